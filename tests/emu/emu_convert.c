/*
 * emu_convert.c - the conversion kernels' launcher (contract:
 * dataplane/cvt_op.h, daemon/transport/convert_kernels.h), run on the
 * host by a stream's worker, and the kernel library's test helpers (so
 * tests/conversion/cvt_gpu_test.c runs on the emulator too).
 *
 * As the real launcher: a descriptor with a base not aligned to its
 * element size, a bad dtype or geometry is refused at the launch with
 * cudaErrorInvalidValue (a GPU would fault, sticky, on the misaligned
 * access; the launcher checks first).  When it runs, every operand's
 * extent must lie inside one live allocation of the stream's device,
 * else the context dies (sticky cudaErrorIllegalAddress), as a kernel's
 * stray access would.  The element rules are dataplane/convert_elem.h's,
 * the host quantizer's: what the emulator checks is the driver's geometry
 * (dataplane/conv_dev.c), bit for bit against the host path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/convert_elem.h"
#include "dataplane/cvt_op.h"
#include "tests/emu/emu_internal.h"

enum { DT_FP8E4M3 = 6, DT_FP16 = 8, DT_BF16 = 9, DT_FP32 = 10 };

typedef struct cvt_run {
	emu_op_t h;
	dp_cvt_op_t a;
} cvt_run_t;

static int
dt_size(int dt)
{
	return dt == DT_FP32 ? 4 : dt == DT_BF16 || dt == DT_FP16 ? 2 : dt == DT_FP8E4M3 ? 1 : 0;
}

/* bytes from an operand's base to its last element's end */
static size_t
extent(int64_t rows, int64_t cols, int64_t ld, int64_t inc, int size)
{
	return (size_t)(((rows - 1) * ld + (cols - 1) * inc + 1) * size);
}

static uint8_t *
dev_mem(const void *p, size_t len, int sdev, const char *side, emu_alloc_t **pin)
{
	uint8_t *mem = NULL;
	int dev = REFIT_EMU_HOST;

	*pin = NULL;
	switch (emu_mem_find(p, len, true, &dev, &mem, pin)) {
	case EMU_DEVICE:
		if (dev == sdev)
			return mem;
		emu_mem_unpin(*pin);
		*pin = NULL;
		emu_fault(cudaErrorIllegalAddress, "refit_cuda_convert on a stream of device %d: "
			  "%s %p is memory of device %d", sdev, side, p, dev);
		return NULL;
	default:
		emu_fault(cudaErrorIllegalAddress, "refit_cuda_convert on device %d: %s [%p, +%zu) "
			  "is not inside one live allocation of it", sdev, side, p, len);
		return NULL;
	}
}

static uint32_t
widen(const uint8_t *p, int from, int64_t i)
{
	uint32_t u;
	uint16_t h;

	if (from == DT_FP32) {
		memcpy(&u, p + i * 4, 4);
		return u;
	}
	memcpy(&h, p + i * 2, 2);
	return from == DT_BF16 ? (uint32_t)h << 16 : dp_widen_fp16(h);
}

static void
scales(const dp_cvt_op_t *a, const uint8_t *src, uint8_t *sc)
{
	int64_t nbr = (a->rows + a->br - 1) / a->br, nbc = (a->cols + a->bc - 1) / a->bc;

	for (int64_t bi = 0; bi < nbr; bi++)
		for (int64_t bj = 0; bj < nbc; bj++) {
			uint32_t m = 0, s;
			int64_t at = bi * a->scale_ld + bj * a->scale_inc;

			for (int64_t r = bi * a->br; r < (bi + 1) * a->br && r < a->rows; r++)
				for (int64_t c = bj * a->bc; c < (bj + 1) * a->bc && c < a->cols; c++) {
					uint32_t x = widen(src, a->from, r * a->src_ld +
							   c * a->src_inc) & 0x7fffffffu;

					m = x > m ? x : m;
				}
			if (a->mx) {
				sc[at] = dp_elem_mx_scale(m);
			} else {
				s = dp_elem_scale_inv(m);
				memcpy(sc + at * 4, &s, 4);
			}
		}
}

static void
elems(const dp_cvt_op_t *a, const uint8_t *src, uint8_t *dst, const uint8_t *sc)
{
	for (int64_t r = 0; r < a->rows; r++)
		for (int64_t c = 0; c < a->cols; c++) {
			uint32_t u = widen(src, a->from, r * a->src_ld + c * a->src_inc), sb;
			int64_t d = r * a->dst_ld + c * a->dst_inc;

			if (a->op == DP_CVT_CAST) {
				uint16_t h = a->to == DT_BF16 ? dp_elem_bf16(u) : dp_elem_fp16(u);

				memcpy(dst + d * 2, &h, 2);
				continue;
			}
			int64_t at = ((a->r0 + r) / a->br) * a->scale_ld +
				     ((a->c0 + c) / a->bc) * a->scale_inc;

			if (a->mx)
				sb = dp_elem_mx_divisor(sc[at]);
			else
				memcpy(&sb, sc + at * 4, 4);
			dst[d] = dp_elem_e4m3(dp_bits_of(dp_float_of(u) / dp_float_of(sb)));
		}
}

