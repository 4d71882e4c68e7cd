/*
 * conv_dev.c - conversion on a device as kernel launches (see conv_dev.h).
 */
#include <string.h>

#include "dataplane/conv_dev.h"

refit_status_t
dp_dev_quant_ok(const dp_quant_t *q, const char *name, refit_err_t *err)
{
	for (int d = 0; d + 2 < q->ndim; d++)
		if (q->block[d] != 1 && q->shape[d] != 1)
			return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "conversion of \"%s\" on "
					     "the GPU: its scale block spans dim %d of %d (%lld); "
					     "the kernels take blocks over the two innermost dims",
					     name, d, q->ndim, (long long)q->block[d]);
	return REFIT_OK;
}

/* want's blocks: their element box b (clipped to the shape) and grid box g */
static void
block_hull(const dp_quant_t *q, const plan_box_t *want, plan_box_t *b, plan_box_t *g)
{
	for (int d = 0; d < q->ndim; d++) {
		int64_t lo = want->off[d] / q->block[d];
		int64_t hi = (want->off[d] + want->size[d] - 1) / q->block[d];
		int64_t end = (hi + 1) * q->block[d];

		g->off[d] = lo;
		g->size[d] = hi - lo + 1;
		b->off[d] = lo * q->block[d];
		b->size[d] = (end < q->shape[d] ? end : q->shape[d]) - b->off[d];
	}
}

uint64_t
dp_dev_quant_scratch(const dp_quant_t *q, const plan_box_t *want)
{
	plan_box_t b, g;

	block_hull(q, want, &b, &g);
	return dp_view_bytes(q->ndim, g.size, q->mx ? 1 : 4);
}

/* The 2-D geometry of view v (shard s) at global element g: its address,
 * row and column strides. */
static void
plane(const dp_view_t *v, const plan_shard_t *s, const int64_t *g, const void **p,
      int64_t *ld, int64_t *inc)
{
	int nd = v->ndim;

	*p = dp_view_at(v, s, g);
	*ld = nd >= 2 ? v->stride[nd - 2] : 0;
	*inc = nd >= 1 ? v->stride[nd - 1] : 0;
}

static void
rows_cols(int nd, const int64_t *size, int64_t *rows, int64_t *cols)
{
	*rows = nd >= 2 ? size[nd - 2] : 1;
	*cols = nd >= 1 ? size[nd - 1] : 1;
}

/* The next index over the leading dims (all but the two innermost) of a
 * box of `size`: false after the last. */
static bool
next_lead(int64_t *idx, int nd, const int64_t *size)
{
	int d;

	for (d = nd - 3; d >= 0 && ++idx[d] == size[d]; d--)
		idx[d] = 0;
	return d >= 0;
}

void
dp_dev_cvt_box(const dp_dev_ops_t *dev, int32_t rank, const dp_view_t *sv,
	       const plan_shard_t *ss, plan_dtype_t from, const dp_view_t *dv,
	       const plan_shard_t *ds, plan_dtype_t to, const plan_box_t *box)
{
	int nd = sv->ndim;
	int64_t idx[PLAN_MAX_DIMS] = {0}, g[PLAN_MAX_DIMS];
	dp_cvt_op_t op = {.op = DP_CVT_CAST, .from = from, .to = to, .br = 1, .bc = 1};

	if (plan_box_is_empty(box, nd))
		return;
	rows_cols(nd, box->size, &op.rows, &op.cols);
	do {
		const void *dp;

		for (int d = 0; d < nd; d++)
			g[d] = box->off[d] + (d + 2 < nd ? idx[d] : 0);
		plane(sv, ss, g, &op.src, &op.src_ld, &op.src_inc);
		plane(dv, ds, g, &dp, &op.dst_ld, &op.dst_inc);
		op.dst = (void *)dp;
		dev->convert(dev->ctx, rank, &op);
	} while (next_lead(idx, nd, box->size));
}

void
dp_dev_quant(const dp_dev_ops_t *dev, int32_t rank, const dp_quant_t *q, const dp_view_t *sv,
	     const plan_shard_t *ss, const plan_box_t *want, const dp_view_t *qv,
	     const plan_shard_t *qs, const dp_view_t *scv, const plan_shard_t *scs,
	     void *scratch)
{
	int nd = q->ndim, r = nd - 2, c = nd - 1;
	uint32_t se = q->mx ? 1 : 4;
	int64_t idx[PLAN_MAX_DIMS] = {0}, g[PLAN_MAX_DIMS];
	plan_box_t b, gb, part;
	plan_shard_t gs;
	dp_view_t tv;   /* the scratch: want's blocks' scales, contiguous */

	if (plan_box_is_empty(want, nd))
		return;
	if (q->to != PLAN_DT_FP8E4M3) {   /* a cast: no scales */
		if (qv)
			dp_dev_cvt_box(dev, rank, sv, ss, q->from, qv, qs, q->to, want);
		return;
	}
	block_hull(q, want, &b, &gb);
	dp_view_contiguous(&tv, scratch, nd, gb.size, se);
	dp_shard_of_box(&gs, &gb);
	do {
		dp_cvt_op_t op = {.op = DP_CVT_SCALES, .from = q->from, .to = q->to, .mx = q->mx,
				  .br = nd >= 2 ? q->block[r] : 1, .bc = nd >= 1 ? q->block[c] : 1};
		int64_t gg[PLAN_MAX_DIMS];
		const void *sp;

		for (int d = 0; d < nd; d++) {
			bool lead = d + 2 < nd;

			g[d] = (lead ? want->off[d] + idx[d] : b.off[d]);
			gg[d] = lead ? g[d] / q->block[d] : gb.off[d];
		}
		plane(sv, ss, g, &op.src, &op.src_ld, &op.src_inc);
		plane(&tv, &gs, gg, &sp, &op.scale_ld, &op.scale_inc);
		op.scale = (void *)sp;
		rows_cols(nd, b.size, &op.rows, &op.cols);
		dev->convert(dev->ctx, rank, &op);
		if (qv == NULL)
			continue;
		op.op = DP_CVT_QUANT;
		for (int d = nd - 2 < 0 ? 0 : nd - 2; d < nd; d++)
			g[d] = want->off[d];
		plane(sv, ss, g, &op.src, &op.src_ld, &op.src_inc);
		plane(qv, qs, g, &sp, &op.dst_ld, &op.dst_inc);
		op.dst = (void *)sp;
		rows_cols(nd, want->size, &op.rows, &op.cols);
		op.r0 = nd >= 2 ? want->off[r] - b.off[r] : 0;
		op.c0 = nd >= 1 ? want->off[c] - b.off[c] : 0;
		dev->convert(dev->ctx, rank, &op);
	} while (next_lead(idx, nd, want->size));
	if (scv == NULL)
		return;
	if (scv->ndim == 0) {   /* the tensor scale: the one block */
		dev->copy(dev->ctx, rank, scv->base, scratch, se);
		return;
	}
	if (plan_box_intersect(&gb, &scs->box, nd, &part))
		dev->copy_box(dev->ctx, rank, &tv, &gs, scv, scs, &part);
}
