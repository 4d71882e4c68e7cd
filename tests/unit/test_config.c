/*
 * test_config.c - refitd's configuration (daemon/config.c) without a
 * process: every key of the table from a good and a bad value (the keys
 * are read from config_dump, so a key added to the table without a case
 * below fails keys_all_cased) with its bounds and wrong JSON types, the
 * reloadable keys, the defaults against docs/control-plane.md's table, the
 * example configurations, the dump round trip and --help.  Documents,
 * units and the checks across keys: test_config_values.c.
 *
 * The docs and the example configurations are read relative to the
 * current directory: run the unit tests from the repository root (as
 * `make unit` and tests/run-check.sh do).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "codec/json.h"
#include "common/parse.h"
#include "common/strbuf.h"
#include "daemon/config.h"
#include "tests/unit/config_helpers.h"
#include "tests/unit/helpers.h"

/* What one key accepts and refuses. */
typedef struct kcase {
	const char *key;
	const char *good;      /* accepted by config_set */
	const char *shown;     /* config_dump's value after good, as JSON text */
	const char *bad;       /* refused by config_set; NULL: any text is taken
				  (a path or a name, checked where it is used) */
	const char *unchecked; /* taken by config_set but refused by config_check
				  on a node serving ranks 0-3; NULL: none */
	uint64_t lo, hi;       /* numbers: the inclusive bounds */
} kcase_t;