static void
cvt_run(emu_op_t *op_, struct CUstream_st *s)
{
	const dp_cvt_op_t *a = &((cvt_run_t *)op_)->a;
	int sdev = emu_stream_dev(s), fs = dt_size(a->from), ss = a->mx ? 1 : 4;
	emu_alloc_t *sp = NULL, *dp = NULL, *cp = NULL;
	uint8_t *src, *dst = NULL, *sc = NULL;
	int64_t nbr = (a->rows + a->br - 1) / a->br, nbc = (a->cols + a->bc - 1) / a->bc;
	int64_t sr = a->op == DP_CVT_SCALES ? nbr : (a->r0 + a->rows - 1) / a->br + 1;
	int64_t scc = a->op == DP_CVT_SCALES ? nbc : (a->c0 + a->cols - 1) / a->bc + 1;
	bool ok;

	src = dev_mem(a->src, extent(a->rows, a->cols, a->src_ld, a->src_inc, fs), sdev,
		      "source", &sp);
	ok = src != NULL;
	if (ok && a->op != DP_CVT_CAST) /* the scales the op touches: from the grid origin */
		ok = (sc = dev_mem(a->scale, extent(sr, scc, a->scale_ld, a->scale_inc, ss), sdev,
				   "scales", &cp)) != NULL;
	if (ok && a->op != DP_CVT_SCALES)
		ok = (dst = dev_mem(a->dst, extent(a->rows, a->cols, a->dst_ld, a->dst_inc,
						   dt_size(a->to)), sdev, "destination",
				    &dp)) != NULL;
	if (ok && a->op == DP_CVT_SCALES)
		scales(a, src, sc);
	else if (ok)
		elems(a, src, dst, sc);
	if (ok)
		emu_count_pair(sdev, sdev, (uint64_t)(a->rows * a->cols) * (uint64_t)fs);
	emu_mem_unpin(sp);
	emu_mem_unpin(dp);
	emu_mem_unpin(cp);
}

static void
cvt_free(emu_op_t *op)
{
	free(op);
}

static bool
aligned(const void *p, int size)
{
	return size > 0 && (uintptr_t)p % (uintptr_t)size == 0;
}

/* The launcher's own checks: NULL or why the descriptor is refused. */
static const char *
refused(const dp_cvt_op_t *a)
{
	int ss = a->mx ? 1 : 4;

	if (a->rows < 0 || a->cols < 0 || a->src_ld < 0 || a->src_inc < 0 || a->dst_ld < 0 ||
	    a->dst_inc < 0 || a->scale_ld < 0 || a->scale_inc < 0)
		return "a negative extent or stride";
	if (a->from != DT_FP32 && a->from != DT_BF16 && a->from != DT_FP16)
		return "a source dtype not fp32, bf16 or fp16";
	if (!aligned(a->src, dt_size(a->from)))
		return "a source base not aligned to its element size";
	switch (a->op) {
	case DP_CVT_CAST:
		if (a->to != DT_BF16 && a->to != DT_FP16)
			return "a cast to a dtype not bf16 or fp16";
		return aligned(a->dst, 2) ? NULL : "a destination base not aligned to 2 bytes";
	case DP_CVT_SCALES:
	case DP_CVT_QUANT:
		if (a->br < 1 || a->bc < 1 || a->r0 < 0 || a->c0 < 0)
			return "a block extent < 1 or a negative grid offset";
		if (!aligned(a->scale, ss))
			return "a scale base not aligned to its element size";
		if (a->op == DP_CVT_QUANT && (a->to != DT_FP8E4M3 || a->dst == NULL))
			return "a quantization to a dtype not fp8e4m3";
		return NULL;
	}
	return "an unknown op";
}

EMU_API int
refit_cuda_convert(const dp_cvt_op_t *a, void *stream)
{
	cudaError_t e = emu_enter(), prev;
	struct CUstream_st *s;
	const char *why = "NULL descriptor";
	cvt_run_t *r;

	if (e)
		return e;
	/* as the real launcher: its own checks touch no runtime state, and
	 * cudaGetLastError() after the launch returns (and clears) a stale error */
	prev = emu_last_swap(cudaSuccess);
	if (a == NULL || (why = refused(a)) != NULL) {
		e = emu_fail(cudaErrorInvalidValue, "refit_cuda_convert: op %d refused: %s",
			     a ? a->op : -1, why);
		emu_last_swap(prev);
		return e;
	}
	if (a->rows == 0 || a->cols == 0) {
		emu_last_swap(prev);
		return cudaSuccess;
	}
	if ((e = emu_stream_get(stream, &s)) == cudaSuccess && emu_stream_dev(s) != emu_cur_dev())
		e = emu_fail(cudaErrorInvalidResourceHandle, "refit_cuda_convert: launch on a "
			     "stream of device %d while the current device is %d",
			     emu_stream_dev(s), emu_cur_dev());
	if (e == cudaSuccess && (r = calloc(1, sizeof(*r))) == NULL)
		e = emu_fail(cudaErrorMemoryAllocation, "refit_cuda_convert: out of memory");
	if (e != cudaSuccess) {
		emu_last_swap(cudaSuccess);
		return e;
	}
	r->h.run = cvt_run;
	r->h.fini = cvt_free;
	r->a = *a;
	emu_stream_push(s, &r->h);
	return prev;
}

/* ---- the kernel library's test helpers (convert_kernels.h) -------------------- */

EMU_API int
refit_cuda_devices(void)
{
	int n = 0;

	return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

EMU_API void *
refit_cuda_alloc(uint64_t bytes)
{
	void *p = NULL;

	return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

EMU_API void
refit_cuda_free(void *p)
{
	cudaFree(p);
}

EMU_API int
refit_cuda_copy(void *dst, const void *src, uint64_t n, int to_device)
{
	return (int)cudaMemcpy(dst, src, n, to_device ? cudaMemcpyHostToDevice :
						     cudaMemcpyDeviceToHost);
}

EMU_API int
refit_cuda_sync(void)
{
	return (int)cudaDeviceSynchronize();
}
