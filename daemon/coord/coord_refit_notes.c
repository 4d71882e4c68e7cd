/*
 * coord_refit_notes.c - what the refit driver (coord_refit.c) notes in a
 * refit's record, feeding its machine no event and calling no node: the
 * lookups and public names of records, a retry or an end noted, the
 * metrics and state file after a change (coord_refit_settle), the slices'
 * deadline, each node's slice start, what a slice that succeeded reported
 * (its bytes and times), what a failed slice saw of its peers and the
 * broken link those reports name together (coord_blame.c), and a member's
 * poisoning.  Loop thread only; called by coord_refit.c and the files
 * above it, calls only the files below (coord_refit_nodes.c, coord_plan.c,
 * coord_delta.c, coord_slice.c, coord_metrics.c, coord_store.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/utf8.h"
#include "daemon/coord/coord_internal.h"

/* the slices' deadline when the operator set none: the plan's modelled
 * time times SLICE_MODEL_FACTOR, at least SLICE_FLOOR_MS, and at least its
 * busiest node's network bytes at SLICE_FLOOR_BPS (the model assumes the
 * NICs' line rate; tcp over host memory moves far less) */
#define SLICE_MODEL_FACTOR 4
#define SLICE_FLOOR_MS 30000
#define SLICE_FLOOR_BPS (100ull * 1000 * 1000)

refit_rec_t *
coord_find_refit(coord_t *c, uint64_t id)
{
	for (size_t i = 0; i < c->refits.n; i++)
		if (c->refits.v[i]->id == id)
			return c->refits.v[i];
	return NULL;
}

bool
coord_refit_is_final(const refit_rec_t *r)
{
	return refit_fsm_is(r->fsm.state, REFIT_FSM_FINAL);
}

/* RUNNING, FAILING*: the round of RunSlice answers and slice reports. */
bool
coord_refit_runs_slices(const refit_rec_t *r)
{
	return r->fsm.state == REFIT_FSM_RUNNING || r->fsm.state == REFIT_FSM_FAILING ||
	       r->fsm.state == REFIT_FSM_FAILING_SYMPTOM;
}

const char *
coord_refit_public_name(const refit_rec_t *r)
{
	return refit_fsm_public_name(refit_fsm_public(r->fsm.state));
}

/* RETRY: the attempt that ended (was) is noted; the next one is planned
 * in wait_ms with the members of then.  Figures are the last attempt's. */
void
coord_refit_note_retry(refit_rec_t *r, const refit_fsm_t *was, uint64_t wait_ms)
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
	r->delta_wire = r->delta_dense = r->dense_wire = 0;
	r->nstages = 0;
	memset(r->stage_us, 0, sizeof(r->stage_us));
	memset(r->stage_bytes, 0, sizeof(r->stage_bytes));
}

/* END: a final state; a committed refit moves the model's installed version. */
void
coord_refit_note_end(coord_t *c, refit_rec_t *r)
{
	r->retry_at_ms = 0;
	r->finished_ms = coord_now_ms();
	coord_slices_free(r);
	if (r->fsm.state == REFIT_FSM_COMMITTED) {
		free(r->failure);   /* an earlier attempt's failure is in attempts */
		r->failure = NULL;
	}
	/* each instance's installed version, the model's (coord_refit_nodes.c) */
	coord_refit_instances_end(c, r, r->fsm.state == REFIT_FSM_COMMITTED);
	if (r->fsm.state == REFIT_FSM_COMMITTED)
		coord_delta_committed(c, r);
	log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %s%s%s", r->id, r->model,
		 r->version, coord_refit_public_name(r), r->failure ? ": " : "",
		 r->failure ? r->failure : "");
}

/* After the bookkeeping: metrics follow every change of state (p: the plan,
 * when one was just taken); the state file every change clients can see. */
void
coord_refit_settle(coord_t *c, refit_rec_t *r, const refit_fsm_t *was, const plan_t *p)
{
	if (was->state == r->fsm.state && p == NULL)
		return;
	coord_metrics_refit(c, r, p);
	if (refit_fsm_public(was->state) != refit_fsm_public(r->fsm.state))
		coord_save(c);
}

/*
 * Does ev end the slices of a refit that failed with nothing but symptoms
 * (what peers saw: a transport's error, a deadline, an abort)?  Then the
 * nodes' reports together name the broken link (coord_refit_name_link); a
 * cause a node found itself (a CRC mismatch, a client gone, a poisoned
 * node) stays.
 */
bool
coord_refit_ends_on_symptoms(const refit_fsm_t *was, const refit_fsm_event_t *ev)
{
	bool report = ev->kind == REFIT_FSM_EV_SLICE_OK || ev->kind == REFIT_FSM_EV_SLICE_FAILED;
	bool cause = ev->kind == REFIT_FSM_EV_SLICE_FAILED && (!ev->u.slice.symptom || ev->final);

	if (!report || cause)
		return false;
	return was->state == REFIT_FSM_FAILING_SYMPTOM ||
	       (was->state == REFIT_FSM_RUNNING && ev->kind == REFIT_FSM_EV_SLICE_FAILED);
}

/*
 * The slices of r failed with symptoms only: name the broken link from
 * every node's report (coord_blame.c) as r's failure, both ends named; the
 * first report kept so far is logged.  Nothing changes when the reports
 * name no link.
 */
