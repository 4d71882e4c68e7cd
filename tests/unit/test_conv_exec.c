/*
 * test_conv_exec.c - conversion through the planner and the executor:
 * random shardings (blocks split by shard boundaries, partial blocks at the
 * edges, replicas, sender- and receiver-side sites, both plan modes) give
 * every destination byte and every scale equal to the whole-tensor
 * conversion; the rewrite's errors and its independent check.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "dataplane/conv_exec.h"
#include "dataplane/convert.h"
#include "tests/unit/gen.h"
#include "tests/unit/helpers.h"
#include "tests/unit/hostmem.h"

/* ---- memory registered for the original sets ---------------------- */

typedef struct tmem {
	const plan_layout_set_t *src, *dst;
	uint8_t **full;        /* per src tensor: the whole tensor, row-major */
	th_bufs_t bufs;
} tmem_t;

static int32_t
src_index(const tmem_t *m, const char *name)
{
	for (size_t i = 0; i < m->src->n; i++)
		if (strcmp(m->src->v[i].name, name) == 0)
			return (int32_t)i;
	return -1;
}

static refit_status_t
tmem_view(void *ctx, int32_t rank, uint32_t t, bool dst, int32_t piece, dp_view_t *out,
	  refit_err_t *err)
{
	tmem_t *m = ctx;
	int32_t si = src_index(m, m->dst->v[t].name);
	const plan_layout_t *l = dst ? &m->dst->v[t] : &m->src->v[si];
	const dp_view_t *had = th_bufs_find(&m->bufs, rank, t, dst, piece);
	uint32_t e = (uint32_t)plan_dtype_size(l->dtype);
	dp_view_t *v;

	if (had != NULL) {
		*out = *had;
		return REFIT_OK;
	}
	CHECK(th_bufs_make(&m->bufs, l, rank, t, dst, piece, &v, err));
	if (!dst) { /* fill the source piece from the whole tensor */
		plan_shard_t whole;
		plan_box_t fb;
		dp_view_t fv;

		plan_box_full(&fb, l->shape, l->ndim);
		dp_shard_of_box(&whole, &fb);
		dp_view_contiguous(&fv, m->full[si], l->ndim, l->shape, e);
		for (size_t i = 0; i < l->nshards; i++)
			if (l->shards[i].rank == rank && l->shards[i].piece == piece)
				dp_copy_box(&fv, &whole, v, &l->shards[i], &l->shards[i].box);
	}
	*out = *v;
	return REFIT_OK;
}

static void
tmem_fini(tmem_t *m)
{
	th_bufs_free(&m->bufs);
}

/* ---- random layouts ------------------------------------------------ */

/* Cut [0, n) at random points (at multiples of `align` when align > 0). */
static int
cuts(unsigned *seed, int64_t n, int64_t align, int64_t *at)
{
	int k = 1;

	at[0] = 0;
	for (int i = 0; i < 3; i++) {
		int64_t c = 1 + gen_rnd(seed, (int)(n > 1 ? n - 1 : 1));

		if (align > 0)
			c = c / align * align;
		if (c > at[k - 1] && c < n)
			at[k++] = c;
	}
	at[k] = n;
	return k;
}

/* Explicit shards of a 2-D shape cut into a grid, on ranks [r0, r0 + nr),
 * each box on 1 or 2 ranks; `cover` false drops some boxes. */
static void
grid_layout(unsigned *seed, const char *name, plan_dtype_t dt, const int64_t *shape,
	    int64_t align0, int64_t align1, int r0, int nr, bool cover, plan_layout_t *out)
{
	int64_t a[5], b[5];
	int na = cuts(seed, shape[0], align0, a), nb = cuts(seed, shape[1], align1, b);
	VEC(plan_shard_t) sh = {0};
	refit_err_t e;

	for (int i = 0; i < na; i++)
		for (int j = 0; j < nb; j++) {
			int copies = 1 + gen_rnd(seed, 2);

			if (!cover && gen_rnd(seed, 4) == 0)
				continue;
			for (int c = 0; c < copies; c++) {
				plan_shard_t s;

				memset(&s, 0, sizeof(s));
				s.rank = r0 + gen_rnd(seed, nr);
				s.box.off[0] = a[i];
				s.box.size[0] = a[i + 1] - a[i];
				s.box.off[1] = b[j];
				s.box.size[1] = b[j + 1] - b[j];
				VEC_PUSH(&sh, s);
			}
		}
	refit_err_clear(&e);
	ck_assert_msg(plan_layout_init_explicit(out, name, dt, 2, shape, sh.v, sh.n, &e) ==
		      REFIT_OK, "%s", e.msg);
	VEC_FREE(&sh);
}

