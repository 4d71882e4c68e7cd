/*
 * node.c - the node role (see node.h).
 *
 * Membership: a timer joins the coordinator, then heartbeats; a heartbeat
 * answered NOT_FOUND (lease lost, or the coordinator restarted) joins
 * again.  Node service: PrepareEpoch records the epoch and its data-plane
 * token and refuses an epoch older than the one prepared; RunSlice and
 * Abort refuse other epochs.  The data plane itself (transports, executor,
 * the librefit socket) is not part of this build, so RunSlice reports that
 * no client memory is registered here.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/node.h"
#include "refit/v1/refit.pb-c.h"

#define CALL_MS 5000

struct node {
	uv_loop_t *loop;
	uv_timer_t beat;
	char *coordinator, *node_id, *advertise, *domain;
	int32_t *ranks;
	size_t nranks;
	rpc_client_opts_t client;
	uint64_t member_id, epoch;    /* membership epoch from the coordinator */
	uint64_t prepared_epoch;      /* last epoch PrepareEpoch set up */
	uint8_t token[64];
	size_t token_len;
	bool busy;                    /* a Join or Heartbeat is in flight */
	bool drained;                 /* an operator drained us: stay out */
	uint32_t inflight;
	bool closing, timer_closed;
};

static void
maybe_free(node_t *n)
{
	if (!n->closing || !n->timer_closed || n->inflight)
		return;
	free(n->coordinator);
	free(n->node_id);
	free(n->advertise);
	free(n->domain);
	free(n->ranks);
	free(n);
}

/* ---- membership --------------------------------------------------------- */

static void
on_join(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	n->inflight--;
	n->busy = false;
	if (!n->closing) {
		if (st != REFIT_OK) {
			log_warnx("node %s: Join: %s (retrying)", n->node_id, msg);
		} else {
			const Refit__V1__JoinResponse *r = (const void *)resp;

			n->member_id = r->member_id;
			n->epoch = r->epoch;
			log_info("node %s: joined as member %" PRIu64 " at epoch %" PRIu64
				 " (lease %u ms)", n->node_id, r->member_id, r->epoch,
				 r->lease_ttl_ms);
			if (r->heartbeat_ms)
				uv_timer_set_repeat(&n->beat, r->heartbeat_ms);
		}
	}
	maybe_free(n);
}

static void leave(node_t *n);

static void
on_beat_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	n->inflight--;
	n->busy = false;
	if (!n->closing) {
		if (st == REFIT_ERR_NOT_FOUND) {
			log_warnx("node %s: %s: joining again", n->node_id, msg);
			n->member_id = 0;
		} else if (st != REFIT_OK) {
			log_warnx("node %s: Heartbeat: %s", n->node_id, msg);
		} else if (((const Refit__V1__HeartbeatResponse *)resp)->drain) {
			log_info("node %s: drained by the operator: leaving the membership and "
				 "staying out until restarted", n->node_id);
			n->drained = true;
			leave(n);
		} else {
			const Refit__V1__HeartbeatResponse *r = (const void *)resp;

			if (r->epoch != n->epoch)
				log_info("node %s: epoch %" PRIu64 " -> %" PRIu64, n->node_id,
					 n->epoch, r->epoch);
			n->epoch = r->epoch;
		}
	}
	maybe_free(n);
}

static void
on_tick(uv_timer_t *t)
{
	node_t *n = t->data;
	refit_err_t err;

	if (n->busy || n->closing || n->drained)
		return;
	refit_err_clear(&err);
	if (n->member_id == 0) {
		Refit__V1__JoinRequest rq = REFIT__V1__JOIN_REQUEST__INIT;
		Refit__V1__RankInfo *rv = xcalloc(n->nranks, sizeof(*rv));
		Refit__V1__RankInfo **rp = xcalloc(n->nranks, sizeof(*rp));

		for (size_t i = 0; i < n->nranks; i++) {
			refit__v1__rank_info__init(&rv[i]);
			rv[i].rank = n->ranks[i];
			rv[i].domain = n->domain;
			rp[i] = &rv[i];
		}
		rq.node_id = n->node_id;
		rq.host = n->advertise;
		rq.rpc_endpoint = n->advertise;
		rq.ranks = rp;
		rq.n_ranks = n->nranks;
		if (rpc_call_async(n->loop, n->coordinator, &n->client,
				   &refit__v1__coordinator__descriptor, "Join", &rq.base, CALL_MS,
				   on_join, n, &err) == REFIT_OK) {
			n->busy = true;
			n->inflight++;
		}
		free(rv);
		free(rp);
	} else {
		Refit__V1__HeartbeatRequest rq = REFIT__V1__HEARTBEAT_REQUEST__INIT;

		rq.member_id = n->member_id;
		rq.epoch = n->epoch;
		if (rpc_call_async(n->loop, n->coordinator, &n->client,
				   &refit__v1__coordinator__descriptor, "Heartbeat", &rq.base,
				   CALL_MS, on_beat_done, n, &err) == REFIT_OK) {
			n->busy = true;
			n->inflight++;
		}
	}
	if (err.status != REFIT_OK)
		log_warnx("node %s: %s", n->node_id, err.msg);
}

/* ---- Node service -------------------------------------------------------- */

