/*
 * test_layout.c - DTensor semantics, explicit layouts, validation messages,
 * coverage and matching.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "tests/unit/helpers.h"

static void
assert_box1(const plan_shard_t *s, int d, int64_t off, int64_t size)
{
	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(s->box.off[d], off);
	ck_assert_int_eq(s->box.size[d], size);
}

/* PyTorch's documented example: (2,5) on [[0,1],[2,3]], Shard(1), Shard(1). */
START_TEST(pytorch_shard_shard_same_dim)
{
	plan_layout_t l;
	int64_t offs[4] = {0, 2, 3, 4}, sizes[4] = {2, 1, 1, 1};

	th_layout("{\"name\":\"t\",\"dtype\":\"fp32\",\"shape\":[2,5],"
		  "\"mesh\":[[0,1],[2,3]],\"placements\":[\"Shard(1)\",\"Shard(1)\"]}", &l);
	ck_assert_uint_eq(l.nshards, 4);
	for (int r = 0; r < 4; r++) {
		assert_box1(th_shard(&l, r, 0), 1, offs[r], sizes[r]);
		assert_box1(th_shard(&l, r, 0), 0, 0, 2);
	}
	plan_layout_fini(&l);
}
END_TEST

#define T(dtype, shape, mesh, pl) \
	"{\"name\":\"t\",\"dtype\":\"" dtype "\",\"shape\":" shape ",\"mesh\":" mesh \
	",\"placements\":" pl "}"

/* A dim of the first shard of a rank: offset and size. */
typedef struct box1 {
	int32_t rank;
	int d;
	int64_t off, size;
} box1_t;

/* Uneven and empty shards: layouts and dims of their ranks' shards. */
static const struct uneven {
	const char *json;
	int n;
	box1_t want[4];
} uneven[] = {
	/* 5 over 4 ranks: 2, 2, 1 and an empty one at the end */
	{T("bf16", "[5]", "[0,1,2,3]", "[\"Shard(0)\"]"), 4,
	 {{0, 0, 0, 2}, {1, 0, 2, 2}, {2, 0, 4, 1}, {3, 0, 5, 0}}},
	/* ceil(3/4) = 1: sizes 1,1,1,0; and 0-sized dims */
	{T("bf16", "[3,0]", "[0,1,2,3]", "[\"S(0)\"]"), 3, {{2, 0, 2, 1}, {3, 0, 3, 0}, {0, 1, 0, 0}}},
	/* 2-D mesh, two dims, uneven on both */
	{T("bf16", "[5,7]", "[[0,1,2],[3,4,5]]", "[\"Shard(0)\",\"Shard(1)\"]"), 4,
	 {{0, 0, 0, 3}, {4, 0, 3, 2}, {4, 1, 3, 3}, {5, 1, 6, 1}}},
};

START_TEST(uneven_and_empty)
{
	const struct uneven *u = &uneven[_i];
	plan_layout_t l;

	ck_assert_int_gt(u->n, 0);
	th_layout(u->json, &l);
	for (int k = 0; k < u->n; k++)
		assert_box1(th_shard(&l, u->want[k].rank, 0), u->want[k].d, u->want[k].off,
			    u->want[k].size);
	plan_layout_fini(&l);
}
END_TEST

START_TEST(nested_shard_order)
{
	plan_layout_t l;

	/* mesh-dim order: dp splits first, tp inside it */
	th_layout("{\"name\":\"t\",\"dtype\":\"bf16\",\"shape\":[8,8],"
		  "\"mesh\":[[0,1],[2,3]],\"placements\":[\"Shard(0)\",\"Shard(0)\"]}", &l);
	for (int r = 0; r < 4; r++)
		assert_box1(th_shard(&l, r, 0), 0, 2 * r, 2);
	plan_layout_fini(&l);
}
END_TEST

