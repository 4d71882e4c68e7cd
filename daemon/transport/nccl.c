/*
 * nccl.c - the nccl transport: GPU memory, NCCL point-to-point in groups
 * (see transport.h, docs/dataplane.md).
 *
 * libcudart and libnccl are loaded with dlopen (gpu.c); without them, or
 * without a device, the backend says why it cannot run and refitd refuses
 * to start with it.  Communicators: one per local rank (GPU), all ranks of
 * the epoch in one NCCL world (communicator rank = index of the global rank
 * in the epoch's ascending rank list), created in non-blocking mode at the
 * first session of an epoch from the unique id the coordinator took from
 * the lowest rank's node, polled against the session's deadline, aborted
 * (ncclCommAbort) on any failure, timeout or abort request, and never
 * reused after that: a node whose communicators were aborted waits for a
 * new epoch and a new id (the coordinator bumps the epoch after every
 * failed or aborted nccl refit).  When members only left, the epoch comes
 * without an id and the survivors shrink (ncclCommShrink).  One session at
 * a time uses them (the coordinator also runs one nccl refit at a time, so
 * groups are posted in one order on every node: docs/dataplane.md).
 *
 * Devices: local rank i runs on the device gpu_devices names (default i);
 * its communicator, its stream, its staging and every copy that touches its
 * memory use that device, made current on the calling thread first (the
 * current device is per thread).  Box copies: cudaMemcpyAsync /
 * cudaMemcpy2DAsync for contiguous rows, refitGpuCopyStrided (a kernel)
 * when the innermost dim is strided.  Every CUDA return is checked; the
 * first failure of a session is kept and returned by the next sync, so a
 * slice with a failed copy fails and is never committed.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/transport/gpu.h"
#include "daemon/transport/gpu_arena.h"
#include "daemon/transport/transport.h"

#ifndef REFIT_HAVE_NCCL

static char nowhy[300];

static const char *
nccl_unavailable(void)
{
	gpu_load(1, nowhy, sizeof(nowhy));
	return nowhy;
}

/* never started: unavailable says why, and refitd refuses to start with it */
const xport_ops_t xport_nccl_ops = {.name = "nccl", .memory = XPORT_MEM_DEVICE,
				    .unavailable = nccl_unavailable};

#else

/* The communicators and what they were made for.  Only the session that
 * owns the transport (x->busy) touches them, without x->mu. */
typedef struct comms {
	uint64_t epoch;           /* 0: none */
	int32_t *ranks;           /* the world, ascending (communicator rank = index) */
	size_t nranks;
	int32_t *local;           /* this node's ranks in the world */
	size_t nlocal;
	ncclComm_t *comm;         /* per local rank */
	cudaStream_t *stream;
	int *dev;
	struct arena *arena;      /* per local rank: its staging arena (made at first use) */
	ncclUniqueId id;          /* the id they were made from */
	bool have_id;             /* false: shrunk from older ones */
} comms_t;

/* A rank's GPU staging arena: one ncclMemAlloc of the budget, registered
 * with the rank's communicator, for every dev_alloc of the epoch. */
typedef struct arena {
	uint8_t *base;            /* NULL: not made yet */
	void *reg;                /* ncclCommRegister's handle (NULL: none) */
	gpu_arena_t a;
} arena_t;

/* The world of an epoch as PrepareEpoch gave it. */
typedef struct world {
	uint64_t epoch;
	int32_t *ranks, *local;
	size_t nranks, nlocal;
	ncclUniqueId id;
	bool have_id;
} world_t;

struct xport {
	const gpu_api_t *api;
	char *node_id;
	/* configured: rank -> device (fixed after start) */
	int32_t *cranks;
	int *cdevs;
	size_t ncranks;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	world_t w;                /* mu */
	bool busy;                /* mu: a session owns cm and the fields below */
	comms_t cm;
	ncclUniqueId used_id;     /* the last id communicators were made from */
	bool have_used;
	VEC(gpu_root_t) roots;    /* mu: holders of the ids this node made */
	const xport_session_cfg_t *scfg;   /* the owning session's bounds */
	refit_err_t derr;         /* the session's first device error (dev ops
				     return nothing: the next sync returns it) */
	dp_dev_ops_t dev;
	void *bounce;             /* pinned, HOST_CHUNK bytes: every host copy goes
				     through it (NULL until the first) */
	/* mu: "" or why this node runs no more refits: work on a stream did
	 * not end within its bound, even after its communicator was aborted,
	 * and the memory that work may still write was kept (never freed or
	 * reused: device staging, the pinned buffer) */
	char poison[REFIT_ERR_MSG_MAX];
	bool dead;                /* mu: poisoned by a sticky CUDA error (poison_dead) */
	uint64_t budget;          /* gpu_staging_budget_bytes: each rank's arena */
	uint64_t kept;            /* allocations kept so (not freed) */
};

/* Host copies go through the pinned bounce buffer in chunks of this. */
#define HOST_CHUNK (4u << 20)
/* How long a stream may take to drain before its memory is freed (after an
 * abort, NCCL's kernels end at once), and a host copy on an idle stream may
 * take when no session bounds it: longer is a stuck device. */
#define DRAIN_MS 10000
#define HOST_COPY_MS 60000

struct xport_session {
	xport_t *x;
	xport_session_cfg_t cfg;
};

static char why_buf[1024];

static const char *
nccl_unavailable(void)
{
	return gpu_load(1, why_buf, sizeof(why_buf)) ? NULL : why_buf;
}

static void poison_dead(xport_t *x, int32_t rank, const char *what, cudaError_t e);

/*
 * The errors after which, as CUDA documents them (driver_types.h), "the
 * process must be terminated and relaunched": the device's context is dead
 * and every later CUDA call returns the same error.
 */
static bool
sticky(cudaError_t e)
{
	switch ((int)e) {
	case cudaErrorIllegalAddress:      /* 700 */
	case cudaErrorLaunchTimeout:       /* 702 */
	case cudaErrorAssert:              /* 710 */
	case cudaErrorHardwareStackError:  /* 714 */
	case cudaErrorIllegalInstruction:  /* 715 */
	case cudaErrorMisalignedAddress:   /* 716 */
	case cudaErrorInvalidAddressSpace: /* 717 */
	case cudaErrorInvalidPc:           /* 718 */
	case cudaErrorLaunchFailure:       /* 719 */
	case 721:                          /* cudaErrorTensorMemoryLeak (CUDA 12.8+) */
	case 810:                          /* cudaErrorMpsClientTerminated */
		return true;
	default:
		return false;
	}
}

static refit_status_t
cuda_err(xport_t *x, cudaError_t e, const char *what, refit_err_t *err)
{
	if (sticky(e))
		poison_dead(x, -1, what, e);
	return refit_err_set(err, REFIT_ERR_CUDA, "nccl transport: %s: %s (cudaError %d)", what,
			     x->api->cudaGetErrorString(e), (int)e);
}

static void
world_free(world_t *w)
{
	free(w->ranks);
	free(w->local);
	memset(w, 0, sizeof(*w));
}

static void
world_copy(world_t *dst, const world_t *src)
{
	*dst = *src;
	dst->ranks = xmalloc((src->nranks + 1) * sizeof(int32_t));
	dst->local = xmalloc((src->nlocal + 1) * sizeof(int32_t));
	memcpy(dst->ranks, src->ranks, src->nranks * sizeof(int32_t));
	memcpy(dst->local, src->local, src->nlocal * sizeof(int32_t));
}

static int
index_in(const int32_t *v, size_t n, int32_t r)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (v[mid] < r)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && v[lo] == r ? (int)lo : -1;
}

/* Index of rank r among the communicators' local ranks (-1: none). */
static int
local_index(const comms_t *cm, int32_t r)
{
	for (size_t i = 0; i < cm->nlocal; i++)
		if (cm->local[i] == r)
			return (int)i;
	return -1;
}

/* The configured device of rank r (-1: not a rank of this node). */
static int
device_of(const xport_t *x, int32_t r)
{
	for (size_t i = 0; i < x->ncranks; i++)
		if (x->cranks[i] == r)
			return x->cdevs[i];
	return -1;
}

/* ---- device memory operations -------------------------------------------------- */

/* A device error of the session so far (refit_err_set keeps the first:
 * later ones follow from it). */
