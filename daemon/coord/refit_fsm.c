/*
 * refit_fsm.c - the refit lifecycle (refit_fsm.h): the table of states,
 * which events each state expects, and the transition function.  Pure:
 * the protobuf header is read for the RefitState numbers only.
 */
#include "daemon/coord/refit_fsm.h"
#include "refit/v1/refit.pb-c.h"

#define PENDING REFIT__V1__REFIT_STATE__PENDING
#define PREPARING REFIT__V1__REFIT_STATE__PREPARING
#define RUNNING REFIT__V1__REFIT_STATE__RUNNING

/* The one map from the lifecycle to what clients see (RefitState). */
static const refit_fsm_state_info_t states[] = {
	[REFIT_FSM_PLANNING] = {"planning", PENDING, "planning", NULL, 0},
	[REFIT_FSM_QUEUED] = {"queued", PENDING, "planning", NULL, REFIT_FSM_WAITS},
	[REFIT_FSM_RETRY_WAIT] = {"retry-wait", PENDING, "planning", NULL, REFIT_FSM_WAITS},
	[REFIT_FSM_NCCL_ID] = {"nccl-id", PREPARING, "preparing", "NcclId",
			       REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_PREPARING] = {"preparing", PREPARING, "preparing", "PrepareEpoch",
				 REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_RUNNING] = {"running", RUNNING, "running", "RunSlice",
			       REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_FAILING_SYMPTOM] = {"failing-symptom", RUNNING, "running", "RunSlice",
				       REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_FAILING] = {"failing", RUNNING, "running", "RunSlice",
			       REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_COMMITTING] = {"committing", RUNNING, "committing", "Commit",
				  REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_PUBLISHING] = {"publishing", RUNNING, "committing", "Publish",
				  REFIT_FSM_HOLDS_EPOCH},
	[REFIT_FSM_COMMITTED] = {"committed", REFIT__V1__REFIT_STATE__COMMITTED, NULL, NULL,
				 REFIT_FSM_FINAL},
	[REFIT_FSM_FAILED] = {"failed", REFIT__V1__REFIT_STATE__FAILED, NULL, NULL,
			      REFIT_FSM_FINAL},
	[REFIT_FSM_ABORTED] = {"aborted", REFIT__V1__REFIT_STATE__ABORTED, NULL, NULL,
			       REFIT_FSM_FINAL},
};
_Static_assert(sizeof(states) / sizeof(states[0]) == REFIT_FSM_NSTATES,
	       "a row per refit_fsm_state_t");

/* RefitState names, by value (refit.proto). */
static const char *const public_names[] = {
	[PENDING] = "PENDING", [PREPARING] = "PREPARING", [RUNNING] = "RUNNING",
	[REFIT__V1__REFIT_STATE__COMMITTED] = "COMMITTED",
	[REFIT__V1__REFIT_STATE__FAILED] = "FAILED",
	[REFIT__V1__REFIT_STATE__ABORTED] = "ABORTED",
};
#define NPUBLIC (int)(sizeof(public_names) / sizeof(public_names[0]))

static const char *const event_names[] = {
	[REFIT_FSM_EV_PLANNED] = "planned", [REFIT_FSM_EV_PLAN_STALE] = "plan-stale",
	[REFIT_FSM_EV_DUE] = "due", [REFIT_FSM_EV_CALLS_SENT] = "calls-sent",
	[REFIT_FSM_EV_NODE_OK] = "node-ok", [REFIT_FSM_EV_NODE_FAILED] = "node-failed",
	[REFIT_FSM_EV_SLICE_OK] = "slice-ok", [REFIT_FSM_EV_SLICE_FAILED] = "slice-failed",
	[REFIT_FSM_EV_FAIL] = "fail", [REFIT_FSM_EV_DEADLINE] = "deadline",
	[REFIT_FSM_EV_EPOCH_CHANGED] = "epoch-changed", [REFIT_FSM_EV_ABORT] = "abort",
};
_Static_assert(sizeof(event_names) / sizeof(event_names[0]) == REFIT_FSM_NEVENTS,
	       "a name per event");

static const char *const action_names[] = {
	[REFIT_FSM_ACT_KEEP_CAUSE] = "keep-cause",
	[REFIT_FSM_ACT_CANCEL_CALLS] = "cancel-calls", [REFIT_FSM_ACT_RETRY] = "retry",
	[REFIT_FSM_ACT_WAIT] = "wait", [REFIT_FSM_ACT_END] = "end",
	[REFIT_FSM_ACT_NEW_EPOCH] = "new-epoch", [REFIT_FSM_ACT_PLAN] = "plan",
	[REFIT_FSM_ACT_ASK_NCCL_ID] = "ask-nccl-id",
	[REFIT_FSM_ACT_SEND_PREPARE] = "send-prepare", [REFIT_FSM_ACT_SEND_RUN] = "send-run",
	[REFIT_FSM_ACT_SEND_COMMIT] = "send-commit",
	[REFIT_FSM_ACT_SEND_PUBLISH] = "send-publish",
	[REFIT_FSM_ACT_ABORT_NODES] = "abort-nodes",
};
_Static_assert(sizeof(action_names) / sizeof(action_names[0]) == REFIT_FSM_NACTIONS,
	       "a name per action");

