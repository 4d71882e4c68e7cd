/*
 * view.h - tensor memory as the data plane sees it, and box copies.
 *
 * A view is one rank's local tensor piece: a base pointer, local extents,
 * strides in elements (any non-negative strides: non-contiguous tensors
 * are fine) and the element size.  A shard (plan/layout.h) says which
 * global box a view holds and where that box starts locally (local_off), so
 * a global box inside the shard maps to local memory without any search.
 * libc only; no allocation.
 */
#ifndef REFIT_DATAPLANE_VIEW_H
#define REFIT_DATAPLANE_VIEW_H

#include "plan/layout.h"

typedef struct dp_view {
	uint8_t *base;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];   /* local extents */
	int64_t stride[PLAN_MAX_DIMS];  /* in elements */
	uint32_t elem;                  /* bytes per element */
} dp_view_t;

/* A row-major contiguous view of shape over base. */
void dp_view_contiguous(dp_view_t *v, void *base, int ndim, const int64_t *shape,
			uint32_t elem);
/* Bytes a contiguous view of shape needs. */
uint64_t dp_view_bytes(int ndim, const int64_t *shape, uint32_t elem);
/*
 * Local extents of rank's piece in l: for a DTensor rank, its local tensor
 * (every box it holds, concatenated); for an explicit shard, its box.
 * Fails when the rank holds no such piece.
 */
refit_status_t dp_local_shape(const plan_layout_t *l, int32_t rank, int32_t piece,
			      int64_t *shape, refit_err_t *err);
/*
 * Copy the global box (inside both shards' boxes) from sv (holding ss) to
 * dv (holding ds).  Innermost contiguous runs move with memcpy.
 */
void dp_copy_box(const dp_view_t *sv, const plan_shard_t *ss, const dp_view_t *dv,
		 const plan_shard_t *ds, const plan_box_t *box);
/* Pointer to global element g (inside sh's box) in view v, which holds sh. */
uint8_t *dp_view_at(const dp_view_t *v, const plan_shard_t *sh, const int64_t *g);
/* A shard describing a contiguous buffer that holds exactly box. */
void dp_shard_of_box(plan_shard_t *sh, const plan_box_t *box);

#endif