static bool
dfailed(const xport_t *x)
{
	return x->derr.status != REFIT_OK;
}

static void
dfail(xport_t *x, cudaError_t e, int32_t rank, const char *what)
{
	if (sticky(e))
		poison_dead(x, rank, what, e);
	refit_err_set(&x->derr, REFIT_ERR_CUDA, "nccl transport: rank %d: %s: %s (cudaError "
		      "%d)", rank, what, x->api->cudaGetErrorString(e), (int)e);
}

/* The session's device error, into err. */
static refit_status_t
dfail_out(const xport_t *x, refit_err_t *err)
{
	return refit_err_set(err, x->derr.status, "%s", x->derr.msg);
}

/* The node is poisoned (see xport.poison): why, or NULL. */
static bool
poisoned(xport_t *x)
{
	bool p;

	pthread_mutex_lock(&x->mu);
	p = x->poison[0] != '\0';
	pthread_mutex_unlock(&x->mu);
	return p;
}

/* Work on rank's stream did not end in time and may still write memory:
 * from now on nothing that work may touch is freed or reused, and the node
 * refuses refits (the first reason stays). */
static void
poison(xport_t *x, int32_t rank, const char *what)
{
	pthread_mutex_lock(&x->mu);
	if (x->poison[0] == '\0')
		snprintf(x->poison, sizeof(x->poison), "rank %d: %s; the memory it may still "
			 "write is kept (never freed or reused) and this node runs no more "
			 "refits until refitd restarts", rank, what);
	pthread_mutex_unlock(&x->mu);
	log_warnx("nccl: node %s: rank %d: %s: the node is poisoned (restart refitd)",
		  x->node_id, rank, what);
}

/* A sticky CUDA error (what returned e, on rank's device; -1: not known):
 * the context is dead, nothing of this process's CUDA works again, and the
 * node must exit for systemd to restart refitd (nccl_poisoned says so).
 * The first reason stays. */
static void
poison_dead(xport_t *x, int32_t rank, const char *what, cudaError_t e)
{
	char who[32] = "";
	bool first;

	if (rank >= 0)
		snprintf(who, sizeof(who), "rank %d: ", (int)rank);
	pthread_mutex_lock(&x->mu);
	first = !x->dead;
	if (first) {
		x->dead = true;
		snprintf(x->poison, sizeof(x->poison), "%s%s: %s (cudaError %d), a sticky CUDA "
			 "error: the device's context is dead and every later CUDA call of "
			 "refitd fails; refitd must restart", who, what,
			 x->api->cudaGetErrorString(e), (int)e);
	}
	pthread_mutex_unlock(&x->mu);
	if (first)
		log_errorx("nccl: node %s: %s: %s (cudaError %d): a sticky CUDA error, the node is "
			   "poisoned and exits", x->node_id, what, x->api->cudaGetErrorString(e),
			   (int)e);
}

/* Poll stream st until it drained, for at most ms: true when it did (or
 * failed: a failed stream runs nothing more). */
static bool
drained(const gpu_api_t *a, cudaStream_t st, int64_t ms)
{
	for (int64_t end = xport_now_ms() + ms;; usleep(100)) {
		if (a->cudaStreamQuery(st) != cudaErrorNotReady)
			return true;
		if (xport_now_ms() >= end)
			return false;
	}
}

/* Make rank's device current on this thread; its stream (NULL: failed). */
static bool
on_rank(xport_t *x, int32_t rank, cudaStream_t *st)
{
	int li = local_index(&x->cm, rank);
	cudaError_t e;

	if (li < 0) {
		refit_err_set(&x->derr, REFIT_ERR_INTERNAL, "nccl transport: rank %d has no "
			      "communicator on this node", rank);
		return false;
	}
	if ((e = x->api->cudaSetDevice(x->cm.dev[li])) != cudaSuccess) {
		dfail(x, e, rank, "cudaSetDevice");
		return false;
	}
	*st = x->cm.stream[li];
	return true;
}

