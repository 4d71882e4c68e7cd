/*
 * coord_refit.c - the driver of the refit state machine (refit_fsm.h): the
 * events fed to it, the actions carried out, and the node calls those make
 * (NcclId, PrepareEpoch, RunSlice, Commit, Publish, Abort) with their
 * answers.  The Coordinator's refit methods and the timer are in
 * coord_refit_api.c; which instances and nodes take part and the
 * messages they are sent (RunSlice's request) in coord_refit_nodes.c; what
 * the driver notes in a record without an event or a call (retries, ends,
 * blame, the slices' deadline, what a slice reported) in
 * coord_refit_notes.c.  The node calls and the machine feed each other
 * (an action calls nodes, an answer is an event), so they share this file.
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
 * own slice deadline (RunSliceRequest.timeout_ms,
 * coord_refit_slice_deadline_ms), an Abort it does not answer while the
 * refit fails, or at last by SLICE_RUN_MS (coord_refit_api.c).  When the slices failed with symptoms
 * only, every node's report together names the broken data link
 * (coord_refit_name_link, coord_blame.c).
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

#define NODE_CALL_MS 30000
#define ABORT_CALL_MS 5000

/* ---- the driver ------------------------------------------------------------ */

static void ask_nccl_id(coord_t *c, refit_rec_t *r);
static void send_prepare(coord_t *c, refit_rec_t *r);
static void send_run(coord_t *c, refit_rec_t *r);
static void send_install(coord_t *c, refit_rec_t *r);
static void abort_on_nodes(coord_t *c, refit_rec_t *r, uint32_t attempt);

/*
 * nccl: a failure or an abort may have aborted the communicators on some
 * nodes only; a new epoch with a new unique id makes every node build fresh
 * ones for the next refit (a node never reuses aborted ones).  At most one
 * nccl refit holds an epoch at a time (coord_nccl_busy), so the refits this new
 * epoch fails are never nccl ones asking for another.
 */
static void
nccl_failed_epoch(coord_t *c)
{
	c->nccl_ok = false;
	c->nccl_epoch = 0;
	coord_bump_epoch(c, "a refit on nccl failed");
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
		coord_refit_instances_end(c, r, false);  /* in place: written? */
		coord_refit_note_retry(r, was, a->wait_ms);
		break;
	case REFIT_FSM_ACT_WAIT:
		r->retry_at_ms = coord_now_ms() + a->wait_ms;
		break;
	case REFIT_FSM_ACT_END:
		coord_refit_note_end(c, r);
		break;
	case REFIT_FSM_ACT_NEW_EPOCH:
		nccl_failed_epoch(c);
		break;
	case REFIT_FSM_ACT_PLAN:
		coord_refit_plan(c, r);
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
	bool settled = false, blame;

	refit_err_clear(&err);
	if (refit_fsm_step(&r->fsm, ev, &out, &err) != REFIT_OK) {
		log_warnx("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %s", r->id,
			  r->model, r->version, err.msg);
		return;
	}
	r->fsm = out.next;
	if (coord_refit_new_round(was.state, r->fsm.state))
		r->phase++;
	blame = coord_refit_ends_on_symptoms(&was, ev) && !coord_refit_runs_slices(r);
	for (size_t i = 0; i < out.nact; i++) {
		if (!settled && out.act[i].kind >= REFIT_FSM_FIRST_CALL) {
			coord_refit_settle(c, r, &was, p);
			settled = true;
		}
		if (blame && (out.act[i].kind == REFIT_FSM_ACT_RETRY ||
			      out.act[i].kind == REFIT_FSM_ACT_END)) {
			coord_refit_name_link(c, r);  /* before the failure is logged, noted, counted */
			blame = false;
		}
		do_action(c, r, &was, &out.act[i], msg);
	}
	if (!settled)
		coord_refit_settle(c, r, &was, p);
}

void
coord_refit_on(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind)
{
	refit_event(c, r, &(refit_fsm_event_t){.kind = kind}, NULL, NULL);
}

/* An event with a failure message (cut on a character boundary). */