static const kcase_t cases[] = {
	{"role", "coordinator", "\"coordinator\"", "worker", NULL, 0, 0},
	{"listen", "unix:/tmp/refit.sock", "\"unix:/tmp/refit.sock\"", "", "127.0.0.1:70000", 0, 0},
	{"coordinator", "10.0.0.1:7070,10.0.0.2:7070", "\"10.0.0.1:7070,10.0.0.2:7070\"", "",
	 "10.0.0.1:7070,10.0.0.2:0", 0, 0},
	{"tls_cert", "/etc/refit/cert.pem", "\"/etc/refit/cert.pem\"", NULL, NULL, 0, 0},
	{"tls_key", "/etc/refit/key.pem", "\"/etc/refit/key.pem\"", NULL, NULL, 0, 0},
	{"tls_client_ca", "/etc/refit/ca.pem", "\"/etc/refit/ca.pem\"", NULL, NULL, 0, 0},
	{"tls_ca", "/etc/refit/ca.pem", "\"/etc/refit/ca.pem\"", NULL, NULL, 0, 0},
	{"token_file", "/etc/refit/token", "\"/etc/refit/token\"", NULL, NULL, 0, 0},
	{"join_token_file", "/etc/refit/join.token", "\"/etc/refit/join.token\"", NULL, NULL, 0, 0},
	{"insecure", "true", "\"true\"", "yes", NULL, 0, 0},
	{"lease_ttl_ms", "5000", "5000", "5s", NULL, 100, 3600000},
	{"heartbeat_ms", "500", "500", "-1", NULL, 10, 600000},
	{"nic", "node", "\"node\"", "switch", NULL, 0, 0},
	{"transport", "nccl", "\"nccl\"", "rdma", NULL, 0, 0},
	{"staging_bytes", "1GiB", "1073741824", "1.5G", "4194303", 1 << 20, TIB},
	{"max_msg_bytes", "16M", "16777216", "64 MiB", NULL, 4096, 1 << 30},
	{"state_file", "/var/lib/refit/state", "\"/var/lib/refit/state\"", NULL, NULL, 0, 0},
	{"state_store", "etcd", "\"etcd\"", "zookeeper", NULL, 0, 0},
	{"etcd_endpoints", "10.0.0.1:2379,10.0.0.2:2379", "\"10.0.0.1:2379,10.0.0.2:2379\"",
	 NULL, NULL, 0, 0},
	{"etcd_prefix", "/refit-a", "\"/refit-a\"", NULL, NULL, 0, 0},
	{"etcd_tls_ca", "/etc/refit/etcd-ca.crt", "\"/etc/refit/etcd-ca.crt\"", NULL, NULL, 0, 0},
	{"etcd_tls_cert", "/etc/refit/etcd.crt", "\"/etc/refit/etcd.crt\"", NULL, NULL, 0, 0},
	{"etcd_tls_key", "/etc/refit/etcd.key", "\"/etc/refit/etcd.key\"", NULL, NULL, 0, 0},
	{"etcd_lease_ttl_ms", "2000", "2000", "2s", NULL, 1000, 600000},
	{"etcd_chunk_bytes", "64KiB", "65536", "64 KiB", NULL, 1024, 1 << 20},
	{"log_level", "debug", "\"debug\"", "trace", NULL, 0, 0},
	{"node_id", "gpu-7", "\"gpu-7\"", "", NULL, 0, 0},
	{"ranks", "0-3,8", "\"0-3,8\"", NULL, "0-3,2", 0, 0},
	{"domain", "rack-1", "\"rack-1\"", NULL, NULL, 0, 0},
	{"advertise", "gpu-7:7071", "\"gpu-7:7071\"", NULL, "gpu-7:0", 0, 0},
	{"data_listen", "0.0.0.0:7072", "\"0.0.0.0:7072\"", "", "0.0.0.0:x", 0, 0},
	{"data_advertise", "gpu-7:7072", "\"gpu-7:7072\"", NULL, "gpu-7", 0, 0},
	{"local_socket", "/tmp/refit.sock", "\"/tmp/refit.sock\"", "", NULL, 0, 0},
	{"local_socket_group", "refit", "\"refit\"", NULL, NULL, 0, 0},
	{"slice_timeout_ms", "1000", "1000", "1e3", NULL, 100, 86400000},
	{"connect_timeout_ms", "2000", "2000", "2s", NULL, 100, 600000},
	{"delta_base_bytes", "64MiB", "67108864", "lots", NULL, 0, 1ull << 44},
	{"plan_cache_bytes", "0", "0", "lots", NULL, 0, TIB},
	{"cuda_library", "/opt/cuda/libcudart.so", "\"/opt/cuda/libcudart.so\"", NULL, NULL, 0, 0},
	{"nccl_library", "/opt/nccl/libnccl.so.2", "\"/opt/nccl/libnccl.so.2\"", NULL, NULL, 0, 0},
	{"gpu_kernels_library", "/opt/refit/k.so", "\"/opt/refit/k.so\"", NULL, NULL, 0, 0},
	{"gpu_devices", "4-7", "\"4-7\"", NULL, "0,1", 0, 0},
	{"gpu_staging_budget_bytes", "2GiB", "2147483648", "15MiB", NULL, 16 << 20, TIB},
	{"data_source_check", "off", "\"off\"", "maybe", NULL, 0, 0},
	{"data_tls", "on", "\"on\"", "yes", NULL, 0, 0},
	{"poisoned_exit", "on", "\"on\"", "yes", NULL, 0, 0},
	{"test_msg_delay_ms", "5", "5", "x", NULL, 0, 10000},
	{"test_fail_commit", "2", "2", "two", NULL, 0, 1000000},
	{"test_lose_publish", "2", "2", "two", NULL, 0, 1000000},
	{"test_hold_run_ms", "100", "100", "", NULL, 0, 60000},
	{"instance_grace_ms", "1000", "1000", "1m", NULL, 100, 86400000},
	{"refit_records", "1000", "1000", "many", NULL, 1, 100000},
	{"default_trigger", "on_ready", "\"on_ready\"", "auto", NULL, 0, 0},
	{"default_min_interval_ms", "500", "500", "-1", NULL, 0, 86400000},
	{"metrics_listen", "127.0.0.1:9100", "\"127.0.0.1:9100\"", NULL, "nonsense", 0, 0},
	{"log_format", "json", "\"json\"", "xml", NULL, 0, 0},
	{"test_hold_publish_ms", "800", "800", "1s", NULL, 0, 60000},
};

#define NCASES (sizeof(cases) / sizeof(cases[0]))

