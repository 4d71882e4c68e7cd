/*
 * refit_plan_plan.c - `refit-plan plan` and `refit-plan explain`: a plan
 * between two layout files on a topology, built, validated and costed, or
 * set next to gather-and-broadcast (see refit_plan.c for the binary).
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

typedef struct inputs {
	const char *src, *dst, *topo;
	plan_opts_t opts;
	int json, validate;
	plan_layout_set_t s, d;
	plan_topo_t t;
	bool has_conv;           /* the destination converts (docs/conversion.md) */
	plan_conv_t conv;        /* then plans are built on its rewritten pair */
	const plan_layout_set_t *ps, *pd;
} inputs_t;

static const struct option plan_longopts[] = {
	{"src", required_argument, NULL, 's'},
	{"dst", required_argument, NULL, 'd'},
	{"topology", required_argument, NULL, 't'},
	{"chunk-bytes", required_argument, NULL, 'c'},
	{"staging-bytes", required_argument, NULL, 'b'},
	{"mode", required_argument, NULL, 'm'},
	{"json", no_argument, NULL, 'j'},
	{"no-validate", no_argument, NULL, 'n'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

static void
plan_usage(const char *sub)
{
	fprintf(stderr,
		"usage: %s %s --src S.json --dst D.json --topology T.json|PRESET:RANKS\n"
		"          [--chunk-bytes N] [--staging-bytes N] [--mode reshard|broadcast]\n"
		"          [--json] [--no-validate]\n"
		"  --chunk-bytes    largest message (default 4MiB)\n"
		"  --staging-bytes  per-rank bound on relayed data held (default 256MiB)\n"
		"  --mode           reshard (default) or broadcast (gather-and-broadcast)\n"
		"  --json           machine-readable output\n"
		"  --no-validate    skip the independent validator\n",
		progname, sub);
}

static void
free_inputs(inputs_t *in)
{
	plan_layout_set_fini(&in->s);
	plan_layout_set_fini(&in->d);
	plan_topo_fini(&in->t);
	if (in->has_conv)
		plan_convert_fini(&in->conv);
}

/* 0 parsed, -1 help printed, >0 exit code; on >0 nothing is left to free */
static int
parse_inputs(int argc, char **argv, inputs_t *in)
{
	refit_err_t err;
	int c;

	memset(in, 0, sizeof(*in));
	plan_opts_default(&in->opts);
	in->validate = 1;
	refit_err_clear(&err);
	optind = 1;
	while ((c = getopt_long(argc, argv, "", plan_longopts, NULL)) != -1) {
		switch (c) {
		case 's': in->src = optarg; break;
		case 'd': in->dst = optarg; break;
		case 't': in->topo = optarg; break;
		case 'j': in->json = 1; break;
		case 'n': in->validate = 0; break;
		case 'c':
			if (refit_parse_size(optarg, &in->opts.chunk_bytes, "--chunk-bytes", &err))
				return die_input(&err);
			break;
		case 'b':
			if (refit_parse_size(optarg, &in->opts.staging_bytes, "--staging-bytes",
					     &err))
				return die_input(&err);
			break;
		case 'm':
			if (plan_mode_parse(optarg, &in->opts.mode) != REFIT_OK) {
				fprintf(stderr, "%s: --mode \"%s\": expected reshard or "
					"broadcast\n", progname, optarg);
				return EXIT_BADINPUT;
			}
			break;
		case 'h':
			plan_usage(argv[0]);
			return -1;
		default:
			plan_usage(argv[0]);
			return EXIT_BADINPUT;
		}
	}
	if (optind != argc || !in->src || !in->dst || !in->topo) {
		fprintf(stderr, "%s %s: --src, --dst and --topology are required\n",
			progname, argv[0]);
		plan_usage(argv[0]);
		return EXIT_BADINPUT;
	}
	plan_layout_set_init(&in->s);
	plan_layout_set_init(&in->d);
	if (codec_layouts_load(in->src, &in->s, NULL, &err) != REFIT_OK ||
	    codec_layouts_load(in->dst, &in->d, NULL, &err) != REFIT_OK ||
	    codec_topo_load(in->topo, &in->t, &err) != REFIT_OK) {
		free_inputs(in);
		return die_input(&err);
	}
	in->ps = &in->s;
	in->pd = &in->d;
	if (plan_convert_any(&in->d)) {
		if (plan_convert_apply(&in->s, &in->d, &in->conv, &err) != REFIT_OK) {
			free_inputs(in);
			return die_input(&err);
		}
		in->has_conv = true;
		if (in->validate &&
		    plan_convert_check(&in->conv, &in->s, &in->d, &err) != REFIT_OK) {
			free_inputs(in);
			return die_input(&err);
		}
		in->ps = &in->conv.src;
		in->pd = &in->conv.dst;
	}
	return 0;
}

/* What conversion changes: the reshard plan of the same refit without it. */
static int
conv_summary(inputs_t *in, const plan_cost_t *after, strbuf_t *sb)
{
	plan_layout_set_t d0;
	plan_opts_t o = in->opts;
	refit_err_t err;
	plan_cost_t c;
	plan_t p;
	char a[8][32];

	if (!in->has_conv)
		return 0;
	refit_err_clear(&err);
	plan_convert_strip(&in->d, &d0);
	o.mode = PLAN_MODE_RESHARD;
	if (plan_build(&in->s, &d0, &in->t, &o, &p, &err) != REFIT_OK) {
		plan_layout_set_fini(&d0);
		return die_input(&err);
	}
	if (plan_cost(&p, &in->s, &d0, &in->t, &c, &err) != REFIT_OK) {
		plan_fini(&p);
		plan_layout_set_fini(&d0);
		return die_input(&err);
	}
	codec_fmt_bytes((double)c.payload_bytes, a[0], sizeof(a[0]));
	codec_fmt_bytes((double)after->payload_bytes, a[1], sizeof(a[1]));
	codec_fmt_bytes((double)c.bytes[PLAN_LINK_NETWORK], a[2], sizeof(a[2]));
	codec_fmt_bytes((double)after->bytes[PLAN_LINK_NETWORK], a[3], sizeof(a[3]));
	codec_fmt_time(c.time_s, a[4], sizeof(a[4]));
	codec_fmt_time(after->time_s, a[5], sizeof(a[5]));
	codec_fmt_time(c.lb_time_s, a[6], sizeof(a[6]));
	codec_fmt_time(after->lb_time_s, a[7], sizeof(a[7]));
	strbuf_printf(sb, "conversion: %zu tensors (%zu on the senders, %zu on the receivers)\n"
		      "  reshard without -> with conversion: payload %s -> %s, network %s -> %s, "
		      "modelled %s -> %s, lower bound %s -> %s\n",
		      in->conv.n, plan_convert_count(&in->conv, PLAN_CONV_SENDER),
		      plan_convert_count(&in->conv, PLAN_CONV_RECEIVER), a[0], a[1], a[2], a[3],
		      a[4], a[5], a[6], a[7]);
	plan_fini(&p);
	plan_layout_set_fini(&d0);
	return 0;
}

/* Build, validate and cost one plan; exit code on failure, else 0. */
static int
make_plan(inputs_t *in, const plan_opts_t *o, plan_t *p, plan_cost_t *c)
{
	refit_err_t err;
	plan_check_t chk;

	refit_err_clear(&err);
	if (plan_build(in->ps, in->pd, &in->t, o, p, &err) != REFIT_OK)
		return die_input(&err);
	if ((in->validate && plan_validate(p, in->ps, in->pd, &chk, &err) != REFIT_OK) ||
	    plan_cost(p, in->ps, in->pd, &in->t, c, &err) != REFIT_OK) {
		plan_fini(p);
		return die_input(&err);
	}
	return 0;
}

int
refit_plan_cmd_plan(int argc, char **argv)
{
	inputs_t in;
	plan_t p;
	plan_cost_t c;
	strbuf_t sb;
	int rc = parse_inputs(argc, argv, &in);

	if (rc != 0)
		return rc < 0 ? 0 : rc;
	rc = make_plan(&in, &in.opts, &p, &c);
	if (rc == 0) {
		strbuf_init(&sb);
		if (in.json)
			codec_plan_json(&p, &c, &sb);
		else
			codec_plan_summary(&p, &c, &in.t, &sb);
		if (!in.json && in.validate)
			strbuf_puts(&sb, "validated: every needed element arrives exactly "
				    "once; senders hold what they send; staging bound kept\n");
		if (!in.json)
			rc = conv_summary(&in, &c, &sb);
		put(&sb);
		strbuf_fini(&sb);
		plan_fini(&p);
	}
	free_inputs(&in);
	return rc;
}

int
refit_plan_cmd_explain(int argc, char **argv)
{
	inputs_t in;
	plan_t rp, bp;
	plan_cost_t rc_, bc;
	plan_opts_t o;
	strbuf_t sb;
	int rc = parse_inputs(argc, argv, &in);

	if (rc != 0)
		return rc < 0 ? 0 : rc;
	o = in.opts;
	o.mode = PLAN_MODE_RESHARD;
	rc = make_plan(&in, &o, &rp, &rc_);
	if (rc == 0) {
		o.mode = PLAN_MODE_BROADCAST;
		rc = make_plan(&in, &o, &bp, &bc);
		if (rc == 0) {
			strbuf_init(&sb);
			if (in.json) {
				strbuf_puts(&sb, "{\"reshard\": ");
				codec_plan_json(&rp, &rc_, &sb);
				strbuf_puts(&sb, ", \"broadcast\": ");
				codec_plan_json(&bp, &bc, &sb);
				strbuf_puts(&sb, "}\n");
			} else {
				codec_explain_table(&rp, &rc_, &bp, &bc, &in.t, &sb);
				rc = conv_summary(&in, &rc_, &sb);
			}
			put(&sb);
			strbuf_fini(&sb);
			plan_fini(&bp);
		}
		plan_fini(&rp);
	}
	free_inputs(&in);
	return rc;
}