#define DCHK(x, rank, call, what)                                  \
	do {                                                       \
		cudaError_t e_ = (call);                           \
		if (e_ != cudaSuccess) {                           \
			dfail(x, e_, rank, what);                  \
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
		for (int64_t i = 0; i < box->size[r] && !dfailed(x); i++)
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
static void
dev_copy_box(void *ctx, int32_t rank, const dp_view_t *sv, const plan_shard_t *ss,
	     const dp_view_t *dv, const plan_shard_t *ds, const plan_box_t *box)
{
	xport_t *x = ctx;
	cudaStream_t st;
	int nd = sv->ndim, c = nd - 1, outer = nd >= 2 ? nd - 2 : 0;
	int64_t e = sv->elem;
	int64_t so[PLAN_MAX_DIMS], dof[PLAN_MAX_DIMS], idx[PLAN_MAX_DIMS] = {0};
	int64_t soff = 0, doff = 0;
	bool contig;

	if (dfailed(x) || !on_rank(x, rank, &st))
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
			dfail(x, (cudaError_t)rc, rank, "refitGpuCopyStrided");
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
		if (dfailed(x))
			return;
		/* next index over the outer dims */
		for (d = outer - 1; d >= 0 && ++idx[d] == box->size[d]; d--)
			idx[d] = 0;
		if (d < 0)
			return;
	}
}

/* One conversion launch (dataplane/conv_dev.c) on rank's stream. */
static void
dev_convert(void *ctx, int32_t rank, const dp_cvt_op_t *op)
{
	xport_t *x = ctx;
	cudaStream_t st;
	int rc;

	if (dfailed(x) || !on_rank(x, rank, &st))
		return;
	(void)x->api->cudaGetLastError();   /* as for copy_strided: a stale error */
	if ((rc = x->api->convert(op, st)) != 0)
		dfail(x, (cudaError_t)rc, rank, op->op == DP_CVT_CAST ? "refit_cuda_convert (cast)"
		      : op->op == DP_CVT_SCALES ? "refit_cuda_convert (scales)"
		      : "refit_cuda_convert (quantize)");
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

/* Staging from the rank's arena (first fit, 256-byte aligned). */
static void *
dev_alloc(void *ctx, int32_t rank, uint64_t bytes)
{
	xport_t *x = ctx;
	cudaStream_t st;
	arena_t *ar;
	uint64_t off;

	if (!on_rank(x, rank, &st) || (ar = arena_of(x, local_index(&x->cm, rank), rank)) == NULL)
		return NULL;
	if (!gpu_arena_get(&ar->a, bytes, &off)) {
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

/* Free a rank's arena (its communicator is gone, its stream drained, so
 * nothing queued uses it: allocations still held are given up with it, a
 * later dev_free finds no arena): NCCL dropped the registration with the
 * communicator (ncclRegCleanup). */
static void
arena_free(xport_t *x, size_t li)
{
	arena_t *ar = &x->cm.arena[li];
	ncclResult_t r;

	if (ar->base == NULL)
		return;
	if (poisoned(x)) {  /* work that never ended may still write it */
		x->kept++;
		log_warnx("nccl: node %s: rank %d: its staging arena is kept (the node is "
			  "poisoned)", x->node_id, x->cm.local[li]);
	} else if ((r = x->api->ncclMemFree(ar->base)) != ncclSuccess) {
		log_warnx("nccl: node %s: ncclMemFree: %s", x->node_id,
			  x->api->ncclGetErrorString(r));
	}
	log_info("nccl: node %s: rank %d: GPU staging held at most %" PRIu64 " of its %" PRIu64
		 " bytes this epoch", x->node_id, x->cm.local[li], ar->a.peak, x->budget);
	gpu_arena_fini(&ar->a);
	memset(ar, 0, sizeof(*ar));
}

static void
dev_free(void *ctx, int32_t rank, void *p)
{
	xport_t *x = ctx;
	cudaStream_t st;
	arena_t *ar;

	if (p == NULL)
		return;
	/* a poisoned node keeps its memory: work that never ended may write it
	 * (and cudaFree, which synchronises the device, would wait for it) */
	if (poisoned(x)) {
		x->kept++;
		return;
	}
	/* the communicators were dropped with their arenas (their streams
	 * drained, else the node would be poisoned): nothing to give back */
	if (local_index(&x->cm, rank) < 0)
		return;
	if (!on_rank(x, rank, &st))
		return;
	ar = &x->cm.arena[local_index(&x->cm, rank)];
	if (ar->base == NULL || (uint8_t *)p < ar->base || (uint8_t *)p >= ar->base + ar->a.size)
		return;   /* an arena of an epoch before (dropped and made again) */
	/* nothing queued may still use it (failed and aborted sessions skip
	 * their syncs), bounded: a stream that does not drain keeps it */
	if (!drained(x->api, st, DRAIN_MS)) {
		poison(x, rank, "staging was to be freed, but its stream did not drain in 10 s");
		x->kept++;
		return;
	}
	if (!gpu_arena_put(&ar->a, (uint64_t)((uint8_t *)p - ar->base)))
		log_warnx("nccl: node %s: rank %d: %p is no allocation of its arena", x->node_id,
			  rank, p);
}

static void
dev_copy(void *ctx, int32_t rank, void *dst, const void *src, uint64_t n)
{
	xport_t *x = ctx;
	cudaStream_t st;

	if (dfailed(x) || !on_rank(x, rank, &st))
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
			dfail(x, e, rank, "a queued copy (cudaStreamQuery)");
			return dfail_out(x, err);
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

static void drop_comms(xport_t *x, bool abort);

/*
 * A host copy did not end: abort the communicators (their kernels end at
 * once, and the stream drains unless the device is stuck; drop_comms waits
 * 10 s and poisons the node if not).  A copy still running after that may
 * write the pinned buffer: it is kept, never freed or reused.
 */
static void
host_copy_abandon(xport_t *x, int32_t rank, refit_status_t st, const char *why)
{
	refit_err_set(&x->derr, st, "nccl transport: rank %d: a copy with the host %s; the "
		      "communicators were aborted (the caller's memory was never given to "
		      "the device: copies go through a pinned buffer)", rank, why);
	drop_comms(x, true);
	if (poisoned(x)) {
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
			dfail(x, e, rank, "a copy with the host (cudaStreamQuery)");
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

	if (dfailed(x) || !on_rank(x, rank, &st))
		return;
	if (!host_copy_wait(x, rank, st))  /* what was queued before */
		return;
	if (x->bounce == NULL && (e = a->cudaMallocHost(&x->bounce, HOST_CHUNK)) != cudaSuccess) {
		x->bounce = NULL;
		dfail(x, e, rank, "cudaMallocHost (the pinned buffer of host copies)");
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

static void
dev_to_host(void *ctx, int32_t rank, void *host, const void *dev, uint64_t n)
{
	memset(host, 0, n);
	host_copy(ctx, rank, host, dev, n, cudaMemcpyDeviceToHost);
}

static void
dev_from_host(void *ctx, int32_t rank, void *dev, const void *host, uint64_t n)
{
	host_copy(ctx, rank, dev, host, n, cudaMemcpyHostToDevice);
}

/* Every queued copy done, or the session's first device error. */
static refit_status_t
dev_sync(void *ctx, refit_err_t *err)
{
	xport_t *x = ctx;

	for (size_t i = 0; i < x->cm.nlocal && !dfailed(x); i++) {
		cudaError_t e = x->api->cudaSetDevice(x->cm.dev[i]);

		if (e != cudaSuccess) {
			dfail(x, e, x->cm.local[i], "cudaSetDevice");
			break;
		}
		CHECK(wait_stream(x, x->cm.local[i], x->cm.stream[i], err));
	}
	if (dfailed(x))
		return dfail_out(x, err);
	return REFIT_OK;
}

/* ---- the backend ------------------------------------------------------------------- */

static refit_status_t
nccl_start(const xport_cfg_t *cfg, xport_t **out, refit_err_t *err)
{
	char why[1024];
	const gpu_api_t *a = gpu_load(1, why, sizeof(why));
	xport_t *x;
	int *devs;
	refit_status_t rc;

	if (a == NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "nccl transport: %s", why);
	devs = xcalloc(cfg->nranks + 1, sizeof(*devs));
	if (cfg->gpu_devices != NULL) {
		const char *p = cfg->gpu_devices;
		size_t n = 0;

		while (*p && n <= cfg->nranks) {
			char *end;
			long v = strtol(p, &end, 10);

			if (end == p || v < 0 || v > 1 << 20 || n == cfg->nranks ||
			    (*end != ',' && *end != '\0')) {
				free(devs);
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "gpu_devices \"%s\" "
						     "is not a comma-separated list of one CUDA "
						     "device per rank (%zu ranks)", cfg->gpu_devices,
						     cfg->nranks);
			}
			devs[n++] = (int)v;
			p = *end ? end + 1 : end;
		}
		if (n != cfg->nranks) {
			free(devs);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "gpu_devices \"%s\" names "
					     "%zu devices for %zu ranks", cfg->gpu_devices, n,
					     cfg->nranks);
		}
	} else {
		for (size_t i = 0; i < cfg->nranks; i++)
			devs[i] = (int)i;
	}
	for (size_t i = 0; i < cfg->nranks; i++) {
		if (devs[i] >= a->ndevices) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "nccl transport: rank %d "
					   "would run on CUDA device %d, but %s sees %d device%s%s",
					   cfg->ranks[i], devs[i], a->cuda_path, a->ndevices,
					   a->ndevices == 1 ? "" : "s", cfg->gpu_devices ?
					   " (gpu_devices)" : " (set gpu_devices)");
			free(devs);
			return rc;
		}
		for (size_t k = 0; k < i; k++)
			if (devs[k] == devs[i]) {
				rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "nccl transport: ranks "
						   "%d and %d on one device (%d): NCCL refuses two "
						   "ranks of a communicator on one device (run one "
						   "refitd per rank with NCCL_HOSTID instead)",
						   cfg->ranks[k], cfg->ranks[i], devs[i]);
				free(devs);
				return rc;
			}
	}
	x = xcalloc(1, sizeof(*x));
	x->api = a;
	x->node_id = xstrdup(cfg->node_id);
	x->ncranks = cfg->nranks;
	x->cranks = xmalloc((cfg->nranks + 1) * sizeof(int32_t));
	memcpy(x->cranks, cfg->ranks, cfg->nranks * sizeof(int32_t));
	x->cdevs = devs;
	x->budget = cfg->gpu_staging_budget ? cfg->gpu_staging_budget : 1ull << 30;
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	x->dev = (dp_dev_ops_t){dev_copy_box, dev_alloc, dev_free, dev_copy, dev_to_host,
				dev_from_host, dev_sync, a->convert ? dev_convert : NULL, x};
	for (size_t i = 0; i < cfg->nranks; i++)
		log_info("nccl: node %s: rank %d on CUDA device %d", x->node_id, x->cranks[i],
			 x->cdevs[i]);
	*out = x;
	return REFIT_OK;
}

static const char *
nccl_endpoint(xport_t *x)
{
	(void)x;
	return "nccl";
}

static void
nccl_set_epoch(xport_t *x, uint64_t epoch, const uint8_t *token, size_t len)
{
	(void)x;
	(void)epoch;
	(void)token;
	(void)len; /* NCCL ids are secret enough: only the coordinator hands them out */
}

/* A communicator's state; ncclInProgress while its job runs. */
static ncclResult_t
comm_state(const gpu_api_t *a, ncclComm_t c)
{
	ncclResult_t st = ncclSuccess, r = a->ncclCommGetAsyncError(c, &st);

	return r == ncclSuccess ? st : r;
}

/*
 * The library's own text for an error, as "; NCCL's last error: <text>", or
 * "" when it has none (or lacks ncclGetLastError): an internal error's code
 * alone says nothing, NCCL explains it there.  NCCL keeps one last message,
 * not one per communicator (the argument is unused), hence "last".
 */
static const char *
nccl_says(const gpu_api_t *a, ncclComm_t c, char *buf, size_t n)
{
	const char *t = a->ncclGetLastError ? a->ncclGetLastError(c) : NULL;

	if (t == NULL || *t == '\0')
		return "";
	snprintf(buf, n, "; NCCL's last error: %s", t);
	return buf;
}

/*
 * Free one communicator (local rank rank): ncclCommDestroy when it is ready
 * and healthy, else ncclCommAbort, which works in any state.  The state can
 * change between the check and the destroy (an asynchronous error of the
 * proxy), so a refused destroy is followed by an abort.  NCCL 2.27.6 and
 * later also leave the calling thread inside a group when they refuse a
 * destroy (init.cc: ncclGroupStartInternal, then NCCLCHECK's early return
 * past ncclGroupEndInternal; 2.27.5 and before open none): that group is closed
 * here, or every later group of this thread would never be launched (its
 * ncclGroupEnd would only close the one left open) and its streams would
 * look drained.
 */
#define NCCL_DESTROY_GROUP 22706   /* the first NCCL whose refused destroy leaves a group */

/*
 * ncclCommAbort, bounded.  NCCL's abort tears down its proxy thread and
 * connections and waits for the communicator's kernels (init.cc
 * commReclaim -> commFree): a stuck device or a proxy blocked in the
 * network can hold it without end, and with it the pool thread and every
 * later refit.  It runs on a thread of its own on the caller's current
 * device; after ABORT_MS the caller goes on and the node is poisoned (the
 * communicator's work may still write its memory, so nothing of it is
 * freed; refits are refused until refitd restarts).  The abandoned thread
 * frees its job when the abort returns, if ever.
 */
#define ABORT_MS 10000

typedef struct abort_job {
	const gpu_api_t *a;
	ncclComm_t c;
	int dev;                  /* -1: none current */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done, abandoned;
	ncclResult_t r;
} abort_job_t;

static void
abort_job_free(abort_job_t *j)
{
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
}

static void *
abort_main(void *arg)
{
	abort_job_t *j = arg;
	ncclResult_t r;
	bool gone;

	if (j->dev >= 0)
		(void)j->a->cudaSetDevice(j->dev);
	r = j->a->ncclCommAbort(j->c);
	pthread_mutex_lock(&j->mu);
	j->r = r;
	j->done = true;
	gone = j->abandoned;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (gone)
		abort_job_free(j);
	return NULL;
}

static ncclResult_t
abort_bounded(xport_t *x, ncclComm_t c, int32_t rank)
{
	abort_job_t *j = xcalloc(1, sizeof(*j));
	int64_t end = xport_now_ms() + ABORT_MS;
	pthread_attr_t at;
	pthread_t t;
	ncclResult_t r;

	j->a = x->api;
	j->c = c;
	if (x->api->cudaGetDevice(&j->dev) != cudaSuccess)
		j->dev = -1;
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &at, abort_main, j) != 0) {   /* no thread: unbounded */
		pthread_attr_destroy(&at);
		abort_job_free(j);
		return x->api->ncclCommAbort(c);
	}
	pthread_attr_destroy(&at);
	pthread_mutex_lock(&j->mu);
	while (!j->done && xport_now_ms() < end) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	if (!j->done) {
		j->abandoned = true;
		pthread_mutex_unlock(&j->mu);
		poison(x, rank, "ncclCommAbort did not return within 10 s (a stuck device or "
		       "proxy): its communicator and the memory its work may write are kept");
		return ncclInProgress;   /* said: the callers log nothing more */
	}
	r = j->r;
	pthread_mutex_unlock(&j->mu);
	abort_job_free(j);
	return r;
}

static void
comm_free(xport_t *x, ncclComm_t c, int32_t rank, bool abort)
{
	const gpu_api_t *a = x->api;
	ncclResult_t r;

	if (!abort && comm_state(a, c) == ncclSuccess) {
		if ((r = a->ncclCommDestroy(c)) == ncclSuccess)
			return;
		log_warnx("nccl: node %s: ncclCommDestroy (rank %d): %s; aborting it", x->node_id,
			  rank, a->ncclGetErrorString(r));
		if (a->nccl_version >= NCCL_DESTROY_GROUP && (r = a->ncclGroupEnd()) != ncclSuccess &&
		    r != ncclInProgress)
			log_warnx("nccl: node %s: ncclGroupEnd after the refused ncclCommDestroy "
				  "(rank %d): %s", x->node_id, rank, a->ncclGetErrorString(r));
	}
	if ((r = abort_bounded(x, c, rank)) != ncclSuccess && r != ncclInProgress)
		log_warnx("nccl: node %s: ncclCommAbort (rank %d): %s", x->node_id, rank,
			  a->ncclGetErrorString(r));
}

/* Free the communicators and their streams: abort (they may be
 * mid-operation, or even in progress) or destroy.  Owner only. */
static void
drop_comms(xport_t *x, bool abort)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;

	for (size_t i = 0; i < cm->nlocal && cm->comm; i++) {
		cudaError_t e;

		if (cm->dev && (e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess)
			log_warnx("nccl: node %s: cudaSetDevice(%d): %s", x->node_id, cm->dev[i],
				  a->cudaGetErrorString(e));
		/* a communicator in progress or with an error cannot be destroyed
		 * (NCCL refuses): it is aborted */
		if (cm->comm[i] != NULL)
			comm_free(x, cm->comm[i], cm->local[i], abort);
		/* what the stream still holds (operations of an aborted communicator
		 * end at once) finishes before its buffers can be freed; a stream
		 * that does not poisons the node: its buffers are kept */
		if (cm->stream && cm->stream[i] && !drained(a, cm->stream[i], DRAIN_MS))
			poison(x, cm->local[i], "its stream did not drain within 10 s of its "
			       "communicator's end");
		if (cm->stream && cm->stream[i] &&
		    (e = a->cudaStreamDestroy(cm->stream[i])) != cudaSuccess)
			log_warnx("nccl: node %s: cudaStreamDestroy (rank %d): %s", x->node_id,
				  cm->local[i], a->cudaGetErrorString(e));
		if (cm->arena)
			arena_free(x, i);
	}
	free(cm->arena);
	free(cm->comm);
	free(cm->stream);
	free(cm->dev);
	free(cm->ranks);
	free(cm->local);
	memset(cm, 0, sizeof(*cm));
}

static void release_roots(xport_t *x, const ncclUniqueId *keep);

static void
nccl_set_world(xport_t *x, const xport_world_t *w)
{
	world_t nw = {.epoch = w->epoch, .nranks = w->nranks, .nlocal = w->nlocal};

	nw.ranks = (int32_t *)w->ranks;
	nw.local = (int32_t *)w->local;
	nw.have_id = w->id_len == sizeof(nw.id);
	if (nw.have_id)
		memcpy(&nw.id, w->id, sizeof(nw.id));
	pthread_mutex_lock(&x->mu);
	/* the communicators stay until the next session: it reuses, shrinks
	 * or recreates them */
	world_free(&x->w);
	world_copy(&x->w, &nw);
	pthread_mutex_unlock(&x->mu);
	/* a new epoch: the roots of earlier ids are consumed or abandoned */
	release_roots(x, nw.have_id ? &nw.id : NULL);
}

static refit_status_t
nccl_unique_id(xport_t *x, uint8_t *out, size_t *len, refit_err_t *err)
{
	gpu_root_t r;
	char why[512];

	if (*len < sizeof(ncclUniqueId))
		return refit_err_set(err, REFIT_ERR_INTERNAL, "nccl id buffer too small");
	if (gpu_root_new(&r, 10000, why, sizeof(why)) != 0)
		return refit_err_set(err, REFIT_ERR_NCCL, "ncclGetUniqueId: %s", why);
	memcpy(out, r.id, sizeof(ncclUniqueId));
	*len = sizeof(ncclUniqueId);
	pthread_mutex_lock(&x->mu);
	VEC_PUSH(&x->roots, r);
	pthread_mutex_unlock(&x->mu);
	return REFIT_OK;
}

/*
 * End the holders of ids other than keep (NULL: all): their roots are
 * consumed (communicators formed from them) or abandoned (an epoch that
 * failed or passed).  Never under x->mu (reaping is bounded, not instant).
 */
static void
release_roots(xport_t *x, const ncclUniqueId *keep)
{
	VEC(gpu_root_t) gone = {0};

	pthread_mutex_lock(&x->mu);
	for (size_t i = 0; i < x->roots.n;) {
		if (keep && memcmp(x->roots.v[i].id, keep, sizeof(*keep)) == 0) {
			i++;
			continue;
		}
		VEC_PUSH(&gone, x->roots.v[i]);
		x->roots.v[i] = x->roots.v[--x->roots.n];
	}
	pthread_mutex_unlock(&x->mu);
	for (size_t i = 0; i < gone.n; i++)
		gpu_root_release(&gone.v[i]);
	VEC_FREE(&gone);
}

static refit_status_t
bounds(const xport_session_cfg_t *cfg, const char *what, refit_err_t *err)
{
	if (atomic_load(cfg->abort))
		return refit_err_set(err, REFIT_ERR_ABORTED, "nccl transport: %s: aborted", what);
	if (xport_now_ms() >= cfg->deadline_ms)
		return refit_err_set(err, REFIT_ERR_TIMEOUT, "nccl transport: %s: deadline "
				     "passed", what);
	return REFIT_OK;
}

/*
 * Open an NCCL group; what: the calls' name for the message.  NCCL 2.27
 * and later never refuse (group.cc: ncclGroupStartInternal only counts the
 * depth); earlier ones refused while the previous non-blocking group was
 * still being launched (ncclInvalidUsage).  Refused: no group is open, and
 * the calls must not be made (outside a group each would be its own).
 */
static refit_status_t
group_start(const gpu_api_t *a, const char *what, refit_err_t *err)
{
	ncclResult_t r = a->ncclGroupStart();

	if (r != ncclSuccess)
		return refit_err_set(err, REFIT_ERR_NCCL, "%sncclGroupStart: %s", what,
				     a->ncclGetErrorString(r));
	return REFIT_OK;
}

/* End the NCCL group a loop of calls opened; rc: the loop's result (the
 * first error stays), what: the calls' name for the message. */
static refit_status_t
group_end(const gpu_api_t *a, refit_status_t rc, const char *what, refit_err_t *err)
{
	ncclResult_t r = a->ncclGroupEnd();

	if (rc == REFIT_OK && r != ncclSuccess && r != ncclInProgress)
		return refit_err_set(err, REFIT_ERR_NCCL, "%sncclGroupEnd: %s", what,
				     a->ncclGetErrorString(r));
	return rc;
}

/*
 * Before aborting communicators that are still in progress: give what they
 * are doing up to 2 s to end.  A non-blocking group's operations reach
 * their streams from NCCL's own thread; aborting while that runs can leave
 * operations queued after the abort, on buffers freed next.  An init or a
 * connection that waits for a dead peer does not end: abort then.
 */
static void
settle(xport_t *x)
{
	int64_t end = xport_now_ms() + 2000;

	for (size_t i = 0; i < x->cm.nlocal; i++)
		while (comm_state(x->api, x->cm.comm[i]) == ncclInProgress &&
		       xport_now_ms() < end)
			usleep(200);
}

/* Wait until every communicator left ncclInProgress (deadline, abort); on
 * failure they are aborted.  Owner only, never under x->mu. */
static refit_status_t
wait_comms(xport_t *x, const xport_session_cfg_t *cfg, const char *what, refit_err_t *err)
{
	refit_status_t rc;

	for (;;) {
		bool pending = false;

		for (size_t i = 0; i < x->cm.nlocal; i++) {
			ncclResult_t st = comm_state(x->api, x->cm.comm[i]);

			if (st == ncclInProgress) {
				pending = true;
			} else if (st != ncclSuccess) {
				char says[320];

				rc = refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: %s (rank "
						   "%d): %s%s", what, x->cm.local[i],
						   x->api->ncclGetErrorString(st),
						   nccl_says(x->api, x->cm.comm[i], says,
							     sizeof(says)));
				drop_comms(x, true);
				return rc;
			}
		}
		if (!pending)
			return REFIT_OK;
		if ((rc = bounds(cfg, what, err)) != REFIT_OK) {
			settle(x);
			drop_comms(x, true);
			return rc;
		}
		usleep(200);
	}
}

/* The communicator ranks (indices into cm->ranks) the world w drops; *nex
 * of them.  NULL when w is not cm's world less some ranks. */
static int *
shrink_excluded(const comms_t *cm, const world_t *w, size_t *nex)
{
	int *excl = xcalloc(cm->nranks + 1, sizeof(*excl));
	size_t k = 0;

	*nex = 0;
	for (size_t i = 0; i < cm->nranks; i++) {
		while (k < w->nranks && w->ranks[k] < cm->ranks[i])
			k++;
		if (k < w->nranks && w->ranks[k] == cm->ranks[i])
			continue;
		excl[(*nex)++] = (int)i;
	}
	if (cm->nranks - *nex != w->nranks || *nex == 0) {
		free(excl);
		return NULL;
	}
	return excl;
}

/* ncclCommShrink on every local communicator, in one group; nc gets the
 * new ones (NULL until their job ends). */
static refit_status_t
shrink_issue(xport_t *x, const int *excl, size_t nex, ncclComm_t *nc, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;
	refit_status_t rc = REFIT_OK;

	CHECK(group_start(a, "ncclCommShrink: ", err));
	for (size_t i = 0; i < cm->nlocal && rc == REFIT_OK; i++) {
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
		cudaError_t e;
		ncclResult_t r;

		c.blocking = 0;
		if ((e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess) {
			rc = cuda_err(x, e, "cudaSetDevice", err);
			break;
		}
		r = a->ncclCommShrink(cm->comm[i], (int *)excl, (int)nex, &nc[i], &c,
				      NCCL_SHRINK_DEFAULT);
		if (r != ncclSuccess && r != ncclInProgress)
			rc = refit_err_set(err, REFIT_ERR_NCCL, "ncclCommShrink (rank %d): %s",
					   cm->local[i], a->ncclGetErrorString(r));
	}
	return group_end(a, rc, "ncclCommShrink: ", err);
}

/* Until every shrink ended: parents first (until each is done its child
 * may be NULL), then the children; bounded by the session. */
static refit_status_t
shrink_wait(xport_t *x, ncclComm_t *nc, const xport_session_cfg_t *cfg, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;

	for (;;) {
		bool pending = false;

		for (size_t i = 0; i < cm->nlocal; i++) {
			ncclResult_t st = comm_state(a, cm->comm[i]);
			/* NCCL's thread writes it (an atomic release store) */
			ncclComm_t child = __atomic_load_n(&nc[i], __ATOMIC_ACQUIRE);

			if (st == ncclSuccess && child != NULL)
				st = comm_state(a, child);
			else if (st == ncclSuccess) /* parent done, no child */
				st = ncclInternalError;
			if (st == ncclInProgress)
				pending = true;
			else if (st != ncclSuccess) {
				char says[320];

				return refit_err_set(err, REFIT_ERR_NCCL, "ncclCommShrink (rank %d): "
						     "%s%s%s", cm->local[i], a->ncclGetErrorString(st),
						     child ? "" : " (no new communicator)",
						     nccl_says(a, child ? child : cm->comm[i], says,
							       sizeof(says)));
			}
		}
		if (!pending)
			return REFIT_OK;
		CHECK(bounds(cfg, "shrinking the communicators", err));
		usleep(200);
	}
}

/*
 * Members only left (the new world is the old one less some ranks, this
 * node's ranks unchanged): shrink.  ncclCommShrink in non-blocking mode
 * leaves the new communicator NULL until its job ends, and the parent
 * reports ncclInProgress meanwhile: poll the parent, then the child.  A
 * parent in progress is never destroyed (NCCL refuses): on failure
 * everything is aborted.  Owner only.
 */
static refit_status_t
try_shrink(xport_t *x, const world_t *w, const xport_session_cfg_t *cfg, refit_err_t *err)
{
	comms_t *cm = &x->cm;
	size_t nex = 0;
	int *excl;
	ncclComm_t *nc;
	refit_status_t rc;

	if (cm->nlocal != w->nlocal || memcmp(cm->local, w->local, w->nlocal * sizeof(int32_t)))
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "nccl transport: epoch %" PRIu64
				     " came without a unique id, but this node's ranks changed: "
				     "it cannot shrink its communicators", w->epoch);
	if ((excl = shrink_excluded(cm, w, &nex)) == NULL)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "nccl transport: epoch %" PRIu64
				     " came without a unique id, but its %zu ranks are not the %zu "
				     "of this node's communicators less some: cannot shrink",
				     w->epoch, w->nranks, cm->nranks);
	nc = xcalloc(cm->nlocal + 1, sizeof(*nc));
	rc = shrink_issue(x, excl, nex, nc, err);
	free(excl);
	if (rc == REFIT_OK)
		rc = shrink_wait(x, nc, cfg, err);
	if (rc != REFIT_OK) {
		size_t nl = cm->nlocal;

		/*
		 * The parents first: ncclCommAbort of a parent ends its shrink and
		 * joins it (NCCL 2.28.9 init.cc: setCommAbortFlags sets the child's
		 * abort flag, ncclCommEnsureReady -> ncclGroupJobAbort), and the
		 * shrink, ending, writes its new communicator into nc[i], failed or
		 * not (ncclCommInitRankFunc: "assign it to user pointer").  Only
		 * then are the new ones known (aborted here) and nc freed: before,
		 * nc was read and freed first, the shrinks in progress wrote into
		 * freed memory and their communicators were never freed.
		 */
		drop_comms(x, true);
		for (size_t i = 0; i < nl; i++) {
			ncclComm_t c = __atomic_load_n(&nc[i], __ATOMIC_ACQUIRE);
			ncclResult_t ar = c != NULL ? abort_bounded(x, c, -1) : ncclSuccess;

			if (ar != ncclSuccess && ar != ncclInProgress)
				log_warnx("nccl: node %s: ncclCommAbort of a shrunk communicator "
					  "failed", x->node_id);
		}
		free(nc);
		return rc;
	}
	for (size_t i = 0; i < cm->nlocal; i++) {
		comm_free(x, cm->comm[i], cm->local[i], false);  /* the old one */
		cm->comm[i] = nc[i];
		/* the old communicator took the arena's registration with it */
		if (cm->arena[i].base != NULL &&
		    x->api->ncclCommRegister(nc[i], cm->arena[i].base, x->budget,
					     &cm->arena[i].reg) != ncclSuccess) {
			free(nc);
			drop_comms(x, true);
			return refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: rank %d: "
					     "ncclCommRegister of its staging arena with the shrunk "
					     "communicator failed", cm->local[i]);
		}
	}
	free(nc);
	free(cm->ranks);
	cm->ranks = xmalloc((w->nranks + 1) * sizeof(int32_t));
	memcpy(cm->ranks, w->ranks, w->nranks * sizeof(int32_t));
	cm->nranks = w->nranks;
	cm->epoch = w->epoch;
	cm->have_id = false;
	return REFIT_OK;
}

