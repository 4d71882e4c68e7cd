/*
 * test_convert.c - the conversion kernels against hand-computed bit
 * patterns (every rounding case of docs/conversion.md), block geometry,
 * and block quantization of strided views against a whole-tensor
 * reference written plainly here.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "dataplane/convert.h"
#include "tests/unit/gen.h"
#include "tests/unit/helpers.h"

typedef struct { uint32_t in; uint32_t want; } case_t;

static const case_t bf16_cases[] = {
	{0x3f800000, 0x3f80}, {0x3f808000, 0x3f80}, /* tie, even stays */
	{0x3f818000, 0x3f82}, /* tie, odd rounds up */
	{0x3f808001, 0x3f81}, {0xbf808001, 0xbf81},
	{0x7f7fffff, 0x7f80}, /* fp32 max rounds to inf */
	{0x7f7f7fff, 0x7f7f}, {0xff800000, 0xff80}, {0x7f800000, 0x7f80},
	{0x7fc00001, 0x7fc0}, {0xffc00000, 0x7fc0}, {0x7f800001, 0x7fc0},
	{0x00000001, 0x0000}, {0x00008000, 0x0000}, {0x00018000, 0x0002},
	{0x80000000, 0x8000}, {0x807fffff, 0x8080},
};

static const case_t fp16_cases[] = {
	{0x3f800000, 0x3c00}, {0x477fe000, 0x7bff}, {0x477fefff, 0x7bff},
	{0x477ff000, 0x7c00}, /* 65520: tie, rounds to inf */
	{0x7f800000, 0x7c00}, {0xff800000, 0xfc00}, {0x7f7fffff, 0x7c00},
	{0x33800000, 0x0001}, /* 2^-24 */
	{0x33000000, 0x0000}, /* 2^-25: tie to even 0 */
	{0xb3000000, 0x8000}, {0x33000001, 0x0001},
	{0x33400000, 0x0001}, {0x33c00000, 0x0002}, /* 3 * 2^-25: tie to even 2 */
	{0x38800000, 0x0400}, {0x387fc000, 0x03ff}, {0x387fe000, 0x0400},
	{0x7fc00000, 0x7e00}, {0xffc00001, 0x7e00}, {0x80000000, 0x8000},
	{0x3f801000, 0x3c00}, {0x3f803000, 0x3c02}, {0x00000001, 0x0000},
};

static const case_t e4m3_cases[] = {
	{0x00000000, 0x00}, {0x80000000, 0x80}, {0x3f800000, 0x38},
	{0x3f880000, 0x38}, /* 1.0625: tie to even 1.0 */
	{0x3f980000, 0x3a}, /* 1.1875: tie to even 1.25 */
	{0x3f880001, 0x39}, {0x43e00000, 0x7e}, {0xc3e00000, 0xfe},
	{0x43dfffff, 0x7e}, {0x43e80000, 0x7e}, /* 464: saturates */
	{0x4e6e6b28, 0x7e}, {0x7f800000, 0x7e}, {0xff800000, 0xfe},
	{0x7fc00000, 0x7f}, {0xffc00000, 0x7f}, {0x7f800001, 0x7f},
	{0x3c800000, 0x08}, /* 2^-6, smallest normal */
	{0x3b000000, 0x01}, /* 2^-9, smallest subnormal */
	{0x3a800000, 0x00}, /* 2^-10: tie to even 0 */
	{0xba800000, 0x80}, {0x3a800001, 0x01},
	{0x3b400000, 0x02}, /* 3 * 2^-10: tie to even 2 */
	{0x3c700000, 0x08}, /* 15 * 2^-10: tie to even 8, a normal */
	{0x3c600000, 0x07}, {0x43700000, 0x77}, {0x3f000000, 0x30},
	{0x00000001, 0x00}, {0x80000001, 0x80}, {0x3d100000, 0x11},
};

static uint32_t
cvt_bf16(uint32_t f32)
{
	return dp_cvt_bf16(f32);
}

static uint32_t
cvt_fp16(uint32_t f32)
{
	return dp_cvt_fp16(f32);
}

static uint32_t
cvt_e4m3(uint32_t f32)
{
	return dp_cvt_e4m3(f32);
}

/* A rounding kernel with its hand-computed cases. */
typedef struct kernel {
	const char *name;
	uint32_t (*cvt)(uint32_t f32);
	const case_t *c;
	size_t n;
} kernel_t;

#define KERNEL(name, fn, cases) {name, fn, cases, sizeof(cases) / sizeof(cases[0])}

static const kernel_t kernels[] = {
	KERNEL("bf16", cvt_bf16, bf16_cases),
	KERNEL("fp16", cvt_fp16, fp16_cases),
	KERNEL("e4m3", cvt_e4m3, e4m3_cases),
};

