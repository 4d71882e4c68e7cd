/*
 * bench_plan.c - planner speed and memory.
 *
 *   1. a DeepSeek-V3-sized MoE model (61 layers, 256 routed experts stored
 *      in stacked groups, MLA attention; ~2,500 tensors, ~1.3 TB in bf16)
 *      from 256 training ranks (PP4 x EP8/DP8 x TP8) to 256 inference ranks
 *      (32 replicas of TP8), on dgx-h100;
 *   2. the same at a quarter of the layers, to show memory grows linearly
 *      with transfers;
 *   3. one tensor across 1024 x 1024 ranks: Shard(0) -> uneven Shard(0),
 *      and the worst case Shard(0) -> Shard(1), where every source box
 *      meets every destination box (S x D transfers).
 *
 * Each case reports build time for reshard and broadcast plans, transfers,
 * messages, peak RSS growth and bytes per transfer, and the cost model's
 * ratio to the lower bound.  Timings are one run on this machine; compare
 * rows of one run, not runs of different days.
 */
#include <stdbool.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "codec/json.h"
#include "common/clock.h"

/* A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:" the peak since
 * peak_reset); 0 when absent. */
static long
status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = 0;

	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0)
			kb = atol(line + strlen(key));
	if (f)
		fclose(f);
	return kb;
}

static void
add_dtensor(plan_layout_set_t *set, const char *name, int ndim, const int64_t *shape,
	    int mdim, const int64_t *msh, const int32_t *mesh, const char *const *pl)
{
	plan_placement_t p[4];
	plan_layout_t l;
	refit_err_t e;

	refit_err_clear(&e);
	for (int i = 0; i < mdim; i++)
		if (plan_placement_parse(pl[i], &p[i], "bench", &e) != REFIT_OK)
			abort();
	if (plan_layout_init_dtensor(&l, name, PLAN_DT_BF16, ndim, shape, mdim, msh, mesh,
				     p, &e) != REFIT_OK) {
		fprintf(stderr, "bench: %s\n", e.msg);
		exit(1);
	}
	plan_layout_set_add(set, &l);
}

/*
 * The model, with `layers` layers.  Training: PP4 stages of 64 ranks
 * (8 nodes), inside a stage dp/ep x tp = 8 x 8 (tp inside a node).
 * Inference: 32 replicas of TP8, one per node, ranks 256..511.
 */
