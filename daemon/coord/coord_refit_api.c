/*
 * coord_refit_api.c - the ways into the refit driver (coord_refit.c) from
 * outside its state machine: the Coordinator's refit methods (TriggerRefit,
 * GetRefit, ListRefits, AbortRefit, and SliceDone, a node's report at the
 * end of its slice), aborts for a member that leaves, and the timer: the
 * RUNNING backstop (SLICE_RUN_MS), retries and queued refits that are due,
 * catch-up refits of instances that registered late, and the trigger
 * policy's pending refits (coord_trigger.c; before catch-up, which waits
 * for a refit of the model in flight).
 *
 * Triggers are idempotent per (model, key).  The newest refit_records
 * records (config key, default COORD_REFIT_RECORDS) are kept for GetRefit,
 * ListRefits, idempotent triggers and the state file; older final ones are
 * freed (coord_refits_trim).  Loop thread only.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/coord/coord_internal.h"

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
	o->by_policy = r->by_policy;
	o->dense_wire_bytes = r->dense_wire;
	o->delta_wire_bytes = r->delta_wire;
	o->delta_dense_bytes = r->delta_dense;
	o->delta_base_refit = r->delta_base >> 8;
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

/* Free the oldest final records beyond the bound, in one pass (records in
 * flight stay, however many); the vector shrinks when it is mostly empty. */
void
coord_refits_trim(coord_t *c)
{
	size_t max = c->o.refit_records ? c->o.refit_records : COORD_REFIT_RECORDS;
	size_t drop = c->refits.n > max ? c->refits.n - max : 0, n = 0;

	if (drop == 0)
		return;
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (drop > 0 && coord_refit_is_final(r)) {
			coord_refit_free(r);
			drop--;
		} else {
			c->refits.v[n++] = r;
		}
	}
	c->refits.n = n;
	if (c->refits.cap > 2 * max + 16 && c->refits.n <= max) {
		c->refits.v = xreallocarray(c->refits.v, max + 1, sizeof(*c->refits.v));
		c->refits.cap = max + 1;
	}
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
		if (!coord_refit_is_final(c->refits.v[i]) &&
		    strcmp(c->refits.v[i]->model, m->name) == 0)
			return refit_err_set(err, REFIT_ERR_EXISTS, "TriggerRefit \"%s\": refit %"
					     PRIu64 " is still %s", m->name, c->refits.v[i]->id,
					     coord_refit_public_name(c->refits.v[i]));
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
	r = coord_refit_add(c, m, NULL);
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
	coord_refits_trim(c);
	rsp.refit_id = r->id;
	rpc_call_reply(call, &rsp.base);
	coord_refit_plan(c, r);
}

static void
h_get(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__GetRefitRequest *rq = (const void *)msg;
	refit_rec_t *r = coord_find_refit(c, rq->refit_id);
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
	refit_rec_t *r = coord_find_refit(c, rq->refit_id);
	const char *node = rq->node_id ? rq->node_id : "";
	member_t *m = coord_find_member(c, rq->member_id);
	size_t k;

	if (r == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "SliceDone: no refit %" PRIu64,
				     rq->refit_id);
	if (m != NULL && !coord_member_acts(c, call, "SliceDone", m))
		return;
	if (m != NULL && strcmp(m->node_id, node) != 0 && coord_binds(c))
		return rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "SliceDone: "
				       "member %" PRIu64 " is node \"%s\", not \"%s\": a member "
				       "acts only for itself", rq->member_id, m->node_id, node);
	if (m != NULL && strcmp(m->node_id, node) != 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SliceDone: member %" PRIu64
				     " is node \"%s\", not \"%s\"", rq->member_id, m->node_id,
				     node);
	coord_member_poisoned(c, m, rq->poisoned);
	k = coord_refit_node_index(r, rq->member_id);
	if (!coord_refit_runs_slices(r) || r->epoch != rq->epoch || r->fsm.attempt != rq->attempt ||
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
	coord_refit_mark_started(r, k);  /* its RunSlice answer may still be on its way */
	r->ntime[k].plan_us = rq->plan_micros;
	r->ntime[k].plan_cached = rq->plan_cached;
	r->ntime[k].decode_us = rq->slice_micros;
	r->ntime[k].slice_xfers = rq->slice_xfers;
	r->ntime[k].slice_us = rq->stats ? rq->stats->micros : 0;
	coord_refit_slice_result(c, r, k, node,
				 rq->code == 0 ? REFIT_OK : rpc_status_from_grpc(rq->code),
				 rq->message && rq->message[0] ? rq->message : "failed", rq->stats,
				 rq->poisoned && rq->poisoned[0]);
	rpc_call_reply(call, &rsp.base);  /* frees rq */
}