/* torch.distributed.tensor's _StridedShard docstring example. */
START_TEST(strided_shard_fsdp_tp)
{
	plan_layout_t l;
	int64_t rows[4] = {0, 4, 2, 6};

	th_layout("{\"name\":\"t\",\"dtype\":\"bf16\",\"shape\":[8,8],"
		  "\"mesh\":[[0,1],[2,3]],"
		  "\"placements\":[\"_StridedShard(dim=0, split_factor=2)\",\"Shard(0)\"]}", &l);
	for (int r = 0; r < 4; r++) {
		ck_assert_int_eq(th_nshards(&l, r), 1);
		assert_box1(th_shard(&l, r, 0), 0, rows[r], 2);
	}
	plan_layout_fini(&l);
}
END_TEST

START_TEST(strided_shard_multi_box)
{
	plan_layout_t l;

	/* alone, _StridedShard leaves each rank two pieces */
	th_layout("{\"name\":\"t\",\"dtype\":\"fp32\",\"shape\":[8,3],"
		  "\"mesh\":[5,9],\"placements\":[\"_S(0, 2)\"]}", &l);
	ck_assert_int_eq(th_nshards(&l, 5), 2);
	assert_box1(th_shard(&l, 5, 0), 0, 0, 2);
	assert_box1(th_shard(&l, 5, 1), 0, 4, 2);
	ck_assert_int_eq(th_shard(&l, 5, 1)->local_off[0], 2);
	assert_box1(th_shard(&l, 9, 0), 0, 2, 2);
	assert_box1(th_shard(&l, 9, 1), 0, 6, 2);
	ck_assert_int_eq(th_shard(&l, 9, 1)->local_off[0], 2);
	plan_layout_fini(&l);
}
END_TEST

START_TEST(negative_dim_and_replicate)
{
	plan_layout_t a, b;

	th_layout("{\"name\":\"t\",\"dtype\":\"fp32\",\"shape\":[4,6],"
		  "\"mesh\":[[0,1],[2,3]],\"placements\":[\"Replicate()\",\"Shard(dim=-1)\"]}", &a);
	th_layout("{\"name\":\"t\",\"dtype\":\"fp32\",\"shape\":[4,6],"
		  "\"mesh\":[[0,1],[2,3]],\"placements\":[\"R\",\"Shard(1)\"]}", &b);
	ck_assert_uint_eq(a.nshards, b.nshards);
	for (size_t i = 0; i < a.nshards; i++) {
		ck_assert_int_eq(a.shards[i].rank, b.shards[i].rank);
		ck_assert(plan_box_equal(&a.shards[i].box, &b.shards[i].box, 2));
	}
	/* replicas: ranks 0 and 2 hold the same box */
	ck_assert(plan_box_equal(&th_shard(&a, 0, 0)->box, &th_shard(&a, 2, 0)->box, 2));
	plan_layout_fini(&a);
	plan_layout_fini(&b);
}
END_TEST

START_TEST(noncontiguous_ranks_any_order)
{
	plan_layout_t l;

	th_layout("{\"name\":\"t\",\"dtype\":\"int8\",\"shape\":[4],"
		  "\"mesh\":[[[7],[3]],[[10],[0]]],"
		  "\"placements\":[\"Shard(0)\",\"Shard(0)\",\"Replicate()\"]}", &l);
	assert_box1(th_shard(&l, 7, 0), 0, 0, 1);
	assert_box1(th_shard(&l, 3, 0), 0, 1, 1);
	assert_box1(th_shard(&l, 10, 0), 0, 2, 1);
	assert_box1(th_shard(&l, 0, 0), 0, 3, 1);
	ck_assert_int_eq(l.mesh_ndim, 3);
	plan_layout_fini(&l);
}
END_TEST

