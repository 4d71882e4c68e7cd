/*
 * nccl_comm.c - the nccl transport's communicators, their life cycle: the
 * epoch's world (set_world), unique ids (unique_id), non-blocking creation
 * from the id in one NCCL group, shrinking when members only left, polling
 * them against the session's bounds, and ensure_comms that picks between
 * keeping, shrinking and creating.  Calls nccl_abort.c and nccl_state.c.
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


void
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
	nccl_world_free(&x->w);
	nccl_world_copy(&x->w, &nw);
	pthread_mutex_unlock(&x->mu);
	/* a new epoch: the roots of earlier ids are consumed or abandoned */
	nccl_release_roots(x, nw.have_id ? &nw.id : NULL);
}

refit_status_t
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

refit_status_t
nccl_bounds(const xport_session_cfg_t *cfg, const char *what, refit_err_t *err)
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
refit_status_t
nccl_group_start(const gpu_api_t *a, const char *what, refit_err_t *err)
{
	ncclResult_t r = a->ncclGroupStart();

	if (r != ncclSuccess)
		return refit_err_set(err, REFIT_ERR_NCCL, "%sncclGroupStart: %s", what,
				     a->ncclGetErrorString(r));
	return REFIT_OK;
}

/* End the NCCL group a loop of calls opened; rc: the loop's result (the
 * first error stays), what: the calls' name for the message. */
refit_status_t
nccl_group_end(const gpu_api_t *a, refit_status_t rc, const char *what, refit_err_t *err)
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
		while (nccl_comm_state(x->api, x->cm.comm[i]) == ncclInProgress &&
		       xport_now_ms() < end)
			usleep(200);
}

/* Wait until every communicator left ncclInProgress (deadline, abort); on
 * failure they are aborted.  Owner only, never under x->mu. */
refit_status_t
nccl_wait_comms(xport_t *x, const xport_session_cfg_t *cfg, const char *what, refit_err_t *err)
{
	refit_status_t rc;

	for (;;) {
		bool pending = false;

		for (size_t i = 0; i < x->cm.nlocal; i++) {
			ncclResult_t st = nccl_comm_state(x->api, x->cm.comm[i]);

			if (st == ncclInProgress) {
				pending = true;
			} else if (st != ncclSuccess) {
				char says[320];

				rc = refit_err_set(err, REFIT_ERR_NCCL, "nccl transport: %s (rank "
						   "%d): %s%s", what, x->cm.local[i],
						   x->api->ncclGetErrorString(st),
						   nccl_says(x->api, x->cm.comm[i], says,
							     sizeof(says)));
				nccl_drop_comms(x, true);
				return rc;
			}
		}
		if (!pending)
			return REFIT_OK;
		if ((rc = nccl_bounds(cfg, what, err)) != REFIT_OK) {
			settle(x);
			nccl_drop_comms(x, true);
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

	CHECK(nccl_group_start(a, "ncclCommShrink: ", err));
	for (size_t i = 0; i < cm->nlocal && rc == REFIT_OK; i++) {
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
		cudaError_t e;
		ncclResult_t r;

		c.blocking = 0;
		if ((e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess) {
			rc = nccl_cuda_err(x, e, "cudaSetDevice", err);
			break;
		}
		r = a->ncclCommShrink(cm->comm[i], (int *)excl, (int)nex, &nc[i], &c,
				      NCCL_SHRINK_DEFAULT);
		if (r != ncclSuccess && r != ncclInProgress)
			rc = refit_err_set(err, REFIT_ERR_NCCL, "ncclCommShrink (rank %d): %s",
					   cm->local[i], a->ncclGetErrorString(r));
	}
	return nccl_group_end(a, rc, "ncclCommShrink: ", err);
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
			ncclResult_t st = nccl_comm_state(a, cm->comm[i]);
			/* NCCL's thread writes it (an atomic release store) */
			ncclComm_t child = __atomic_load_n(&nc[i], __ATOMIC_ACQUIRE);

			if (st == ncclSuccess && child != NULL)
				st = nccl_comm_state(a, child);
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
		CHECK(nccl_bounds(cfg, "shrinking the communicators", err));
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
		nccl_drop_comms(x, true);
		for (size_t i = 0; i < nl; i++) {
			ncclComm_t c = __atomic_load_n(&nc[i], __ATOMIC_ACQUIRE);
			ncclResult_t ar = c != NULL ? nccl_abort_bounded(x, c, -1) : ncclSuccess;

			if (ar != ncclSuccess && ar != ncclInProgress)
				log_warnx("nccl: node %s: ncclCommAbort of a shrunk communicator "
					  "failed", x->node_id);
		}
		free(nc);
		return rc;
	}
	for (size_t i = 0; i < cm->nlocal; i++) {
		nccl_comm_free(x, cm->comm[i], cm->local[i], false);  /* the old one */
		cm->comm[i] = nc[i];
		/* the old communicator took the arena's registration with it */
		if (cm->arena[i].base != NULL &&
		    x->api->ncclCommRegister(nc[i], cm->arena[i].base, x->budget,
					     &cm->arena[i].reg) != ncclSuccess) {
			free(nc);
			nccl_drop_comms(x, true);
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

		cm->dev[i] = nccl_device_of(x, w->local[i]);
		if (cm->dev[i] < 0) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "nccl transport: epoch %"
					   PRIu64 " gives this node rank %d, which it does not "
					   "serve", w->epoch, w->local[i]);
			break;
		}
		if ((e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess ||
		    (e = a->cudaStreamCreateWithFlags(&cm->stream[i], cudaStreamNonBlocking)) !=
			    cudaSuccess) {
			rc = nccl_cuda_err(x, e, "creating a stream", err);
			break;
		}
	}
	if (rc != REFIT_OK) {
		nccl_drop_comms(x, true);
		return rc;
	}
	/* the id is spent from here on, whatever happens */
	x->used_id = w->id;
	x->have_used = true;
	if ((rc = nccl_group_start(a, "ncclCommInitRankConfig: ", err)) != REFIT_OK) {
		nccl_drop_comms(x, true);
		return rc;
	}
	for (size_t i = 0; i < w->nlocal; i++) {
		ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
		cudaError_t e;

		c.blocking = 0;
		if ((e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess) {
			rc = nccl_cuda_err(x, e, "cudaSetDevice", err);
			break;
		}
		r = a->ncclCommInitRankConfig(&cm->comm[i], (int)w->nranks, w->id,
					      nccl_index_in(w->ranks, w->nranks, w->local[i]), &c);
		if (r != ncclSuccess && r != ncclInProgress) {
			rc = refit_err_set(err, REFIT_ERR_NCCL, "ncclCommInitRankConfig (rank %d): "
					   "%s", w->local[i], a->ncclGetErrorString(r));
			break;
		}
	}
	rc = nccl_group_end(a, rc, "ncclCommInitRankConfig: ", err);
	if (rc != REFIT_OK) {
		nccl_drop_comms(x, true);
		return rc;
	}
	/* the id's root (if this node made it) stays until the next epoch: other
	 * ranks may still be on their way to it */
	CHECK(nccl_wait_comms(x, cfg, "creating the communicators", err));
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
refit_status_t
nccl_ensure_comms(xport_t *x, const world_t *w, const xport_session_cfg_t *cfg, refit_err_t *err)
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
		nccl_drop_comms(x, false);
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

#endif
