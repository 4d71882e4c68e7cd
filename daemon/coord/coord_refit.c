/*
 * coord_refit.c - refits: TriggerRefit, GetRefit, ListRefits, AbortRefit,
 * SliceDone, and the driver of the refit state machine (refit_fsm.h).
 *
 * Everything that happens to a refit becomes an event of its machine
 * (refit_event): a plan in hand, a node's answer, a slice's report, a
 * membership change, an abort.  The machine says what comes next; this
 * file carries the actions out, in the order given: bookkeeping first
 * (the failure kept, calls cancelled, a retry noted, the end), then the
 * refit's metrics and state file, then the calls to nodes, which feed
 * events back.  The state is set before any action runs, so an action
 * that reaches the refit again (a new epoch failing the refits of the old
 * one) finds it in its new state: no re-entry guard is needed.
 *
 *   planning -> preparing (-> nccl-id first on nccl when the epoch needs a
 *   unique id) -> running -> committing -> publishing -> committed; a slice
 *   failure -> failing (the others are aborted, their reports collected);
 *   a failure with retries left -> retry-wait -> planning; nccl refits wait
 *   their turn in queued; any live state -> aborted (AbortRefit, a drain).
 *   docs/control-plane.md has the whole table.
 *
 * Node calls are asynchronous (rpc_async_call, grouped by refit id, so a
 * refit that ends cancels the calls it still has out); an answer for a
 * refit that has moved on (phase counter) is ignored.  No call lasts as
 * long as a slice: a node that never reports is caught by its lease, its
 * own slice deadline, or at last by SLICE_RUN_MS here.  Triggers are
 * idempotent per (model, key).  The last REFIT_KEEP records are kept for
 * ListRefits.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "common/utf8.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/coord/coord_rules.h"
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
is_final(const refit_rec_t *r)
{
	return refit_fsm_is(r->fsm.state, REFIT_FSM_FINAL);
}

/* RUNNING, FAILING*: the round of RunSlice answers and slice reports. */
static bool
runs_slices(const refit_rec_t *r)
{
	return r->fsm.state == REFIT_FSM_RUNNING || r->fsm.state == REFIT_FSM_FAILING ||
	       r->fsm.state == REFIT_FSM_FAILING_SYMPTOM;
}

static const char *
public_name(const refit_rec_t *r)
{
	return refit_fsm_public_name(refit_fsm_public(r->fsm.state));
}

/* ---- the driver ------------------------------------------------------------ */

static void plan_refit(coord_t *c, refit_rec_t *r);
static void ask_nccl_id(coord_t *c, refit_rec_t *r);
static void send_prepare(coord_t *c, refit_rec_t *r);
static void send_run(coord_t *c, refit_rec_t *r);
static void send_install(coord_t *c, refit_rec_t *r);
static void abort_on_nodes(coord_t *c, refit_rec_t *r, uint32_t attempt);

/*
 * nccl: a failure or an abort may have aborted the communicators on some
 * nodes only; a new epoch with a new unique id makes every node build fresh
 * ones for the next refit (a node never reuses aborted ones).  At most one
 * nccl refit holds an epoch at a time (nccl_busy), so the refits this new
 * epoch fails are never nccl ones asking for another.
 */
static void
nccl_failed_epoch(coord_t *c)
{
	c->nccl_ok = false;
	c->nccl_epoch = 0;
	coord_bump_epoch(c, "a refit on nccl failed");
}

/* RETRY: the attempt that ended (was) is noted; the next one is planned
 * in wait_ms with the members of then.  Figures are the last attempt's. */
static void
note_retry(refit_rec_t *r, const refit_fsm_t *was, uint64_t wait_ms)
{
	const char *why = r->failure ? r->failure : "";

	r->attempts = xreallocarray(r->attempts, r->nattempts + 1, sizeof(char *));
	r->attempts[r->nattempts++] = xstrdup(why);
	log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): attempt %u failed: %s; "
		 "retrying in %" PRIu64 " ms", r->id, r->model, r->version, was->attempt, why,
		 wait_ms);
	r->retry_at_ms = coord_now_ms() + wait_ms;
	coord_slices_free(r);
	r->bytes = r->comm_us = 0;
	r->nstages = 0;
	memset(r->stage_us, 0, sizeof(r->stage_us));
	memset(r->stage_bytes, 0, sizeof(r->stage_bytes));
}

/* END: a final state; a committed refit moves the model's installed version. */
static void
note_end(coord_t *c, refit_rec_t *r)
{
	r->retry_at_ms = 0;
	r->finished_ms = coord_now_ms();
	coord_slices_free(r);
	if (r->fsm.state == REFIT_FSM_COMMITTED) {
		model_t *m = coord_find_model(c, r->model);

		free(r->failure);   /* an earlier attempt's failure is in attempts */
		r->failure = NULL;
		if (m != NULL && r->only == NULL && r->version > m->installed_version)
			m->installed_version = r->version;
	}
	log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %s%s%s", r->id, r->model,
		 r->version, public_name(r), r->failure ? ": " : "",
		 r->failure ? r->failure : "");
}