static refit_status_t
create_comms(xport_t *x, const world_t *w, const xport_session_cfg_t *cfg, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;
	ncclResult_t r;
	refit_status_t rc = REFIT_OK;

	cm->nlocal = w->nlocal;
	cm->local = xmalloc((w->nlocal + 1) * sizeof(int32_t));
	memcpy(cm->local, w->local, w->nlocal * sizeof(int32_t));
	cm->ranks = xmalloc((w->nranks + 1) * sizeof(int32_t));
	memcpy(cm->ranks, w->ranks, w->nranks * sizeof(int32_t));
	cm->nranks = w->nranks;
	cm->comm = xcalloc(w->nlocal + 1, sizeof(*cm->comm));
	cm->stream = xcalloc(w->nlocal + 1, sizeof(*cm->stream));
	cm->dev = xcalloc(w->nlocal + 1, sizeof(*cm->dev));
	cm->arena = xcalloc(w->nlocal + 1, sizeof(*cm->arena));
	for (size_t i = 0; i < w->nlocal; i++) {
		cudaError_t e;

		cm->dev[i] = device_of(x, w->local[i]);
		if (cm->dev[i] < 0) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "nccl transport: epoch %"
					   PRIu64 " gives this node rank %d, which it does not "
					   "serve", w->epoch, w->local[i]);
			break;
		}
		if ((e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess ||
		    (e = a->cudaStreamCreateWithFlags(&cm->stream[i], cudaStreamNonBlocking)) !=
			    cudaSuccess) {
			rc = cuda_err(x, e, "creating a stream", err);
			break;
		}
	}
	if (rc != REFIT_OK) {
		drop_comms(x, true);
		return rc;
	}
	/* the id is spent from here on, whatever happens */
	x->used_id = w->id;
	x->have_used = true;
	if ((rc = group_start(a, "ncclCommInitRankConfig: ", err)) != REFIT_OK) {
		drop_comms(x, true);
		return rc;
	}
	for (size_t i = 0; i < w->nlocal; i++) {
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
		cudaError_t e;

		c.blocking = 0;
		if ((e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess) {
			rc = cuda_err(x, e, "cudaSetDevice", err);
			break;
		}
		r = a->ncclCommInitRankConfig(&cm->comm[i], (int)w->nranks, w->id,
					      index_in(w->ranks, w->nranks, w->local[i]), &c);
		if (r != ncclSuccess && r != ncclInProgress) {
			rc = refit_err_set(err, REFIT_ERR_NCCL, "ncclCommInitRankConfig (rank %d): "
					   "%s", w->local[i], a->ncclGetErrorString(r));
			break;
		}
	}
	rc = group_end(a, rc, "ncclCommInitRankConfig: ", err);
	if (rc != REFIT_OK) {
		drop_comms(x, true);
		return rc;
	}
	/* the id's root (if this node made it) stays until the next epoch: other
	 * ranks may still be on their way to it */
	CHECK(wait_comms(x, cfg, "creating the communicators", err));
	cm->epoch = w->epoch;
	cm->id = w->id;
	cm->have_id = true;
	return REFIT_OK;
}

