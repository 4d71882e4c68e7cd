/*
 * coord_refit.c - refits: TriggerRefit, GetRefit, ListRefits, AbortRefit
 * and the state machine that drives the nodes.
 *
 *   PENDING -> PREPARING  plan taken (from the cache when layouts, members
 *                         and options are unchanged); every node taking part
 *                         is told the epoch (Node.PrepareEpoch), unless it
 *                         acknowledged this epoch already
 *           -> RUNNING    every node starts its slice (Node.RunSlice, answered
 *                         at the start) and reports its end (SliceDone,
 *                         counted once per node and attempt)
 *           -> COMMITTED  every node succeeded, then committed (Node.Commit:
 *                         ready, nothing shown to clients), then published
 *                         (Node.Publish, sent only once every node
 *                         committed: an instance spanning nodes switches on
 *                         all or none): the model's installed version moves
 *   any non-final state -> FAILED  (a node failed, could not be reached, or
 *                         membership changed) or ABORTED (AbortRefit)
 *
 * Node calls are asynchronous (rpc_async_call, grouped by refit id, so a
 * refit that ends cancels the calls it still has out); an answer for a
 * refit that has moved on (phase counter) is ignored.  No call lasts as
 * long as a slice: a node that never reports is caught by its lease, its
 * own slice deadline, or at last by SLICE_RUN_MS here.  Triggers are idempotent per
 * (model, key).  The last REFIT_KEEP records are kept for ListRefits.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <stdarg.h>

#include "codec/json.h"
#include "common/log.h"
#include "common/utf8.h"
#include "plan/convert.h"
#include "daemon/coord/coord_internal.h"
#include "rpc/proto_conv.h"

#define REFIT_KEEP 256
#define NODE_CALL_MS 30000
#define SLICE_RUN_MS 3600000   /* RUNNING backstop: a node's slice_timeout_ms comes first */

typedef struct nctx {
	coord_t *c;
	uint64_t refit_id, member_id;
	uint32_t phase;
} nctx_t;

static refit_rec_t *
find_refit(coord_t *c, uint64_t id)
{
	for (size_t i = 0; i < c->refits.n; i++)
		if (c->refits.v[i]->id == id)
			return c->refits.v[i];
	return NULL;
}

static bool
is_final(int st)
{
	return st == REFIT__V1__REFIT_STATE__COMMITTED || st == REFIT__V1__REFIT_STATE__FAILED ||
	       st == REFIT__V1__REFIT_STATE__ABORTED;
}

static const char *
state_name(int st)
{
	static const char *const n[] = {"PENDING", "PREPARING", "RUNNING", "COMMITTED",
					"FAILED", "ABORTED"};

	return st >= 0 && st <= 5 ? n[st] : "?";
}

static void
rec_free(refit_rec_t *r)
{
	for (size_t i = 0; i < r->nattempts; i++)
		free(r->attempts[i]);
	free(r->attempts);
	free(r->only);
	for (size_t i = 0; i < r->nskipped; i++)
		free(r->skipped[i]);
	free(r->skipped);
	free(r->model);
	free(r->key);
	free(r->failure);
	free(r->nodes);
	free(r->nstate);
	free(r->ntime);
	free(r);
}

/*
 * nccl: a failure or an abort may have aborted the communicators on some
 * nodes only; a new epoch with a new unique id makes every node build fresh
 * ones for the next refit (a node never reuses aborted ones).
 */
static void
nccl_failed_epoch(coord_t *c)
{
	c->nccl_ok = false;
	c->nccl_epoch = 0;
	c->bumping = true;
	coord_bump_epoch(c, "a refit on nccl failed");
	c->bumping = false;
}

static void
finish(coord_t *c, refit_rec_t *r, int state, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void
finish(coord_t *c, refit_rec_t *r, int state, const char *fmt, ...)
{
	char msg[REFIT_ERR_MSG_MAX] = "";
	va_list ap;
	bool bump;

	if (fmt != NULL) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		utf8_cut(msg); /* cut by the buffer: on a character boundary */
	}
	bump = (state == REFIT__V1__REFIT_STATE__FAILED ||
		state == REFIT__V1__REFIT_STATE__ABORTED) && r->nccl && !c->bumping &&
	       r->state != REFIT__V1__REFIT_STATE__PENDING;
	r->phase++;
	r->pending = 0;
	if (!r->publishing)
		rpc_async_cancel(c->rpc, r->id);  /* answers no longer wanted */
	free(r->failure);
	r->failure = msg[0] ? xstrdup(msg) : NULL;
	if (state == REFIT__V1__REFIT_STATE__FAILED && r->attempt <= r->retries) {
		/* the model's retry policy: plan again later, with the members of then */
		uint64_t wait = (uint64_t)r->backoff_ms << (r->attempt - 1 < 16 ? r->attempt - 1 : 16);

		r->attempts = xreallocarray(r->attempts, r->nattempts + 1, sizeof(char *));
		r->attempts[r->nattempts++] = xstrdup(msg);
		log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): attempt %u failed: %s; "
			 "retrying in %" PRIu64 " ms", r->id, r->model, r->version, r->attempt, msg,
			 wait);
		r->attempt++;
		r->state = REFIT__V1__REFIT_STATE__PENDING;
		r->retry_at_ms = coord_now_ms() + (wait ? wait : 1);
		r->committing = r->publishing = r->failing = r->failing_symptom = false;
		r->bytes = r->comm_us = 0;   /* figures are the last attempt's */
		r->nstages = 0;
		memset(r->stage_us, 0, sizeof(r->stage_us));
		memset(r->stage_bytes, 0, sizeof(r->stage_bytes));
		if (bump)
			nccl_failed_epoch(c);
		coord_metrics_refit(c, r, NULL);
		coord_save(c);
		return;
	}
	r->state = state;
	r->retry_at_ms = 0;
	r->finished_ms = coord_now_ms();
	if (bump)
		nccl_failed_epoch(c);
	if (state == REFIT__V1__REFIT_STATE__COMMITTED) {
		model_t *m = coord_find_model(c, r->model);

		if (m != NULL && r->only == NULL && r->version > m->installed_version)
			m->installed_version = r->version;
	}
	log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %s%s%s", r->id, r->model,
		 r->version, state_name(state), msg[0] ? ": " : "", msg);
	coord_metrics_refit(c, r, NULL);
	coord_save(c);
}

/* The options of a refit's plan: the same when planning and in RunSlice. */
void
coord_plan_opts(const coord_t *c, int mode, plan_opts_t *o)
{
	plan_opts_default(o);
	o->mode = mode == REFIT__V1__MODE__BROADCAST ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
	if (c->o.staging_bytes)
		o->staging_bytes = c->o.staging_bytes;
}

/* ---- node calls ----------------------------------------------------------- */

static void on_node_done(void *arg, refit_status_t st, const char *msg,
			 ProtobufCMessage *resp);

/* Call method on every node of r (but those that acknowledged epoch
 * skip_epoch, when not 0); fails r when a call cannot start. */