static void
do_action(coord_t *c, refit_rec_t *r, const refit_fsm_t *was, const refit_fsm_action_t *a,
	  const char *msg)
{
	switch (a->kind) {
	case REFIT_FSM_ACT_KEEP_CAUSE:
		free(r->failure);
		r->failure = xstrdup(msg ? msg : "failed");
		break;
	case REFIT_FSM_ACT_CANCEL_CALLS:
		rpc_async_cancel(c->rpc, r->id);  /* answers no longer wanted */
		break;
	case REFIT_FSM_ACT_RETRY:
		note_retry(r, was, a->wait_ms);
		break;
	case REFIT_FSM_ACT_WAIT:
		r->retry_at_ms = coord_now_ms() + a->wait_ms;
		break;
	case REFIT_FSM_ACT_END:
		note_end(c, r);
		break;
	case REFIT_FSM_ACT_NEW_EPOCH:
		nccl_failed_epoch(c);
		break;
	case REFIT_FSM_ACT_PLAN:
		plan_refit(c, r);
		break;
	case REFIT_FSM_ACT_ASK_NCCL_ID:
		ask_nccl_id(c, r);
		break;
	case REFIT_FSM_ACT_SEND_PREPARE:
		send_prepare(c, r);
		break;
	case REFIT_FSM_ACT_SEND_RUN:
		send_run(c, r);
		break;
	case REFIT_FSM_ACT_SEND_COMMIT:
	case REFIT_FSM_ACT_SEND_PUBLISH:
		send_install(c, r);
		break;
	case REFIT_FSM_ACT_ABORT_NODES:
		abort_on_nodes(c, r, was->attempt);
		break;
	default:
		log_warnx("coordinator: refit %" PRIu64 ": unknown action %d", r->id,
			  (int)a->kind);
		break;
	}
}

/* After the bookkeeping: metrics follow every change of state (p: the plan,
 * when one was just taken); the state file every change clients can see. */
static void
settle(coord_t *c, refit_rec_t *r, const refit_fsm_t *was, const plan_t *p)
{
	if (was->state == r->fsm.state && p == NULL)
		return;
	coord_metrics_refit(c, r, p);
	if (refit_fsm_public(was->state) != refit_fsm_public(r->fsm.state))
		coord_save(c);
}

/* A new round of node calls (or none): answers of the last one are stale. */
static bool
new_round(refit_fsm_state_t from, refit_fsm_state_t to)
{
	const char *a = refit_fsm_info(from)->call, *b = refit_fsm_info(to)->call;

	return from != to && (b == NULL || a == NULL || strcmp(a, b) != 0);
}

/*
 * Feed ev to r's machine and carry out what it says (msg: the event's
 * failure message, for KEEP_CAUSE; p: the plan just taken).  An event the
 * state does not expect is a bug: logged, nothing changes.
 */
static void
refit_event(coord_t *c, refit_rec_t *r, const refit_fsm_event_t *ev, const char *msg,
	    const plan_t *p)
{
	refit_fsm_t was = r->fsm;
	refit_fsm_out_t out;
	refit_err_t err;
	bool settled = false;

	refit_err_clear(&err);
	if (refit_fsm_step(&r->fsm, ev, &out, &err) != REFIT_OK) {
		log_warnx("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %s", r->id,
			  r->model, r->version, err.msg);
		return;
	}
	r->fsm = out.next;
	if (new_round(was.state, r->fsm.state))
		r->phase++;
	for (size_t i = 0; i < out.nact; i++) {
		if (!settled && out.act[i].kind >= REFIT_FSM_FIRST_CALL) {
			settle(c, r, &was, p);
			settled = true;
		}
		do_action(c, r, &was, &out.act[i], msg);
	}
	if (!settled)
		settle(c, r, &was, p);
}

static void
refit_on(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind)
{
	refit_event(c, r, &(refit_fsm_event_t){.kind = kind}, NULL, NULL);
}