static uint16_t
rnd_bits16(unsigned *seed, plan_dtype_t dt)
{
	int r = gen_rnd(seed, 2000);

	if (r == 0)
		return dt == PLAN_DT_BF16 ? 0x7fc0 : 0x7e00;       /* NaN */
	if (r == 1)
		return dt == PLAN_DT_BF16 ? 0xff80 : 0xfc00;       /* -inf */
	if (r < 6)
		return 0;
	if (dt == PLAN_DT_BF16)
		return (uint16_t)(gen_rnd(seed, 2) << 15 | (110 + gen_rnd(seed, 30)) << 7 |
				  gen_rnd(seed, 128));
	return (uint16_t)(gen_rnd(seed, 2) << 15 | (1 + gen_rnd(seed, 29)) << 10 |
			  gen_rnd(seed, 1024));
}

static void
fill(unsigned *seed, uint8_t *p, plan_dtype_t dt, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		if (dt == PLAN_DT_FP32) {
			uint32_t u = (uint32_t)rnd_bits16(seed, PLAN_DT_BF16) << 16 |
				     (uint32_t)gen_rnd(seed, 1 << 16);

			memcpy(p + 4 * i, &u, 4);
		} else {
			uint16_t h = rnd_bits16(seed, dt);

			memcpy(p + 2 * i, &h, 2);
		}
	}
}

/* ---- the whole-tensor reference and the comparison ----------------- */

static void
conv_spec(plan_layout_t *l, plan_dtype_t from, plan_scale_t sc, int64_t b0, int64_t b1)
{
	char name[160];
	plan_convert_t c;

	memset(&c, 0, sizeof(c));
	c.from = from;
	c.scale = sc;
	c.nblock = sc == PLAN_SCALE_BLOCK || sc == PLAN_SCALE_MX ? 2 : 0;
	c.block[0] = b0;
	c.block[1] = b1;
	snprintf(name, sizeof(name), "%s_scale_inv", l->name);
	c.scale_tensor = sc == PLAN_SCALE_NONE ? NULL : name;
	l->conv = plan_convert_dup(&c);
}

/* Compare rank memory of every dst shard of tensor t with want (whole). */
static int
compare(tmem_t *m, uint32_t t, const uint8_t *want)
{
	const plan_layout_t *l = &m->dst->v[t];
	uint32_t e = (uint32_t)plan_dtype_size(l->dtype);
	int bad = 0;

	for (size_t i = 0; i < l->nshards; i++) {
		const plan_shard_t *s = &l->shards[i];
		dp_view_t v, wv, gv;
		plan_shard_t whole;
		plan_box_t fb;
		uint8_t *got;

		if (plan_box_is_empty(&s->box, l->ndim))
			continue;
		ck_assert_int_eq(tmem_view(m, s->rank, t, true, s->piece, &v, NULL), REFIT_OK);
		got = xcalloc(1, dp_view_bytes(l->ndim, s->box.size, e) + 1);
		plan_box_full(&fb, l->shape, l->ndim);
		dp_shard_of_box(&whole, &fb);
		dp_view_contiguous(&wv, (void *)want, l->ndim, l->shape, e);
		dp_view_contiguous(&gv, got, l->ndim, s->box.size, e);
		plan_shard_t gs;

		dp_shard_of_box(&gs, &s->box);
		dp_copy_box(&wv, &whole, &gv, &gs, &s->box);   /* expected */
		uint8_t *have = xcalloc(1, dp_view_bytes(l->ndim, s->box.size, e) + 1);
		dp_view_t hv;

		dp_view_contiguous(&hv, have, l->ndim, s->box.size, e);
		dp_copy_box(&v, s, &hv, &gs, &s->box);         /* what arrived */
		if (memcmp(got, have, dp_view_bytes(l->ndim, s->box.size, e)) != 0)
			bad++;
		free(got);
		free(have);
	}
	return bad;
}

