/*
 * nccl_dev.c - the nccl transport's device memory operations (dp_dev_ops_t):
 * box copies (cudaMemcpyAsync / cudaMemcpy2DAsync, the strided kernel),
 * conversion, the staging arena's allocations (one ncclMemAlloc per rank
 * and epoch, registered with the communicator), device copies, host copies
 * through the pinned bounce buffer, and the sync that returns the session's
 * first device error.  Calls nccl_abort.c and nccl_state.c.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/transport/nccl_internal.h"

#ifdef REFIT_HAVE_NCCL


#define DCHK(x, rank, call, what)                                  \
	do {                                                       \
		cudaError_t e_ = (call);                           \
		if (e_ != cudaSuccess) {                           \
			nccl_dfail(x, e_, rank, what);                  \
			return;                                    \
		}                                                  \
	} while (0)

/* The largest pitch a 2D copy takes: cudaDeviceProp.memPitch, 2^31-1 on
 * current GPUs; CUDA refuses more (cudaErrorInvalidPitchValue). */
#define MAX_PITCH ((int64_t)INT32_MAX)

static bool
pitches_ok(int64_t a, int64_t b)
{
	return a <= MAX_PITCH && b <= MAX_PITCH;
}

/* n elements of e bytes, strides ds and ss (elements), one copy each: a
 * 2D copy whose pitch CUDA would refuse. */
static void
copy_elems(xport_t *x, int32_t rank, cudaStream_t st, uint8_t *dp, const uint8_t *sp,
	   int64_t ds, int64_t ss, int64_t e, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		DCHK(x, rank, x->api->cudaMemcpyAsync(dp + i * ds * e, sp + i * ss * e, (size_t)e,
						      cudaMemcpyDeviceToDevice, st),
		     "cudaMemcpyAsync");
}

/*
 * The rows of one index of the outer dims, on stream st: sp and dp point at
 * the box's first element there.  One dim: a row (or, strided, one element
 * per row).  Two or more: the two innermost dims as one 2D copy, or row by
 * row where rows overlap, or element by element without the kernel.
 */
static void
copy_plane(xport_t *x, int32_t rank, cudaStream_t st, uint8_t *dp, const uint8_t *sp,
	   const dp_view_t *sv, const dp_view_t *dv, const plan_box_t *box, bool contig)
{
	const gpu_api_t *a = x->api;
	int nd = sv->ndim, c = nd - 1, r = nd - 2;
	int64_t e = sv->elem;
	uint64_t w = (uint64_t)box->size[c] * (uint64_t)e;

	if (nd == 1 && contig)
		DCHK(x, rank, a->cudaMemcpyAsync(dp, sp, w, cudaMemcpyDeviceToDevice, st),
		     "cudaMemcpyAsync");
	else if (nd == 1 && !pitches_ok(dv->stride[0] * e, sv->stride[0] * e))
		copy_elems(x, rank, st, dp, sp, dv->stride[0], sv->stride[0], e, box->size[0]);
	else if (nd == 1)  /* no kernel: one element per row */
		DCHK(x, rank, a->cudaMemcpy2DAsync(dp, dv->stride[0] * e, sp, sv->stride[0] * e,
						   e, box->size[0], cudaMemcpyDeviceToDevice, st),
		     "cudaMemcpy2DAsync");
	else if (contig && box->size[r] == 1)
		DCHK(x, rank, a->cudaMemcpyAsync(dp, sp, w, cudaMemcpyDeviceToDevice, st),
		     "cudaMemcpyAsync");
	else if (contig && (uint64_t)(sv->stride[r] * e) >= w &&
		 (uint64_t)(dv->stride[r] * e) >= w && pitches_ok(dv->stride[r] * e, sv->stride[r] * e))
		DCHK(x, rank, a->cudaMemcpy2DAsync(dp, dv->stride[r] * e, sp, sv->stride[r] * e,
						   w, box->size[r], cudaMemcpyDeviceToDevice, st),
		     "cudaMemcpy2DAsync");
	else if (contig) /* rows that overlap, or a pitch too large: one copy each */
		for (int64_t i = 0; i < box->size[r]; i++)
			DCHK(x, rank, a->cudaMemcpyAsync(dp + i * dv->stride[r] * e,
							 sp + i * sv->stride[r] * e, w,
							 cudaMemcpyDeviceToDevice, st),
			     "cudaMemcpyAsync");
	else if (!pitches_ok(dv->stride[c] * e, sv->stride[c] * e))
		for (int64_t i = 0; i < box->size[r] && !nccl_dfailed(x); i++)
			copy_elems(x, rank, st, dp + i * dv->stride[r] * e, sp + i * sv->stride[r] * e,
				   dv->stride[c], sv->stride[c], e, box->size[c]);
	else  /* no kernel: a 2D copy of single elements per row */
		for (int64_t i = 0; i < box->size[r]; i++)
			DCHK(x, rank, a->cudaMemcpy2DAsync(dp + i * dv->stride[r] * e,
							   dv->stride[c] * e,
							   sp + i * sv->stride[r] * e,
							   sv->stride[c] * e, e, box->size[c],
							   cudaMemcpyDeviceToDevice, st),
			     "cudaMemcpy2DAsync");
}