static const kcase_t *
case_of(const char *key)
{
	for (size_t i = 0; i < NCASES; i++)
		if (strcmp(cases[i].key, key) == 0)
			return &cases[i];
	return NULL;
}
/* The table's keys, in order, from config_dump: one case each, and no case
 * for a key the table lacks. */
START_TEST(keys_all_cased)
{
	refitd_config_t c;
	cJSON *root;
	const cJSON *it;
	size_t n = 0;

	config_init(&c);
	root = tcfg_dump_json(&c);
	cJSON_ArrayForEach(it, root) {
		ck_assert_msg(case_of(it->string) != NULL, "config key \"%s\" has no case in "
			      "tests/unit/test_config.c", it->string);
		n++;
	}
	for (size_t i = 0; i < NCASES; i++) {
		ck_assert_msg(cJSON_GetObjectItemCaseSensitive(root, cases[i].key) != NULL,
			      "case \"%s\" is not a config key", cases[i].key);
		ck_assert_msg(case_of(cases[i].key) == &cases[i], "two cases for \"%s\"",
			      cases[i].key);
	}
	ck_assert_uint_eq(n, NCASES);
	cJSON_Delete(root);
	config_fini(&c);
}
END_TEST

/* One key (loop over cases): its good value, its bad one, its bounds,
 * wrong JSON types, and what config_check says. */
START_TEST(key_values)
{
	static const char *const wrong_types[] = {
		"true", "false", "null", "[]", "[\"x\"]", "{}", "1.5", "-1", "1e30",
	};
	const kcase_t *k = &cases[_i];
	refitd_config_t c;
	char doc[256], num[32];
	bool number;
	cJSON *def;

	config_init(&c);
	def = tcfg_dump_json(&c);
	number = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(def, k->key));
	cJSON_Delete(def);

	/* the good value, from a flag and from a file */
	tcfg_set_ok(&c, k->key, k->good);
	ck_assert_str_eq(tcfg_shown(&c, k->key), k->shown);
	config_fini(&c);
	config_init(&c);
	snprintf(doc, sizeof(doc), "{\"%s\": \"%s\"}", k->key, k->good);
	tcfg_parse_ok(&c, doc);
	ck_assert_str_eq(tcfg_shown(&c, k->key), k->shown);
	if (number && strspn(k->good, "0123456789") == strlen(k->good)) {
		config_fini(&c);
		config_init(&c);
		snprintf(doc, sizeof(doc), "{\"%s\": %s}", k->key, k->good);
		tcfg_parse_ok(&c, doc);
		ck_assert_str_eq(tcfg_shown(&c, k->key), k->shown);
	}

	/* the bad value, from a flag and from a file */
	if (k->bad != NULL) {
		tcfg_names(tcfg_set_refused(&c, k->key, k->bad), k->key, k->bad);
		snprintf(doc, sizeof(doc), "{\"%s\": \"%s\"}", k->key, k->bad);
		tcfg_names(tcfg_parse_refused(&c, doc), k->key, k->bad);
	}

	/* numbers: the bounds are inclusive, one past either end is refused */
	ck_assert_msg(number == (k->hi > 0), "%s: bounds given for a string, or none for a "
		      "number", k->key);
	if (number) {
		snprintf(num, sizeof(num), "%" PRIu64, k->lo);
		tcfg_set_ok(&c, k->key, num);
		ck_assert_str_eq(tcfg_shown(&c, k->key), num);
		snprintf(num, sizeof(num), "%" PRIu64, k->hi);
		tcfg_set_ok(&c, k->key, num);
		ck_assert_str_eq(tcfg_shown(&c, k->key), num);
		snprintf(num, sizeof(num), "%" PRIu64, k->hi + 1);
		tcfg_names(tcfg_set_refused(&c, k->key, num), k->key, num);
		if (k->lo > 0) {
			snprintf(num, sizeof(num), "%" PRIu64, k->lo - 1);
			tcfg_names(tcfg_set_refused(&c, k->key, num), k->key, num);
		}
	}

	/* a file gives a string or a whole number, nothing else (a false|true
	 * key also a JSON boolean, test_auth.c) */
	for (size_t i = 0; i < sizeof(wrong_types) / sizeof(wrong_types[0]); i++) {
		if (strcmp(k->key, "insecure") == 0 && i < 2)
			continue;
		snprintf(doc, sizeof(doc), "{\"%s\": %s}", k->key, wrong_types[i]);
		tcfg_names(tcfg_parse_refused(&c, doc), k->key, NULL);
	}
	config_fini(&c);

	/* what only config_check can see, on a node (some keys are the node's) */
	if (k->unchecked != NULL) {
		tcfg_node_config(&c);
		tcfg_set_ok(&c, k->key, k->good);
		tcfg_check_ok(&c);
		tcfg_set_ok(&c, k->key, k->unchecked);
		tcfg_names(tcfg_check_refused(&c), k->key, k->unchecked);
		config_fini(&c);
	}
}
END_TEST

