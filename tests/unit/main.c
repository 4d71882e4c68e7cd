/*
 * main.c - runs every unit-test suite; forks per test (Check's default),
 * so a crash fails one test, not the run.  Exit status 0 when all pass.
 * Check's own CK_RUN_SUITE / CK_RUN_CASE select a part.
 */
#include <stdlib.h>

#include "tests/unit/suites.h"

int
main(void)
{
	SRunner *sr = srunner_create(suite_common());
	int failed;

	srunner_add_suite(sr, suite_box());
	srunner_add_suite(sr, suite_layout());
	srunner_add_suite(sr, suite_topo());
	srunner_add_suite(sr, suite_codec());
	srunner_add_suite(sr, suite_planner());
	srunner_add_suite(sr, suite_validate());
	srunner_add_suite(sr, suite_property());
	srunner_add_suite(sr, suite_dataplane());
	srunner_add_suite(sr, suite_model());
	srunner_add_suite(sr, suite_convert());
	srunner_add_suite(sr, suite_conv_exec());
	srunner_add_suite(sr, suite_ops());
	srunner_add_suite(sr, suite_pool());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
