/*
 * emu_delta.c - the delta kernels' launcher (contract: dataplane/delta_dev.h,
 * daemon/transport/delta_kernels.h), run on the host by a stream's worker:
 * the kernels' own phase functions, every tile of a parallel phase in
 * turn, so what the emulator checks is the device algorithm itself against
 * the host codec (tests/gpu/delta_gpu_test.c).
 *
 * As the real launcher: a descriptor with a bad element size, a base, new
 * bytes or a decode's output not aligned to the element size, scratch or
 * result not 8-aligned, or an encode's output under DP_DELTA_HDR + nbytes
 * is refused at the launch with cudaErrorInvalidValue (not sticky).  When
 * it runs, every operand's extent must lie inside one live allocation of
 * the stream's device, else the context dies (sticky
 * cudaErrorIllegalAddress), as a kernel's stray access would.
 */
#include <stdlib.h>
#include <string.h>

#include "dataplane/delta_dev.h"
#include "tests/emu/emu_internal.h"

typedef struct delta_run {
	emu_op_t h;
	dp_delta_op_t a;
} delta_run_t;

/* the host view of operand p (len bytes; none for len 0 and p NULL) */
static bool
dev_mem(const void *p, uint64_t len, int sdev, const char *side, void **host,
	emu_alloc_t **pin)
{
	uint8_t *mem = NULL;
	int dev = REFIT_EMU_HOST;

	*pin = NULL;
	*host = NULL;
	if (p == NULL && len == 0)
		return true;
	if (emu_mem_find(p, len ? len : 1, true, &dev, &mem, pin) == EMU_DEVICE) {
		if (dev == sdev) {
			*host = mem;
			return true;
		}
		emu_mem_unpin(*pin);
		*pin = NULL;
		emu_fault(cudaErrorIllegalAddress, "refit_cuda_delta on a stream of device %d: "
			  "%s %p is memory of device %d", sdev, side, p, dev);
		return false;
	}
	emu_fault(cudaErrorIllegalAddress, "refit_cuda_delta on device %d: %s [%p, +%llu) is "
		  "not inside one live allocation of it", sdev, side, p,
		  (unsigned long long)len);
	return false;
}

/* the scans' threads here: few, so chunks of several tiles (and empty
 * ones) are exercised; the kernels use DPD_SCAN_MAX */
#define EMU_SCAN_THREADS 3u

static void
phases(const dp_delta_op_t *h)
{
	uint64_t nt = dp_delta_dev_tiles(h->nbytes, h->esize);
	uint32_t m = EMU_SCAN_THREADS;

	/* a GPU runs the threads of a step in any order: the last first here */
	if (h->dir == 0) {
		for (uint64_t t = nt; t-- > 0;)
			dpd_e1_count(h, t);
		for (uint32_t th = m; th-- > 0;)
			dpd_e2a_sum(h, th, m);
		dpd_e2b_scan(h, m);
		for (uint32_t th = m; th-- > 0;)
			dpd_e2c_context(h, th, m);
		for (uint64_t t = nt; t-- > 0;)
			dpd_e3_runs(h, t);
		for (uint32_t th = m; th-- > 0;)
			dpd_e4a_sum(h, th, m);
		dpd_e4b_choose(h, m);
		for (uint32_t th = m; th-- > 0;)
			dpd_e4c_place(h, th, m);
		for (uint64_t t = nt; t-- > 0;)
			dpd_e5_write(h, t);
		return;
	}
	for (uint64_t t = nt; t-- > 0;)
		dpd_d1_bits(h, t);
	for (uint32_t th = m; th-- > 0;)
		dpd_d1b_sum(h, th, m);
	dpd_d2_result(h, m);
	for (uint32_t th = m; th-- > 0;)
		dpd_d2c_place(h, th, m);
	for (uint64_t t = nt; t-- > 0;)
		dpd_d3_copy(h, t);
	for (uint64_t t = nt; t-- > 0;)
		dpd_d4_apply(h, t);
}

static void
delta_run(emu_op_t *op_, struct CUstream_st *s)
{
	const dp_delta_op_t *a = &((delta_run_t *)op_)->a;
	dp_delta_op_t h = *a;
	int sdev = emu_stream_dev(s);
	emu_alloc_t *pin[6] = {0};
	void *m[6];
	bool ok;

	ok = dev_mem(a->base, a->nbytes, sdev, "base", &m[0], &pin[0]) &&
	     (a->dir == 1 || dev_mem(a->cur, a->nbytes, sdev, "new bytes", &m[1], &pin[1])) &&
	     dev_mem(a->out, a->dir ? a->nbytes : a->cap, sdev, "output", &m[2], &pin[2]) &&
	     (a->dir == 0 || dev_mem(a->enc, a->len, sdev, "encoding", &m[3], &pin[3])) &&
	     dev_mem(a->scratch, dp_delta_dev_scratch(a->nbytes, a->esize), sdev, "scratch",
		     &m[4], &pin[4]) &&
	     dev_mem(a->result, 16, sdev, "result", &m[5], &pin[5]);
	if (ok) {
		h.base = m[0];
		h.cur = a->dir ? NULL : m[1];
		h.out = m[2];
		h.enc = a->dir ? m[3] : NULL;
		h.scratch = m[4];
		h.result = m[5];
		phases(&h);
		emu_count_pair(sdev, sdev, a->nbytes);
	}
	for (int i = 0; i < 6; i++)
		emu_mem_unpin(pin[i]);
}

static void
delta_free(emu_op_t *op)
{
	free(op);
}

EMU_API int
refit_cuda_delta(const dp_delta_op_t *a, void *stream)
{
	cudaError_t e = emu_enter(), prev;
	struct CUstream_st *s;
	const char *why = "NULL descriptor";
	delta_run_t *r;

	if (e)
		return e;
	prev = emu_last_swap(cudaSuccess);
	if (a == NULL || (why = dpd_op_refused(a)) != NULL) {
		e = emu_fail(cudaErrorInvalidValue, "refit_cuda_delta: refused: %s", why);
		emu_last_swap(prev);
		return e;
	}
	if ((e = emu_stream_get(stream, &s)) == cudaSuccess && emu_stream_dev(s) != emu_cur_dev())
		e = emu_fail(cudaErrorInvalidResourceHandle, "refit_cuda_delta: launch on a "
			     "stream of device %d while the current device is %d",
			     emu_stream_dev(s), emu_cur_dev());
	if (e == cudaSuccess && (r = calloc(1, sizeof(*r))) == NULL)
		e = emu_fail(cudaErrorMemoryAllocation, "refit_cuda_delta: out of memory");
	if (e != cudaSuccess) {
		emu_last_swap(cudaSuccess);
		return e;
	}
	r->h.run = delta_run;
	r->h.fini = delta_free;
	r->a = *a;
	emu_stream_push(s, &r->h);
	return prev;
}