/* An event with a failure message (cut on a character boundary). */
static void refit_eventf(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind,
			 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void
refit_eventf(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind, const char *fmt, ...)
{
	char msg[REFIT_ERR_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	utf8_vformat(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	refit_event(c, r, &(refit_fsm_event_t){.kind = kind}, msg, NULL);
}

void
coord_member_poisoned(coord_t *c, member_t *m, const char *why)
{
	(void)c;
	if (m == NULL || why == NULL || why[0] == '\0' || m->poisoned != NULL)
		return;
	m->poisoned = xstrdup(why);
	utf8_cut(m->poisoned);
	log_errorx("coordinator: node %s (member %" PRIu64 ") is poisoned: %s; refits that "
		   "need it fail at once", m->node_id, m->id, m->poisoned);
}

/* r needs poisoned member m: it fails now, and is not retried (m refuses
 * every refit until refitd restarts on it). */
static void
fail_poisoned(coord_t *c, refit_rec_t *r, const member_t *m)
{
	refit_fsm_event_t ev = {.kind = REFIT_FSM_EV_FAIL, .final = true};
	char msg[REFIT_ERR_MSG_MAX];

	snprintf(msg, sizeof(msg), "node %s is poisoned: restart refitd on it (or drain it); "
		 "it said: %s", m->node_id, m->poisoned);
	utf8_cut(msg);
	refit_event(c, r, &ev, msg, NULL);
}

/* ---- node calls ----------------------------------------------------------- */

static void on_node_done(void *arg, refit_status_t st, const char *msg,
			 ProtobufCMessage *resp);

/*
 * Call the state's node method (refit_fsm_info(state)->call) on every node
 * of r but those that acknowledged epoch skip_epoch (when not 0), then
 * count the round (CALLS_SENT); a call that cannot start fails r.
 */
static void
call_nodes(coord_t *c, refit_rec_t *r, ProtobufCMessage *req, uint64_t skip_epoch)
{
	const char *method = refit_fsm_info(r->fsm.state)->call;
	refit_fsm_event_t ev = {.kind = REFIT_FSM_EV_CALLS_SENT};
	refit_err_t err;

	for (size_t i = 0; i < r->nnodes; i++) {
		member_t *m = coord_find_member(c, r->nodes[i]);
		nctx_t *x;

		refit_err_clear(&err);
		if (m == NULL || m->rpc_ep[0] == '\0')
			return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "node %s: %s",
					    m ? m->node_id : "?", m ? "advertised no "
					    "rpc_endpoint" : "left the membership");
		if (skip_epoch != 0 && m->prepared_epoch == skip_epoch)
			continue;
		coord_slice_attach(r, m->id, req);  /* RunSlice: this node's slice */
		x = xcalloc(1, sizeof(*x));
		*x = (nctx_t){c, r->id, m->id, r->phase};
		if (rpc_async_call(c->rpc, r->id, m->rpc_ep, &refit__v1__node__descriptor,
				   method, req, NODE_CALL_MS, on_node_done, x, &err) != REFIT_OK) {
			free(x);
			return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "node %s: %s", m->node_id,
					    err.msg);
		}
		c->inflight++;
		ev.u.calls.n++;
	}
	refit_event(c, r, &ev, NULL, NULL);
}

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
	return r != NULL && r->phase == x->phase && !is_final(r) ? r : NULL;
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

/* A call of the round failed (NcclId, PrepareEpoch, Commit, Publish). */
static void
node_failed(coord_t *c, refit_rec_t *r, const char *node, const char *msg)
{
	char extra[128] = "";

	if (r->fsm.state == REFIT_FSM_PUBLISHING)
		/* every node had committed: the others publish (the decision
		 * was taken); this one did not get it (it died or is cut off) */
		snprintf(extra, sizeof(extra), " (every node had committed; the others "
			 "published version %" PRIu64 ")", r->version);
	else if (r->fsm.state == REFIT_FSM_COMMITTING)
		/* nothing was published anywhere: the others drop what they committed */
		snprintf(extra, sizeof(extra), " (nothing was published)");
	refit_eventf(c, r, REFIT_FSM_EV_NODE_FAILED, "node %s: %s: %s%s", node,
		     refit_fsm_info(r->fsm.state)->call, msg, extra);
}

static void slice_started(coord_t *c, refit_rec_t *r, size_t k, const char *node,
			  refit_status_t st, const char *msg);

static void
on_node_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;
	member_t *m;
	refit_rec_t *r = answer_of(x, &m);
	const char *node = m ? m->node_id : "?";

	(void)resp;
	if (r == NULL) {
		/* moved on */
	} else if (runs_slices(r)) {
		size_t k = node_index(r, x->member_id);

		if (k != SIZE_MAX)
			slice_started(c, r, k, node, st, msg);
	} else if (st != REFIT_OK) {
		node_failed(c, r, node, msg);
	} else {
		if (r->fsm.state == REFIT_FSM_PREPARING && m != NULL)
			m->prepared_epoch = r->epoch;
		refit_on(c, r, REFIT_FSM_EV_NODE_OK);
	}
	free(x);
	coord_maybe_free(c);
}

/* ---- slices ---------------------------------------------------------------- */

/* The RunSlice instances of r: the trainer first, then the instances in
 * the order the plan composed them (*n of them, in *iv; free_layouts). */
static Refit__V1__InstanceLayouts **
instance_layouts(const refit_rec_t *r, const model_t *m, Refit__V1__InstanceLayouts **iv,
		 size_t *n)
{
	Refit__V1__InstanceLayouts **ip = xcalloc(m->inst.n + 1, sizeof(*ip));

	*iv = xcalloc(m->inst.n + 1, sizeof(**iv));
	*n = 0;
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < m->inst.n; i++) {
			const instance_t *in = &m->inst.v[i];
			Refit__V1__InstanceLayouts *o = &(*iv)[*n];

			if ((pass == 0) != (in->role == REFIT__V1__ROLE__TRAIN))
				continue;
			if (in->role == REFIT__V1__ROLE__INFER &&
			    ((r->only && strcmp(r->only, in->name) != 0) || in->skip))
				continue;
			refit__v1__instance_layouts__init(o);
			o->instance = in->name;
			o->role = (Refit__V1__Role)in->role;
			o->tensors = conv_layouts_to_proto(&in->layouts);
			o->n_tensors = in->layouts.n;
			ip[(*n)++] = o;
		}
	return ip;
}

