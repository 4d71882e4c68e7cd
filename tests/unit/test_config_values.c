/*
 * test_config_values.c - what daemon/config.c refuses beyond one key's own
 * values (those are test_config.c's, a case per key): unknown and repeated
 * keys, whole JSON documents (one object, all of it or nothing), sizes
 * with their units and durations, the cross-key, etcd and per-role checks
 * of config_check, and ranks lists.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"
#include "tests/unit/config_helpers.h"
#include "tests/unit/helpers.h"


START_TEST(unknown_keys)
{
	refitd_config_t c;
	const char *m;

	config_init(&c);
	m = tcfg_set_refused(&c, "lease_ttl", "5000");
	tcfg_names(m, "unknown key \"lease_ttl\"", NULL);
	tcfg_names(m, "did you mean \"lease_ttl_ms\"", NULL);
	m = tcfg_set_refused(&c, "zzz", "1");
	tcfg_names(m, "unknown key \"zzz\"", NULL);
	ck_assert_msg(strstr(m, "did you mean") == NULL, "%s", m);
	/* the flag spelling is main.c's to translate, not a key */
	tcfg_names(tcfg_set_refused(&c, "lease-ttl-ms", "5000"), "lease-ttl-ms", NULL);
	/* keys are case-sensitive */
	tcfg_names(tcfg_set_refused(&c, "Role", "node"), "Role", NULL);
	/* in a file: named, and the keys before it are not applied */
	tcfg_names(tcfg_parse_refused(&c, "{\"role\": \"coordinator\", \"stagingbytes\": \"1M\"}"),
	      "unknown key \"stagingbytes\"", NULL);
	ck_assert_str_eq(tcfg_shown(&c, "role"), "\"node\"");
	config_fini(&c);
}
END_TEST

START_TEST(duplicate_keys)
{
	refitd_config_t c;

	config_init(&c);
	tcfg_names(tcfg_parse_refused(&c, "{\"heartbeat_ms\": 1000, \"lease_ttl_ms\": 5000, "
			    "\"heartbeat_ms\": 1000}"),
	      "\"heartbeat_ms\" appears twice", NULL);
	/* also when the two values differ, and for a key the table lacks */
	tcfg_names(tcfg_parse_refused(&c, "{\"role\": \"node\", \"role\": \"coordinator\"}"), "role", NULL);
	tcfg_names(tcfg_parse_refused(&c, "{\"nosuch\": 1, \"nosuch\": 1}"), "nosuch", NULL);
	ck_assert_str_eq(tcfg_shown(&c, "lease_ttl_ms"), "10000");
	config_fini(&c);
}
END_TEST

/* Whole documents: only one JSON object, and all of it or nothing. */
START_TEST(documents)
{
	static const char *const not_objects[] = {
		"", " ", "[]", "1", "\"role\"", "null", "{", "{\"role\":", "{\"role\" \"node\"}",
		"{} {}", "{} x", "{\"role\": \"coordinator\"} trailing", "{}]",
	};
	refitd_config_t c;

	config_init(&c);
	for (size_t i = 0; i < sizeof(not_objects) / sizeof(not_objects[0]); i++)
		tcfg_parse_refused(&c, not_objects[i]);
	/* the length given is the document: text after it is not read */
	{
		const char *text = "{\"log_level\": \"warn\"} ignored";
		refit_err_t e;

		refit_err_clear(&e);
		ck_assert_int_eq(config_parse(&c, text, 21, &e), REFIT_OK);
		ck_assert_str_eq(tcfg_shown(&c, "log_level"), "\"warn\"");
	}
	tcfg_parse_ok(&c, "{}");
	tcfg_parse_ok(&c, "\n  {\"role\": \"coordinator\"}\n\n");
	ck_assert_str_eq(tcfg_shown(&c, "role"), "\"coordinator\"");
	/* a later document changes only its own keys */
	tcfg_parse_ok(&c, "{\"lease_ttl_ms\": 5000}");
	ck_assert_str_eq(tcfg_shown(&c, "role"), "\"coordinator\"");
	ck_assert_str_eq(tcfg_shown(&c, "lease_ttl_ms"), "5000");
	/* a bad key late in a document undoes none of it: nothing applied */
	tcfg_names(tcfg_parse_refused(&c, "{\"lease_ttl_ms\": 7000, \"node_id\": \"n1\", "
			    "\"heartbeat_ms\": \"fast\"}"), "heartbeat_ms", "fast");
	ck_assert_str_eq(tcfg_shown(&c, "lease_ttl_ms"), "5000");
	ck_assert_str_eq(tcfg_shown(&c, "node_id"), "null");
	/* an empty string unsets a key without a default */
	tcfg_parse_ok(&c, "{\"state_file\": \"/tmp/s\"}");
	tcfg_parse_ok(&c, "{\"state_file\": \"\"}");
	ck_assert_str_eq(tcfg_shown(&c, "state_file"), "null");
	config_fini(&c);
}
END_TEST