/* config_diff's callback: the keys reported, with their reloadable flag. */
typedef struct diffs {
	char keys[NCASES][32];
	bool reloadable[NCASES];
	size_t n;
} diffs_t;

static void
on_diff(void *ctx, const char *key, bool reloadable)
{
	diffs_t *d = ctx;

	ck_assert_uint_lt(d->n, NCASES);
	snprintf(d->keys[d->n], sizeof(d->keys[d->n]), "%s", key);
	d->reloadable[d->n++] = reloadable;
}

/* Whether key may change on SIGHUP: config_diff of the defaults against
 * key set to its good value reports exactly that key. */
static bool
reloadable(const kcase_t *k)
{
	refitd_config_t a, b;
	diffs_t d = {.n = 0};

	config_init(&a);
	config_init(&b);
	tcfg_set_ok(&b, k->key, k->good);
	config_diff(&a, &b, on_diff, &d);
	ck_assert_msg(d.n == 1 && strcmp(d.keys[0], k->key) == 0, "diff of %s: %zu keys",
		      k->key, d.n);
	config_fini(&a);
	config_fini(&b);
	return d.reloadable[0];
}

START_TEST(reload)
{
	static const char *const want[] = {
		"token_file", "join_token_file", "lease_ttl_ms", "heartbeat_ms", "log_level",
		"log_format",
	};
	refitd_config_t running, fresh;
	diffs_t d = {.n = 0};
	size_t nreload = 0;

	for (size_t i = 0; i < NCASES; i++) {
		bool r = reloadable(&cases[i]), listed = false;

		for (size_t j = 0; j < sizeof(want) / sizeof(want[0]); j++)
			listed |= strcmp(want[j], cases[i].key) == 0;
		ck_assert_msg(r == listed, "%s: reloadable %d", cases[i].key, r);
		nreload += r;
	}
	ck_assert_uint_eq(nreload, sizeof(want) / sizeof(want[0]));
	/* every key changed; applying keeps the start-only ones as they run */
	config_init(&running);
	config_init(&fresh);
	for (size_t i = 0; i < NCASES; i++)
		tcfg_set_ok(&fresh, cases[i].key, cases[i].good);
	config_apply_reloadable(&running, &fresh);
	config_diff(&running, &fresh, on_diff, &d);
	ck_assert_uint_eq(d.n, NCASES - nreload);
	for (size_t i = 0; i < d.n; i++)
		ck_assert_msg(!d.reloadable[i], "%s still differs", d.keys[i]);
	ck_assert_str_eq(tcfg_shown(&running, "log_level"), "\"debug\"");
	ck_assert_str_eq(tcfg_shown(&running, "role"), "\"node\"");
	config_fini(&running);
	config_fini(&fresh);
	/* no difference, no call */
	d.n = 0;
	config_init(&running);
	config_init(&fresh);
	config_diff(&running, &fresh, on_diff, &d);
	ck_assert_uint_eq(d.n, 0);
	config_fini(&running);
	config_fini(&fresh);
}
END_TEST

/* Split s at ", " into at most max trimmed parts (s is changed). */
static size_t
split(char *s, char **parts, size_t max)
{
	size_t n = 0;

	while (n < max) {
		char *e = strstr(s, ", ");

		parts[n++] = s;
		if (e == NULL)
			break;
		*e = '\0';
		s = e + 2;
	}
	return n;
}

