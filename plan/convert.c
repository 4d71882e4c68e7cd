/*
 * convert.c - precision conversion as a rewrite of a layout pair (see
 * convert.h and docs/conversion.md).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"
#include "plan/convert.h"

plan_dtype_t
plan_conv_scale_dtype(plan_scale_t s)
{
	return s == PLAN_SCALE_MX ? PLAN_DT_UINT8 : PLAN_DT_FP32;
}

const char *
plan_conv_site_name(plan_conv_site_t s)
{
	return s == PLAN_CONV_SENDER ? "sender" : "receiver";
}

static bool
wide_float(plan_dtype_t dt)
{
	return dt == PLAN_DT_FP32 || dt == PLAN_DT_BF16 || dt == PLAN_DT_FP16;
}

refit_status_t
plan_convert_check_spec(const plan_layout_t *l, refit_err_t *err)
{
	const plan_convert_t *c = l->conv;
	const char *to = plan_dtype_name(l->dtype), *from;
	bool ok;

	if (c == NULL)
		return REFIT_OK;
	from = plan_dtype_name(c->from);
	if (c->from == l->dtype)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\" "
				     "from %s to %s: nothing to convert", l->name, from, to);
	if (l->dtype == PLAN_DT_BF16 || l->dtype == PLAN_DT_FP16)
		ok = c->from == PLAN_DT_FP32;
	else
		ok = l->dtype == PLAN_DT_FP8E4M3 && wide_float(c->from);
	if (!ok)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\" "
				     "from %s to %s is not supported (fp32 -> bf16 or fp16; "
				     "bf16, fp16 or fp32 -> fp8e4m3)", l->name, from, to);
	if (l->dtype != PLAN_DT_FP8E4M3 && c->scale != PLAN_SCALE_NONE)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\" to "
				     "%s is a cast and takes no scale", l->name, to);
	if (l->dtype == PLAN_DT_FP8E4M3 && c->scale == PLAN_SCALE_NONE)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\" to "
				     "fp8e4m3 needs \"scale\": \"tensor\" or \"block\"", l->name);
	if ((c->scale == PLAN_SCALE_BLOCK || c->scale == PLAN_SCALE_MX) &&
	    (c->nblock < 1 || c->nblock > l->ndim))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\": "
				     "\"block\" has %d entries but the tensor has %d dims",
				     l->name, c->nblock, l->ndim);
	if (c->scale != PLAN_SCALE_NONE &&
	    (c->scale_tensor == NULL || strcmp(c->scale_tensor, l->name) == 0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\": "
				     "the scale tensor needs a name of its own", l->name);
	return REFIT_OK;
}

bool
plan_convert_any(const plan_layout_set_t *dst)
{
	for (size_t i = 0; i < dst->n; i++)
		if (dst->v[i].conv)
			return true;
	return false;
}

/* ---- block geometry ------------------------------------------------ */

static void
geometry(const plan_layout_t *d, plan_conv_tensor_t *t)
{
	const plan_convert_t *c = d->conv;

	t->to = d->dtype;
	t->from = c->from;
	t->scale = c->scale;
	t->ndim = d->ndim;
	for (int k = 0; k < d->ndim; k++) {
		t->shape[k] = d->shape[k];
		t->block[k] = 1;
		if (c->scale == PLAN_SCALE_TENSOR && d->shape[k] > 0)
			t->block[k] = d->shape[k];
	}
	if (c->scale == PLAN_SCALE_BLOCK || c->scale == PLAN_SCALE_MX)
		for (int k = 0; k < c->nblock; k++)
			t->block[d->ndim - c->nblock + k] = c->block[k];
	for (int k = 0; k < d->ndim; k++)
		t->grid[k] = (t->shape[k] + t->block[k] - 1) / t->block[k];
}

/* Does box start and end on block boundaries (or the tensor's edge)? */
static bool
aligned(const plan_conv_tensor_t *t, const plan_box_t *b)
{
	for (int d = 0; d < t->ndim; d++) {
		int64_t end = b->off[d] + b->size[d];

		if (b->off[d] % t->block[d] != 0 ||
		    (end % t->block[d] != 0 && end != t->shape[d]))
			return false;
	}
	return true;
}

