/*
 * convert.c - precision conversion kernels (see convert.h and
 * docs/conversion.md for the rules).
 */
#include <string.h>

#include "dataplane/convert.h"
#include "dataplane/convert_elem.h"

/*
 * The host entry points of the element rules, which live in convert_elem.h
 * (shared with the CUDA kernels): each is the rule of that name, called.
 */
#define HOST_RULE(ret, name, arg, rule) \
	ret name(arg v)                 \
	{                               \
		return rule(v);         \
	}

HOST_RULE(uint16_t, dp_cvt_bf16, uint32_t, dp_elem_bf16)
HOST_RULE(uint16_t, dp_cvt_fp16, uint32_t, dp_elem_fp16)
HOST_RULE(uint8_t, dp_cvt_e4m3, uint32_t, dp_elem_e4m3)
HOST_RULE(uint32_t, dp_e4m3_scale_inv, uint32_t, dp_elem_scale_inv)
HOST_RULE(uint8_t, dp_mx_scale, uint32_t, dp_elem_mx_scale)
HOST_RULE(uint32_t, dp_mx_divisor, uint8_t, dp_elem_mx_divisor)

#define bits_of dp_bits_of
#define float_of dp_float_of
#define widen_fp16 dp_widen_fp16

uint32_t
dp_cvt_widen(const void *p, plan_dtype_t dt)
{
	uint32_t u;
	uint16_t h;

	switch (dt) {
	case PLAN_DT_FP32:
		memcpy(&u, p, 4);
		return u;
	case PLAN_DT_BF16:
		memcpy(&h, p, 2);
		return (uint32_t)h << 16;
	case PLAN_DT_FP16:
		memcpy(&h, p, 2);
		return widen_fp16(h);
	default:
		return 0;
	}
}


bool
dp_cvt_supported(plan_dtype_t from, plan_dtype_t to)
{
	bool wide = from == PLAN_DT_FP32 || from == PLAN_DT_BF16 || from == PLAN_DT_FP16;

	if (to == PLAN_DT_BF16 || to == PLAN_DT_FP16)
		return from == PLAN_DT_FP32;
	return to == PLAN_DT_FP8E4M3 && wide;
}

/* The run loops: one per source dtype so the widening inlines. */
#define RUN_LOOP(ELEM_T, WIDEN)                                                  \
	do {                                                                     \
		const ELEM_T *in = src;                                          \
		if (to == PLAN_DT_BF16) {                                        \
			uint16_t *o = dst;                                       \
			for (size_t i = 0; i < n; i++)                           \
				o[i] = dp_elem_bf16(WIDEN(in[i]));                \
		} else if (to == PLAN_DT_FP16) {                                 \
			uint16_t *o = dst;                                       \
			for (size_t i = 0; i < n; i++)                           \
				o[i] = dp_elem_fp16(WIDEN(in[i]));                \
		} else {                                                         \
			uint8_t *o = dst;                                        \
			for (size_t i = 0; i < n; i++)                           \
				o[i] = dp_elem_e4m3(bits_of(float_of(WIDEN(in[i])) / s)); \
		}                                                                \
	} while (0)

#define W32(x) (x)
#define W16B(x) ((uint32_t)(x) << 16)
#define W16H(x) widen_fp16(x)

bool
dp_cvt_run(const void *src, plan_dtype_t from, void *dst, plan_dtype_t to,
	   uint32_t scale_inv, size_t n)
{
	float s = float_of(scale_inv);

	if (!dp_cvt_supported(from, to))
		return false;
	if (from == PLAN_DT_FP32)
		RUN_LOOP(uint32_t, W32);
	else if (from == PLAN_DT_BF16)
		RUN_LOOP(uint16_t, W16B);
	else
		RUN_LOOP(uint16_t, W16H);
	return true;
}

uint32_t
dp_amax_run(const void *src, plan_dtype_t dt, size_t n)
{
	uint32_t m = 0;

	/* |x| as fp32 bits orders like |x|, and NaN bits lie above inf */
	if (dt == PLAN_DT_FP32) {
		const uint32_t *in = src;

		for (size_t i = 0; i < n; i++) {
			uint32_t a = in[i] & 0x7fffffffu;

			m = a > m ? a : m;
		}
	} else if (dt == PLAN_DT_BF16) {
		const uint16_t *in = src;

		for (size_t i = 0; i < n; i++) {
			uint32_t a = ((uint32_t)in[i] << 16) & 0x7fffffffu;

			m = a > m ? a : m;
		}
	} else {
		const uint16_t *in = src;

		for (size_t i = 0; i < n; i++) {
			uint32_t a = widen_fp16(in[i]) & 0x7fffffffu;

			m = a > m ? a : m;
		}
	}
	return m;
}

/* Odometer over every dim but the last; false when done. */
static bool
next_row(int64_t *g, const plan_box_t *box, int nd)
{
	int d = nd - 2;

	while (d >= 0 && ++g[d] == box->off[d] + box->size[d]) {
		g[d] = box->off[d];
		d--;
	}
	return d >= 0;
}

