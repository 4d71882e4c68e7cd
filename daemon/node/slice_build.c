/*
 * slice_build.c - a slice's tables (see slice_internal.h): the messages this
 * node sends or receives, kept from the plan with their parts, each part's
 * dependencies on the received parts it relays, and at begin the packed
 * buffers and the parts ready at once.  Calls slice_stream.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/node/slice_internal.h"

/* Node of rank r (SIZE_MAX: none). */
static size_t
node_of(const slice_cfg_t *c, int32_t r)
{
	for (size_t i = 0; i < c->nnodes; i++)
		for (size_t k = 0; k < c->nodes[i].nranks; k++)
			if (c->nodes[i].ranks[k] == r)
				return i;
	return SIZE_MAX;
}

/* A received part: which rank holds which box after which part. */
typedef struct held {
	int32_t rank;
	uint32_t tensor, stage;
	uint32_t part;
	plan_box_t box;
} held_t;

static int
cmp_held(const void *a, const void *b)
{
	const held_t *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/*
 * Dependencies: a part sent (or copied) by rank r in stage s > 0 packs
 * data r received earlier (forwards, relays); it waits for exactly the
 * arrived parts at r, of earlier stages, whose boxes overlap it.  Data
 * from r's own training or inference memory needs nothing.  So a relay
 * goes as soon as its piece is here, not when its whole message or the
 * whole stage is: the stages pipeline, part by part.  Edges follow stages
 * upwards: no cycle, no deadlock.
 */
static void
link_deps(slice_t *s)
{
	VEC(held_t) h = {0};
	VEC(uint32_t) *adj = xcalloc(s->parts.n + 1, sizeof(*adj));
	uint32_t *stamp = xcalloc(s->parts.n + 1, sizeof(*stamp));

	for (size_t i = 0; i < s->msgs.n; i++) {
		smsg_t *m = &s->msgs.v[i];
		const plan_msg_t *pm = slice_msg_at(s, i);

		if (m->kind == M_OUT)
			continue;
		for (uint32_t k = 0; k < pm->nparts; k++) {
			held_t e = {pm->to, s->c->plan->xfers[pm->parts[k].xfer].tensor,
				    pm->stage, (uint32_t)(m->part0 + k), pm->parts[k].box};

			VEC_PUSH(&h, e);
		}
	}
	xqsort(h.v, h.n, sizeof(*h.v), cmp_held);
	for (size_t i = 0; i < s->msgs.n; i++) {
		smsg_t *m = &s->msgs.v[i];
		const plan_msg_t *pm = slice_msg_at(s, i);

		if (m->kind == M_IN || pm->stage == 0)
			continue;
		for (uint32_t k = 0; k < pm->nparts; k++) {
			uint32_t t = s->c->plan->xfers[pm->parts[k].xfer].tensor;
			uint32_t me = (uint32_t)(m->part0 + k);
			held_t key = {.rank = pm->from, .tensor = t};
			int nd = s->c->plan->tensors[t].ndim;
			size_t lo = 0, hi = h.n;

			while (lo < hi) { /* first entry of (rank, tensor) */
				size_t mid = (lo + hi) / 2;

				if (cmp_held(&h.v[mid], &key) < 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			for (size_t e = lo; e < h.n && cmp_held(&h.v[e], &key) == 0; e++) {
				uint32_t src = h.v[e].part;

				if (h.v[e].stage >= pm->stage || stamp[src] == me + 1 ||
				    !plan_box_overlaps(&h.v[e].box, &pm->parts[k].box, nd))
					continue;
				stamp[src] = me + 1;
				VEC_PUSH(&adj[src], me);
				s->sp.v[me].ndeps++;
			}
		}
	}
	for (size_t p = 0; p < s->parts.n; p++) {
		s->sp.v[p].dep0 = (uint32_t)s->deps.n;
		s->sp.v[p].ndep = (uint32_t)adj[p].n;
		for (size_t k = 0; k < adj[p].n; k++)
			VEC_PUSH(&s->deps, adj[p].v[k]);
		VEC_FREE(&adj[p]);
	}
	free(adj);
	free(stamp);
	VEC_FREE(&h);
}

/* Keep the messages this node sends or receives. */
refit_status_t
slice_collect(slice_t *s, refit_err_t *err)
{
	const slice_cfg_t *c = s->c;
	int32_t maxr = -1;
	size_t *where;
	plan_msgs_t it;
	plan_msg_t m;

	for (size_t i = 0; i < c->nnodes; i++)
		for (size_t k = 0; k < c->nodes[i].nranks; k++)
			if (c->nodes[i].ranks[k] > maxr)
				maxr = c->nodes[i].ranks[k];
	where = xmalloc(((size_t)maxr + 1) * sizeof(*where));
	for (int32_t r = 0; r <= maxr; r++)
		where[r] = node_of(c, r);
	plan_msgs_init(&it, c->plan, 0, c->plan->nxfers);
	while (plan_msgs_next(&it, &m)) {
		size_t f = m.from <= maxr ? where[m.from] : SIZE_MAX;
		size_t t = m.to <= maxr ? where[m.to] : SIZE_MAX;
		smsg_t sm = {.m = m, .part0 = s->parts.n};

		if (f == SIZE_MAX || t == SIZE_MAX) {
			plan_msgs_fini(&it);
			free(where);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "the plan moves data from "
					     "rank %d to rank %d, and one of them belongs to no "
					     "node of the epoch", m.from, m.to);
		}
		if (f != c->self && t != c->self)
			continue;
		for (uint32_t k = 0; k < m.nparts; k++) {
			VEC_PUSH(&s->parts, m.parts[k]);
			VEC_PUSH(&s->sp, ((spart_t){.msg = (uint32_t)s->msgs.n}));
		}
		sm.m.parts = NULL;
		sm.nleft = m.nparts;
		if (f == c->self && t == c->self) {
			sm.kind = M_LOCAL;
			s->local_left++;
		} else if (f == c->self) {
			sm.kind = M_OUT;
			sm.peer = (uint32_t)t;
			sm.pos = (uint32_t)s->out[t].n;
			VEC_PUSH(&s->out[t], s->msgs.n);
			s->out_left++;
		} else {
			sm.kind = M_IN;
			sm.peer = (uint32_t)f;
			sm.pos = (uint32_t)s->in[f].n;
			VEC_PUSH(&s->in[f], s->msgs.n);
			s->in_left++;
		}
		/* buffers are sized by what each peer really exchanges, not the bound */
		if (f == c->self && m.bytes > s->out_max[t])
			s->out_max[t] = m.bytes;
		if (t == c->self && f != c->self && m.bytes > s->in_max[f])
			s->in_max[f] = m.bytes;
		s->stage_left[m.stage]++;
		VEC_PUSH(&s->msgs, sm);
	}
	plan_msgs_fini(&it);
	free(where);
	link_deps(s);
	return REFIT_OK;
}

/* Start: every part whose data is here already (a snapshot: what becomes
 * ready while local copies run is queued by slice_finished()). */
static refit_status_t
start_ready(slice_t *s, refit_err_t *err)
{
	size_t nlocal = 0;

	for (size_t p = 0; p < s->parts.n; p++) {
		const smsg_t *m = &s->msgs.v[s->sp.v[p].msg];

		if (s->sp.v[p].ndeps != 0 || m->kind == M_IN)
			continue;
		if (m->kind == M_OUT)
			VEC_PUSH(&s->ready[m->peer], p);
		else {
			VEC_PUSH(&s->work, p);
			nlocal++;
		}
	}
	/* the stack runs the last first: local parts in plan order */
	for (size_t k = 0; k < nlocal / 2; k++) {
		size_t t = s->work.v[k];

		s->work.v[k] = s->work.v[nlocal - 1 - k];
		s->work.v[nlocal - 1 - k] = t;
	}
	return slice_finished(s, err);
}

/* ---- the stream form (tcp) ----------------------------------------------------- */

/* Before the first pull: one packed buffer per peer (and one for local
 * copies), sized by the largest message it carries; then what needs no
 * transfer runs. */
refit_status_t
slice_begin(void *arg, refit_err_t *err)
{
	slice_t *s = arg;
	const slice_cfg_t *c = s->c;

	for (size_t i = 0; i < c->nnodes; i++) {
		uint64_t bytes = s->out_max[i] + s->trail;

		if (s->out[i].n == 0 && !(i == c->self && s->local_left))
			continue;
		s->buf[i] = c->pool ? dp_pool_get(c->pool, bytes) : xmalloc(bytes + 1);
		if (s->buf[i] == NULL)
			return refit_err_set(err, REFIT_ERR_NOMEM, "slice: cannot map a %" PRIu64
					     "-byte message buffer", bytes);
	}
	return start_ready(s, err);
}
