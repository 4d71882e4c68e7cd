/*
 * main.c - runs every unit-test suite; forks per test (Check's default),
 * so a crash fails one test, not the run.  Exit status 0 when all pass.
 * Check's own CK_RUN_SUITE / CK_RUN_CASE select a part.
 */
#include <stddef.h>
#include <stdlib.h>

#include "tests/unit/suites.h"

/* The suites, in the order they run. */
static Suite *(*const suites[])(void) = {
	suite_common,  suite_box,       suite_layout,   suite_topo,      suite_codec,
	suite_planner, suite_validate,  suite_gpu_staging, suite_property, suite_dataplane,
	suite_model,   suite_convert,   suite_conv_exec, suite_ops,      suite_config,
	suite_config_values,
	suite_refit_fsm, suite_coord_rules, suite_pool,   suite_plansort, suite_framework,
	suite_blame,     suite_delta,     suite_delta_base, suite_gdelta_base, suite_auth,
	suite_etcd_watch, suite_coord_chunks,
};

int
main(void)
{
	SRunner *sr = srunner_create(NULL);
	int failed;

	for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
		srunner_add_suite(sr, suites[i]());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
