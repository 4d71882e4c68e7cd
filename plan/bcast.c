/*
 * bcast.c - the gather-and-broadcast planner (baseline and fallback).
 *
 * What today's RL frameworks do, expressed as a plan: each tensor is
 * gathered whole on one training rank (its root: the lowest rank holding
 * part of it), passed along a chain through one receiver per destination
 * domain (a pipelined broadcast, as NCCL's ring does it), and every receiver
 * copies the whole tensor to each other destination rank of its domain,
 * which keeps its slice.  Each rank involved holds a whole copy in staging,
 * so tensors are cut into units of at most staging_bytes and units are
 * packed into rounds in which no rank holds more than staging_bytes.  A
 * round has K + 2 stages (K = destination domains): gather, K chain hops,
 * domain copies.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"

typedef struct part {
	int32_t domain, key, rank;  /* key: the domain's lowest rank (its order) */
} part_t;

typedef VEC(part_t) partvec_t;

typedef struct bcast {
	const plan_topo_t *topo;
	const plan_opts_t *opts;
	cxvec_t *out;       /* compact transfers */
	boxvec_t *boxes;    /* their boxes, each stored once */
	uint64_t *net_send, *net_recv, *nvl_send, *round_load;
	i32vec_t touched;   /* ranks with round_load != 0 */
	uint32_t round, spr;
} bcast_t;

