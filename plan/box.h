/*
 * box.h - N-dimensional boxes of tensor elements, and dtypes.
 *
 * A box is a half-open hyper-rectangle [off, off+size) in global tensor
 * coordinates.  The number of dims is not stored in the box: every tensor
 * knows its ndim and passes it along, so a box array costs no per-box header.
 * Pure functions, no allocation, no I/O.
 */
#ifndef REFIT_PLAN_BOX_H
#define REFIT_PLAN_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/alloc.h"
#include "common/err.h"

#define PLAN_MAX_DIMS 8
/* a - b yields at most this many disjoint pieces */
#define PLAN_BOX_SUB_MAX (2 * PLAN_MAX_DIMS)

typedef struct plan_box {
	int64_t off[PLAN_MAX_DIMS];
	int64_t size[PLAN_MAX_DIMS];
} plan_box_t;

typedef VEC(plan_box_t) plan_boxvec_t;

typedef enum plan_dtype {
	PLAN_DT_BOOL, PLAN_DT_UINT8, PLAN_DT_INT8, PLAN_DT_INT16, PLAN_DT_INT32,
	PLAN_DT_INT64, PLAN_DT_FP8E4M3, PLAN_DT_FP8E5M2, PLAN_DT_FP16,
	PLAN_DT_BF16, PLAN_DT_FP32, PLAN_DT_FP64, PLAN_DT_COUNT
} plan_dtype_t;

/* Parse a dtype name ("bf16", also "bfloat16", "torch.bfloat16", ...). */
refit_status_t plan_dtype_parse(const char *s, plan_dtype_t *out);
/* Canonical name ("bf16"). */
const char *plan_dtype_name(plan_dtype_t dt);
/* Bytes per element. */
size_t plan_dtype_size(plan_dtype_t dt);

/* Product of sizes; 0 for an empty box, 1 for ndim 0.  (This and the
 * other small predicates are inline: the planner calls them per transfer.) */
static inline int64_t
plan_box_volume(const plan_box_t *b, int ndim)
{
	int64_t v = 1;

	for (int d = 0; d < ndim; d++)
		v *= b->size[d];
	return v;
}

static inline bool
plan_box_is_empty(const plan_box_t *b, int ndim)
{
	for (int d = 0; d < ndim; d++)
		if (b->size[d] <= 0)
			return true;
	return false;
}

/* The whole tensor of `shape`. */
void plan_box_full(plan_box_t *b, const int64_t *shape, int ndim);
/* out = a & b; returns false (out unspecified) when the result is empty. */
bool plan_box_intersect(const plan_box_t *a, const plan_box_t *b, int ndim,
			plan_box_t *out);
static inline bool
plan_box_overlaps(const plan_box_t *a, const plan_box_t *b, int ndim)
{
	for (int d = 0; d < ndim; d++) {
		if (a->off[d] >= b->off[d] + b->size[d] ||
		    b->off[d] >= a->off[d] + a->size[d] ||
		    a->size[d] <= 0 || b->size[d] <= 0)
			return false;
	}
	return true;
}

/* true when every element of inner lies in outer (an empty inner: true). */
bool plan_box_contains(const plan_box_t *outer, const plan_box_t *inner, int ndim);
/*
 * Disjoint non-empty pieces of a - b written to out[PLAN_BOX_SUB_MAX];
 * returns how many.  When a and b do not overlap, out[0] = a.
 */
int plan_box_subtract(const plan_box_t *a, const plan_box_t *b, int ndim,
		      plan_box_t *out);
/*
 * rem := rem - cut, piece by piece (the pieces stay disjoint when they
 * were); tmp is scratch storage owned by the caller.
 */
void plan_boxvec_subtract(plan_boxvec_t *rem, const plan_box_t *cut, int ndim,
			  plan_boxvec_t *tmp);
static inline bool
plan_box_equal(const plan_box_t *a, const plan_box_t *b, int ndim)
{
	for (int d = 0; d < ndim; d++)
		if (a->off[d] != b->off[d] || a->size[d] != b->size[d])
			return false;
	return true;
}

/* Total order: offsets lexicographically, then sizes. */
int plan_box_cmp(const plan_box_t *a, const plan_box_t *b, int ndim);
/* true when every element of the box lies within shape. */
bool plan_box_in_bounds(const plan_box_t *b, const int64_t *shape, int ndim);
/*
 * Split b along dim into k near-equal consecutive slabs (1 <= k <= size[dim]),
 * written to out[k].
 */
void plan_box_split(const plan_box_t *b, int dim, int64_t k, plan_box_t *out);

struct strbuf;
/* Append "offset [o0, o1] size [s0, s1]" (error messages). */
void plan_box_str(struct strbuf *sb, const plan_box_t *b, int ndim);

#endif