static void
make_model(int layers, plan_layout_set_t *src, plan_layout_set_t *dst)
{
	const int64_t H = 7168, I = 2048, V = 129280, E = 256, G = 8;
	int32_t tmesh[64], imesh[256];
	const int64_t tm[2] = {8, 8}, im[2] = {32, 8};
	char name[128];

	for (int i = 0; i < 256; i++)
		imesh[i] = 256 + i;
	for (int l = -1; l <= layers; l++) {
		int stage = l < 0 ? 0 : l >= layers ? 3 : l * 4 / layers;

		for (int i = 0; i < 64; i++)
			tmesh[i] = stage * 64 + i;
		struct {
			const char *n;
			int nd;
			int64_t s[3];
			const char *tp, *dp, *itp;
		} t[] = {
			{"embed_tokens.weight", 2, {V, H}, "Shard(0)", "Replicate()", "Shard(0)"},
			{"lm_head.weight", 2, {V, H}, "Shard(0)", "Replicate()", "Shard(0)"},
			{"norm.weight", 1, {H}, "Replicate()", "Replicate()", "Replicate()"},
			{"input_layernorm.weight", 1, {H}, "Replicate()", "Replicate()", "Replicate()"},
			{"post_attention_layernorm.weight", 1, {H}, "Replicate()", "Replicate()",
			 "Replicate()"},
			{"self_attn.q_a_proj.weight", 2, {1536, H}, "Replicate()", "Replicate()",
			 "Replicate()"},
			{"self_attn.q_b_proj.weight", 2, {128 * 192, 1536}, "Shard(0)",
			 "Replicate()", "Shard(0)"},
			{"self_attn.kv_a_proj_with_mqa.weight", 2, {576, H}, "Replicate()",
			 "Replicate()", "Replicate()"},
			{"self_attn.kv_b_proj.weight", 2, {128 * 256, 512}, "Shard(0)",
			 "Replicate()", "Shard(0)"},
			{"self_attn.o_proj.weight", 2, {H, 128 * 128}, "Shard(1)", "Replicate()",
			 "Shard(1)"},
			{"mlp.gate.weight", 2, {E, H}, "Replicate()", "Replicate()", "Replicate()"},
			{"mlp.shared_experts.gate_up_proj.weight", 2, {2 * I, H}, "Shard(0)",
			 "Replicate()", "Shard(0)"},
			{"mlp.shared_experts.down_proj.weight", 2, {H, I}, "Shard(1)",
			 "Replicate()", "Shard(1)"},
		};
		size_t lo = l < 0 ? 0 : l >= layers ? 1 : 3, hi = l < 0 ? 1 : l >= layers ? 3 : 13;

		for (size_t k = lo; k < hi; k++) {
			const char *tp[2] = {t[k].dp, t[k].tp}, *ip[2] = {"Replicate()", t[k].itp};

			if (l >= 0 && l < layers)
				snprintf(name, sizeof(name), "model.layers.%d.%s", l, t[k].n);
			else
				snprintf(name, sizeof(name), "model.%s", t[k].n);
			add_dtensor(src, name, t[k].nd, t[k].s, 2, tm, tmesh, tp);
			add_dtensor(dst, name, t[k].nd, t[k].s, 2, im, imesh, ip);
		}
		if (l < 0 || l >= layers)
			continue;
		/* routed experts in stacked groups of G: EP over the stage's dp dim
		 * in training, TP on the intermediate dim in inference */
		for (int g = 0; g < E / G; g++) {
			const char *tp13[2] = {"Shard(0)", "Shard(1)"}, *ip13[2] = {"Replicate()",
										"Shard(1)"};
			const char *tp2[2] = {"Shard(0)", "Shard(2)"}, *ip2[2] = {"Replicate()",
										 "Shard(2)"};
			int64_t s13[3] = {G, 2 * I, H}, s2[3] = {G, H, I};

			snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%d.w13", l, g);
			add_dtensor(src, name, 3, s13, 2, tm, tmesh, tp13);
			add_dtensor(dst, name, 3, s13, 2, im, imesh, ip13);
			snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%d.w2", l, g);
			add_dtensor(src, name, 3, s2, 2, tm, tmesh, tp2);
			add_dtensor(dst, name, 3, s2, 2, im, imesh, ip2);
		}
	}
}

static void
run_case(const char *label, const plan_layout_set_t *src, const plan_layout_set_t *dst,
	 const plan_topo_t *topo, int validate)
{
	for (int mode = 0; mode < 2; mode++) {
		plan_opts_t o;
		plan_t p;
		plan_cost_t c;
		plan_check_t chk;
		refit_err_t e;
		long r0 = status_kb("VmRSS:");
		double t0 = clock_mono_s(), t1, t2, t3 = 0;
		char payload[32];

		plan_opts_default(&o);
		if (getenv("BENCH_CHUNK")) {
			o.chunk_bytes = strtoull(getenv("BENCH_CHUNK"), NULL, 0);
			o.staging_bytes = o.chunk_bytes * 2;
		}
		o.mode = mode ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
		refit_err_clear(&e);
		if (plan_build(src, dst, topo, &o, &p, &e) != REFIT_OK) {
			fprintf(stderr, "bench: %s\n", e.msg);
			exit(1);
		}
		t1 = clock_mono_s();
		long r1 = status_kb("VmRSS:");
		if (plan_cost(&p, src, dst, topo, &c, &e) != REFIT_OK)
			exit(1);
		t2 = clock_mono_s();
		if (validate) {
			if (plan_validate(&p, src, dst, &chk, &e) != REFIT_OK) {
				fprintf(stderr, "bench: %s\n", e.msg);
				exit(1);
			}
			t3 = clock_mono_s() - t2;
		}
		codec_fmt_bytes((double)c.payload_bytes, payload, sizeof(payload));
		printf("%-34s %-9s %7zu %10zu %9zu %8.3f %8.3f %8s %7.0f %6.1f %7.3f\n",
		       mode ? "" : label, plan_mode_name(o.mode), src->n, p.nxfers, p.nmsgs,
		       t1 - t0, t2 - t1, validate ? "" : "-",
		       (double)(r1 - r0) / 1024.0,
		       p.nxfers ? (double)(r1 - r0) * 1024.0 / (double)p.nxfers : 0.0,
		       c.ratio);
		if (validate)
			printf("%-34s %-9s validated in %.3f s, payload %s\n", "", "", t3, payload);
		plan_fini(&p);
	}
}