void
coord_refit_name_link(coord_t *c, refit_rec_t *r)
{
	const coord_blame_report_t **reps;
	const char **names, **eps;
	char line[REFIT_ERR_MSG_MAX];

	if (r->ntime == NULL || r->nnodes == 0)
		return;
	reps = xcalloc(r->nnodes, sizeof(*reps));
	names = xcalloc(r->nnodes, sizeof(*names));
	eps = xcalloc(r->nnodes, sizeof(*eps));
	for (size_t k = 0; k < r->nnodes; k++) {
		const member_t *m = coord_find_member(c, r->nodes[k]);

		reps[k] = &r->ntime[k].blame;
		names[k] = m ? m->node_id : "?";
		eps[k] = m ? m->data_ep : NULL;
	}
	if (coord_blame_name(reps, r->nnodes, names, eps, line, sizeof(line))) {
		log_warnx("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): %s (the first "
			  "report was: %s)", r->id, r->model, r->version, line,
			  r->failure ? r->failure : "none");
		free(r->failure);
		r->failure = xstrdup(line);
	}
	free(reps);
	free(names);
	free(eps);
}

/* A new round of node calls (or none): answers of the last one are stale. */
bool
coord_refit_new_round(refit_fsm_state_t from, refit_fsm_state_t to)
{
	const char *a = refit_fsm_info(from)->call, *b = refit_fsm_info(to)->call;

	return from != to && (b == NULL || a == NULL || strcmp(a, b) != 0);
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

/* The index of member id among r's nodes, or SIZE_MAX. */
size_t
coord_refit_node_index(const refit_rec_t *r, uint64_t id)
{
	for (size_t k = 0; k < r->nnodes; k++)
		if (r->nodes[k] == id)
			return k;
	return SIZE_MAX;
}

/*
 * The slices' deadline (RunSliceRequest.timeout_ms): the operator's
 * slice_timeout_ms, else max(SLICE_FLOOR_MS, SLICE_MODEL_FACTOR x the
 * plan's modelled time, the busiest node's bytes at SLICE_FLOOR_BPS) (a
 * node's own slice_timeout_ms still overrides it there).
 */
uint64_t
coord_refit_slice_deadline_ms(const coord_t *c, const refit_rec_t *r)
{
	uint64_t ms = (r->model_us * SLICE_MODEL_FACTOR + 999) / 1000;
	uint64_t by_bytes = r->node_bytes / (SLICE_FLOOR_BPS / 1000);

	if (by_bytes > ms)
		ms = by_bytes;
	if (ms < SLICE_FLOOR_MS)
		ms = SLICE_FLOOR_MS;
	if (c->o.slice_timeout_ms)
		ms = c->o.slice_timeout_ms;
	if (ms > UINT32_MAX)
		ms = UINT32_MAX;
	log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): slice deadline %" PRIu64
		 " ms (%s; the plan's modelled time is %.3f ms, its busiest node moves %"
		 PRIu64 " bytes)", r->id, r->model, r->version, ms, c->o.slice_timeout_ms ?
		 "slice_timeout_ms" : "max(30 s, 4 x modelled, bytes at 100 MB/s)",
		 r->model_us / 1e3, r->node_bytes);
	return ms;
}

/* The index among r's nodes of the node called id, or SIZE_MAX. */
static size_t
node_index_by_id(coord_t *c, const refit_rec_t *r, const char *id)
{
	for (size_t k = 0; id != NULL && k < r->nnodes; k++) {
		const member_t *m = coord_find_member(c, r->nodes[k]);

		if (m != NULL && strcmp(m->node_id, id) == 0)
			return k;
	}
	return SIZE_MAX;
}

/* Node k's slice failed (st, msg): keep what it saw of its peers
 * (RunSliceResponse.peer_issues) for coord_refit_name_link. */
void
coord_refit_blame_keep(coord_t *c, refit_rec_t *r, size_t k, refit_status_t st, const char *msg,
	   const Refit__V1__RunSliceResponse *rs)
{
	coord_blame_report_t *b = &r->ntime[k].blame;

	if (b->how == COORD_BLAME_SILENT)
		return;   /* unreachable(), just before */
	memset(b, 0, sizeof(*b));
	if (st == REFIT_ERR_ABORTED || strstr(msg, "aborted by the coordinator") != NULL)
		b->how = COORD_BLAME_ABORTED;
	else if (st == REFIT_ERR_TIMEOUT)
		b->how = COORD_BLAME_DEADLINE;
	else
		b->how = COORD_BLAME_FAILED;
	for (size_t i = 0; rs != NULL && i < rs->n_peer_issues; i++) {
		const Refit__V1__PeerIssue *pi = rs->peer_issues[i];
		size_t p = node_index_by_id(c, r, pi->node_id);

		if (p != SIZE_MAX && p != k)
			coord_blame_add(b, (int)pi->kind, (uint32_t)p, pi->messages, pi->detail);
	}
}

/* Node k's slice runs (its RunSlice was answered, or it already reported). */
void
coord_refit_mark_started(refit_rec_t *r, size_t k)
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

/*
 * A node answered: the refit it belongs to, if the answer is still wanted
 * (the refit is in the phase the call was made in, and not final), and the
 * member that answered.  Counts the call as done.
 */
refit_rec_t *
coord_refit_answer_of(const nctx_t *x, member_t **m)
{
	coord_t *c = x->c;
	refit_rec_t *r = c->closing ? NULL : coord_find_refit(c, x->refit_id);

	c->inflight--;
	*m = c->closing ? NULL : coord_find_member(c, x->member_id);
	return r != NULL && r->phase == x->phase && !coord_refit_is_final(r) ? r : NULL;
}

/* Node k's slice succeeded: what its SliceDone (rs) reports, added to r
 * (bytes, the delta's, the slowest node's comm and stage times). */
void
coord_refit_note_slice(refit_rec_t *r, size_t k, const Refit__V1__RunSliceResponse *rs)
{
	coord_delta_note(r, k, rs);
	r->delta_wire += rs->delta_wire_bytes;
	r->delta_dense += rs->delta_dense_bytes;
	r->dense_wire += rs->dense_wire_bytes;
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