START_TEST(placement_parsing)
{
	plan_placement_t p;
	refit_err_t e;

	ck_assert_int_eq(plan_placement_parse(" Shard( dim = 2 ) ", &p, "p", NULL), REFIT_OK);
	ck_assert_int_eq(p.kind, PLAN_PL_SHARD);
	ck_assert_int_eq(p.dim, 2);
	ck_assert_int_eq(plan_placement_parse("_StridedShard(dim=1, sf=4)", &p, "p", NULL),
			 REFIT_OK);
	ck_assert_int_eq(p.kind, PLAN_PL_STRIDED_SHARD);
	ck_assert_int_eq(p.split_factor, 4);
	ck_assert_int_eq(plan_placement_parse("_StridedShard(0, split_factor=2)", &p, "p",
					      NULL), REFIT_OK);
	ck_assert_int_eq(plan_placement_parse("_S(3, 2)", &p, "p", NULL), REFIT_OK);
	ck_assert_int_eq(p.dim, 3);
	ck_assert_int_eq(p.split_factor, 2);
	ck_assert_int_eq(plan_placement_parse("Replicate()", &p, "p", NULL), REFIT_OK);
	ck_assert_int_eq(plan_placement_parse("R", &p, "p", NULL), REFIT_OK);
	static const char *const bad[] = {
		"Shard", "Shard()", "Shard(x)", "Shard(1,2)", "Replicate(1)", "Shard(1)x",
		"Shard(dim=1, dim=2)", "_StridedShard(1)", "Foo(1)", "", "S(1", "R()",
		"_StridedShard(dim=1, bogus=2)", "Shard(99999999999)",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(plan_placement_parse(bad[i], &p, "p", NULL) ==
			      REFIT_ERR_INVALID_ARG, "accepted \"%s\"", bad[i]);
	refit_err_clear(&e);
	plan_placement_parse("Partial(sum)", &p, "placement 0", &e);
	ck_assert_ptr_nonnull(strstr(e.msg, "Partial placements hold unreduced values"));
	refit_err_clear(&e);
	plan_placement_parse("_S(0, 0)", &p, "placement 0", &e);
	ck_assert_str_eq(e.msg, "placement 0 \"_S(0, 0)\": split_factor must be from 1 to 4096, got 0");
}
END_TEST

START_TEST(validation_messages)
{
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w1\",\"dtype\":\"bf16\",\"shape\":[2,3,4],\"mesh\":[[0,1],[2,3]],"
		"\"placements\":[\"Replicate()\",\"Shard(5)\"]}"),
		"layout \"w1\": placement 1 \"Shard(5)\" names dim 5 but the tensor has 3 dims");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[[0,1],[2]],"
		"\"placements\":[\"R\",\"R\"]}"),
		"layout \"w\": mesh is not rectangular: mesh[1] should be an array of 2 entries");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[[0,1],[2,1]],"
		"\"placements\":[\"R\",\"R\"]}"),
		"layout \"w\": mesh: duplicate rank 1");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0,1],"
		"\"placements\":[\"Shard(0)\",\"R\"]}"),
		"layout \"w\": 2 placements for a 1-D mesh (one per mesh dim)");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0,1],"
		"\"placements\":[\"Shrd(0)\"]}"),
		"layout \"w\": placement 0 \"Shrd(0)\": unknown placement (expected "
		"Replicate(), Shard(d) or _StridedShard(dim=d, split_factor=k))");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf17\",\"shape\":[2],\"mesh\":[0],"
		"\"placements\":[\"R\"]}"),
		"layout \"w\": unknown dtype \"bf17\" (known: bool, uint8, int8, int16, int32, "
		"int64, fp8e4m3, fp8e5m2, fp16, bf16, fp32, fp64)");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[4,4],\"shards\":["
		"{\"rank\":0,\"offset\":[0,0],\"size\":[4,2]},"
		"{\"rank\":1,\"offset\":[2,2],\"size\":[3,2]}]}"),
		"layout \"w\": shards[1] (rank 1): box is out of bounds in dim 0: offset 2 "
		"size 3 but the dim has 4 elements");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0],"
		"\"placements\":[\"R\"],\"palcements\":1}"),
		"layout \"w\": unknown key \"palcements\" (known: name, dtype, shape, mesh, "
		"placements, shards, convert)");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2.5],\"mesh\":[0],"
		"\"placements\":[\"R\"]}"),
		"layout \"w\": shape[0]: 2.5 is not an integer from 0 to 281474976710656");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0],"
		"\"placements\":[\"R\"],\"shards\":[]}"),
		"layout \"w\": give either \"mesh\" + \"placements\" or \"shards\", not both");
	ck_assert_str_eq(th_layout_error(
		"{\"tensors\":[{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0],"
		"\"placements\":[\"R\"]},{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[2],"
		"\"mesh\":[0],\"placements\":[\"R\"]}]}"),
		"layout \"a\": tensor listed twice");
	ck_assert_ptr_nonnull(strstr(th_layout_error("{\"tensors\": [1, 2"),
				     "malformed JSON"));
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[1099511627776,1099511627776],"
		"\"mesh\":[0],\"placements\":[\"R\"]}"),
		"layout \"w\": shape has more than 2^56 elements");
	ck_assert_str_eq(th_layout_error(
		"{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[1,1,1,1,1,1,1,1,1],\"mesh\":[0],"
		"\"placements\":[\"R\"]}"),
		"layout \"w\": shape: more than 8 entries");
}
END_TEST