/* Sizes: a number of bytes with an optional binary unit, case-insensitive. */
START_TEST(size_suffixes)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} good[] = {
		{"4096", 4096}, {"4096B", 4096}, {"4K", 4096}, {"4KB", 4096}, {"4KiB", 4096},
		{"4k", 4096}, {"4kib", 4096}, {"1M", 1 << 20}, {"1MB", 1 << 20},
		{"1MiB", 1 << 20}, {"3mib", 3 << 20}, {"1G", 1 << 30}, {"1GB", 1 << 30},
		{"1GiB", 1 << 30}, {"1T", TIB}, {"1TB", TIB}, {"1TiB", TIB},
		{"1099511627776", TIB},
	};
	static const char *const bad[] = {
		"1.5G", "1 GiB", " 1M", "1M ", "G", "-1M", "+1M", "1PiB", "1Mi", "1Gb/s",
		"0x100000", "1e6", "18446744073709551615K", "99999999999999999999",
	};
	refitd_config_t c;
	char want[32];

	config_init(&c);
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		/* plan_cache_bytes: 0 to 1 TiB, so every unit fits */
		tcfg_set_ok(&c, "plan_cache_bytes", good[i].text);
		snprintf(want, sizeof(want), "%" PRIu64, good[i].bytes);
		ck_assert_msg(strcmp(tcfg_shown(&c, "plan_cache_bytes"), want) == 0, "%s: %s, not %s",
			      good[i].text, tcfg_shown(&c, "plan_cache_bytes"), want);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		tcfg_names(tcfg_set_refused(&c, "plan_cache_bytes", bad[i]), "plan_cache_bytes", bad[i]);
	/* in bounds in bytes, whatever the unit: the text given is quoted */
	tcfg_names(tcfg_set_refused(&c, "staging_bytes", "2T"), "staging_bytes", "2T");
	tcfg_names(tcfg_set_refused(&c, "staging_bytes", "1023K"), "staging_bytes", "1023K");
	tcfg_set_ok(&c, "staging_bytes", "1024K");
	ck_assert_str_eq(tcfg_shown(&c, "staging_bytes"), "1048576");
	tcfg_names(tcfg_set_refused(&c, "max_msg_bytes", "2GiB"), "max_msg_bytes", "2GiB");
	tcfg_names(tcfg_set_refused(&c, "max_msg_bytes", "4095"), "max_msg_bytes", "4095");
	tcfg_set_ok(&c, "max_msg_bytes", "4K");
	/* a JSON number is bytes */
	tcfg_parse_ok(&c, "{\"max_msg_bytes\": 65536}");
	ck_assert_str_eq(tcfg_shown(&c, "max_msg_bytes"), "65536");
	config_fini(&c);
}
END_TEST