void
coord_refit_eventf(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind, const char *fmt, ...)
{
	char msg[REFIT_ERR_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	utf8_vformat(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	refit_event(c, r, &(refit_fsm_event_t){.kind = kind}, msg, NULL);
}

/* r needs poisoned member m: it fails now (kind FAIL; EPOCH_CHANGED: m left
 * during it), not retried (m refuses every refit until refitd restarts). */
void
coord_refit_fail_poisoned(coord_t *c, refit_rec_t *r, const member_t *m,
			  refit_fsm_event_kind_t kind)
{
	refit_fsm_event_t ev = {.kind = kind, .final = true};
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
void
coord_call_nodes(coord_t *c, refit_rec_t *r, ProtobufCMessage *req, uint64_t skip_epoch)
{
	const char *method = refit_fsm_info(r->fsm.state)->call;
	refit_fsm_event_t ev = {.kind = REFIT_FSM_EV_CALLS_SENT};
	refit_err_t err;

	for (size_t i = 0; i < r->nnodes; i++) {
		member_t *m = coord_find_member(c, r->nodes[i]);
		nctx_t *x;

		refit_err_clear(&err);
		if (m == NULL || m->rpc_ep[0] == '\0')
			return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "node %s: %s",
						  m ? m->node_id : "?", m ? "advertised no "
						  "rpc_endpoint" : "left the membership");
		if (skip_epoch != 0 && m->prepared_epoch == skip_epoch)
			continue;
		coord_slice_attach(r, m->id, req);  /* RunSlice: this node's slice */
		coord_prepare_attach(m, req);       /* PrepareEpoch: its own token */
		x = xcalloc(1, sizeof(*x));
		*x = (nctx_t){c, r->id, m->id, r->phase};
		if (rpc_async_call(c->rpc, r->id, m->rpc_ep, &refit__v1__node__descriptor,
				   method, req, NODE_CALL_MS, on_node_done, x, &err) != REFIT_OK) {
			free(x);
			return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "node %s: %s",
						  m->node_id, err.msg);
		}
		c->inflight++;
		ev.u.calls.n++;
	}
	refit_event(c, r, &ev, NULL, NULL);
}

/* A call of the round failed (NcclId, PrepareEpoch, Commit, Publish). */
static void
node_failed(coord_t *c, refit_rec_t *r, const char *node, const char *msg)
{
	char extra[128] = "";

	if (r->fsm.state == REFIT_FSM_PUBLISHING) {
		/* every node had committed: the others publish (the decision
		 * was taken); this one did not get it: resent (coord_publish.c) */
		snprintf(extra, sizeof(extra), " (every node had committed; the others "
			 "published version %" PRIu64 "; resent to this one)", r->version);
		coord_publish_failed(c, r->id, node);
	}
	else if (r->fsm.state == REFIT_FSM_COMMITTING)
		/* nothing was published anywhere: the others drop what they committed */
		snprintf(extra, sizeof(extra), " (nothing was published)");
	coord_refit_eventf(c, r, REFIT_FSM_EV_NODE_FAILED, "node %s: %s: %s%s", node,
			   refit_fsm_info(r->fsm.state)->call, msg, extra);
}

static void slice_started(coord_t *c, refit_rec_t *r, size_t k, const char *node,
			  refit_status_t st, const char *msg);
static void slice_result(coord_t *c, refit_rec_t *r, size_t k, const char *node,
			 refit_status_t st, const char *msg,
			 const Refit__V1__RunSliceResponse *rs, bool poisoned, bool symptom);

static void
on_node_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;
	member_t *m;
	refit_rec_t *r = coord_refit_answer_of(x, &m);
	const char *node = m ? m->node_id : "?";

	(void)resp;
	/* a decided Publish acknowledged, even after the refit moved on */
	if (st == REFIT_OK && m != NULL)
		coord_publish_acked(c, x->refit_id, m->node_id);
	if (r == NULL) {
		/* moved on */
	} else if (coord_refit_runs_slices(r)) {
		size_t k = coord_refit_node_index(r, x->member_id);

		if (k != SIZE_MAX)
			slice_started(c, r, k, node, st, msg);
	} else if (st != REFIT_OK) {
		node_failed(c, r, node, msg);
	} else {
		if (r->fsm.state == REFIT_FSM_PREPARING && m != NULL)
			m->prepared_epoch = r->epoch;
		coord_refit_on(c, r, REFIT_FSM_EV_NODE_OK);
	}
	free(x);
	coord_maybe_free(c);
}

/* ---- slices ---------------------------------------------------------------- */