/* Whole-tensor conversion of src tensor si into q (and scales sc). */
static void
reference(const plan_conv_tensor_t *t, const uint8_t *x, uint8_t *q, uint8_t *sc)
{
	dp_quant_t g = {t->from, t->to, t->ndim, {0}, {0}, t->scale == PLAN_SCALE_MX};
	plan_box_t fb, gb;
	plan_shard_t fs, gs;
	dp_view_t sv, qv, scv;

	memcpy(g.shape, t->shape, sizeof(g.shape));
	memcpy(g.block, t->block, sizeof(g.block));
	plan_box_full(&fb, t->shape, t->ndim);
	dp_shard_of_box(&fs, &fb);
	dp_view_contiguous(&sv, (void *)x, t->ndim, t->shape, (uint32_t)plan_dtype_size(t->from));
	dp_view_contiguous(&qv, q, t->ndim, t->shape, (uint32_t)plan_dtype_size(t->to));
	if (t->scale == PLAN_SCALE_NONE) {
		dp_cvt_box(&sv, &fs, t->from, &qv, &fs, t->to, 0, &fb);
		return;
	}
	plan_box_full(&gb, t->grid, t->ndim);
	dp_shard_of_box(&gs, &gb);
	dp_view_contiguous(&scv, sc, t->scale == PLAN_SCALE_TENSOR ? 0 : t->ndim, t->grid,
			   t->scale == PLAN_SCALE_MX ? 1 : 4);
	dp_quant_region(&g, &sv, &fs, &fb, &qv, &fs, &scv, &gs);
}