static int
cmp_part(const void *a, const void *b)
{
	const part_t *x = a, *y = b;

	/* domains in the order of their lowest rank, not of their index (the
	 * order the topology named them in: the nodes' join order) */
	if (x->key != y->key)
		return (x->key > y->key) - (x->key < y->key);
	return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Store box in the table; its index. */
static uint32_t
box_add(bcast_t *bc, const plan_box_t *box)
{
	VEC_PUSH(bc->boxes, *box);
	return (uint32_t)(bc->boxes->n - 1);
}

static void
emit(bcast_t *bc, uint32_t stage, int32_t from, int32_t to, uint32_t tensor,
     uint32_t box, uint64_t bytes)
{
	plan_cx_t x = {.stage = stage, .from = from, .to = to, .tensor = tensor,
		       .box = box};

	if (plan_link_of(bc->topo, from, to) == PLAN_LINK_NETWORK) {
		bc->net_send[from] += bytes;
		bc->net_recv[to] += bytes;
	} else {
		bc->nvl_send[from] += bytes;
	}
	VEC_PUSH(bc->out, x);
}

/* Destination ranks (with their domain) needing part of unit u, sorted. */
static void
participants(const plan_layout_t *dst, const plan_topo_t *topo, const int32_t *dkey,
	     const plan_box_t *u, partvec_t *out)
{
	size_t k = 0;

	out->n = 0;
	for (size_t i = 0; i < dst->nshards; i++) {
		int32_t dom = plan_topo_domain(topo, dst->shards[i].rank);

		if (plan_box_overlaps(&dst->shards[i].box, u, dst->ndim) ||
		    (dst->ndim == 0 && !plan_box_is_empty(&dst->shards[i].box, 0)))
			VEC_PUSH(out, ((part_t){dom, dom >= 0 ? dkey[dom] : -1,
						dst->shards[i].rank}));
	}
	xqsort(out->v, out->n, sizeof(*out->v), cmp_part);
	for (size_t i = 0; i < out->n; i++)
		if (k == 0 || out->v[i].rank != out->v[k - 1].rank)
			out->v[k++] = out->v[i];
	out->n = k;
}

static void
charge(bcast_t *bc, int32_t rank, uint64_t bytes)
{
	if (bc->round_load[rank] == 0)
		VEC_PUSH(&bc->touched, rank);
	bc->round_load[rank] += bytes;
}

/* Start a new round when a rank of this unit would exceed staging. */
static void
fit_round(bcast_t *bc, int32_t root, const partvec_t *ps, uint64_t bytes)
{
	bool full = bc->round_load[root] + bytes > bc->opts->staging_bytes;

	for (size_t i = 0; i < ps->n && !full; i++)
		full = bc->round_load[ps->v[i].rank] + bytes > bc->opts->staging_bytes;
	if (full) {
		for (size_t i = 0; i < bc->touched.n; i++)
			bc->round_load[bc->touched.v[i]] = 0;
		bc->touched.n = 0;
		bc->round++;
	}
	charge(bc, root, bytes);
	for (size_t i = 0; i < ps->n; i++)
		if (ps->v[i].rank != root)
			charge(bc, ps->v[i].rank, bytes);
}

/* u minus every box of cut, as disjoint pieces in out (reset first). */
static void
box_minus(const plan_box_t *u, const plan_box_t *cut, size_t ncut, int ndim,
	  boxvec_t *out)
{
	boxvec_t tmp = {0};

	out->n = 0;
	VEC_PUSH(out, *u);
	for (size_t i = 0; i < ncut && out->n; i++)
		plan_boxvec_subtract(out, &cut[i], ndim, &tmp);
	VEC_FREE(&tmp);
}

/*
 * Stage 0 of the round: bring the parts of u root lacks to root.  The
 * parts gathered are left in *rem.
 */
static void
gather(bcast_t *bc, const srcidx_t *ix, const plan_layout_t *src, uint32_t tensor,
       int32_t root, const plan_box_t *u, uint32_t base, boxvec_t *rem)
{
	boxvec_t own = {0}, pieces = {0};
	i32vec_t groups = {0};
	int32_t dom = plan_topo_domain(bc->topo, root);
	uint64_t elem = plan_dtype_size(src->dtype);

	for (size_t i = 0; i < src->nshards; i++)
		if (src->shards[i].rank == root)
			VEC_PUSH(&own, src->shards[i].box);
	box_minus(u, own.v, own.n, src->ndim, rem);
	for (size_t j = 0; j < rem->n; j++) {
		pieces.n = groups.n = 0;
		srcidx_cover(ix, bc->topo, &rem->v[j], dom, &pieces, &groups);
		for (size_t k = 0; k < pieces.n; k++) {
			const srcgroup_t *g = &ix->g[groups.v[k]];
			int32_t best = -1;
			bool best_local = false;

			for (uint32_t h = 0; h < g->nh; h++) {
				int32_t r = ix->holders[g->h0 + h];
				bool local = plan_topo_domain(bc->topo, r) == dom;
				uint64_t load = local ? bc->nvl_send[r] : bc->net_send[r];

				if (best < 0 || (local && !best_local) ||
				    (local == best_local &&
				     load < (best_local ? bc->nvl_send[best] : bc->net_send[best])))
					best = r, best_local = local;
			}
			emit(bc, base, best, root, tensor, box_add(bc, &pieces.v[k]),
			     (uint64_t)plan_box_volume(&pieces.v[k], src->ndim) * elem);
		}
	}
	VEC_FREE(&own);
	VEC_FREE(&pieces);
	VEC_FREE(&groups);
}

/*
 * Chain through one receiver per domain, then copies inside each domain.
 * When root itself needs the tensor, its domain comes first with root as
 * the receiver: it copies locally the part it held (the rest it gathered).
 */
static void
chain(bcast_t *bc, uint32_t tensor, int32_t root, const plan_box_t *u,
      uint64_t bytes, const partvec_t *ps, const boxvec_t *gathered, int ndim,
      uint32_t base)
{
	int32_t prev = root, root_dom = -1;
	uint32_t hop = 0, ub = box_add(bc, u);

	for (size_t i = 0; i < ps->n; i++)
		if (ps->v[i].rank == root)
			root_dom = ps->v[i].domain;
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < ps->n;) {
			size_t j = i;
			int32_t recv = ps->v[i].rank;
			bool mine = ps->v[i].domain == root_dom;

			while (j < ps->n && ps->v[j].domain == ps->v[i].domain) {
				if (bc->net_recv[ps->v[j].rank] < bc->net_recv[recv])
					recv = ps->v[j].rank;
				j++;
			}
			if (mine != (pass == 0)) {
				i = j;
				continue;
			}
			if (mine) {
				boxvec_t held = {0};

				recv = root;
				box_minus(u, gathered->v, gathered->n, ndim, &held);
				for (size_t k = 0; k < held.n; k++)
					emit(bc, base + 1, root, root, tensor,
					     box_add(bc, &held.v[k]), 0);
				VEC_FREE(&held);
			} else {
				emit(bc, base + 1 + hop++, prev, recv, tensor, ub, bytes);
			}
			for (size_t k = i; k < j; k++)
				if (ps->v[k].rank != recv)
					emit(bc, base + bc->spr - 1, recv, ps->v[k].rank,
					     tensor, ub, bytes);
			prev = recv;
			i = j;
		}
	}
}