/*
 * One box, from view sv (shard ss) to view dv (shard ds), both on rank's
 * device.  Dims of size 1 have no stride that matters.  Contiguous rows
 * (innermost stride 1 on both sides) go as 1D/2D copies, one per index of
 * the outer dims; a strided innermost dim goes to the kernel in one launch.
 */
void
nccl_dev_copy_box(void *ctx, int32_t rank, const dp_view_t *sv, const plan_shard_t *ss,
		  const dp_view_t *dv, const plan_shard_t *ds, const plan_box_t *box)
{
	xport_t *x = ctx;
	cudaStream_t st;
	int nd = sv->ndim, c = nd - 1, outer = nd >= 2 ? nd - 2 : 0;
	int64_t e = sv->elem;
	int64_t so[PLAN_MAX_DIMS], dof[PLAN_MAX_DIMS], idx[PLAN_MAX_DIMS] = {0};
	int64_t soff = 0, doff = 0;
	bool contig;

	if (nccl_dfailed(x) || !nccl_on_rank(x, rank, &st))
		return;
	for (int d = 0; d < nd; d++) {
		if (box->size[d] == 0)
			return;
		so[d] = box->off[d] - ss->box.off[d] + ss->local_off[d];
		dof[d] = box->off[d] - ds->box.off[d] + ds->local_off[d];
		soff += so[d] * sv->stride[d];
		doff += dof[d] * dv->stride[d];
	}
	if (nd == 0) {
		DCHK(x, rank, x->api->cudaMemcpyAsync(dv->base, sv->base, (size_t)e,
						      cudaMemcpyDeviceToDevice, st),
		     "cudaMemcpyAsync");
		return;
	}
	contig = box->size[c] == 1 || (sv->stride[c] == 1 && dv->stride[c] == 1);
	if (!contig && x->api->copy_strided != NULL &&
	    (e == 1 || e == 2 || e == 4 || e == 8) && nd <= REFIT_GPU_MAX_DIMS) {
		int rc;

		/* the kernel library ends its launch with cudaGetLastError(): an
		 * error an earlier call on this thread left there (handled where
		 * it was returned, e.g. a refused copy of a failed session) would
		 * come back as the launch's.  A sticky error stays (and the
		 * launch returns it). */
		(void)x->api->cudaGetLastError();
		rc = x->api->copy_strided(st, dv->base + doff * e, sv->base + soff * e, nd,
					  box->size, dv->stride, sv->stride, (int)e);

		if (rc != 0)
			nccl_dfail(x, (cudaError_t)rc, rank, "refitGpuCopyStrided");
		return;
	}
	for (;;) {
		int64_t sb = 0, db = 0;
		int d;

		for (d = outer; d < nd; d++) {  /* the plane's first element */
			sb += so[d] * sv->stride[d];
			db += dof[d] * dv->stride[d];
		}
		for (d = 0; d < outer; d++) {
			sb += (so[d] + idx[d]) * sv->stride[d];
			db += (dof[d] + idx[d]) * dv->stride[d];
		}
		copy_plane(x, rank, st, dv->base + db * e, sv->base + sb * e, sv, dv, box, contig);
		if (nccl_dfailed(x))
			return;
		/* next index over the outer dims */
		for (d = outer - 1; d >= 0 && ++idx[d] == box->size[d]; d--)
			idx[d] = 0;
		if (d < 0)
			return;
	}
}