START_TEST(rounding)
{
	const kernel_t *k = &kernels[_i];

	for (size_t i = 0; i < k->n; i++)
		ck_assert_msg(k->cvt(k->c[i].in) == k->c[i].want, "%s(%08x) = %x, want %x", k->name,
			      k->c[i].in, k->cvt(k->c[i].in), k->c[i].want);
}
END_TEST

START_TEST(widen_and_scale)
{
	static const case_t h[] = {
		{0x0001, 0x33800000}, {0x8001, 0xb3800000}, {0x03ff, 0x387fc000},
		{0x7c00, 0x7f800000}, {0x7e00, 0x7fc00000}, {0x3c00, 0x3f800000},
		{0x0400, 0x38800000}, {0x8000, 0x80000000},
	};
	static const case_t s[] = {
		{0x00000000, 0x346facad}, /* zero block: 1e-4 / 448 */
		{0x38d1b716, 0x346facad}, /* just below 1e-4: clamped */
		{0x43e00000, 0x3f800000}, {0x44600000, 0x40000000},
		{0x7fc00123, DP_NAN32}, {0x7f800000, 0x7f800000},
	};
	uint16_t b = 0xc0a0;

	for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++) {
		uint16_t v = (uint16_t)h[i].in;

		ck_assert_uint_eq(dp_cvt_widen(&v, PLAN_DT_FP16), h[i].want);
	}
	ck_assert_uint_eq(dp_cvt_widen(&b, PLAN_DT_BF16), 0xc0a00000);
	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
		ck_assert_msg(dp_e4m3_scale_inv(s[i].in) == s[i].want, "scale(%08x) = %08x, "
			      "want %08x", s[i].in, dp_e4m3_scale_inv(s[i].in), s[i].want);
	ck_assert(dp_cvt_supported(PLAN_DT_FP32, PLAN_DT_BF16));
	ck_assert(dp_cvt_supported(PLAN_DT_BF16, PLAN_DT_FP8E4M3));
	ck_assert(!dp_cvt_supported(PLAN_DT_BF16, PLAN_DT_FP16));
	ck_assert(!dp_cvt_supported(PLAN_DT_FP32, PLAN_DT_FP8E5M2));
}
END_TEST

/* Special blocks: zeros, a NaN, an infinity; bf16 and fp16 sources. */
START_TEST(special_blocks)
{
	/* 2 x 4 fp32, blocks 2 x 2: [0 -0 | nan 1] / [0 0 | 2 3] and a row of inf */
	uint32_t x[2][6] = {{0x00000000, 0x80000000, 0x7fc00000, 0x3f800000, 0x7f800000, 0x40000000},
			    {0x00000000, 0x00000000, 0x40000000, 0x40400000, 0xc0400000, 0xff800000}};
	uint8_t q[2][6];
	uint32_t sc[3];
	dp_quant_t g = {PLAN_DT_FP32, PLAN_DT_FP8E4M3, 2, {2, 6}, {2, 2}, false};
	int64_t shape[2] = {2, 6}, gshape[2] = {1, 3};
	dp_view_t sv, qv, scv;
	plan_shard_t ss, gs;
	plan_box_t all;

	dp_view_contiguous(&sv, x, 2, shape, 4);
	dp_view_contiguous(&qv, q, 2, shape, 1);
	dp_view_contiguous(&scv, sc, 2, gshape, 4);
	plan_box_full(&all, shape, 2);
	dp_shard_of_box(&ss, &all);
	plan_box_full(&all, gshape, 2);
	dp_shard_of_box(&gs, &all);
	plan_box_full(&all, shape, 2);
	dp_quant_region(&g, &sv, &ss, &all, &qv, &ss, &scv, &gs);
	ck_assert_uint_eq(sc[0], 0x346facad);
	ck_assert_uint_eq(sc[1], DP_NAN32);
	ck_assert_uint_eq(sc[2], 0x7f800000);
	ck_assert_uint_eq(q[0][0], 0x00);
	ck_assert_uint_eq(q[0][1], 0x80);
	ck_assert_uint_eq(q[1][0], 0x00);
	for (int i = 0; i < 2; i++)
		for (int j = 2; j < 4; j++)
			ck_assert_uint_eq(q[i][j], 0x7f);
	ck_assert_uint_eq(q[0][4], 0x7f);  /* inf / inf */
	ck_assert_uint_eq(q[1][5], 0x7f);
	ck_assert_uint_eq(q[0][5], 0x00);  /* 2 / inf */
	ck_assert_uint_eq(q[1][4], 0x80);

	/* bf16 and fp16 sources: 3.0 with amax 896 (scale 2.0) is 1.5 */
	uint16_t bx[2] = {0x4040, 0x4460}, hx[2] = {0x4200, 0x6300};
	uint8_t bq[2], hq[2];

	ck_assert_uint_eq(dp_amax_run(bx, PLAN_DT_BF16, 2), 0x44600000);
	ck_assert_uint_eq(dp_amax_run(hx, PLAN_DT_FP16, 2), 0x44600000);
	ck_assert(dp_cvt_run(bx, PLAN_DT_BF16, bq, PLAN_DT_FP8E4M3, 0x40000000, 2));
	ck_assert(dp_cvt_run(hx, PLAN_DT_FP16, hq, PLAN_DT_FP8E4M3, 0x40000000, 2));
	ck_assert_uint_eq(bq[0], 0x3c);
	ck_assert_uint_eq(bq[1], 0x7e);
	ck_assert_uint_eq(hq[0], 0x3c);
	ck_assert_uint_eq(hq[1], 0x7e);
	ck_assert(!dp_cvt_run(bx, PLAN_DT_BF16, hq, PLAN_DT_FP16, 0, 2));
}
END_TEST