/* Durations are whole milliseconds: no units, no signs, no blanks. */
START_TEST(durations)
{
	static const char *const bad[] = {
		"5s", "5ms", "1e3", "+5000", "-0", " 5000", "5000 ", "5000.0", "0x1000", "",
		"18446744073709551616",
	};
	refitd_config_t c;

	config_init(&c);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		tcfg_names(tcfg_set_refused(&c, "lease_ttl_ms", bad[i]), "lease_ttl_ms", bad[i]);
	tcfg_set_ok(&c, "lease_ttl_ms", "05000");
	ck_assert_str_eq(tcfg_shown(&c, "lease_ttl_ms"), "5000");
	/* a JSON number that is whole, even written with an exponent */
	tcfg_parse_ok(&c, "{\"lease_ttl_ms\": 6e3}");
	ck_assert_str_eq(tcfg_shown(&c, "lease_ttl_ms"), "6000");
	tcfg_names(tcfg_parse_refused(&c, "{\"lease_ttl_ms\": 6000.5}"), "lease_ttl_ms", NULL);
	config_fini(&c);
}
END_TEST

/* Checks across keys, in either role. */
START_TEST(cross_checks)
{
	refitd_config_t c;
	const char *m;

	for (int role = 0; role < 2; role++) {
		if (role == 0)
			tcfg_coordinator_config(&c);
		else
			tcfg_node_config(&c);
		/* heartbeat shorter than the lease */
		tcfg_set_ok(&c, "lease_ttl_ms", "2000");
		m = tcfg_check_refused(&c);
		tcfg_names(m, "heartbeat_ms", "2000");
		tcfg_names(m, "lease_ttl_ms", NULL);
		tcfg_set_ok(&c, "lease_ttl_ms", "2001");
		tcfg_check_ok(&c);
		/* staging holds at least one 4 MiB chunk: the table lets 1 MiB in */
		tcfg_set_ok(&c, "staging_bytes", "4194303");
		tcfg_names(tcfg_check_refused(&c), "staging_bytes", "4194303");
		tcfg_set_ok(&c, "staging_bytes", "4MiB");
		tcfg_check_ok(&c);
		/* TLS: certificate and key together; a client CA needs both */
		tcfg_set_ok(&c, "tls_cert", "/c.pem");
		tcfg_names(tcfg_check_refused(&c), "tls_key", NULL);
		tcfg_set_ok(&c, "tls_key", "/k.pem");
		tcfg_check_ok(&c);
		tcfg_set_ok(&c, "tls_cert", "");
		tcfg_names(tcfg_check_refused(&c), "tls_cert", NULL);
		tcfg_set_ok(&c, "tls_key", "");
		tcfg_set_ok(&c, "tls_client_ca", "/ca.pem");
		tcfg_names(tcfg_check_refused(&c), "tls_client_ca", NULL);
		tcfg_set_ok(&c, "tls_cert", "/c.pem");
		tcfg_set_ok(&c, "tls_key", "/k.pem");
		tcfg_check_ok(&c);
		config_fini(&c);
	}
}
END_TEST