static void
widen(const plan_conv_tensor_t *t, const plan_box_t *b, plan_box_t *out)
{
	for (int d = 0; d < t->ndim; d++) {
		int64_t a = b->off[d] / t->block[d] * t->block[d];
		int64_t e = (b->off[d] + b->size[d] + t->block[d] - 1) / t->block[d] * t->block[d];

		out->off[d] = a;
		out->size[d] = (e < t->shape[d] ? e : t->shape[d]) - a;
	}
}

/* The block-grid box of the blocks that box meets. */
static void
to_grid(const plan_conv_tensor_t *t, const plan_box_t *b, plan_box_t *out)
{
	for (int d = 0; d < t->ndim; d++) {
		int64_t a = b->off[d] / t->block[d];
		int64_t e = (b->off[d] + b->size[d] + t->block[d] - 1) / t->block[d];

		out->off[d] = a;
		out->size[d] = e - a;
	}
}

/* The elements of a grid box (scale tensor coordinates, full ndim). */
static void
from_grid(const plan_conv_tensor_t *t, const plan_box_t *g, plan_box_t *out)
{
	for (int d = 0; d < t->ndim; d++) {
		int64_t a = g->off[d] * t->block[d], e = (g->off[d] + g->size[d]) * t->block[d];

		out->off[d] = a;
		out->size[d] = (e < t->shape[d] ? e : t->shape[d]) - a;
	}
}

/* A scale shard's box in grid coordinates of full ndim (a tensor scale is
 * a scalar: the one block). */
static void
scale_grid_box(const plan_conv_tensor_t *t, const plan_shard_t *s, plan_box_t *g)
{
	for (int d = 0; d < t->ndim; d++) {
		g->off[d] = t->scale == PLAN_SCALE_TENSOR ? 0 : s->box.off[d];
		g->size[d] = t->scale == PLAN_SCALE_TENSOR ? 1 : s->box.size[d];
	}
}

/* ---- the rewrite --------------------------------------------------- */

static void
copy_layout(plan_layout_t *o, const plan_layout_t *s)
{
	plan_layout_set_t one = {(plan_layout_t *)s, 1, 1}, tmp;

	plan_layout_set_copy(&tmp, &one);
	*o = tmp.v[0];
	free(tmp.v);
	free(o->conv ? o->conv->scale_tensor : NULL);
	free(o->conv);
	o->conv = NULL;
}

/* Check the conversion of dst tensor i against its source and scale tensor. */
static refit_status_t
check_pair(const plan_layout_t *d, const plan_layout_t *s, const plan_layout_set_t *dst,
	   const strmap_t *sidx, const strmap_t *didx, int64_t *scale_of, size_t i,
	   plan_conv_tensor_t *t, refit_err_t *err)
{
	const plan_layout_t *sc;
	int32_t k;

	CHECK(plan_convert_check_spec(d, err));
	if (s->dtype != d->conv->from)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": \"convert\" "
				     "from %s but the source is %s", d->name,
				     plan_dtype_name(d->conv->from), plan_dtype_name(s->dtype));
	geometry(d, t);
	if (d->conv->scale == PLAN_SCALE_NONE)
		return REFIT_OK;
	k = strmap_get(didx, d->conv->scale_tensor);
	if (k < 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": scale tensor "
				     "\"%s\" is not among the destination tensors", d->name,
				     d->conv->scale_tensor);
	sc = &dst->v[k];
	if (scale_of[k] >= 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": scale tensor "
				     "\"%s\" is also the scale tensor of \"%s\"", d->name, sc->name,
				     dst->v[scale_of[k]].name);
	if (sc->conv || strmap_get(sidx, sc->name) >= 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": scale tensor "
				     "\"%s\" is computed, it can neither convert nor have a "
				     "source", d->name, sc->name);
	bool shape_ok = sc->ndim == (t->scale == PLAN_SCALE_TENSOR ? 0 : t->ndim);

	for (int e = 0; shape_ok && e < sc->ndim; e++)
		shape_ok = sc->shape[e] == t->grid[e];
	if (sc->dtype != plan_conv_scale_dtype(t->scale) || !shape_ok) {
		char want[160] = "[]";
		size_t o = 0;

		for (int e = 0; t->scale != PLAN_SCALE_TENSOR && e < t->ndim; e++)
			o += (size_t)snprintf(want + o, sizeof(want) - o, "%s%" PRId64,
					      e ? ", " : "[", t->grid[e]);
		if (t->scale != PLAN_SCALE_TENSOR)
			snprintf(want + o, sizeof(want) - o, "]");
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": scale tensor "
				     "\"%s\" must be %s of shape %s (%s), not %s of %d dims",
				     d->name, sc->name, plan_dtype_name(plan_conv_scale_dtype(t->scale)),
				     want, t->scale == PLAN_SCALE_TENSOR ?
				     "one scale for the tensor" : "one scale per block",
				     plan_dtype_name(sc->dtype), sc->ndim);
	}
	scale_of[k] = (int64_t)i;
	t->scale_dst = k;
	return REFIT_OK;
}

