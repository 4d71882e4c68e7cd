/*
 * framework_fsdp2.c - FSDP2 + TP maps: every Hugging Face tensor a DTensor
 * over [dp][tp] (the placements of fsdp2_rules in framework.c), each rank's
 * local tensor its parameter, the boxes from the DTensor resolution of
 * plan/layout.c, computed once per (shape, kind) and indexed by rank.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/fw_internal.h"

static int
cmp_shard_rank(const void *x, const void *y)
{
	const plan_shard_t *a = x, *b = y;

	if (a->rank != b->rank)
		return a->rank < b->rank ? -1 : 1;
	return a->local_off[0] < b->local_off[0] ? -1 : a->local_off[0] > b->local_off[0];
}

/* The shards of tensor t placed as `kind` over [dp][tp] (cached by shape). */
static refit_status_t
dt_get(fwgen_t *g, rule_kind_t kind, int32_t t, const dt_cache_t **out)
{
	const plan_fw_tensor_t *ft = fw_T(g, t);
	int64_t tp = g->par->tp, world = g->m->world, msh[2] = {g->par->dp, tp};
	plan_placement_t pl[2];
	char strided[64];
	const char *p0 = "Shard(0)", *p1 = "Replicate()";
	dt_cache_t c = {0};
	int32_t *mesh;
	refit_status_t rc;

	for (size_t i = 0; i < g->dt.n; i++) {
		dt_cache_t *x = &g->dt.v[i];

		if (x->kind == kind && x->ndim == ft->ndim &&
		    memcmp(x->shape, ft->shape, (size_t)ft->ndim * sizeof(x->shape[0])) == 0) {
			*out = x;
			return REFIT_OK;
		}
	}
	if ((kind == R_COL || kind == R_VOCAB) && tp > 1) {
		snprintf(strided, sizeof(strided), "_StridedShard(dim=0, split_factor=%" PRId64 ")",
			 tp);
		p0 = strided;
		p1 = "Shard(0)";
	} else if (kind == R_ROW) {
		p1 = "Shard(1)";
	}
	CHECK(plan_placement_parse(p0, &pl[0], ft->name, g->err));
	CHECK(plan_placement_parse(p1, &pl[1], ft->name, g->err));
	mesh = xmalloc((size_t)world * sizeof(*mesh));
	for (int64_t i = 0; i < world; i++)
		mesh[i] = (int32_t)i;
	rc = plan_layout_init_dtensor(&c.l, ft->name, ft->dtype, ft->ndim, ft->shape, 2, msh, mesh,
				      pl, g->err);
	free(mesh);
	if (rc != REFIT_OK)
		return rc;
	xqsort(c.l.shards, c.l.nshards, sizeof(*c.l.shards), cmp_shard_rank);
	c.first = xcalloc((size_t)world + 1, sizeof(*c.first));
	for (size_t i = 0; i < c.l.nshards; i++)
		c.first[c.l.shards[i].rank + 1]++;
	for (int64_t r = 0; r < world; r++)
		c.first[r + 1] += c.first[r];
	c.kind = kind;
	c.ndim = ft->ndim;
	memcpy(c.shape, ft->shape, sizeof(c.shape));
	VEC_PUSH(&g->dt, c);
	*out = &g->dt.v[g->dt.n - 1];
	return REFIT_OK;
}

/* One Hugging Face tensor as the rank's DTensor local tensor. */
static refit_status_t
fsdp2_param(fwgen_t *g, rule_kind_t kind, int32_t t)
{
	const dt_cache_t *c;
	int64_t shape[PLAN_MAX_DIMS] = {0};
	size_t a, b;

	CHECK(dt_get(g, kind, t, &c));
	a = c->first[g->rank];
	b = c->first[g->rank + 1];
	for (size_t i = a; i < b; i++)
		for (int d = 0; d < c->ndim; d++) {
			const plan_shard_t *sh = &c->l.shards[i];
			int64_t end = sh->local_off[d] + sh->box.size[d];

			shape[d] = end > shape[d] ? end : shape[d];
		}
	fw_param_begin(g, fw_T(g, t)->name, fw_T(g, t)->dtype, c->ndim, shape);
	for (size_t i = a; i < b; i++) {
		const plan_shard_t *sh = &c->l.shards[i];
		plan_fw_piece_t pc = {0};

		if (plan_box_is_empty(&sh->box, c->ndim))
			continue;
		pc.tensor = t;
		pc.box = sh->box;
		memcpy(pc.at, sh->local_off, sizeof(pc.at));
		VEC_PUSH(&g->m->pieces, pc);
		g->m->params.v[g->m->params.n - 1].npieces++;
	}
	return REFIT_OK;
}

refit_status_t
fw_rule_fsdp2(fwgen_t *g, const rule_t *r)
{
	if (r->kind != R_EACH)
		return fsdp2_param(g, r->kind, fw_part(g, r, 0, -1));
	for (int64_t e = 0; e < g->a->experts; e++)
		CHECK(fsdp2_param(g, R_REPL, fw_part(g, r, 0, e)));
	return REFIT_OK;
}

void
fw_fsdp2_fini(fwgen_t *g)
{
	for (size_t i = 0; i < g->dt.n; i++) {
		plan_layout_fini(&g->dt.v[i].l);
		free(g->dt.v[i].first);
	}
	VEC_FREE(&g->dt);
}