/* state_store etcd: endpoints, each host:port; a prefix /x; no state_file. */
START_TEST(etcd_checks)
{
	refitd_config_t c;

	tcfg_coordinator_config(&c);
	tcfg_set_ok(&c, "state_store", "etcd");
	tcfg_names(tcfg_check_refused(&c), "etcd_endpoints", NULL);
	tcfg_set_ok(&c, "etcd_endpoints", "127.0.0.1:2379,etcd-2");
	tcfg_names(tcfg_check_refused(&c), "etcd_endpoints", "etcd-2");
	tcfg_set_ok(&c, "etcd_endpoints", "unix:/run/etcd.sock");
	tcfg_names(tcfg_check_refused(&c), "etcd_endpoints", "unix:/run/etcd.sock");
	tcfg_set_ok(&c, "etcd_endpoints", "127.0.0.1:2379,etcd-2:2379");
	tcfg_check_ok(&c);
	tcfg_set_ok(&c, "etcd_prefix", "refit");
	tcfg_names(tcfg_check_refused(&c), "etcd_prefix", "refit");
	tcfg_set_ok(&c, "etcd_prefix", "/refit/");
	tcfg_names(tcfg_check_refused(&c), "etcd_prefix", "/refit/");
	tcfg_set_ok(&c, "etcd_prefix", "/refit/a");
	tcfg_check_ok(&c);
	/* TLS to etcd: the CA alone (no client certificate) is enough; a client
	 * certificate needs its key and the CA, a key its certificate */
	tcfg_set_ok(&c, "etcd_tls_ca", "/etc/refit/etcd-ca.crt");
	tcfg_check_ok(&c);
	tcfg_set_ok(&c, "etcd_tls_key", "/etc/refit/etcd.key");
	tcfg_names(tcfg_check_refused(&c), "etcd_tls_key without etcd_tls_cert", NULL);
	tcfg_set_ok(&c, "etcd_tls_key", "");
	tcfg_set_ok(&c, "etcd_tls_cert", "/etc/refit/etcd.crt");
	tcfg_names(tcfg_check_refused(&c), "etcd_tls_cert without etcd_tls_key", NULL);
	tcfg_set_ok(&c, "etcd_tls_key", "/etc/refit/etcd.key");
	tcfg_check_ok(&c);
	tcfg_set_ok(&c, "etcd_tls_ca", "");
	tcfg_names(tcfg_check_refused(&c), "etcd_tls_cert needs etcd_tls_ca", NULL);
	tcfg_set_ok(&c, "etcd_tls_ca", "/etc/refit/etcd-ca.crt");
	tcfg_check_ok(&c);
	tcfg_set_ok(&c, "state_file", "/var/lib/refit/state");
	tcfg_names(tcfg_check_refused(&c), "state_file", NULL);
	/* the state file alone: the etcd keys are not looked at */
	tcfg_set_ok(&c, "state_store", "file");
	tcfg_set_ok(&c, "etcd_endpoints", "");
	tcfg_check_ok(&c);
	config_fini(&c);
	/* a node: several coordinators, each host:port */
	tcfg_node_config(&c);
	tcfg_set_ok(&c, "coordinator", "127.0.0.1:7070,127.0.0.1:7071");
	tcfg_check_ok(&c);
	tcfg_set_ok(&c, "coordinator", "127.0.0.1:7070,nowhere");
	tcfg_names(tcfg_check_refused(&c), "coordinator", "nowhere");
	tcfg_set_ok(&c, "coordinator", ",");
	tcfg_names(tcfg_check_refused(&c), "coordinator", NULL);
	config_fini(&c);
}
END_TEST

/* What config_check asks of a node and not of a coordinator. */
START_TEST(role_checks)
{
	static const struct {
		const char *key, *value;
	} node_only[] = {
		{"ranks", "0-3,3"},      {"coordinator", "host:0"}, {"advertise", "nope"},
		{"data_listen", "x:"},   {"data_advertise", ":1"},  {"gpu_devices", "0"},
	};
	static const struct {
		const char *key, *value;
		bool ok;
	} ports[] = {
		{"listen", "127.0.0.1:0", true},     {"listen", "unix:/tmp/r.sock", true},
		{"listen", "[::1]:7070", true},      {"listen", "host:65535", true},
		{"listen", "host:65536", false},     {"listen", "host:", false},
		{"listen", ":7070", false},          {"listen", "7070", false},
		{"listen", "host:007070", false},    {"listen", "host:+80", false},
		{"coordinator", "c:1", true},        {"coordinator", "c:0", false},
		{"advertise", "n:0", false},         {"advertise", "unix:/r.sock", true},
		{"data_listen", "0.0.0.0:0", true},  {"data_advertise", "n:0", false},
		{"metrics_listen", "127.0.0.1:0", true}, {"metrics_listen", "[::]:9100", true},
		{"metrics_listen", "9100", false},   {"metrics_listen", "unix:/m.sock", false},
	};
	refitd_config_t c;

	/* a node needs ranks; a coordinator neither needs nor reads them */
	config_init(&c);
	tcfg_names(tcfg_check_refused(&c), "ranks", NULL);
	tcfg_set_ok(&c, "role", "coordinator");
	tcfg_check_ok(&c);
	for (size_t i = 0; i < sizeof(node_only) / sizeof(node_only[0]); i++)
		tcfg_set_ok(&c, node_only[i].key, node_only[i].value);
	tcfg_check_ok(&c);
	config_fini(&c);
	for (size_t i = 0; i < sizeof(node_only) / sizeof(node_only[0]); i++) {
		tcfg_node_config(&c);
		tcfg_set_ok(&c, node_only[i].key, node_only[i].value);
		tcfg_names(tcfg_check_refused(&c), node_only[i].key, node_only[i].value);
		config_fini(&c);
	}
	/* addresses: port 0 only where the daemon binds (the syntax; beyond
	 * loopback needs a join token or "insecure", test_auth.c) */
	for (size_t i = 0; i < sizeof(ports) / sizeof(ports[0]); i++) {
		tcfg_node_config(&c);
		tcfg_set_ok(&c, "insecure", "true");
		tcfg_set_ok(&c, ports[i].key, ports[i].value);
		if (ports[i].ok)
			tcfg_check_ok(&c);
		else
			tcfg_names(tcfg_check_refused(&c), ports[i].key, ports[i].value);
		config_fini(&c);
	}
	/* gpu_devices: one per rank, in rank order, each once */
	tcfg_node_config(&c);
	tcfg_set_ok(&c, "gpu_devices", "3,2,1,0");
	tcfg_check_ok(&c);
	tcfg_set_ok(&c, "gpu_devices", "0,0,1,2");
	tcfg_names(tcfg_check_refused(&c), "gpu_devices", "0,0,1,2");
	tcfg_set_ok(&c, "gpu_devices", "0-4");
	tcfg_names(tcfg_check_refused(&c), "gpu_devices", "0-4");
	config_fini(&c);
}
END_TEST