/* SEND_RUN: every node starts its slice (answered at the start). */
static void
send_run(coord_t *c, refit_rec_t *r)
{
	Refit__V1__RunSliceRequest rq = REFIT__V1__RUN_SLICE_REQUEST__INIT;
	model_t *m = coord_find_model(c, r->model);
	Refit__V1__InstanceLayouts *iv;
	plan_opts_t o;

	if (m == NULL)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "model \"%s\" went away",
					  r->model);
	free(r->nstate);
	free(r->ntime);
	r->nstate = xcalloc(r->nnodes + 1, sizeof(*r->nstate));
	r->ntime = xcalloc(r->nnodes + 1, sizeof(*r->ntime));
	r->nstarted = 0;
	r->run_sent = true;   /* in place: its instances may be written from now */
	r->running_after_ms = 0;
	r->run_deadline_ms = coord_now_ms() + SLICE_RUN_MS;
	coord_plan_opts(c, r->mode, &o);
	coord_run_request(c, r, m, &o, &rq, &iv);
	r->slice_ms = coord_refit_slice_deadline_ms(c, r);
	rq.timeout_ms = (uint32_t)r->slice_ms;
	coord_delta_offer(c, r, m, &rq);
	coord_call_nodes(c, r, &rq.base, 0);
	coord_delta_offer_free(&rq);
	coord_slices_free(r);  /* packed into the calls */
	coord_free_layouts(iv, rq.instances, rq.n_instances);
}

/* SEND_COMMIT, SEND_PUBLISH: the two phases of the install.  Commit: every
 * node keeps its slice's result ready without showing it.  Publish, once
 * every node committed: the clients are shown it. */
static void
send_install(coord_t *c, refit_rec_t *r)
{
	Refit__V1__CommitRequest cq = REFIT__V1__COMMIT_REQUEST__INIT;
	Refit__V1__PublishRequest pq = REFIT__V1__PUBLISH_REQUEST__INIT;
	refit_err_t err;

	cq.refit_id = pq.refit_id = r->id;
	cq.epoch = pq.epoch = r->epoch;
	cq.model = pq.model = r->model;
	cq.version = pq.version = r->version;
	refit_err_clear(&err);
	/* the decision is durable before any Publish leaves */
	if (r->fsm.state == REFIT_FSM_PUBLISHING && coord_publish_decided(c, r, &err) != REFIT_OK)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "the decision to publish could "
					  "not be made durable, so nothing was published: %s",
					  err.msg);
	if (r->fsm.state == REFIT_FSM_PUBLISHING && coord_publish_held(c, r))
		return;  /* tests: test_hold_publish_ms (coord_refits_tick sends it) */
	coord_call_nodes(c, r, r->fsm.state == REFIT_FSM_PUBLISHING ? &pq.base : &cq.base, 0);
}

/*
 * Node k's slice ended (its SliceDone, or a RunSlice that failed): counted
 * once.  A failure makes the others stop; the refit fails once all have
 * reported, naming the likeliest cause (peers of a failed node only see it
 * disappear).  When every slice succeeded, Commit follows.
 */
void
coord_refit_slice_result(coord_t *c, refit_rec_t *r, size_t k, const char *node, refit_status_t st,
			 const char *msg, const Refit__V1__RunSliceResponse *rs, bool poisoned)
{
	slice_result(c, r, k, node, st, msg, rs, poisoned, false);
}

/* coord_refit_slice_result; symptom: the failure is one whatever it says. */
static void
slice_result(coord_t *c, refit_rec_t *r, size_t k, const char *node, refit_status_t st,
	     const char *msg, const Refit__V1__RunSliceResponse *rs, bool poisoned, bool symptom)
{
	refit_fsm_event_t ev = {.kind = REFIT_FSM_EV_SLICE_OK};
	char buf[REFIT_ERR_MSG_MAX];

	r->nstate[k] |= NODE_REPORTED;
	if (rs != NULL)
		coord_delta_evicted(c, r, k, rs);
	if (st != REFIT_OK)
		coord_refit_blame_keep(c, r, k, st, msg, rs);
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
		ev.u.slice.symptom = !poisoned && (symptom || coord_rules_is_symptom(msg));
		return refit_event(c, r, &ev, buf, NULL);
	}
	if (rs != NULL)
		coord_refit_note_slice(r, k, rs);
	refit_event(c, r, &ev, NULL, NULL);
}