static void
free_layouts(Refit__V1__InstanceLayouts *iv, Refit__V1__InstanceLayouts **ip, size_t n)
{
	for (size_t i = 0; i < n; i++)
		conv_layouts_proto_free(iv[i].tensors, iv[i].n_tensors);
	free(iv);
	free(ip);
}

/* SEND_RUN: every node starts its slice (answered at the start). */
static void
send_run(coord_t *c, refit_rec_t *r)
{
	Refit__V1__RunSliceRequest rq = REFIT__V1__RUN_SLICE_REQUEST__INIT;
	model_t *m = coord_find_model(c, r->model);
	Refit__V1__InstanceLayouts *iv;
	plan_opts_t o;

	if (m == NULL)
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "model \"%s\" went away", r->model);
	free(r->nstate);
	free(r->ntime);
	r->nstate = xcalloc(r->nnodes + 1, sizeof(*r->nstate));
	r->ntime = xcalloc(r->nnodes + 1, sizeof(*r->ntime));
	r->nstarted = 0;
	r->running_after_ms = 0;
	r->run_deadline_ms = coord_now_ms() + SLICE_RUN_MS;
	coord_plan_opts(c, r->mode, &o);
	rq.instances = instance_layouts(r, m, &iv, &rq.n_instances);
	rq.refit_id = r->id;
	rq.epoch = r->epoch;
	rq.plan_digest = r->plan_digest;
	rq.model = r->model;
	rq.version = r->version;
	rq.verify = r->verify;
	rq.mode = (Refit__V1__Mode)r->mode;
	rq.chunk_bytes = o.chunk_bytes;
	rq.staging_bytes = o.staging_bytes;
	rq.corrupt_msg = r->corrupt;
	rq.nic_per_node = c->o.nic_per_node;
	rq.attempt = r->fsm.attempt;
	call_nodes(c, r, &rq.base, 0);
	coord_slices_free(r);  /* packed into the calls */
	free_layouts(iv, rq.instances, rq.n_instances);
}

/* SEND_COMMIT, SEND_PUBLISH: the two phases of the install.  Commit: every
 * node keeps its slice's result ready without showing it.  Publish, once
 * every node committed: the clients are shown it. */
static void
send_install(coord_t *c, refit_rec_t *r)
{
	Refit__V1__CommitRequest cq = REFIT__V1__COMMIT_REQUEST__INIT;
	Refit__V1__PublishRequest pq = REFIT__V1__PUBLISH_REQUEST__INIT;

	cq.refit_id = pq.refit_id = r->id;
	cq.epoch = pq.epoch = r->epoch;
	cq.model = pq.model = r->model;
	cq.version = pq.version = r->version;
	call_nodes(c, r, r->fsm.state == REFIT_FSM_PUBLISHING ? &pq.base : &cq.base, 0);
}

/*
 * Node k's slice ended (its SliceDone, or a RunSlice that failed): counted
 * once.  A failure makes the others stop; the refit fails once all have
 * reported, naming the likeliest cause (peers of a failed node only see it
 * disappear).  When every slice succeeded, Commit follows.
 */
static void
slice_result(coord_t *c, refit_rec_t *r, size_t k, const char *node, refit_status_t st,
	     const char *msg, const Refit__V1__RunSliceResponse *rs, bool poisoned)
{
	refit_fsm_event_t ev = {.kind = REFIT_FSM_EV_SLICE_OK};
	char buf[REFIT_ERR_MSG_MAX];

	r->nstate[k] |= NODE_REPORTED;
	if (st != REFIT_OK) {
		/* a poisoned node: the cause, and no retry (it refuses them all) */
		if (poisoned)
			snprintf(buf, sizeof(buf), "node %s: RunSlice: %s; node %s is poisoned: "
				 "restart refitd on it", node, msg, node);
		else
			snprintf(buf, sizeof(buf), "node %s: RunSlice: %s", node, msg);
		utf8_cut(buf);
		ev.kind = REFIT_FSM_EV_SLICE_FAILED;
		ev.final = poisoned;
		ev.u.slice.symptom = !poisoned && coord_rules_is_symptom(msg);
		return refit_event(c, r, &ev, buf, NULL);
	}
	if (rs != NULL) {
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
	refit_event(c, r, &ev, NULL, NULL);
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
			slice_result(c, r, k, node, st, msg, NULL, false);
		return;
	}
	mark_started(r, k);
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
	coord_member_poisoned(c, m, rq->poisoned);
	k = node_index(r, rq->member_id);
	if (!runs_slices(r) || r->epoch != rq->epoch || r->fsm.attempt != rq->attempt ||
	    r->nstate == NULL) {
		log_debug(LOG_SUB_COORD, "coordinator: refit %" PRIu64 ": SliceDone from %s for "
			  "epoch %" PRIu64 " attempt %u: the refit has moved on (%s, attempt %u)",
			  r->id, node, rq->epoch, rq->attempt, refit_fsm_state_name(r->fsm.state),
			  r->fsm.attempt);
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
	r->ntime[k].decode_us = rq->slice_micros;
	r->ntime[k].slice_xfers = rq->slice_xfers;
	r->ntime[k].slice_us = rq->stats ? rq->stats->micros : 0;
	slice_result(c, r, k, node, rq->code == 0 ? REFIT_OK : rpc_status_from_grpc(rq->code),
		     rq->message && rq->message[0] ? rq->message : "failed", rq->stats,
		     rq->poisoned && rq->poisoned[0]);
	rpc_call_reply(call, &rsp.base);  /* frees rq */
}

/* ---- preparing ------------------------------------------------------------- */

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

		if (o != r && o->fsm.nccl && refit_fsm_is(o->fsm.state, REFIT_FSM_HOLDS_EPOCH))
			return true;
	}
	return false;
}