/* Plain whole-tensor reference: blocks of a row-major fp32 array. */
static void
ref_quant(const uint32_t *x, int nd, const int64_t *shape, const int64_t *blk,
	  uint8_t *q, uint32_t *sc)
{
	int64_t n = 1, grid[PLAN_MAX_DIMS], ng = 1;
	uint32_t *amax;

	for (int d = 0; d < nd; d++) {
		n *= shape[d];
		grid[d] = (shape[d] + blk[d] - 1) / blk[d];
		ng *= grid[d];
	}
	amax = xcalloc((size_t)ng, 4);
	for (int pass = 0; pass < 2; pass++) {
		for (int64_t i = 0; i < n; i++) {
			int64_t rem = i, gi = 0, c[PLAN_MAX_DIMS];

			for (int d = nd - 1; d >= 0; d--) {
				c[d] = rem % shape[d];
				rem /= shape[d];
			}
			for (int d = 0; d < nd; d++)
				gi = gi * grid[d] + c[d] / blk[d];
			if (pass == 0) {
				uint32_t a = x[i] & 0x7fffffffu;

				if (a > amax[gi])
					amax[gi] = a;
			} else {
				float f, s;

				memcpy(&f, &x[i], 4);
				memcpy(&s, &sc[gi], 4);
				f = f / s;
				memcpy(&rem, &f, 4);
				q[i] = dp_cvt_e4m3((uint32_t)rem);
			}
		}
		for (int64_t k = 0; pass == 0 && k < ng; k++)
			sc[k] = dp_e4m3_scale_inv(amax[k]);
	}
	free(amax);
}

/* Random fp32 bits: mostly normal values, some specials. */
static uint32_t
rnd_f32(unsigned *seed)
{
	static const uint32_t sp[] = {0, 0x80000000, 0x7f800000, 0x00000001, 0x3a800000};
	int r = gen_rnd(seed, 1000);

	if (r < 3)
		return sp[r];
	return (uint32_t)gen_rnd(seed, 2) << 31 | (uint32_t)(110 + gen_rnd(seed, 30)) << 23 |
	       (uint32_t)gen_rnd(seed, 1 << 23);
}

/* Quantizing sub-regions of strided views gives the whole-tensor result. */
START_TEST(regions_match_whole_tensor)
{
	unsigned seed = 7;

	for (int iter = 0; iter < 300; iter++) {
		int nd = 1 + gen_rnd(&seed, 3);
		dp_quant_t g = {PLAN_DT_FP32, PLAN_DT_FP8E4M3, nd, {0}, {0}, false};
		int64_t n = 1, ng = 1, grid[PLAN_MAX_DIMS], sstr = 1;
		plan_box_t full, want;
		plan_shard_t ss, qs, gs;
		dp_view_t sv, qv, scv;

		for (int d = 0; d < nd; d++) {
			g.shape[d] = 1 + gen_rnd(&seed, 9);
			g.block[d] = 1 + gen_rnd(&seed, 4);
			n *= g.shape[d];
		}
		dp_quant_grid(&g, grid);
		for (int d = 0; d < nd; d++)
			ng *= grid[d];
		uint32_t *x = xmalloc((size_t)n * 2 * 4), *sc = xmalloc((size_t)ng * 4),
			 *got_sc = xcalloc((size_t)ng, 4);
		uint8_t *q = xmalloc((size_t)n), *got = xcalloc((size_t)n, 1);

		/* the source is strided: every other element */
		memset(&sv, 0, sizeof(sv));
		sv.base = (uint8_t *)x;
		sv.ndim = nd;
		sv.elem = 4;
		for (int d = nd - 1; d >= 0; d--) {
			sv.shape[d] = g.shape[d];
			sv.stride[d] = 2 * sstr;
			sstr *= g.shape[d];
		}
		uint32_t *dense = xmalloc((size_t)n * 4);
		for (int64_t i = 0; i < n; i++)
			x[2 * i] = dense[i] = rnd_f32(&seed);
		ref_quant(dense, nd, g.shape, g.block, q, sc);
		plan_box_full(&full, g.shape, nd);
		dp_shard_of_box(&ss, &full);
		qs = ss;
		dp_view_contiguous(&qv, got, nd, g.shape, 1);
		plan_box_full(&full, grid, nd);
		dp_shard_of_box(&gs, &full);
		dp_view_contiguous(&scv, got_sc, nd, grid, 4);
		/* quantize the tensor in random pieces along dim 0 */
		for (int64_t a = 0; a < g.shape[0];) {
			int64_t b = a + 1 + gen_rnd(&seed, (int)(g.shape[0] - a));

			plan_box_full(&want, g.shape, nd);
			want.off[0] = a;
			want.size[0] = b - a;
			dp_quant_region(&g, &sv, &ss, &want, &qv, &qs, &scv, &gs);
			a = b;
		}
		ck_assert_msg(memcmp(q, got, (size_t)n) == 0, "iteration %d: fp8 differs", iter);
		ck_assert_msg(memcmp(sc, got_sc, (size_t)ng * 4) == 0, "iteration %d: scales differ",
			      iter);
		free(x);
		free(dense);
		free(sc);
		free(got_sc);
		free(q);
		free(got);
	}
}
END_TEST