START_TEST(random_shardings_bit_exact)
{
	unsigned seed = 0xc0de0000u + (unsigned)_i;
	int sites[2] = {0, 0};

	for (int iter = 0; iter < 60; iter++) {
		plan_layout_set_t src, dst;
		plan_layout_t l;
		plan_topo_t topo;
		int64_t shape[2] = {1 + gen_rnd(&seed, 150), 1 + gen_rnd(&seed, 150)};
		int64_t b0 = 1 + gen_rnd(&seed, 48), b1 = 1 + gen_rnd(&seed, 48);
		int64_t cshape[2] = {1 + gen_rnd(&seed, 40), 1 + gen_rnd(&seed, 40)};
		int64_t tshape[2] = {1 + gen_rnd(&seed, 30), 1 + gen_rnd(&seed, 30)};
		int64_t grid[2] = {(shape[0] + b0 - 1) / b0, (shape[1] + b1 - 1) / b1};
		int64_t xshape[2] = {1 + gen_rnd(&seed, 20), 1 + gen_rnd(&seed, 100)};
		int64_t xb = 1 + gen_rnd(&seed, 40);
		int64_t xgrid[2] = {xshape[0], (xshape[1] + xb - 1) / xb};
		plan_dtype_t wfrom = gen_rnd(&seed, 2) ? PLAN_DT_BF16 : PLAN_DT_FP32;
		bool aligned_src = gen_rnd(&seed, 2);
		uint8_t *full[4];
		refit_err_t e;

		plan_layout_set_init(&src);
		plan_layout_set_init(&dst);
		/* w: wfrom -> fp8 with b0 x b1 blocks; c: fp32 -> bf16; t: fp16 -> fp8, tensor scale */
		grid_layout(&seed, "w", wfrom, shape, aligned_src ? b0 : 0, aligned_src ? b1 : 0,
			    0, 8, true, &l);
		plan_layout_set_add(&src, &l);
		grid_layout(&seed, "c", PLAN_DT_FP32, cshape, 0, 0, 0, 8, true, &l);
		plan_layout_set_add(&src, &l);
		grid_layout(&seed, "t", PLAN_DT_FP16, tshape, 0, 0, 0, 8, true, &l);
		plan_layout_set_add(&src, &l);
		/* x: bf16 -> MXFP8, 1 x xb blocks, e8m0 scales */
		grid_layout(&seed, "x", PLAN_DT_BF16, xshape, aligned_src ? 1 : 0,
			    aligned_src ? xb : 0, 0, 8, true, &l);
		plan_layout_set_add(&src, &l);
		grid_layout(&seed, "w", PLAN_DT_FP8E4M3, shape, 0, 0, 8, 8, false, &l);
		conv_spec(&l, wfrom, PLAN_SCALE_BLOCK, b0, b1);
		plan_layout_set_add(&dst, &l);
		grid_layout(&seed, "w_scale_inv", PLAN_DT_FP32, grid, 0, 0, 4 + gen_rnd(&seed, 6), 6,
			    false, &l);
		plan_layout_set_add(&dst, &l);
		grid_layout(&seed, "c", PLAN_DT_BF16, cshape, 0, 0, 8, 8, false, &l);
		conv_spec(&l, PLAN_DT_FP32, PLAN_SCALE_NONE, 0, 0);
		plan_layout_set_add(&dst, &l);
		grid_layout(&seed, "t", PLAN_DT_FP8E4M3, tshape, 0, 0, 8, 8, false, &l);
		conv_spec(&l, PLAN_DT_FP16, PLAN_SCALE_TENSOR, 0, 0);
		plan_layout_set_add(&dst, &l);
		{
			plan_shard_t s[2];

			memset(s, 0, sizeof(s));
			s[0].rank = 9;
			s[1].rank = 14;
			ck_assert_int_eq(plan_layout_init_explicit(&l, "t_scale_inv", PLAN_DT_FP32, 0,
								   NULL, s, 2, NULL), REFIT_OK);
			plan_layout_set_add(&dst, &l);
		}
		grid_layout(&seed, "x", PLAN_DT_FP8E4M3, xshape, 0, 0, 8, 8, false, &l);
		conv_spec(&l, PLAN_DT_BF16, PLAN_SCALE_MX, 1, xb);
		plan_layout_set_add(&dst, &l);
		grid_layout(&seed, "x_scale_inv", PLAN_DT_UINT8, xgrid, 0, 0, 8, 8, false, &l);
		plan_layout_set_add(&dst, &l);
		for (int k = 0; k < 4; k++) {
			int64_t n = plan_layout_numel(&src.v[k]);

			full[k] = xmalloc((size_t)n * plan_dtype_size(src.v[k].dtype) + 1);
			fill(&seed, full[k], src.v[k].dtype, n);
		}
		th_topo("dgx-h100:16", &topo);

		plan_conv_t c;

		refit_err_clear(&e);
		ck_assert_msg(plan_convert_apply(&src, &dst, &c, &e) == REFIT_OK, "%s", e.msg);
		ck_assert_msg(plan_convert_check(&c, &src, &dst, &e) == REFIT_OK, "%s", e.msg);
		ck_assert_uint_eq(c.n, 4);
		sites[c.t[0].site]++;
		if (aligned_src)
			ck_assert_int_eq(c.t[0].site, PLAN_CONV_SENDER);
		ck_assert_int_eq(c.t[1].site, PLAN_CONV_SENDER);   /* casts: always */
		for (int mode = 0; mode < 2; mode++) {
			tmem_t m = {&src, &dst, full, {0}};
			dp_mem_ops_t ops = {tmem_view, &m, NULL};
			dp_exec_opts_t eo = {.verify = gen_rnd(&seed, 2), .corrupt_msg = -1};
			dp_exec_stats_t st;
			plan_check_t chk;
			dp_conv_t *cx;
			dp_exec_t *x;
			plan_opts_t o;
			plan_t p;

			plan_opts_default(&o);
			o.mode = mode ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
			o.chunk_bytes = (uint64_t)256 << gen_rnd(&seed, 4);
			ck_assert_msg(plan_build(&c.src, &c.dst, &topo, &o, &p, &e) == REFIT_OK, "%s",
				      e.msg);
			ck_assert_msg(plan_validate(&p, &c.src, &c.dst, &chk, &e) == REFIT_OK, "%s",
				      e.msg);
			ck_assert_int_eq(dp_conv_new(&c, &src, &dst, &ops, &cx, &e), REFIT_OK);
			ck_assert_int_eq(dp_exec_new(&p, &c.src, &c.dst, dp_conv_mem(cx), &eo, &x, &e),
					 REFIT_OK);
			ck_assert_msg(dp_exec_local(x, &st, &e) == REFIT_OK, "iteration %d, %s, w on the %s side: %s", iter, plan_mode_name(o.mode), plan_conv_site_name(c.t[0].site), e.msg);
			for (int32_t r = 0; r < 16; r++)
				ck_assert_msg(dp_conv_finish(cx, r, &e) == REFIT_OK, "%s", e.msg);
			{   /* the whole-slice estimate's bound covers what was made */
				uint64_t need = 0;

				for (int32_t r = 0; r < 16; r++)
					need += dp_conv_scratch_need(cx, r);
				ck_assert_uint_ge(need, dp_conv_scratch_bytes(cx));
				ck_assert_uint_gt(dp_conv_scratch_bytes(cx), 0);
			}
			for (size_t k = 0; k < c.n; k++) {
				const plan_conv_tensor_t *t = &c.t[k];
				int64_t n = plan_layout_numel(&dst.v[t->dst]);
				uint8_t *q = xcalloc(1, (size_t)n * plan_dtype_size(t->to) + 1);
				int64_t ng = 1;

				for (int d = 0; d < t->ndim; d++)
					ng *= t->grid[d];
				uint8_t *sc = xcalloc(1, (size_t)(ng + 1) * 4);

				reference(t, full[t->src], q, sc);
				ck_assert_msg(compare(&m, t->dst, q) == 0, "iteration %d, %s, tensor "
					      "%s (%s side): wrong bytes", iter, plan_mode_name(o.mode),
					      dst.v[t->dst].name, plan_conv_site_name(t->site));
				if (t->scale_dst >= 0)
					ck_assert_msg(compare(&m, (uint32_t)t->scale_dst, sc) == 0,
						      "iteration %d, %s: wrong scales of %s (%s side)",
						      iter, plan_mode_name(o.mode), dst.v[t->dst].name,
						      plan_conv_site_name(t->site));
				free(q);
				free(sc);
			}
			dp_exec_free(x);
			dp_conv_free(cx);
			tmem_fini(&m);
			plan_fini(&p);
		}
		plan_convert_fini(&c);
		for (int k = 0; k < 4; k++)
			free(full[k]);
		plan_layout_set_fini(&src);
		plan_layout_set_fini(&dst);
		plan_topo_fini(&topo);
	}
	ck_assert_msg(sites[0] > 5 && sites[1] > 5, "sender %d, receiver %d: both sites should "
		      "be exercised", sites[0], sites[1]);
}
END_TEST

