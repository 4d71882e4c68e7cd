/*
 * refit_plan_model.c - `refit-plan model`: a whole model from the
 * catalogue, its training and inference layouts (or frameworks' maps),
 * reshard against the best broadcast, time against the bound, conversion
 * and delta costs (see refit_plan.c for the binary).
 */
#include <inttypes.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/refit_plan_delta.h"
#include "client/refit_plan_fw.h"
#include "codec/json.h"
#include "common/clock.h"
#include "common/parse.h"
#include "plan/convert.h"
#include "plan/gpu_staging.h"
#include "client/refit_plan_internal.h"

/* ---- model ---------------------------------------------------------- */

#ifndef REFIT_DATADIR
#define REFIT_DATADIR "/usr/local/share/refit"
#endif

static void
model_usage(FILE *f)
{
	fprintf(f, "usage: %s model --model NAME|FILE --train SPEC --infer SPEC\n"
		"          [--topology PRESET] [--placement packed|rack-aligned]\n"
		"          [--chunk-bytes N] [--baseline-chunks LIST] [--infer-dtype D] [--validate]\n"
		"          [--explain] [--json]\n"
		"          [--train-framework megatron --infer-framework vllm|sglang [--coverage]]\n"
		"  NAME   a file in config/models (qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3,\n"
		"         kimi-k2, llama-3-70b) or a path to an architecture JSON\n"
		"  SPEC   comma-separated tpN, ppN, dpN, epN; e.g. --train tp4,pp8,ep16\n"
		"         --infer tp8,dp16 (inference: dp instances of tp, ep = tp optional)\n"
		"  PRESET a topology preset name (default dgx-h100), sized to both worlds\n"
		"  --placement  packed: rank r in domain r / domain size, training first;\n"
		"         rack-aligned: training and inference in separate domains, no\n"
		"         instance straddling two, leftover GPUs idle (default for\n"
		"         gb200-nvl72; packed for the others)\n"
		"  --baseline-chunks  chunk sizes gather-and-broadcast is also planned with;\n"
		"         the best is the baseline the speed-up is against (default\n"
		"         1MiB,2MiB,4MiB,8MiB,16MiB,64MiB)\n"
		"  --infer-dtype same|fp8-block128|fp8-tensor  inference weights: as trained\n"
		"         (default), or every projection in fp8e4m3 with 128 x 128 block\n"
		"         scales or one scale per tensor (docs/conversion.md)\n"
		"  --validate  also run the validator on the reshard plan\n"
		"  --explain   what the reshard's modelled time is made of: its busiest\n"
		"         resource (bytes, messages, latency) and the pipeline fill\n"
		"  --train-framework, --infer-framework  both sides as the frameworks keep\n"
		"         them (fused, padded, interleaved; docs/frameworks.md) instead of\n"
		"         Hugging Face tensors sharded on one dim; MoE experts per expert\n"
		"  --coverage  with them: every parameter byte by path (reshard, padding)\n"
		"  --delta-density D  also the reshard as a delta refit with D (0..1 or N%%)\n"
		"         of the elements changed: bytes, time, break-even densities\n"
		"  --delta-codec E,D  the codec's GB/s per rank (default %.1f,%.1f: one host\n"
		"         core, bench-delta; docs/delta.md)\n",
		progname, DELTA_ENCODE_GBS, DELTA_DECODE_GBS);
}

typedef struct model_run {
	plan_t p;
	plan_cost_t c;
	double secs;
} model_run_t;

static int
model_plan(const plan_layout_set_t *s, const plan_layout_set_t *d, plan_topo_t *t,
	   plan_opts_t *o, plan_mode_t mode, model_run_t *r)
{
	refit_err_t e;
	double t0 = clock_mono_s();

	refit_err_clear(&e);
	o->mode = mode;
	if (plan_build(s, d, t, o, &r->p, &e) != REFIT_OK ||
	    plan_cost(&r->p, s, d, t, &r->c, &e) != REFIT_OK) {
		plan_fini(&r->p);
		return die_input(&e);
	}
	r->secs = clock_mono_s() - t0;
	return 0;
}

/* --infer-dtype: the converted pair, and the unconverted reshard run */
typedef struct model_conv {
	bool on;
	plan_layout_set_t d8;
	plan_conv_t conv;
	model_run_t before;
	const plan_layout_set_t *ps, *pd;
} model_conv_t;

