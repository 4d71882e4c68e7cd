/*
 * helpers.h - shared test helpers: layouts from JSON strings, lookups.
 */
#ifndef REFIT_TESTS_HELPERS_H
#define REFIT_TESTS_HELPERS_H

#include "codec/json.h"
#include "tests/unit/suites.h"

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

#endif