static void
call_nodes(coord_t *c, refit_rec_t *r, const char *method, const ProtobufCMessage *req,
	   int64_t timeout_ms, uint64_t skip_epoch)
{
	refit_err_t err;

	r->pending = 0;
	for (size_t i = 0; i < r->nnodes; i++) {
		member_t *m = coord_find_member(c, r->nodes[i]);
		nctx_t *x;

		refit_err_clear(&err);
		if (m == NULL || m->rpc_ep[0] == '\0') {
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: %s",
			       m ? m->node_id : "?", m ? "advertised no rpc_endpoint" :
			       "left the membership");
			return;
		}
		if (skip_epoch != 0 && m->prepared_epoch == skip_epoch)
			continue;
		x = xcalloc(1, sizeof(*x));
		*x = (nctx_t){c, r->id, m->id, r->phase};
		if (rpc_async_call(c->rpc, r->id, m->rpc_ep, &refit__v1__node__descriptor,
				   method, req, timeout_ms, on_node_done, x, &err) != REFIT_OK) {
			free(x);
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: %s", m->node_id,
			       err.msg);
			return;
		}
		c->inflight++;
		r->pending++;
	}
}

static void
start_running(coord_t *c, refit_rec_t *r)
{
	Refit__V1__RunSliceRequest rq = REFIT__V1__RUN_SLICE_REQUEST__INIT;
	model_t *m = coord_find_model(c, r->model);
	Refit__V1__InstanceLayouts *iv, **ip;
	plan_opts_t o;
	size_t n = 0;

	if (m == NULL) {
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "model \"%s\" went away", r->model);
		return;
	}
	r->state = REFIT__V1__REFIT_STATE__RUNNING;
	r->phase++;
	coord_metrics_refit(c, r, NULL);
	free(r->nstate);
	free(r->ntime);
	r->nstate = xcalloc(r->nnodes + 1, sizeof(*r->nstate));
	r->ntime = xcalloc(r->nnodes + 1, sizeof(*r->ntime));
	r->nstarted = 0;
	r->running_after_ms = 0;
	r->run_deadline_ms = coord_now_ms() + SLICE_RUN_MS;
	coord_save(c);
	coord_plan_opts(c, r->mode, &o);
	iv = xcalloc(m->inst.n + 1, sizeof(*iv));
	ip = xcalloc(m->inst.n + 1, sizeof(*ip));
	/* the trainer first, then the instances in the order the plan composed them */
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < m->inst.n; i++) {
			instance_t *in = &m->inst.v[i];

			if ((pass == 0) != (in->role == REFIT__V1__ROLE__TRAIN))
				continue;
			if (in->role == REFIT__V1__ROLE__INFER &&
			    ((r->only && strcmp(r->only, in->name) != 0) || in->skip))
				continue;
			refit__v1__instance_layouts__init(&iv[n]);
			iv[n].instance = in->name;
			iv[n].role = (Refit__V1__Role)in->role;
			iv[n].tensors = conv_layouts_to_proto(&in->layouts);
			iv[n].n_tensors = in->layouts.n;
			ip[n] = &iv[n];
			n++;
		}
	rq.refit_id = r->id;
	rq.epoch = r->epoch;
	rq.plan_digest = r->plan_digest;
	rq.model = r->model;
	rq.version = r->version;
	rq.verify = r->verify;
	rq.mode = (Refit__V1__Mode)r->mode;
	rq.chunk_bytes = o.chunk_bytes;
	rq.staging_bytes = o.staging_bytes;
	rq.instances = ip;
	rq.n_instances = n;
	rq.corrupt_msg = r->corrupt;
	rq.nic_per_node = c->o.nic_per_node;
	rq.attempt = r->attempt;
	call_nodes(c, r, "RunSlice", &rq.base, NODE_CALL_MS, 0);
	for (size_t i = 0; i < n; i++)
		conv_layouts_proto_free(iv[i].tensors, iv[i].n_tensors);
	free(iv);
	free(ip);
}

/* Every slice ran: first phase of the install, every node keeps its
 * slice's result ready without showing it (Node.Commit). */
static void
start_commit(coord_t *c, refit_rec_t *r)
{
	Refit__V1__CommitRequest rq = REFIT__V1__COMMIT_REQUEST__INIT;

	r->committing = true;
	r->phase++;
	coord_metrics_refit(c, r, NULL);
	rq.refit_id = r->id;
	rq.epoch = r->epoch;
	rq.model = r->model;
	rq.version = r->version;
	call_nodes(c, r, "Commit", &rq.base, NODE_CALL_MS, 0);
}

/* Every node committed: show the version to the clients (Node.Publish). */
static void
start_publish(coord_t *c, refit_rec_t *r)
{
	Refit__V1__PublishRequest rq = REFIT__V1__PUBLISH_REQUEST__INIT;

	r->publishing = true;
	r->phase++;
	rq.refit_id = r->id;
	rq.epoch = r->epoch;
	rq.model = r->model;
	rq.version = r->version;
	call_nodes(c, r, "Publish", &rq.base, NODE_CALL_MS, 0);
}

static void abort_on_nodes(coord_t *c, refit_rec_t *r);

/*
 * A node answered: the refit it belongs to, if the answer is still wanted
 * (the refit is in the phase the call was made in, and not final), and the
 * member that answered.  Counts the call as done.
 */
static refit_rec_t *
answer_of(const nctx_t *x, member_t **m)
{
	coord_t *c = x->c;
	refit_rec_t *r = c->closing ? NULL : find_refit(c, x->refit_id);

	c->inflight--;
	*m = c->closing ? NULL : coord_find_member(c, x->member_id);
	return r != NULL && r->phase == x->phase && !is_final(r->state) ? r : NULL;
}

/* The index of member id among r's nodes, or SIZE_MAX. */
static size_t
node_index(const refit_rec_t *r, uint64_t id)
{
	for (size_t k = 0; k < r->nnodes; k++)
		if (r->nodes[k] == id)
			return k;
	return SIZE_MAX;
}

/*
 * Node k's slice ended (its SliceDone, or a RunSlice that failed): counted
 * once.  A failure makes the others stop; the refit fails once all have
 * reported, naming the likeliest cause (peers of a failed node only see it
 * disappear).  When every slice succeeded, Commit follows.
 */
static void
slice_result(coord_t *c, refit_rec_t *r, size_t k, const char *node, refit_status_t st,
	     const char *msg, const Refit__V1__RunSliceResponse *rs)
{
	r->nstate[k] |= NODE_REPORTED;
	r->pending--;
	if (st != REFIT_OK) {
		char buf[REFIT_ERR_MSG_MAX];
		bool symptom = strstr(msg, "tcp: ") != NULL || /* the transport saw it */
			       strstr(msg, "aborted by the coordinator") != NULL;

		snprintf(buf, sizeof(buf), "node %s: RunSlice: %s", node, msg);
		utf8_cut(buf);
		if (r->failure == NULL || (!symptom && r->failing_symptom)) {
			free(r->failure);
			r->failure = xstrdup(buf);
			r->failing_symptom = symptom;
		}
		if (!r->failing) {
			r->failing = true;
			abort_on_nodes(c, r);
		}
	} else if (rs != NULL) {
		r->bytes += rs->bytes;
		if (rs->comm_micros > r->comm_us)
			r->comm_us = rs->comm_micros;
		for (size_t i = 0; i < rs->n_stages; i++) {
			uint32_t sk = rs->stages[i]->stage < 64 ? rs->stages[i]->stage : 63;

			if (rs->stages[i]->micros > r->stage_us[sk])
				r->stage_us[sk] = rs->stages[i]->micros;
			r->stage_bytes[sk] += rs->stages[i]->bytes;
			if (sk + 1 > r->nstages)
				r->nstages = sk + 1;
		}
	}
	if (r->pending > 0)
		return;
	if (r->failing)
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "%s", r->failure);
	else
		start_commit(c, r);
}