static bool
same_ranks(const comms_t *cm, const world_t *w)
{
	return cm->nranks == w->nranks && cm->nlocal == w->nlocal &&
	       memcmp(cm->ranks, w->ranks, w->nranks * sizeof(int32_t)) == 0 &&
	       memcmp(cm->local, w->local, w->nlocal * sizeof(int32_t)) == 0;
}

/*
 * The epoch's communicators: the ones there are (same epoch, same id or
 * none sent), shrunk ones (a new epoch without an id), or new ones from the
 * epoch's id -- never from an id already spent (aborted communicators are
 * never brought back: a node that aborted waits for a new epoch).  Owner
 * only, never under x->mu.
 */
static refit_status_t
ensure_comms(xport_t *x, const world_t *w, const xport_session_cfg_t *cfg, refit_err_t *err)
{
	comms_t *cm = &x->cm;
	int64_t t0 = xport_now_ms();

	if (w->epoch != cfg->epoch)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "nccl transport: the refit is "
				     "of epoch %" PRIu64 ", this node has epoch %" PRIu64,
				     cfg->epoch, w->epoch);
	if (cm->comm && cm->epoch == w->epoch && same_ranks(cm, w) &&
	    (!w->have_id || (cm->have_id && memcmp(&cm->id, &w->id, sizeof(w->id)) == 0)))
		return REFIT_OK;
	if (cm->comm && !w->have_id) {
		CHECK(try_shrink(x, w, cfg, err));
		log_info("nccl: node %s: communicators shrunk to epoch %" PRIu64 " (%zu ranks) in "
			 "%" PRId64 " ms", x->node_id, w->epoch, w->nranks, xport_now_ms() - t0);
		return REFIT_OK;
	}
	if (cm->comm)
		drop_comms(x, false);
	if (!w->have_id)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "nccl transport: epoch %" PRIu64
				     " came without a unique id and this node has no "
				     "communicators to shrink (they were aborted): the next epoch "
				     "brings a new id", w->epoch);
	if (x->have_used && memcmp(&x->used_id, &w->id, sizeof(w->id)) == 0)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "nccl transport: the unique id "
				     "of epoch %" PRIu64 " was spent by communicators that were "
				     "aborted since: the next epoch brings a new id", w->epoch);
	CHECK(create_comms(x, w, cfg, err));
	log_info("nccl: node %s: %zu communicators of epoch %" PRIu64 " (world of %zu ranks) "
		 "in %" PRId64 " ms", x->node_id, w->nlocal, w->epoch, w->nranks,
		 xport_now_ms() - t0);
	return REFIT_OK;
}

