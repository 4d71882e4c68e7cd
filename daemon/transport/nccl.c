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
 * (ncclCommAbort) on any failure, timeout or abort request, and recreated
 * at the next session.  One session at a time uses them: NCCL operations
 * must be issued in the same order everywhere, so refits run one after the
 * other on an nccl node.
 *
 * Device memory operations: strided box copies as cudaMemcpy2DAsync calls
 * (rows of the innermost contiguous dim, or elements when even that is
 * strided) on one copy stream with cudaMemcpyDefault (unified addressing
 * reaches every local device and IPC mappings); staging with cudaMalloc.
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
#include "daemon/transport/transport.h"

#ifndef REFIT_HAVE_NCCL

static char nowhy[300];

static const char *
nccl_unavailable(void)
{
	gpu_load(1, nowhy, sizeof(nowhy));
	return nowhy;
}

const xport_ops_t xport_nccl_ops = {.name = "nccl", .unavailable = nccl_unavailable};

#else

struct xport {
	const gpu_api_t *api;
	char *node_id;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	/* the epoch's world */
	uint64_t epoch;
	int32_t *ranks, *local;
	size_t nranks, nlocal;
	ncclUniqueId id;
	bool have_id;
	/* communicators of comm_epoch (0: none), over the ranks comm_ranks */
	uint64_t comm_epoch;
	int32_t *comm_ranks;
	size_t ncomm_ranks;
	ncclComm_t *comms;
	cudaStream_t *streams;
	int *devs;
	bool busy;
	dp_dev_ops_t dev;
};

struct xport_session {
	xport_t *x;
	xport_session_cfg_t cfg;
};

static char why_buf[512];

static const char *
nccl_unavailable(void)
{
	return gpu_load(1, why_buf, sizeof(why_buf)) ? NULL : why_buf;
}

static refit_status_t
cuda_err(const gpu_api_t *a, cudaError_t e, const char *what, refit_err_t *err)
{
	return refit_err_set(err, REFIT_ERR_CUDA, "nccl transport: %s: %s", what,
			     a->cudaGetErrorString(e));
}

/* ---- device memory operations -------------------------------------------------- */

static void
dev_copy_box(void *ctx, const dp_view_t *sv, const plan_shard_t *ss, const dp_view_t *dv,
	     const plan_shard_t *ds, const plan_box_t *box)
{
	xport_t *x = ctx;
	const gpu_api_t *a = x->api;
	cudaStream_t st = x->streams[0];
	int nd = sv->ndim;
	uint64_t e = sv->elem;
	int64_t so[PLAN_MAX_DIMS], dof[PLAN_MAX_DIMS], idx[PLAN_MAX_DIMS] = {0};
	int outer;

	for (int d = 0; d < nd; d++) {
		if (box->size[d] == 0)
			return;
		so[d] = box->off[d] - ss->box.off[d] + ss->local_off[d];
		dof[d] = box->off[d] - ds->box.off[d] + ds->local_off[d];
	}
	if (nd == 0) {
		a->cudaMemcpyAsync(dv->base, sv->base, e, cudaMemcpyDefault, st);
		return;
	}
	outer = nd >= 2 ? nd - 2 : 0;
	for (;;) {
		int64_t sbase = 0, dbase = 0;

		for (int d = 0; d < outer; d++) {
			sbase += (so[d] + idx[d]) * sv->stride[d];
			dbase += (dof[d] + idx[d]) * dv->stride[d];
		}
		if (nd == 1) {
			if (sv->stride[0] == 1 && dv->stride[0] == 1)
				a->cudaMemcpyAsync(dv->base + dof[0] * e, sv->base + so[0] * e,
						   (size_t)box->size[0] * e, cudaMemcpyDefault, st);
			else
				a->cudaMemcpy2DAsync(dv->base + dof[0] * dv->stride[0] * e,
						     dv->stride[0] * e,
						     sv->base + so[0] * sv->stride[0] * e,
						     sv->stride[0] * e, e, box->size[0],
						     cudaMemcpyDefault, st);
		} else {
			int r = nd - 2, c = nd - 1;
			uint8_t *sp = sv->base + (sbase + so[r] * sv->stride[r] +
						  so[c] * sv->stride[c]) * e;
			uint8_t *dp = dv->base + (dbase + dof[r] * dv->stride[r] +
						  dof[c] * dv->stride[c]) * e;

			if (sv->stride[c] == 1 && dv->stride[c] == 1)
				a->cudaMemcpy2DAsync(dp, dv->stride[r] * e, sp, sv->stride[r] * e,
						     box->size[c] * e, box->size[r],
						     cudaMemcpyDefault, st);
			else
				for (int64_t i = 0; i < box->size[r]; i++)
					a->cudaMemcpy2DAsync(dp + i * dv->stride[r] * e,
							     dv->stride[c] * e,
							     sp + i * sv->stride[r] * e,
							     sv->stride[c] * e, e, box->size[c],
							     cudaMemcpyDefault, st);
		}
		/* next index over the outer dims */
		int d = outer - 1;

		while (d >= 0 && ++idx[d] == box->size[d])
			idx[d--] = 0;
		if (d < 0)
			return;
	}
}

