/*
 * refit_plan_fw.h - the frameworks' memory in `refit-plan`: the
 * framework-map command and the layouts `refit-plan model` takes with
 * --train-framework / --infer-framework (plan/framework.h).
 */
#ifndef REFIT_CLIENT_PLAN_FW_H
#define REFIT_CLIENT_PLAN_FW_H

#include "common/strbuf.h"
#include "plan/framework.h"

/* refit-plan framework-map ...; returns the exit code. */
int refit_plan_cmd_framework_map(int argc, char **argv);

/* Both sides of a model refit as framework maps. */
typedef struct fw_pair {
	plan_fw_map_t train, infer;
} fw_pair_t;

/*
 * Build the maps of a under the two frameworks and their layouts (training
 * ranks from 0, inference ranks after them) into s and d (initialised
 * here; fp8_block > 0: the engine's projections in fp8, d converting);
 * checks both maps (plan_fw_map_check).  On error nothing is left
 * to free.
 */
refit_status_t fw_pair_build(fw_pair_t *fp, const plan_arch_t *a, plan_fw_t tf,
			     const plan_par_t *pt, plan_fw_t inf, const plan_par_t *pi,
			     int64_t fp8_block, plan_layout_set_t *s, plan_layout_set_t *d,
			     refit_err_t *err);
void fw_pair_fini(fw_pair_t *fp);
/* The coverage table: parameter bytes by reshard versus padding, per side. */
void fw_pair_coverage(const fw_pair_t *fp, bool json, strbuf_t *sb);

#endif