/* The members' transports: whether any uses nccl, one that does not, and
 * the member holding the lowest rank. */
static void
scan_members(coord_t *c, bool *nccl, const member_t **other, const member_t **low)
{
	int32_t lowr = INT32_MAX;

	*nccl = false;
	*other = *low = NULL;
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];

		if (strcmp(m->transport, "nccl") == 0)
			*nccl = true;
		else
			*other = m;
		for (size_t k = 0; k < m->nranks; k++)
			if (m->ranks[k].rank < lowr) {
				lowr = m->ranks[k].rank;
				*low = m;
			}
	}
}

static void
on_nccl_id(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;
	member_t *m;
	refit_rec_t *r = answer_of(x, &m);
	const Refit__V1__NcclIdResponse *rs = (const void *)resp;
	char bad[64];

	if (r == NULL) {
		/* moved on */
	} else if (st != REFIT_OK) {
		node_failed(c, r, m ? m->node_id : "?", msg);
	} else if (rs->nccl_unique_id.len == 0 || rs->nccl_unique_id.len > sizeof(r->nccl_id)) {
		snprintf(bad, sizeof(bad), "an id of %zu bytes", rs->nccl_unique_id.len);
		node_failed(c, r, m ? m->node_id : "?", bad);
	} else {
		memcpy(r->nccl_id, rs->nccl_unique_id.data, rs->nccl_unique_id.len);
		r->nccl_id_len = rs->nccl_unique_id.len;
		nccl_remember(c, r);
		refit_on(c, r, REFIT_FSM_EV_NODE_OK);
	}
	free(x);
	coord_maybe_free(c);
}

/* ASK_NCCL_ID: the node of the lowest rank makes the epoch's unique id. */
static void
ask_nccl_id(coord_t *c, refit_rec_t *r)
{
	Refit__V1__NcclIdRequest rq = REFIT__V1__NCCL_ID_REQUEST__INIT;
	const member_t *other, *low;
	bool nccl;
	nctx_t *x;
	refit_err_t err;

	scan_members(c, &nccl, &other, &low);
	if (low == NULL)
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "NcclId: no member holds a rank");
	refit_err_clear(&err);
	x = xcalloc(1, sizeof(*x));
	*x = (nctx_t){c, r->id, low->id, r->phase};
	rq.epoch = r->epoch;
	if (rpc_async_call(c->rpc, r->id, low->rpc_ep, &refit__v1__node__descriptor, "NcclId",
			   &rq.base, NODE_CALL_MS, on_nccl_id, x, &err) != REFIT_OK) {
		free(x);
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "node %s: %s", low->node_id,
				    err.msg);
	}
	c->inflight++;
}

/*
 * With the plan in hand: the nodes taking part, then PLANNED.  On the nccl
 * transport every member takes part (the communicators span the whole
 * epoch) and the unique id comes first from the node of the lowest rank;
 * nccl refits run one at a time, cluster-wide, so that every node posts
 * its NCCL groups in the same order (docs/dataplane.md): the others wait
 * (queued) and are planned again at a tick after it ends.
 */
static void
prepare(coord_t *c, refit_rec_t *r, const plan_t *p)
{
	refit_fsm_event_t ev = {.kind = REFIT_FSM_EV_PLANNED};
	const member_t *other, *low;
	bool nccl;

	scan_members(c, &nccl, &other, &low);
	if (nccl && other == NULL && nccl_busy(c, r)) {
		ev.u.planned.wait_turn = true;
		return refit_event(c, r, &ev, NULL, NULL);
	}
	memcpy(r->plan_digest, p->digest_hex, sizeof(r->plan_digest));
	involved_nodes(c, p, coord_find_model(c, r->model), r);
	r->epoch = c->epoch;
	if (nccl && other != NULL)
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "mixed transports: node %s uses "
				    "%s while others use nccl; every node of an epoch needs the "
				    "same", other->node_id, other->transport);
	ev.u.planned.nccl = nccl;
	ev.u.planned.no_nodes = r->nnodes == 0;  /* nothing moves */
	if (nccl && r->nnodes > 0) {
		free(r->nodes);
		r->nodes = xcalloc(c->members.n + 1, sizeof(*r->nodes));
		for (size_t i = 0; i < c->members.n; i++)
			r->nodes[i] = c->members.v[i].id;
		r->nnodes = c->members.n;
	}
	/* a node that refuses every refit: fail now, not at its RunSlice (on
	 * nccl every member's ranks form the communicators: all are needed) */
	for (size_t i = 0; i < r->nnodes; i++) {
		const member_t *m = coord_find_member(c, r->nodes[i]);

		if (m != NULL && m->poisoned != NULL)
			return fail_poisoned(c, r, m);
	}
	if (nccl && r->nnodes > 0)
		ev.u.planned.need_id = nccl_need_id(c, r);
	coord_slices_make(c, r, p, nccl);
	refit_event(c, r, &ev, NULL, p);
}

