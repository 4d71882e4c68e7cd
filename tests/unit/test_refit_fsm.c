/*
 * test_refit_fsm.c - the refit lifecycle (daemon/coord/refit_fsm.h) without
 * processes: every (state, event) pair.  EXPECTED says, per state, which
 * events it takes; every pair it takes has rows in ROWS (the next state,
 * count, attempt and actions), every other pair must be refused with an
 * error and leave the output untouched.  A new state or event without a
 * line here fails table_matches_enums.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/coord/refit_fsm.h"
#include "tests/unit/helpers.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/*
 * One string per state, one character per event, in the order of
 * refit_fsm_event_kind_t: 'x' the state takes it, '.' it is an error.
 *
 *   planned, plan-stale, due, calls-sent, node-ok, node-failed,
 *   slice-ok, slice-failed, fail, deadline, epoch-changed, abort
 */
static const char *const EXPECTED[] = {
	[REFIT_FSM_PLANNING] = "xx......x..x",
	[REFIT_FSM_QUEUED] = "..x........x",
	[REFIT_FSM_RETRY_WAIT] = "..x........x",
	[REFIT_FSM_NCCL_ID] = "....xx..x.xx",
	[REFIT_FSM_PREPARING] = "...xxx..x.xx",
	[REFIT_FSM_RUNNING] = "...x..xxxxxx",
	[REFIT_FSM_FAILING_SYMPTOM] = "......xx.xxx",
	[REFIT_FSM_FAILING] = "......xx.xxx",
	[REFIT_FSM_COMMITTING] = "...xxx..x.xx",
	[REFIT_FSM_PUBLISHING] = "...xxx..x.xx",
	[REFIT_FSM_COMMITTED] = "............",
	[REFIT_FSM_FAILED] = "............",
	[REFIT_FSM_ABORTED] = "............",
};

typedef struct row {
	refit_fsm_state_t from;
	uint32_t pending, attempt, retries;
	bool nccl;
	refit_fsm_event_t ev;
	refit_fsm_state_t to;
	uint32_t to_pending, to_attempt;
	const char *acts;   /* action names in order; "retry:N" and "wait:N" with wait_ms */
} row_t;

#define ST(x) REFIT_FSM_##x
#define EV(k) {.kind = REFIT_FSM_EV_##k}
#define PLANNED(...) {.kind = REFIT_FSM_EV_PLANNED, .u.planned = {__VA_ARGS__}}
#define SENT(n) {.kind = REFIT_FSM_EV_CALLS_SENT, .u.calls = {n}}
#define SLICE_FAILED(sym) {.kind = REFIT_FSM_EV_SLICE_FAILED, .u.slice = {sym}}

/* from, pending, attempt, retries, nccl, event, to, pending, attempt, actions
 * (the backoff is 100 ms throughout) */