/* Sender side when the shards holding whole blocks cover the tensor: then
 * *kept is the source with only those shards, in the destination dtype. */
static bool
try_sender(plan_conv_tensor_t *t, const plan_layout_t *s, plan_layout_t *kept)
{
	size_t n = 0;
	refit_err_t e;

	copy_layout(kept, s);
	kept->dtype = t->to;
	t->src_shard = xmalloc((s->nshards ? s->nshards : 1) * sizeof(*t->src_shard));
	for (size_t i = 0; i < s->nshards; i++) {
		if (plan_box_is_empty(&s->shards[i].box, s->ndim) ||
		    !aligned(t, &s->shards[i].box))
			continue;
		t->src_shard[n] = (uint32_t)i;
		kept->shards[n++] = s->shards[i];
	}
	t->nshards = n;
	if (n != s->nshards) {
		kept->nshards = n;
		kept->is_dtensor = false;
		free(kept->mesh);
		kept->mesh = NULL;
		kept->mesh_ndim = 0;
	}
	refit_err_clear(&e);
	if (plan_layout_check_coverage(kept, &e) == REFIT_OK)
		return true;
	plan_layout_fini(kept);
	free(t->src_shard);
	t->src_shard = NULL;
	t->nshards = 0;
	return false;
}

/* The scale tensor's source: each kept shard's block grid on its rank. */
static refit_status_t
scale_source(const plan_conv_tensor_t *t, const plan_layout_t *kept, const char *name,
	     plan_layout_t *out, refit_err_t *err)
{
	plan_shard_t *sh = xcalloc(kept->nshards ? kept->nshards : 1, sizeof(*sh));
	int nd = t->scale == PLAN_SCALE_TENSOR ? 0 : t->ndim;
	refit_status_t rc;

	for (size_t i = 0; i < kept->nshards; i++) {
		sh[i].rank = kept->shards[i].rank;
		if (nd)
			to_grid(t, &kept->shards[i].box, &sh[i].box);
	}
	rc = plan_layout_init_explicit(out, name, plan_conv_scale_dtype(t->scale), nd, t->grid, sh,
				       kept->nshards, err);
	free(sh);
	return rc;
}

/* Receiver side: the destination in the source dtype, widened to blocks,
 * plus the element boxes of the scale shards. */
static refit_status_t
receiver_dst(plan_conv_tensor_t *t, const plan_layout_t *d, const plan_layout_t *sc,
	     plan_layout_t *out, refit_err_t *err)
{
	size_t n = d->nshards + (sc ? sc->nshards : 0), k = 0;
	plan_shard_t *sh = xcalloc(n ? n : 1, sizeof(*sh));
	refit_status_t rc;

	t->dst_shard = xcalloc(n ? n : 1, sizeof(*t->dst_shard));
	for (size_t i = 0; i < d->nshards; i++) {
		if (plan_box_is_empty(&d->shards[i].box, d->ndim))
			continue;
		sh[k].rank = d->shards[i].rank;
		widen(t, &d->shards[i].box, &sh[k].box);
		t->dst_shard[k++] = (plan_conv_shard_t){false, (uint32_t)i};
	}
	for (size_t i = 0; sc && i < sc->nshards; i++) {
		plan_box_t g;

		if (plan_box_is_empty(&sc->shards[i].box, sc->ndim))
			continue;
		scale_grid_box(t, &sc->shards[i], &g);
		sh[k].rank = sc->shards[i].rank;
		from_grid(t, &g, &sh[k].box);
		t->dst_shard[k++] = (plan_conv_shard_t){true, (uint32_t)i};
	}
	t->nshards = k;
	rc = plan_layout_init_explicit(out, d->name, t->from, d->ndim, d->shape, sh, k, err);
	free(sh);
	return rc;
}

