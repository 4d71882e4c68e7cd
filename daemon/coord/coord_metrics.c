/*
 * coord_metrics.c - the coordinator's refit metrics (daemon/metrics.h):
 * coord_refit.c calls coord_metrics_refit after every change of a refit's
 * state; this file keeps, per refit in flight, its phase and when it began,
 * and the bytes its plan moves by link class; it observes each phase's
 * duration when the next begins, and at the final state counts the
 * outcome once, its cause, its duration and (committed) its bytes.
 * It also keeps the loop thread's log context at the current epoch (the
 * ops timer refreshes it too, once a second), so that a refit's log lines
 * carry the epoch it runs in.  Loop thread only (the registry is
 * thread-safe for the scrapes).
 */
#include <string.h>

#include "common/log.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/metrics.h"

typedef struct track {
	uint64_t id;
	const char *phase;
	uint64_t since_ms;
	uint64_t bytes[PLAN_LINK_COUNT];
	bool have_bytes;
} track_t;

static VEC(track_t) tracks;

static const char *
phase_of(const refit_rec_t *r)
{
	return refit_fsm_info(r->fsm.state)->phase; /* NULL: final */
}

/* The failure's cause, from the coordinator's own messages (coord_refit.c). */
static const char *
cause_of(const refit_rec_t *r)
{
	const char *m = r->failure ? r->failure : "";

	if (r->fsm.state == REFIT_FSM_ABORTED)
		return "aborted";
	if (strncmp(m, "plan", 4) == 0)
		return "plan";
	if (r->fsm.final)   /* a node it needs is poisoned (coord_refit_fail_poisoned, its report) */
		return "poisoned";
	if (strstr(m, "membership changed") != NULL)
		return "membership";
	if (strstr(m, "never reported") != NULL)
		return "timeout";
	if (strncmp(m, "data link ", 10) == 0)  /* the broken link named (coord_blame.c) */
		return "data_link";
	if (strstr(m, "RunSlice") != NULL)
		return "slice";
	if (strstr(m, "went away") != NULL)
		return "model_gone";
	if (strstr(m, "mixed transports") != NULL)
		return "config";
	if (strncmp(m, "node ", 5) == 0)
		return "node_call";
	return "other";
}

static void
plan_bytes(coord_t *c, const plan_t *p, track_t *t)
{
	plan_topo_t topo;
	refit_err_t err;

	refit_err_clear(&err);
	memset(t->bytes, 0, sizeof(t->bytes));
	t->have_bytes = false;
	if (coord_members_topo(c, &topo, &err) == REFIT_OK) {
		for (size_t i = 0; i < p->nxfers; i++) {
			const plan_xfer_t *x = &p->xfers[i];

			t->bytes[plan_link_of(&topo, x->from, x->to)] += plan_xfer_bytes(p, x);
		}
		t->have_bytes = true;
	}
	plan_topo_fini(&topo);
}

void
coord_metrics_refit(coord_t *c, const refit_rec_t *r, const plan_t *p)
{
	const char *phase = phase_of(r);
	uint64_t now = coord_now_ms();
	track_t *t = NULL;
	size_t i;

	log_set_context(&(log_context_t){NULL, -1, c->epoch, 0});
	for (i = 0; i < tracks.n && t == NULL; i++)
		if (tracks.v[i].id == r->id)
			t = &tracks.v[i];
	if (t == NULL) {
		VEC_PUSH(&tracks, ((track_t){.id = r->id, .phase = "planning",
					     .since_ms = r->created_ms}));
		t = &tracks.v[tracks.n - 1];
		i = tracks.n;
	}
	if (p != NULL)
		plan_bytes(c, p, t);
	if (phase != NULL && strcmp(phase, t->phase) == 0)
		return;
	metrics_observe(M_REFIT_PHASE_SECONDS, (const char *[]){"phase", t->phase, NULL},
			now > t->since_ms ? (double)(now - t->since_ms) / 1000.0 : 0.0);
	if (phase != NULL) {
		if (refit_fsm_public(r->fsm.state) == REFIT__V1__REFIT_STATE__PENDING)
			metrics_add(M_REFIT_RETRIES_TOTAL, NULL, 1); /* back to planning */
		t->phase = phase;
		t->since_ms = now;
		return;
	}
	{
		const char *outcome = refit_fsm_info(r->fsm.state)->name; /* a final state */
		uint64_t end = r->finished_ms ? r->finished_ms : now;

		metrics_add(M_REFITS_TOTAL, (const char *[]){"outcome", outcome, NULL}, 1);
		metrics_observe(M_REFIT_SECONDS, (const char *[]){"outcome", outcome, NULL},
				end > r->created_ms ? (double)(end - r->created_ms) / 1000.0 : 0.0);
		if (r->fsm.state != REFIT_FSM_COMMITTED)
			metrics_add(M_REFIT_FAILURES_TOTAL, (const char *[]){"cause", cause_of(r),
									     NULL}, 1);
		else if (t->have_bytes)
			for (int l = 0; l < PLAN_LINK_COUNT; l++)
				metrics_add(M_REFIT_BYTES_TOTAL, (const char *[]){
						"link", plan_link_name((plan_link_t)l), NULL},
					    (double)t->bytes[l]);
	}
	memmove(&tracks.v[i - 1], &tracks.v[i], (tracks.n - i) * sizeof(tracks.v[0]));
	tracks.n--;
}

void
coord_leader_changed(coord_t *c)
{
	metrics_set(M_COORD_LEADER, NULL, c->leading ? 1 : 0);
}
