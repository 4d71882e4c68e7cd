/*
 * refit_plan_fw.c - `refit-plan framework-map` and the framework side of
 * `refit-plan model` (see refit_plan_fw.h).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/refit_plan_fw.h"
#include "codec/json.h"

#ifndef REFIT_DATADIR
#define REFIT_DATADIR "/usr/local/share/refit"
#endif

static void
usage(FILE *f)
{
	fprintf(f, "usage: refit-plan framework-map --framework F --model NAME|FILE --par SPEC\n"
		"          [--rank R] [--check] [--fp8-block 128]\n"
		"  F      megatron, vllm or sglang\n"
		"  NAME   a file in config/models, or a path to an architecture JSON or a\n"
		"         Hugging Face config.json (llama, mistral, qwen2, qwen3, qwen3_moe,\n"
		"         deepseek_v3, kimi_k2)\n"
		"  SPEC   megatron: tpN,ppN[,dpN][,epN][,etpN] (ranks: TP innermost, then DP,\n"
		"         then PP); vllm, sglang: tpN[,dpN][,epN] (rank = instance * tp + tp rank)\n"
		"  --rank R   only rank R's parameters (default: every rank)\n"
		"  --check    check the map (pieces disjoint, inside, covering) and print a\n"
		"             summary instead of the map\n"
		"  --fp8-block N  an engine's projections in fp8e4m3 with N x N block\n"
		"             scales, each followed by its weight_scale_inv parameter\n"
		"prints every rank's parameters, as the framework names them, as pieces of\n"
		"the Hugging Face tensors (docs/frameworks.md)\n");
}

static const char *const dirs[] = {"config/models", REFIT_DATADIR "/models", NULL};

int
refit_plan_cmd_framework_map(int argc, char **argv)
{
	static const struct option lo[] = {
		{"framework", required_argument, NULL, 'f'}, {"model", required_argument, NULL, 'M'},
		{"par", required_argument, NULL, 'p'}, {"rank", required_argument, NULL, 'r'},
		{"check", no_argument, NULL, 'c'}, {"fp8-block", required_argument, NULL, 'b'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *fwn = NULL, *model = NULL, *par = NULL;
	long rank = -1, block = 0;
	int c, check = 0;
	char *end;
	plan_fw_t fw;
	plan_arch_t a;
	plan_par_t p;
	plan_fw_map_t m;
	refit_err_t e;
	strbuf_t sb;

	refit_err_clear(&e);
	optind = 1;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'f': fwn = optarg; break;
		case 'M': model = optarg; break;
		case 'p': par = optarg; break;
		case 'c': check = 1; break;
		case 'b':
			block = strtol(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || block <= 0) {
				fprintf(stderr, "refit-plan: --fp8-block \"%s\": expected a block "
					"size (128)\n", optarg);
				return 2;
			}
			break;
		case 'r':
			rank = strtol(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || rank < 0) {
				fprintf(stderr, "refit-plan: --rank \"%s\": expected a rank number\n",
					optarg);
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!fwn || !model || !par || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (plan_fw_parse(fwn, &fw, &e) != REFIT_OK ||
	    codec_arch_load(model, dirs, &a, &e) != REFIT_OK ||
	    plan_par_parse(par, plan_fw_trains(fw), &p, &e) != REFIT_OK ||
	    plan_fw_map_build(&m, &a, fw, &p, block, &e) != REFIT_OK) {
		fprintf(stderr, "refit-plan: %s\n", e.msg);
		return 2;
	}
	if (rank >= m.world) {
		fprintf(stderr, "refit-plan: --rank %ld: the %s world of %s has %lld ranks\n",
			rank, plan_fw_name(fw), par, (long long)m.world);
		plan_fw_map_fini(&m);
		return 2;
	}
	strbuf_init(&sb);
	if (check) {
		plan_fw_bytes_t b;
		char pb[32], pad[32];

		if (plan_fw_map_check(&m, &e) != REFIT_OK) {
			fprintf(stderr, "refit-plan: %s\n", e.msg);
			plan_fw_map_fini(&m);
			strbuf_fini(&sb);
			return 1;
		}
		plan_fw_map_bytes(&m, &b);
		codec_fmt_bytes((double)b.params, pb, sizeof(pb));
		codec_fmt_bytes((double)b.padding, pad, sizeof(pad));
		strbuf_printf(&sb, "%s %s %s: %lld ranks, %zu tensors, %zu parameters (%s, %s "
			      "padding), %zu pieces: checked\n", plan_fw_name(fw), a.name, par,
			      (long long)m.world, m.tensors.n, b.nparams, pb, pad, b.npieces);
	} else {
		codec_fw_map_json(&m, a.name, par, (int32_t)rank, &sb);
	}
	fwrite(sb.s, 1, sb.len, stdout);
	strbuf_fini(&sb);
	plan_fw_map_fini(&m);
	return 0;
}

refit_status_t
fw_pair_build(fw_pair_t *fp, const plan_arch_t *a, plan_fw_t tf, const plan_par_t *pt,
	      plan_fw_t inf, const plan_par_t *pi, int64_t fp8_block, plan_layout_set_t *s,
	      plan_layout_set_t *d, refit_err_t *err)
{
	refit_status_t rc;

	memset(fp, 0, sizeof(*fp));
	plan_layout_set_init(s);
	plan_layout_set_init(d);
	rc = plan_fw_map_build(&fp->train, a, tf, pt, 0, err);
	if (rc == REFIT_OK)
		rc = plan_fw_map_build(&fp->infer, a, inf, pi, fp8_block, err);
	if (rc == REFIT_OK)
		rc = plan_fw_map_layouts(&fp->train, 0, s, err);
	if (rc == REFIT_OK)
		rc = plan_fw_map_layouts(&fp->infer, (int32_t)fp->train.world, d, err);
	if (rc == REFIT_OK)
		rc = plan_fw_map_check_with(&fp->train, s, err);
	if (rc == REFIT_OK)
		rc = plan_fw_map_check_with(&fp->infer, d, err);
	if (rc != REFIT_OK) {
		plan_layout_set_fini(s);
		plan_layout_set_fini(d);
		fw_pair_fini(fp);
	}
	return rc;
}

void
fw_pair_fini(fw_pair_t *fp)
{
	plan_fw_map_fini(&fp->train);
	plan_fw_map_fini(&fp->infer);
}

static void
side(const char *label, const plan_fw_map_t *m, bool json, strbuf_t *sb)
{
	plan_fw_bytes_t b;
	uint64_t data;
	char pb[32], rb[32], pad[32];

	plan_fw_map_bytes(m, &b);
	data = b.params - b.padding;
	if (json) {
		strbuf_printf(sb, "\"%s\": {\"framework\": \"%s\", \"parameters\": %zu, "
			      "\"parameter_bytes\": %llu, \"reshard_bytes\": %llu, "
			      "\"padding_bytes\": %llu, \"other_bytes\": %llu, \"reshard_share\": "
			      "%.6f}", label, plan_fw_name(m->fw), b.nparams,
			      (unsigned long long)b.params, (unsigned long long)b.pieces,
			      (unsigned long long)b.padding, (unsigned long long)(data - b.pieces),
			      data ? (double)b.pieces / (double)data : 1.0);
		return;
	}
	codec_fmt_bytes((double)b.params, pb, sizeof(pb));
	codec_fmt_bytes((double)b.pieces, rb, sizeof(rb));
	codec_fmt_bytes((double)b.padding, pad, sizeof(pad));
	strbuf_printf(sb, "%-10s %-9s %10zu  %-14s %-14s %6.2f %%  %-12s\n", label,
		      plan_fw_name(m->fw), b.nparams, pb, rb,
		      data ? 100.0 * (double)b.pieces / (double)data : 100.0, pad);
}

void
fw_pair_coverage(const fw_pair_t *fp, bool json, strbuf_t *sb)
{
	if (json) {
		strbuf_puts(sb, "{");
		side("train", &fp->train, true, sb);
		strbuf_puts(sb, ", ");
		side("infer", &fp->infer, true, sb);
		strbuf_puts(sb, "}");
		return;
	}
	strbuf_printf(sb, "\ncoverage: every parameter byte of every rank, by path\n"
		      "%-10s %-9s %10s  %-14s %-14s %8s  %-12s\n", "side", "framework",
		      "parameters", "bytes", "by reshard", "share", "padding");
	side("training", &fp->train, false, sb);
	side("inference", &fp->infer, false, sb);
	strbuf_puts(sb, "(padding: rows a framework pads, e.g. its vocabulary; no path carries "
		    "them, the engine keeps its own)\n");
}