/* One conversion launch (dataplane/conv_dev.c) on rank's stream. */
void
nccl_dev_convert(void *ctx, int32_t rank, const dp_cvt_op_t *op)
{
	xport_t *x = ctx;
	cudaStream_t st;
	int rc;

	if (nccl_dfailed(x) || !nccl_on_rank(x, rank, &st))
		return;
	(void)x->api->cudaGetLastError();   /* as for copy_strided: a stale error */
	if ((rc = x->api->convert(op, st)) != 0)
		nccl_dfail(x, (cudaError_t)rc, rank, op->op == DP_CVT_CAST ? "refit_cuda_convert (cast)"
			   : op->op == DP_CVT_SCALES ? "refit_cuda_convert (scales)"
			   : "refit_cuda_convert (quantize)");
}

/* One delta encode or decode (dataplane/delta_gpu.c) on rank's stream. */
void
nccl_dev_delta(void *ctx, int32_t rank, const dp_delta_op_t *op)
{
	xport_t *x = ctx;
	cudaStream_t st;
	int rc;

	if (nccl_dfailed(x) || !nccl_on_rank(x, rank, &st))
		return;
	(void)x->api->cudaGetLastError();
	if ((rc = x->api->delta(op, st)) != 0)
		nccl_dfail(x, (cudaError_t)rc, rank, op->dir ? "refit_cuda_delta (decode)"
			   : "refit_cuda_delta (encode)");
}

/*
 * Local rank li's arena, made at its first use in the epoch (its device
 * current, its communicator ready): one ncclMemAlloc of the budget,
 * registered with the communicator (every send and receive buffer of
 * refit's comes from an arena, so no matched pair mixes registered and
 * unregistered memory, which NCCL leaves undefined).  NULL: failed (derr).
 */
static arena_t *
arena_of(xport_t *x, int li, int32_t rank)
{
	arena_t *ar = &x->cm.arena[li];
	const gpu_api_t *a = x->api;
	ncclResult_t r;
	void *p = NULL;

	if (ar->base != NULL)
		return ar;
	if ((r = a->ncclMemAlloc(&p, x->budget)) != ncclSuccess) {
		refit_err_set(&x->derr, REFIT_ERR_NOMEM, "nccl transport: rank %d: ncclMemAlloc of "
			      "its %" PRIu64 "-byte staging arena (gpu_staging_budget_bytes): %s", rank,
			      x->budget, a->ncclGetErrorString(r));
		return NULL;
	}
	if ((r = a->ncclCommRegister(x->cm.comm[li], p, x->budget, &ar->reg)) != ncclSuccess) {
		refit_err_set(&x->derr, REFIT_ERR_NCCL, "nccl transport: rank %d: ncclCommRegister "
			      "of its staging arena: %s", rank, a->ncclGetErrorString(r));
		(void)a->ncclMemFree(p);
		return NULL;
	}
	ar->base = p;
	gpu_arena_init(&ar->a, x->budget);
	log_info("nccl: node %s: rank %d: staging arena of %" PRIu64 " bytes (ncclMemAlloc, "
		 "registered with its communicator)", x->node_id, rank, x->budget);
	return ar;
}

/* Staging from the rank's arena (first fit from its bottom, or its top;
 * 256-byte aligned). */
static void *
dev_alloc(xport_t *x, int32_t rank, uint64_t bytes, bool top)
{
	cudaStream_t st;
	arena_t *ar;
	uint64_t off;

	if (!nccl_on_rank(x, rank, &st) || (ar = arena_of(x, nccl_local_index(&x->cm, rank), rank)) == NULL)
		return NULL;
	if (!(top ? gpu_arena_get_top : gpu_arena_get)(&ar->a, bytes, &off)) {
		refit_err_set(&x->derr, REFIT_ERR_NOMEM, "nccl transport: rank %d needs %" PRIu64
			      " more bytes of GPU staging at once than its budget holds: "
			      "gpu_staging_budget_bytes %" PRIu64 ", %" PRIu64 " in use, the largest "
			      "free run %" PRIu64 " (this refit's groups, relays and conversion "
			      "scratch; raise the budget or lower the plan's staging_bytes)", rank,
			      bytes, x->budget, ar->a.in_use, gpu_arena_largest(&ar->a));
		return NULL;
	}
	return ar->base + off;
}