/* Node k's slice runs (its RunSlice was answered, or it already reported). */
static void
mark_started(refit_rec_t *r, size_t k)
{
	if (r->nstate[k] & NODE_STARTED)
		return;
	r->nstate[k] |= NODE_STARTED;
	if (++r->nstarted == r->nnodes) {
		r->running_after_ms = coord_now_ms() - r->created_ms;
		log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %zu slices running, "
			 "%" PRIu64 " ms after the trigger", r->id, r->model, r->version,
			 r->nnodes, r->running_after_ms);
	}
}

/* RunSlice answered: the slice started (its end comes in SliceDone). */
static void
slice_started(coord_t *c, refit_rec_t *r, size_t k, const char *node, refit_status_t st,
	      const char *msg)
{
	if (st != REFIT_OK) {
		if (!(r->nstate[k] & NODE_REPORTED))
			slice_result(c, r, k, node, st, msg, NULL);
		return;
	}
	mark_started(r, k);
}

static void
on_node_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;
	member_t *m;
	refit_rec_t *r = answer_of(x, &m);

	(void)resp;
	if (r == NULL) {
		/* moved on */
	} else if (r->state == REFIT__V1__REFIT_STATE__RUNNING && !r->committing) {
		size_t k = node_index(r, x->member_id);

		if (k != SIZE_MAX)
			slice_started(c, r, k, m ? m->node_id : "?", st, msg);
	} else if (st != REFIT_OK && r->publishing) {
		/* every node had committed: the others publish (the decision
		 * was taken); this one did not get it (it died or is cut off) */
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: Publish: %s (every node "
		       "had committed; the others published version %" PRIu64 ")",
		       m ? m->node_id : "?", msg, r->version);
	} else if (st != REFIT_OK) {
		/* a failed Commit or PrepareEpoch: nothing was published
		 * anywhere; the other nodes drop what they committed */
		const char *what = r->committing ? "Commit" : "PrepareEpoch";

		r->committing = false;  /* its other calls are cancelled */
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: %s: %s%s",
		       m ? m->node_id : "?", what, msg, what[0] == 'C' ?
		       " (nothing was published)" : "");
		abort_on_nodes(c, r);
	} else {
		if (r->state == REFIT__V1__REFIT_STATE__PREPARING && m != NULL)
			m->prepared_epoch = r->epoch;
		if (--r->pending > 0) {
			/* more answers to come */
		} else if (r->state == REFIT__V1__REFIT_STATE__PREPARING) {
			start_running(c, r);
		} else if (!r->publishing) {
			start_publish(c, r);
		} else {
			finish(c, r, REFIT__V1__REFIT_STATE__COMMITTED, NULL);
		}
	}
	free(x);
	coord_maybe_free(c);
}

/*
 * SliceDone: a node's slice ended.  Counted once per (refit, attempt,
 * node); a duplicate, or a report for an attempt that has moved on, is
 * answered counted=false so the node stops sending it.
 */
static void
h_slice_done(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__SliceDoneRequest *rq = (const void *)msg;
	Refit__V1__SliceDoneResponse rsp = REFIT__V1__SLICE_DONE_RESPONSE__INIT;
	refit_rec_t *r = find_refit(c, rq->refit_id);
	const char *node = rq->node_id ? rq->node_id : "";
	member_t *m = coord_find_member(c, rq->member_id);
	size_t k;

	if (r == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "SliceDone: no refit %" PRIu64,
				     rq->refit_id);
	if (m != NULL && strcmp(m->node_id, node) != 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SliceDone: member %" PRIu64
				     " is node \"%s\", not \"%s\"", rq->member_id, m->node_id,
				     node);
	k = node_index(r, rq->member_id);
	if (r->state != REFIT__V1__REFIT_STATE__RUNNING || r->committing ||
	    r->epoch != rq->epoch || r->attempt != rq->attempt || r->nstate == NULL) {
		log_debug(LOG_SUB_COORD, "coordinator: refit %" PRIu64 ": SliceDone from %s for epoch %" PRIu64
			  " attempt %u: the refit has moved on (%s, attempt %u)", r->id, node,
			  rq->epoch, rq->attempt, state_name(r->state), r->attempt);
		return rpc_call_reply(call, &rsp.base);
	}
	if (k == SIZE_MAX || m == NULL)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SliceDone: node \"%s\" "
				     "(member %" PRIu64 ") takes no part in refit %" PRIu64, node,
				     rq->member_id, r->id);
	if (r->nstate[k] & NODE_REPORTED)
		return rpc_call_reply(call, &rsp.base); /* a duplicate */
	rsp.counted = true;
	mark_started(r, k);  /* its RunSlice answer may still be on its way */
	r->ntime[k].plan_us = rq->plan_micros;
	r->ntime[k].plan_cached = rq->plan_cached;
	r->ntime[k].slice_us = rq->stats ? rq->stats->micros : 0;
	slice_result(c, r, k, node, rq->code == 0 ? REFIT_OK : rpc_status_from_grpc(rq->code),
		     rq->message && rq->message[0] ? rq->message : "failed", rq->stats);
	rpc_call_reply(call, &rsp.base);  /* frees rq */
}

/* ---- plans ----------------------------------------------------------------- */

/* Digest of everything a plan depends on. */
static void
plan_key(coord_t *c, const model_t *m, const char *only, const plan_opts_t *o,
	 char hex[SHA256_HEX_LEN])
{
	strbuf_t sb;

	strbuf_init(&sb);
	if (only)
		strbuf_printf(&sb, "only %s\n", only);
	strbuf_printf(&sb, "mode %d chunk %" PRIu64 " staging %" PRIu64 " nic %d\n", (int)o->mode,
		      o->chunk_bytes, o->staging_bytes, (int)c->o.nic_per_node);
	for (size_t i = 0; i < m->inst.n; i++)
		strbuf_printf(&sb, "inst %d %s %s%s\n", m->inst.v[i].role, m->inst.v[i].name,
			      m->inst.v[i].digest, m->inst.v[i].skip ? " skipped" : "");
	for (size_t i = 0; i < c->members.n; i++) {
		strbuf_printf(&sb, "node %s", c->members.v[i].node_id);
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			strbuf_printf(&sb, " %d@%s", c->members.v[i].ranks[k].rank,
				      c->members.v[i].ranks[k].domain);
		strbuf_puts(&sb, "\n");
	}
	sha256_hex(sb.s, sb.len, hex);
	strbuf_fini(&sb);
}

/* ---- planning off the loop ---------------------------------------------- */