#define S(x) (1u << REFIT_FSM_##x)
#define SLICES (S(RUNNING) | S(FAILING_SYMPTOM) | S(FAILING))
#define ROUNDS (S(PREPARING) | S(COMMITTING) | S(PUBLISHING))
#define EPOCH (S(NCCL_ID) | ROUNDS | SLICES)
#define LIVE (S(PLANNING) | S(QUEUED) | S(RETRY_WAIT) | EPOCH)

/* The states in which each event is expected; anywhere else it is an error. */
static const uint32_t legal[] = {
	[REFIT_FSM_EV_PLANNED] = S(PLANNING),
	[REFIT_FSM_EV_PLAN_STALE] = S(PLANNING),
	[REFIT_FSM_EV_DUE] = S(QUEUED) | S(RETRY_WAIT),
	[REFIT_FSM_EV_CALLS_SENT] = ROUNDS | S(RUNNING),
	[REFIT_FSM_EV_NODE_OK] = S(NCCL_ID) | ROUNDS,
	[REFIT_FSM_EV_NODE_FAILED] = S(NCCL_ID) | ROUNDS,
	[REFIT_FSM_EV_SLICE_OK] = SLICES,
	[REFIT_FSM_EV_SLICE_FAILED] = SLICES,
	[REFIT_FSM_EV_FAIL] = S(PLANNING) | S(NCCL_ID) | ROUNDS | S(RUNNING),
	[REFIT_FSM_EV_DEADLINE] = SLICES,
	[REFIT_FSM_EV_EPOCH_CHANGED] = EPOCH,
	[REFIT_FSM_EV_ABORT] = LIVE,
};
_Static_assert(sizeof(legal) / sizeof(legal[0]) == REFIT_FSM_NEVENTS,
	       "the states of every event");

static void
act(refit_fsm_out_t *o, refit_fsm_action_kind_t k, uint64_t wait_ms)
{
	o->act[o->nact++] = (refit_fsm_action_t){k, wait_ms};
}

static void
enter(refit_fsm_out_t *o, refit_fsm_state_t s, refit_fsm_action_kind_t k)
{
	o->next.state = s;
	o->next.pending = 0;
	act(o, k, 0);
}

/*
 * The attempt is over (from: the state it was in): retried after the
 * model's backoff while retries are left and no event said that no attempt
 * can succeed (final), else FAILED.  Calls still out
 * are cancelled, but not Publish: every node had committed, the others
 * publish.  Nor is a refit that failed publishing retried: the decision
 * was taken, some nodes installed, and the Publish is resent to the others
 * (coord_publish.c); another attempt would install the version twice.
 * On nccl a refit that reached the nodes leaves a new epoch.
 */
static void
fail(const refit_fsm_t *m, refit_fsm_out_t *o, bool keep, bool abort_nodes)
{
	/* a final cause kept (a poisoned node) is why no attempt follows: no
	 * later failure replaces it (the membership change when that node
	 * exits, the deadline) */
	if (keep && !m->final)
		act(o, REFIT_FSM_ACT_KEEP_CAUSE, 0);
	if (m->state != REFIT_FSM_PUBLISHING)
		act(o, REFIT_FSM_ACT_CANCEL_CALLS, 0);
	o->next.pending = 0;
	if (m->attempt <= m->retries && !o->next.final && m->state != REFIT_FSM_PUBLISHING) {
		uint32_t sh = m->attempt - 1 < 16 ? m->attempt - 1 : 16;
		uint64_t wait = (uint64_t)m->backoff_ms << sh;

		o->next.state = REFIT_FSM_RETRY_WAIT;
		o->next.attempt = m->attempt + 1;
		act(o, REFIT_FSM_ACT_RETRY, wait ? wait : 1);
	} else {
		o->next.state = REFIT_FSM_FAILED;
		act(o, REFIT_FSM_ACT_END, 0);
	}
	if (m->nccl && refit_fsm_is(m->state, REFIT_FSM_HOLDS_EPOCH))
		act(o, REFIT_FSM_ACT_NEW_EPOCH, 0);
	if (abort_nodes)
		act(o, REFIT_FSM_ACT_ABORT_NODES, 0);
}