void *
nccl_dev_alloc(void *ctx, int32_t rank, uint64_t bytes)
{
	return dev_alloc(ctx, rank, bytes, false);
}

void *
nccl_dev_alloc_top(void *ctx, int32_t rank, uint64_t bytes)
{
	return dev_alloc(ctx, rank, bytes, true);
}

void
nccl_dev_free(void *ctx, int32_t rank, void *p)
{
	xport_t *x = ctx;
	cudaStream_t st;
	arena_t *ar;

	if (p == NULL)
		return;
	/* a poisoned node keeps its memory: work that never ended may write it
	 * (and cudaFree, which synchronises the device, would wait for it) */
	if (nccl_is_poisoned(x)) {
		x->kept++;
		return;
	}
	/* the communicators were dropped with their arenas (their streams
	 * drained, else the node would be poisoned): nothing to give back */
	if (nccl_local_index(&x->cm, rank) < 0)
		return;
	if (!nccl_on_rank(x, rank, &st))
		return;
	ar = &x->cm.arena[nccl_local_index(&x->cm, rank)];
	if (ar->base == NULL || (uint8_t *)p < ar->base || (uint8_t *)p >= ar->base + ar->a.size)
		return;   /* an arena of an epoch before (dropped and made again) */
	/* nothing queued may still use it (failed and aborted sessions skip
	 * their syncs), bounded: a stream that does not drain keeps it */
	if (!nccl_drained(x->api, st, DRAIN_MS)) {
		nccl_poison(x, rank, "staging was to be freed, but its stream did not drain in 10 s");
		x->kept++;
		return;
	}
	if (!gpu_arena_put(&ar->a, (uint64_t)((uint8_t *)p - ar->base)))
		log_warnx("nccl: node %s: rank %d: %p is no allocation of its arena", x->node_id,
			  rank, p);
}

void
nccl_dev_copy(void *ctx, int32_t rank, void *dst, const void *src, uint64_t n)
{
	xport_t *x = ctx;
	cudaStream_t st;

	if (nccl_dfailed(x) || !nccl_on_rank(x, rank, &st))
		return;
	DCHK(x, rank, x->api->cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st),
	     "cudaMemcpyAsync");
}

/* Wait for one stream, bounded by the session's deadline and abort flag. */
static refit_status_t
wait_stream(xport_t *x, int32_t rank, cudaStream_t st, refit_err_t *err)
{
	for (;;) {
		cudaError_t e = x->api->cudaStreamQuery(st);

		if (e == cudaSuccess)
			return REFIT_OK;
		if (e != cudaErrorNotReady) {
			nccl_dfail(x, e, rank, "a queued copy (cudaStreamQuery)");
			return nccl_dfail_out(x, err);
		}
		if (x->scfg && atomic_load(x->scfg->abort))
			return refit_err_set(err, REFIT_ERR_ABORTED, "nccl transport: aborted "
					     "while copies of rank %d ran", rank);
		if (x->scfg && xport_now_ms() >= x->scfg->deadline_ms)
			return refit_err_set(err, REFIT_ERR_TIMEOUT, "nccl transport: copies of "
					     "rank %d ran past the deadline", rank);
		usleep(50);
	}
}

/*
 * A host copy did not end: abort the communicators (their kernels end at
 * once, and the stream drains unless the device is stuck; nccl_drop_comms waits
 * 10 s and poisons the node if not).  A copy still running after that may
 * write the pinned buffer: it is kept, never freed or reused.
 */
static void
host_copy_abandon(xport_t *x, int32_t rank, refit_status_t st, const char *why)
{
	refit_err_set(&x->derr, st, "nccl transport: rank %d: a copy with the host %s; the "
		      "communicators were aborted (the caller's memory was never given to "
		      "the device: copies go through a pinned buffer)", rank, why);
	nccl_drop_comms(x, true);
	if (nccl_is_poisoned(x)) {
		x->bounce = NULL;  /* kept */
		x->kept++;
	}
}

/*
 * Wait for the copy just queued on st: bounded by the session's deadline
 * and abort flag, and by HOST_COPY_MS.  true: done.
 */