START_TEST(ranks_lists)
{
	static const struct {
		const char *spec;
		int32_t want[8];
		size_t n;
	} good[] = {
		{"0", {0}, 1},
		{"0-3,8", {0, 1, 2, 3, 8}, 5},
		{"8,0-3", {8, 0, 1, 2, 3}, 5},
		{"5-5", {5}, 1},
		{"16777215", {16777215}, 1},
		{"1,3,5", {1, 3, 5}, 3},
	};
	static const char *const bad[] = {
		"-1", "3-1", "0-3,2", "1,1", "0,,1", "0-3,", ",0", "a", "0-", "1-2-3", " 1",
		"+1", "0-+3", "0- 3", "1 ", "16777216", "0-65537", "0x3", "1;2",
	};
	int32_t *r;
	size_t n;
	refit_err_t e;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		refit_err_clear(&e);
		ck_assert_msg(config_parse_ranks(good[i].spec, &r, &n, &e) == REFIT_OK, "%s: %s",
			      good[i].spec, e.msg);
		ck_assert_uint_eq(n, good[i].n);
		for (size_t j = 0; j < n; j++)
			ck_assert_int_eq(r[j], good[i].want[j]);
		free(r);
	}
	refit_err_clear(&e);
	ck_assert_int_eq(config_parse_ranks("0-65535", &r, &n, &e), REFIT_OK);
	ck_assert_uint_eq(n, 65536);
	free(r);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		refit_err_clear(&e);
		ck_assert_msg(config_parse_ranks(bad[i], &r, &n, &e) != REFIT_OK, "\"%s\" was taken",
			      bad[i]);
		ck_assert_ptr_null(r);
		ck_assert_uint_eq(n, 0);
		tcfg_names(e.msg, "ranks", bad[i]);
	}
	refit_err_clear(&e);
	ck_assert_int_ne(config_parse_ranks(NULL, &r, &n, &e), REFIT_OK);
	tcfg_names(e.msg, "ranks", NULL);
	refit_err_clear(&e);
	ck_assert_int_ne(config_parse_ranks("", &r, &n, &e), REFIT_OK);
	tcfg_names(e.msg, "ranks", NULL);
}
END_TEST


Suite *
suite_config_values(void)
{
	return th_suite("config values",
			th_tcase("config values", 0, TH_TESTS(unknown_keys, duplicate_keys,
				 documents, size_suffixes, durations, cross_checks, role_checks,
				 etcd_checks, ranks_lists)),
			NULL);
}