static void *
dev_alloc(void *ctx, uint64_t bytes)
{
	xport_t *x = ctx;
	void *p = NULL;

	x->api->cudaSetDevice(x->devs[0]);
	return x->api->cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

static void
dev_free(void *ctx, void *p)
{
	xport_t *x = ctx;

	x->api->cudaFree(p);
}

static void
dev_copy(void *ctx, void *dst, const void *src, uint64_t n)
{
	xport_t *x = ctx;

	x->api->cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, x->streams[0]);
}

static void
dev_to_host(void *ctx, void *host, const void *dev, uint64_t n)
{
	xport_t *x = ctx;

	x->api->cudaStreamSynchronize(x->streams[0]);
	x->api->cudaMemcpy(host, dev, n, cudaMemcpyDefault);
}

static void
dev_from_host(void *ctx, void *dev, const void *host, uint64_t n)
{
	xport_t *x = ctx;

	x->api->cudaStreamSynchronize(x->streams[0]);
	x->api->cudaMemcpy(dev, host, n, cudaMemcpyDefault);
}

static refit_status_t
dev_sync(void *ctx, refit_err_t *err)
{
	xport_t *x = ctx;
	cudaError_t e = x->api->cudaStreamSynchronize(x->streams[0]);

	return e == cudaSuccess ? REFIT_OK : cuda_err(x->api, e, "copy", err);
}

/* ---- the backend ------------------------------------------------------------------- */