static void
single_tensor(const char *label, const char *dst_pl, int64_t rows, int64_t cols)
{
	plan_layout_set_t s, d;
	plan_topo_t t;
	int32_t *ms = malloc(1024 * sizeof(int32_t)), *md = malloc(1024 * sizeof(int32_t));
	int64_t shape[2] = {rows, cols}, m[1] = {1024};
	const char *sp[1] = {"Shard(0)"}, *dp[1] = {dst_pl};

	for (int i = 0; i < 1024; i++) {
		ms[i] = i;
		md[i] = 1024 + (i * 7) % 1024; /* non-contiguous, shuffled */
	}
	plan_layout_set_init(&s);
	plan_layout_set_init(&d);
	add_dtensor(&s, "w", 2, shape, 1, m, ms, sp);
	add_dtensor(&d, "w", 2, shape, 1, m, md, dp);
	if (plan_topo_preset(&t, "dgx-h100:2048", 0, NULL) != REFIT_OK)
		exit(1);
	run_case(label, &s, &d, &t, 0);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	free(ms);
	free(md);
}

/* Start a new peak (Linux: "5" > /proc/self/clear_refs) after giving
 * freed heap back; false when the peak stays the process's. */
static bool
peak_reset(void)
{
	FILE *f;
	bool ok;

	malloc_trim(0); /* earlier cases' freed heap is not this case's */
	f = fopen("/proc/self/clear_refs", "w");
	ok = f != NULL && fputs("5", f) >= 0;

	if (f != NULL && fclose(f) != 0)
		ok = false;
	return ok;
}

/*
 * The scaling curve: catalogue models as refit-plan model builds them
 * (dgx-h100, packed; BENCH_CURVE_TOPO=gb200-nvl72: rack-aligned), inference
 * data-parallel degree doubling (BENCH_CURVE_DP=N: that one alone).  plan_s is
 * the CPU time of plan_build (reshard), so other load on the machine does
 * not count; peak_MiB is the case's peak RSS (its layouts and plan; the
 * process's, marked *, where the peak cannot be reset).
 */