/* Trim blanks and backquotes at both ends, in place. */
static char *
trim(char *s)
{
	size_t n;

	while (*s == ' ' || *s == '`')
		s++;
	n = strlen(s);
	while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '`'))
		s[--n] = '\0';
	return s;
}

/* docs/control-plane.md's configuration table: every key of the table once,
 * with config_init's default and config_diff's reloadable flag. */
START_TEST(docs_table)
{
	const char *path = "docs/control-plane.md";
	char *text, *line, *save = NULL;
	size_t len, seen[NCASES] = {0};
	bool in_table = false;
	refit_err_t e;
	refitd_config_t c;
	cJSON *def;

	refit_err_clear(&e);
	ck_assert_msg(codec_read_file(path, &text, &len, &e) == REFIT_OK, "%s (run the unit "
		      "tests from the repository root)", e.msg);
	config_init(&c);
	def = tcfg_dump_json(&c);
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *cell[5], *keys[8], *defs[8];
		size_t nc = 0, nk, nd;

		if (strncmp(line, "| key | default | reloadable |", 30) == 0) {
			in_table = true;
			continue;
		}
		if (!in_table || strncmp(line, "|---", 4) == 0)
			continue;
		if (line[0] != '|')
			break;
		/* | keys | defaults | yes/no | meaning | */
		for (char *p = line + 1; nc < 4 && (p = strchr(cell[nc] = p, '|')) != NULL; p++) {
			*p = '\0';
			cell[nc] = trim(cell[nc]);
			nc++;
		}
		ck_assert_msg(nc == 4, "docs table row without 4 cells: %s", line);
		nk = split(cell[0], keys, 8);
		nd = strcmp(cell[1], "-") == 0 ? 0 : split(cell[1], defs, 8);
		for (size_t i = 0; i < nk; i++) {
			const char *key = trim(keys[i]);
			const kcase_t *k = case_of(key);
			const cJSON *v = cJSON_GetObjectItemCaseSensitive(def, key);
			const char *doc = i < nd ? trim(defs[i]) : "-";

			ck_assert_msg(k != NULL && v != NULL, "docs name config key \"%s\"; the "
				      "table has none", key);
			ck_assert_msg(seen[k - cases]++ == 0, "docs list \"%s\" twice", key);
			ck_assert_msg(strcmp(cell[2], reloadable(k) ? "yes" : "no") == 0,
				      "docs: %s reloadable \"%s\"", key, cell[2]);
			if (cJSON_IsNumber(v)) {
				uint64_t n = 0;

				refit_err_clear(&e);
				ck_assert_msg(refit_parse_size(doc, &n, key, &e) == REFIT_OK &&
					      n == (uint64_t)v->valuedouble, "docs: %s default "
					      "\"%s\", the table's is %.0f", key, doc, v->valuedouble);
			} else if (cJSON_IsString(v)) {
				ck_assert_msg(strcmp(doc, v->valuestring) == 0, "docs: %s default "
					      "\"%s\", the table's is \"%s\"", key, doc,
					      v->valuestring);
			} else {
				/* unset: "-", or what the daemon uses then (hostname, listen, ...) */
				ck_assert_msg(cJSON_IsNull(v) && doc[0] != '\0', "docs: %s", key);
			}
		}
	}
	ck_assert_msg(in_table, "%s has no configuration table", path);
	for (size_t i = 0; i < NCASES; i++)
		ck_assert_msg(seen[i] == 1, "config key \"%s\" is missing from %s's table",
			      cases[i].key, path);
	cJSON_Delete(def);
	config_fini(&c);
	free(text);
}
END_TEST

/* The example configurations load and pass the checks; a file's errors
 * name the file. */
