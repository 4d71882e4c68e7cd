/*
 * emu_copy.c - copies, memsets and the strided-copy kernel, as stream
 * operations (see emu_stream.c for when they run and what a fault does).
 *
 * Every copy is a 3-D box: depth slices of height rows of width bytes.
 * When queued: the direction must match the pointers (device addresses are
 * those of the emulated address space), every pitch must hold a row
 * (whatever the height, as CUDA documents) and not exceed the device's
 * maximum pitch.  When run: each device side must lie inside one allocation
 * of the stream's device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/emu/emu_internal.h"

#define MAX_PITCH 2147483647ULL   /* cudaDevAttrMaxPitch of current GPUs */
#define KMAX 8

typedef struct copy_op {
	emu_op_t h;
	const char *what;
	uint8_t *dst;
	const uint8_t *src;
	size_t width, height, depth, dpitch, spitch, dslice, sslice;
	bool memset;
	int value;
	bool hang;      /* REFIT_EMU_HANG_D2H: never ends, whatever aborts */
	bool fault;     /* REFIT_EMU_FAULT_D2D: kills the context when it runs */
} copy_op_t;

typedef struct kernel_op {
	emu_op_t h;
	uint8_t *dst;
	const uint8_t *src;
	int ndim, elem;
	int64_t shape[KMAX], dst_stride[KMAX], src_stride[KMAX];
} kernel_op_t;

static void
op_free(emu_op_t *op)
{
	free(op);
}

/*
 * Resolve [p, p + len) for a stream of device sdev: the host-writable
 * address, *dev (REFIT_EMU_HOST for host memory) and the pin.  NULL after a
 * fault (device range outside one allocation, or of another device; or host
 * memory where a kernel needs device memory).
 */
static uint8_t *
resolve(const void *p, size_t len, int sdev, bool need_dev, const char *what,
	const char *side, int *dev, emu_alloc_t **pin)
{
	uint8_t *mem = NULL;

	*pin = NULL;
	*dev = REFIT_EMU_HOST;
	switch (emu_mem_find(p, len, true, dev, &mem, pin)) {
	case EMU_HOST:
		*dev = REFIT_EMU_HOST;
		if (!need_dev)
			return (uint8_t *)p;
		emu_fault(cudaErrorIllegalAddress, "%s on device %d: %s %p is host memory", what,
			  sdev, side, p);
		return NULL;
	case EMU_BAD:
		emu_fault(cudaErrorIllegalAddress, "%s on device %d: %s [%p, +%zu) is not inside "
			  "one live allocation", what, sdev, side, p, len);
		return NULL;
	default:
		if (*dev == sdev)
			return mem;
		emu_fault(cudaErrorIllegalAddress, "%s on a stream of device %d: %s %p is memory "
			  "of device %d", what, sdev, side, p, *dev);
		emu_mem_unpin(*pin);
		*pin = NULL;
		return NULL;
	}
}

static void
copy_run(emu_op_t *op_, struct CUstream_st *s)
{
	copy_op_t *op = (copy_op_t *)op_;
	int sdev = emu_stream_dev(s), ddev, srcdev = REFIT_EMU_HOST;
	size_t dlen = (op->depth - 1) * op->dslice + (op->height - 1) * op->dpitch + op->width;
	size_t slen = (op->depth - 1) * op->sslice + (op->height - 1) * op->spitch + op->width;
	emu_alloc_t *dpin = NULL, *spin = NULL;
	uint8_t *d;
	const uint8_t *src = NULL;

	/* a stuck device: the copy never ends and its stream never drains
	 * (nothing, not even an abort of the communicators, ends it); it writes
	 * nothing, so the process may exit */
	while (op->hang)
		pause();
	if (op->fault) {
		emu_fault(cudaErrorIllegalAddress, "%s on device %d: device-to-device copy %llu "
			  "faults (REFIT_EMU_FAULT_D2D)", op->what, sdev,
			  (unsigned long long)emu_env()->fault_d2d);
		return;
	}
	d = resolve(op->dst, dlen, sdev, false, op->what, "destination", &ddev, &dpin);

	if (d && !op->memset)
		src = resolve(op->src, slen, sdev, false, op->what, "source", &srcdev, &spin);
	if (d && (op->memset || src)) {
		for (size_t z = 0; z < op->depth; z++)
			for (size_t y = 0; y < op->height; y++) {
				uint8_t *to = d + z * op->dslice + y * op->dpitch;

				if (op->memset)
					memset(to, op->value, op->width);
				else
					memmove(to, src + z * op->sslice + y * op->spitch,
						op->width);
			}
		if (!op->memset)
			emu_count_pair(srcdev, ddev, op->width * op->height * op->depth);
	}
	emu_mem_unpin(dpin);
	emu_mem_unpin(spin);
}