/* The current members as PrepareEpoch lists them, in *mv (members_msg_free). */
static Refit__V1__Member **
members_msg(coord_t *c, Refit__V1__Member **mv)
{
	Refit__V1__Member **mp = xcalloc(c->members.n + 1, sizeof(*mp));

	*mv = xcalloc(c->members.n + 1, sizeof(**mv));
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];
		Refit__V1__Member *o = &(*mv)[i];

		refit__v1__member__init(o);
		o->member_id = m->id;
		o->node_id = m->node_id;
		o->host = m->host;
		o->rpc_endpoint = m->rpc_ep;
		o->data_endpoint = m->data_ep;
		o->transport = m->transport;
		o->ranks = xcalloc(m->nranks + 1, sizeof(*o->ranks));
		o->n_ranks = m->nranks;
		for (size_t k = 0; k < m->nranks; k++) {
			o->ranks[k] = xmalloc(sizeof(*o->ranks[k]));
			refit__v1__rank_info__init(o->ranks[k]);
			o->ranks[k]->rank = m->ranks[k].rank;
			o->ranks[k]->domain = m->ranks[k].domain;
		}
		mp[i] = o;
	}
	return mp;
}

static void
members_msg_free(Refit__V1__Member *mv, Refit__V1__Member **mp, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < mv[i].n_ranks; k++)
			free(mv[i].ranks[k]);
		free(mv[i].ranks);
	}
	free(mv);
	free(mp);
}

/* SEND_PREPARE: every node taking part is told the epoch, its members,
 * token and (nccl) unique id. */
static void
send_prepare(coord_t *c, refit_rec_t *r)
{
	Refit__V1__PrepareEpochRequest rq = REFIT__V1__PREPARE_EPOCH_REQUEST__INIT;
	Refit__V1__Member *mv;
	size_t n = c->members.n;

	/* one token per epoch: refits of several models share the epoch */
	if (c->token_epoch != r->epoch) {
		if (getrandom(c->token, sizeof(c->token), 0) != (ssize_t)sizeof(c->token))
			log_warn("coordinator: getrandom");
		c->token_epoch = r->epoch;
	}
	rq.epoch = r->epoch;
	rq.token.data = c->token;
	rq.token.len = sizeof(c->token);
	if (r->fsm.nccl && r->nccl_id_len) {
		rq.nccl_unique_id.data = r->nccl_id;
		rq.nccl_unique_id.len = r->nccl_id_len;
	}
	rq.members = members_msg(c, &mv);
	rq.n_members = n;
	/* a node that acknowledged this epoch already (for another refit)
	 * is not told again: same members, same token, same unique id */
	call_nodes(c, r, &rq.base, r->epoch);
	members_msg_free(mv, rq.members, n);
}

/* ---- planning -------------------------------------------------------------- */

static void
on_refit_planned(planjob_t *j)
{
	coord_t *c = j->c;
	refit_rec_t *r = find_refit(c, j->refit_id);
	model_t *m = coord_find_model(c, j->model);
	char key[SHA256_HEX_LEN];

	if (r == NULL || r->fsm.state != REFIT_FSM_PLANNING)
		return; /* aborted while planning */
	if (j->rc != REFIT_OK)
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "plan: %s", j->err.msg);
	if (m == NULL)
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "model \"%s\" went away while "
				    "planning", j->model);
	coord_plan_key(c, m, j->only, &j->opts, key);
	if (strcmp(key, j->key) != 0)
		return refit_on(c, r, REFIT_FSM_EV_PLAN_STALE); /* layouts or members changed */
	r->plan_us = j->plan_us;
	r->plan_cached = false;
	if (j->only == NULL)
		return prepare(c, r, coord_plan_keep(c, j));
	/* a catch-up plan is used once: keep it with the refit until prepared */
	prepare(c, r, &j->plan);
}

