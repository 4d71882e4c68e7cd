/*
 * needs.c - source group index and the walk over destination needs
 * (see internal.h).
 */
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"

/* ---- source index ----------------------------------------------------- */

typedef struct boxrank {
	plan_box_t box;
	int32_t rank;
} boxrank_t;

static int
cmp_boxrank(const void *a, const void *b)
{
	const boxrank_t *x = a, *y = b;
	int c = plan_box_cmp(&x->box, &y->box, PLAN_MAX_DIMS);

	return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* The dim along which group offsets are most varied. */
static int
pick_index_dim(const srcgroup_t *g, size_t ng, int ndim)
{
	int64_t *offs = xmalloc((ng ? ng : 1) * sizeof(*offs));
	size_t best = 0;
	int bestd = 0;

	for (int d = 0; d < ndim; d++) {
		size_t distinct = 0;

		for (size_t i = 0; i < ng; i++)
			offs[i] = g[i].box.off[d];
		xqsort(offs, ng, sizeof(*offs), cmp_i64);
		for (size_t i = 0; i < ng; i++)
			distinct += i == 0 || offs[i] != offs[i - 1];
		if (distinct > best) {
			best = distinct;
			bestd = d;
		}
	}
	free(offs);
	return bestd;
}

/* qsort has no context argument: sort (key, index) pairs instead. */
typedef struct keyidx {
	int64_t key;
	size_t i;
} keyidx_t;

static int
cmp_keyidx(const void *a, const void *b)
{
	const keyidx_t *x = a, *y = b;

	if (x->key != y->key)
		return (x->key > y->key) - (x->key < y->key);
	return (x->i > y->i) - (x->i < y->i);
}

static void
sort_by_dim(srcidx_t *ix)
{
	keyidx_t *k = xmalloc((ix->ng ? ix->ng : 1) * sizeof(*k));
	srcgroup_t *g = xmalloc((ix->ng ? ix->ng : 1) * sizeof(*g));

	for (size_t i = 0; i < ix->ng; i++)
		k[i] = (keyidx_t){ix->ndim ? ix->g[i].box.off[ix->idim] : 0, i};
	xqsort(k, ix->ng, sizeof(*k), cmp_keyidx);
	for (size_t i = 0; i < ix->ng; i++)
		g[i] = ix->g[k[i].i];
	free(ix->g);
	ix->g = g;
	free(k);
}

static bool
groups_disjoint(const srcidx_t *ix)
{
	int d = ix->idim;

	for (size_t i = 0; i < ix->ng; i++) {
		int64_t end = ix->ndim ? ix->g[i].box.off[d] + ix->g[i].box.size[d] : 1;

		for (size_t j = i + 1; j < ix->ng; j++) {
			if (ix->ndim && ix->g[j].box.off[d] >= end)
				break;
			if (plan_box_overlaps(&ix->g[i].box, &ix->g[j].box, ix->ndim))
				return false;
		}
	}
	return true;
}

void
srcidx_build(srcidx_t *ix, const plan_layout_t *src)
{
	boxrank_t *br = xmalloc((src->nshards ? src->nshards : 1) * sizeof(*br));
	size_t n = 0;

	memset(ix, 0, sizeof(*ix));
	ix->ndim = src->ndim;
	for (size_t i = 0; i < src->nshards; i++)
		if (!plan_box_is_empty(&src->shards[i].box, src->ndim))
			br[n++] = (boxrank_t){src->shards[i].box, src->shards[i].rank};
	xqsort(br, n, sizeof(*br), cmp_boxrank);
	ix->g = xmalloc((n ? n : 1) * sizeof(*ix->g));
	ix->holders = xmalloc((n ? n : 1) * sizeof(*ix->holders));
	for (size_t i = 0, nh = 0; i < n; i++) {
		if (i == 0 || !plan_box_equal(&br[i].box, &br[i - 1].box, src->ndim)) {
			ix->g[ix->ng++] = (srcgroup_t){br[i].box, (uint32_t)nh, 0};
		} else if (br[i].rank == br[i - 1].rank) {
			continue; /* one rank listing the same box twice */
		}
		ix->holders[nh++] = br[i].rank;
		ix->g[ix->ng - 1].nh++;
	}
	free(br);
	ix->idim = pick_index_dim(ix->g, ix->ng, ix->ndim);
	sort_by_dim(ix);
	for (size_t i = 0; i < ix->ng; i++)
		if (ix->ndim && ix->g[i].box.size[ix->idim] > ix->maxlen)
			ix->maxlen = ix->g[i].box.size[ix->idim];
	ix->disjoint = groups_disjoint(ix);
}

void
srcidx_fini(srcidx_t *ix)
{
	free(ix->g);
	free(ix->holders);
	memset(ix, 0, sizeof(*ix));
}

/* The first group that may overlap q (groups before it end before q). */
static size_t
query_first(const srcidx_t *ix, const plan_box_t *q)
{
	size_t lo = 0, hi = ix->ng;
	int64_t from;

	if (ix->ndim == 0)
		return 0;
	from = q->off[ix->idim] - ix->maxlen; /* first that may reach q */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ix->g[mid].box.off[ix->idim] <= from)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Whether group i starts past q's end (it and the ones after miss q). */
static inline bool
query_past(const srcidx_t *ix, size_t i, const plan_box_t *q)
{
	return ix->ndim > 0 &&
	       ix->g[i].box.off[ix->idim] >= q->off[ix->idim] + q->size[ix->idim];
}

void
srcidx_query(const srcidx_t *ix, const plan_box_t *q, i32vec_t *out)
{
	for (size_t i = query_first(ix, q); i < ix->ng; i++) {
		if (query_past(ix, i, q))
			break;
		if (plan_box_overlaps(&ix->g[i].box, q, ix->ndim) || ix->ndim == 0)
			VEC_PUSH(out, (int32_t)i);
	}
}

bool
srcidx_holds(const srcidx_t *ix, const srcgroup_t *g, int32_t rank)
{
	return xbsearch(&rank, ix->holders + g->h0, g->nh, sizeof(int32_t),
		       cmp_i32v) != NULL;
}

static bool
group_in_domain(const srcidx_t *ix, const srcgroup_t *g, const plan_topo_t *topo,
		int32_t domain)
{
	for (uint32_t k = 0; k < g->nh; k++)
		if (plan_topo_domain(topo, ix->holders[g->h0 + k]) == domain)
			return true;
	return false;
}

void
srcidx_cover(const srcidx_t *ix, const plan_topo_t *topo, const plan_box_t *q,
	     int32_t prefer_domain, boxvec_t *pieces, i32vec_t *groups)
{
	i32vec_t cand = {0};
	boxvec_t rem = {0}, next = {0};

	if (ix->disjoint) { /* the query's groups in order, no list built */
		for (size_t i = query_first(ix, q); i < ix->ng; i++) {
			plan_box_t in;

			if (query_past(ix, i, q))
				break;
			if (ix->ndim == 0)
				in = *q;
			else if (!plan_box_intersect(q, &ix->g[i].box, ix->ndim, &in))
				continue;
			VEC_PUSH(pieces, in);
			VEC_PUSH(groups, (int32_t)i);
		}
		return;
	}
	srcidx_query(ix, q, &cand);
	/* Overlapping groups: take each element from the first group (local
	 * ones first) that holds it, tracking the part of q still open. */
	VEC_PUSH(&rem, *q);
	for (int pass = 0; pass < 2 && rem.n > 0; pass++) {
		for (size_t i = 0; i < cand.n && rem.n > 0; i++) {
			const srcgroup_t *g = &ix->g[cand.v[i]];
			bool local = prefer_domain >= 0 &&
				     group_in_domain(ix, g, topo, prefer_domain);

			if (prefer_domain >= 0 && local != (pass == 0))
				continue;
			if (prefer_domain < 0 && pass == 1)
				continue;
			for (size_t j = 0; j < rem.n; j++) {
				plan_box_t in;

				if (plan_box_intersect(&rem.v[j], &g->box, ix->ndim, &in)) {
					VEC_PUSH(pieces, in);
					VEC_PUSH(groups, cand.v[i]);
				}
			}
			plan_boxvec_subtract(&rem, &g->box, ix->ndim, &next);
		}
	}
	VEC_FREE(&cand);
	VEC_FREE(&rem);
	VEC_FREE(&next);
}

/* ---- destination regions ---------------------------------------------- */

typedef struct dentry {
	int32_t domain, rank;
	plan_box_t box;
} dentry_t;

static int
cmp_dentry(const void *a, const void *b)
{
	const dentry_t *x = a, *y = b;
	int c;

	if (x->domain != y->domain)
		return (x->domain > y->domain) - (x->domain < y->domain);
	c = plan_box_cmp(&x->box, &y->box, PLAN_MAX_DIMS);
	if (c)
		return c;
	return (x->rank > y->rank) - (x->rank < y->rank);
}

typedef struct region {
	plan_box_t box;
	uint32_t r0, nr; /* ranks in the walk's rank arena */
} region_t;

typedef VEC(region_t) regionvec_t;

/* Ranks a ∪ b (both sorted, both in the arena) appended to the arena;
 * returns the offset. */
static uint32_t
merge_ranks(i32vec_t *arena, uint32_t a0, uint32_t na, uint32_t b0,
	    uint32_t nb, uint32_t *nout)
{
	uint32_t off, i = 0, j = 0;

	VEC_RESERVE(arena, arena->n + na + nb);
	off = (uint32_t)arena->n;
	while (i < na || j < nb) {
		int32_t x = i < na ? arena->v[a0 + i] : INT32_MAX;
		int32_t y = j < nb ? arena->v[b0 + j] : INT32_MAX;

		arena->v[arena->n++] = x < y ? x : y;
		i += x <= y;
		j += y <= x;
	}
	*nout = (uint32_t)arena->n - off;
	return off;
}

/*
 * Disjoint regions for the entries e[0..n) of one domain (sorted by box,
 * rank).  Identical boxes merge their ranks; partial overlaps are split.
 */
static void
build_regions(const dentry_t *e, size_t n, int ndim, i32vec_t *arena,
	      regionvec_t *out)
{
	bool disjoint = true;
	size_t first = out->n;

	for (size_t i = 0; i < n;) {
		size_t j = i;
		region_t r = {e[i].box, (uint32_t)arena->n, 0};

		while (j < n && plan_box_equal(&e[j].box, &e[i].box, ndim)) {
			/* a rank listing the same box twice needs it once */
			if (j == i || e[j].rank != e[j - 1].rank)
				VEC_PUSH(arena, e[j].rank);
			j++;
		}
		r.nr = (uint32_t)arena->n - r.r0;
		for (size_t k = first; k < out->n && disjoint; k++)
			disjoint = !plan_box_overlaps(&out->v[k].box, &r.box, ndim);
		if (disjoint) {
			VEC_PUSH(out, r);
		} else {
			/* general case: split existing regions against r */
			boxvec_t fresh = {0}, tmp = {0};
			size_t n0 = out->n;

			VEC_PUSH(&fresh, r.box);
			for (size_t k = first; k < n0; k++) {
				region_t old = out->v[k];
				plan_box_t in, sub[PLAN_BOX_SUB_MAX];
				int ns;

				if (!plan_box_intersect(&old.box, &r.box, ndim, &in))
					continue;
				out->v[k].box = in;
				out->v[k].r0 = merge_ranks(arena, old.r0, old.nr,
							   r.r0, r.nr, &out->v[k].nr);
				ns = plan_box_subtract(&old.box, &r.box, ndim, sub);
				for (int s = 0; s < ns; s++)
					VEC_PUSH(out, ((region_t){sub[s], old.r0, old.nr}));
				plan_boxvec_subtract(&fresh, &in, ndim, &tmp);
			}
			for (size_t f = 0; f < fresh.n; f++)
				VEC_PUSH(out, ((region_t){fresh.v[f], r.r0, r.nr}));
			VEC_FREE(&fresh);
			VEC_FREE(&tmp);
			disjoint = false;
		}
		i = j;
	}
}

static void
emit_region(const srcidx_t *src, const plan_topo_t *topo, uint32_t tensor,
	    int32_t domain, const region_t *r, const int32_t *ranks,
	    const needs_visitor_t *v, boxvec_t *pieces, i32vec_t *groups)
{
	pieces->n = groups->n = 0;
	srcidx_cover(src, topo, &r->box, domain, pieces, groups);
	for (size_t i = 0; i < pieces->n; i++) {
		const srcgroup_t *g = &src->g[groups->v[i]];
		needs_item_t it = {
			.tensor = tensor, .domain = domain, .box = &pieces->v[i],
			.src = src, .group = (uint32_t)groups->v[i],
			.local = group_in_domain(src, g, topo, domain),
			.need = ranks, .nneed = r->nr,
		};

		v->item(v->ctx, &it);
	}
}

refit_status_t
needs_walk(const srcidx_t *src, const plan_layout_t *dst, uint32_t tensor,
	   const plan_topo_t *topo, const needs_visitor_t *v, refit_err_t *err)
{
	dentry_t *e = xmalloc((dst->nshards ? dst->nshards : 1) * sizeof(*e));
	size_t n = 0;
	i32vec_t arena = {0}, groups = {0};
	regionvec_t regions = {0};
	boxvec_t pieces = {0};

	for (size_t i = 0; i < dst->nshards; i++) {
		const plan_shard_t *s = &dst->shards[i];
		int32_t d = plan_topo_domain(topo, s->rank);

		if (d < 0) {
			free(e);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": rank %d is not in the topology",
					     dst->name, s->rank);
		}
		if (!plan_box_is_empty(&s->box, dst->ndim))
			e[n++] = (dentry_t){d, s->rank, s->box};
	}
	xqsort(e, n, sizeof(*e), cmp_dentry);
	for (size_t i = 0; i < n;) {
		size_t j = i;

		while (j < n && e[j].domain == e[i].domain)
			j++;
		arena.n = regions.n = 0;
		build_regions(e + i, j - i, dst->ndim, &arena, &regions);
		for (size_t k = 0; k < regions.n; k++)
			emit_region(src, topo, tensor, e[i].domain, &regions.v[k],
				    arena.v + regions.v[k].r0, v, &pieces, &groups);
		if (v->domain_end)
			v->domain_end(v->ctx, tensor, e[i].domain);
		i = j;
	}
	free(e);
	VEC_FREE(&arena);
	VEC_FREE(&groups);
	VEC_FREE(&regions);
	VEC_FREE(&pieces);
	return REFIT_OK;
}