static bool
host_copy_wait(xport_t *x, int32_t rank, cudaStream_t st)
{
	int64_t end = xport_now_ms() + HOST_COPY_MS;
	cudaError_t e;

	if (x->scfg && x->scfg->deadline_ms < end)
		end = x->scfg->deadline_ms;
	for (;;) {
		if ((e = x->api->cudaStreamQuery(st)) == cudaSuccess)
			return true;
		if (e != cudaErrorNotReady) {
			nccl_dfail(x, e, rank, "a copy with the host (cudaStreamQuery)");
			return false;
		}
		if (x->scfg && atomic_load(x->scfg->abort)) {
			host_copy_abandon(x, rank, REFIT_ERR_ABORTED, "was still running at the "
					  "abort");
			return false;
		}
		if (xport_now_ms() >= end) {
			host_copy_abandon(x, rank, REFIT_ERR_TIMEOUT, "did not end before the "
					  "session's deadline (or in 60 s)");
			return false;
		}
		usleep(50);
	}
}

/*
 * A copy to or from the caller's host memory, which the caller frees or
 * reuses once this returns (a stack byte, a CRC buffer).  So the device
 * never sees that memory: each chunk goes through the transport's pinned
 * buffer (cudaMallocHost), copied to or from the caller's memory by the
 * CPU.  Pinned also keeps cudaMemcpyAsync asynchronous (to pageable memory
 * it returns only once the copy is done, cuda_runtime_api.h "API
 * synchronization behavior", unbounded).  First the stream drains (bounded
 * by the session: a copy queued behind a group that never ends would never
 * start); then each chunk's copy is waited for, bounded; one that does not
 * end aborts the communicators, and if it still runs then, the buffer is
 * kept and the node poisoned.  Errors go to the session (next sync).
 */
static void
host_copy(xport_t *x, int32_t rank, void *dst, const void *src, uint64_t n,
	  enum cudaMemcpyKind kind)
{
	const gpu_api_t *a = x->api;
	bool d2h = kind == cudaMemcpyDeviceToHost;
	cudaStream_t st;
	cudaError_t e;

	if (nccl_dfailed(x) || !nccl_on_rank(x, rank, &st))
		return;
	if (!host_copy_wait(x, rank, st))  /* what was queued before */
		return;
	if (x->bounce == NULL && (e = a->cudaMallocHost(&x->bounce, HOST_CHUNK)) != cudaSuccess) {
		x->bounce = NULL;
		nccl_dfail(x, e, rank, "cudaMallocHost (the pinned buffer of host copies)");
		return;
	}
	for (uint64_t off = 0; off < n;) {
		uint64_t k = n - off < HOST_CHUNK ? n - off : HOST_CHUNK;

		if (!d2h)
			memcpy(x->bounce, (const uint8_t *)src + off, k);
		DCHK(x, rank, a->cudaMemcpyAsync(d2h ? x->bounce : (uint8_t *)dst + off,
						 d2h ? (const uint8_t *)src + off : x->bounce, k,
						 kind, st),
		     d2h ? "cudaMemcpyAsync to the host" : "cudaMemcpyAsync from the host");
		if (!host_copy_wait(x, rank, st))
			return;
		if (d2h)
			memcpy((uint8_t *)dst + off, x->bounce, k);
		off += k;
	}
}

void
nccl_dev_to_host(void *ctx, int32_t rank, void *host, const void *dev, uint64_t n)
{
	memset(host, 0, n);
	host_copy(ctx, rank, host, dev, n, cudaMemcpyDeviceToHost);
}

void
nccl_dev_from_host(void *ctx, int32_t rank, void *dev, const void *host, uint64_t n)
{
	host_copy(ctx, rank, dev, host, n, cudaMemcpyHostToDevice);
}

/* Every queued copy done, or the session's first device error. */
refit_status_t
nccl_dev_sync(void *ctx, refit_err_t *err)
{
	xport_t *x = ctx;

	for (size_t i = 0; i < x->cm.nlocal && !nccl_dfailed(x); i++) {
		cudaError_t e = x->api->cudaSetDevice(x->cm.dev[i]);

		if (e != cudaSuccess) {
			nccl_dfail(x, e, x->cm.local[i], "cudaSetDevice");
			break;
		}
		CHECK(wait_stream(x, x->cm.local[i], x->cm.stream[i], err));
	}
	if (nccl_dfailed(x))
		return nccl_dfail_out(x, err);
	return REFIT_OK;
}

#endif