static void
planjob_work(uv_work_t *w)
{
	planjob_t *j = w->data;

	refit_err_clear(&j->err);
	/* conversions (docs/conversion.md): plan the pair as it crosses the wire */
	j->rc = plan_convert_rewrite(&j->src, &j->dst, &j->err);
	if (j->rc == REFIT_OK)
		j->rc = plan_build(&j->src, &j->dst, &j->topo, &j->opts, &j->plan, &j->err);
	if (j->rc != REFIT_OK || !j->explain)
		return;
	j->rc = plan_cost(&j->plan, &j->src, &j->dst, &j->topo, &j->cost, &j->err);
	if (j->rc != REFIT_OK)
		return;
	j->opts.mode = PLAN_MODE_BROADCAST;
	j->rc = plan_build(&j->src, &j->dst, &j->topo, &j->opts, &j->bplan, &j->err);
	if (j->rc == REFIT_OK)
		j->rc = plan_cost(&j->bplan, &j->src, &j->dst, &j->topo, &j->bcost, &j->err);
}

static void
planjob_free(planjob_t *j)
{
	plan_fini(&j->plan);
	plan_fini(&j->bplan);
	plan_layout_set_fini(&j->src);
	plan_layout_set_fini(&j->dst);
	plan_topo_fini(&j->topo);
	free(j->model);
	free(j->only);
	free(j);
}

static void
planjob_after(uv_work_t *w, int status)
{
	planjob_t *j = w->data;
	coord_t *c = j->c;

	(void)status;
	c->inflight--;
	if (!c->closing)
		j->done(j);
	else if (j->call != NULL)
		rpc_call_fail(j->call, REFIT_ERR_UNAVAILABLE, "coordinator is shutting down");
	planjob_free(j);
	coord_maybe_free(c);
}

refit_status_t
coord_plan_async(coord_t *c, model_t *m, const char *only, const plan_opts_t *o,
		 bool explain,
		 void (*done)(planjob_t *j), uint64_t refit_id, rpc_call_t *call,
		 refit_err_t *err)
{
	planjob_t *j = xcalloc(1, sizeof(*j));
	instance_t *t = coord_train_instance(m);
	refit_status_t rc;

	if (t == NULL) {
		free(j);
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "model \"%s\" has no registered "
				     "trainer", m->name);
	}
	rc = coord_compose_dst(m, only, &j->dst, err);
	if (rc == REFIT_OK)
		rc = coord_members_topo(c, &j->topo, err);
	if (rc != REFIT_OK) {
		planjob_free(j);
		return rc;
	}
	plan_layout_set_copy(&j->src, &t->layouts);
	plan_key(c, m, only, o, j->key);
	j->only = only ? xstrdup(only) : NULL;
	j->c = c;
	j->model = xstrdup(m->name);
	j->opts = *o;
	j->explain = explain;
	j->done = done;
	j->refit_id = refit_id;
	j->call = call;
	j->w.data = j;
	if (uv_queue_work(c->loop, &j->w, planjob_work, planjob_after) != 0) {
		planjob_free(j);
		return refit_err_set(err, REFIT_ERR_SYS, "cannot queue planning work");
	}
	c->inflight++;
	return REFIT_OK;
}

static plan_cache_t *
cache_of(coord_t *c, const char *model)
{
	for (size_t i = 0; i < c->plans.n; i++)
		if (strcmp(c->plans.v[i].model, model) == 0)
			return &c->plans.v[i];
	return NULL;
}

/* Keep j's plan as the model's cached plan (the job gives it up). */
static const plan_t *
cache_store(coord_t *c, planjob_t *j)
{
	plan_cache_t *pc = cache_of(c, j->model);

	if (pc == NULL) {
		plan_cache_t n = {.model = xstrdup(j->model)};

		VEC_PUSH(&c->plans, n);
		pc = &c->plans.v[c->plans.n - 1];
	} else {
		plan_fini(&pc->plan);
	}
	memcpy(pc->key, j->key, sizeof(pc->key));
	pc->plan = j->plan;
	memset(&j->plan, 0, sizeof(j->plan));
	log_info("coordinator: model \"%s\": plan %.12s built (%zu transfers)", j->model,
		 pc->plan.digest_hex, pc->plan.nxfers);
	return &pc->plan;
}

/* Members owning a rank that sends or receives in p: one pass over p. */
static void
involved_nodes(coord_t *c, const plan_t *p, const model_t *md, refit_rec_t *r)
{
	int32_t maxr = -1;
	uint8_t *used;

	for (size_t i = 0; i < c->members.n; i++)
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			if (c->members.v[i].ranks[k].rank > maxr)
				maxr = c->members.v[i].ranks[k].rank;
	used = xcalloc((size_t)maxr + 2, 1);
	for (size_t x = 0; x < p->nxfers; x++) {
		if (p->xfers[x].from <= maxr)
			used[p->xfers[x].from] = 1;
		if (p->xfers[x].to <= maxr)
			used[p->xfers[x].to] = 1;
	}
	/* every node holding inference memory installs, even one receiving nothing */
	for (size_t i = 0; md != NULL && i < md->inst.n; i++)
		for (size_t t = 0; md->inst.v[i].role == REFIT__V1__ROLE__INFER &&
				   !md->inst.v[i].skip &&
				   (r->only == NULL || strcmp(r->only, md->inst.v[i].name) == 0) &&
				   t < md->inst.v[i].layouts.n; t++)
			for (size_t k = 0; k < md->inst.v[i].layouts.v[t].nshards; k++) {
				int32_t rk = md->inst.v[i].layouts.v[t].shards[k].rank;

				if (rk <= maxr)
					used[rk] = 1;
			}
	free(r->nodes);
	r->nnodes = 0;
	r->nodes = xcalloc(c->members.n ? c->members.n : 1, sizeof(*r->nodes));
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];
		bool any = false;

		for (size_t k = 0; k < m->nranks && !any; k++)
			any = used[m->ranks[k].rank];
		if (any)
			r->nodes[r->nnodes++] = m->id;
	}
	free(used);
}

static void send_prepare(coord_t *c, refit_rec_t *r);


/* The id (or none: shrink) of r's epoch is the one every refit of it uses. */
static void
nccl_remember(coord_t *c, const refit_rec_t *r)
{
	memcpy(c->nccl_id, r->nccl_id, r->nccl_id_len);
	c->nccl_id_len = r->nccl_id_len;
	c->nccl_epoch = r->epoch;
	free(c->nccl_members);
	c->nccl_members = xcalloc(c->members.n + 1, sizeof(*c->nccl_members));
	for (size_t i = 0; i < c->members.n; i++)
		c->nccl_members[i] = c->members.v[i].id;
	c->nccl_nmembers = c->members.n;
	c->nccl_ok = true;
}

/*
 * Does r's epoch need a new unique id?  Not when it has one already (a
 * second refit of the epoch) or when members only left since the last id
 * and nothing failed: then the nodes shrink their communicators.  Each id
 * starts a bootstrap root that only communicators consume: ask for one
 * exactly when the nodes will build new ones.
 */