/* RunSlice answered: the slice started (its end comes in SliceDone). */
static void
slice_started(coord_t *c, refit_rec_t *r, size_t k, const char *node, refit_status_t st,
	      const char *msg)
{
	if (st != REFIT_OK) {
		if (!(r->nstate[k] & NODE_REPORTED))
			coord_refit_slice_result(c, r, k, node, st, msg, NULL, false);
		return;
	}
	coord_refit_mark_started(r, k);
}

/* ---- preparing ------------------------------------------------------------- */

static void
on_nccl_id(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	nctx_t *x = arg;
	coord_t *c = x->c;
	member_t *m;
	refit_rec_t *r = coord_refit_answer_of(x, &m);
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
		coord_nccl_remember(c, r);
		coord_refit_on(c, r, REFIT_FSM_EV_NODE_OK);
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

	coord_scan_members(c, &nccl, &other, &low);
	if (low == NULL)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "NcclId: no member holds a "
					  "rank");
	refit_err_clear(&err);
	x = xcalloc(1, sizeof(*x));
	*x = (nctx_t){c, r->id, low->id, r->phase};
	rq.epoch = r->epoch;
	if (rpc_async_call(c->rpc, r->id, low->rpc_ep, &refit__v1__node__descriptor, "NcclId",
			   &rq.base, NODE_CALL_MS, on_nccl_id, x, &err) != REFIT_OK) {
		free(x);
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "node %s: %s", low->node_id,
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

	coord_scan_members(c, &nccl, &other, &low);
	if (nccl && other == NULL && coord_nccl_busy(c, r)) {
		ev.u.planned.wait_turn = true;
		return refit_event(c, r, &ev, NULL, NULL);
	}
	memcpy(r->plan_digest, p->digest_hex, sizeof(r->plan_digest));
	coord_involved_nodes(c, p, coord_find_model(c, r->model), r);
	r->epoch = c->epoch;
	if (nccl && other != NULL)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "mixed transports: node %s "
					  "uses %s while others use nccl; every node of an epoch "
					  "needs the same", other->node_id, other->transport);
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
			return coord_refit_fail_poisoned(c, r, m, REFIT_FSM_EV_FAIL);
	}
	if (nccl && r->nnodes > 0)
		ev.u.planned.need_id = coord_nccl_need_id(c, r);
	coord_slices_make(c, r, p, nccl);
	refit_event(c, r, &ev, NULL, p);
}

/* SEND_PREPARE: every node taking part is told the epoch, its members,
 * token and (nccl) unique id. */
static void
send_prepare(coord_t *c, refit_rec_t *r)
{
	Refit__V1__PrepareEpochRequest rq = REFIT__V1__PREPARE_EPOCH_REQUEST__INIT;
	Refit__V1__Member *mv;
	size_t n = c->members.n;

	/* a token per member and epoch (refits of several models share the
	 * epoch); each node gets its own (coord_call_nodes), the others' hashes */
	coord_data_tokens(c, r->epoch);
	rq.epoch = r->epoch;
	if (r->fsm.nccl && r->nccl_id_len) {
		rq.nccl_unique_id.data = r->nccl_id;
		rq.nccl_unique_id.len = r->nccl_id_len;
	}
	rq.members = coord_members_msg(c, &mv);
	rq.n_members = n;
	/* a node that acknowledged this epoch already (for another refit)
	 * is not told again: same members, same token, same unique id */
	coord_call_nodes(c, r, &rq.base, r->epoch);
	coord_members_msg_free(mv, rq.members, n);
}

/* ---- planning -------------------------------------------------------------- */

static void
on_refit_planned(planjob_t *j)
{
	coord_t *c = j->c;
	refit_rec_t *r = coord_find_refit(c, j->refit_id);
	model_t *m = coord_find_model(c, j->model);
	char key[SHA256_HEX_LEN];

	if (r == NULL || r->fsm.state != REFIT_FSM_PLANNING)
		return; /* aborted while planning */
	if (j->rc != REFIT_OK)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "plan: %s", j->err.msg);
	if (m == NULL)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "model \"%s\" went away while "
					  "planning", j->model);
	coord_plan_key(c, m, j->only, &j->opts, key);
	if (strcmp(key, j->key) != 0)
		/* layouts or members changed */
		return coord_refit_on(c, r, REFIT_FSM_EV_PLAN_STALE);
	r->plan_us = j->plan_us;
	r->plan_cached = false;
	r->model_us = (uint64_t)(j->cost.time_s * 1e6 + 0.5);
	r->node_bytes = j->node_bytes;
	if (j->only == NULL)
		return prepare(c, r, coord_plan_keep(c, j));
	/* a catch-up plan is used once: keep it with the refit until prepared */
	prepare(c, r, &j->plan);
}

