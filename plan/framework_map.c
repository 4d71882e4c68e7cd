/*
 * framework_map.c - what a framework map is checked against, and how it
 * becomes the explicit layouts the planner takes (see framework.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/framework.h"

/* A region of a parameter: a piece (its box's sizes on the trailing dims,
 * 1 on the leading ones) or a padding box. */
typedef struct region {
	int64_t at[PLAN_MAX_DIMS], size[PLAN_MAX_DIMS];
	size_t src;             /* piece index, or pads index + npieces */
} region_t;

static int
region_cmp(const void *x, const void *y)
{
	const region_t *a = x, *b = y;

	return a->at[0] < b->at[0] ? -1 : a->at[0] > b->at[0];
}

static void
region_of_piece(const plan_fw_map_t *m, const plan_fw_param_t *p, size_t i, region_t *r)
{
	const plan_fw_piece_t *pc = &m->pieces.v[p->piece0 + i];
	int shift = p->ndim - m->tensors.v[pc->tensor].ndim;

	for (int d = 0; d < p->ndim; d++) {
		r->at[d] = pc->at[d];
		r->size[d] = d < shift ? 1 : pc->box.size[d - shift];
	}
	r->src = i;
}

static refit_status_t
region_where(const plan_fw_map_t *m, const plan_fw_param_t *p, const region_t *r, char *buf,
	     size_t n)
{
	if (r->src < p->npieces) {
		const plan_fw_piece_t *pc = &m->pieces.v[p->piece0 + r->src];

		snprintf(buf, n, "the piece of \"%s\" at [%" PRId64 ", ...]",
			 m->tensors.v[pc->tensor].name, r->at[0]);
	} else {
		snprintf(buf, n, "the padding at [%" PRId64 ", ...]", r->at[0]);
	}
	return REFIT_OK;
}

/* One parameter: every region inside it and inside its tensor, dtypes
 * equal, regions disjoint (a sweep on dim 0), volumes adding up. */
static refit_status_t
check_param(const plan_fw_map_t *m, const plan_fw_param_t *p, refit_err_t *err)
{
	size_t n = p->npieces + p->npads;
	region_t *r = xcalloc(n ? n : 1, sizeof(*r));
	int64_t vol = 1, sum = 0;
	char w1[256], w2[256];
	refit_status_t rc = REFIT_OK;

	for (int d = 0; d < p->ndim; d++)
		vol *= p->shape[d];
	for (size_t i = 0; i < p->npieces && rc == REFIT_OK; i++) {
		const plan_fw_piece_t *pc = &m->pieces.v[p->piece0 + i];
		const plan_fw_tensor_t *t = &m->tensors.v[pc->tensor];

		region_of_piece(m, p, i, &r[i]);
		if (t->ndim > p->ndim || t->dtype != p->dtype ||
		    !plan_box_in_bounds(&pc->box, t->shape, t->ndim))
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "parameter \"%s\" (rank %d): "
					   "its piece of \"%s\" is not inside that tensor, or of "
					   "another dtype or more dims", p->name, p->rank, t->name);
	}
	for (size_t i = 0; i < p->npads; i++) {
		region_t *x = &r[p->npieces + i];

		memcpy(x->at, m->pads.v[p->pad0 + i].off, sizeof(x->at));
		memcpy(x->size, m->pads.v[p->pad0 + i].size, sizeof(x->size));
		x->src = p->npieces + i;
	}
	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		plan_box_t b;

		memcpy(b.off, r[i].at, sizeof(b.off));
		memcpy(b.size, r[i].size, sizeof(b.size));
		sum += plan_box_volume(&b, p->ndim);
		if (!plan_box_in_bounds(&b, p->shape, p->ndim)) {
			region_where(m, p, &r[i], w1, sizeof(w1));
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "parameter \"%s\" (rank %d): "
					   "%s lies outside it", p->name, p->rank, w1);
		}
	}
	xqsort(r, n, sizeof(*r), region_cmp);
	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		plan_box_t a;

		memcpy(a.off, r[i].at, sizeof(a.off));
		memcpy(a.size, r[i].size, sizeof(a.size));
		for (size_t j = i + 1; j < n && r[j].at[0] < a.off[0] + a.size[0]; j++) {
			plan_box_t b;

			memcpy(b.off, r[j].at, sizeof(b.off));
			memcpy(b.size, r[j].size, sizeof(b.size));
			if (!plan_box_overlaps(&a, &b, p->ndim))
				continue;
			region_where(m, p, &r[i], w1, sizeof(w1));
			region_where(m, p, &r[j], w2, sizeof(w2));
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "parameter \"%s\" (rank %d): "
					   "%s overlaps %s", p->name, p->rank, w1, w2);
			break;
		}
	}
	if (rc == REFIT_OK && sum != vol)
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "parameter \"%s\" (rank %d): its "
				   "pieces and padding cover %" PRId64 " of its %" PRId64
				   " elements", p->name, p->rank, sum, vol);
	free(r);
	return rc;
}