static void
h_abort(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__AbortRefitRequest *rq = (const void *)msg;
	refit_rec_t *r = coord_find_refit(c, rq->refit_id);
	Refit__V1__Refit o;

	if (r == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "AbortRefit: no refit %" PRIu64,
				     rq->refit_id);
	if (coord_refit_is_final(r))
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "AbortRefit: refit %" PRIu64
				     " is already %s", r->id, coord_refit_public_name(r));
	coord_refit_eventf(c, r, REFIT_FSM_EV_ABORT, "aborted: %s",
			   rq->reason && rq->reason[0] ? rq->reason : "by request");
	fill_refit(r, &o);
	rpc_call_reply(call, &o.base);
}

const rpc_method_cfg_t coord_refit_methods[] = {
	{"TriggerRefit", h_trigger},
	{"GetRefit", h_get},
	{"ListRefits", h_list},
	{"AbortRefit", h_abort},
	{"SliceDone", h_slice_done},
};
const size_t coord_refit_nmethods = sizeof(coord_refit_methods) / sizeof(coord_refit_methods[0]);

/* ---- a member that leaves ---------------------------------------------------- */

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
		if (coord_refit_is_final(r) || !uses)
			continue;
		coord_refit_eventf(c, r, REFIT_FSM_EV_ABORT, "aborted: %s", why);
		if (n < max)
			ids[n++] = r->id;
	}
	return n;
}

/* Poisoned member m leaves (refitd exits on a sticky CUDA error, or its
 * lease lapsed): the refits of the epoch that use it fail now naming its
 * poison, final, before the epoch's bump would fail them as a membership
 * change, which is retried (and fails again: "rank N has no node"). */
void
coord_refits_on_poisoned_leave(coord_t *c, const member_t *m)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];
		bool uses = false;

		for (size_t k = 0; k < r->nnodes && !uses; k++)
			uses = r->nodes[k] == m->id;
		if (uses && refit_fsm_is(r->fsm.state, REFIT_FSM_HOLDS_EPOCH) &&
		    r->epoch == c->epoch)
			coord_refit_fail_poisoned(c, r, m, REFIT_FSM_EV_EPOCH_CHANGED);
	}
}

/* ---- the timer --------------------------------------------------------------- */

/* A refit of model in flight (one that waits is not in the way). */
static bool
model_busy(coord_t *c, const char *model)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		const refit_rec_t *r = c->refits.v[i];

		if (!coord_refit_is_final(r) && !refit_fsm_is(r->fsm.state, REFIT_FSM_WAITS) &&
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
	coord_refit_eventf(c, r, REFIT_FSM_EV_DEADLINE, "node %s never reported its slice "
			   "(SliceDone) within %d ms; %u of %zu did not", m ? m->node_id : "?",
			   SLICE_RUN_MS, r->fsm.pending, r->nnodes);
}

/*
 * Should in (of m) get a catch-up refit now?  Its catch-up check is armed
 * by every registration of it (late, another node, a client, a node that
 * joined again, in any order) and stays armed until it is whole (each of
 * its nodes a member that registered it since joining), CATCH_UP_DELAY_MS
 * after the last registration; then it is disarmed, and a refit starts
 * when it is behind (it holds an older version than the model's newest, or
 * is invalid) and the policy allows.  A failed catch-up is not repeated
 * until it registers again (its own retries come first).
 */
static bool
catch_up_due(coord_t *c, model_t *m, instance_t *in, uint64_t now)
{
	if (in->role != REFIT__V1__ROLE__INFER || in->catch_up_at_ms == 0 ||
	    now < in->catch_up_at_ms)
		return false;
	if (m->no_catch_up || m->latest_version == 0 || coord_train_instance(m) == NULL ||
	    !coord_instance_behind(m, in)) {
		in->catch_up_at_ms = 0;
		return false;
	}
	return coord_instance_unheld(c, in) < 0 && !model_busy(c, m->name);
}