static void
index_names(const plan_layout_set_t *s, strmap_t *m)
{
	strmap_init(m);
	for (size_t i = 0; i < s->n; i++)
		strmap_put(m, s->v[i].name, (int32_t)i);
}

/* Decide every conversion's site and check it (pass 1). */
static refit_status_t
plan_sites(const plan_layout_set_t *src, const plan_layout_set_t *dst, strmap_t *sidx,
	   strmap_t *didx, int64_t *scale_of, plan_conv_t *c, plan_layout_t *kept,
	   refit_err_t *err)
{
	for (size_t i = 0; i < dst->n; i++) {
		const plan_layout_t *d = &dst->v[i];
		plan_conv_tensor_t *t;
		int32_t j;

		if (d->conv == NULL)
			continue;
		j = strmap_get(sidx, d->name);
		if (j < 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": converts "
					     "but has no source tensor", d->name);
		t = &c->t[c->n++];
		memset(t, 0, sizeof(*t));
		t->src = (uint32_t)j;
		t->dst = (uint32_t)i;
		t->scale_dst = t->scale_dst2 = -1;
		if (src->v[j].ndim != d->ndim ||
		    memcmp(src->v[j].shape, d->shape, sizeof(int64_t) * (size_t)d->ndim) != 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": the source "
					     "and destination shapes differ", d->name);
		CHECK(check_pair(d, &src->v[j], dst, sidx, didx, scale_of, i, t, err));
		t->site = try_sender(t, &src->v[j], &kept[c->n - 1]) ? PLAN_CONV_SENDER
								       : PLAN_CONV_RECEIVER;
	}
	return REFIT_OK;
}

/* Build the rewritten pair (pass 2). */
static refit_status_t
build(const plan_layout_set_t *src, const plan_layout_set_t *dst, const int64_t *scale_of,
      const int64_t *conv_of, plan_conv_t *c, plan_layout_t *kept, refit_err_t *err)
{
	plan_layout_set_copy(&c->src, src);
	for (size_t k = 0; k < c->n; k++) {
		plan_layout_t *s = &c->src.v[c->t[k].src];

		if (c->t[k].site != PLAN_CONV_SENDER)
			continue;
		plan_layout_fini(s);
		*s = kept[k];
		memset(&kept[k], 0, sizeof(kept[k]));
	}
	for (size_t i = 0; i < dst->n; i++) {
		int64_t k = conv_of[i] >= 0 ? conv_of[i] : scale_of[i] >= 0 ? conv_of[scale_of[i]] : -1;
		plan_conv_tensor_t *t = k >= 0 ? &c->t[k] : NULL;
		plan_layout_t l;

		if (t && t->site == PLAN_CONV_RECEIVER && (int64_t)i == t->scale_dst)
			continue; /* computed by the receivers */
		if (t && t->site == PLAN_CONV_RECEIVER) {
			CHECK(receiver_dst(t, &dst->v[i], t->scale_dst >= 0 ? &dst->v[t->scale_dst]
						: NULL, &l, err));
		} else {
			copy_layout(&l, &dst->v[i]);
		}
		if (t && (int64_t)i == t->scale_dst)
			t->scale_dst2 = (int64_t)c->dst.n;
		else if (t)
			t->dst2 = (uint32_t)c->dst.n;
		c->dst_orig[c->dst.n] = (uint32_t)i;
		c->dst_conv[c->dst.n] = k;
		plan_layout_set_add(&c->dst, &l);
		if (t && (int64_t)i == t->dst && t->site == PLAN_CONV_SENDER && t->scale_dst >= 0) {
			plan_layout_t ss;

			CHECK(scale_source(t, &c->src.v[t->src], dst->v[t->scale_dst].name, &ss, err));
			plan_layout_set_add(&c->src, &ss);
		}
	}
	return REFIT_OK;
}