refit_status_t
plan_fw_map_check_with(const plan_fw_map_t *m, const plan_layout_set_t *s, refit_err_t *err)
{
	for (size_t i = 0; i < m->params.n; i++)
		CHECK(check_param(m, &m->params.v[i], err));
	for (size_t i = 0; i < s->n; i++) {
		refit_status_t rc = plan_layout_check_coverage(&s->v[i], err);

		if (rc != REFIT_OK) {
			refit_err_prefix(err, "%s map", plan_fw_name(m->fw));
			return rc;
		}
	}
	return REFIT_OK;
}

refit_status_t
plan_fw_map_check(const plan_fw_map_t *m, refit_err_t *err)
{
	plan_layout_set_t s;
	refit_status_t rc;

	CHECK(plan_fw_map_layouts(m, 0, &s, err));
	rc = plan_fw_map_check_with(m, &s, err);
	plan_layout_set_fini(&s);
	return rc;
}

refit_status_t
plan_fw_map_layouts(const plan_fw_map_t *m, int32_t base, plan_layout_set_t *out,
		    refit_err_t *err)
{
	size_t nt = m->tensors.n, *count = xcalloc(nt ? nt : 1, sizeof(*count));
	plan_shard_t **sh = xcalloc(nt ? nt : 1, sizeof(*sh));
	refit_status_t rc = REFIT_OK;

	plan_layout_set_init(out);
	for (size_t i = 0; i < m->pieces.n; i++)
		count[m->pieces.v[i].tensor]++;
	for (size_t t = 0; t < nt; t++)
		sh[t] = xcalloc(count[t] ? count[t] : 1, sizeof(**sh));
	memset(count, 0, nt * sizeof(*count));
	for (size_t i = 0; i < m->params.n; i++) {
		const plan_fw_param_t *p = &m->params.v[i];

		for (size_t k = 0; k < p->npieces; k++) {
			const plan_fw_piece_t *pc = &m->pieces.v[p->piece0 + k];
			plan_shard_t *s = &sh[pc->tensor][count[pc->tensor]++];

			s->rank = p->rank + base;
			s->box = pc->box;
		}
	}
	for (size_t t = 0; t < nt && rc == REFIT_OK; t++) {
		const plan_fw_tensor_t *ft = &m->tensors.v[t];
		plan_layout_t l;

		rc = plan_layout_init_explicit(&l, ft->name, ft->dtype, ft->ndim, ft->shape, sh[t],
					       count[t], err);
		if (rc == REFIT_OK && ft->scale >= 0) {
			plan_convert_t cv = {ft->from, PLAN_SCALE_BLOCK, 2,
					     {m->fp8_block, m->fp8_block},
					     m->tensors.v[ft->scale].name};

			l.conv = plan_convert_dup(&cv);
		}
		if (rc == REFIT_OK)
			plan_layout_set_add(out, &l);
	}
	for (size_t t = 0; t < nt; t++)
		free(sh[t]);
	free(sh);
	free(count);
	return plan_layout_set_finish(out, rc, err);
}
