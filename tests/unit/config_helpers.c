/*
 * config_helpers.c - what the configuration tests share (config_helpers.h):
 * config_set, config_parse and config_check run and the test failed unless
 * they go as expected, a refusal checked to leave the configuration as it
 * was, and what config_dump shows read back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "common/strbuf.h"
#include "tests/unit/config_helpers.h"
#include "tests/unit/helpers.h"


/* config_dump of c, parsed; the test fails when it is not a JSON object. */
cJSON *
tcfg_dump_json(const refitd_config_t *c)
{
	strbuf_t sb;
	cJSON *root;

	strbuf_init(&sb);
	config_dump(c, &sb);
	root = cJSON_Parse(sb.s);
	ck_assert_msg(cJSON_IsObject(root), "config_dump is not a JSON object: %s", sb.s);
	strbuf_fini(&sb);
	return root;
}

/* config_dump as text (heap). */
char *
tcfg_dump_text(const refitd_config_t *c)
{
	strbuf_t sb;

	strbuf_init(&sb);
	config_dump(c, &sb);
	return sb.s;
}

/* The value config_dump shows for key, as compact JSON text. */
const char *
tcfg_shown(const refitd_config_t *c, const char *key)
{
	static char out[256];
	cJSON *root = tcfg_dump_json(c);
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
	char *t;

	ck_assert_msg(v != NULL, "config_dump has no \"%s\"", key);
	t = cJSON_PrintUnformatted(v);
	snprintf(out, sizeof(out), "%s", t);
	free(t);
	cJSON_Delete(root);
	return out;
}

/* The message names key and, when value is not empty, quotes value. */
void
tcfg_names(const char *msg, const char *key, const char *value)
{
	ck_assert_msg(strstr(msg, key) != NULL, "message \"%s\" does not name key %s", msg, key);
	if (value != NULL && value[0] != '\0')
		ck_assert_msg(strstr(msg, value) != NULL, "message \"%s\" does not quote \"%s\"",
			      msg, value);
}

void
tcfg_set_ok(refitd_config_t *c, const char *key, const char *value)
{
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_msg(config_set(c, key, value, &e) == REFIT_OK, "%s = \"%s\": %s", key, value,
		      e.msg);
}

/* config_set(key, value) fails and leaves c as it was; its message. */
const char *
tcfg_set_refused(refitd_config_t *c, const char *key, const char *value)
{
	static refit_err_t e;
	char *before = tcfg_dump_text(c), *after;

	refit_err_clear(&e);
	ck_assert_msg(config_set(c, key, value, &e) != REFIT_OK, "%s = \"%s\" was taken", key,
		      value);
	ck_assert_int_eq(e.status, REFIT_ERR_INVALID_ARG);
	after = tcfg_dump_text(c);
	ck_assert_msg(strcmp(before, after) == 0, "%s = \"%s\" was refused but changed the "
		      "configuration", key, value);
	free(before);
	free(after);
	return e.msg;
}

void
tcfg_parse_ok(refitd_config_t *c, const char *text)
{
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_msg(config_parse(c, text, strlen(text), &e) == REFIT_OK, "%s: %s", text, e.msg);
}

/* config_parse(text) fails and leaves c as it was; its message. */
const char *
tcfg_parse_refused(refitd_config_t *c, const char *text)
{
	static refit_err_t e;
	char *before = tcfg_dump_text(c), *after;

	refit_err_clear(&e);
	ck_assert_msg(config_parse(c, text, strlen(text), &e) != REFIT_OK, "%s was taken", text);
	ck_assert_int_eq(e.status, REFIT_ERR_INVALID_ARG);
	after = tcfg_dump_text(c);
	ck_assert_msg(strcmp(before, after) == 0, "%s was refused but changed the "
		      "configuration", text);
	free(before);
	free(after);
	return e.msg;
}

void
tcfg_check_ok(const refitd_config_t *c)
{
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_msg(config_check(c, &e) == REFIT_OK, "config_check: %s", e.msg);
}

const char *
tcfg_check_refused(const refitd_config_t *c)
{
	static refit_err_t e;

	refit_err_clear(&e);
	ck_assert_msg(config_check(c, &e) != REFIT_OK, "config_check passed");
	ck_assert_int_eq(e.status, REFIT_ERR_INVALID_ARG);
	return e.msg;
}

/* A node serving ranks 0-3, otherwise the defaults; passes config_check. */
void
tcfg_node_config(refitd_config_t *c)
{
	config_init(c);
	tcfg_set_ok(c, "role", "node");
	tcfg_set_ok(c, "ranks", "0-3");
	tcfg_check_ok(c);
}

void
tcfg_coordinator_config(refitd_config_t *c)
{
	config_init(c);
	tcfg_set_ok(c, "role", "coordinator");
	tcfg_check_ok(c);
}
