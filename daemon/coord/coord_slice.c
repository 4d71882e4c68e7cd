/*
 * coord_slice.c - each node's slice of a refit's plan (docs/control-plane.md,
 * "slices"): the transfers in which one of its ranks sends or receives,
 * encoded (rpc/proto_conv.h, conv_slice_put) once per node when the refit
 * is prepared, kept with the refit until its RunSlice calls are made, and
 * attached to each node's RunSliceRequest.  Nodes do not plan.
 *
 * Grouped transports (nccl) get the whole plan: there every node posts its
 * sends and receives in NCCL groups whose buckets come from the global
 * message order (daemon/node/slice.c), which a slice cannot reproduce.
 * Loop thread only.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "daemon/coord/coord_internal.h"
#include "rpc/proto_conv.h"

struct coord_slices {
	uint64_t *member;   /* member ids, one slice each */
	strbuf_t *buf;      /* the encoded records */
	uint32_t *n;        /* records */
	size_t nmembers;
	bool whole;         /* one slice, the whole plan, for every member */
	uint32_t nstages, stages_per_round, ntensors;
	uint64_t nxfers;
};

void
coord_slices_free(refit_rec_t *r)
{
	coord_slices_t *s = r->slices;

	if (s == NULL)
		return;
	for (size_t i = 0; i < s->nmembers; i++)
		strbuf_fini(&s->buf[i]);
	free(s->buf);
	free(s->n);
	free(s->member);
	free(s);
	r->slices = NULL;
}

/* Append transfer x to slice k (once per slice). */
static void
put(coord_slices_t *s, size_t k, const plan_t *p, const plan_xfer_t *x)
{
	conv_slice_put(p, x, &s->buf[k]);
	s->n[k]++;
}

void
coord_slices_make(coord_t *c, refit_rec_t *r, const plan_t *p, bool whole)
{
	coord_slices_t *s = xcalloc(1, sizeof(*s));
	int32_t maxr = -1;
	size_t *where;

	coord_slices_free(r);
	r->slices = s;
	r->plan_xfers = p->nxfers;
	s->whole = whole;
	s->nstages = p->nstages;
	s->stages_per_round = p->stages_per_round;
	s->ntensors = p->ntensors;
	s->nxfers = p->nxfers;
	s->nmembers = s->whole ? 1 : c->members.n;
	s->member = xcalloc(s->nmembers + 1, sizeof(*s->member));
	s->buf = xcalloc(s->nmembers + 1, sizeof(*s->buf));
	s->n = xcalloc(s->nmembers + 1, sizeof(*s->n));
	for (size_t i = 0; i < s->nmembers; i++) {
		strbuf_init(&s->buf[i]);
		if (!s->whole)
			s->member[i] = c->members.v[i].id;
	}
	if (s->whole) {
		for (size_t x = 0; x < p->nxfers; x++)
			put(s, 0, p, &p->xfers[x]);
		return;
	}
	/* rank -> member: one pass over the plan */
	for (size_t i = 0; i < c->members.n; i++)
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			if (c->members.v[i].ranks[k].rank > maxr)
				maxr = c->members.v[i].ranks[k].rank;
	where = xmalloc(((size_t)maxr + 2) * sizeof(*where));
	for (int32_t rk = 0; rk <= maxr; rk++)
		where[rk] = SIZE_MAX;
	for (size_t i = 0; i < c->members.n; i++)
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			if (c->members.v[i].ranks[k].rank >= 0)
				where[c->members.v[i].ranks[k].rank] = i;
	for (size_t x = 0; x < p->nxfers; x++) {
		const plan_xfer_t *xf = &p->xfers[x];
		size_t f = xf->from >= 0 && xf->from <= maxr ? where[xf->from] : SIZE_MAX;
		size_t t = xf->to >= 0 && xf->to <= maxr ? where[xf->to] : SIZE_MAX;

		if (f != SIZE_MAX)
			put(s, f, p, xf);
		if (t != SIZE_MAX && t != f)
			put(s, t, p, xf);
	}
	free(where);
}

void
coord_slice_attach(const refit_rec_t *r, uint64_t member_id, ProtobufCMessage *req)
{
	Refit__V1__RunSliceRequest *rq = (Refit__V1__RunSliceRequest *)req;
	const coord_slices_t *s = r->slices;
	size_t k = 0;

	if (req->descriptor != &refit__v1__run_slice_request__descriptor)
		return;
	/* no slice (none made, or a member that joined since): the node
	 * refuses a RunSlice without one, naming it */
	rq->slice_xfers.data = NULL;
	rq->slice_xfers.len = 0;
	rq->slice_nxfers = 0;
	rq->plan_stages = rq->plan_stages_per_round = rq->plan_tensors = 0;
	rq->plan_xfers = 0;
	rq->slice_whole = false;
	if (s == NULL)
		return;
	while (!s->whole && k < s->nmembers && s->member[k] != member_id)
		k++;
	if (k == s->nmembers) {
		log_warnx("coordinator: refit %" PRIu64 ": member %" PRIu64 " has no slice", r->id,
			  member_id);
		return;
	}
	rq->slice_xfers.data = (uint8_t *)s->buf[k].s;
	rq->slice_xfers.len = s->buf[k].len;
	rq->slice_nxfers = s->n[k];
	rq->slice_whole = s->whole;
	rq->plan_stages = s->nstages;
	rq->plan_stages_per_round = s->stages_per_round;
	rq->plan_tensors = s->ntensors;
	rq->plan_xfers = s->nxfers;
}
