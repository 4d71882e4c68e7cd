/*
 * test_box.c - box algebra, dtypes, chunking.
 */
#include <stdio.h>
#include <stdlib.h>

#include "plan/internal.h"
#include "tests/unit/helpers.h"

static plan_box_t
B2(int64_t o0, int64_t o1, int64_t s0, int64_t s1)
{
	plan_box_t b = {{o0, o1}, {s0, s1}};

	return b;
}

START_TEST(intersect_and_contains)
{
	plan_box_t a = B2(0, 0, 4, 4), b = B2(2, 3, 4, 4), c = B2(4, 0, 1, 1), out;

	ck_assert(plan_box_intersect(&a, &b, 2, &out));
	ck_assert(plan_box_equal(&out, &(plan_box_t){{2, 3}, {2, 1}}, 2));
	ck_assert(!plan_box_intersect(&a, &c, 2, &out)); /* touching edges */
	ck_assert(!plan_box_overlaps(&a, &c, 2));
	ck_assert(plan_box_contains(&a, &out, 2));
	ck_assert(!plan_box_contains(&out, &a, 2));
	ck_assert_int_eq(plan_box_volume(&a, 2), 16);
	ck_assert_int_eq(plan_box_volume(&a, 0), 1);
	ck_assert(plan_box_is_empty(&(plan_box_t){{0, 0}, {3, 0}}, 2));
	ck_assert(plan_box_contains(&c, &(plan_box_t){{9, 9}, {0, 3}}, 2));
}
END_TEST

/* a - b: pieces are disjoint, inside a, outside b, and add up. */
START_TEST(subtract_random)
{
	unsigned seed = 7;

	for (int iter = 0; iter < 5000; iter++) {
		int nd = 1 + rand_r(&seed) % 4;
		plan_box_t a, b, out[PLAN_BOX_SUB_MAX], in;
		int64_t vol = 0;
		int n;

		for (int d = 0; d < nd; d++) {
			a.off[d] = rand_r(&seed) % 5;
			a.size[d] = 1 + rand_r(&seed) % 5;
			b.off[d] = rand_r(&seed) % 8;
			b.size[d] = 1 + rand_r(&seed) % 5;
		}
		n = plan_box_subtract(&a, &b, nd, out);
		for (int i = 0; i < n; i++) {
			ck_assert(plan_box_contains(&a, &out[i], nd));
			ck_assert(!plan_box_overlaps(&out[i], &b, nd));
			for (int j = i + 1; j < n; j++)
				ck_assert(!plan_box_overlaps(&out[i], &out[j], nd));
			vol += plan_box_volume(&out[i], nd);
		}
		if (plan_box_intersect(&a, &b, nd, &in))
			vol += plan_box_volume(&in, nd);
		ck_assert_int_eq(vol, plan_box_volume(&a, nd));
		ck_assert_int_le(n, 2 * nd);
	}
}
END_TEST

START_TEST(split_near_equal)
{
	plan_box_t b = B2(10, 0, 7, 3), out[3];

	plan_box_split(&b, 0, 3, out);
	ck_assert_int_eq(out[0].off[0], 10);
	ck_assert_int_eq(out[0].size[0], 3);
	ck_assert_int_eq(out[1].off[0], 13);
	ck_assert_int_eq(out[1].size[0], 2);
	ck_assert_int_eq(out[2].off[0], 15);
	ck_assert_int_eq(out[2].size[0], 2);
	ck_assert_int_eq(out[2].size[1], 3);
}
END_TEST

START_TEST(chunk_bounds_and_tiles)
{
	unsigned seed = 11;

	for (int iter = 0; iter < 2000; iter++) {
		int nd = 1 + rand_r(&seed) % 4;
		uint64_t elem = 1u << (rand_r(&seed) % 4), max = 8 + rand_r(&seed) % 300;

		if (nd == 4)
			max *= 16; /* keep the pairwise check below small */
		plan_box_t b;
		boxvec_t out = {0};
		int64_t vol = 0;

		for (int d = 0; d < nd; d++) {
			b.off[d] = rand_r(&seed) % 4;
			b.size[d] = 1 + rand_r(&seed) % 9;
		}
		plan_box_chunk(&b, nd, elem, max, &out);
		for (size_t i = 0; i < out.n; i++) {
			ck_assert(plan_box_contains(&b, &out.v[i], nd));
			ck_assert_uint_le(plan_box_volume(&out.v[i], nd) * elem,
					  max < elem ? elem : max);
			for (size_t j = i + 1; j < out.n; j++)
				ck_assert(!plan_box_overlaps(&out.v[i], &out.v[j], nd));
			vol += plan_box_volume(&out.v[i], nd);
		}
		ck_assert_int_eq(vol, plan_box_volume(&b, nd));
		VEC_FREE(&out);
	}
}
END_TEST

START_TEST(dtypes)
{
	plan_dtype_t dt;
	static const struct { const char *n; size_t sz; } t[] = {
		{"bool", 1}, {"uint8", 1}, {"int8", 1}, {"int16", 2}, {"int32", 4},
		{"int64", 8}, {"fp8e4m3", 1}, {"fp8e5m2", 1}, {"fp16", 2}, {"bf16", 2},
		{"fp32", 4}, {"fp64", 8},
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		ck_assert_int_eq(plan_dtype_parse(t[i].n, &dt), REFIT_OK);
		ck_assert_uint_eq(plan_dtype_size(dt), t[i].sz);
		ck_assert_str_eq(plan_dtype_name(dt), t[i].n);
	}
	ck_assert_int_eq(plan_dtype_parse("torch.bfloat16", &dt), REFIT_OK);
	ck_assert_int_eq(dt, PLAN_DT_BF16);
	ck_assert_int_eq(plan_dtype_parse("float8_e4m3fn", &dt), REFIT_OK);
	ck_assert_int_eq(dt, PLAN_DT_FP8E4M3);
	ck_assert_int_eq(plan_dtype_parse("fp4", &dt), REFIT_ERR_INVALID_ARG);
}
END_TEST

START_TEST(box_cmp_order)
{
	plan_box_t a = B2(0, 1, 2, 2), b = B2(0, 2, 1, 1), c = B2(0, 1, 2, 3);

	ck_assert_int_lt(plan_box_cmp(&a, &b, 2), 0);
	ck_assert_int_gt(plan_box_cmp(&b, &a, 2), 0);
	ck_assert_int_lt(plan_box_cmp(&a, &c, 2), 0);
	ck_assert_int_eq(plan_box_cmp(&a, &a, 2), 0);
	ck_assert(plan_box_in_bounds(&a, (int64_t[]){2, 3}, 2));
	ck_assert(!plan_box_in_bounds(&a, (int64_t[]){2, 2}, 2));
}
END_TEST

Suite *
suite_box(void)
{
	return th_suite("box", th_tcase("core", 0, TH_TESTS(intersect_and_contains, subtract_random,
			split_near_equal, chunk_bounds_and_tiles, dtypes, box_cmp_order)), NULL);
}
