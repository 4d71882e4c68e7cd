/*
 * convert.h - precision conversion as a rewrite of a layout pair
 * (docs/conversion.md).
 *
 * A destination tensor with a `conv` (plan/layout.h) is stored in another
 * dtype than its source.  plan_convert_apply turns (src, dst) into a plain
 * pair (every tensor the same dtype on both sides) whose dtypes are what
 * crosses the wire, so the planner, validator and cost model count
 * converted sizes without knowing about conversion:
 *   - casts, and scaled fp8 whose senders hold whole blocks, convert on the
 *     sender: the rewritten source has the destination dtype on the shards
 *     that hold whole blocks, plus a source for the scale tensor (each such
 *     shard's block grid, on the same rank);
 *   - other scaled fp8 converts on the receiver: the rewritten destination
 *     has the source dtype, every box widened to whole blocks, plus the
 *     element boxes of the scale shards; the scale tensor leaves the
 *     destination (the receiver computes it).
 * The tables say, for the executor's memory wrapper (dataplane/conv_exec.h),
 * what every rewritten tensor and shard stands for.
 *
 * Pure: no I/O.  Errors name the tensor and the field.
 */
#ifndef REFIT_PLAN_CONVERT_H
#define REFIT_PLAN_CONVERT_H

#include "plan/layout.h"

typedef enum plan_conv_site {
	PLAN_CONV_SENDER,
	PLAN_CONV_RECEIVER,
} plan_conv_site_t;

/* Receiver side: a shard of the rewritten destination stands for this. */
typedef struct plan_conv_shard {
	bool is_scale;        /* a shard of the scale tensor (else of the tensor) */
	uint32_t orig;        /* its index in the original destination layout */
} plan_conv_shard_t;

typedef struct plan_conv_tensor {
	uint32_t src, dst;        /* original indices */
	int64_t scale_dst;        /* original index of the scale tensor; -1: none */
	plan_conv_site_t site;
	plan_dtype_t from, to;
	plan_scale_t scale;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	int64_t block[PLAN_MAX_DIMS]; /* every dim: 1 for casts, the shape for a tensor scale */
	int64_t grid[PLAN_MAX_DIMS];  /* ceil(shape / block) */
	/* in the rewritten sets */
	uint32_t dst2;            /* this tensor in the rewritten destination */
	int64_t scale_dst2;       /* sender side, scaled: the scale tensor; else -1 */
	uint32_t *src_shard;      /* sender side: original source shard of each
				     rewritten source shard (and of each scale
				     source shard, one to one) */
	plan_conv_shard_t *dst_shard; /* receiver side: per rewritten dst shard */
	size_t nshards;           /* entries of src_shard or dst_shard */
} plan_conv_tensor_t;

typedef struct plan_conv {
	plan_layout_set_t src, dst;  /* the rewritten pair plans are built from */
	uint32_t *dst_orig;          /* rewritten dst index -> original dst index */
	int64_t *dst_conv;           /* rewritten dst index -> index in t, or -1 */
	plan_conv_tensor_t *t;
	size_t n;
} plan_conv_t;

/* Check one destination tensor's conversion on its own (the codec calls
 * it): dtype pair, scale kind, block entries. */
refit_status_t plan_convert_check_spec(const plan_layout_t *l, refit_err_t *err);
/* Does any destination tensor convert? */
bool plan_convert_any(const plan_layout_set_t *dst);
/*
 * Rewrite (src, dst) into out (caller storage; plan_convert_fini).  Checks
 * the conversions against the sources and the scale tensors (dtype, shape,
 * named by exactly one tensor, no source of their own).  Without
 * conversions out is a copy.  On error out is zeroed.
 */
refit_status_t plan_convert_apply(const plan_layout_set_t *src,
				  const plan_layout_set_t *dst, plan_conv_t *out,
				  refit_err_t *err);
void plan_convert_fini(plan_conv_t *c);
/*
 * Check a rewrite independently of how it was made: sender-side source
 * shards hold whole blocks and cover the tensor; receiver-side boxes are
 * block-aligned, contain the box they stand for, and every block of every
 * scale shard is inside one of its rank's boxes.  REFIT_ERR_INTERNAL names
 * the tensor and the shard.
 */
refit_status_t plan_convert_check(const plan_conv_t *c, const plan_layout_set_t *src,
				  const plan_layout_set_t *dst, refit_err_t *err);
/*
 * The same refit without conversion, for comparisons: out (initialised
 * here) is dst with every converted tensor in its source dtype and the
 * scale tensors left out.
 */
void plan_convert_strip(const plan_layout_set_t *dst, plan_layout_set_t *out);
/*
 * FP8 inference for a generated model (refit-plan model --infer-dtype):
 * out (initialised here) is dst with every linear projection weight (a
 * name ending in "_proj.weight" or "_proj_with_mqa.weight", 2 or 3 dims)
 * in fp8e4m3 from its dtype, with block scales of block[0] x block[1]
 * (0 x 0: one scale per tensor), and a scale tensor "<name>_scale_inv"
 * laid out like the weight (same mesh and placements over the grid).
 */
refit_status_t plan_convert_model_fp8(const plan_layout_set_t *dst, const int64_t *block,
				      plan_layout_set_t *out, refit_err_t *err);
/*
 * plan_match for a pair that may convert: the conversions are checked and
 * the rewritten pair matched (the registry's check of a new instance).
 */
refit_status_t plan_convert_match(const plan_layout_set_t *src,
				  const plan_layout_set_t *dst, refit_err_t *err);
/*
 * Replace (src, dst) in place by their rewritten pair (nothing to do
 * without conversions): for planners that need only the plan.
 */
refit_status_t plan_convert_rewrite(plan_layout_set_t *src, plan_layout_set_t *dst,
				    refit_err_t *err);
/* Tensors of dst that convert, and the bytes of their scale tensors. */
size_t plan_convert_count(const plan_conv_t *c, plan_conv_site_t site);

/* The scale tensor's dtype: uint8 (e8m0 bytes) for MX, else fp32. */
plan_dtype_t plan_conv_scale_dtype(plan_scale_t s);
/* "sender" / "receiver" */
const char *plan_conv_site_name(plan_conv_site_t s);

#endif
