/*
 * refit_plan.c - `refit-plan`, the planner offline.
 *
 * One binary, a table of subcommands that drives both dispatch and --help.
 * Exit codes: 0 success, 1 internal failure (e.g. a plan the validator
 * rejects: a bug), 2 bad input or usage.  Errors go to stderr.
 *
 * This file: the table and dispatch, `help` and `boxes`; `plan` and
 * `explain` are in refit_plan_plan.c, `model` in refit_plan_model.c,
 * `framework-map` in refit_plan_fw.c (refit_plan_internal.h).
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

typedef struct cmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *args;
	const char *help;
} cmd_t;

/* ---- boxes ---------------------------------------------------------- */

static int
cmd_boxes(int argc, char **argv)
{
	plan_layout_set_t set;
	refit_err_t err;
	strbuf_t sb;
	int list = 0, rc;

	if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		printf("usage: %s boxes LAYOUT.json\n"
		       "  prints {\"name\", \"shards\": [{\"rank\", \"offset\", \"size\"}]} per tensor:\n"
		       "  one entry per mesh rank, replicas included, empty shards with size 0;\n"
		       "  a rank holding several boxes (_StridedShard) gets one entry per box\n"
		       "  with its \"local_offset\" inside the rank's local tensor\n", progname);
		return 0;
	}
	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: %s boxes LAYOUT.json\n", progname);
		return EXIT_BADINPUT;
	}
	refit_err_clear(&err);
	plan_layout_set_init(&set);
	if (codec_layouts_load(argv[1], &set, &list, &err) != REFIT_OK)
		return die_input(&err);
	strbuf_init(&sb);
	if (list)
		strbuf_puts(&sb, "{\"tensors\": [\n");
	for (size_t i = 0; i < set.n; i++) {
		if (i)
			strbuf_puts(&sb, ",\n");
		codec_boxes_json(&set.v[i], &sb);
	}
	strbuf_puts(&sb, list ? "\n]}\n" : "\n");
	put(&sb);
	rc = 0;
	strbuf_fini(&sb);
	plan_layout_set_fini(&set);
	return rc;
}

/* ---- dispatch ------------------------------------------------------- */

static int cmd_help(int argc, char **argv);

static const cmd_t cmds[] = {
	{"boxes", cmd_boxes, "LAYOUT.json",
	 "print the box every rank holds, one entry per mesh rank"},
	{"framework-map", refit_plan_cmd_framework_map,
	 "--framework F --model M --par SPEC [--rank R] [--check]",
	 "a framework's real parameters on every rank as pieces of the HF tensors"},
	{"plan", refit_plan_cmd_plan, "--src S --dst D --topology T [...]",
	 "build, validate and cost a plan; --json prints every transfer"},
	{"explain", refit_plan_cmd_explain, "--src S --dst D --topology T [...]",
	 "reshard next to gather-and-broadcast: bytes, busiest links, time, bound"},
	{"model", refit_plan_cmd_model, "--model M --train SPEC --infer SPEC [--infer-dtype fp8-block128]",
	 "a whole model from the catalogue: reshard vs broadcast, time vs bound"},
	{"help", cmd_help, "[COMMAND]", "this text, or a command's options"},
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static void
usage(FILE *f)
{
	fprintf(f, "usage: %s COMMAND [ARGS]\n\nthe refit planner, offline\n\n", progname);
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  %-8s %-38s %s\n", cmds[i].name, cmds[i].args, cmds[i].help);
	fprintf(f, "\ntopology presets (use as NAME:RANKS):");
	for (const char *const *p = plan_topo_preset_names(); *p; p++)
		fprintf(f, " %s", *p);
	fprintf(f, "\n");
}

static int
cmd_help(int argc, char **argv)
{
	if (argc >= 2) {
		char *hargv[] = {argv[1], "--help", NULL};

		for (size_t i = 0; i < NCMDS; i++)
			if (strcmp(cmds[i].name, argv[1]) == 0 && cmds[i].run != cmd_help)
				return cmds[i].run(2, hargv);
	}
	usage(stdout);
	return 0;
}

int
main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_BADINPUT;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < NCMDS; i++)
		if (strcmp(cmds[i].name, argv[1]) == 0)
			return cmds[i].run(argc - 1, argv + 1);
	fprintf(stderr, "%s: unknown command \"%s\"\n", progname, argv[1]);
	usage(stderr);
	return EXIT_BADINPUT;
}