refit_status_t
plan_convert_apply(const plan_layout_set_t *src, const plan_layout_set_t *dst,
		   plan_conv_t *out, refit_err_t *err)
{
	strmap_t sidx, didx;
	size_t nd = dst->n ? dst->n : 1;
	int64_t *scale_of = xmalloc(nd * sizeof(int64_t)), *conv_of = xmalloc(nd * sizeof(int64_t));
	plan_layout_t *kept = xcalloc(nd, sizeof(*kept));
	refit_status_t rc;

	memset(out, 0, sizeof(*out));
	plan_layout_set_init(&out->src);
	plan_layout_set_init(&out->dst);
	out->t = xcalloc(nd, sizeof(*out->t));
	out->dst_orig = xmalloc(nd * sizeof(*out->dst_orig));
	out->dst_conv = xmalloc(nd * sizeof(*out->dst_conv));
	for (size_t i = 0; i < dst->n; i++)
		scale_of[i] = conv_of[i] = -1;
	index_names(src, &sidx);
	index_names(dst, &didx);
	rc = plan_sites(src, dst, &sidx, &didx, scale_of, out, kept, err);
	for (size_t k = 0; k < out->n; k++)
		conv_of[out->t[k].dst] = (int64_t)k;
	if (rc == REFIT_OK)
		rc = build(src, dst, scale_of, conv_of, out, kept, err);
	for (size_t k = 0; k < nd; k++)
		plan_layout_fini(&kept[k]);
	free(kept);
	free(scale_of);
	free(conv_of);
	strmap_fini(&sidx);
	strmap_fini(&didx);
	if (rc != REFIT_OK)
		plan_convert_fini(out);
	return rc;
}

void
plan_convert_fini(plan_conv_t *c)
{
	if (c == NULL)
		return;
	plan_layout_set_fini(&c->src);
	plan_layout_set_fini(&c->dst);
	for (size_t k = 0; c->t && k < c->n; k++) {
		free(c->t[k].src_shard);
		free(c->t[k].dst_shard);
	}
	free(c->t);
	free(c->dst_orig);
	free(c->dst_conv);
	memset(c, 0, sizeof(*c));
}

/* ---- the independent check ---------------------------------------- */

static refit_status_t
bad(refit_err_t *err, const char *name, const char *what, size_t shard)
{
	return refit_err_set(err, REFIT_ERR_INTERNAL, "conversion of \"%s\": shard %zu %s",
			     name, shard, what);
}

static refit_status_t
check_sender(const plan_conv_t *c, const strmap_t *names, const plan_conv_tensor_t *t,
	     const plan_layout_t *s, const plan_layout_set_t *src, refit_err_t *err)
{
	int32_t k;
	const plan_layout_t *ss = NULL;

	if (s->dtype != t->to)
		return bad(err, s->name, "is not in the destination dtype", 0);
	for (size_t i = 0; i < s->nshards; i++) {
		const plan_shard_t *o = &src->v[t->src].shards[t->src_shard[i]];

		if (!aligned(t, &s->shards[i].box))
			return bad(err, s->name, "does not hold whole blocks", i);
		if (o->rank != s->shards[i].rank ||
		    !plan_box_equal(&o->box, &s->shards[i].box, t->ndim))
			return bad(err, s->name, "is not the source shard it names", i);
	}
	if (plan_layout_check_coverage(s, err) != REFIT_OK) {
		refit_err_prefix(err, "conversion");
		return REFIT_ERR_INTERNAL;
	}
	if (t->scale_dst2 < 0)
		return REFIT_OK;
	k = strmap_get(names, c->dst.v[t->scale_dst2].name);
	if (k >= 0)
		ss = &c->src.v[k];
	if (ss == NULL || ss->nshards != s->nshards)
		return bad(err, s->name, "has no scale source shard", 0);
	for (size_t i = 0; i < s->nshards; i++) {
		plan_box_t g;

		to_grid(t, &s->shards[i].box, &g);
		if (ss->shards[i].rank != s->shards[i].rank ||
		    (ss->ndim && !plan_box_equal(&g, &ss->shards[i].box, t->ndim)))
			return bad(err, s->name, "has a scale source shard of other blocks", i);
	}
	return REFIT_OK;
}

