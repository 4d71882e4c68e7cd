/*
 * nccl_session.c - the nccl transport's sessions: open (one at a time, the
 * communicators ensured for the epoch), NCCL groups of sends and receives
 * posted, waited on and named when they fail, the exchange, close.  Calls
 * nccl_comm.c, nccl_abort.c and nccl_state.c.
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


static void
release(xport_t *x)
{
	pthread_mutex_lock(&x->mu);
	x->busy = false;
	x->scfg = NULL;
	pthread_cond_broadcast(&x->cv);
	pthread_mutex_unlock(&x->mu);
}

/*
 * Stream ordering (docs/gpu.md): a trainer writes its weights on its own
 * streams, asynchronously; WeightsReady carries an interprocess event it
 * recorded after those writes.  Every local stream waits for each event
 * before anything of the session is queued on it, so no copy out of a
 * client's memory runs before the client's writes landed.  The wait covers
 * the event's most recent record when cudaStreamWaitEvent is called (CUDA);
 * the client records again only after BeginWrite, which waits until no
 * slice reads its memory.  The imported handle is destroyed at once: CUDA
 * keeps a pending wait.
 */
static refit_status_t
wait_events(xport_t *x, const xport_session_cfg_t *cfg, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;

	for (size_t k = 0; k < cfg->nevents; k++) {
		cudaIpcEventHandle_t h;
		cudaEvent_t ev;
		cudaError_t e;
		char what[160];

		memcpy(h.reserved, cfg->events[k].handle, sizeof(h.reserved));
		snprintf(what, sizeof(what), "client %" PRIu64 "'s ready event: "
			 "cudaIpcOpenEventHandle (the client must keep the event until its next "
			 "weights_ready)", cfg->events[k].client);
		if (cm->nlocal == 0)
			break;
		if ((e = a->cudaSetDevice(cm->dev[0])) != cudaSuccess ||
		    (e = a->cudaIpcOpenEventHandle(&ev, h)) != cudaSuccess)
			return nccl_cuda_err(x, e, what, err);
		for (size_t i = 0; i < cm->nlocal && e == cudaSuccess; i++)
			if ((e = a->cudaSetDevice(cm->dev[i])) == cudaSuccess)
				e = a->cudaStreamWaitEvent(cm->stream[i], ev, 0);
		a->cudaEventDestroy(ev);
		if (e != cudaSuccess) {
			snprintf(what, sizeof(what), "client %" PRIu64 "'s ready event: "
				 "cudaStreamWaitEvent", cfg->events[k].client);
			return nccl_cuda_err(x, e, what, err);
		}
	}
	if (cfg->nevents > 0)
		log_debug(LOG_SUB_XPORT, "nccl: node %s: %zu local streams wait for %zu client "
			  "ready events", x->node_id, cm->nlocal, cfg->nevents);
	return REFIT_OK;
}

refit_status_t
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
	/* the whole plan, before anything is allocated (docs/gpu.md) */
	if (cfg->staging_need > x->budget)
		return refit_err_set(err, REFIT_ERR_LIMIT, "nccl transport: node %s: the plan's "
				     "slice needs %" PRIu64 " bytes of GPU staging at once on rank "
				     "%d (a group's messages, sender and receiver sides, with the "
				     "relay data, conversion scratch and delta encodings and bases "
				     "held then, 256-byte rounded), more than a rank's GPU staging budget "
				     "(gpu_staging_budget_bytes %" PRIu64 "): refused before "
				     "anything was allocated; raise the budget or lower the refit's "
				     "staging_bytes", x->node_id, cfg->staging_need,
				     cfg->staging_rank, x->budget);
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
	nccl_world_copy(&w, &x->w);
	pthread_mutex_unlock(&x->mu);
	s = xcalloc(1, sizeof(*s));
	s->x = x;
	s->cfg = *cfg;
	x->scfg = &s->cfg;
	refit_err_clear(&x->derr);
	rc = nccl_ensure_comms(x, &w, &s->cfg, err);
	nccl_world_free(&w);
	if (rc != REFIT_OK) {
		free(s);
		release(x);
		return rc;
	}
	if ((rc = wait_events(x, &s->cfg, err)) != REFIT_OK) {
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
	nccl_drop_comms(x, true);
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

	CHECK(nccl_group_start(a, "", err));
	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		int li = nccl_local_index(cm, ops[i].rank);
		int peer = nccl_index_in(cm->ranks, cm->nranks, ops[i].peer);
		cudaError_t e;

		if (ops[i].bytes == 0)
			continue;
		if ((e = a->cudaSetDevice(cm->dev[li])) != cudaSuccess) {
			rc = nccl_cuda_err(x, e, "cudaSetDevice", err);
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
	return nccl_group_end(a, rc, "", err);
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
				return nccl_cuda_err(x, e, "point-to-point group", err);
			/* after the query: an error set before the stream drained is seen */
			st = nccl_comm_state(a, cm->comm[i]);
			if (st != ncclSuccess && st != ncclInProgress)
				return group_error(x, i, ops, n, st, err);
			if (e == cudaSuccess && st == ncclSuccess)
				break;
			CHECK(nccl_bounds(cfg, "point-to-point group", err));
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
	if (nccl_dfailed(x))
		return nccl_dfail_out(x, err);
	for (size_t i = 0; i < n; i++)
		if (nccl_local_index(&x->cm, ops[i].rank) < 0 ||
		    nccl_index_in(x->cm.ranks, x->cm.nranks, ops[i].peer) < 0)
			return refit_err_set(err, REFIT_ERR_INTERNAL, "nccl transport: rank %d or "
					     "%d is not in the communicators' world",
					     ops[i].rank, ops[i].peer);
	if ((rc = post_group(x, ops, n, err)) != REFIT_OK)
		return group_fail(x, rc);
	CHECK(nccl_wait_comms(x, &s->cfg, "point-to-point group", err));
	/* the fault suite waits for this line: the node is in the wait below,
	 * and PrepareEpoch (set_world, x->mu) must still be answered */
	log_debug(LOG_SUB_XPORT, "nccl: node %s: group of %zu operations issued, waiting for "
		  "it", x->node_id, n);
	if ((rc = wait_group(x, ops, n, &s->cfg, err)) != REFIT_OK)
		return group_fail(x, rc);
	return REFIT_OK;
}

/* The executor's groups, in its order, each run to completion. */
refit_status_t
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

const dp_dev_ops_t *
nccl_dev(xport_session_t *s)
{
	return &s->x->dev;
}

void
nccl_close(xport_session_t *s)
{
	if (s == NULL)
		return;
	release(s->x);
	free(s);
}

#endif