#define W_SRC "{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[300,200],\"mesh\":[0,1]," \
	"\"placements\":[\"Shard(0)\"]}"
#define W_DST(conv) "{\"name\":\"w\",\"dtype\":\"fp8e4m3\",\"shape\":[300,200]," \
	"\"mesh\":[8,9],\"placements\":[\"Shard(1)\"],\"convert\":" conv "}"

/* The error plan_convert_apply gives for (src, dst) documents. */
static const char *
apply_error(const char *src, const char *dst)
{
	static refit_err_t e;
	plan_layout_set_t s, d;
	plan_conv_t c;

	th_layouts(src, &s);
	th_layouts(dst, &d);
	refit_err_clear(&e);
	ck_assert_int_ne(plan_convert_apply(&s, &d, &c, &e), REFIT_OK);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	return e.msg;
}

START_TEST(convert_keys)
{
	static const struct { const char *json, *msg; } bad[] = {
		{W_DST("{\"from\":\"bf16\",\"sclae\":1}"),
		 "layout \"w\": \"convert\": unknown key \"sclae\" (known: from, scale, block, "
		 "scale_tensor)"},
		{W_DST("{\"from\":\"bf16\",\"scale\":\"none\"}"),
		 "layout \"w\": \"convert\" to fp8e4m3 needs \"scale\": \"tensor\" or \"block\""},
		{W_DST("{\"from\":\"fp8e5m2\"}"),
		 "layout \"w\": \"convert\" from fp8e5m2 to fp8e4m3 is not supported (fp32 -> bf16 "
		 "or fp16; bf16, fp16 or fp32 -> fp8e4m3)"},
		{W_DST("{\"from\":\"bf16\",\"block\":[1,2,3]}"),
		 "layout \"w\": \"convert\": \"block\" has 3 entries but the tensor has 2 dims"},
		{W_DST("{\"from\":\"bf16\",\"scale\":\"tensor\",\"block\":[2]}"),
		 "layout \"w\": \"convert\": \"block\" needs \"scale\": \"block\" or \"mx\""},
		{"{\"name\":\"c\",\"dtype\":\"bf16\",\"shape\":[2],\"mesh\":[0],"
		 "\"placements\":[\"R\"],\"convert\":{\"from\":\"fp32\",\"scale_tensor\":\"x\"}}",
		 "layout \"c\": \"convert\": \"scale_tensor\" needs a scaled conversion"},
	};
	plan_layout_set_t d;
	const plan_convert_t *c;

	th_layouts("{\"tensors\":[" W_DST("{\"from\":\"bf16\"}") "]}", &d);
	c = d.v[0].conv;
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(c->scale, PLAN_SCALE_BLOCK);
	ck_assert_int_eq(c->nblock, 2);
	ck_assert_int_eq(c->block[0], 128);
	ck_assert_str_eq(c->scale_tensor, "w_scale_inv");
	plan_layout_set_fini(&d);
	th_layouts(W_DST("{\"from\":\"fp32\",\"scale\":\"block\",\"block\":[1,32],"
			 "\"scale_tensor\":\"s\"}"), &d);
	ck_assert_int_eq(d.v[0].conv->block[1], 32);
	ck_assert_str_eq(d.v[0].conv->scale_tensor, "s");
	plan_layout_set_fini(&d);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_str_eq(th_layout_error(bad[i].json), bad[i].msg);
}
END_TEST