START_TEST(files)
{
	static const char *const examples[] = {"config/coordinator.json", "config/node.json"};
	char path[64];
	refitd_config_t c;
	refit_err_t e;
	FILE *f;

	for (size_t i = 0; i < sizeof(examples) / sizeof(examples[0]); i++) {
		config_init(&c);
		refit_err_clear(&e);
		ck_assert_msg(config_load(&c, examples[i], &e) == REFIT_OK, "%s", e.msg);
		tcfg_check_ok(&c);
		config_fini(&c);
	}
	config_init(&c);
	snprintf(path, sizeof(path), "/tmp/refit-unit-config-%d.json", (int)getpid());
	refit_err_clear(&e);
	ck_assert_int_ne(config_load(&c, path, &e), REFIT_OK);
	tcfg_names(e.msg, path, NULL);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"role\": \"coordinator\",\n \"lease_ttl_ms\": 99}\n", f);
	ck_assert_int_eq(fclose(f), 0);
	refit_err_clear(&e);
	ck_assert_int_ne(config_load(&c, path, &e), REFIT_OK);
	unlink(path);
	tcfg_names(e.msg, path, NULL);
	tcfg_names(e.msg, "lease_ttl_ms", "99");
	ck_assert_str_eq(tcfg_shown(&c, "role"), "\"node\"");
	config_fini(&c);
}
END_TEST

START_TEST(dump_round_trip)
{
	refitd_config_t a, b;
	char *x, *y;
	cJSON *root;
	const cJSON *it;

	/* every set value survives a dump read back as a file (nulls left out) */
	config_init(&a);
	for (size_t i = 0; i < NCASES; i++)
		tcfg_set_ok(&a, cases[i].key, cases[i].good);
	tcfg_set_ok(&a, "node_id", "quote\"and\\slash");
	root = tcfg_dump_json(&a);
	cJSON_ArrayForEach(it, root)
		ck_assert_msg(!cJSON_IsNull(it), "%s is unset", it->string);
	x = cJSON_PrintUnformatted(root);
	config_init(&b);
	tcfg_parse_ok(&b, x);
	free(x);
	x = tcfg_dump_text(&a);
	y = tcfg_dump_text(&b);
	ck_assert_str_eq(x, y);
	free(x);
	free(y);
	cJSON_Delete(root);
	config_fini(&a);
	config_fini(&b);
}
END_TEST

/* --help: every key as its flag, with its default and whether reloadable. */
START_TEST(help_lists_every_key)
{
	refitd_config_t c;
	strbuf_t sb;
	cJSON *def;
	const cJSON *it;

	config_init(&c);
	def = tcfg_dump_json(&c);
	strbuf_init(&sb);
	config_help(&sb);
	cJSON_ArrayForEach(it, def) {
		char flag[64], *line, *end;
		const kcase_t *k = case_of(it->string);

		snprintf(flag, sizeof(flag), "  --%s ", it->string);
		for (char *p = flag + 4; *p; p++)
			*p = *p == '_' ? '-' : *p;
		line = strstr(sb.s, flag);
		ck_assert_msg(line != NULL, "--help has no %s", flag);
		/* the flag's two lines */
		end = strchr(line, '\n');
		ck_assert_ptr_nonnull(end);
		end = strchr(end + 1, '\n');
		ck_assert_ptr_nonnull(end);
		*end = '\0';
		ck_assert_msg((strstr(line, "reloadable") != NULL) == reloadable(k),
			      "--help: %s", line);
		if (cJSON_IsString(it)) {
			char want[128];

			snprintf(want, sizeof(want), "default %s", it->valuestring);
			ck_assert_msg(strstr(line, want) != NULL, "--help: %s", line);
		}
		*end = '\n';
	}
	ck_assert_str_eq(tcfg_shown(&c, "role"), "\"node\"");
	strbuf_fini(&sb);
	cJSON_Delete(def);
	config_fini(&c);
}
END_TEST

Suite *
suite_config(void)
{
	TCase *keys = th_tcase("config keys", 0, TH_TESTS(keys_all_cased));

	tcase_add_loop_test(keys, key_values, 0, NCASES);
	return th_suite("config", keys,
			th_tcase("config", 0, TH_TESTS(reload, docs_table, files, dump_round_trip,
				 help_lists_every_key)),
			NULL);
}