static void
release(xport_t *x)
{
	pthread_mutex_lock(&x->mu);
	x->busy = false;
	x->scfg = NULL;
	pthread_cond_broadcast(&x->cv);
	pthread_mutex_unlock(&x->mu);
}

static refit_status_t
nccl_open(xport_t *x, const xport_session_cfg_t *cfg, xport_session_t **out,
	  refit_err_t *err)
{
	xport_session_t *s;
	world_t w;
	refit_status_t rc;

	/* a message is staged whole (the plan cut it to its chunk size): one
	 * larger than a rank's arena cannot run however the groups fall */
	if (cfg->max_msg_bytes > x->budget)
		return refit_err_set(err, REFIT_ERR_LIMIT, "nccl transport: node %s: the plan's "
				     "messages reach %" PRIu64 " bytes (its chunk size and check "
				     "trailer), more than a rank's GPU staging budget "
				     "(gpu_staging_budget_bytes %" PRIu64 "): it cannot run even one "
				     "message at a time; raise the budget or lower chunk_bytes",
				     x->node_id, cfg->max_msg_bytes, x->budget);
	pthread_mutex_lock(&x->mu);
	while (x->busy) { /* one session at a time */
		struct timespec ts;

		if (atomic_load(cfg->abort) || xport_now_ms() >= cfg->deadline_ms) {
			pthread_mutex_unlock(&x->mu);
			return refit_err_set(err, atomic_load(cfg->abort) ? REFIT_ERR_ABORTED :
					     REFIT_ERR_TIMEOUT, "nccl transport: another refit "
					     "held the communicators until the %s",
					     atomic_load(cfg->abort) ? "abort" : "deadline");
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&x->cv, &x->mu, &ts);
	}
	if (x->poison[0] != '\0') {
		rc = refit_err_set(err, REFIT_ERR_UNAVAILABLE, "nccl transport: node %s is "
				   "poisoned: %s", x->node_id, x->poison);
		pthread_mutex_unlock(&x->mu);
		return rc;
	}
	x->busy = true;
	world_copy(&w, &x->w);
	pthread_mutex_unlock(&x->mu);
	s = xcalloc(1, sizeof(*s));
	s->x = x;
	s->cfg = *cfg;
	x->scfg = &s->cfg;
	refit_err_clear(&x->derr);
	rc = ensure_comms(x, &w, &s->cfg, err);
	world_free(&w);
	if (rc != REFIT_OK) {
		free(s);
		release(x);
		return rc;
	}
	*out = s;
	return REFIT_OK;
}