static refit_status_t
nccl_start(const xport_cfg_t *cfg, xport_t **out, refit_err_t *err)
{
	char why[512];
	const gpu_api_t *a = gpu_load(1, why, sizeof(why));
	xport_t *x;

	if (a == NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "nccl transport: %s", why);
	x = xcalloc(1, sizeof(*x));
	x->api = a;
	x->node_id = xstrdup(cfg->node_id);
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	x->dev = (dp_dev_ops_t){dev_copy_box, dev_alloc, dev_free, dev_copy, dev_to_host,
				dev_from_host, dev_sync, x};
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

/* Free the communicators (abort: they may be mid-operation).  Locked. */
static void
drop_comms(xport_t *x, bool abort)
{
	for (size_t i = 0; i < x->nlocal && x->comms; i++) {
		if (x->comms[i] == NULL)
			continue;
		if (abort)
			x->api->ncclCommAbort(x->comms[i]);
		else
			x->api->ncclCommDestroy(x->comms[i]);
		if (x->streams[i])
			x->api->cudaStreamDestroy(x->streams[i]);
	}
	free(x->comms);
	free(x->streams);
	free(x->devs);
	free(x->comm_ranks);
	x->comms = NULL;
	x->streams = NULL;
	x->devs = NULL;
	x->comm_ranks = NULL;
	x->ncomm_ranks = 0;
	x->comm_epoch = 0;
}

static void
nccl_set_world(xport_t *x, const xport_world_t *w)
{
	pthread_mutex_lock(&x->mu);
	/* the communicators of the old epoch stay until the next session: it
	 * shrinks them when members only left, or recreates them */
	free(x->ranks);
	free(x->local);
	x->epoch = w->epoch;
	x->nranks = w->nranks;
	x->nlocal = w->nlocal;
	x->ranks = xmalloc((w->nranks + 1) * sizeof(int32_t));
	x->local = xmalloc((w->nlocal + 1) * sizeof(int32_t));
	memcpy(x->ranks, w->ranks, w->nranks * sizeof(int32_t));
	memcpy(x->local, w->local, w->nlocal * sizeof(int32_t));
	x->have_id = w->id_len == sizeof(x->id);
	if (x->have_id)
		memcpy(&x->id, w->id, sizeof(x->id));
	pthread_mutex_unlock(&x->mu);
}

static refit_status_t
nccl_unique_id(xport_t *x, uint8_t *out, size_t *len, refit_err_t *err)
{
	ncclUniqueId id;
	ncclResult_t r = x->api->ncclGetUniqueId(&id);

	if (r != ncclSuccess)
		return refit_err_set(err, REFIT_ERR_NCCL, "ncclGetUniqueId: %s",
				     x->api->ncclGetErrorString(r));
	if (*len < sizeof(id))
		return refit_err_set(err, REFIT_ERR_INTERNAL, "nccl id buffer too small");
	memcpy(out, &id, sizeof(id));
	*len = sizeof(id);
	return REFIT_OK;
}

static int
world_index(const xport_t *x, int32_t r)
{
	size_t lo = 0, hi = x->nranks;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (x->ranks[mid] < r)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < x->nranks && x->ranks[lo] == r ? (int)lo : -1;
}

static int
local_index(const xport_t *x, int32_t r)
{
	for (size_t i = 0; i < x->nlocal; i++)
		if (x->local[i] == r)
			return (int)i;
	return -1;
}

/* Wait until every communicator left ncclInProgress (deadline, abort). */
static refit_status_t
wait_comms(xport_t *x, const xport_session_cfg_t *cfg, const char *what, refit_err_t *err)
{
	for (;;) {
		bool pending = false;

		for (size_t i = 0; i < x->nlocal; i++) {
			ncclResult_t st = ncclSuccess;

			x->api->ncclCommGetAsyncError(x->comms[i], &st);
			if (st == ncclInProgress) {
				pending = true;
			} else if (st != ncclSuccess) {
				refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: %s (rank %d): "
					      "%s", what, x->local[i],
					      x->api->ncclGetErrorString(st));
				drop_comms(x, true);
				return REFIT_ERR_NCCL;
			}
		}
		if (!pending)
			return REFIT_OK;
		if (atomic_load(cfg->abort) || xport_now_ms() >= cfg->deadline_ms) {
			refit_err_set(err, atomic_load(cfg->abort) ? REFIT_ERR_ABORTED :
				      REFIT_ERR_TIMEOUT, "nccl transport: %s: %s", what,
				      atomic_load(cfg->abort) ? "aborted" : "deadline passed");
			drop_comms(x, true);
			return err->status;
		}
		usleep(200);
	}
}

/*
 * Members only left (the new world is a subset of the old one, this node's
 * ranks unchanged) and NCCL has ncclCommShrink: shrink instead of
 * recreating.  false when it does not apply or failed (then recreate).
 * Locked.
 */