static const char *
kind_name(int kind)
{
	static const char *const n[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice",
					"cudaMemcpyDeviceToHost", "cudaMemcpyDeviceToDevice",
					"cudaMemcpyDefault"};

	return kind >= 0 && kind <= 4 ? n[kind] : "?";
}

/* Check the direction against the pointers. */
static cudaError_t
check_kind(const char *what, const void *dst, const void *src, int kind)
{
	bool dd = emu_is_dev_addr(dst), sd = emu_is_dev_addr(src);
	bool ok;

	switch (kind) {
	case cudaMemcpyHostToHost: ok = !dd && !sd; break;
	case cudaMemcpyHostToDevice: ok = dd && !sd; break;
	case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
	case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
	case cudaMemcpyDefault: ok = true; break;
	default:
		return emu_fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d", what, kind);
	}
	if (!ok)
		return emu_fail(cudaErrorInvalidValue, "%s: %s but the destination %p is %s "
				"memory and the source %p is %s memory", what, kind_name(kind),
				dst, dd ? "device" : "host", src, sd ? "device" : "host");
	return cudaSuccess;
}

/* CUDA: "width must not exceed either dpitch or spitch", nor a pitch the
 * maximum pitch (whatever the height). */
static cudaError_t
check_pitch(const char *what, const char *name, size_t pitch, size_t width)
{
	if (pitch < width)
		return emu_fail(cudaErrorInvalidPitchValue, "%s: %s %zu is shorter than a row of "
				"%zu bytes", what, name, pitch, width);
	if (pitch > MAX_PITCH)
		return emu_fail(cudaErrorInvalidPitchValue, "%s: %s %zu exceeds the maximum "
				"pitch %llu", what, name, pitch, MAX_PITCH);
	return cudaSuccess;
}

/* Validate and queue a copy (op filled but for h); sync: wait for it. */
static cudaError_t
copy_submit(copy_op_t *tmpl, int kind, cudaStream_t sh, bool sync)
{
	const char *w = tmpl->what;
	struct CUstream_st *s;
	copy_op_t *op;
	cudaError_t e = emu_enter();
	uint64_t n = (uint64_t)tmpl->width * tmpl->height * tmpl->depth;

	if (e)
		return e;
	if (!tmpl->memset && (e = check_kind(w, tmpl->dst, tmpl->src, kind)) != cudaSuccess)
		return e;
	if ((e = check_pitch(w, "dpitch", tmpl->dpitch, tmpl->width)) ||
	    (!tmpl->memset && (e = check_pitch(w, "spitch", tmpl->spitch, tmpl->width))))
		return e;
	if (n && (tmpl->dst == NULL || (!tmpl->memset && tmpl->src == NULL)))
		return emu_fail(cudaErrorInvalidValue, "%s: NULL pointer (dst %p, src %p)", w,
				(void *)tmpl->dst, (const void *)tmpl->src);
	if (tmpl->memset && !emu_is_dev_addr(tmpl->dst))
		return emu_fail(cudaErrorInvalidValue, "%s(%p): not device memory", w,
				(void *)tmpl->dst);
	if ((e = emu_stream_get(sh, &s)) != cudaSuccess)
		return e;
	if (n == 0)
		return cudaSuccess;
	if ((op = malloc(sizeof(*op))) == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "%s: out of host memory", w);
	*op = *tmpl;
	if (!tmpl->memset && emu_env()->hang_d2h && !emu_is_dev_addr(tmpl->dst) &&
	    emu_is_dev_addr(tmpl->src)) {
		static _Atomic uint64_t d2h;

		op->hang = ++d2h == emu_env()->hang_d2h;
		if (op->hang)
			emu_say("%s: device-to-host copy %llu never ends (REFIT_EMU_HANG_D2H)", w,
				(unsigned long long)emu_env()->hang_d2h);
	}
	if (!tmpl->memset && emu_env()->fault_d2d && emu_is_dev_addr(tmpl->dst) &&
	    emu_is_dev_addr(tmpl->src)) {
		static _Atomic uint64_t d2d;

		op->fault = ++d2d == emu_env()->fault_d2d;
	}
	op->h.run = copy_run;
	op->h.fini = op_free;
	emu_stream_push(s, &op->h);
	if (sync)
		return cudaStreamSynchronize(sh);
	return cudaSuccess;
}