/*
 * Which inference instances this refit leaves out: those not healthy now
 * (the member that registered them left, or a rank of theirs has no
 * member).  A strict model fails instead; so does one left with none.
 * False when the refit failed here.
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
		int32_t lost;
		size_t t;

		in->skip = false;
		if (in->role != REFIT__V1__ROLE__INFER ||
		    (r->only && strcmp(r->only, in->name) != 0))
			continue;
		lost = coord_rules_unheld_rank(c->members.v, c->members.n, &in->layouts, &t);
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
		refit_eventf(c, r, REFIT_FSM_EV_FAIL, "%s: %s", healthy == 0 ?
			     "no healthy inference instance" : "instances not healthy (strict "
			     "policy)", sb.s);
		strbuf_fini(&sb);
		return false;
	}
	if (r->nskipped)
		log_warnx("coordinator: refit %" PRIu64 " (%s v%" PRIu64 ") skips %s", r->id,
			  r->model, r->version, sb.s);
	strbuf_fini(&sb);
	return true;
}

/* PLAN: the instances taking part, then the plan: the model's last one when
 * its inputs are unchanged, else one built off the loop. */
static void
plan_refit(coord_t *c, refit_rec_t *r)
{
	model_t *m = coord_find_model(c, r->model);
	plan_cache_t *pc;
	plan_opts_t o;
	refit_err_t err;
	char key[SHA256_HEX_LEN];

	if (m == NULL)
		return refit_eventf(c, r, REFIT_FSM_EV_FAIL, "model \"%s\" went away", r->model);
	if (!choose_instances(c, m, r))
		return;
	pc = r->only ? NULL : coord_plan_cached(c, m->name);
	coord_plan_opts(c, r->mode, &o);
	coord_plan_key(c, m, r->only, &o, key);
	if (pc != NULL && strcmp(pc->key, key) == 0) {
		r->plan_us = 0;
		r->plan_cached = true;
		return prepare(c, r, &pc->plan);
	}
	refit_err_clear(&err);
	if (coord_plan_async(c, m, r->only, &o, false, on_refit_planned, r->id, NULL, &err) !=
	    REFIT_OK)
		refit_eventf(c, r, REFIT_FSM_EV_FAIL, "plan: %s", err.msg);
}

/* A new epoch: refits in flight of the old one fail (coord_internal.h). */
void
coord_bump_epoch(coord_t *c, const char *why)
{
	c->epoch++;
	log_info("coordinator: epoch %" PRIu64 " (%s)", c->epoch, why);
	coord_refits_on_epoch(c, c->epoch - 1, why);
}

size_t
coord_refits_abort_member(coord_t *c, uint64_t id, const char *why, uint64_t *ids,
			  size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];
		bool uses = refit_fsm_public(r->fsm.state) == REFIT__V1__REFIT_STATE__PENDING;

		for (size_t k = 0; k < r->nnodes && !uses; k++)
			uses = r->nodes[k] == id;
		if (is_final(r) || !uses)
			continue;
		refit_eventf(c, r, REFIT_FSM_EV_ABORT, "aborted: %s", why);
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

		/* the change names the node (a lease that expired: the node that
		 * died under the refit); the surviving nodes stop now, not at
		 * their slice deadline */
		if (refit_fsm_is(r->fsm.state, REFIT_FSM_HOLDS_EPOCH) && r->epoch == old_epoch)
			refit_eventf(c, r, REFIT_FSM_EV_EPOCH_CHANGED, "membership changed "
				     "(epoch %" PRIu64 " -> %" PRIu64 ": %s) during the refit",
				     old_epoch, c->epoch, why);
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
	o->state = (Refit__V1__RefitState)refit_fsm_public(r->fsm.state);
	o->plan_digest = (char *)r->plan_digest;
	o->created_unix_ms = r->created_ms;
	o->finished_unix_ms = r->finished_ms;
	o->bytes = r->bytes;
	o->failure = r->failure ? r->failure : "";
	o->idempotency_key = r->key ? r->key : "";
	o->attempt = r->fsm.attempt;
	o->attempts = r->attempts;
	o->n_attempts = r->nattempts;
	o->instance = r->only ? r->only : "";
	o->skipped = r->skipped;
	o->n_skipped = r->nskipped;
	o->comm_micros = r->comm_us;
	o->running_after_ms = r->running_after_ms;
	o->plan_micros = r->plan_us;
	o->plan_cached = r->plan_cached;
	o->plan_xfers = r->plan_xfers;
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
		(*nv)[k].decode_micros = r->ntime[k].decode_us;
		(*nv)[k].slice_xfers = r->ntime[k].slice_xfers;
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
		if (is_final(c->refits.v[i])) {
			coord_refit_free(c->refits.v[i]);
			memmove(&c->refits.v[i], &c->refits.v[i + 1],
				(c->refits.n - i - 1) * sizeof(*c->refits.v));
			c->refits.n--;
		} else {
			i++;
		}
	}
}

/* A new refit of m to its latest version, PLANNING, added to c's records
 * (only: a catch-up of that instance).  The caller persists and plans it. */
static refit_rec_t *
new_refit(coord_t *c, const model_t *m, const char *only)
{
	refit_rec_t *r = xcalloc(1, sizeof(*r));

	r->id = ++c->next_refit;
	r->model = xstrdup(m->name);
	r->only = only ? xstrdup(only) : NULL;
	r->version = m->latest_version;
	r->mode = REFIT__V1__MODE__RESHARD;
	r->created_ms = coord_now_ms();
	refit_fsm_init(&r->fsm, m->retries, m->retry_backoff_ms);
	VEC_PUSH(&c->refits, r);
	return r;
}