static bool
try_shrink(xport_t *x, const xport_session_cfg_t *cfg)
{
	const gpu_api_t *a = x->api;
	int *excl;
	size_t nex = 0, k = 0;
	ncclComm_t *nc;
	refit_err_t err;
	bool ok = true;

	if (a->ncclCommShrink == NULL || x->comms == NULL || x->nranks >= x->ncomm_ranks)
		return false;
	excl = xcalloc(x->ncomm_ranks, sizeof(*excl));
	for (size_t i = 0; i < x->ncomm_ranks; i++) {
		while (k < x->nranks && x->ranks[k] < x->comm_ranks[i])
			k++;
		if (k < x->nranks && x->ranks[k] == x->comm_ranks[i])
			continue;
		excl[nex++] = (int)i;
	}
	if (x->ncomm_ranks - nex != x->nranks) { /* someone new joined */
		free(excl);
		return false;
	}
	nc = xcalloc(x->nlocal + 1, sizeof(*nc));
	a->ncclGroupStart();
	for (size_t i = 0; i < x->nlocal && ok; i++) {
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
		ncclResult_t r;

		c.blocking = 0;
		a->cudaSetDevice(x->devs[i]);
		r = a->ncclCommShrink(x->comms[i], excl, (int)nex, &nc[i], &c, NCCL_SHRINK_DEFAULT);
		ok = r == ncclSuccess || r == ncclInProgress;
	}
	{
		ncclResult_t ge = a->ncclGroupEnd();

		if (ge != ncclSuccess && ge != ncclInProgress)
			ok = false;
	}
	free(excl);
	if (!ok) {
		for (size_t i = 0; i < x->nlocal; i++)
			if (nc[i])
				a->ncclCommAbort(nc[i]);
		free(nc);
		return false;
	}
	{
		ncclComm_t *old = x->comms;

		x->comms = nc;
		refit_err_clear(&err);
		ok = wait_comms(x, cfg, "shrinking the communicators", &err) == REFIT_OK;
		if (ok) {
			for (size_t i = 0; i < x->nlocal; i++)
				a->ncclCommDestroy(old[i]);
			free(old);
		} else {
			for (size_t i = 0; i < x->nlocal; i++) /* wait_comms aborted the new ones */
				a->ncclCommAbort(old[i]);
			free(old);
			log_warnx("nccl: node %s: %s; recreating", x->node_id, err.msg);
			return false;
		}
	}
	return true;
}

/* The epoch's communicators, created if needed.  Locked. */
static refit_status_t
ensure_comms(xport_t *x, const xport_session_cfg_t *cfg, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	ncclResult_t r;
	int64_t t0 = xport_now_ms();

	if (x->comm_epoch == cfg->epoch && x->comms)
		return REFIT_OK;
	if (x->comm_epoch && try_shrink(x, cfg)) {
		x->comm_epoch = cfg->epoch;
		free(x->comm_ranks);
		x->comm_ranks = xmalloc((x->nranks + 1) * sizeof(int32_t));
		memcpy(x->comm_ranks, x->ranks, x->nranks * sizeof(int32_t));
		x->ncomm_ranks = x->nranks;
		log_info("nccl: node %s: communicators shrunk to epoch %" PRIu64 " (%zu ranks) "
			 "in %" PRId64 " ms", x->node_id, cfg->epoch, x->nranks,
			 xport_now_ms() - t0);
		return REFIT_OK;
	}
	if (x->comm_epoch)
		drop_comms(x, false);
	if (x->epoch != cfg->epoch || !x->have_id)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "nccl transport: no unique id "
				     "for epoch %" PRIu64 " (this node has epoch %" PRIu64 ")",
				     cfg->epoch, x->epoch);
	x->comms = xcalloc(x->nlocal + 1, sizeof(*x->comms));
	x->streams = xcalloc(x->nlocal + 1, sizeof(*x->streams));
	x->devs = xcalloc(x->nlocal + 1, sizeof(*x->devs));
	a->ncclGroupStart();
	for (size_t i = 0; i < x->nlocal; i++) {
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
		cudaError_t e;

		c.blocking = 0;
		x->devs[i] = (int)(i % (size_t)a->ndevices);
		a->cudaSetDevice(x->devs[i]);
		e = a->cudaStreamCreateWithFlags(&x->streams[i], cudaStreamNonBlocking);
		if (e != cudaSuccess) {
			a->ncclGroupEnd();
			drop_comms(x, true);
			return cuda_err(a, e, "cudaStreamCreate", err);
		}
		r = a->ncclCommInitRankConfig(&x->comms[i], (int)x->nranks, x->id,
					      world_index(x, x->local[i]), &c);
		if (r != ncclSuccess && r != ncclInProgress) {
			a->ncclGroupEnd();
			drop_comms(x, true);
			return refit_err_set(err, REFIT_ERR_NCCL, "ncclCommInitRankConfig (rank "
					     "%d): %s", x->local[i], a->ncclGetErrorString(r));
		}
	}
	r = a->ncclGroupEnd();
	if (r != ncclSuccess && r != ncclInProgress) {
		drop_comms(x, true);
		return refit_err_set(err, REFIT_ERR_NCCL, "ncclCommInitRankConfig: %s",
				     a->ncclGetErrorString(r));
	}
	CHECK(wait_comms(x, cfg, "creating the communicators", err));
	x->comm_epoch = cfg->epoch;
	x->comm_ranks = xmalloc((x->nranks + 1) * sizeof(int32_t));
	memcpy(x->comm_ranks, x->ranks, x->nranks * sizeof(int32_t));
	x->ncomm_ranks = x->nranks;
	log_info("nccl: node %s: %zu communicators of epoch %" PRIu64 " (world of %zu ranks) "
		 "in %" PRId64 " ms", x->node_id, x->nlocal, cfg->epoch, x->nranks,
		 xport_now_ms() - t0);
	return REFIT_OK;
}