static uint32_t
count_dst_domains(const plan_layout_set_t *dst, const plan_topo_t *topo)
{
	uint8_t *seen = xcalloc((size_t)topo->ndomains + 1, 1);
	uint32_t k = 0;

	for (size_t i = 0; i < dst->n; i++)
		for (size_t s = 0; s < dst->v[i].nshards; s++) {
			int32_t d = plan_topo_domain(topo, dst->v[i].shards[s].rank);

			if (d >= 0 && !seen[d]) {
				seen[d] = 1;
				k++;
			}
		}
	free(seen);
	return k;
}

static int32_t
root_of(const plan_layout_t *src)
{
	int32_t root = -1;

	for (size_t i = 0; i < src->nshards; i++)
		if (!plan_box_is_empty(&src->shards[i].box, src->ndim) &&
		    (root < 0 || src->shards[i].rank < root))
			root = src->shards[i].rank;
	return root;
}

refit_status_t
plan_broadcast(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	       const size_t *map, const plan_topo_t *topo, const plan_opts_t *opts,
	       cxvec_t *out, boxvec_t *boxes, uint32_t *stages_per_round,
	       refit_err_t *err)
{
	bcast_t bc = {.topo = topo, .opts = opts, .out = out, .boxes = boxes};
	size_t ns = (size_t)topo->nslots;
	partvec_t ps = {0};
	boxvec_t units = {0}, gathered = {0};

	int32_t *dkey = xmalloc(((size_t)topo->ndomains + 1) * sizeof(*dkey));

	(void)err;
	for (int32_t d = 0; d < topo->ndomains; d++)
		dkey[d] = INT32_MAX;
	for (int32_t r = 0; r < topo->nslots; r++) {
		int32_t d = plan_topo_domain(topo, r);

		if (d >= 0 && r < dkey[d])
			dkey[d] = r;
	}
	bc.spr = count_dst_domains(dst, topo) + 2;
	bc.net_send = xcalloc(ns, sizeof(uint64_t));
	bc.net_recv = xcalloc(ns, sizeof(uint64_t));
	bc.nvl_send = xcalloc(ns, sizeof(uint64_t));
	bc.round_load = xcalloc(ns, sizeof(uint64_t));
	for (size_t i = 0; i < dst->n; i++) {
		const plan_layout_t *s = &src->v[map[i]];
		int32_t root = root_of(s);
		uint64_t elem = plan_dtype_size(s->dtype);
		plan_box_t full;
		srcidx_t ix;

		if (root < 0)
			continue; /* empty tensor */
		srcidx_build(&ix, s);
		plan_box_full(&full, s->shape, s->ndim);
		units.n = 0;
		plan_box_chunk(&full, s->ndim, elem, opts->staging_bytes, &units);
		for (size_t u = 0; u < units.n; u++) {
			uint64_t bytes = (uint64_t)plan_box_volume(&units.v[u], s->ndim) * elem;

			participants(&dst->v[i], topo, dkey, &units.v[u], &ps);
			if (ps.n == 0)
				continue;
			fit_round(&bc, root, &ps, bytes);
			gather(&bc, &ix, s, (uint32_t)i, root, &units.v[u], bc.round * bc.spr,
			       &gathered);
			chain(&bc, (uint32_t)i, root, &units.v[u], bytes, &ps, &gathered,
			      s->ndim, bc.round * bc.spr);
		}
		srcidx_fini(&ix);
	}
	*stages_per_round = bc.spr;
	free(dkey);
	VEC_FREE(&ps);
	VEC_FREE(&units);
	VEC_FREE(&gathered);
	VEC_FREE(&bc.touched);
	free(bc.net_send);
	free(bc.net_recv);
	free(bc.nvl_send);
	free(bc.round_load);
	return REFIT_OK;
}
