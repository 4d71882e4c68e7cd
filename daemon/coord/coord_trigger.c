/*
 * coord_trigger.c - what starts a model's refits besides the operator: the
 * model's trigger policy (RefitPolicy.trigger, min_interval_ms).
 *
 * manual (the default): TriggerRefit only.  on_ready: every WeightsReady
 * makes its version the model's pending version (a newer one replaces it,
 * and the replaced one is counted as skipped); the pending version starts a
 * refit as soon as no refit of the model is in flight (a retry waiting for
 * its back-off counts as in flight: it is never preempted) and
 * min_interval_ms has passed since the last refit the policy started began.
 * A pending version not newer than the one installed is dropped.  A refit
 * the policy started that failed and waits to retry (RETRY_WAIT) a version
 * older than the pending one is superseded: aborted, naming the version
 * that replaces it, so the newest goes next (a retry already running is
 * never preempted; an operator's or a catch-up refit is not superseded).
 * The lease
 * tick (coord_refits_tick) retries the start, so a pending version goes
 * once the refit in flight ends, whatever the end.
 *
 * Also where the refit records are made (coord_refit_add) for every way in.
 * Called by coord_register.c (WeightsReady) and
 * coord_refit_api.c (triggers, catch-up, the tick); calls coord_refit.c
 * (planning) and below, never back.  Loop thread only.
 */
#include <inttypes.h>
#include <string.h>

#include "common/log.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/coord/coord_rules.h"
#include "daemon/metrics.h"

refit_rec_t *
coord_refit_add(coord_t *c, const model_t *m, const char *only)
{
	refit_rec_t *r = coord_refit_new();

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

/* Abort m's policy refits waiting to retry a version older than the
 * pending one (their attempts failed; the newest waiting version goes
 * instead).  As any abort, it tells the nodes to drop what they hold of
 * it (best effort); in-place instances its failed attempt reached stay
 * marked invalid until the newest version is installed. */
static void
supersede(coord_t *c, const model_t *m)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		refit_rec_t *r = c->refits.v[i];

		if (!r->by_policy || r->fsm.state != REFIT_FSM_RETRY_WAIT ||
		    r->version >= m->pending_version || strcmp(r->model, m->name) != 0)
			continue;
		log_info("coordinator: refit %" PRIu64 " of model \"%s\" (version %" PRIu64
			 ") superseded by version %" PRIu64 " while it waited to retry",
			 r->id, m->name, r->version, m->pending_version);
		coord_refit_eventf(c, r, REFIT_FSM_EV_ABORT, "aborted: superseded by version %"
				   PRIu64 " (trigger on_ready) while it waited to retry",
				   m->pending_version);
	}
}

/* A refit of m not yet final, a retry waiting for its back-off included. */
static bool
in_flight(const coord_t *c, const model_t *m)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		const refit_rec_t *r = c->refits.v[i];

		if (!coord_refit_is_final(r) && strcmp(r->model, m->name) == 0)
			return true;
	}
	return false;
}

/* Start m's pending refit when it is due (coord_rules_trigger).  True when
 * one started (c->refits may have moved); the state is saved when m changed. */
static bool
try_start(coord_t *c, model_t *m, uint64_t now)
{
	instance_t *t;
	refit_rec_t *r;

	if (!m->on_ready || m->pending_version == 0)
		return false;  /* the common case, before looking at the records */
	if (m->pending_version > m->installed_version)
		supersede(c, m);
	switch (coord_rules_trigger(m, in_flight(c, m), now)) {
	case COORD_TRIGGER_STALE:
		log_info("coordinator: model \"%s\": pending version %" PRIu64 " dropped "
			 "(version %" PRIu64 " is installed)", m->name, m->pending_version,
			 m->installed_version);
		if (m->pending_version < m->installed_version) {
			m->skipped_versions++;
			metrics_add(M_SKIPPED_VERSIONS_TOTAL, NULL, 1);
		}
		m->pending_version = 0;
		coord_save(c);
		return false;
	case COORD_TRIGGER_GO:
		break;
	default:
		return false;
	}
	/* after a coordinator restart the trainer's nodes join again first */
	t = coord_train_instance(m);
	if (t == NULL || coord_instance_unheld(c, t) >= 0)
		return false;
	r = coord_refit_add(c, m, NULL);
	r->version = m->pending_version;
	r->by_policy = true;
	m->pending_version = 0;
	m->policy_refits++;
	m->policy_start_ms = r->created_ms;
	metrics_add(M_POLICY_REFITS_TOTAL, NULL, 1);
	log_info("coordinator: refit %" PRIu64 ": model \"%s\" to version %" PRIu64
		 " (trigger on_ready, min interval %" PRIu32 " ms)", r->id, m->name, r->version,
		 m->min_interval_ms);
	coord_save(c);
	coord_refit_plan(c, r);
	return true;
}

void
coord_trigger_ready(coord_t *c, model_t *m, uint64_t version)
{
	uint64_t was = m->pending_version;

	if (!m->on_ready)
		return;
	if (coord_rules_trigger_note(m, version)) {
		log_info("coordinator: model \"%s\": version %" PRIu64 " skipped (version %"
			 PRIu64 " is ready and waits for the refit in flight)", m->name, was,
			 version);
		metrics_add(M_SKIPPED_VERSIONS_TOTAL, NULL, 1);
	}
	if (!try_start(c, m, coord_now_ms()))
		coord_save(c);  /* the pending version */
}

bool
coord_trigger_tick(coord_t *c, uint64_t now)
{
	bool any = false;

	for (size_t k = 0; k < c->models.n; k++)
		any |= try_start(c, &c->models.v[k], now);
	return any;
}