static refit_status_t
nccl_open(xport_t *x, const xport_session_cfg_t *cfg, xport_session_t **out,
	  refit_err_t *err)
{
	xport_session_t *s;
	refit_status_t rc;

	pthread_mutex_lock(&x->mu);
	while (x->busy) { /* one session at a time: same operation order everywhere */
		struct timespec ts;

		if (atomic_load(cfg->abort) || xport_now_ms() >= cfg->deadline_ms) {
			pthread_mutex_unlock(&x->mu);
			return refit_err_set(err, REFIT_ERR_TIMEOUT, "nccl transport: another "
					     "refit held the communicators past the deadline");
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&x->cv, &x->mu, &ts);
	}
	rc = ensure_comms(x, cfg, err);
	if (rc == REFIT_OK)
		x->busy = true;
	pthread_mutex_unlock(&x->mu);
	if (rc != REFIT_OK)
		return rc;
	s = xcalloc(1, sizeof(*s));
	s->x = x;
	s->cfg = *cfg;
	*out = s;
	return REFIT_OK;
}

static refit_status_t
nccl_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err)
{
	(void)s;
	(void)io;
	return refit_err_set(err, REFIT_ERR_INTERNAL, "nccl transport: runs in groups, not "
			     "streams");
}

static refit_status_t
nccl_group(xport_session_t *s, const xport_op_t *ops, size_t n, refit_err_t *err)
{
	xport_t *x = s->x;
	const gpu_api_t *a = x->api;
	ncclResult_t r;

	pthread_mutex_lock(&x->mu);
	if (x->comms == NULL) {
		pthread_mutex_unlock(&x->mu);
		return refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: the communicators "
				     "were aborted");
	}
	a->ncclGroupStart();
	for (size_t i = 0; i < n; i++) {
		int li = local_index(x, ops[i].rank), peer = world_index(x, ops[i].peer);

		if (li < 0 || peer < 0) {
			a->ncclGroupEnd();
			pthread_mutex_unlock(&x->mu);
			return refit_err_set(err, REFIT_ERR_INTERNAL, "nccl transport: rank %d or "
					     "%d is not in the epoch's world", ops[i].rank,
					     ops[i].peer);
		}
		if (ops[i].bytes == 0)
			continue;
		r = ops[i].send ? a->ncclSend(ops[i].buf, ops[i].bytes, ncclUint8, peer,
					      x->comms[li], x->streams[li])
				: a->ncclRecv(ops[i].buf, ops[i].bytes, ncclUint8, peer,
					      x->comms[li], x->streams[li]);
		if (r != ncclSuccess && r != ncclInProgress) {
			a->ncclGroupEnd();
			drop_comms(x, true);
			pthread_mutex_unlock(&x->mu);
			return refit_err_set(err, REFIT_ERR_NCCL, "nccl%s rank %d -> %d: %s",
					     ops[i].send ? "Send" : "Recv", ops[i].rank,
					     ops[i].peer, a->ncclGetErrorString(r));
		}
	}
	r = a->ncclGroupEnd();
	if (r != ncclSuccess && r != ncclInProgress) {
		drop_comms(x, true);
		pthread_mutex_unlock(&x->mu);
		return refit_err_set(err, REFIT_ERR_NCCL, "ncclGroupEnd: %s",
				     a->ncclGetErrorString(r));
	}
	if (wait_comms(x, &s->cfg, "point-to-point group", err) != REFIT_OK) {
		pthread_mutex_unlock(&x->mu);
		return err->status;
	}
	/* the group is issued: wait for its kernels, bounded */
	for (size_t i = 0; i < x->nlocal; i++) {
		for (;;) {
			cudaError_t e = a->cudaStreamQuery(x->streams[i]);
			ncclResult_t st = ncclSuccess;

			if (e == cudaSuccess)
				break;
			a->ncclCommGetAsyncError(x->comms[i], &st);
			if ((e != cudaErrorNotReady) || st != ncclSuccess ||
			    atomic_load(s->cfg.abort) || xport_now_ms() >= s->cfg.deadline_ms) {
				if (e != cudaErrorNotReady)
					cuda_err(a, e, "point-to-point group", err);
				else if (st != ncclSuccess)
					refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: %s",
						      a->ncclGetErrorString(st));
				else
					refit_err_set(err, atomic_load(s->cfg.abort) ?
						      REFIT_ERR_ABORTED : REFIT_ERR_TIMEOUT,
						      "nccl transport: group %s",
						      atomic_load(s->cfg.abort) ? "aborted" :
						      "ran past the deadline");
				drop_comms(x, true);
				pthread_mutex_unlock(&x->mu);
				return err->status;
			}
			usleep(50);
		}
	}
	pthread_mutex_unlock(&x->mu);
	return REFIT_OK;
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
	pthread_mutex_lock(&s->x->mu);
	s->x->busy = false;
	pthread_cond_broadcast(&s->x->cv);
	pthread_mutex_unlock(&s->x->mu);
	free(s);
}

