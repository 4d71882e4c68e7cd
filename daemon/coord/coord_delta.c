/*
 * coord_delta.c - who holds which delta base (docs/delta.md, issue 26).
 *
 * The nodes keep, per message of a plan, the bytes they last sent and
 * received over tcp, tagged with the refit (id and attempt) that carried
 * them (daemon/node/delta_base.h).  The coordinator offers a refit the
 * tag of the model's last committed refit as its base only when that
 * refit ran the same plan (digest) in the same epoch, and names the nodes
 * that reported keeping every base of it: a unit goes encoded only
 * between two of them.  Anything else is dense: a new instance or layout
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
}

char **
coord_delta_offer(coord_t *c, refit_rec_t *r, model_t *m, uint64_t *tag, uint64_t *base,
		  size_t *n)
{
	char **ids = xcalloc(m->ndelta_members + 1, sizeof(*ids));

	*n = 0;
	*base = 0;
	if (r->only != NULL) {
		/* a catch-up: its own plan, sent once; it keeps no bases and
		 * leaves the model's plan's alone (its next refit stays delta) */
		r->delta_tag = r->delta_base = 0;
		*tag = 0;
		return ids;
	}
	r->delta_tag = m->delta_off ? 0 : r->id << 8 | (r->fsm.attempt & 0xffu);
	if (r->delta_tag && m->delta_tag && m->delta_epoch == r->epoch &&
	    strcmp(m->delta_digest, r->plan_digest) == 0) {
		*base = m->delta_tag;
		for (size_t i = 0; i < m->ndelta_members; i++) {
			member_t *mb = coord_find_member(c, m->delta_members[i]);

			if (mb != NULL)
				ids[(*n)++] = mb->node_id;
		}
	}
	r->delta_base = *base;
	*tag = r->delta_tag;
	/* the nodes rewrite their bases from now: none is known until this
	 * refit commits */
	forget(m);
	return ids;
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
}
