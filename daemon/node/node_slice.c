/*
 * node_slice.c - the slice of a plan a node receives in RunSlice
 * (docs/control-plane.md, "slices"), checked once at the edge: the node
 * does not plan, so nothing the coordinator sends is run before it passed
 * here.  Every record must name ranks of the epoch's members, one of them
 * this node's (but in a whole plan, sent to grouped transports), a stage
 * of the plan, a tensor of the plan's table (the composed destination
 * layouts, converted), a box inside that tensor; records come in plan
 * order (stage, from, to), which the message rule relies on.  Errors name
 * the record.  Loop thread.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"

bool
node_serves(const node_t *n, int32_t r)
{
	for (size_t i = 0; i < n->nranks; i++)
		if (n->ranks[i] == r)
			return true;
	return false;
}

/* "record i (stage s, rank a -> b, tensor "t")" into buf, for errors. */
static const char *
rec_name(char *buf, size_t len, size_t i, const plan_xfer_t *x, const plan_t *p)
{
	snprintf(buf, len, "slice record %zu (stage %u, rank %d -> %d, tensor \"%s\")", i,
		 x->stage, x->from, x->to, p->tensors[x->tensor].name);
	return buf;
}

/* The checks of one decoded record (x, the i-th) against p and the epoch. */
static refit_status_t
check_rec(const node_t *n, const plan_t *p, const plan_layout_set_t *dst,
	  const plan_topo_t *topo, bool whole, size_t i, refit_err_t *err)
{
	const plan_xfer_t *x = &p->xfers[i], *prev = i ? &p->xfers[i - 1] : NULL;
	const plan_layout_t *t = &dst->v[x->tensor];
	const plan_box_t *b = plan_xfer_box(p, x);
	char what[200];

	if (x->stage >= p->nstages)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: the plan has %u stages",
				     rec_name(what, sizeof(what), i, x, p), p->nstages);
	if (plan_topo_node(topo, x->from) < 0 || plan_topo_node(topo, x->to) < 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: rank %d is no member's in "
				     "epoch %" PRIu64, rec_name(what, sizeof(what), i, x, p),
				     plan_topo_node(topo, x->from) < 0 ? x->from : x->to,
				     n->prepared_epoch);
	if (!whole && !node_serves(n, x->from) && !node_serves(n, x->to))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: neither rank is this "
				     "node's", rec_name(what, sizeof(what), i, x, p));
	if (prev != NULL && (prev->stage > x->stage ||
			     (prev->stage == x->stage && (prev->from > x->from ||
							  (prev->from == x->from &&
							   prev->to > x->to)))))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: out of plan order (after "
				     "stage %u, rank %d -> %d)", rec_name(what, sizeof(what), i,
				     x, p), prev->stage, prev->from, prev->to);
	for (int d = 0; d < t->ndim; d++)
		if (b->size[d] < 1 || b->off[d] < 0 || b->off[d] > t->shape[d] - b->size[d])
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: dim %d of its box "
					     "(offset %" PRId64 ", size %" PRId64 ") is not inside "
					     "the tensor (%" PRId64 ")", rec_name(what, sizeof(what),
					     i, x, p), d, b->off[d], b->size[d],
					     t->shape[d]);
	return REFIT_OK;
}

refit_status_t
node_slice_take(const node_t *n, const Refit__V1__RunSliceRequest *rq,
		const plan_layout_set_t *dst, const plan_topo_t *topo, const plan_opts_t *o,
		plan_t *out, refit_err_t *err)
{
	const uint8_t *b = rq->slice_xfers.data;
	size_t len = rq->slice_xfers.len, nx = rq->slice_nxfers;
	int *ndim;
	refit_status_t rc;

	memset(out, 0, sizeof(*out));
	if (rq->plan_tensors == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "RunSlice carries no slice of the "
				     "plan (a coordinator older than this node?)");
	if (rq->plan_tensors != dst->n)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "the slice's plan has %u tensors, "
				     "the layouts in RunSlice %zu", rq->plan_tensors, dst->n);
	if (nx > len / CONV_SLICE_HEAD || (uint64_t)nx > rq->plan_xfers)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "the slice claims %zu transfers "
				     "in %zu bytes, of a plan of %" PRIu64, nx, len,
				     rq->plan_xfers);
	if (rq->slice_whole && (uint64_t)nx != rq->plan_xfers)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "a whole plan of %" PRIu64
				     " transfers came with %zu", rq->plan_xfers, nx);
	if (nx > 0 && (rq->plan_stages == 0 || rq->plan_stages > NODE_SLICE_MAX_STAGES ||
		       rq->plan_stages_per_round == 0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "the slice's plan has %u stages "
				     "(%u per round): out of range (1 to %u)", rq->plan_stages,
				     rq->plan_stages_per_round, NODE_SLICE_MAX_STAGES);
	out->opts = *o;
	out->ntensors = (uint32_t)dst->n;
	out->tensors = xcalloc(dst->n ? dst->n : 1, sizeof(*out->tensors));
	ndim = xcalloc(dst->n ? dst->n : 1, sizeof(*ndim));
	for (size_t t = 0; t < dst->n; t++) {
		out->tensors[t].name = xstrdup(dst->v[t].name);
		out->tensors[t].dtype = dst->v[t].dtype;
		out->tensors[t].ndim = ndim[t] = dst->v[t].ndim;
		out->tensors[t].elem = (uint32_t)plan_dtype_size(dst->v[t].dtype);
	}
	out->nstages = rq->plan_stages;
	out->stages_per_round = rq->plan_stages_per_round ? rq->plan_stages_per_round : 1;
	snprintf(out->digest_hex, sizeof(out->digest_hex), "%s", rq->plan_digest ?
		 rq->plan_digest : "");
	out->xfers = xcalloc(nx ? nx : 1, sizeof(*out->xfers));
	out->nxfers = nx;
	out->boxes = xcalloc(nx ? nx : 1, sizeof(*out->boxes));  /* one per record */
	out->nboxes = nx;
	rc = conv_slice_get(b, len, nx, ndim, out->ntensors, out->xfers, out->boxes, err);
	free(ndim);
	for (size_t i = 0; i < nx && rc == REFIT_OK; i++)
		rc = check_rec(n, out, dst, topo, rq->slice_whole, i, err);
	if (rc != REFIT_OK)
		plan_fini(out);
	return rc;
}