static bool
nccl_need_id(coord_t *c, refit_rec_t *r)
{
	if (c->nccl_ok && c->nccl_epoch == r->epoch) {
		memcpy(r->nccl_id, c->nccl_id, c->nccl_id_len);
		r->nccl_id_len = c->nccl_id_len;
		return false;
	}
	if (!c->nccl_ok || c->nccl_epoch == 0 || c->members.n >= c->nccl_nmembers)
		return true;
	for (size_t i = 0; i < c->members.n; i++) {
		bool was = false;

		for (size_t k = 0; k < c->nccl_nmembers && !was; k++)
			was = c->nccl_members[k] == c->members.v[i].id;
		if (!was)
			return true;
	}
	r->nccl_id_len = 0;   /* shrink */
	nccl_remember(c, r);
	return false;
}

/* Another nccl refit between planning and its end (they run one at a time). */
static bool
nccl_busy(const coord_t *c, const refit_rec_t *r)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		const refit_rec_t *o = c->refits.v[i];

		if (o != r && o->nccl && (o->state == REFIT__V1__REFIT_STATE__PREPARING ||
					  o->state == REFIT__V1__REFIT_STATE__RUNNING))
			return true;
	}
	return false;
}

static void
on_nccl_id(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;
	member_t *m;
	refit_rec_t *r = answer_of(x, &m);

	if (r != NULL) {
		const Refit__V1__NcclIdResponse *rs = (const void *)resp;

		if (st != REFIT_OK) {
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: NcclId: %s",
			       m ? m->node_id : "?", msg);
		} else if (rs->nccl_unique_id.len == 0 ||
			   rs->nccl_unique_id.len > sizeof(r->nccl_id)) {
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: NcclId: an id of "
			       "%zu bytes", m ? m->node_id : "?", rs->nccl_unique_id.len);
		} else {
			memcpy(r->nccl_id, rs->nccl_unique_id.data, rs->nccl_unique_id.len);
			r->nccl_id_len = rs->nccl_unique_id.len;
			nccl_remember(c, r);
			send_prepare(c, r);
		}
	}
	free(x);
	coord_maybe_free(c);
}

/*
 * With the plan in hand: tell every node taking part the epoch.  On the
 * nccl transport every member takes part (the communicators span the whole
 * epoch) and the unique id comes first from the node of the lowest rank.
 */
static void
prepare(coord_t *c, refit_rec_t *r, const plan_t *p)
{
	const member_t *low = NULL, *other = NULL;
	int32_t lowr = INT32_MAX;
	size_t nn = 0;

	bool nccl = false;

	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];

		if (strcmp(m->transport, "nccl") == 0)
			nccl = true;
		else
			other = m;
		for (size_t k = 0; k < m->nranks; k++)
			if (m->ranks[k].rank < lowr) {
				lowr = m->ranks[k].rank;
				low = m;
			}
	}
	/*
	 * nccl: one refit at a time, cluster-wide, so that every node posts
	 * its NCCL groups in the same order (docs/dataplane.md); the others
	 * wait, PENDING, and start at a tick after it ends.
	 */
	if (nccl && other == NULL && nccl_busy(c, r)) {
		r->retry_at_ms = coord_now_ms() + 1;
		return;
	}
	memcpy(r->plan_digest, p->digest_hex, sizeof(r->plan_digest));
	involved_nodes(c, p, coord_find_model(c, r->model), r);
	r->epoch = c->epoch;
	r->state = REFIT__V1__REFIT_STATE__PREPARING;
	r->phase++;
	coord_metrics_refit(c, r, p);
	r->nccl = nccl;
	coord_save(c);
	if (r->nccl && other != NULL) {
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "mixed transports: node %s uses "
		       "%s while others use nccl; every node of an epoch needs the same",
		       other->node_id, other->transport);
		return;
	}
	if (r->nnodes == 0) {
		finish(c, r, REFIT__V1__REFIT_STATE__COMMITTED, NULL); /* nothing moves */
		return;
	}
	if (!r->nccl) {
		send_prepare(c, r);
		return;
	}
	free(r->nodes);
	r->nodes = xcalloc(c->members.n + 1, sizeof(*r->nodes));
	for (size_t i = 0; i < c->members.n; i++)
		r->nodes[nn++] = c->members.v[i].id;
	r->nnodes = nn;
	if (!nccl_need_id(c, r)) {
		send_prepare(c, r);
		return;
	}
	{
		Refit__V1__NcclIdRequest rq = REFIT__V1__NCCL_ID_REQUEST__INIT;
		nctx_t *x = xcalloc(1, sizeof(*x));
		refit_err_t err;

		refit_err_clear(&err);
		*x = (nctx_t){c, r->id, low->id, r->phase};
		rq.epoch = r->epoch;
		if (rpc_async_call(c->rpc, r->id, low->rpc_ep, &refit__v1__node__descriptor,
				   "NcclId", &rq.base, NODE_CALL_MS, on_nccl_id, x, &err) !=
		    REFIT_OK) {
			free(x);
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s: %s", low->node_id,
			       err.msg);
			return;
		}
		c->inflight++;
	}
}

static void
send_prepare(coord_t *c, refit_rec_t *r)
{
	Refit__V1__PrepareEpochRequest rq = REFIT__V1__PREPARE_EPOCH_REQUEST__INIT;
	Refit__V1__Member *mv, **mp;

	r->phase++;
	/* one token per epoch: refits of several models share the epoch */
	if (c->token_epoch != r->epoch) {
		if (getrandom(c->token, sizeof(c->token), 0) != (ssize_t)sizeof(c->token))
			log_warn("coordinator: getrandom");
		c->token_epoch = r->epoch;
	}
	rq.epoch = r->epoch;
	rq.token.data = c->token;
	rq.token.len = sizeof(c->token);
	if (r->nccl && r->nccl_id_len) {
		rq.nccl_unique_id.data = r->nccl_id;
		rq.nccl_unique_id.len = r->nccl_id_len;
	}
	mv = xcalloc(c->members.n + 1, sizeof(*mv));
	mp = xcalloc(c->members.n + 1, sizeof(*mp));
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];

		refit__v1__member__init(&mv[i]);
		mv[i].member_id = m->id;
		mv[i].node_id = m->node_id;
		mv[i].host = m->host;
		mv[i].rpc_endpoint = m->rpc_ep;
		mv[i].data_endpoint = m->data_ep;
		mv[i].transport = m->transport;
		mv[i].ranks = xcalloc(m->nranks + 1, sizeof(*mv[i].ranks));
		mv[i].n_ranks = m->nranks;
		for (size_t k = 0; k < m->nranks; k++) {
			mv[i].ranks[k] = xmalloc(sizeof(*mv[i].ranks[k]));
			refit__v1__rank_info__init(mv[i].ranks[k]);
			mv[i].ranks[k]->rank = m->ranks[k].rank;
			mv[i].ranks[k]->domain = m->ranks[k].domain;
		}
		mp[i] = &mv[i];
	}
	rq.members = mp;
	rq.n_members = c->members.n;
	/* a node that acknowledged this epoch already (for another refit)
	 * is not told again: same members, same token, same unique id */
	call_nodes(c, r, "PrepareEpoch", &rq.base, NODE_CALL_MS, r->epoch);
	for (size_t i = 0; i < c->members.n; i++) {
		for (size_t k = 0; k < mv[i].n_ranks; k++)
			free(mv[i].ranks[k]);
		free(mv[i].ranks);
	}
	free(mv);
	free(mp);
	if (r->state == REFIT__V1__REFIT_STATE__PREPARING && r->pending == 0)
		start_running(c, r);  /* every node had it */
}