static void
curve(const char *model, const char *train, const char *tp, const int *dps, int n)
{
	static const char *const dirs[] = {"config/models", NULL};
	plan_arch_t a;
	refit_err_t e;

	refit_err_clear(&e);
	if (codec_arch_load(model, dirs, &a, &e) != REFIT_OK) {
		fprintf(stderr, "bench: %s\n", e.msg);
		exit(1);
	}
	const char *only = getenv("BENCH_CURVE_DP"); /* one inference dp alone */
	const char *topo = getenv("BENCH_CURVE_TOPO") ? getenv("BENCH_CURVE_TOPO") : "dgx-h100";

	for (int i = 0; i < n; i++) {
		plan_par_t pt, pi;
		plan_layout_set_t s, d;
		plan_topo_t t;
		plan_jobs_t jobs;
		plan_opts_t o;
		plan_t p;
		char inf[64];
		double t0;
		bool reset;

		if (only && atoi(only) != dps[i])
			continue;
		snprintf(inf, sizeof(inf), "%s,dp%d", tp, dps[i]);
		plan_layout_set_init(&s);
		plan_layout_set_init(&d);
		if (plan_par_parse(train, true, &pt, &e) != REFIT_OK ||
		    plan_par_parse(inf, false, &pi, &e) != REFIT_OK ||
		    plan_model_layouts(&a, &pt, &pi, &s, &d, &e) != REFIT_OK) {
			fprintf(stderr, "bench: %s\n", e.msg);
			exit(1);
		}
		jobs = (plan_jobs_t){(int32_t)plan_par_world(&pt), (int32_t)pi.dp,
				     (int32_t)(pi.tp ? pi.tp : 1)};
		if (plan_topo_preset_jobs(&t, topo, &jobs, strcmp(topo, "gb200-nvl72") == 0 ?
					  PLAN_PLACE_RACK_ALIGNED : PLAN_PLACE_PACKED, NULL,
					  &e) != REFIT_OK) {
			fprintf(stderr, "bench: %s\n", e.msg);
			exit(1);
		}
		plan_opts_default(&o);
		reset = peak_reset();
		t0 = clock_cpu_s();
		if (plan_build(&s, &d, &t, &o, &p, &e) != REFIT_OK) {
			fprintf(stderr, "bench: %s\n", e.msg);
			exit(1);
		}
		printf("%-12s %-12s %-12s %6d %10zu %8.2f %8.0f%s  %.12s\n", model, train, inf,
		       t.nranks, p.nxfers, clock_cpu_s() - t0, (double)status_kb("VmHWM:") / 1024.0,
		       reset ? " " : "*", p.digest_hex);
		fflush(stdout);
		plan_fini(&p);
		plan_topo_fini(&t);
		plan_layout_set_fini(&s);
		plan_layout_set_fini(&d);
	}
}

int
main(void)
{
	plan_topo_t topo;
	int sizes[2] = {15, 61};

	if (getenv("BENCH_QUICK"))
		sizes[1] = 15;
	if (getenv("BENCH_CURVE")) /* the scaling curve alone */
		goto scaling;

	printf("refit planner benchmark (one core; times in seconds, memory = RSS growth)\n\n");
	printf("%-34s %-9s %7s %10s %9s %8s %8s %8s %7s %6s %7s\n", "case", "mode", "tensors",
	       "transfers", "messages", "plan_s", "cost_s", "valid_s", "mem_MiB", "B/xfer",
	       "t/bound");
	if (plan_topo_preset(&topo, "dgx-h100:512", 0, NULL) != REFIT_OK)
		return 1;
	for (int k = 0; k < 2; k++) {
		plan_layout_set_t s, d;
		char label[64];

		plan_layout_set_init(&s);
		plan_layout_set_init(&d);
		make_model(sizes[k], &s, &d);
		snprintf(label, sizeof(label), "moe %d layers 256->256 ranks", sizes[k]);
		run_case(label, &s, &d, &topo, k == 0);
		plan_layout_set_fini(&s);
		plan_layout_set_fini(&d);
	}
	plan_topo_fini(&topo);
	single_tensor("1 tensor 1024->1024, S(0)->S(0)", "Shard(0)", 1000003, 8192);
	single_tensor("1 tensor 1024->1024, S(0)->S(1)", "Shard(1)", 1000003, 8192);

scaling:;
	/* ranks vs time and memory (BENCH_QUICK: DeepSeek-V3 only) */
	static const int ds[] = {2, 4, 8}, kimi[] = {16, 32, 64};

	printf("\nscaling curve (reshard; plan_s = CPU seconds of plan_build, peak_MiB = "
	       "the case's peak RSS)\n");
	printf("%-12s %-12s %-12s %6s %10s %8s %9s  %s\n", "model", "train", "infer", "ranks",
	       "transfers", "plan_s", "peak_MiB", "digest");
	curve("deepseek-v3", "pp16,ep16", "tp32", ds, 3);
	if (!getenv("BENCH_QUICK"))
		curve("kimi-k2", "pp16,ep64", "tp16", kimi, 3);
	return 0;
}