/* MXFP8: e8m0 scale bytes, divisors, and a block quantized with them. */
START_TEST(mx_scales)
{
	static const case_t sb[] = {
		{0x43e00000, 127}, /* 448: 2^8 * 1.75 -> X = 0 */
		{0x3f800000, 119}, /* 1.0 -> X = -8 */
		{0x00000000, 0}, {0x00000001, 0}, /* zero, fp32 subnormal: X = -127 */
		{0x7f7fffff, 246}, {0x7f800000, 0xff}, {0x7fc00001, 0xff},
		{0x04000000, 0},   /* 2^-119: X = -127 (clamped) */
		{0x04800000, 1},
	};
	static const case_t dv[] = {
		{127, 0x3f800000}, {119, 0x3b800000}, {0, 0x00400000}, {1, 0x00800000},
		{254, 0x7f000000}, {0xff, 0x7fc00000},
	};
	/* a 1 x 4 block of fp32: amax 1.0 -> divisor 2^-8 */
	uint32_t x[4] = {0x3f800000, 0xbf000000, 0x3ff33333, 0x00000000};
	uint8_t q[4], sc = 0;
	dp_quant_t g = {PLAN_DT_FP32, PLAN_DT_FP8E4M3, 2, {1, 4}, {1, 4}, true};
	int64_t shape[2] = {1, 4}, gshape[2] = {1, 1};
	plan_box_t all, gall;
	plan_shard_t ss, gs;
	dp_view_t sv, qv, scv;

	for (size_t i = 0; i < sizeof(sb) / sizeof(sb[0]); i++)
		ck_assert_msg(dp_mx_scale(sb[i].in) == sb[i].want, "mx scale(%08x) = %u, want %u",
			      sb[i].in, dp_mx_scale(sb[i].in), sb[i].want);
	for (size_t i = 0; i < sizeof(dv) / sizeof(dv[0]); i++)
		ck_assert_uint_eq(dp_mx_divisor((uint8_t)dv[i].in), dv[i].want);
	plan_box_full(&all, shape, 2);
	dp_shard_of_box(&ss, &all);
	plan_box_full(&gall, gshape, 2);
	dp_shard_of_box(&gs, &gall);
	dp_view_contiguous(&sv, x, 2, shape, 4);
	dp_view_contiguous(&qv, q, 2, shape, 1);
	dp_view_contiguous(&scv, &sc, 2, gshape, 1);
	x[2] = 0x3ff33333;  /* 1.9: the block's amax, 486.4 after scaling: saturates */
	dp_quant_region(&g, &sv, &ss, &all, &qv, &ss, &scv, &gs);
	ck_assert_uint_eq(sc, 119);
	ck_assert_uint_eq(q[0], 0x78);   /* 256 */
	ck_assert_uint_eq(q[1], 0xf0);   /* -128 */
	ck_assert_uint_eq(q[2], 0x7e);   /* 486.4 -> 448 */
	ck_assert_uint_eq(q[3], 0x00);
}
END_TEST

Suite *
suite_convert(void)
{
	TCase *tc = th_tcase("kernels", 0, TH_TESTS(widen_and_scale, special_blocks, mx_scales,
			regions_match_whole_tensor));

	tcase_add_loop_test(tc, rounding, 0, sizeof(kernels) / sizeof(kernels[0]));
	return th_suite("convert", tc, NULL);
}