static void
model_conv_fini(model_conv_t *m)
{
	if (!m->on)
		return;
	plan_fini(&m->before.p);
	plan_convert_fini(&m->conv);
	plan_layout_set_fini(&m->d8);
	m->on = false;
}

static int
model_convert(const char *idt, plan_layout_set_t *s, plan_layout_set_t *d,
	      const plan_layout_set_t *given8, plan_topo_t *t, plan_opts_t *o, model_conv_t *m)
{
	int64_t block[2] = {128, 128};
	refit_err_t e;
	int rc;

	memset(m, 0, sizeof(*m));
	m->ps = s;
	m->pd = d;
	if (strcmp(idt, "same") == 0)
		return 0;
	if (strcmp(idt, "fp8-tensor") == 0)
		block[0] = block[1] = 0;
	refit_err_clear(&e);
	if (given8 != NULL) /* a framework map stores fp8 itself */
		plan_layout_set_copy(&m->d8, given8);
	else if (plan_convert_model_fp8(d, block, &m->d8, &e) != REFIT_OK)
		return die_input(&e);
	if (plan_convert_apply(s, &m->d8, &m->conv, &e) != REFIT_OK ||
	    plan_convert_check(&m->conv, s, &m->d8, &e) != REFIT_OK) {
		plan_layout_set_fini(&m->d8);
		return die_input(&e);
	}
	rc = model_plan(s, d, t, o, PLAN_MODE_RESHARD, &m->before);
	if (rc != 0) {
		plan_convert_fini(&m->conv);
		plan_layout_set_fini(&m->d8);
		return rc;
	}
	m->on = true;
	m->ps = &m->conv.src;
	m->pd = &m->conv.dst;
	return 0;
}

static void
model_row(const char *label, const model_run_t *r, strbuf_t *sb)
{
	char pay[32], net[32], nvl[32], nic[32], tm[32], lb[32];

	codec_fmt_bytes((double)r->c.payload_bytes, pay, sizeof(pay));
	codec_fmt_bytes((double)r->c.bytes[PLAN_LINK_NETWORK], net, sizeof(net));
	codec_fmt_bytes((double)r->c.bytes[PLAN_LINK_NVLINK], nvl, sizeof(nvl));
	codec_fmt_bytes((double)r->c.max_nic_bytes, nic, sizeof(nic));
	snprintf(tm, sizeof(tm), "%.3f s", r->c.time_s);
	snprintf(lb, sizeof(lb), "%.3f s", r->c.lb_time_s);
	strbuf_printf(sb, "%-21s %-12s %-12s %-12s %-12s %-10s %-11s %.3f\n", label, pay, net,
		      nvl, nic, tm, lb, r->c.ratio);
}

static const char *const res_names[] = {"network send", "network receive",
					 "NVLink send", "NVLink receive", "host copies",
					 "delta codec"};
static const char *const res_keys[] = {"net_tx", "net_rx", "nvlink_tx", "nvlink_rx", "host",
				       "codec"};

/* --explain: the reshard's modelled time, term by term (plan_cost_t.busiest). */
static void
explain_text(const plan_cost_t *c, strbuf_t *sb)
{
	char b[32];

	codec_fmt_bytes((double)c->busiest.bytes, b, sizeof(b));
	strbuf_printf(sb, "\nreshard %.3f ms = busiest resource %.3f ms + pipeline fill %.3f ms "
		      "(%u stages)\n", c->time_s * 1e3, (c->time_s - c->fill_s) * 1e3,
		      c->fill_s * 1e3, c->stages_used);
	strbuf_printf(sb, "busiest resource: %s of rank %d: %s in %" PRIu64 " messages "
		      "(%.2f MiB each on average): %.3f ms bytes + %.3f ms latency + %.3f ms "
		      "other\n", res_names[c->busiest.kind], c->busiest.rank, b, c->busiest.msgs,
		      c->busiest.msgs ? (double)c->busiest.bytes / (double)c->busiest.msgs / (1 << 20)
				      : 0.0,
		      c->busiest.bytes_s * 1e3, c->busiest.latency_s * 1e3,
		      (c->busiest.other_s > 0 ? c->busiest.other_s : 0) * 1e3);
}

