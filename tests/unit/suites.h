/*
 * suites.h - the unit-test suites (Check), run by main.c.
 */
#ifndef REFIT_TESTS_SUITES_H
#define REFIT_TESTS_SUITES_H

#include <check.h>

Suite *suite_common(void);
Suite *suite_box(void);
Suite *suite_layout(void);
Suite *suite_topo(void);
Suite *suite_codec(void);
Suite *suite_planner(void);
Suite *suite_validate(void);
Suite *suite_gpu_staging(void);
Suite *suite_property(void);
Suite *suite_dataplane(void);
Suite *suite_model(void);
Suite *suite_convert(void);
Suite *suite_conv_exec(void);
Suite *suite_ops(void);
Suite *suite_config(void);
Suite *suite_config_values(void);
Suite *suite_refit_fsm(void);
Suite *suite_coord_rules(void);
Suite *suite_pool(void);
Suite *suite_plansort(void);
Suite *suite_framework(void);
Suite *suite_blame(void);
Suite *suite_delta(void);
Suite *suite_delta_base(void);
Suite *suite_gdelta_base(void);
Suite *suite_auth(void);
Suite *suite_etcd_watch(void);
Suite *suite_coord_chunks(void);

#endif