static void start_refit(coord_t *c, model_t *m, refit_rec_t *r);

static void
on_refit_planned(planjob_t *j)
{
	coord_t *c = j->c;
	refit_rec_t *r = find_refit(c, j->refit_id);
	model_t *m = coord_find_model(c, j->model);
	char key[SHA256_HEX_LEN];

	if (r == NULL || r->state != REFIT__V1__REFIT_STATE__PENDING)
		return; /* aborted while planning */
	if (j->rc != REFIT_OK) {
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "plan: %s", j->err.msg);
		return;
	}
	if (m == NULL) {
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "model \"%s\" went away while "
		       "planning", j->model);
		return;
	}
	plan_key(c, m, j->only, &j->opts, key);
	if (strcmp(key, j->key) != 0) {
		start_refit(c, m, r); /* layouts or members changed: plan again */
		return;
	}
	if (j->only == NULL) {
		prepare(c, r, cache_store(c, j));
		return;
	}
	/* a catch-up plan is used once: keep it with the refit until prepared */
	prepare(c, r, &j->plan);
}

/*
 * Which inference instances this refit leaves out: those not healthy now
 * (the member that registered them left, or a rank of theirs has no
 * member).  A strict model fails instead; so does one left with none.
 * False when the refit was finished here.
 */
static bool
choose_instances(coord_t *c, model_t *m, refit_rec_t *r)
{
	strbuf_t sb;
	size_t healthy = 0;

	for (size_t i = 0; i < r->nskipped; i++)
		free(r->skipped[i]);
	r->nskipped = 0;
	strbuf_init(&sb);
	for (size_t i = 0; i < m->inst.n; i++) {
		instance_t *in = &m->inst.v[i];
		int32_t lost = -1;

		in->skip = false;
		if (in->role != REFIT__V1__ROLE__INFER ||
		    (r->only && strcmp(r->only, in->name) != 0))
			continue;
		for (size_t t = 0; t < in->layouts.n && lost < 0; t++)
			for (size_t k = 0; k < in->layouts.v[t].nshards && lost < 0; k++) {
				int32_t rk = in->layouts.v[t].shards[k].rank;
				bool found = false;

				for (size_t q = 0; q < c->members.n && !found; q++)
					for (size_t j = 0; j < c->members.v[q].nranks && !found; j++)
						found = c->members.v[q].ranks[j].rank == rk;
				if (!found)
					lost = rk;
			}
		if (lost < 0 && coord_find_member(c, in->member_id) != NULL) {
			healthy++;
			continue;
		}
		in->skip = true;
		in->missed = true;
		r->skipped = xreallocarray(r->skipped, r->nskipped + 1, sizeof(char *));
		r->skipped[r->nskipped++] = xstrdup(in->name);
		if (lost >= 0)
			strbuf_printf(&sb, "%s\"%s\" (rank %d has no node)", sb.len ? ", " : "",
				      in->name, lost);
		else
			strbuf_printf(&sb, "%s\"%s\" (its node left)", sb.len ? ", " : "",
				      in->name);
	}
	if (r->nskipped && (m->strict_instances || healthy == 0)) {
		for (size_t i = 0; i < m->inst.n; i++)
			m->inst.v[i].skip = false;
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "%s: %s", healthy == 0 ?
		       "no healthy inference instance" : "instances not healthy (strict policy)",
		       sb.s);
		strbuf_fini(&sb);
		return false;
	}
	if (r->nskipped)
		log_warnx("coordinator: refit %" PRIu64 " (%s v%" PRIu64 ") skips %s", r->id,
			  r->model, r->version, sb.s);
	strbuf_fini(&sb);
	return true;
}

static void
start_refit(coord_t *c, model_t *m, refit_rec_t *r)
{
	plan_cache_t *pc = r->only ? NULL : cache_of(c, m->name);
	plan_opts_t o;
	refit_err_t err;
	char key[SHA256_HEX_LEN];

	refit_err_clear(&err);
	if (!choose_instances(c, m, r))
		return;
	coord_plan_opts(c, r->mode, &o);
	plan_key(c, m, r->only, &o, key);
	if (pc != NULL && strcmp(pc->key, key) == 0) {
		prepare(c, r, &pc->plan);
		return;
	}
	if (coord_plan_async(c, m, r->only, &o, false, on_refit_planned, r->id, NULL, &err) !=
	    REFIT_OK)
		finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "plan: %s", err.msg);
}

size_t
coord_refits_abort_member(coord_t *c, uint64_t id, const char *why, uint64_t *ids,
			  size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];
		bool uses = r->state == REFIT__V1__REFIT_STATE__PENDING;

		for (size_t k = 0; k < r->nnodes && !uses; k++)
			uses = r->nodes[k] == id;
		if (is_final(r->state) || !uses)
			continue;
		finish(c, r, REFIT__V1__REFIT_STATE__ABORTED, "aborted: %s", why);
		abort_on_nodes(c, r);
		if (n < max)
			ids[n++] = r->id;
	}
	return n;
}

void
coord_refits_on_epoch(coord_t *c, uint64_t old_epoch, const char *why)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (!is_final(r->state) && r->state != REFIT__V1__REFIT_STATE__PENDING &&
		    r->epoch == old_epoch) {
			uint32_t a = r->attempt;

			/* the change names the node (a lease that expired: the node
			 * that died under the refit) */
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "membership changed (epoch %"
			       PRIu64 " -> %" PRIu64 ": %s) during the refit", old_epoch,
			       c->epoch, why);
			/* the surviving nodes stop now, not at their slice deadline */
			if (r->state == REFIT__V1__REFIT_STATE__FAILED || r->attempt != a)
				abort_on_nodes(c, r);
		}
	}
}

/* ---- handlers --------------------------------------------------------------- */

static void
fill_refit(const refit_rec_t *r, Refit__V1__Refit *o)
{
	refit__v1__refit__init(o);
	o->id = r->id;
	o->model = r->model;
	o->version = r->version;
	o->epoch = r->epoch;
	o->mode = (Refit__V1__Mode)r->mode;
	o->verify = r->verify;
	o->state = (Refit__V1__RefitState)r->state;
	o->plan_digest = (char *)r->plan_digest;
	o->created_unix_ms = r->created_ms;
	o->finished_unix_ms = r->finished_ms;
	o->bytes = r->bytes;
	o->failure = r->failure ? r->failure : "";
	o->idempotency_key = r->key ? r->key : "";
	o->attempt = r->attempt;
	o->attempts = r->attempts;
	o->n_attempts = r->nattempts;
	o->instance = r->only ? r->only : "";
	o->skipped = r->skipped;
	o->n_skipped = r->nskipped;
	o->comm_micros = r->comm_us;
	o->running_after_ms = r->running_after_ms;
}