static void
abort_refit(const refit_fsm_t *m, refit_fsm_out_t *o)
{
	act(o, REFIT_FSM_ACT_KEEP_CAUSE, 0);
	if (m->state != REFIT_FSM_PUBLISHING)
		act(o, REFIT_FSM_ACT_CANCEL_CALLS, 0);
	o->next.state = REFIT_FSM_ABORTED;
	o->next.pending = 0;
	act(o, REFIT_FSM_ACT_END, 0);
	if (m->nccl && refit_fsm_is(m->state, REFIT_FSM_HOLDS_EPOCH))
		act(o, REFIT_FSM_ACT_NEW_EPOCH, 0);
	act(o, REFIT_FSM_ACT_ABORT_NODES, 0);
}

/* Every answer (report) of the round is in: the next phase. */
static void
round_done(const refit_fsm_t *m, refit_fsm_out_t *o)
{
	static const struct {
		refit_fsm_state_t from, to;
		refit_fsm_action_kind_t act;
	} next[] = {
		{REFIT_FSM_PREPARING, REFIT_FSM_RUNNING, REFIT_FSM_ACT_SEND_RUN},
		{REFIT_FSM_RUNNING, REFIT_FSM_COMMITTING, REFIT_FSM_ACT_SEND_COMMIT},
		{REFIT_FSM_COMMITTING, REFIT_FSM_PUBLISHING, REFIT_FSM_ACT_SEND_PUBLISH},
		{REFIT_FSM_PUBLISHING, REFIT_FSM_COMMITTED, REFIT_FSM_ACT_END},
	};

	for (size_t i = 0; i < sizeof(next) / sizeof(next[0]); i++)
		if (next[i].from == m->state) {
			enter(o, next[i].to, next[i].act);
			return;
		}
	fail(m, o, false, false); /* FAILING, FAILING_SYMPTOM: the cause is kept already */
}

static void
planned(const refit_fsm_t *m, const refit_fsm_event_t *ev, refit_fsm_out_t *o)
{
	(void)m;
	if (ev->u.planned.wait_turn) {
		o->next.state = REFIT_FSM_QUEUED;
		act(o, REFIT_FSM_ACT_WAIT, 1);
		return;
	}
	o->next.nccl = ev->u.planned.nccl;
	if (ev->u.planned.no_nodes)
		enter(o, REFIT_FSM_COMMITTED, REFIT_FSM_ACT_END);
	else if (ev->u.planned.nccl && ev->u.planned.need_id)
		enter(o, REFIT_FSM_NCCL_ID, REFIT_FSM_ACT_ASK_NCCL_ID);
	else
		enter(o, REFIT_FSM_PREPARING, REFIT_FSM_ACT_SEND_PREPARE);
}

/* A slice report: the first failure makes the others stop; a cause found
 * later replaces a symptom kept so far, and the first final failure (a
 * poisoned node) replaces any failure kept so far: it is why no attempt
 * follows; the last report ends the round. */
static void
slice_report(const refit_fsm_t *m, const refit_fsm_event_t *ev, refit_fsm_out_t *o)
{
	bool failed = ev->kind == REFIT_FSM_EV_SLICE_FAILED;
	bool symptom = failed && ev->u.slice.symptom;
	bool first = failed && m->state == REFIT_FSM_RUNNING;
	bool keep = first || (failed && m->state == REFIT_FSM_FAILING_SYMPTOM && !symptom) ||
		    (failed && ev->final && !m->final);

	o->next.pending = m->pending - 1;
	if (first)
		o->next.state = symptom ? REFIT_FSM_FAILING_SYMPTOM : REFIT_FSM_FAILING;
	else if (keep)
		o->next.state = REFIT_FSM_FAILING;
	if (o->next.pending > 0) {
		if (keep)
			act(o, REFIT_FSM_ACT_KEEP_CAUSE, 0);
		if (first)
			act(o, REFIT_FSM_ACT_ABORT_NODES, 0);
	} else if (m->state == REFIT_FSM_RUNNING && !failed) {
		round_done(m, o);
	} else {
		fail(m, o, keep, first);
	}
}

static void
node_answer(const refit_fsm_t *m, const refit_fsm_event_t *ev, refit_fsm_out_t *o)
{
	if (ev->kind == REFIT_FSM_EV_NODE_FAILED) {
		/* a Commit or PrepareEpoch that failed: the others drop theirs */
		fail(m, o, true, m->state == REFIT_FSM_PREPARING ||
				 m->state == REFIT_FSM_COMMITTING);
	} else if (m->state == REFIT_FSM_NCCL_ID) {
		enter(o, REFIT_FSM_PREPARING, REFIT_FSM_ACT_SEND_PREPARE);
	} else if ((o->next.pending = m->pending - 1) == 0) {
		round_done(m, o);
	}
}

