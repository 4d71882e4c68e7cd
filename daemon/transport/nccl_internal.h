/*
 * nccl_internal.h - what the files of the nccl transport share: the
 * transport's state (communicators, staging arenas, the epoch's world,
 * struct xport and a session), its bounds, and each file's functions for
 * the others.  The files call one another in one direction only (no
 * cycle: tests/check-layers.py):
 *
 *   nccl.c          the backend: start, stop, endpoints, peer memory
 *                   (mem_open: the device's uuid checked), the ops table
 *   nccl_session.c  sessions, NCCL groups of sends and receives, exchange
 *   nccl_comm.c     communicators' life cycle: the world, unique ids,
 *                   creation, shrinking, waiting on them
 *   nccl_dev.c      device memory operations: box copies, conversion, the
 *                   staging arena's allocations, host copies, sync
 *   nccl_abort.c    teardown: the bounded abort thread, freeing
 *                   communicators and arenas, releasing id roots
 *   nccl_state.c    errors, poison, worlds and rank lookups
 *
 * Only compiled with REFIT_HAVE_NCCL (see nccl.c for the design).
 */
#ifndef REFIT_DAEMON_TRANSPORT_NCCL_INTERNAL_H
#define REFIT_DAEMON_TRANSPORT_NCCL_INTERNAL_H

#ifdef REFIT_HAVE_NCCL

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/alloc.h"
#include "daemon/transport/gpu.h"
#include "daemon/transport/gpu_arena.h"
#include "daemon/transport/transport.h"


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

/* nccl_state.c */
bool nccl_sticky(cudaError_t e);
refit_status_t nccl_cuda_err(xport_t *x, cudaError_t e, const char *what, refit_err_t *err);
void nccl_world_free(world_t *w);
void nccl_world_copy(world_t *dst, const world_t *src);
int nccl_index_in(const int32_t *v, size_t n, int32_t r);
int nccl_local_index(const comms_t *cm, int32_t r);
int nccl_device_of(const xport_t *x, int32_t r);
bool nccl_dfailed(const xport_t *x);
void nccl_dfail(xport_t *x, cudaError_t e, int32_t rank, const char *what);
refit_status_t nccl_dfail_out(const xport_t *x, refit_err_t *err);
bool nccl_is_poisoned(xport_t *x);
void nccl_poison(xport_t *x, int32_t rank, const char *what);
bool nccl_drained(const gpu_api_t *a, cudaStream_t st, int64_t ms);
bool nccl_on_rank(xport_t *x, int32_t rank, cudaStream_t *st);

/* nccl_abort.c */
ncclResult_t nccl_comm_state(const gpu_api_t *a, ncclComm_t c);
const char *nccl_says(const gpu_api_t *a, ncclComm_t c, char *buf, size_t n);
ncclResult_t nccl_abort_bounded(xport_t *x, ncclComm_t c, int32_t rank);
void nccl_comm_free(xport_t *x, ncclComm_t c, int32_t rank, bool abort);
void nccl_drop_comms(xport_t *x, bool abort);
void nccl_release_roots(xport_t *x, const ncclUniqueId *keep);

/* nccl_dev.c: the session's device ops (dp_dev_ops_t) */
void nccl_dev_copy_box(void *ctx, int32_t rank, const dp_view_t *sv, const plan_shard_t *ss,
		       const dp_view_t *dv, const plan_shard_t *ds, const plan_box_t *box);
void nccl_dev_convert(void *ctx, int32_t rank, const dp_cvt_op_t *op);
void nccl_dev_delta(void *ctx, int32_t rank, const dp_delta_op_t *op);
void *nccl_dev_alloc(void *ctx, int32_t rank, uint64_t bytes);
void *nccl_dev_alloc_top(void *ctx, int32_t rank, uint64_t bytes);
void nccl_dev_free(void *ctx, int32_t rank, void *p);
void nccl_dev_copy(void *ctx, int32_t rank, void *dst, const void *src, uint64_t n);
void nccl_dev_to_host(void *ctx, int32_t rank, void *host, const void *dev, uint64_t n);
void nccl_dev_from_host(void *ctx, int32_t rank, void *dev, const void *host, uint64_t n);
refit_status_t nccl_dev_sync(void *ctx, refit_err_t *err);

/* nccl_comm.c */
void nccl_set_world(xport_t *x, const xport_world_t *w);
refit_status_t nccl_unique_id(xport_t *x, uint8_t *out, size_t *len, refit_err_t *err);
refit_status_t nccl_bounds(const xport_session_cfg_t *cfg, const char *what, refit_err_t *err);
refit_status_t nccl_group_start(const gpu_api_t *a, const char *what, refit_err_t *err);
refit_status_t nccl_group_end(const gpu_api_t *a, refit_status_t rc, const char *what,
			      refit_err_t *err);
refit_status_t nccl_wait_comms(xport_t *x, const xport_session_cfg_t *cfg, const char *what,
			       refit_err_t *err);
refit_status_t nccl_ensure_comms(xport_t *x, const world_t *w, const xport_session_cfg_t *cfg,
				 refit_err_t *err);

/* nccl_session.c */
refit_status_t nccl_open(xport_t *x, const xport_session_cfg_t *cfg, xport_session_t **out,
			 refit_err_t *err);
refit_status_t nccl_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err);
const dp_dev_ops_t *nccl_dev(xport_session_t *s);
void nccl_close(xport_session_t *s);

#endif /* REFIT_HAVE_NCCL */
#endif