cudaError_t
cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
		  size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
	copy_op_t t = {.what = "cudaMemcpy2DAsync", .dst = dst, .src = src, .width = width,
		       .height = height, .depth = 1, .dpitch = dpitch, .spitch = spitch};

	return copy_submit(&t, kind, stream, false);
}

cudaError_t
cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
		cudaStream_t stream)
{
	copy_op_t t = {.what = "cudaMemcpyAsync", .dst = dst, .src = src, .width = count,
		       .height = 1, .depth = 1, .dpitch = count, .spitch = count};

	return copy_submit(&t, kind, stream, false);
}

cudaError_t
cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	copy_op_t t = {.what = "cudaMemcpy", .dst = dst, .src = src, .width = count,
		       .height = 1, .depth = 1, .dpitch = count, .spitch = count};

	return copy_submit(&t, kind, NULL, true);
}

cudaError_t
cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
	copy_op_t t = {.what = "cudaMemsetAsync", .dst = p, .width = count, .height = 1,
		       .depth = 1, .dpitch = count, .memset = true, .value = value};

	return copy_submit(&t, cudaMemcpyDefault, stream, false);
}

cudaError_t
cudaMemset(void *p, int value, size_t count)
{
	copy_op_t t = {.what = "cudaMemset", .dst = p, .width = count, .height = 1,
		       .depth = 1, .dpitch = count, .memset = true, .value = value};

	return copy_submit(&t, cudaMemcpyDefault, NULL, true);
}

cudaError_t
cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
	const char *w = "cudaMemcpy3DAsync";
	copy_op_t t = {.what = w};
	cudaError_t e = emu_enter();

	if (e)
		return e;
	if (p == NULL)
		return emu_fail(cudaErrorInvalidValue, "%s(NULL)", w);
	if (p->srcArray || p->dstArray)
		return emu_fail(cudaErrorInvalidValue, "%s: CUDA arrays are not emulated", w);
	t.width = p->extent.width;
	t.height = p->extent.height;
	t.depth = p->extent.depth;
	t.dpitch = p->dstPtr.pitch;
	t.spitch = p->srcPtr.pitch;
	t.dslice = p->dstPtr.pitch * p->dstPtr.ysize;
	t.sslice = p->srcPtr.pitch * p->srcPtr.ysize;
	if (t.depth > 1 && (p->dstPtr.ysize < t.height || p->srcPtr.ysize < t.height))
		return emu_fail(cudaErrorInvalidValue, "%s: ysize (dst %zu, src %zu) below the "
				"height %zu", w, p->dstPtr.ysize, p->srcPtr.ysize, t.height);
	t.dst = (uint8_t *)p->dstPtr.ptr + p->dstPos.z * t.dslice + p->dstPos.y * t.dpitch +
		p->dstPos.x;
	t.src = (const uint8_t *)p->srcPtr.ptr + p->srcPos.z * t.sslice +
		p->srcPos.y * t.spitch + p->srcPos.x;
	return copy_submit(&t, p->kind, stream, false);
}

/* ---- the strided-copy kernel (contract: daemon/transport/gpu_kernels.h) ------ */

static void
kernel_run(emu_op_t *op_, struct CUstream_st *s)
{
	kernel_op_t *k = (kernel_op_t *)op_;
	int sdev = emu_stream_dev(s), dd, sd;
	int64_t dmax = 0, smax = 0, n = 1, idx[KMAX] = {0};
	emu_alloc_t *dpin = NULL, *spin = NULL;
	uint8_t *d;
	const uint8_t *src = NULL;

	for (int i = 0; i < k->ndim; i++) {
		n *= k->shape[i];
		dmax += (k->shape[i] - 1) * k->dst_stride[i];
		smax += (k->shape[i] - 1) * k->src_stride[i];
	}
	if (n == 0)
		return;
	/* every element is base + i * elem: the bases decide (a GPU's T* load or
	 * store of an address not a multiple of sizeof(T) kills the context) */
	if ((uintptr_t)k->dst % (uintptr_t)k->elem || (uintptr_t)k->src % (uintptr_t)k->elem) {
		emu_fault(cudaErrorMisalignedAddress, "refitGpuCopyStrided on device %d: %d-byte "
			  "elements at destination %p, source %p: an address not a multiple of "
			  "the element size", sdev, k->elem, k->dst, k->src);
		return;
	}
	d = resolve(k->dst, (size_t)(dmax + 1) * k->elem, sdev, true, "refitGpuCopyStrided",
		    "destination", &dd, &dpin);
	if (d)
		src = resolve(k->src, (size_t)(smax + 1) * k->elem, sdev, true,
			      "refitGpuCopyStrided", "source", &sd, &spin);
	if (d && src) {
		for (int64_t c = 0; c < n; c++) {
			int64_t so = 0, dof = 0;

			for (int i = 0; i < k->ndim; i++) {
				so += idx[i] * k->src_stride[i];
				dof += idx[i] * k->dst_stride[i];
			}
			memcpy(d + dof * k->elem, src + so * k->elem, (size_t)k->elem);
			for (int i = k->ndim - 1; i >= 0 && ++idx[i] == k->shape[i]; i--)
				idx[i] = 0;
		}
		emu_count_pair(sd, dd, (uint64_t)n * (uint64_t)k->elem);
	}
	emu_mem_unpin(dpin);
	emu_mem_unpin(spin);
}

