/*
 * refit_plan_internal.h - what the files of `refit-plan` share: the exit
 * code for bad input, the program's name in messages, reporting an error
 * and printing a buffer, and each subcommand family's entry point for the
 * table in refit_plan.c (refit_plan_plan.c: plan, explain;
 * refit_plan_model.c: model; refit_plan_fw.c: framework-map).
 */
#ifndef REFIT_CLIENT_PLAN_INTERNAL_H
#define REFIT_CLIENT_PLAN_INTERNAL_H

#include <stdio.h>

#include "common/err.h"
#include "common/strbuf.h"

#define EXIT_BADINPUT 2

static const char *progname = "refit-plan";

static inline int
die_input(const refit_err_t *err)
{
	fprintf(stderr, "%s: %s\n", progname, err->msg);
	return err->status == REFIT_ERR_INTERNAL ? 1 : EXIT_BADINPUT;
}

static inline void
put(strbuf_t *sb)
{
	fwrite(sb->s, 1, sb->len, stdout);
}

/* refit_plan_plan.c: refit-plan plan ..., refit-plan explain ...; the exit code */
int refit_plan_cmd_plan(int argc, char **argv);
int refit_plan_cmd_explain(int argc, char **argv);
/* refit_plan_model.c: refit-plan model ...; the exit code */
int refit_plan_cmd_model(int argc, char **argv);

#endif