START_TEST(convert_apply_errors)
{
	const char *scale_ok = "{\"name\":\"w_scale_inv\",\"dtype\":\"fp32\","
			       "\"shape\":[3,2],\"mesh\":[8],\"placements\":[\"R\"]}";

	ck_assert_str_eq(apply_error(W_SRC, W_DST("{\"from\":\"bf16\"}")),
			 "layout \"w\": scale tensor \"w_scale_inv\" is not among the "
			 "destination tensors");
	ck_assert_str_eq(apply_error(W_SRC, "{\"tensors\":[" W_DST("{\"from\":\"fp16\"}")
				     ",{\"name\":\"w_scale_inv\",\"dtype\":\"fp32\",\"shape\":"
				     "[3,2],\"mesh\":[8],\"placements\":[\"R\"]}]}"),
			 "layout \"w\": \"convert\" from fp16 but the source is bf16");
	ck_assert_str_eq(apply_error(W_SRC, "{\"tensors\":[" W_DST("{\"from\":\"bf16\"}")
				     ",{\"name\":\"w_scale_inv\",\"dtype\":\"fp32\",\"shape\":"
				     "[2,2],\"mesh\":[8],\"placements\":[\"R\"]}]}"),
			 "layout \"w\": scale tensor \"w_scale_inv\" must be fp32 of shape "
			 "[3, 2] (one scale per block), not fp32 of 2 dims");
	/* a correct pair rewrites: Shard(0) of 300 rows on 2 ranks is 150 + 150,
	 * not whole 128-row blocks, so w converts on the receivers */
	{
		plan_layout_set_t s, d;
		plan_conv_t c;
		char dst[1024];

		snprintf(dst, sizeof(dst), "{\"tensors\":[%s,%s]}",
			 W_DST("{\"from\":\"bf16\"}"), scale_ok);
		th_layouts(W_SRC, &s);
		th_layouts(dst, &d);
		ck_assert_int_eq(plan_convert_apply(&s, &d, &c, NULL), REFIT_OK);
		ck_assert_int_eq(c.t[0].site, PLAN_CONV_RECEIVER);
		ck_assert_uint_eq(c.dst.n, 1);                 /* scales: computed */
		ck_assert_int_eq(c.dst.v[0].dtype, PLAN_DT_BF16);
		ck_assert_int_eq(plan_convert_check(&c, &s, &d, NULL), REFIT_OK);
		plan_convert_fini(&c);
		plan_layout_set_fini(&s);
		/* 256 + 44 rows: whole blocks, on the senders, fp8 on the wire */
		th_layouts("{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[300,200],"
			   "\"shards\":[{\"rank\":0,\"offset\":[0,0],\"size\":[256,200]},"
			   "{\"rank\":1,\"offset\":[256,0],\"size\":[44,200]}]}", &s);
		ck_assert_int_eq(plan_convert_apply(&s, &d, &c, NULL), REFIT_OK);
		ck_assert_int_eq(c.t[0].site, PLAN_CONV_SENDER);
		ck_assert_uint_eq(c.dst.n, 2);
		ck_assert_uint_eq(c.src.n, 2);
		ck_assert_int_eq(c.src.v[0].dtype, PLAN_DT_FP8E4M3);
		ck_assert_int_eq(c.src.v[1].shards[1].box.off[0], 2);
		ck_assert_int_eq(plan_convert_check(&c, &s, &d, NULL), REFIT_OK);
		/* the check catches a rewrite that is wrong */
		c.src.v[0].shards[1].box.off[0] = 255;
		ck_assert_int_eq(plan_convert_check(&c, &s, &d, NULL), REFIT_ERR_INTERNAL);
		plan_convert_fini(&c);
		plan_layout_set_fini(&s);
		plan_layout_set_fini(&d);
	}
}
END_TEST