void
dp_cvt_box(const dp_view_t *sv, const plan_shard_t *ss, plan_dtype_t from,
	   const dp_view_t *dv, const plan_shard_t *ds, plan_dtype_t to,
	   uint32_t scale_inv, const plan_box_t *box)
{
	int nd = sv->ndim;
	int64_t g[PLAN_MAX_DIMS], run;

	if (plan_box_is_empty(box, nd))
		return;
	if (nd == 0) {
		dp_cvt_run(sv->base, from, dv->base, to, scale_inv, 1);
		return;
	}
	run = box->size[nd - 1];
	memcpy(g, box->off, sizeof(g));
	do {
		uint8_t *s = dp_view_at(sv, ss, g), *t = dp_view_at(dv, ds, g);

		if (sv->stride[nd - 1] == 1 && dv->stride[nd - 1] == 1) {
			dp_cvt_run(s, from, t, to, scale_inv, (size_t)run);
		} else {
			for (int64_t k = 0; k < run; k++)
				dp_cvt_run(s + k * sv->stride[nd - 1] * (int64_t)sv->elem, from,
					   t + k * dv->stride[nd - 1] * (int64_t)dv->elem, to,
					   scale_inv, 1);
		}
	} while (next_row(g, box, nd));
}

uint32_t
dp_amax_box(const dp_view_t *sv, const plan_shard_t *ss, plan_dtype_t dt,
	    const plan_box_t *box)
{
	int nd = sv->ndim;
	int64_t g[PLAN_MAX_DIMS], run;
	uint32_t m = 0, a;

	if (plan_box_is_empty(box, nd))
		return 0;
	if (nd == 0)
		return dp_amax_run(sv->base, dt, 1);
	run = box->size[nd - 1];
	memcpy(g, box->off, sizeof(g));
	do {
		uint8_t *s = dp_view_at(sv, ss, g);

		if (sv->stride[nd - 1] == 1) {
			a = dp_amax_run(s, dt, (size_t)run);
			m = a > m ? a : m;
		} else {
			for (int64_t k = 0; k < run; k++) {
				a = dp_amax_run(s + k * sv->stride[nd - 1] * (int64_t)sv->elem, dt, 1);
				m = a > m ? a : m;
			}
		}
	} while (next_row(g, box, nd));
	return m;
}

void
dp_quant_grid(const dp_quant_t *q, int64_t *grid)
{
	for (int d = 0; d < q->ndim; d++)
		grid[d] = (q->shape[d] + q->block[d] - 1) / q->block[d];
}

/* Write one scale (4 bytes, or 1 for a 1-byte view: e8m0) at grid
 * coordinate gc when scs holds it. */
static void
put_scale(const dp_view_t *scv, const plan_shard_t *scs, const int64_t *gc, int nd,
	  uint32_t s)
{
	plan_box_t one;
	uint8_t b = (uint8_t)s;
	const void *src = scv->elem == 1 ? (const void *)&b : (const void *)&s;

	if (scv->ndim == 0) {
		memcpy(scv->base, src, scv->elem);
		return;
	}
	for (int d = 0; d < nd; d++) {
		one.off[d] = gc[d];
		one.size[d] = 1;
	}
	if (plan_box_contains(&scs->box, &one, nd))
		memcpy(dp_view_at(scv, scs, gc), src, scv->elem);
}

void
dp_quant_region(const dp_quant_t *q, const dp_view_t *sv, const plan_shard_t *ss,
		const plan_box_t *want, const dp_view_t *qv, const plan_shard_t *qs,
		const dp_view_t *scv, const plan_shard_t *scs)
{
	int nd = q->ndim;
	int64_t lo[PLAN_MAX_DIMS], hi[PLAN_MAX_DIMS], gc[PLAN_MAX_DIMS];

	if (plan_box_is_empty(want, nd))
		return;
	for (int d = 0; d < nd; d++) {
		lo[d] = want->off[d] / q->block[d];
		hi[d] = (want->off[d] + want->size[d] - 1) / q->block[d];
		gc[d] = lo[d];
	}
	for (;;) {
		plan_box_t blk, part;
		uint32_t s, sbyte;
		int d;

		for (d = 0; d < nd; d++) {
			int64_t a = gc[d] * q->block[d], b = a + q->block[d];

			blk.off[d] = a;
			blk.size[d] = (b < q->shape[d] ? b : q->shape[d]) - a;
		}
		s = dp_amax_box(sv, ss, q->from, &blk);
		if (q->mx) {   /* the byte to store; divide by the power of two */
			uint8_t e = dp_mx_scale(s);

			sbyte = e;
			s = dp_mx_divisor(e);
		} else {
			s = dp_e4m3_scale_inv(s);
			sbyte = s;
		}
		if (qv && plan_box_intersect(&blk, want, nd, &part))
			dp_cvt_box(sv, ss, q->from, qv, qs, q->to, s, &part);
		if (scv)
			put_scale(scv, scs, gc, nd, sbyte);
		for (d = nd - 1; d >= 0 && ++gc[d] > hi[d]; d--)
			gc[d] = lo[d];
		if (d < 0)
			break;
	}
}