static void
explain_json(const plan_cost_t *c, strbuf_t *sb)
{
	strbuf_printf(sb, ", \"explain\": {\"resource\": \"%s\", \"rank\": %d, \"bytes\": %" PRIu64
		      ", \"messages\": %" PRIu64 ", \"bytes_s\": %.9g, \"latency_s\": %.9g, "
		      "\"other_s\": %.9g, \"fill_s\": %.9g}", res_keys[c->busiest.kind],
		      c->busiest.rank, c->busiest.bytes, c->busiest.msgs, c->busiest.bytes_s,
		      c->busiest.latency_s, c->busiest.other_s > 0 ? c->busiest.other_s : 0,
		      c->fill_s);
}

/* "1MiB,4MiB,..." into out[] (at most 16). */
static refit_status_t
parse_chunks(const char *arg, uint64_t *out, size_t *n, refit_err_t *err)
{
	char buf[512], *save = NULL, *tok;

	if (strlen(arg) >= sizeof(buf))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--baseline-chunks: the list "
				     "is too long");
	snprintf(buf, sizeof(buf), "%s", arg);
	*n = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (*n == 16)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--baseline-chunks: "
					     "at most 16 sizes");
		CHECK(refit_parse_size(tok, &out[*n], "--baseline-chunks", err));
		if (out[*n] == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--baseline-chunks: "
					     "\"%s\" is zero", tok);
		(*n)++;
	}
	if (*n == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--baseline-chunks \"%s\": "
				     "no sizes", arg);
	return REFIT_OK;
}

/* Gather-and-broadcast at each chunk size; the fastest into *best. */
static int
best_baseline(const plan_layout_set_t *s, const plan_layout_set_t *d, plan_topo_t *t,
	      const plan_opts_t *o, const uint64_t *chunks, size_t n, plan_cost_t *best,
	      uint64_t *best_chunk)
{
	for (size_t i = 0; i < n; i++) {
		plan_opts_t oc = *o;
		model_run_t r;
		int rc;

		if (chunks[i] == o->chunk_bytes)
			continue; /* planned already */
		oc.chunk_bytes = chunks[i];
		if (oc.staging_bytes < oc.chunk_bytes)
			oc.staging_bytes = oc.chunk_bytes;
		if ((rc = model_plan(s, d, t, &oc, PLAN_MODE_BROADCAST, &r)) != 0)
			return rc;
		if (r.c.time_s < best->time_s) {
			*best = r.c;
			*best_chunk = chunks[i];
		}
		plan_fini(&r.p);
	}
	return 0;
}