/* fill_refit's per-node figures (node names are c's; free nv and np). */
static void
fill_nodes(coord_t *c, const refit_rec_t *r, Refit__V1__Refit *o, Refit__V1__NodeTiming **nv,
	   Refit__V1__NodeTiming ***np)
{
	size_t n = r->ntime ? r->nnodes : 0;

	*nv = xcalloc(n + 1, sizeof(**nv));
	*np = xcalloc(n + 1, sizeof(**np));
	for (size_t k = 0; k < n; k++) {
		const member_t *m = coord_find_member(c, r->nodes[k]);

		refit__v1__node_timing__init(&(*nv)[k]);
		(*nv)[k].node_id = m ? m->node_id : "(left)";
		(*nv)[k].plan_micros = r->ntime[k].plan_us;
		(*nv)[k].plan_cached = r->ntime[k].plan_cached;
		(*nv)[k].slice_micros = r->ntime[k].slice_us;
		(*nv)[k].reported = (r->nstate[k] & NODE_REPORTED) != 0;
		(*np)[k] = &(*nv)[k];
	}
	o->nodes = *np;
	o->n_nodes = n;
}

/* fill_refit's stage timings (caller storage). */
static void
fill_stages(const refit_rec_t *r, Refit__V1__Refit *o, Refit__V1__StageTiming *tv,
	    Refit__V1__StageTiming **tp)
{
	for (uint32_t k = 0; k < r->nstages; k++) {
		refit__v1__stage_timing__init(&tv[k]);
		tv[k].stage = k;
		tv[k].micros = r->stage_us[k];
		tv[k].bytes = r->stage_bytes[k];
		tp[k] = &tv[k];
	}
	o->stages = tp;
	o->n_stages = r->nstages;
}

static void
trim_records(coord_t *c)
{
	for (size_t i = 0; c->refits.n > REFIT_KEEP && i < c->refits.n;) {
		if (is_final(c->refits.v[i]->state)) {
			rec_free(c->refits.v[i]);
			memmove(&c->refits.v[i], &c->refits.v[i + 1],
				(c->refits.n - i - 1) * sizeof(*c->refits.v));
			c->refits.n--;
		} else {
			i++;
		}
	}
}

static void
h_trigger(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__TriggerRefitRequest *rq = (const void *)msg;
	Refit__V1__TriggerRefitResponse rsp = REFIT__V1__TRIGGER_REFIT_RESPONSE__INIT;
	const char *key = rq->idempotency_key && rq->idempotency_key[0] ? rq->idempotency_key : NULL;
	model_t *m = coord_find_model(c, rq->model ? rq->model : "");
	refit_rec_t *r;

	if (m == NULL || coord_train_instance(m) == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "TriggerRefit: model \"%s\" has "
				     "no registered trainer", rq->model ? rq->model : "");
	for (size_t i = 0; key && i < c->refits.n; i++) {
		r = c->refits.v[i];
		if (r->key && strcmp(r->key, key) == 0 && strcmp(r->model, m->name) == 0) {
			rsp.refit_id = r->id;
			rsp.existing = true;
			return rpc_call_reply(call, &rsp.base);
		}
	}
	if (m->latest_version == 0)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "TriggerRefit \"%s\": no weights "
				     "are ready yet (no WeightsReady)", m->name);
	if (rq->version > m->latest_version)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "TriggerRefit \"%s\": version %"
				     PRIu64 " is newer than the latest ready %" PRIu64, m->name,
				     rq->version, m->latest_version);
	if (rq->mode != REFIT__V1__MODE__RESHARD && rq->mode != REFIT__V1__MODE__BROADCAST)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "TriggerRefit: unknown mode %d",
				     (int)rq->mode);
	for (size_t i = 0; i < c->refits.n; i++)
		if (!is_final(c->refits.v[i]->state) && strcmp(c->refits.v[i]->model, m->name) == 0)
			return rpc_call_fail(call, REFIT_ERR_EXISTS, "TriggerRefit \"%s\": refit %"
					     PRIu64 " is still %s", m->name, c->refits.v[i]->id,
					     state_name(c->refits.v[i]->state));
	r = xcalloc(1, sizeof(*r));
	r->id = ++c->next_refit;
	r->model = xstrdup(m->name);
	r->key = key ? xstrdup(key) : NULL;
	r->version = rq->version ? rq->version : m->latest_version;
	r->mode = (int)rq->mode;
	r->verify = rq->verify;
	r->corrupt = rq->test_corrupt_msg;
	r->attempt = 1;
	r->retries = m->retries;
	r->backoff_ms = m->retry_backoff_ms;
	r->created_ms = coord_now_ms();
	r->state = REFIT__V1__REFIT_STATE__PENDING;
	VEC_PUSH(&c->refits, r);
	{
		refit_err_t err;

		refit_err_clear(&err);
		if (coord_save_durable(c, "TriggerRefit", &err) != REFIT_OK) {
			c->refits.n--;
			c->next_refit--;
			rec_free(r);
			return rpc_call_fail(call, err.status, "%s", err.msg);
		}
	}
	trim_records(c);
	rsp.refit_id = r->id;
	rpc_call_reply(call, &rsp.base);
	start_refit(c, m, r);
}

static void
h_get(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__GetRefitRequest *rq = (const void *)msg;
	refit_rec_t *r = find_refit(c, rq->refit_id);
	Refit__V1__Refit o;

	Refit__V1__StageTiming tv[64], *tp[64];
	Refit__V1__NodeTiming *nv, **np;

	if (r == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "GetRefit: no refit %" PRIu64,
				     rq->refit_id);
	fill_refit(r, &o);
	fill_stages(r, &o, tv, tp);
	fill_nodes(c, r, &o, &nv, &np);
	rpc_call_reply(call, &o.base);
	free(nv);
	free(np);
}

static void
h_list(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__ListRefitsRequest *rq = (const void *)msg;
	Refit__V1__ListRefitsResponse rsp = REFIT__V1__LIST_REFITS_RESPONSE__INIT;
	Refit__V1__Refit *v = xcalloc(c->refits.n ? c->refits.n : 1, sizeof(*v));
	Refit__V1__Refit **p = xcalloc(c->refits.n ? c->refits.n : 1, sizeof(*p));
	size_t n = 0;

	for (size_t i = c->refits.n; i-- > 0;) { /* newest first */
		const refit_rec_t *r = c->refits.v[i];

		if (rq->model && rq->model[0] && strcmp(rq->model, r->model) != 0)
			continue;
		if (rq->limit && n == rq->limit)
			break;
		fill_refit(r, &v[n]);
		p[n] = &v[n];
		n++;
	}
	rsp.refits = p;
	rsp.n_refits = n;
	rpc_call_reply(call, &rsp.base);
	free(v);
	free(p);
}

/*
 * A failing refit's Abort found a node unreachable (its process died, so
 * its SliceDone will never come): its slice counts as failed now, not when
 * its lease lapses.
 */
