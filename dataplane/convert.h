/*
 * convert.h - precision conversion kernels (host): fp32 -> bf16/fp16 casts,
 * and bf16/fp16/fp32 -> fp8e4m3 with a scale per block or per tensor.
 *
 * The numerics are docs/conversion.md's (round to nearest even, e4m3
 * saturating to 448, scale_inv = max(amax, 1e-4) / 448, q = x / scale_inv,
 * canonical NaNs); tests/conversion/ref.py is the independent reference.
 * Element functions are branch-light so the run loops vectorise; box
 * functions walk strided views (dataplane/view.h) run by run.
 *
 * libc only, no allocation, no I/O.  Thread: any.
 */
#ifndef REFIT_DATAPLANE_CONVERT_H
#define REFIT_DATAPLANE_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "dataplane/view.h"

#define DP_E4M3_MAX 448.0f
#define DP_AMAX_MIN 1e-4f
#define DP_NAN32 0x7fc00000u   /* the scale of a block holding a NaN */

/* fp32 bits -> bf16 bits, fp16 bits, e4m3 code (docs/conversion.md). */
uint16_t dp_cvt_bf16(uint32_t f32);
uint16_t dp_cvt_fp16(uint32_t f32);
uint8_t dp_cvt_e4m3(uint32_t f32);
/* Exact widening of one element of dtype (fp32, bf16, fp16) to fp32 bits. */
uint32_t dp_cvt_widen(const void *p, plan_dtype_t dt);
/* e4m3 scale_inv (fp32 bits) of a block whose max |x| has fp32 bits amax
 * (any NaN bits: a block holding a NaN). */
uint32_t dp_e4m3_scale_inv(uint32_t amax);
/* MXFP8: the e8m0 scale byte of a block, and the divisor (fp32 bits) of a byte. */
uint8_t dp_mx_scale(uint32_t amax);
uint32_t dp_mx_divisor(uint8_t e8m0);

/* Contiguous runs: n elements of `from` at src into `to` at dst; scale_inv
 * (fp32 bits) is used by fp8e4m3 targets only.  Returns false (nothing
 * written) for a pair that is not a conversion. */
bool dp_cvt_run(const void *src, plan_dtype_t from, void *dst, plan_dtype_t to,
		uint32_t scale_inv, size_t n);
/* max |x| (fp32 bits, NaN bits above inf when any NaN) of n elements. */
uint32_t dp_amax_run(const void *src, plan_dtype_t dt, size_t n);

/* Can `from` be converted to `to` (a cast, or e4m3 with scales)? */
bool dp_cvt_supported(plan_dtype_t from, plan_dtype_t to);

/*
 * One quantization's geometry: the tensor's shape, its dtypes and the
 * block (a tensor scale is a block of the whole shape).
 */
typedef struct dp_quant {
	plan_dtype_t from, to;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	int64_t block[PLAN_MAX_DIMS];   /* >= 1; 1 everywhere for a cast */
	bool mx;                        /* MXFP8: e8m0 byte scales (1-byte scale view) */
} dp_quant_t;

/*
 * Element-wise conversion of the global box (inside both shards) from sv
 * (dtype from) into dv (dtype to) with one scale (fp32 bits; ignored by casts).
 */
void dp_cvt_box(const dp_view_t *sv, const plan_shard_t *ss, plan_dtype_t from,
		const dp_view_t *dv, const plan_shard_t *ds, plan_dtype_t to,
		uint32_t scale_inv, const plan_box_t *box);
/* max |x| over the global box of sv (inside ss). */
uint32_t dp_amax_box(const dp_view_t *sv, const plan_shard_t *ss, plan_dtype_t dt,
		     const plan_box_t *box);
/*
 * Quantize every block that meets `want` (a box in element coordinates):
 * the block's scale is computed from the whole block, read from sv (which
 * must hold every such block whole, clipped to the shape); the elements of
 * block & want are written to qv/qs (unless qv is NULL), and the block's
 * scale_inv to scv/scs at the block's grid coordinate when scs holds it
 * (unless scv is NULL; a 0-dim scale view is the tensor scale).
 */
void dp_quant_region(const dp_quant_t *q, const dp_view_t *sv, const plan_shard_t *ss,
		     const plan_box_t *want, const dp_view_t *qv, const plan_shard_t *qs,
		     const dp_view_t *scv, const plan_shard_t *scs);
/* Grid of scale blocks: grid[d] = ceil(shape[d] / block[d]). */
void dp_quant_grid(const dp_quant_t *q, int64_t *grid);

#endif