static const row_t ROWS[] = {
	/* planning */
	{ST(PLANNING), 0, 1, 0, 0, PLANNED(.wait_turn = true), ST(QUEUED), 0, 1, "wait:1"},
	{ST(PLANNING), 0, 1, 0, 0, PLANNED(.no_nodes = true), ST(COMMITTED), 0, 1, "end"},
	{ST(PLANNING), 0, 1, 0, 0, PLANNED(0), ST(PREPARING), 0, 1, "send-prepare"},
	{ST(PLANNING), 0, 1, 0, 0, PLANNED(.nccl = true, .need_id = true), ST(NCCL_ID), 0, 1,
	 "ask-nccl-id"},
	{ST(PLANNING), 0, 1, 0, 0, PLANNED(.nccl = true), ST(PREPARING), 0, 1, "send-prepare"},
	{ST(PLANNING), 0, 1, 0, 0, PLANNED(.need_id = true), ST(PREPARING), 0, 1,
	 "send-prepare"},
	{ST(PLANNING), 0, 1, 0, 0, EV(PLAN_STALE), ST(PLANNING), 0, 1, "plan"},
	{ST(PLANNING), 0, 1, 0, 0, EV(FAIL), ST(FAILED), 0, 1, "keep-cause cancel-calls end"},
	{ST(PLANNING), 0, 1, 1, 0, EV(FAIL), ST(RETRY_WAIT), 0, 2,
	 "keep-cause cancel-calls retry:100"},
	/* nodes were not reached: no new epoch even on nccl */
	{ST(PLANNING), 0, 2, 1, 1, EV(FAIL), ST(FAILED), 0, 2, "keep-cause cancel-calls end"},
	{ST(PLANNING), 0, 1, 0, 1, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	/* waiting */
	{ST(QUEUED), 0, 1, 0, 0, EV(DUE), ST(PLANNING), 0, 1, "plan"},
	{ST(QUEUED), 0, 1, 0, 0, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(RETRY_WAIT), 0, 2, 1, 1, EV(DUE), ST(PLANNING), 0, 2, "plan"},
	{ST(RETRY_WAIT), 0, 2, 1, 1, EV(ABORT), ST(ABORTED), 0, 2,
	 "keep-cause cancel-calls end abort-nodes"},
	/* nccl-id */
	{ST(NCCL_ID), 0, 1, 0, 1, EV(NODE_OK), ST(PREPARING), 0, 1, "send-prepare"},
	{ST(NCCL_ID), 0, 1, 0, 1, EV(NODE_FAILED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end new-epoch"},
	{ST(NCCL_ID), 0, 1, 0, 1, EV(FAIL), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end new-epoch"},
	{ST(NCCL_ID), 0, 1, 0, 1, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end new-epoch abort-nodes"},
	{ST(NCCL_ID), 0, 1, 0, 1, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end new-epoch abort-nodes"},
	/* preparing */
	{ST(PREPARING), 0, 1, 0, 0, SENT(3), ST(PREPARING), 3, 1, ""},
	{ST(PREPARING), 0, 1, 0, 0, SENT(0), ST(RUNNING), 0, 1, "send-run"},
	{ST(PREPARING), 2, 1, 0, 0, EV(NODE_OK), ST(PREPARING), 1, 1, ""},
	{ST(PREPARING), 1, 1, 0, 0, EV(NODE_OK), ST(RUNNING), 0, 1, "send-run"},
	{ST(PREPARING), 2, 1, 0, 0, EV(NODE_FAILED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(PREPARING), 2, 2, 2, 0, EV(NODE_FAILED), ST(RETRY_WAIT), 0, 3,
	 "keep-cause cancel-calls retry:200 abort-nodes"},
	{ST(PREPARING), 2, 1, 0, 0, EV(FAIL), ST(FAILED), 0, 1, "keep-cause cancel-calls end"},
	{ST(PREPARING), 2, 1, 0, 0, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(PREPARING), 2, 1, 0, 1, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end new-epoch abort-nodes"},
	{ST(PREPARING), 2, 1, 0, 0, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	/* running */
	{ST(RUNNING), 0, 1, 0, 0, SENT(2), ST(RUNNING), 2, 1, ""},
	{ST(RUNNING), 0, 1, 0, 0, SENT(0), ST(COMMITTING), 0, 1, "send-commit"},
	{ST(RUNNING), 2, 1, 0, 0, EV(SLICE_OK), ST(RUNNING), 1, 1, ""},
	{ST(RUNNING), 1, 1, 0, 0, EV(SLICE_OK), ST(COMMITTING), 0, 1, "send-commit"},
	{ST(RUNNING), 2, 1, 0, 0, SLICE_FAILED(false), ST(FAILING), 1, 1,
	 "keep-cause abort-nodes"},
	{ST(RUNNING), 2, 1, 0, 0, SLICE_FAILED(true), ST(FAILING_SYMPTOM), 1, 1,
	 "keep-cause abort-nodes"},
	/* a later attempt keeps its own cause, not the last attempt's (a bug
	 * of the flags this machine replaced) */
	{ST(RUNNING), 2, 2, 2, 0, SLICE_FAILED(false), ST(FAILING), 1, 2,
	 "keep-cause abort-nodes"},
	{ST(RUNNING), 1, 1, 0, 0, SLICE_FAILED(false), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(RUNNING), 1, 1, 1, 1, SLICE_FAILED(true), ST(RETRY_WAIT), 0, 2,
	 "keep-cause cancel-calls retry:100 new-epoch abort-nodes"},
	{ST(RUNNING), 2, 1, 0, 0, EV(FAIL), ST(FAILED), 0, 1, "keep-cause cancel-calls end"},
	{ST(RUNNING), 2, 1, 0, 0, EV(DEADLINE), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(RUNNING), 2, 1, 0, 0, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(RUNNING), 2, 1, 0, 1, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end new-epoch abort-nodes"},
	/* failing, only symptoms so far */
	{ST(FAILING_SYMPTOM), 2, 1, 0, 0, EV(SLICE_OK), ST(FAILING_SYMPTOM), 1, 1, ""},
	{ST(FAILING_SYMPTOM), 1, 1, 0, 0, EV(SLICE_OK), ST(FAILED), 0, 1, "cancel-calls end"},
	{ST(FAILING_SYMPTOM), 2, 1, 0, 0, SLICE_FAILED(true), ST(FAILING_SYMPTOM), 1, 1, ""},
	{ST(FAILING_SYMPTOM), 2, 1, 0, 0, SLICE_FAILED(false), ST(FAILING), 1, 1, "keep-cause"},
	{ST(FAILING_SYMPTOM), 1, 1, 0, 0, SLICE_FAILED(false), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end"},
	{ST(FAILING_SYMPTOM), 1, 1, 0, 0, SLICE_FAILED(true), ST(FAILED), 0, 1,
	 "cancel-calls end"},
	{ST(FAILING_SYMPTOM), 2, 1, 0, 0, EV(DEADLINE), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(FAILING_SYMPTOM), 2, 1, 0, 0, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(FAILING_SYMPTOM), 2, 1, 0, 0, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	/* failing, the cause kept */
	{ST(FAILING), 2, 1, 0, 0, EV(SLICE_OK), ST(FAILING), 1, 1, ""},
	{ST(FAILING), 1, 1, 0, 0, EV(SLICE_OK), ST(FAILED), 0, 1, "cancel-calls end"},
	{ST(FAILING), 2, 1, 0, 0, SLICE_FAILED(false), ST(FAILING), 1, 1, ""},
	{ST(FAILING), 1, 1, 1, 0, SLICE_FAILED(true), ST(RETRY_WAIT), 0, 2,
	 "cancel-calls retry:100"},
	{ST(FAILING), 2, 1, 0, 0, EV(DEADLINE), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(FAILING), 2, 1, 0, 1, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end new-epoch abort-nodes"},
	{ST(FAILING), 2, 1, 0, 0, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	/* committing */
	{ST(COMMITTING), 0, 1, 0, 0, SENT(2), ST(COMMITTING), 2, 1, ""},
	{ST(COMMITTING), 0, 1, 0, 0, SENT(0), ST(PUBLISHING), 0, 1, "send-publish"},
	{ST(COMMITTING), 2, 1, 0, 0, EV(NODE_OK), ST(COMMITTING), 1, 1, ""},
	{ST(COMMITTING), 1, 1, 0, 0, EV(NODE_OK), ST(PUBLISHING), 0, 1, "send-publish"},
	{ST(COMMITTING), 2, 1, 0, 0, EV(NODE_FAILED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(COMMITTING), 2, 1, 0, 0, EV(FAIL), ST(FAILED), 0, 1, "keep-cause cancel-calls end"},
	{ST(COMMITTING), 2, 1, 0, 0, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	{ST(COMMITTING), 2, 1, 0, 0, EV(ABORT), ST(ABORTED), 0, 1,
	 "keep-cause cancel-calls end abort-nodes"},
	/* publishing: the decision is taken, Publish calls are never cancelled */
	{ST(PUBLISHING), 0, 1, 0, 0, SENT(2), ST(PUBLISHING), 2, 1, ""},
	{ST(PUBLISHING), 0, 1, 0, 0, SENT(0), ST(COMMITTED), 0, 1, "end"},
	{ST(PUBLISHING), 2, 1, 0, 0, EV(NODE_OK), ST(PUBLISHING), 1, 1, ""},
	{ST(PUBLISHING), 1, 1, 0, 0, EV(NODE_OK), ST(COMMITTED), 0, 1, "end"},
	{ST(PUBLISHING), 2, 1, 0, 0, EV(NODE_FAILED), ST(FAILED), 0, 1, "keep-cause end"},
	/* ... nor retried: the decision stands, the Publish is resent */
	{ST(PUBLISHING), 2, 1, 1, 1, EV(NODE_FAILED), ST(FAILED), 0, 1,
	 "keep-cause end new-epoch"},
	{ST(PUBLISHING), 2, 1, 0, 0, EV(FAIL), ST(FAILED), 0, 1, "keep-cause end"},
	{ST(PUBLISHING), 2, 1, 0, 0, EV(EPOCH_CHANGED), ST(FAILED), 0, 1,
	 "keep-cause end abort-nodes"},
	{ST(PUBLISHING), 2, 1, 0, 0, EV(ABORT), ST(ABORTED), 0, 1, "keep-cause end abort-nodes"},
};

static refit_fsm_t
machine(refit_fsm_state_t s, uint32_t pending, uint32_t attempt, uint32_t retries, bool nccl)
{
	return (refit_fsm_t){.state = s, .pending = pending, .attempt = attempt,
			     .retries = retries, .backoff_ms = 100, .nccl = nccl};
}

/* The actions of o as "name name:wait ..." into buf. */
static const char *
render(const refit_fsm_out_t *o, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < o->nact && n < len; i++) {
		const refit_fsm_action_t *a = &o->act[i];
		bool timed = a->kind == REFIT_FSM_ACT_RETRY || a->kind == REFIT_FSM_ACT_WAIT;

		n += (size_t)snprintf(buf + n, len - n, timed ? "%s%s:%llu" : "%s%s",
				      i ? " " : "", refit_fsm_action_name(a->kind),
				      (unsigned long long)a->wait_ms);
	}
	return buf;
}

START_TEST(table_matches_enums)
{
	ck_assert_uint_eq(NELEM(EXPECTED), REFIT_FSM_NSTATES);
	for (int s = 0; s < REFIT_FSM_NSTATES; s++) {
		ck_assert_msg(EXPECTED[s] != NULL, "state %s has no line in EXPECTED",
			      refit_fsm_state_name((refit_fsm_state_t)s));
		ck_assert_msg(strlen(EXPECTED[s]) == REFIT_FSM_NEVENTS, "state %s: %zu events "
			      "in EXPECTED, the enum has %d", refit_fsm_state_name(s),
			      strlen(EXPECTED[s]), REFIT_FSM_NEVENTS);
		ck_assert_ptr_nonnull(refit_fsm_info((refit_fsm_state_t)s));
		for (int t = 0; t < s; t++)
			ck_assert_str_ne(refit_fsm_state_name(s), refit_fsm_state_name(t));
	}
	ck_assert_ptr_null(refit_fsm_info(REFIT_FSM_NSTATES));
	for (int e = 0; e < REFIT_FSM_NEVENTS; e++)
		ck_assert_str_ne(refit_fsm_event_name((refit_fsm_event_kind_t)e), "?");
	for (int a = 0; a < REFIT_FSM_NACTIONS; a++)
		ck_assert_str_ne(refit_fsm_action_name((refit_fsm_action_kind_t)a), "?");
}
END_TEST

/* Every pair EXPECTED marks has rows; every other pair is an error. */
START_TEST(every_pair)
{
	for (int s = 0; s < REFIT_FSM_NSTATES; s++)
		for (int e = 0; e < REFIT_FSM_NEVENTS; e++) {
			size_t rows = 0;

			for (size_t i = 0; i < NELEM(ROWS); i++)
				rows += (int)ROWS[i].from == s && (int)ROWS[i].ev.kind == e;
			if (EXPECTED[s][e] == 'x') {
				ck_assert_msg(rows > 0, "(%s, %s) is taken but has no row",
					      refit_fsm_state_name(s), refit_fsm_event_name(e));
				continue;
			}
			ck_assert_msg(rows == 0, "(%s, %s) is an error but has rows",
				      refit_fsm_state_name(s), refit_fsm_event_name(e));
			for (uint32_t p = 0; p < 2; p++) {
				refit_fsm_t m = machine((refit_fsm_state_t)s, p, 1, 1, true);
				refit_fsm_event_t ev = {.kind = (refit_fsm_event_kind_t)e};
				refit_fsm_out_t out, was;
				refit_err_t err;

				refit_err_clear(&err);
				memset(&out, 0xa5, sizeof(out));
				was = out;
				ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err),
						 REFIT_ERR_INTERNAL);
				ck_assert_ptr_nonnull(strstr(err.msg, refit_fsm_state_name(s)));
				ck_assert_ptr_nonnull(strstr(err.msg, refit_fsm_event_name(e)));
				ck_assert_int_eq(memcmp(&out, &was, sizeof(out)), 0);
			}
		}
}
END_TEST

START_TEST(rows)
{
	for (size_t i = 0; i < NELEM(ROWS); i++) {
		const row_t *r = &ROWS[i];
		refit_fsm_t m = machine(r->from, r->pending, r->attempt, r->retries, r->nccl);
		refit_fsm_out_t out;
		refit_err_t err;
		char acts[256];
		bool calls = false, end = false;

		refit_err_clear(&err);
		ck_assert_msg(refit_fsm_step(&m, &r->ev, &out, &err) == REFIT_OK, "row %zu: %s",
			      i, err.msg);
		ck_assert_msg(out.next.state == r->to, "row %zu (%s, %s): %s, expected %s", i,
			      refit_fsm_state_name(r->from), refit_fsm_event_name(r->ev.kind),
			      refit_fsm_state_name(out.next.state), refit_fsm_state_name(r->to));
		ck_assert_msg(out.next.pending == r->to_pending, "row %zu: pending %u", i,
			      out.next.pending);
		ck_assert_msg(out.next.attempt == r->to_attempt, "row %zu: attempt %u", i,
			      out.next.attempt);
		ck_assert_msg(strcmp(render(&out, acts, sizeof(acts)), r->acts) == 0,
			      "row %zu (%s, %s): actions \"%s\", expected \"%s\"", i,
			      refit_fsm_state_name(r->from), refit_fsm_event_name(r->ev.kind),
			      acts, r->acts);
		ck_assert_uint_eq(out.next.retries, r->retries);
		ck_assert_uint_eq(out.next.backoff_ms, 100);
		/* bookkeeping first, then the calls (the refit is saved between) */
		for (size_t k = 0; k < out.nact; k++) {
			end |= out.act[k].kind == REFIT_FSM_ACT_END;
			if (out.act[k].kind >= REFIT_FSM_FIRST_CALL)
				calls = true;
			else
				ck_assert_msg(!calls, "row %zu: %s after a call", i,
					      refit_fsm_action_name(out.act[k].kind));
		}
		/* a final state is reached only with "end" */
		ck_assert_int_eq(refit_fsm_is(out.next.state, REFIT_FSM_FINAL), end);
	}
}
END_TEST

START_TEST(planned_sets_nccl)
{
	refit_fsm_t m = machine(REFIT_FSM_PLANNING, 0, 1, 0, false);
	refit_fsm_event_t ev = PLANNED(.nccl = true);
	refit_fsm_out_t out;
	refit_err_t err;

	refit_err_clear(&err);
	ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err), REFIT_OK);
	ck_assert(out.next.nccl);
	m.nccl = true;
	ev = (refit_fsm_event_t)PLANNED(0);
	ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err), REFIT_OK);
	ck_assert(!out.next.nccl);
}
END_TEST

/* A count never goes below zero: an answer nobody waits for is an error. */
START_TEST(count_underflow)
{
	static const refit_fsm_state_t st[] = {REFIT_FSM_PREPARING, REFIT_FSM_COMMITTING,
					       REFIT_FSM_PUBLISHING, REFIT_FSM_RUNNING,
					       REFIT_FSM_FAILING, REFIT_FSM_FAILING_SYMPTOM};

	for (size_t i = 0; i < NELEM(st); i++) {
		refit_fsm_t m = machine(st[i], 0, 1, 0, false);
		refit_fsm_event_t ev = {.kind = i < 3 ? REFIT_FSM_EV_NODE_OK :
						      REFIT_FSM_EV_SLICE_OK};
		refit_fsm_out_t out;
		refit_err_t err;

		refit_err_clear(&err);
		ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err), REFIT_ERR_INTERNAL);
		ck_assert_ptr_nonnull(strstr(err.msg, "outstanding"));
	}
}
END_TEST

START_TEST(backoff_doubles_and_is_capped)
{
	static const struct { uint32_t attempt, backoff; uint64_t wait; } c[] = {
		{1, 100, 100}, {2, 100, 200}, {3, 100, 400}, {17, 100, 100ull << 16},
		{40, 100, 100ull << 16}, {1, 0, 1}, {5, 0, 1},
	};

	for (size_t i = 0; i < NELEM(c); i++) {
		refit_fsm_t m = machine(REFIT_FSM_PLANNING, 0, c[i].attempt, 100, false);
		refit_fsm_event_t ev = EV(FAIL);
		refit_fsm_out_t out;
		refit_err_t err;

		m.backoff_ms = c[i].backoff;
		refit_err_clear(&err);
		ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err), REFIT_OK);
		ck_assert_int_eq(out.act[2].kind, REFIT_FSM_ACT_RETRY);
		ck_assert_uint_eq(out.act[2].wait_ms, c[i].wait);
		ck_assert_uint_eq(out.next.attempt, c[i].attempt + 1);
	}
}
END_TEST

/*
 * A failure whose event is final (a node the refit needs is poisoned) ends
 * in FAILED with retries left; so does a later failure of an attempt that
 * saw a final event (a poisoned node's slice report, then the last report
 * ending the round).  Without the flag the same events retry.
 */
START_TEST(final_failure_not_retried)
{
	for (int fin = 0; fin < 2; fin++) {
		refit_fsm_t m = machine(REFIT_FSM_PLANNING, 0, 1, 5, false);
		refit_fsm_event_t ev = EV(FAIL), bad = EV(SLICE_FAILED), last = EV(SLICE_OK);
		refit_fsm_out_t out;
		refit_err_t err;

		refit_err_clear(&err);
		ev.final = fin;
		ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err), REFIT_OK);
		ck_assert_int_eq(out.next.state, fin ? REFIT_FSM_FAILED : REFIT_FSM_RETRY_WAIT);
		/* two slices run: the first reports a final failure, the second ends well */
		m = machine(REFIT_FSM_RUNNING, 2, 1, 5, false);
		bad.final = fin;
		ck_assert_int_eq(refit_fsm_step(&m, &bad, &out, &err), REFIT_OK);
		ck_assert_int_eq(out.next.state, REFIT_FSM_FAILING);
		ck_assert(out.next.final == (bool)fin);
		m = out.next;
		ck_assert_int_eq(refit_fsm_step(&m, &last, &out, &err), REFIT_OK);
		ck_assert_int_eq(out.next.state, fin ? REFIT_FSM_FAILED : REFIT_FSM_RETRY_WAIT);
		/* three slices: a cause is kept first; a final failure after it
		 * replaces it (it is why no attempt follows); a second final one
		 * does not */
		m = machine(REFIT_FSM_RUNNING, 3, 1, 5, false);
		bad.final = false;
		ck_assert_int_eq(refit_fsm_step(&m, &bad, &out, &err), REFIT_OK);
		m = out.next;
		bad.final = fin;
		ck_assert_int_eq(refit_fsm_step(&m, &bad, &out, &err), REFIT_OK);
		ck_assert_int_eq(out.nact, fin ? 1 : 0);
		if (fin)
			ck_assert_int_eq(out.act[0].kind, REFIT_FSM_ACT_KEEP_CAUSE);
		m = out.next;
		ck_assert_int_eq(refit_fsm_step(&m, &bad, &out, &err), REFIT_OK);
		ck_assert_int_eq(out.next.state, fin ? REFIT_FSM_FAILED : REFIT_FSM_RETRY_WAIT);
		ck_assert(out.nact == 0 || out.act[0].kind != REFIT_FSM_ACT_KEEP_CAUSE);
	}
}
END_TEST

/*
 * A kept final cause (a poisoned node's report) is not replaced by a later
 * failure of the same attempt: the membership change when that node exits
 * (refitd exits on a sticky CUDA error) or the deadline, while the others'
 * reports are still due; without the flag the later one is kept.
 */
START_TEST(final_cause_kept)
{
	static const refit_fsm_event_kind_t later[] = {REFIT_FSM_EV_EPOCH_CHANGED,
						       REFIT_FSM_EV_DEADLINE};

	for (int fin = 0; fin < 2; fin++)
		for (size_t i = 0; i < NELEM(later); i++) {
			refit_fsm_t m = machine(REFIT_FSM_RUNNING, 2, 1, 5, true);
			refit_fsm_event_t bad = EV(SLICE_FAILED), ev = {.kind = later[i]};
			refit_fsm_out_t out;
			refit_err_t err;
			bool kept = false;

			refit_err_clear(&err);
			bad.final = fin;
			ck_assert_int_eq(refit_fsm_step(&m, &bad, &out, &err), REFIT_OK);
			m = out.next;
			ck_assert_int_eq(refit_fsm_step(&m, &ev, &out, &err), REFIT_OK);
			ck_assert_int_eq(out.next.state, fin ? REFIT_FSM_FAILED :
							       REFIT_FSM_RETRY_WAIT);
			for (size_t a = 0; a < out.nact; a++)
				kept |= out.act[a].kind == REFIT_FSM_ACT_KEEP_CAUSE;
			ck_assert(kept == !fin);
		}
}
END_TEST

START_TEST(public_states)
{
	static const char *const names[] = {"PENDING", "PREPARING", "RUNNING", "COMMITTED",
					    "FAILED", "ABORTED"};
	refit_fsm_state_t s;
	refit_err_t err;

	for (int p = 0; p < (int)NELEM(names); p++) {
		ck_assert_str_eq(refit_fsm_public_name(p), names[p]);
		refit_err_clear(&err);
		ck_assert_int_eq(refit_fsm_of_public(p, &s, &err), REFIT_OK);
		ck_assert_int_eq(refit_fsm_public(s), p);
		ck_assert_int_eq(refit_fsm_is(s, REFIT_FSM_FINAL), p >= 3);
	}
	ck_assert_str_eq(refit_fsm_public_name(6), "?");
	ck_assert_str_eq(refit_fsm_public_name(-1), "?");
	for (int bad = -1; bad <= 6; bad += 7) {
		refit_err_clear(&err);
		ck_assert_int_eq(refit_fsm_of_public(bad, &s, &err), REFIT_ERR_INVALID_ARG);
		ck_assert_ptr_nonnull(strstr(err.msg, bad < 0 ? "-1" : "6"));
	}
	for (int t = 0; t < REFIT_FSM_NSTATES; t++) {
		const refit_fsm_state_info_t *in = refit_fsm_info((refit_fsm_state_t)t);

		ck_assert_str_ne(refit_fsm_public_name(in->public_state), "?");
		ck_assert_int_eq(in->phase == NULL, (in->flags & REFIT_FSM_FINAL) != 0);
	}
	ck_assert_str_eq(refit_fsm_info(REFIT_FSM_PUBLISHING)->phase, "committing");
	ck_assert_int_eq(refit_fsm_public(REFIT_FSM_FAILING), 2);
}
END_TEST

/* Feed evs in turn; m ends in want. */
static void
feed(refit_fsm_t *m, const refit_fsm_event_t *evs, size_t n, refit_fsm_state_t want)
{
	for (size_t i = 0; i < n; i++) {
		refit_fsm_out_t out;
		refit_err_t err;

		refit_err_clear(&err);
		ck_assert_msg(refit_fsm_step(m, &evs[i], &out, &err) == REFIT_OK, "event %zu: %s",
			      i, err.msg);
		*m = out.next;
	}
	ck_assert_str_eq(refit_fsm_state_name(m->state), refit_fsm_state_name(want));
}

/* Whole lives: two nodes commit; a failed first attempt, then a retry. */
START_TEST(lifecycles)
{
	static const refit_fsm_event_t ok[] = {
		PLANNED(0), SENT(2), EV(NODE_OK), EV(NODE_OK), SENT(2), EV(SLICE_OK),
		EV(SLICE_OK), SENT(2), EV(NODE_OK), EV(NODE_OK), SENT(2), EV(NODE_OK),
		EV(NODE_OK),
	};
	static const refit_fsm_event_t retried[] = {
		PLANNED(.nccl = true, .need_id = true), EV(NODE_OK), SENT(0), SENT(2),
		SLICE_FAILED(true), SLICE_FAILED(false), EV(DUE), PLANNED(.nccl = true),
		SENT(1), EV(NODE_OK), SENT(1), EV(SLICE_OK), SENT(1), EV(NODE_OK), SENT(1),
		EV(NODE_OK),
	};
	refit_fsm_t m;

	refit_fsm_init(&m, 0, 50);
	ck_assert_int_eq(m.state, REFIT_FSM_PLANNING);
	ck_assert_uint_eq(m.attempt, 1);
	feed(&m, ok, NELEM(ok), REFIT_FSM_COMMITTED);
	refit_fsm_init(&m, 1, 50);
	feed(&m, retried, 6, REFIT_FSM_RETRY_WAIT);
	ck_assert_uint_eq(m.attempt, 2);
	feed(&m, retried + 6, NELEM(retried) - 6, REFIT_FSM_COMMITTED);
}
END_TEST

Suite *
suite_refit_fsm(void)
{
	return th_suite("refit_fsm",
			th_tcase("core", 0,
				 TH_TESTS(table_matches_enums, every_pair, rows, planned_sets_nccl,
					  count_underflow, backoff_doubles_and_is_capped,
					  final_failure_not_retried, final_cause_kept, public_states, lifecycles)),
			NULL);
}