/* Catch-up refits that are due (catch_up_due): one per tick.  True when one
 * started (the vectors may have moved). */
static bool
catch_up(coord_t *c, uint64_t now)
{
	for (size_t k = 0; k < c->models.n; k++) {
		model_t *m = &c->models.v[k];

		for (size_t i = 0; i < m->inst.n; i++) {
			instance_t *in = &m->inst.v[i];
			refit_rec_t *r;

			if (!catch_up_due(c, m, in, now))
				continue;
			in->catch_up_at_ms = 0;
			r = coord_refit_add(c, m, in->name);
			coord_refits_trim(c);
			log_info("coordinator: refit %" PRIu64 ": catch-up of instance \"%s\" of "
				 "model \"%s\" to version %" PRIu64 " (it holds %" PRIu64 "%s)",
				 r->id, in->name, m->name, r->version, in->installed_version,
				 in->invalid ? ", invalid" : "");
			coord_save(c);
			coord_refit_plan(c, r);
			return true;
		}
	}
	return false;
}

/* Every instance of m (trainer included) whole: each of its ranks served
 * by a member that registered it. */
static bool
model_whole(coord_t *c, model_t *m)
{
	for (size_t i = 0; i < m->inst.n; i++)
		if (coord_instance_unheld(c, &m->inst.v[i]) >= 0)
			return false;
	return m->inst.n > 0;
}

/* After a fail-over (resume_version, coord_state.c): the refit the old
 * leader had in flight, again, once the model is whole.  One per tick;
 * true when one started. */
static bool
resume(coord_t *c)
{
	for (size_t k = 0; k < c->models.n; k++) {
		model_t *m = &c->models.v[k];
		refit_rec_t *r;

		if (m->resume_version == 0)
			continue;
		if (m->resume_version != m->latest_version ||
		    m->installed_version >= m->resume_version) {
			m->resume_version = 0;  /* a newer version came, or this one is in */
			continue;
		}
		if (!model_whole(c, m) || model_busy(c, m->name))
			continue;
		m->resume_version = 0;
		r = coord_refit_add(c, m, NULL);
		coord_refits_trim(c);
		log_info("coordinator: refit %" PRIu64 ": model \"%s\" version %" PRIu64 " again: "
			 "the previous leader's refit of it was cut short (retry policy: %u)",
			 r->id, m->name, r->version, m->retries);
		coord_save(c);
		coord_refit_plan(c, r);
		return true;
	}
	return false;
}

/* A held Publish whose time came leaves (if its refit still publishes;
 * else its durable decision is resent as any other). */
static void
held_due(coord_t *c)
{
	uint64_t now = uv_now(c->loop);

	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];
		Refit__V1__PublishRequest pq = REFIT__V1__PUBLISH_REQUEST__INIT;

		if (r->publish_at_ms == 0 || now < r->publish_at_ms)
			continue;
		r->publish_at_ms = 0;
		if (r->fsm.state != REFIT_FSM_PUBLISHING)
			continue;
		log_info("coordinator: refit %" PRIu64 ": the held Publish leaves", r->id);
		pq.refit_id = r->id;
		pq.epoch = r->epoch;
		pq.model = r->model;
		pq.version = r->version;
		coord_call_nodes(c, r, &pq.base, 0);
		return;  /* r may be gone: the rest at the next tick */
	}
}

void
coord_refits_tick(coord_t *c)
{
	uint64_t now = coord_now_ms();

	if (c->closing)
		return;
	coord_refits_trim(c);  /* records loaded from a state file past the bound */
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (coord_refit_runs_slices(r) && r->nstate != NULL && now > r->run_deadline_ms)
			overdue(c, r);
	}
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (refit_fsm_is(r->fsm.state, REFIT_FSM_WAITS) && now >= r->retry_at_ms)
			coord_refit_on(c, r, REFIT_FSM_EV_DUE);
	}
	held_due(c);
	if (!coord_trigger_tick(c, now) && !resume(c))
		catch_up(c, now);
}