int
refit_plan_cmd_model(int argc, char **argv)
{
	static const struct option lo[] = {
		{"model", required_argument, NULL, 'M'}, {"train", required_argument, NULL, 'T'},
		{"infer", required_argument, NULL, 'I'}, {"topology", required_argument, NULL, 't'},
		{"chunk-bytes", required_argument, NULL, 'c'}, {"json", no_argument, NULL, 'j'},
		{"placement", required_argument, NULL, 'P'},
		{"baseline-chunks", required_argument, NULL, 'B'},
		{"infer-dtype", required_argument, NULL, 'D'},
		{"validate", no_argument, NULL, 'V'}, {"explain", no_argument, NULL, 'E'},
		{"train-framework", required_argument, NULL, 'F'},
		{"infer-framework", required_argument, NULL, 'G'},
		{"coverage", no_argument, NULL, 'C'},
		{"delta-density", required_argument, NULL, 'd'},
		{"delta-codec", required_argument, NULL, 'k'},
		{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
	};
	static const char *const dirs[] = {"config/models", REFIT_DATADIR "/models", NULL};
	const char *tfw = NULL, *ifw = NULL;
	plan_fw_t tf = PLAN_FW_MEGATRON, ifk = PLAN_FW_VLLM;
	plan_layout_set_t d8 = {0};
	fw_pair_t fp = {0};
	bool fws = false;
	int coverage = 0;
	const char *name = NULL, *tr = NULL, *inf = NULL, *topo = "dgx-h100", *place = NULL;
	const char *idt = "same";
	plan_place_t pl;
	plan_jobs_t jobs;
	int32_t idle = 0;
	uint64_t chunks[16] = {1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20};
	size_t nchunks = 6;
	plan_cost_t best;
	uint64_t best_chunk = 0;
	plan_arch_t a;
	plan_par_t pt, pi;
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_opts_t o;
	model_run_t rs, bc;
	model_conv_t mc;
	refit_err_t e;
	strbuf_t sb;
	int c, json = 0, validate = 0, explain = 0, rc;
	plan_check_t chk = {0};
	delta_opts_t dlo = {false, 0.0, DELTA_ENCODE_GBS, DELTA_DECODE_GBS};

	refit_err_clear(&e);
	plan_opts_default(&o);
	optind = 1;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'M': name = optarg; break;
		case 'T': tr = optarg; break;
		case 'I': inf = optarg; break;
		case 't': topo = optarg; break;
		case 'j': json = 1; break;
		case 'P': place = optarg; break;
		case 'V': validate = 1; break;
		case 'E': explain = 1; break;
		case 'B':
			if (parse_chunks(optarg, chunks, &nchunks, &e) != REFIT_OK)
				return die_input(&e);
			break;
		case 'D': idt = optarg; break;
		case 'F': tfw = optarg; break;
		case 'G': ifw = optarg; break;
		case 'C': coverage = 1; break;
		case 'd':
			if (delta_parse_density(optarg, &dlo, &e) != REFIT_OK)
				return die_input(&e);
			break;
		case 'k':
			if (delta_parse_codec(optarg, &dlo, &e) != REFIT_OK)
				return die_input(&e);
			break;
		case 'c':
			if (refit_parse_size(optarg, &o.chunk_bytes, "--chunk-bytes", &e))
				return die_input(&e);
			break;
		case 'h': model_usage(stdout); return 0;
		default: model_usage(stderr); return EXIT_BADINPUT;
		}
	}
	if (!name || !tr || !inf || optind != argc) {
		model_usage(stderr);
		return EXIT_BADINPUT;
	}
	if (strcmp(idt, "same") != 0 && strcmp(idt, "fp8-block128") != 0 &&
	    strcmp(idt, "fp8-tensor") != 0) {
		fprintf(stderr, "%s: --infer-dtype \"%s\": expected same, fp8-block128 or "
			"fp8-tensor\n", progname, idt);
		return EXIT_BADINPUT;
	}
	fws = tfw != NULL || ifw != NULL;
	if (fws && (tfw == NULL || ifw == NULL)) {
		fprintf(stderr, "%s: --train-framework and --infer-framework go together (both "
			"sides named as their frameworks name them)\n", progname);
		return EXIT_BADINPUT;
	}
	if (coverage && !fws) {
		fprintf(stderr, "%s: --coverage needs --train-framework and --infer-framework\n",
			progname);
		return EXIT_BADINPUT;
	}
	if (codec_arch_load(name, dirs, &a, &e) != REFIT_OK ||
	    (fws && (plan_fw_parse(tfw, &tf, &e) != REFIT_OK ||
		     plan_fw_parse(ifw, &ifk, &e) != REFIT_OK)) ||
	    plan_par_parse(tr, true, &pt, &e) != REFIT_OK ||
	    plan_par_parse(inf, false, &pi, &e) != REFIT_OK)
		return die_input(&e);
	pl = plan_topo_default_placement(topo);
	if (place != NULL && plan_place_parse(place, &pl, &e) != REFIT_OK)
		return die_input(&e);
	if (strchr(topo, ':') != NULL) {
		fprintf(stderr, "%s: --topology \"%s\": give the preset name only; it is "
			"sized to both jobs\n", progname, topo);
		return EXIT_BADINPUT;
	}
	jobs = (plan_jobs_t){(int32_t)plan_par_world(&pt), (int32_t)(pi.dp ? pi.dp : 1),
			     (int32_t)(pi.tp ? pi.tp : 1)};
	if (fws) {
		if (strcmp(idt, "fp8-tensor") == 0) {
			fprintf(stderr, "%s: --infer-dtype fp8-tensor: the engines' fp8 maps use "
				"block scales (fp8-block128)\n", progname);
			return EXIT_BADINPUT;
		}
		if (fw_pair_build(&fp, &a, tf, &pt, ifk, &pi, strcmp(idt, "same") ? 128 : 0, &s,
				  &d, &e) != REFIT_OK)
			return die_input(&e);
		if (plan_convert_any(&d)) { /* d: as trained; d8: the map's fp8 */
			plan_layout_set_copy(&d8, &d);
			plan_layout_set_fini(&d);
			plan_convert_strip(&d8, &d);
		}
	} else {
		plan_layout_set_init(&s);
		plan_layout_set_init(&d);
		if (plan_model_layouts(&a, &pt, &pi, &s, &d, &e) != REFIT_OK) {
			plan_layout_set_fini(&s);
			plan_layout_set_fini(&d);
			return die_input(&e);
		}
	}
	if (plan_topo_preset_jobs(&t, topo, &jobs, pl, &idle, &e) != REFIT_OK) {
		plan_layout_set_fini(&s);
		plan_layout_set_fini(&d);
		fw_pair_fini(&fp);
		return die_input(&e);
	}
	rc = model_convert(idt, &s, &d, d8.n ? &d8 : NULL, &t, &o, &mc);
	if (rc == 0)
		rc = model_plan(mc.ps, mc.pd, &t, &o, PLAN_MODE_RESHARD, &rs);
	if (rc == 0 && (rc = model_plan(mc.ps, mc.pd, &t, &o, PLAN_MODE_BROADCAST, &bc)) != 0)
		plan_fini(&rs.p);
	if (rc == 0 && validate && plan_validate(&rs.p, mc.ps, mc.pd, &chk, &e) != REFIT_OK) {
		rc = die_input(&e);
		plan_fini(&rs.p);
		plan_fini(&bc.p);
	}
	if (rc == 0) {
		best = bc.c;
		best_chunk = o.chunk_bytes;
		rc = best_baseline(mc.ps, mc.pd, &t, &o, chunks, nchunks, &best, &best_chunk);
		if (rc != 0) {
			plan_fini(&rs.p);
			plan_fini(&bc.p);
		}
	}
	if (rc == 0) {
		strbuf_init(&sb);
		if (json) {
			/* every string escaped: the model's name comes from its file */
			strbuf_puts(&sb, "{\"model\": ");
			strbuf_json_str(&sb, a.name);
			strbuf_printf(&sb, ", \"params\": %lld, \"tensors\": %zu, \"train\": ",
				      (long long)plan_arch_params(&a), s.n);
			strbuf_json_str(&sb, tr);
			strbuf_puts(&sb, ", \"infer\": ");
			strbuf_json_str(&sb, inf);
			strbuf_puts(&sb, ", \"topology\": ");
			strbuf_json_str(&sb, topo);
			strbuf_printf(&sb, ", \"placement\": \"%s\", \"ranks\": %d, \"idle_ranks\": %d, "
				      "\"reshard\": ", plan_place_name(pl), t.nranks, idle);
			codec_cost_json(&rs.c, &sb);
			strbuf_puts(&sb, ", \"broadcast\": ");
			codec_cost_json(&bc.c, &sb);
			strbuf_printf(&sb, ", \"broadcast_best\": {\"chunk_bytes\": %llu, \"cost\": ",
				      (unsigned long long)best_chunk);
			codec_cost_json(&best, &sb);
			strbuf_puts(&sb, "}");
			if (mc.on) {
				strbuf_printf(&sb, ", \"infer_dtype\": \"%s\", \"conversion\": "
					      "{\"tensors\": %zu, \"on_senders\": %zu, "
					      "\"on_receivers\": %zu, \"unconverted_reshard\": ", idt,
					      mc.conv.n, plan_convert_count(&mc.conv, PLAN_CONV_SENDER),
					      plan_convert_count(&mc.conv, PLAN_CONV_RECEIVER));
				codec_cost_json(&mc.before.c, &sb);
				strbuf_puts(&sb, "}");
			}
			if (explain)
				explain_json(&rs.c, &sb);
			if (fws) {
				strbuf_puts(&sb, ", \"coverage\": ");
				fw_pair_coverage(&fp, true, &sb);
			}
			if (dlo.on &&
			    delta_report(&rs.p, mc.ps, mc.pd, &t, &rs.c, &dlo, true, &sb, &e) != REFIT_OK)
				rc = die_input(&e);
			{   /* the nccl transport's GPU staging per rank (docs/gpu.md) */
				plan_gpu_staging_t gs;

				plan_gpu_staging(&rs.p, 4, &gs);
				strbuf_printf(&sb, ", \"gpu_staging\": {\"group_peak_bytes\": %llu, "
					      "\"group_peak_rank\": %d, \"groups\": %llu, "
					      "\"relay_peak_bytes\": %llu}",
					      (unsigned long long)gs.group_peak, (int)gs.rank,
					      (unsigned long long)gs.groups,
					      (unsigned long long)(validate ? chk.max_staging : 0));
			}
			strbuf_printf(&sb, ", \"speedup\": %.4g, \"speedup_vs_best\": %.4g, "
				      "\"plan_seconds\": %.3f, \"transfers\": %zu, \"validated\": %s}\n",
				      bc.c.time_s / rs.c.time_s, best.time_s / rs.c.time_s, rs.secs,
				      rs.p.nxfers, validate ? "true" : "false");
		} else {
			char bytes[32];

			codec_fmt_bytes((double)plan_arch_params(&a) * plan_dtype_size(a.dtype),
					bytes, sizeof(bytes));
			strbuf_printf(&sb, "model %s: %.1f B parameters (%s %s), %zu tensors\n",
				      a.name, (double)plan_arch_params(&a) / 1e9, bytes,
				      plan_dtype_name(a.dtype), s.n);
			strbuf_printf(&sb, "training %s on %lld ranks -> inference %s on %lld ranks; "
				      "%s, placement %s, %d nodes, %d domains, %d idle ranks\n\n",
				      tr, (long long)plan_par_world(&pt), inf,
				      (long long)plan_par_world(&pi), topo, plan_place_name(pl),
				      t.nnodes, t.ndomains, idle);
			strbuf_printf(&sb, "%-21s %-12s %-12s %-12s %-12s %-10s %-11s %s\n", "",
				      "payload", "network", "nvlink", "busiest NIC", "modelled",
				      "lower bound", "ratio");
			if (mc.on)
				model_row("reshard, unconverted", &mc.before, &sb);
			model_row("reshard", &rs, &sb);
			model_row("gather-and-broadcast", &bc, &sb);
			{
				model_run_t b = {.c = best};
				char lbl[32], cb[32];

				codec_fmt_bytes((double)best_chunk, cb, sizeof(cb));
				snprintf(lbl, sizeof(lbl), "  best (%s)", cb);
				model_row(lbl, &b, &sb);
			}
			strbuf_printf(&sb, "\nreshard speed-up x%.2f (x%.2f against gather-and-broadcast "
				      "at its best chunk); planned in %.2f s (%zu transfers)\n",
				      bc.c.time_s / rs.c.time_s, best.time_s / rs.c.time_s, rs.secs,
				      rs.p.nxfers);
			if (mc.on)
				strbuf_printf(&sb, "\ninference %s: %zu tensors convert (%zu on the "
					      "senders, %zu on the receivers); network bytes x%.3f, "
					      "modelled time x%.3f of the unconverted reshard\n", idt,
					      mc.conv.n, plan_convert_count(&mc.conv, PLAN_CONV_SENDER),
					      plan_convert_count(&mc.conv, PLAN_CONV_RECEIVER),
					      (double)rs.c.bytes[PLAN_LINK_NETWORK] /
					      (double)mc.before.c.bytes[PLAN_LINK_NETWORK],
					      rs.c.time_s / mc.before.c.time_s);
			if (explain)
				explain_text(&rs.c, &sb);
			if (dlo.on &&
			    delta_report(&rs.p, mc.ps, mc.pd, &t, &rs.c, &dlo, false, &sb, &e) != REFIT_OK)
				rc = die_input(&e);
			if (coverage)
				fw_pair_coverage(&fp, false, &sb);
			if (validate)
				strbuf_printf(&sb, "validated: every needed element arrives exactly once "
					      "(relay data at most %.1f MiB on one rank in a round)\n",
					      (double)chk.max_staging / (1 << 20));
		}
		if (rc == 0)
			put(&sb);
		strbuf_fini(&sb);
		plan_fini(&rs.p);
		plan_fini(&bc.p);
	}
	model_conv_fini(&mc);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	plan_layout_set_fini(&d8);
	fw_pair_fini(&fp);
	return rc;
}