static refit_status_t
check_receiver(const plan_conv_tensor_t *t, const plan_layout_t *w,
	       const plan_layout_set_t *dst, refit_err_t *err)
{
	const plan_layout_t *d = &dst->v[t->dst];
	const plan_layout_t *sc = t->scale_dst >= 0 ? &dst->v[t->scale_dst] : NULL;
	size_t want = 0;

	if (w->dtype != t->from || w->nshards != t->nshards)
		return bad(err, w->name, "table does not match the rewritten layout", 0);
	for (size_t i = 0; i < d->nshards; i++)
		want += !plan_box_is_empty(&d->shards[i].box, d->ndim);
	for (size_t i = 0; sc && i < sc->nshards; i++)
		want += !plan_box_is_empty(&sc->shards[i].box, sc->ndim);
	if (want != w->nshards)
		return bad(err, w->name, "count differs from the boxes it stands for", 0);
	for (size_t i = 0; i < w->nshards; i++) {
		const plan_conv_shard_t *e = &t->dst_shard[i];
		const plan_shard_t *o = e->is_scale ? &sc->shards[e->orig] : &d->shards[e->orig];
		plan_box_t need, g;

		if (!aligned(t, &w->shards[i].box))
			return bad(err, w->name, "is not widened to whole blocks", i);
		if (e->is_scale) {
			scale_grid_box(t, o, &g);
			from_grid(t, &g, &need);
		} else {
			need = o->box;
		}
		if (o->rank != w->shards[i].rank ||
		    !plan_box_contains(&w->shards[i].box, &need, t->ndim))
			return bad(err, w->name, "does not hold what it stands for", i);
	}
	return REFIT_OK;
}

refit_status_t
plan_convert_check(const plan_conv_t *c, const plan_layout_set_t *src,
		   const plan_layout_set_t *dst, refit_err_t *err)
{
	strmap_t names; /* the rewritten sources by name, built once */
	refit_status_t rc = REFIT_OK;

	index_names(&c->src, &names);
	for (size_t k = 0; k < c->n && rc == REFIT_OK; k++) {
		const plan_conv_tensor_t *t = &c->t[k];
		const plan_layout_t *w = &c->dst.v[t->dst2];

		if (strcmp(w->name, dst->v[t->dst].name) != 0)
			rc = bad(err, dst->v[t->dst].name, "is missing", 0);
		else if (t->site == PLAN_CONV_SENDER)
			rc = check_sender(c, &names, t, &c->src.v[t->src], src, err);
		else
			rc = check_receiver(t, w, dst, err);
	}
	strmap_fini(&names);
	return rc;
}

/* ---- comparisons and generated models ------------------------------ */

size_t
plan_convert_count(const plan_conv_t *c, plan_conv_site_t site)
{
	size_t n = 0;

	for (size_t k = 0; k < c->n; k++)
		n += c->t[k].site == site;
	return n;
}

void
plan_convert_strip(const plan_layout_set_t *dst, plan_layout_set_t *out)
{
	strmap_t scales;

	strmap_init(&scales);
	for (size_t i = 0; i < dst->n; i++)
		if (dst->v[i].conv && dst->v[i].conv->scale_tensor)
			strmap_put(&scales, dst->v[i].conv->scale_tensor, (int32_t)i);
	plan_layout_set_init(out);
	for (size_t i = 0; i < dst->n; i++) {
		plan_layout_t l;
		plan_dtype_t from = dst->v[i].conv ? dst->v[i].conv->from : dst->v[i].dtype;

		if (strmap_get(&scales, dst->v[i].name) >= 0)
			continue;
		copy_layout(&l, &dst->v[i]);
		l.dtype = from;
		plan_layout_set_add(out, &l);
	}
	strmap_fini(&scales);
}