/* strip, model fp8, match, rewrite, counts, names and scratch accounting */
START_TEST(convert_helpers)
{
	plan_layout_set_t s, d, d0, m8, rs, rd;
	plan_conv_t c;
	char dst[1024];
	int64_t blk[2] = {128, 128}, none[2] = {0, 0};
	refit_err_t e;

	snprintf(dst, sizeof(dst), "{\"tensors\":[%s,%s]}", W_DST("{\"from\":\"bf16\"}"),
		 "{\"name\":\"w_scale_inv\",\"dtype\":\"fp32\",\"shape\":[3,2],"
		 "\"mesh\":[8],\"placements\":[\"R\"]}");
	th_layouts(W_SRC, &s);
	th_layouts(dst, &d);
	/* strip: the same refit unconverted, without the scales */
	plan_convert_strip(&d, &d0);
	ck_assert_uint_eq(d0.n, 1);
	ck_assert_int_eq(d0.v[0].dtype, PLAN_DT_BF16);
	ck_assert_ptr_null(d0.v[0].conv);
	ck_assert_int_eq(plan_convert_match(&s, &d0, NULL), REFIT_OK);
	ck_assert_int_eq(plan_convert_match(&s, &d, NULL), REFIT_OK);
	refit_err_clear(&e);
	d0.v[0].dtype = PLAN_DT_FP16;          /* as a source, it disagrees with "from" */
	ck_assert_int_eq(plan_convert_match(&d0, &d, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "layout \"w\": \"convert\" from bf16 but the source is fp16");
	/* model fp8: projections convert, scales follow the weight's layout */
	{
		plan_layout_set_t ms;

		th_layouts("{\"tensors\":[{\"name\":\"a.q_proj.weight\",\"dtype\":\"bf16\","
			   "\"shape\":[300,256],\"mesh\":[8,9],\"placements\":[\"Shard(0)\"]},"
			   "{\"name\":\"a.norm.weight\",\"dtype\":\"bf16\",\"shape\":[256],"
			   "\"mesh\":[8],\"placements\":[\"R\"]}]}", &ms);
		ck_assert_int_eq(plan_convert_model_fp8(&ms, blk, &m8, NULL), REFIT_OK);
		ck_assert_uint_eq(m8.n, 3);
		ck_assert_int_eq(m8.v[0].dtype, PLAN_DT_FP8E4M3);
		ck_assert_str_eq(m8.v[1].name, "a.q_proj.weight_scale_inv");
		ck_assert_int_eq(m8.v[1].shape[0], 3);
		ck_assert_int_eq(m8.v[1].shape[1], 2);
		ck_assert(m8.v[1].is_dtensor);
		ck_assert_int_eq(m8.v[2].dtype, PLAN_DT_BF16);
		ck_assert_int_eq(plan_convert_match(&ms, &m8, NULL), REFIT_OK);
		plan_layout_set_fini(&m8);
		ck_assert_int_eq(plan_convert_model_fp8(&ms, none, &m8, NULL), REFIT_OK);
		ck_assert_int_eq(m8.v[1].ndim, 0);                /* a tensor scale */
		ck_assert_int_eq(plan_convert_match(&ms, &m8, NULL), REFIT_OK);
		plan_layout_set_fini(&m8);
		plan_layout_set_fini(&ms);
	}
	/* rewrite in place equals apply; counts and names */
	ck_assert_int_eq(plan_convert_apply(&s, &d, &c, NULL), REFIT_OK);
	ck_assert_uint_eq(plan_convert_count(&c, PLAN_CONV_RECEIVER), 1);
	ck_assert_uint_eq(plan_convert_count(&c, PLAN_CONV_SENDER), 0);
	ck_assert_str_eq(plan_conv_site_name(PLAN_CONV_SENDER), "sender");
	ck_assert_str_eq(plan_conv_site_name(PLAN_CONV_RECEIVER), "receiver");
	plan_layout_set_copy(&rs, &s);
	plan_layout_set_copy(&rd, &d);
	ck_assert_int_eq(plan_convert_rewrite(&rs, &rd, NULL), REFIT_OK);
	ck_assert_uint_eq(rd.n, c.dst.n);
	ck_assert_int_eq(rd.v[0].dtype, c.dst.v[0].dtype);
	ck_assert_uint_eq(rd.v[0].nshards, c.dst.v[0].nshards);
	ck_assert_int_eq(plan_convert_rewrite(&rs, &rd, NULL), REFIT_OK);  /* nothing left */
	/* scratch: nothing made before use; device memory refused */
	{
		dp_mem_ops_t dev = {tmem_view, NULL, (const dp_dev_ops_t *)&dev};
		dp_conv_t *cx;

		ck_assert_int_eq(dp_conv_new(&c, &s, &d, &(dp_mem_ops_t){tmem_view, NULL, NULL},
					     &cx, NULL), REFIT_OK);
		ck_assert_uint_eq(dp_conv_scratch_bytes(cx), 0);
		dp_conv_free(cx);
		refit_err_clear(&e);
		ck_assert_int_eq(dp_conv_new(&c, &s, &d, &dev, &cx, &e), REFIT_ERR_UNAVAILABLE);
		ck_assert_ptr_null(cx);
	}
	plan_convert_fini(&c);
	plan_layout_set_fini(&rs);
	plan_layout_set_fini(&rd);
	plan_layout_set_fini(&d0);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
}
END_TEST

Suite *
suite_conv_exec(void)
{
	TCase *tc = th_tcase("sharded", 300,
			     TH_TESTS(convert_keys, convert_apply_errors, convert_helpers));

	tcase_add_loop_test(tc, random_shardings_bit_exact, 0, 3);
	return th_suite("conv_exec", tc, NULL);
}