/* A failure inside a group (rc, already in err): the communicators are
 * aborted (the peers may wait on them). */
static refit_status_t
group_fail(xport_t *x, refit_status_t rc)
{
	drop_comms(x, true);
	return rc;
}

/* Post ops as one NCCL group on the local communicators. */
static refit_status_t
post_group(xport_t *x, const xport_op_t *ops, size_t n, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;
	ncclResult_t r;
	refit_status_t rc = REFIT_OK;

	CHECK(group_start(a, "", err));
	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		int li = local_index(cm, ops[i].rank);
		int peer = index_in(cm->ranks, cm->nranks, ops[i].peer);
		cudaError_t e;

		if (ops[i].bytes == 0)
			continue;
		if ((e = a->cudaSetDevice(cm->dev[li])) != cudaSuccess) {
			rc = cuda_err(x, e, "cudaSetDevice", err);
			break;
		}
		r = ops[i].send ? a->ncclSend(ops[i].buf, ops[i].bytes, ncclUint8, peer,
					      cm->comm[li], cm->stream[li])
				: a->ncclRecv(ops[i].buf, ops[i].bytes, ncclUint8, peer,
					      cm->comm[li], cm->stream[li]);
		if (r != ncclSuccess && r != ncclInProgress)
			rc = refit_err_set(err, REFIT_ERR_NCCL, "nccl%s rank %d -> %d: %s",
					   ops[i].send ? "Send" : "Recv", ops[i].rank,
					   ops[i].peer, a->ncclGetErrorString(r));
	}
	return group_end(a, rc, "", err);
}

/* The peers of rank's operations in the group, for a message: "sends to
 * rank 1, 3; receives from rank 2" (truncated with "..."). */
static void
group_peers(const xport_op_t *ops, size_t n, int32_t rank, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int send = 1; send >= 0; send--) {
		bool first = true;

		for (size_t i = 0; i < n; i++) {
			int k;

			if (ops[i].rank != rank || ops[i].send != (send == 1) || ops[i].bytes == 0)
				continue;
			k = first ? snprintf(buf + off, len - off, "%s%s rank %d", off ? "; " : "",
					     send ? "sends to" : "receives from", ops[i].peer)
				  : snprintf(buf + off, len - off, ", %d", ops[i].peer);
			first = false;
			if (k < 0 || (size_t)k >= len - off) {
				if (len >= 4)
					memcpy(buf + len - 4, "...", 4);
				return;
			}
			off += (size_t)k;
		}
	}
}

/* Local rank i's communicator failed the group with st: name the rank and
 * the peers of its operations (one of them died, refused or faulted). */
static refit_status_t
group_error(xport_t *x, size_t i, const xport_op_t *ops, size_t n, ncclResult_t st,
	    refit_err_t *err)
{
	char peers[256], says[320];

	group_peers(ops, n, x->cm.local[i], peers, sizeof(peers));
	return refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: rank %d (%s): the group "
			     "failed: %s (ncclCommGetAsyncError)%s", x->cm.local[i],
			     peers[0] ? peers : "no operations", x->api->ncclGetErrorString(st),
			     nccl_says(x->api, x->cm.comm[i], says, sizeof(says)));
}

/*
 * The posted group's kernels on every local stream, bounded, without x->mu.
 * A drained stream is not enough: NCCL reports a failed operation through
 * the communicator's asynchronous error, and a stream can drain with one
 * set (a send whose data NCCL had buffered, an operation ended by the
 * error), so the error is checked once more after the stream completed.
 */
static refit_status_t
wait_group(xport_t *x, const xport_op_t *ops, size_t n, const xport_session_cfg_t *cfg,
	   refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;

	for (size_t i = 0; i < cm->nlocal; i++) {
		for (;;) {
			cudaError_t e = a->cudaStreamQuery(cm->stream[i]);
			ncclResult_t st;

			if (e != cudaSuccess && e != cudaErrorNotReady)
				return cuda_err(x, e, "point-to-point group", err);
			/* after the query: an error set before the stream drained is seen */
			st = comm_state(a, cm->comm[i]);
			if (st != ncclSuccess && st != ncclInProgress)
				return group_error(x, i, ops, n, st, err);
			if (e == cudaSuccess && st == ncclSuccess)
				break;
			CHECK(bounds(cfg, "point-to-point group", err));
			usleep(50);
		}
	}
	return REFIT_OK;
}

/* Run ops as one group, to completion, bounded by the session's deadline
 * and abort flag; a failure aborts the communicators. */
static refit_status_t
run_group(xport_session_t *s, const xport_op_t *ops, size_t n, refit_err_t *err)
{
	xport_t *x = s->x;
	refit_status_t rc;

	if (x->cm.comm == NULL)
		return refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: the communicators "
				     "were aborted");
	if (dfailed(x))
		return dfail_out(x, err);
	for (size_t i = 0; i < n; i++)
		if (local_index(&x->cm, ops[i].rank) < 0 ||
		    index_in(x->cm.ranks, x->cm.nranks, ops[i].peer) < 0)
			return refit_err_set(err, REFIT_ERR_INTERNAL, "nccl transport: rank %d or "
					     "%d is not in the communicators' world",
					     ops[i].rank, ops[i].peer);
	if ((rc = post_group(x, ops, n, err)) != REFIT_OK)
		return group_fail(x, rc);
	CHECK(wait_comms(x, &s->cfg, "point-to-point group", err));
	/* the fault suite waits for this line: the node is in the wait below,
	 * and PrepareEpoch (set_world, x->mu) must still be answered */
	log_debug(LOG_SUB_XPORT, "nccl: node %s: group of %zu operations issued, waiting for "
		  "it", x->node_id, n);
	if ((rc = wait_group(x, ops, n, &s->cfg, err)) != REFIT_OK)
		return group_fail(x, rc);
	return REFIT_OK;
}

/* The executor's groups, in its order, each run to completion. */
static refit_status_t
nccl_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err)
{
	for (;;) {
		const xport_op_t *ops = NULL;
		size_t n = 0;
		bool end = false;

		CHECK(io->next_group(io->arg, &ops, &n, &end, err));
		if (end)
			return REFIT_OK;
		if (n > 0)
			CHECK(run_group(s, ops, n, err));
		CHECK(io->group_done(io->arg, err));
	}
}

static const dp_dev_ops_t *
nccl_dev(xport_session_t *s)
{
	return &s->x->dev;
}

static void
nccl_close(xport_session_t *s)
{
	if (s == NULL)
		return;
	release(s->x);
	free(s);
}