/* Why m cannot take the trigger rq now (NULL: it can). */
static refit_status_t
trigger_check(coord_t *c, const model_t *m, const Refit__V1__TriggerRefitRequest *rq,
	      refit_err_t *err)
{
	if (m->latest_version == 0)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "TriggerRefit \"%s\": no weights "
				     "are ready yet (no WeightsReady)", m->name);
	if (rq->version > m->latest_version)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "TriggerRefit \"%s\": version %"
				     PRIu64 " is newer than the latest ready %" PRIu64, m->name,
				     rq->version, m->latest_version);
	if (rq->mode != REFIT__V1__MODE__RESHARD && rq->mode != REFIT__V1__MODE__BROADCAST)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "TriggerRefit: unknown mode %d",
				     (int)rq->mode);
	for (size_t i = 0; i < c->refits.n; i++)
		if (!is_final(c->refits.v[i]) && strcmp(c->refits.v[i]->model, m->name) == 0)
			return refit_err_set(err, REFIT_ERR_EXISTS, "TriggerRefit \"%s\": refit %"
					     PRIu64 " is still %s", m->name, c->refits.v[i]->id,
					     public_name(c->refits.v[i]));
	return REFIT_OK;
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
	refit_err_t err;

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
	refit_err_clear(&err);
	if (trigger_check(c, m, rq, &err) != REFIT_OK)
		return rpc_call_fail(call, err.status, "%s", err.msg);
	r = new_refit(c, m, NULL);
	r->key = key ? xstrdup(key) : NULL;
	r->version = rq->version ? rq->version : m->latest_version;
	r->mode = (int)rq->mode;
	r->verify = rq->verify;
	r->corrupt = rq->test_corrupt_msg;
	if (coord_save_durable(c, "TriggerRefit", &err) != REFIT_OK) {
		c->refits.n--;
		c->next_refit--;
		coord_refit_free(r);
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	trim_records(c);
	rsp.refit_id = r->id;
	rpc_call_reply(call, &rsp.base);
	plan_refit(c, r);
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

	if (r == NULL || r->phase != x->phase || !runs_slices(r) || r->nstate == NULL ||
	    m == NULL)
		return;
	k = node_index(r, x->member_id);
	if (k == SIZE_MAX || (r->nstate[k] & NODE_REPORTED))
		return;
	snprintf(buf, sizeof(buf), "unreachable during its slice (%s)", msg);
	slice_result(c, r, k, m->node_id, REFIT_ERR_UNAVAILABLE, buf, NULL, false);
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

/* ABORT_NODES: tell every node of r that attempt was aborted (best effort). */
static void
abort_on_nodes(coord_t *c, refit_rec_t *r, uint32_t attempt)
{
	Refit__V1__AbortRequest ab = REFIT__V1__ABORT_REQUEST__INIT;

	ab.refit_id = r->id;
	ab.epoch = r->epoch;
	ab.reason = r->failure;
	ab.attempt = attempt;
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
	if (is_final(r))
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "AbortRefit: refit %" PRIu64
				     " is already %s", r->id, public_name(r));
	refit_eventf(c, r, REFIT_FSM_EV_ABORT, "aborted: %s",
		     rq->reason && rq->reason[0] ? rq->reason : "by request");
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

/* ---- the timer --------------------------------------------------------------- */

/* A refit of model in flight (one that waits is not in the way). */
static bool
model_busy(coord_t *c, const char *model)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		const refit_rec_t *r = c->refits.v[i];

		if (!is_final(r) && !refit_fsm_is(r->fsm.state, REFIT_FSM_WAITS) &&
		    strcmp(r->model, model) == 0)
			return true;
	}
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
	refit_eventf(c, r, REFIT_FSM_EV_DEADLINE, "node %s never reported its slice "
		     "(SliceDone) within %d ms; %u of %zu did not", m ? m->node_id : "?",
		     SLICE_RUN_MS, r->fsm.pending, r->nnodes);
}

/* Catch-up: an instance that registered after a version was ready gets it.
 * True when one started (the vectors may have moved). */
static bool
catch_up(coord_t *c, uint64_t now)
{
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
			r = new_refit(c, m, in->name);
			trim_records(c);
			log_info("coordinator: refit %" PRIu64 ": catch-up of instance \"%s\" of "
				 "model \"%s\" to version %" PRIu64, r->id, in->name, m->name,
				 r->version);
			coord_save(c);
			plan_refit(c, r);
			return true;
		}
	}
	return false;
}

void
coord_refits_tick(coord_t *c)
{
	uint64_t now = coord_now_ms();

	if (c->closing)
		return;
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (runs_slices(r) && r->nstate != NULL && now > r->run_deadline_ms)
			overdue(c, r);
	}
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (refit_fsm_is(r->fsm.state, REFIT_FSM_WAITS) && now >= r->retry_at_ms)
			refit_on(c, r, REFIT_FSM_EV_DUE);
	}
	catch_up(c, now);
}
