/*
 * helpers.h - shared test helpers: suites from lists of tests, layouts from
 * JSON strings, lookups.
 */
#ifndef REFIT_TESTS_HELPERS_H
#define REFIT_TESTS_HELPERS_H

#include "codec/json.h"
#include "tests/unit/suites.h"

/* The arguments tests, n of th_tcase for the tests named (START_TEST names). */
#define TH_TESTS(...)                                        \
	(const TTest *const[]){__VA_ARGS__},                 \
		sizeof((const TTest *const[]){__VA_ARGS__}) / sizeof(const TTest *)

/* A test case named name holding tests[0..n), each run once; timeout_s > 0
 * replaces Check's default timeout.  Add loop tests to the result. */
TCase *th_tcase(const char *name, double timeout_s, const TTest *const *tests, size_t n);
/* A suite named name holding the test cases given, NULL-terminated. */
Suite *th_suite(const char *name, TCase *tc, ...);

/* Parse json into a fresh set; the test fails with the message on error. */
void th_layouts(const char *json, plan_layout_set_t *out);
/* Parse one tensor and move it into *l. */
void th_layout(const char *json, plan_layout_t *l);
/* The error message a layout document produces (test fails if it parses). */
const char *th_layout_error(const char *json);
/* The n-th shard (0-based) held by rank, or NULL. */
const plan_shard_t *th_shard(const plan_layout_t *l, int32_t rank, int n);
/* Shards held by rank. */
int th_nshards(const plan_layout_t *l, int32_t rank);
/* Preset topology; fails the test on error. */
void th_topo(const char *spec, plan_topo_t *t);

/* A plan with its inputs, its check and its cost. */
typedef struct th_plan {
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_t p;
	plan_check_t chk;
	plan_cost_t c;
} th_plan_t;
/* Build, validate and cost the plan from x->s to x->d on x->t with o
 * (the defaults when NULL); the test fails on any error. */
void th_plan_make(th_plan_t *x, const plan_opts_t *o);
/* Parse src and dst, take the preset topology topo, then th_plan_make. */
void th_plan_build(th_plan_t *x, const char *src, const char *dst, const char *topo,
		   const plan_opts_t *o);
/* Free the plan and its inputs. */
void th_plan_fini(th_plan_t *x);

#endif