static refit_status_t
nccl_mem_open(xport_t *x, int32_t rank, const void *ipc, size_t len, void **base,
	      refit_err_t *err)
{
	cudaIpcMemHandle_t h;
	int li = local_index(x, rank);
	cudaError_t e;

	if (len != sizeof(h))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: a CUDA IPC handle has "
				     "%zu bytes, not %zu", rank, sizeof(h), len);
	memcpy(&h, ipc, sizeof(h));
	x->api->cudaSetDevice(li >= 0 ? li % x->api->ndevices : 0);
	e = x->api->cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess)
		return cuda_err(x->api, e, "cudaIpcOpenMemHandle", err);
	return REFIT_OK;
}

static void
nccl_mem_close(xport_t *x, void *base)
{
	x->api->cudaIpcCloseMemHandle(base);
}

static void
nccl_stop(xport_t *x)
{
	if (x == NULL)
		return;
	pthread_mutex_lock(&x->mu);
	drop_comms(x, true);
	pthread_mutex_unlock(&x->mu);
	free(x->ranks);
	free(x->local);
	free(x->node_id);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	free(x);
}

const xport_ops_t xport_nccl_ops = {
	.name = "nccl",
	.unavailable = nccl_unavailable,
	.start = nccl_start,
	.endpoint = nccl_endpoint,
	.set_epoch = nccl_set_epoch,
	.open = nccl_open,
	.exchange = nccl_exchange,
	.close = nccl_close,
	.stop = nccl_stop,
	.set_world = nccl_set_world,
	.unique_id = nccl_unique_id,
	.group = nccl_group,
	.dev = nccl_dev,
	.mem_open = nccl_mem_open,
	.mem_close = nccl_mem_close,
};
#endif
