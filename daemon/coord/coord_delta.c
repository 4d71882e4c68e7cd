/*
 * coord_delta.c - who holds which delta base (docs/delta.md, issue 26).
 *
 * The nodes keep, per message of a plan, the bytes they last sent and
 * received over tcp, tagged with the refit (id and attempt) that carried
 * them (daemon/node/delta_base.h).  The coordinator offers a refit the
 * tag of the model's last committed refit as its base only when that
 * refit ran the same plan (digest) in the same epoch, names the nodes
 * that reported keeping its bases (a unit goes encoded only between two of
 * them) and the messages a receiver among them kept no base of (its
 * delta_base_bytes had no room: those messages go dense, no other).  Anything else is dense: a new instance or layout
 * (another plan), a restarted or new node (a new epoch), a failed or
 * aborted refit (the base is forgotten as soon as RunSlice goes out, and
 * only a commit names a new one), a catch-up (its own plan: it keeps no
 * bases and touches none, so the model's next refit is delta where its
 * bases allow), a coordinator restart (none of this is saved).  Nodes check the tag and a CRC-32C of
 * the base on every unit, so a wrong offer fails a refit, never a byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/coord/coord_internal.h"

static void
forget(model_t *m)
{
	m->delta_tag = 0;
	m->delta_epoch = 0;
	m->delta_digest[0] = '\0';
	free(m->delta_members);
	m->delta_members = NULL;
	m->ndelta_members = 0;
	coord_lacks_free(&m->delta_lacks, &m->ndelta_lacks);
}

/* The messages m's base lacks, as RunSliceRequest.delta_lacks (the strings
 * are m's: sent before m forgets them). */
static Refit__V1__DeltaLack **
offer_lacks(const model_t *m, size_t *n)
{
	Refit__V1__DeltaLack **v = xcalloc(m->ndelta_lacks + 1, sizeof(*v));

	for (size_t i = 0; i < m->ndelta_lacks; i++) {
		v[i] = xcalloc(1, sizeof(**v));
		refit__v1__delta_lack__init(v[i]);
		v[i]->from_node = m->delta_lacks[i].from;
		v[i]->to_node = m->delta_lacks[i].to;
		v[i]->msgs = m->delta_lacks[i].msgs;
		v[i]->n_msgs = m->delta_lacks[i].n;
	}
	*n = m->ndelta_lacks;
	return v;
}

void
coord_delta_offer(coord_t *c, refit_rec_t *r, model_t *m, Refit__V1__RunSliceRequest *rq)
{
	char **ids = xcalloc(m->ndelta_members + 1, sizeof(*ids));
	size_t n = 0;

	rq->delta_base = 0;
	rq->delta_lacks = NULL;
	rq->n_delta_lacks = 0;
	coord_lacks_free(&r->delta_lacks, &r->ndelta_lacks);  /* an attempt before */
	if (r->only != NULL) {
		/* a catch-up: its own plan, sent once; it keeps no bases and
		 * leaves the model's plan's alone (its next refit stays delta) */
		r->delta_tag = r->delta_base = 0;
		rq->delta_tag = 0;
		rq->delta_nodes = ids;
		rq->n_delta_nodes = 0;
		return;
	}
	r->delta_tag = m->delta_off ? 0 : r->id << 8 | (r->fsm.attempt & 0xffu);
	if (r->delta_tag && m->delta_tag && m->delta_epoch == r->epoch &&
	    strcmp(m->delta_digest, r->plan_digest) == 0) {
		rq->delta_base = m->delta_tag;
		for (size_t i = 0; i < m->ndelta_members; i++) {
			member_t *mb = coord_find_member(c, m->delta_members[i]);

			if (mb != NULL)
				ids[n++] = mb->node_id;
		}
		rq->delta_lacks = offer_lacks(m, &rq->n_delta_lacks);
		/* the request owns the lacks now (freed by coord_delta_offer_free) */
		for (size_t i = 0; i < m->ndelta_lacks; i++)
			m->delta_lacks[i] = (coord_lack_t){0};
	}
	r->delta_base = rq->delta_base;
	rq->delta_tag = r->delta_tag;
	rq->delta_nodes = ids;
	rq->n_delta_nodes = n;
	/* the nodes rewrite their bases from now: none is known until this
	 * refit commits */
	forget(m);
}

void
coord_delta_offer_free(Refit__V1__RunSliceRequest *rq)
{
	for (size_t i = 0; i < rq->n_delta_lacks; i++) {
		free(rq->delta_lacks[i]->from_node);
		free(rq->delta_lacks[i]->to_node);
		free(rq->delta_lacks[i]->msgs);
		free(rq->delta_lacks[i]);
	}
	free(rq->delta_lacks);
	free(rq->delta_nodes);
	rq->delta_lacks = NULL;
	rq->delta_nodes = NULL;
	rq->n_delta_lacks = rq->n_delta_nodes = 0;
}

void
coord_delta_evicted(coord_t *c, const refit_rec_t *r, size_t k,
		    const Refit__V1__RunSliceResponse *rs)
{
	for (size_t i = 0; i < rs->n_delta_evicted; i++) {
		model_t *m = coord_find_model(c, rs->delta_evicted[i]);

		for (size_t j = 0; m != NULL && j < m->ndelta_members;)
			if (m->delta_members[j] == r->nodes[k])
				m->delta_members[j] = m->delta_members[--m->ndelta_members];
			else
				j++;
	}
}

void
coord_delta_note(refit_rec_t *r, size_t k, const Refit__V1__RunSliceResponse *rs)
{
	if (!rs->bases_kept)
		return;
	r->nstate[k] |= NODE_KEPT;
	for (size_t i = 0; i < rs->n_delta_lacks; i++) {
		const Refit__V1__DeltaLack *l = rs->delta_lacks[i];
		coord_lack_t *x;

		if (l->n_msgs == 0)
			continue;
		r->delta_lacks = xreallocarray(r->delta_lacks, r->ndelta_lacks + 1,
					       sizeof(*r->delta_lacks));
		x = &r->delta_lacks[r->ndelta_lacks++];
		x->from = xstrdup(l->from_node);
		x->to = xstrdup(l->to_node);
		x->msgs = xmalloc(l->n_msgs * sizeof(*l->msgs));
		memcpy(x->msgs, l->msgs, l->n_msgs * sizeof(*l->msgs));
		x->n = l->n_msgs;
	}
}

void
coord_delta_committed(coord_t *c, refit_rec_t *r)
{
	model_t *m = coord_find_model(c, r->model);

	if (m == NULL || r->delta_tag == 0 || r->nstate == NULL)
		return;
	forget(m);
	m->delta_tag = r->delta_tag;
	m->delta_epoch = r->epoch;
	snprintf(m->delta_digest, sizeof(m->delta_digest), "%s", r->plan_digest);
	m->delta_members = xcalloc(r->nnodes + 1, sizeof(*m->delta_members));
	for (size_t k = 0; k < r->nnodes; k++)
		if (r->nstate[k] & NODE_KEPT)
			m->delta_members[m->ndelta_members++] = r->nodes[k];
	/* the messages the nodes kept no base of go dense next time */
	m->delta_lacks = r->delta_lacks;
	m->ndelta_lacks = r->ndelta_lacks;
	r->delta_lacks = NULL;
	r->ndelta_lacks = 0;
}
