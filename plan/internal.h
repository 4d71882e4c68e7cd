/*
 * internal.h - machinery shared inside plan/ (not installed, not public).
 *
 * srcidx: the distinct boxes of a source layout ("groups"), each with the
 * sorted ranks holding it (replicas), indexed along one dim for fast overlap
 * queries.
 *
 * needs walk: for one tensor, for each destination domain, the disjoint
 * regions of the tensor that ranks of the domain need, each with the set of
 * ranks needing it, cut by source group.  Each piece is reported once as a
 * needs_item_t; the reshard planner and the lower bound both consume it.
 */
#ifndef REFIT_PLAN_INTERNAL_H
#define REFIT_PLAN_INTERNAL_H

#include "common/alloc.h"
#include "plan/plan.h"

typedef plan_boxvec_t boxvec_t;
typedef VEC(int32_t) i32vec_t;

typedef struct srcgroup {
	plan_box_t box;
	uint32_t h0, nh; /* holders: idx->holders[h0 .. h0+nh), sorted */
} srcgroup_t;

typedef struct srcidx {
	int ndim;
	srcgroup_t *g;   /* sorted by box.off[idim] */
	size_t ng;
	int32_t *holders;
	bool disjoint;   /* no two groups overlap */
	int idim;        /* dim the index is sorted on */
	int64_t maxlen;  /* longest group extent along idim */
} srcidx_t;

void srcidx_build(srcidx_t *ix, const plan_layout_t *src);
void srcidx_fini(srcidx_t *ix);
/* Indices of groups overlapping q, appended to out (in index order). */
void srcidx_query(const srcidx_t *ix, const plan_box_t *q, i32vec_t *out);
/* true when rank is among the group's holders */
bool srcidx_holds(const srcidx_t *ix, const srcgroup_t *g, int32_t rank);
/*
 * Cut box q into pieces each held by one group; every element of q lands
 * in exactly one piece.  When groups overlap, groups with a holder in
 * `prefer_domain` (>= 0) are used first.  pieces/groups appended in step.
 */
void srcidx_cover(const srcidx_t *ix, const plan_topo_t *topo,
		  const plan_box_t *q, int32_t prefer_domain, boxvec_t *pieces,
		  i32vec_t *groups);

typedef struct needs_item {
	uint32_t tensor;
	int32_t domain;
	const plan_box_t *box;   /* the piece */
	const srcidx_t *src;
	uint32_t group;          /* source group holding it */
	bool local;              /* a holder is in `domain` */
	const int32_t *need;     /* sorted ranks of `domain` needing it */
	uint32_t nneed;
} needs_item_t;

typedef struct needs_visitor {
	void (*item)(void *ctx, const needs_item_t *it);
	void (*domain_end)(void *ctx, uint32_t tensor, int32_t domain); /* may be NULL */
	void *ctx;
} needs_visitor_t;

/*
 * Walk the needs of dst (tensor index `tensor`) against the source index.
 * Fails when a destination rank is not in the topology.
 */
refit_status_t needs_walk(const srcidx_t *src, const plan_layout_t *dst,
			  uint32_t tensor, const plan_topo_t *topo,
			  const needs_visitor_t *v, refit_err_t *err);

/* Cut box into boxes of at most max bytes (elem bytes per element),
 * outer dims first, appended to out (plan.c). */
void plan_box_chunk(const plan_box_t *box, int ndim, uint64_t elem, uint64_t max,
		    boxvec_t *out);
/* A 64-bit sort key and the index of what it sorts. */
typedef struct xkey {
	uint64_t key;
	uint32_t idx;
} xkey_t;

/* Stable LSD radix sort of k[0..n) on the low `bits` bits of key. */
void plan_radix_sort(xkey_t *k, size_t n, int bits);
/* Bits needed to write n (0 for 0). */
int plan_bits_for(uint64_t n);

/*
 * Sort the transfers raw[0..nraw) into plan order in place, count
 * messages, digest (plan.c).  Takes ownership of raw and of the box table
 * boxes[0..nboxes) their box fields index (both heap, from VEC or
 * xmalloc, may be NULL when empty).
 */
void plan_finalize(plan_t *p, plan_xfer_t *raw, size_t nraw, plan_box_t *boxes,
		   size_t nboxes);
/* Tensor table and options from the destination set (plan.c). */
void plan_init_tensors(plan_t *p, const plan_layout_set_t *dst,
		       const plan_opts_t *opts);

/* What the planners emit: plan_xfer_t itself (20 bytes, box by index). */
typedef plan_xfer_t plan_cx_t;
typedef VEC(plan_cx_t) cxvec_t;

/* Planners (planner.c, bcast.c). */
refit_status_t plan_reshard(const plan_layout_set_t *src,
			    const plan_layout_set_t *dst, const size_t *map,
			    const plan_topo_t *topo, const plan_opts_t *opts,
			    cxvec_t *out, boxvec_t *boxes,
			    uint32_t *stages_per_round, refit_err_t *err);
refit_status_t plan_broadcast(const plan_layout_set_t *src,
			      const plan_layout_set_t *dst, const size_t *map,
			      const plan_topo_t *topo, const plan_opts_t *opts,
			      cxvec_t *out, boxvec_t *boxes,
			      uint32_t *stages_per_round, refit_err_t *err);

static inline int
cmp_i32v(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

#endif