START_TEST(explicit_and_coverage)
{
	plan_layout_t l;
	refit_err_t e;

	th_layout("{\"name\":\"w\",\"dtype\":\"fp16\",\"shape\":[4,4],\"shards\":["
		  "{\"rank\":3,\"offset\":[0,0],\"size\":[4,2]},"
		  "{\"rank\":3,\"offset\":[0,2],\"size\":[2,2]},"
		  "{\"rank\":1,\"offset\":[0,2],\"size\":[2,2]}]}", &l);
	ck_assert_int_eq(th_shard(&l, 3, 1)->piece, 1);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_layout_check_coverage(&l, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "layout \"w\": the shards leave 4 of 16 elements "
			 "uncovered, e.g. element [2, 2]");
	plan_layout_fini(&l);
	/* overlapping boxes that do cover */
	th_layout("{\"name\":\"w\",\"dtype\":\"fp16\",\"shape\":[4,4],\"shards\":["
		  "{\"rank\":0,\"offset\":[0,0],\"size\":[3,4]},"
		  "{\"rank\":1,\"offset\":[1,0],\"size\":[3,4]}]}", &l);
	ck_assert_int_eq(plan_layout_check_coverage(&l, NULL), REFIT_OK);
	plan_layout_fini(&l);
	/* an offset near INT64_MAX: the message names the right dim (no
	 * signed overflow composing it; UBSan stops on one) */
	{
		const int64_t shape[2] = {4, 4};
		plan_shard_t sh = {.rank = 0};

		sh.box.off[0] = INT64_MAX;
		sh.box.size[0] = 1;
		sh.box.size[1] = 4;
		refit_err_clear(&e);
		ck_assert_int_eq(plan_layout_init_explicit(&l, "w", PLAN_DT_FP32, 2, shape, &sh,
							   1, &e), REFIT_ERR_INVALID_ARG);
		ck_assert_ptr_nonnull(strstr(e.msg, "out of bounds in dim 0: offset "
					     "9223372036854775807 size 1"));
		sh.box.off[0] = 0;
		sh.box.off[1] = 2;
		sh.box.size[1] = INT64_MAX;
		refit_err_clear(&e);
		ck_assert_int_eq(plan_layout_init_explicit(&l, "w", PLAN_DT_FP32, 2, shape, &sh,
							   1, &e), REFIT_ERR_INVALID_ARG);
		ck_assert_ptr_nonnull(strstr(e.msg, "out of bounds in dim 1"));
	}
}
END_TEST