static void
unreachable(coord_t *c, const nctx_t *x, const char *msg)
{
	refit_rec_t *r = find_refit(c, x->refit_id);
	member_t *m = coord_find_member(c, x->member_id);
	size_t k;
	char buf[REFIT_ERR_MSG_MAX];

	if (r == NULL || r->phase != x->phase || r->state != REFIT__V1__REFIT_STATE__RUNNING ||
	    r->committing || r->nstate == NULL || m == NULL)
		return;
	k = node_index(r, x->member_id);
	if (k == SIZE_MAX || (r->nstate[k] & NODE_REPORTED))
		return;
	snprintf(buf, sizeof(buf), "unreachable during its slice (%s)", msg);
	slice_result(c, r, k, m->node_id, REFIT_ERR_UNAVAILABLE, buf, NULL);
}

static void
on_abort_sent(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;

	(void)resp;
	if (st != REFIT_OK)
		log_warnx("coordinator: refit %" PRIu64 ": Node.Abort to member %" PRIu64 ": %s",
			  x->refit_id, x->member_id, msg);
	c->inflight--;
	if (st == REFIT_ERR_UNAVAILABLE && !c->closing)
		unreachable(c, x, msg);
	free(x);
	coord_maybe_free(c);
}

/* Tell every node of r that it was aborted (best effort). */
static void
abort_on_nodes(coord_t *c, refit_rec_t *r)
{
	Refit__V1__AbortRequest ab = REFIT__V1__ABORT_REQUEST__INIT;

	ab.refit_id = r->id;
	ab.epoch = r->epoch;
	ab.reason = r->failure;
	/* the attempt that ended: finish() already moved a retried refit on */
	ab.attempt = r->state == REFIT__V1__REFIT_STATE__PENDING && r->attempt > 1 ?
		     r->attempt - 1 : r->attempt;
	for (size_t i = 0; i < r->nnodes; i++) {
		member_t *m = coord_find_member(c, r->nodes[i]);
		nctx_t *x;

		if (m == NULL || m->rpc_ep[0] == '\0')
			continue;
		x = xcalloc(1, sizeof(*x));
		*x = (nctx_t){c, r->id, m->id, r->phase};
		if (rpc_async_call(c->rpc, RPC_GROUP_NONE, m->rpc_ep,
				   &refit__v1__node__descriptor, "Abort", &ab.base, 5000,
				   on_abort_sent, x, NULL) == REFIT_OK)
			c->inflight++;
		else
			free(x);
	}
}

static void
h_abort(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__AbortRefitRequest *rq = (const void *)msg;
	refit_rec_t *r = find_refit(c, rq->refit_id);
	Refit__V1__Refit o;

	if (r == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "AbortRefit: no refit %" PRIu64,
				     rq->refit_id);
	if (is_final(r->state))
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "AbortRefit: refit %" PRIu64
				     " is already %s", r->id, state_name(r->state));
	finish(c, r, REFIT__V1__REFIT_STATE__ABORTED, "aborted: %s",
	       rq->reason && rq->reason[0] ? rq->reason : "by request");
	abort_on_nodes(c, r);
	fill_refit(r, &o);
	rpc_call_reply(call, &o.base);
}

const rpc_method_cfg_t coord_refit_methods[] = {
	{"TriggerRefit", h_trigger, true},
	{"GetRefit", h_get, true},
	{"ListRefits", h_list, true},
	{"AbortRefit", h_abort, true},
	{"SliceDone", h_slice_done, false},
};
const size_t coord_refit_nmethods = sizeof(coord_refit_methods) / sizeof(coord_refit_methods[0]);

static bool
model_busy(coord_t *c, const char *model)
{
	for (size_t i = 0; i < c->refits.n; i++)
		if (!is_final(c->refits.v[i]->state) && strcmp(c->refits.v[i]->model, model) == 0 &&
		    c->refits.v[i]->retry_at_ms == 0)
			return true;
	return false;
}

/* RUNNING past SLICE_RUN_MS with slices unreported: fail it (a backstop;
 * leases and the nodes' own slice deadlines come first). */
static void
overdue(coord_t *c, refit_rec_t *r)
{
	size_t k = 0;
	const member_t *m;

	while (k < r->nnodes && (r->nstate[k] & NODE_REPORTED))
		k++;
	m = k < r->nnodes ? coord_find_member(c, r->nodes[k]) : NULL;
	finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "node %s never reported its slice "
	       "(SliceDone) within %d ms; %u of %zu did not", m ? m->node_id : "?",
	       SLICE_RUN_MS, r->pending, r->nnodes);
	abort_on_nodes(c, r);
}

void
coord_refits_tick(coord_t *c)
{
	uint64_t now = coord_now_ms();

	if (c->closing)
		return;
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (r->state == REFIT__V1__REFIT_STATE__RUNNING && !r->committing &&
		    r->nstate != NULL && now > r->run_deadline_ms)
			overdue(c, r);
	}
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];
		model_t *m;

		if (r->state != REFIT__V1__REFIT_STATE__PENDING || r->retry_at_ms == 0 ||
		    now < r->retry_at_ms)
			continue;
		r->retry_at_ms = 0;
		if ((m = coord_find_model(c, r->model)) == NULL)
			finish(c, r, REFIT__V1__REFIT_STATE__FAILED, "model \"%s\" went away",
			       r->model);
		else
			start_refit(c, m, r);
	}
	/* catch-up: an instance that registered after a version was ready gets it */
	for (size_t k = 0; k < c->models.n; k++) {
		model_t *m = &c->models.v[k];

		for (size_t i = 0; i < m->inst.n; i++) {
			instance_t *in = &m->inst.v[i];
			refit_rec_t *r;

			if (in->catch_up_at_ms == 0 || now < in->catch_up_at_ms)
				continue;
			if (model_busy(c, m->name))
				continue;   /* after the refit in flight */
			in->catch_up_at_ms = 0;
			if (m->latest_version == 0 || coord_train_instance(m) == NULL)
				continue;
			r = xcalloc(1, sizeof(*r));
			r->id = ++c->next_refit;
			r->model = xstrdup(m->name);
			r->only = xstrdup(in->name);
			r->version = m->latest_version;
			r->mode = REFIT__V1__MODE__RESHARD;
			r->created_ms = now;
			r->state = REFIT__V1__REFIT_STATE__PENDING;
			r->attempt = 1;
			r->retries = m->retries;
			r->backoff_ms = m->retry_backoff_ms;
			VEC_PUSH(&c->refits, r);
			trim_records(c);
			log_info("coordinator: refit %" PRIu64 ": catch-up of instance \"%s\" of "
				 "model \"%s\" to version %" PRIu64, r->id, in->name, m->name,
				 r->version);
			coord_save(c);
			start_refit(c, m, r);
			return; /* the vectors may have moved */
		}
	}
}

void
coord_refits_fini(coord_t *c)
{
	free(c->nccl_members);
	c->nccl_members = NULL;
	for (size_t i = 0; i < c->refits.n; i++)
		rec_free(c->refits.v[i]);
	VEC_FREE(&c->refits);
	for (size_t i = 0; i < c->plans.n; i++) {
		free(c->plans.v[i].model);
		plan_fini(&c->plans.v[i].plan);
	}
	VEC_FREE(&c->plans);
}
