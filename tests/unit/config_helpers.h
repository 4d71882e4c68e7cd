/*
 * config_helpers.h - what the configuration tests (test_config.c,
 * test_config_values.c) share.  Each call fails the running Check test
 * unless daemon/config.c answers as expected; a refusal must also leave
 * the configuration as it was.  Messages returned are in static storage,
 * good until the next call of the same helper.
 */
#ifndef REFIT_TESTS_CONFIG_HELPERS_H
#define REFIT_TESTS_CONFIG_HELPERS_H

#include <cjson/cJSON.h>

#include "daemon/config.h"

#define TIB (1ull << 40)

/* config_dump of c, parsed (the caller frees it); fails unless an object. */
cJSON *tcfg_dump_json(const refitd_config_t *c);
/* config_dump as text (heap, the caller frees it). */
char *tcfg_dump_text(const refitd_config_t *c);
/* The value config_dump shows for key, as compact JSON text (static). */
const char *tcfg_shown(const refitd_config_t *c, const char *key);
/* The message names key and, when value is not empty, quotes value. */
void tcfg_names(const char *msg, const char *key, const char *value);
/* config_set(key, value) succeeds. */
void tcfg_set_ok(refitd_config_t *c, const char *key, const char *value);
/* config_set(key, value) fails and leaves c as it was; its message. */
const char *tcfg_set_refused(refitd_config_t *c, const char *key, const char *value);
/* config_parse(text) succeeds. */
void tcfg_parse_ok(refitd_config_t *c, const char *text);
/* config_parse(text) fails and leaves c as it was; its message. */
const char *tcfg_parse_refused(refitd_config_t *c, const char *text);
/* config_check passes. */
void tcfg_check_ok(const refitd_config_t *c);
/* config_check fails with REFIT_ERR_INVALID_ARG; its message. */
const char *tcfg_check_refused(const refitd_config_t *c);
/* A node serving ranks 0-3, otherwise the defaults; passes config_check
 * (config_init'ed here; the caller calls config_fini). */
void tcfg_node_config(refitd_config_t *c);
/* A coordinator with the defaults; passes config_check. */
void tcfg_coordinator_config(refitd_config_t *c);

#endif