static cudaError_t
kernel_check(int ndim, const int64_t *shape, const int64_t *dst_stride,
	     const int64_t *src_stride, int elem)
{
	const char *w = "refitGpuCopyStrided";

	if (ndim < 1 || ndim > KMAX || shape == NULL || dst_stride == NULL || src_stride == NULL)
		return emu_fail(cudaErrorInvalidValue, "%s: ndim %d (1..%d) or NULL arrays", w,
				ndim, KMAX);
	if (elem != 1 && elem != 2 && elem != 4 && elem != 8)
		return emu_fail(cudaErrorInvalidValue, "%s: elem_size %d", w, elem);
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || dst_stride[i] < 0 || src_stride[i] < 0)
			return emu_fail(cudaErrorInvalidValue, "%s: dim %d: shape %lld, strides "
					"dst %lld src %lld", w, i, (long long)shape[i],
					(long long)dst_stride[i], (long long)src_stride[i]);
		if (dst_stride[i] == 0 && shape[i] > 1)
			return emu_fail(cudaErrorInvalidValue, "%s: dim %d: destination stride 0 "
					"over %lld elements", w, i, (long long)shape[i]);
	}
	return cudaSuccess;
}

/*
 * As daemon/transport/kernels.cu: its own argument checks touch no runtime
 * state; a launch ends with cudaGetLastError(), which returns (and clears)
 * this thread's last error -- the launch's own, or a stale one that an
 * earlier failed call on this thread left unconsumed, although the kernel
 * was launched.  A box of no elements returns at once.
 */
EMU_API int
refitGpuCopyStrided(void *stream, void *dst, const void *src, int ndim, const int64_t *shape,
		    const int64_t *dst_stride, const int64_t *src_stride, int elem_size)
{
	cudaError_t e = emu_enter(), prev;
	struct CUstream_st *s;
	kernel_op_t *k;
	int64_t total = 1;

	if (e)
		return e;
	prev = emu_last_swap(cudaSuccess);
	if ((e = kernel_check(ndim, shape, dst_stride, src_stride, elem_size)) != cudaSuccess) {
		emu_last_swap(prev);
		return e;
	}
	for (int i = 0; i < ndim; i++)
		total *= shape[i];
	if (total == 0) {
		emu_last_swap(prev);
		return cudaSuccess;
	}
	if ((e = emu_stream_get(stream, &s)) != cudaSuccess) {
		emu_last_swap(cudaSuccess);
		return e;
	}
	if (emu_stream_dev(s) != emu_cur_dev()) {
		e = emu_fail(cudaErrorInvalidResourceHandle, "refitGpuCopyStrided: launch on "
			     "a stream of device %d while the current device is %d",
			     emu_stream_dev(s), emu_cur_dev());
		emu_last_swap(cudaSuccess);
		return e;
	}
	if ((k = calloc(1, sizeof(*k))) == NULL) {
		e = emu_fail(cudaErrorMemoryAllocation, "refitGpuCopyStrided: out of memory");
		emu_last_swap(cudaSuccess);
		return e;
	}
	k->h.run = kernel_run;
	k->h.fini = op_free;
	k->dst = dst;
	k->src = src;
	k->ndim = ndim;
	k->elem = elem_size;
	memcpy(k->shape, shape, (size_t)ndim * sizeof(*shape));
	memcpy(k->dst_stride, dst_stride, (size_t)ndim * sizeof(*shape));
	memcpy(k->src_stride, src_stride, (size_t)ndim * sizeof(*shape));
	emu_stream_push(s, &k->h);
	if (prev != cudaSuccess)
		emu_say("refitGpuCopyStrided: launched, but cudaGetLastError() after the launch "
			"returns an earlier call's unconsumed error (%s), as kernels.cu would",
			cudaGetErrorName(prev));
	return prev;
}
