/*
 * conv_dev.h - conversion on a device: dp_cvt_box and dp_quant_region of
 * dataplane/convert.h as launches of the conversion kernels
 * (dataplane/cvt_op.h) through dp_dev_ops_t.convert.
 *
 * A box of ndim dims goes as 2-D regions over its two innermost dims (one
 * row for 1-D, one element for 0-D), one launch per index of the leading
 * dims, with the views' own strides (no copy of a strided view first).
 * Scale blocks may therefore span only the two innermost dims: a leading
 * dim's block must be 1 (or the dim 1) -- dp_dev_quant_ok says so by name.
 * Launches are queued on the rank's stream; errors surface at the device's
 * sync.  Thread: the executor's.
 */
#ifndef REFIT_DATAPLANE_CONV_DEV_H
#define REFIT_DATAPLANE_CONV_DEV_H

#include "dataplane/convert.h"
#include "dataplane/exec.h"

/* Can the device run q (tensor `name`)?  A clear error when not. */
refit_status_t dp_dev_quant_ok(const dp_quant_t *q, const char *name, refit_err_t *err);
/* Bytes of device scratch dp_dev_quant needs for want (its blocks' scales). */
uint64_t dp_dev_quant_scratch(const dp_quant_t *q, const plan_box_t *want);
/* dp_cvt_box on rank's device (a cast: to is bf16 or fp16). */
void dp_dev_cvt_box(const dp_dev_ops_t *dev, int32_t rank, const dp_view_t *sv,
		    const plan_shard_t *ss, plan_dtype_t from, const dp_view_t *dv,
		    const plan_shard_t *ds, plan_dtype_t to, const plan_box_t *box);
/*
 * dp_quant_region on rank's device, the same arguments; scratch is device
 * memory of dp_dev_quant_scratch bytes (the scales of want's blocks, which
 * are computed there first, then copied into scv where scs holds them).
 */
void dp_dev_quant(const dp_dev_ops_t *dev, int32_t rank, const dp_quant_t *q,
		  const dp_view_t *sv, const plan_shard_t *ss, const plan_box_t *want,
		  const dp_view_t *qv, const plan_shard_t *qs, const dp_view_t *scv,
		  const plan_shard_t *scs, void *scratch);

#endif