/* PLAN: the instances taking part, then the plan: the model's last one when
 * its inputs are unchanged, else one built off the loop. */
void
coord_refit_plan(coord_t *c, refit_rec_t *r)
{
	model_t *m = coord_find_model(c, r->model);
	plan_cache_t *pc;
	plan_opts_t o;
	refit_err_t err;
	strbuf_t why;
	char key[SHA256_HEX_LEN];

	if (m == NULL)
		return coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "model \"%s\" went away",
					  r->model);
	strbuf_init(&why);
	if (!coord_refit_choose_instances(c, m, r, &why)) {
		coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "%s", why.s);
		strbuf_fini(&why);
		return;
	}
	strbuf_fini(&why);
	pc = r->only ? NULL : coord_plan_cached(c, m->name);
	coord_plan_opts(c, r->mode, &o);
	coord_plan_key(c, m, r->only, &o, key);
	if (pc != NULL && strcmp(pc->key, key) == 0) {
		r->plan_us = 0;
		r->plan_cached = true;
		r->model_us = (uint64_t)(pc->time_s * 1e6 + 0.5);
		r->node_bytes = pc->node_bytes;
		return prepare(c, r, &pc->plan);
	}
	refit_err_clear(&err);
	if (coord_plan_async(c, m, r->only, &o, false, on_refit_planned, r->id, NULL, &err) !=
	    REFIT_OK)
		coord_refit_eventf(c, r, REFIT_FSM_EV_FAIL, "plan: %s", err.msg);
}

/* A new epoch: refits in flight of the old one fail (coord_internal.h). */
void
coord_bump_epoch(coord_t *c, const char *why)
{
	c->epoch++;
	log_info("coordinator: epoch %" PRIu64 " (%s)", c->epoch, why);
	coord_refits_on_epoch(c, c->epoch - 1, why);
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
			coord_refit_eventf(c, r, REFIT_FSM_EV_EPOCH_CHANGED, "membership "
					   "changed (epoch %" PRIu64 " -> %" PRIu64 ": %s) during "
					   "the refit", old_epoch, c->epoch, why);
	}
}

/* ---- aborts ---------------------------------------------------------------- */

/*
 * A failing refit's Abort found a node unreachable (its process died, so
 * its SliceDone will never come) or it did not answer within the call's
 * deadline (st REFIT_ERR_TIMEOUT: stopped or hung; its peers' reports say
 * more, so this counts as a symptom and coord_refit_name_link weighs it):
 * its slice counts as failed now, not when its lease lapses.
 */
static void
unreachable(coord_t *c, const nctx_t *x, refit_status_t st, const char *msg)
{
	refit_rec_t *r = coord_find_refit(c, x->refit_id);
	member_t *m = coord_find_member(c, x->member_id);
	size_t k;
	char buf[REFIT_ERR_MSG_MAX];

	if (r == NULL || r->phase != x->phase || !coord_refit_runs_slices(r) || r->nstate == NULL ||
	    m == NULL)
		return;
	k = coord_refit_node_index(r, x->member_id);
	if (k == SIZE_MAX || (r->nstate[k] & NODE_REPORTED))
		return;
	r->ntime[k].blame.how = COORD_BLAME_SILENT;
	if (st == REFIT_ERR_TIMEOUT)
		snprintf(buf, sizeof(buf), "did not answer the coordinator's Abort within %d ms "
			 "(stopped or hung?): %s", ABORT_CALL_MS, msg);
	else
		snprintf(buf, sizeof(buf), "unreachable during its slice (%s)", msg);
	slice_result(c, r, k, m->node_id, REFIT_ERR_UNAVAILABLE, buf, NULL, false,
		     st == REFIT_ERR_TIMEOUT);
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
	if ((st == REFIT_ERR_UNAVAILABLE || st == REFIT_ERR_TIMEOUT) && !c->closing)
		unreachable(c, x, st, msg);
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
				   &refit__v1__node__descriptor, "Abort", &ab.base, ABORT_CALL_MS,
				   on_abort_sent, x, NULL) == REFIT_OK)
			c->inflight++;
		else
			free(x);
	}
}