static bool
is_projection(const plan_layout_t *l)
{
	static const char *const ends[] = {"_proj.weight", "_proj_with_mqa.weight", NULL};
	size_t n = strlen(l->name);

	if (l->ndim < 2 || l->ndim > 3)
		return false;
	for (int i = 0; ends[i]; i++) {
		size_t k = strlen(ends[i]);

		if (n >= k && strcmp(l->name + n - k, ends[i]) == 0)
			return true;
	}
	return false;
}

/* The scale tensor of a generated fp8 weight: its grid, laid out alike. */
static refit_status_t
model_scale(const plan_layout_t *w, const plan_conv_tensor_t *t, const char *name,
	    plan_layout_t *out, refit_err_t *err)
{
	int nd = t->scale == PLAN_SCALE_TENSOR ? 0 : w->ndim;
	plan_shard_t *sh;
	refit_status_t rc;

	if (w->is_dtensor && nd > 0)
		return plan_layout_init_dtensor(out, name, PLAN_DT_FP32, nd, t->grid, w->mesh_ndim,
						w->mesh_shape, w->mesh, w->placements, err);
	/* explicit weights (and tensor scales): every rank of the weight gets
	 * the grid of its boxes */
	sh = xcalloc(w->nshards ? w->nshards : 1, sizeof(*sh));
	for (size_t i = 0; i < w->nshards; i++) {
		sh[i].rank = w->shards[i].rank;
		if (nd)
			to_grid(t, &w->shards[i].box, &sh[i].box);
	}
	rc = plan_layout_init_explicit(out, name, PLAN_DT_FP32, nd, t->grid, sh, w->nshards, err);
	free(sh);
	return rc;
}

refit_status_t
plan_convert_model_fp8(const plan_layout_set_t *dst, const int64_t *block,
		       plan_layout_set_t *out, refit_err_t *err)
{
	plan_layout_set_init(out);
	for (size_t i = 0; i < dst->n; i++) {
		const plan_layout_t *w = &dst->v[i];
		plan_convert_t cv = {w->dtype, block[0] ? PLAN_SCALE_BLOCK : PLAN_SCALE_TENSOR,
				     block[0] ? 2 : 0, {block[0], block[1]}, NULL};
		plan_conv_tensor_t t;
		plan_layout_t l, s;
		char name[512];
		refit_status_t rc;

		copy_layout(&l, w);
		if (!is_projection(w) || w->conv != NULL) {
			plan_layout_set_add(out, &l);
			continue;
		}
		snprintf(name, sizeof(name), "%s_scale_inv", w->name);
		cv.scale_tensor = name;
		l.conv = plan_convert_dup(&cv);
		l.dtype = PLAN_DT_FP8E4M3;
		memset(&t, 0, sizeof(t));
		geometry(&l, &t);
		rc = plan_convert_check_spec(&l, err);
		if (rc == REFIT_OK)
			rc = model_scale(w, &t, name, &s, err);
		if (rc != REFIT_OK) {
			plan_layout_fini(&l);
			plan_layout_set_fini(out);
			return rc;
		}
		plan_layout_set_add(out, &l);
		plan_layout_set_add(out, &s);
	}
	return REFIT_OK;
}

refit_status_t
plan_convert_match(const plan_layout_set_t *src, const plan_layout_set_t *dst,
		   refit_err_t *err)
{
	plan_conv_t c;
	size_t *map = NULL;
	refit_status_t rc;

	if (!plan_convert_any(dst)) {
		rc = plan_match(src, dst, &map, err);
		free(map);
		return rc;
	}
	CHECK(plan_convert_apply(src, dst, &c, err));
	rc = plan_match(&c.src, &c.dst, &map, err);
	free(map);
	plan_convert_fini(&c);
	return rc;
}

refit_status_t
plan_convert_rewrite(plan_layout_set_t *src, plan_layout_set_t *dst, refit_err_t *err)
{
	plan_conv_t c;

	if (!plan_convert_any(dst))
		return REFIT_OK;
	CHECK(plan_convert_apply(src, dst, &c, err));
	plan_layout_set_fini(src);
	plan_layout_set_fini(dst);
	*src = c.src;
	*dst = c.dst;
	plan_layout_set_init(&c.src);
	plan_layout_set_init(&c.dst);
	plan_convert_fini(&c);
	return REFIT_OK;
}