/* uuid as nvidia-smi writes it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
static void
uuid_str(const uint8_t *u, char *out, size_t n)
{
	size_t o = (size_t)snprintf(out, n, "GPU-");

	for (int i = 0; i < GPU_UUID_BYTES && o + 3 < n; i++)
		o += (size_t)snprintf(out + o, n - o, "%s%02x",
				      i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", u[i]);
}

/*
 * The GPU a client named by UUID must be the device this node runs rank on
 * (dev): the client's own ordinal means nothing here (CUDA_VISIBLE_DEVICES
 * numbers every process's GPUs from 0).
 */
static refit_status_t
uuid_check(xport_t *x, int32_t rank, const uint8_t *uuid, int dev, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	char s[64];
	int here = -1, r = 0;

	for (int d = 0; d < a->ndevices && here < 0; d++) {
		unsigned char u[GPU_UUID_BYTES];

		if ((r = a->device_uuid(u, d)) == 0 && memcmp(u, uuid, GPU_UUID_BYTES) == 0)
			here = d;
		else if (r != 0)
			return refit_err_set(err, REFIT_ERR_CUDA, "rank %d: cuDeviceGetUuid of CUDA "
					     "device %d failed (CUresult %d)", rank, d, r);
	}
	uuid_str(uuid, s, sizeof(s));
	if (here < 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the client's memory "
				     "is on %s, which is none of this node's %d CUDA devices",
				     rank, s, a->ndevices);
	if (here != dev)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the client's memory "
				     "is on %s, CUDA device %d here, but this node runs rank %d "
				     "on device %d (gpu_devices)", rank, s, here, rank, dev);
	return REFIT_OK;
}

static refit_status_t
nccl_mem_open(xport_t *x, int32_t rank, const void *ipc, size_t len, int32_t device,
	      const uint8_t *uuid, uint64_t bytes, void **base, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	cudaIpcMemHandle_t h;
	struct cudaPointerAttributes at;
	int dev = device_of(x, rank);
	cudaError_t e;
	void *b = NULL;
	refit_status_t rc;
	char why[320];

	*base = NULL;
	if (gpu_ipc_handle_parse(ipc, len, &h, why, sizeof(why)) != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: %s", rank, why);
	if (dev < 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d is not served by this "
				     "node", rank);
	if (uuid != NULL)
		CHECK(uuid_check(x, rank, uuid, dev, err));
	else if (device >= 0 && device != dev)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the client's memory "
				     "is on CUDA device %d, but this node runs rank %d on device "
				     "%d (gpu_devices)", rank, device, rank, dev);
	if (bytes == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: cuda_bytes (the size "
				     "of the allocation) is 0", rank);
	/* the current device is per thread: set it on this one */
	if ((e = a->cudaSetDevice(dev)) != cudaSuccess)
		return cuda_err(x, e, "cudaSetDevice", err);
	if ((e = a->cudaIpcOpenMemHandle(&b, h, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess)
		return cuda_err(x, e, "cudaIpcOpenMemHandle", err);
	memset(&at, 0, sizeof(at));
	if ((e = a->cudaPointerGetAttributes(&at, b)) != cudaSuccess) {
		rc = cuda_err(x, e, "cudaPointerGetAttributes", err);
		goto fail;
	}
	if (at.type != cudaMemoryTypeDevice || at.device != dev) {
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the memory of the IPC handle "
			      "is %s %d, not on device %d where this node runs rank %d",
			      rank, at.type == cudaMemoryTypeDevice ? "on device" :
			      "not device memory, type", at.type == cudaMemoryTypeDevice ?
			      at.device : (int)at.type, dev, rank);
		goto fail;
	}
	/*
	 * The client's claim must lie inside what the handle mapped.  The last
	 * claimed byte being device memory proves nothing: the runtime places
	 * mappings and allocations next to each other, so a claim past the
	 * mapping may end in another client's mapping or this node's staging,
	 * and copies into the claim would write there.  cuMemGetAddressRange
	 * gives the range the pointer lies in (cuda.h: "the base address ... and
	 * size ... of the allocation ... that contains the input pointer").  The
	 * mapping may start before b: CUDA sub-allocates small cudaMalloc
	 * allocations from larger blocks and IPC maps "the entire underlying
	 * memory block" (the programming guide), cudaIpcOpenMemHandle returning
	 * the exported allocation's address inside it; the claim runs from b to
	 * at most the block's end.
	 */
	{
		unsigned long long rb = 0;
		size_t rsz = 0;
		int cr = a->mem_range(&rb, &rsz, (unsigned long long)(uintptr_t)b);

		if (cr != 0) {
			rc = refit_err_set(err, REFIT_ERR_CUDA, "rank %d: cuMemGetAddressRange of "
					   "the client's IPC mapping failed (CUresult %d): its "
					   "size cannot be checked", rank, cr);
			goto fail;
		}
		uint64_t at = (uint64_t)((uintptr_t)b - rb);

		if (rb > (unsigned long long)(uintptr_t)b || at >= rsz || bytes > rsz - at) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: cuda_bytes %" PRIu64
					   " is larger than the allocation of the IPC handle (%zu "
					   "bytes mapped from offset %llu of it): refused before "
					   "anything was written", rank, bytes, rsz - (size_t)at,
					   (unsigned long long)at);
			goto fail;
		}
	}
	*base = b;
	return REFIT_OK;
fail:
	if ((e = a->cudaIpcCloseMemHandle(b)) != cudaSuccess)
		log_warnx("nccl: node %s: cudaIpcCloseMemHandle: %s", x->node_id,
			  a->cudaGetErrorString(e));
	return rc;
}

static void
nccl_mem_close(xport_t *x, void *base)
{
	struct cudaPointerAttributes at;
	cudaError_t e;

	/* closed in the context it was opened in (cudaIpcOpenMemHandle counts
	 * opens per context): its device current on this thread */
	memset(&at, 0, sizeof(at));
	if ((e = x->api->cudaPointerGetAttributes(&at, base)) != cudaSuccess)
		log_warnx("nccl: node %s: cudaPointerGetAttributes of a client's mapping: %s",
			  x->node_id, x->api->cudaGetErrorString(e));
	else if (at.type == cudaMemoryTypeDevice &&
		 (e = x->api->cudaSetDevice(at.device)) != cudaSuccess)
		log_warnx("nccl: node %s: cudaSetDevice(%d): %s", x->node_id, at.device,
			  x->api->cudaGetErrorString(e));
	e = x->api->cudaIpcCloseMemHandle(base);

	if (e != cudaSuccess)
		log_warnx("nccl: node %s: cudaIpcCloseMemHandle: %s", x->node_id,
			  x->api->cudaGetErrorString(e));
}

static void
nccl_stop(xport_t *x)
{
	if (x == NULL)
		return;
	pthread_mutex_lock(&x->mu);
	if (x->busy)
		log_warnx("nccl: node %s: stopping while a refit holds the communicators",
			  x->node_id);
	pthread_mutex_unlock(&x->mu);
	/* a graceful stop destroys them; mid-refit ones are aborted */
	drop_comms(x, x->busy);
	if (x->bounce != NULL && !poisoned(x)) {
		cudaError_t e = x->api->cudaFreeHost(x->bounce);

		if (e != cudaSuccess)
			log_warnx("nccl: node %s: cudaFreeHost: %s", x->node_id,
				  x->api->cudaGetErrorString(e));
	}
	if (x->kept)
		log_warnx("nccl: node %s: %" PRIu64 " buffers kept (never freed): work on "
			  "them did not end", x->node_id, x->kept);
	release_roots(x, NULL);
	VEC_FREE(&x->roots);
	world_free(&x->w);
	free(x->cranks);
	free(x->cdevs);
	free(x->node_id);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	free(x);
}

static xport_poison_t
nccl_poisoned(xport_t *x, char *why, size_t len)
{
	xport_poison_t p;

	pthread_mutex_lock(&x->mu);
	p = x->dead ? XPORT_POISON_DEAD : x->poison[0] != '\0' ? XPORT_POISON_KEPT :
		XPORT_POISON_NONE;
	if (p && len)
		snprintf(why, len, "%s", x->poison);
	pthread_mutex_unlock(&x->mu);
	return p;
}

const xport_ops_t xport_nccl_ops = XPORT_OPS("nccl", XPORT_MEM_DEVICE, nccl);
#endif