static void
h_prepare(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__PrepareEpochRequest *rq = (const void *)msg;
	Refit__V1__PrepareEpochResponse rsp = REFIT__V1__PREPARE_EPOCH_RESPONSE__INIT;
	uint64_t t0 = uv_hrtime();

	if (rq->epoch < n->prepared_epoch)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "node %s: PrepareEpoch: epoch %"
				     PRIu64 " is older than epoch %" PRIu64 " prepared here",
				     n->node_id, rq->epoch, n->prepared_epoch);
	if (rq->token.len > sizeof(n->token))
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "node %s: PrepareEpoch: token "
				     "of %zu bytes (at most %zu)", n->node_id, rq->token.len,
				     sizeof(n->token));
	n->prepared_epoch = rq->epoch;
	memcpy(n->token, rq->token.data, rq->token.len);
	n->token_len = rq->token.len;
	rsp.epoch = rq->epoch;
	rsp.micros = (uv_hrtime() - t0) / 1000;
	log_info("node %s: epoch %" PRIu64 " prepared", n->node_id, rq->epoch);
	rpc_call_reply(call, &rsp.base);
}

static void
h_run(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__RunSliceRequest *rq = (const void *)msg;

	if (rq->epoch != n->prepared_epoch)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "node %s: RunSlice for refit %"
				     PRIu64 " carries epoch %" PRIu64 ", this node prepared epoch %"
				     PRIu64, n->node_id, rq->refit_id, rq->epoch,
				     n->prepared_epoch);
	rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "node %s: no librefit client has registered "
		      "memory for model \"%s\" on this node (this build has no data plane)",
		      n->node_id, rq->model ? rq->model : "");
}

static void
h_abort(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__AbortRequest *rq = (const void *)msg;
	Refit__V1__AbortResponse rsp = REFIT__V1__ABORT_RESPONSE__INIT;

	if (rq->epoch != n->prepared_epoch)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "node %s: Abort for refit %"
				     PRIu64 " carries epoch %" PRIu64 ", this node prepared epoch %"
				     PRIu64, n->node_id, rq->refit_id, rq->epoch,
				     n->prepared_epoch);
	log_info("node %s: refit %" PRIu64 " aborted: %s", n->node_id, rq->refit_id,
		 rq->reason ? rq->reason : "");
	rpc_call_reply(call, &rsp.base);
}

static const rpc_method_cfg_t methods[] = {
	{"PrepareEpoch", h_prepare, false},
	{"RunSlice", h_run, false},
	{"Abort", h_abort, false},
};

node_t *
node_new(uv_loop_t *loop, rpc_server_t *srv, const node_opts_t *o, refit_err_t *err)
{
	node_t *n;

	if (o->nranks == 0 || o->node_id == NULL || o->advertise == NULL) {
		refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: needs node_id, ranks and an "
			      "address to advertise");
		return NULL;
	}
	n = xcalloc(1, sizeof(*n));
	n->loop = loop;
	n->coordinator = xstrdup(o->coordinator);
	n->node_id = xstrdup(o->node_id);
	n->advertise = xstrdup(o->advertise);
	n->domain = xstrdup(o->domain ? o->domain : o->node_id);
	n->ranks = xmalloc(o->nranks * sizeof(*n->ranks));
	memcpy(n->ranks, o->ranks, o->nranks * sizeof(*n->ranks));
	n->nranks = o->nranks;
	n->client = o->client;
	if (rpc_server_add_service(srv, &refit__v1__node__descriptor, methods,
				   sizeof(methods) / sizeof(methods[0]), n, err) != REFIT_OK) {
		n->closing = n->timer_closed = true;
		maybe_free(n);
		return NULL;
	}
	uv_timer_init(loop, &n->beat);
	n->beat.data = n;
	uv_timer_start(&n->beat, on_tick, 0, o->heartbeat_ms);
	return n;
}

static void
on_timer_closed(uv_handle_t *h)
{
	node_t *n = h->data;

	n->timer_closed = true;
	maybe_free(n);
}

static void
on_left(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	(void)resp;
	if (st != REFIT_OK)
		log_warnx("node %s: Leave: %s", n->node_id, msg);
	else
		log_info("node %s: left the membership", n->node_id);
	n->inflight--;
	maybe_free(n);
}

/* Leave the membership (bounded, best effort). */
static void
leave(node_t *n)
{
	Refit__V1__LeaveRequest rq = REFIT__V1__LEAVE_REQUEST__INIT;

	if (n->member_id == 0)
		return;
	rq.member_id = n->member_id;
	rq.reason = n->drained ? "drained" : "shutdown";
	n->member_id = 0;
	if (rpc_call_async(n->loop, n->coordinator, &n->client,
			   &refit__v1__coordinator__descriptor, "Leave", &rq.base, 2000,
			   on_left, n, NULL) == REFIT_OK)
		n->inflight++;
}

void
node_close(node_t *n)
{
	if (n == NULL)
		return;
	n->closing = true;
	leave(n);
	uv_timer_stop(&n->beat);
	uv_close((uv_handle_t *)&n->beat, on_timer_closed);
}

void
node_set_heartbeat(node_t *n, uint32_t heartbeat_ms)
{
	uv_timer_set_repeat(&n->beat, heartbeat_ms);
}