START_TEST(duplicate_tensor_is_invalid)
{
	static const char js[] = "{\"tensors\":[{\"name\":\"a\",\"dtype\":\"bf16\","
		"\"shape\":[2],\"mesh\":[0],\"placements\":[\"R\"]},{\"name\":\"a\","
		"\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0],\"placements\":[\"R\"]}]}";
	plan_layout_set_t s;
	refit_err_t e;

	refit_err_clear(&e);
	plan_layout_set_init(&s);
	/* bad input (INVALID_ARGUMENT), not "already registered" (ALREADY_EXISTS) */
	ck_assert_int_eq(codec_layouts_parse(js, strlen(js), &s, NULL, &e),
			 REFIT_ERR_INVALID_ARG);
	plan_layout_set_fini(&s);
}
END_TEST

START_TEST(match_reports_differences)
{
	plan_layout_set_t s, d;
	size_t *map;
	refit_err_t e;

	th_layouts("{\"tensors\":["
		   "{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[0],\"placements\":[\"R\"]},"
		   "{\"name\":\"b\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[0],\"placements\":[\"R\"]},"
		   "{\"name\":\"c\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[0],\"placements\":[\"R\"]}]}",
		   &s);
	th_layouts("{\"tensors\":["
		   "{\"name\":\"c\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]},"
		   "{\"name\":\"a\",\"dtype\":\"fp32\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]},"
		   "{\"name\":\"b\",\"dtype\":\"bf16\",\"shape\":[2,2],\"mesh\":[1],\"placements\":[\"R\"]},"
		   "{\"name\":\"z\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]}]}",
		   &d);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_match(&s, &d, &map, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_null(map);
	ck_assert_str_eq(e.msg, "source and destination differ in 3 tensors: "
			 "tensor \"a\": dtype differs: source bf16, destination fp32; "
			 "tensor \"b\": shape differs: source [4], destination [2, 2]; "
			 "tensor \"z\" is in the destination but not in the source");
	plan_layout_set_fini(&d);
	th_layouts("{\"tensors\":["
		   "{\"name\":\"c\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]},"
		   "{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]}]}",
		   &d);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_match(&s, &d, &map, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "source and destination differ in 1 tensor: tensor \"b\" "
			 "is in the source but not in the destination");
	plan_layout_set_fini(&d);
	th_layouts("{\"tensors\":["
		   "{\"name\":\"c\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]},"
		   "{\"name\":\"b\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]},"
		   "{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[4],\"mesh\":[1],\"placements\":[\"R\"]}]}",
		   &d);
	ck_assert_int_eq(plan_match(&s, &d, &map, NULL), REFIT_OK);
	ck_assert_uint_eq(map[0], 2);
	ck_assert_uint_eq(map[1], 1);
	ck_assert_uint_eq(map[2], 0);
	free(map);
	plan_layout_set_fini(&d);
	{
		plan_layout_set_t c;

		plan_layout_set_copy(&c, &s);
		plan_layout_set_fini(&s); /* the copy owns its own memory */
		ck_assert_uint_eq(c.n, 3);
		ck_assert_str_eq(c.v[1].name, "b");
		ck_assert_int_eq(c.v[2].mesh[0], 0);
		ck_assert_int_eq(c.v[2].shards[0].box.size[0], 4);
		plan_layout_set_fini(&c);
	}
}
END_TEST

/*
 * Oracle: torch.chunk applied to explicit index lists, one dim at a time,
 * exactly as distribute_tensor applies placements to the local tensor.
 */
typedef struct idxlist {
	int64_t *v;
	int64_t n;
} idxlist_t;

static void
oracle_chunk(idxlist_t *l, int64_t n, int64_t c, const plan_placement_t *p)
{
	int64_t *out = xmalloc((size_t)(l->n + 1) * sizeof(int64_t)), k = 0;
	int64_t E = l->n, sf = p->kind == PLAN_PL_STRIDED_SHARD ? p->split_factor : 1;
	int64_t f = (E + sf - 1) / sf;

	for (int64_t j = 0; j < sf; j++) {
		int64_t sa = j * f < E ? j * f : E, sb = (j + 1) * f < E ? (j + 1) * f : E;
		int64_t L = sb - sa, g = (L + n - 1) / n;
		int64_t a = c * g < L ? c * g : L, b = (c + 1) * g < L ? (c + 1) * g : L;

		for (int64_t i = sa + a; i < sa + b; i++)
			out[k++] = l->v[i];
	}
	free(l->v);
	l->v = out;
	l->n = k;
}

START_TEST(dtensor_matches_index_oracle)
{
	unsigned seed = 1234;

	for (int iter = 0; iter < 3000; iter++) {
		int ndim = 1 + rand_r(&seed) % 3, mdim = 1 + rand_r(&seed) % 3;
		int64_t shape[3], mshape[3], nr = 1;
		plan_placement_t pl[3];
		int32_t mesh[64];
		plan_layout_t l;
		refit_err_t e;

		for (int d = 0; d < ndim; d++)
			shape[d] = rand_r(&seed) % 11;
		for (int i = 0; i < mdim; i++) {
			mshape[i] = 1 + rand_r(&seed) % 4;
			nr *= mshape[i];
			int k = rand_r(&seed) % 4;
			pl[i].kind = k == 0 ? PLAN_PL_REPLICATE :
				     k == 3 ? PLAN_PL_STRIDED_SHARD : PLAN_PL_SHARD;
			pl[i].dim = rand_r(&seed) % ndim - (rand_r(&seed) % 2 ? ndim : 0);
			pl[i].split_factor = 1 + rand_r(&seed) % 3;
		}
		for (int r = 0; r < nr; r++)
			mesh[r] = r * 3 + 1;
		refit_err_clear(&e);
		ck_assert_msg(plan_layout_init_dtensor(&l, "t", PLAN_DT_FP32, ndim, shape, mdim,
						       mshape, mesh, pl, &e) == REFIT_OK,
			      "%s", e.msg);
		for (int r = 0; r < nr; r++) {
			idxlist_t lists[3];
			int64_t rem = r, coord[3], count = 1;

			for (int i = mdim - 1; i >= 0; i--) {
				coord[i] = rem % mshape[i];
				rem /= mshape[i];
			}
			for (int d = 0; d < ndim; d++) {
				lists[d].v = xmalloc((size_t)(shape[d] + 1) * sizeof(int64_t));
				lists[d].n = shape[d];
				for (int64_t i = 0; i < shape[d]; i++)
					lists[d].v[i] = i;
			}
			for (int i = 0; i < mdim; i++)
				if (pl[i].kind != PLAN_PL_REPLICATE)
					oracle_chunk(&lists[(pl[i].dim + ndim) % ndim],
						     mshape[i], coord[i], &pl[i]);
			/* every listed index appears at its local position in a box */
			for (int d = 0; d < ndim; d++)
				count *= lists[d].n;
			int64_t held = 0;
			for (int k = 0; th_shard(&l, mesh[r], k); k++) {
				const plan_shard_t *s = th_shard(&l, mesh[r], k);

				held += plan_box_volume(&s->box, ndim);
				for (int d = 0; d < ndim; d++)
					for (int64_t i = 0; i < s->box.size[d]; i++)
						ck_assert_int_eq(lists[d].v[s->local_off[d] + i],
								 s->box.off[d] + i);
			}
			ck_assert_int_eq(held, count);
			for (int d = 0; d < ndim; d++)
				free(lists[d].v);
		}
		plan_layout_fini(&l);
	}
}
END_TEST

Suite *
suite_layout(void)
{
	TCase *tc = th_tcase("dtensor", 60, TH_TESTS(pytorch_shard_shard_same_dim, nested_shard_order,
			strided_shard_fsdp_tp, strided_shard_multi_box, negative_dim_and_replicate, noncontiguous_ranks_any_order,
			dtensor_matches_index_oracle));
	TCase *tv = th_tcase("validation", 0, TH_TESTS(placement_parsing, validation_messages,
			explicit_and_coverage, duplicate_tensor_is_invalid,
			match_reports_differences));

	tcase_add_loop_test(tc, uneven_and_empty, 0, sizeof(uneven) / sizeof(uneven[0]));
	return th_suite("layout", tc, tv, NULL);
}