static refit_status_t
illegal(const refit_fsm_t *m, const refit_fsm_event_t *ev, const char *why, refit_err_t *err)
{
	return refit_err_set(err, REFIT_ERR_INTERNAL, "refit state machine: event \"%s\" in "
			     "state \"%s\": %s", refit_fsm_event_name(ev->kind),
			     refit_fsm_state_name(m->state), why);
}

/* Does ev count one answer of the round down? */
static bool
counts_one(const refit_fsm_t *m, const refit_fsm_event_t *ev)
{
	return ev->kind == REFIT_FSM_EV_SLICE_OK || ev->kind == REFIT_FSM_EV_SLICE_FAILED ||
	       (ev->kind == REFIT_FSM_EV_NODE_OK && m->state != REFIT_FSM_NCCL_ID);
}

refit_status_t
refit_fsm_step(const refit_fsm_t *m, const refit_fsm_event_t *ev, refit_fsm_out_t *out,
	       refit_err_t *err)
{
	refit_fsm_out_t o = {.next = *m};

	if ((unsigned)m->state >= REFIT_FSM_NSTATES || (unsigned)ev->kind >= REFIT_FSM_NEVENTS)
		return illegal(m, ev, "unknown state or event", err);
	if (!(legal[ev->kind] & (1u << m->state)))
		return illegal(m, ev, "not expected there", err);
	if (counts_one(m, ev) && m->pending == 0)
		return illegal(m, ev, "no answer is outstanding", err);
	o.next.final = m->final || ev->final;
	switch (ev->kind) {
	case REFIT_FSM_EV_PLANNED:
		planned(m, ev, &o);
		break;
	case REFIT_FSM_EV_PLAN_STALE:
	case REFIT_FSM_EV_DUE:
		enter(&o, REFIT_FSM_PLANNING, REFIT_FSM_ACT_PLAN);
		break;
	case REFIT_FSM_EV_CALLS_SENT:
		o.next.pending = ev->u.calls.n;
		if (ev->u.calls.n == 0)
			round_done(m, &o);
		break;
	case REFIT_FSM_EV_NODE_OK:
	case REFIT_FSM_EV_NODE_FAILED:
		node_answer(m, ev, &o);
		break;
	case REFIT_FSM_EV_SLICE_OK:
	case REFIT_FSM_EV_SLICE_FAILED:
		slice_report(m, ev, &o);
		break;
	case REFIT_FSM_EV_FAIL:
		fail(m, &o, true, false);
		break;
	case REFIT_FSM_EV_DEADLINE:
	case REFIT_FSM_EV_EPOCH_CHANGED:
		fail(m, &o, true, true);
		break;
	case REFIT_FSM_EV_ABORT:
		abort_refit(m, &o);
		break;
	default:
		return illegal(m, ev, "unknown event", err);
	}
	*out = o;
	return REFIT_OK;
}

void
refit_fsm_init(refit_fsm_t *m, uint32_t retries, uint32_t backoff_ms)
{
	*m = (refit_fsm_t){.state = REFIT_FSM_PLANNING, .attempt = 1, .retries = retries,
			   .backoff_ms = backoff_ms};
}

const refit_fsm_state_info_t *
refit_fsm_info(refit_fsm_state_t s)
{
	return (unsigned)s < REFIT_FSM_NSTATES ? &states[s] : NULL;
}

bool
refit_fsm_is(refit_fsm_state_t s, unsigned flag)
{
	return (unsigned)s < REFIT_FSM_NSTATES && (states[s].flags & flag) != 0;
}

const char *
refit_fsm_state_name(refit_fsm_state_t s)
{
	return (unsigned)s < REFIT_FSM_NSTATES ? states[s].name : "?";
}

const char *
refit_fsm_event_name(refit_fsm_event_kind_t k)
{
	return (unsigned)k < REFIT_FSM_NEVENTS ? event_names[k] : "?";
}

const char *
refit_fsm_action_name(refit_fsm_action_kind_t k)
{
	return (unsigned)k < REFIT_FSM_NACTIONS ? action_names[k] : "?";
}

int
refit_fsm_public(refit_fsm_state_t s)
{
	return (unsigned)s < REFIT_FSM_NSTATES ? states[s].public_state : -1;
}

const char *
refit_fsm_public_name(int public_state)
{
	return public_state >= 0 && public_state < NPUBLIC && public_names[public_state] ?
	       public_names[public_state] : "?";
}

refit_status_t
refit_fsm_of_public(int public_state, refit_fsm_state_t *s, refit_err_t *err)
{
	for (int i = 0; i < REFIT_FSM_NSTATES; i++)
		if (states[i].public_state == public_state) {
			*s = (refit_fsm_state_t)i;
			return REFIT_OK;
		}
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "refit state %d is not a RefitState "
			     "(0 to %d)", public_state, NPUBLIC - 1);
}
