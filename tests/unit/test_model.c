/*
 * test_model.c - architectures and parallel specs to layouts.
 */
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "tests/unit/helpers.h"

static void
arch(const char *name, plan_arch_t *a)
{
	static const char *const dirs[] = {"config/models", NULL};
	refit_err_t e;

	refit_err_clear(&e);
	if (codec_arch_load(name, dirs, a, &e) != REFIT_OK)
		ck_abort_msg("%s", e.msg);
}

START_TEST(par_specs)
{
	plan_par_t p;
	refit_err_t e;

	ck_assert_int_eq(plan_par_parse("tp4,pp8,ep16", true, &p, NULL), REFIT_OK);
	ck_assert(p.tp == 4 && p.pp == 8 && p.ep == 16 && p.dp == 16);
	ck_assert_int_eq(plan_par_world(&p), 512);
	ck_assert_int_eq(plan_par_parse("dp4,tp2", true, &p, NULL), REFIT_OK);
	ck_assert(p.tp == 2 && p.pp == 1 && p.dp == 4 && p.ep == 1);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_par_parse("tp4,xx2", true, &p, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "expected comma-separated tpN"));
	refit_err_clear(&e);
	ck_assert_int_eq(plan_par_parse("dp6,ep4", true, &p, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "parallel spec \"dp6,ep4\": ep4 must divide dp6");
	ck_assert_int_eq(plan_par_parse("tp8,ep8", false, &p, NULL), REFIT_OK);
	ck_assert(p.dp == 1 && p.ep == 8);
}
END_TEST

/* Parameter counts match the published sizes. */
START_TEST(catalogue_sizes)
{
	static const struct { const char *name; double lo, hi; } t[] = {
		{"llama-3-70b", 70.5e9, 70.6e9},
		{"qwen3-235b-a22b", 235.0e9, 235.2e9},
		{"qwen3-30b-a3b", 30.4e9, 30.6e9},
		{"deepseek-v3", 670.9e9, 671.1e9},   /* 671 B without the MTP layer */
		{"kimi-k2", 1026e9, 1027e9},
	};
	plan_arch_t a;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		arch(t[i].name, &a);
		ck_assert_msg((double)plan_arch_params(&a) > t[i].lo &&
			      (double)plan_arch_params(&a) < t[i].hi, "%s: %lld", t[i].name,
			      (long long)plan_arch_params(&a));
	}
}
END_TEST

/* A small MoE model end to end: sources cover, bytes add up, the plan validates. */
START_TEST(layouts_plan_and_validate)
{
	plan_arch_t a;
	plan_par_t tr, in;
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_opts_t o;
	plan_t p;
	plan_check_t chk;
	refit_err_t e;
	uint64_t bytes = 0;

	arch("qwen3-30b-a3b", &a);
	a.layers = 4; /* keep the test quick */
	ck_assert_int_eq(plan_par_parse("tp2,pp2,ep4", true, &tr, NULL), REFIT_OK);
	ck_assert_int_eq(plan_par_parse("tp8,dp2,ep8", false, &in, NULL), REFIT_OK);
	plan_layout_set_init(&s);
	plan_layout_set_init(&d);
	refit_err_clear(&e);
	ck_assert_msg(plan_model_layouts(&a, &tr, &in, &s, &d, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_uint_eq(s.n, d.n);
	for (size_t i = 0; i < s.n; i++) {
		ck_assert_int_eq(plan_layout_check_coverage(&s.v[i], NULL), REFIT_OK);
		bytes += plan_layout_bytes(&s.v[i]);
	}
	ck_assert_uint_eq(bytes, (uint64_t)plan_arch_params(&a) * 2);
	th_topo("dgx-h100:32", &t);
	plan_opts_default(&o);
	ck_assert_int_eq(plan_build(&s, &d, &t, &o, &p, &e), REFIT_OK);
	ck_assert_msg(plan_validate(&p, &s, &d, &chk, &e) == REFIT_OK, "%s", e.msg);
	/* two inference instances hold every byte at least twice (replicated
	 * norms and routers more often) */
	ck_assert_uint_ge(chk.needed_bytes, 2 * bytes);
	/* parts a rank passes on without needing them stay within staging */
	ck_assert_uint_le(chk.max_staging, o.staging_bytes);
	plan_fini(&p);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	/* bad combinations are refused with a reason */
	plan_layout_set_init(&s);
	plan_layout_set_init(&d);
	ck_assert_int_eq(plan_par_parse("tp8,dp2,ep4", false, &in, NULL), REFIT_OK);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_model_layouts(&a, &tr, &in, &s, &d, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "inference spec: ep4 must equal tp8 (experts split over the "
			 "instance's ranks)");
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
}
END_TEST

START_TEST(arch_errors)
{
	plan_arch_t a;
	refit_err_t e;
	const char *j = "{\"name\":\"x\",\"hidden\":8,\"layers\":2,\"vocab\":16,\"heads\":2,"
			"\"kv_heads\":1,\"head_dim\":4,\"intermediate\":32,\"moe\":1}";

	refit_err_clear(&e);
	ck_assert_int_eq(codec_arch_parse(j, strlen(j), &a, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "unknown key \"moe\""));
	j = "{\"name\":\"x\",\"hidden\":8,\"layers\":2,\"vocab\":16,\"heads\":2}";
	refit_err_clear(&e);
	ck_assert_int_eq(codec_arch_parse(j, strlen(j), &a, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "model \"x\": GQA attention needs kv_heads and head_dim (or "
			 "MLA's q_lora_rank...)");
	refit_err_clear(&e);
	ck_assert_int_eq(codec_arch_load("no-such-model", NULL, &a, &e), REFIT_ERR_NOT_FOUND);
}
END_TEST

Suite *
suite_model(void)
{
	return th_suite("model", th_tcase("catalogue", 120, TH_TESTS(par_specs, catalogue_sizes,
			layouts_plan_and_validate, arch_errors)), NULL);
}
