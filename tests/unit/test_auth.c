/*
 * test_auth.c - who may call what (rpc/rpc_auth.c): every method of the
 * protos refitd serves has a row in the authorization table and every row
 * names a method (the protos are parsed here, so a method added to proto/
 * without a row fails this test); the constant-time comparison; the
 * refusal log's once-a-minute-per-host limiter; and the configuration's
 * secure default (daemon/config.c: beyond loopback only with a join token,
 * mutual TLS or "insecure": true).
 */
#include <string.h>

#include "codec/json.h"
#include "daemon/config.h"
#include "rpc/rpc_auth.h"
#include "tests/unit/helpers.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* the protos of the services refitd serves (run from the repository root) */
static const char *const protos[] = {
	"proto/refit/v1/refit.proto",
	"proto/grpc/health/v1/health.proto",
};

typedef struct pmethod {
	char service[96], method[64];
} pmethod_t;

/* The word at p (letters, digits, '_', '.') into out. */
static const char *
word(const char *p, char *out, size_t cap)
{
	size_t n = 0;

	while (*p == ' ' || *p == '\t')
		p++;
	while ((*p == '_' || *p == '.' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		(*p >= '0' && *p <= '9')) && n + 1 < cap)
		out[n++] = *p++;
	out[n] = '\0';
	return p;
}

/* Every "rpc M(" of every "service S {" of path, as package.S and M. */
static size_t
proto_methods(const char *path, pmethod_t *out, size_t cap)
{
	char *text, *line, *save = NULL, pkg[64] = "", svc[64] = "";
	size_t len, n = 0;
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_msg(codec_read_file(path, &text, &len, &e) == REFIT_OK, "%s (run the unit "
		      "tests from the repository root)", e.msg);
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		const char *p = line;
		char kw[32];

		p = word(p, kw, sizeof(kw));
		if (strcmp(kw, "package") == 0) {
			word(p, pkg, sizeof(pkg));
		} else if (strcmp(kw, "service") == 0) {
			word(p, svc, sizeof(svc));
		} else if (strcmp(kw, "rpc") == 0) {
			ck_assert_msg(svc[0] != '\0' && n < cap, "%s: rpc outside a service: %s",
				      path, line);
			snprintf(out[n].service, sizeof(out[n].service), "%s.%s", pkg, svc);
			word(p, out[n].method, sizeof(out[n].method));
			n++;
		}
	}
	free(text);
	return n;
}

START_TEST(every_method_has_a_row)
{
	pmethod_t ms[128];
	size_t n = 0, used[128] = {0};

	for (size_t i = 0; i < NELEM(protos); i++)
		n += proto_methods(protos[i], ms + n, NELEM(ms) - n);
	ck_assert_uint_ge(n, 30); /* the parser found the services */
	for (size_t i = 0; i < n; i++) {
		const rpc_auth_row_t *r = rpc_auth_find(ms[i].service, ms[i].method);

		ck_assert_msg(r != NULL, "%s.%s has no row in the authorization table "
			      "(rpc/rpc_auth.c)", ms[i].service, ms[i].method);
		used[r - rpc_auth_table]++;
	}
	for (size_t k = 0; k < rpc_auth_nrows; k++)
		ck_assert_msg(used[k] == 1, "row %s.%s names %s", rpc_auth_table[k].service,
			      rpc_auth_table[k].method, used[k] ? "a method twice" :
			      "no method of the protos");
}
END_TEST

/* The credentials the issue names, held to the table. */
START_TEST(table_says)
{
	static const struct {
		const char *svc, *m;
		rpc_cred_t need;
	} rows[] = {
		{"refit.v1.Coordinator", "Join", RPC_CRED_JOIN},
		{"refit.v1.Coordinator", "Heartbeat", RPC_CRED_MEMBER},
		{"refit.v1.Coordinator", "RegisterLayout", RPC_CRED_MEMBER},
		{"refit.v1.Coordinator", "UnregisterLayout", RPC_CRED_MEMBER},
		{"refit.v1.Coordinator", "WeightsReady", RPC_CRED_MEMBER},
		{"refit.v1.Coordinator", "SliceDone", RPC_CRED_MEMBER},
		{"refit.v1.Coordinator", "TriggerRefit", RPC_CRED_OPERATOR},
		{"refit.v1.Node", "PrepareEpoch", RPC_CRED_MEMBER},
		{"refit.v1.Node", "RunSlice", RPC_CRED_MEMBER},
		{"refit.v1.Node", "Publish", RPC_CRED_MEMBER},
		{"refit.v1.Local", "Hello", RPC_CRED_NONE},
		{"grpc.health.v1.Health", "Check", RPC_CRED_NONE},
	};

	for (size_t i = 0; i < NELEM(rows); i++) {
		const rpc_auth_row_t *r = rpc_auth_find(rows[i].svc, rows[i].m);

		ck_assert_ptr_nonnull(r);
		ck_assert_msg(r->need == rows[i].need, "%s.%s needs %s", rows[i].svc, rows[i].m,
			      rpc_cred_name(r->need));
	}
	ck_assert_ptr_null(rpc_auth_find("refit.v1.Node", "Join"));
	/* the operator token opens one member method (refitctl unregister) */
	for (size_t k = 0; k < rpc_auth_nrows; k++)
		ck_assert_msg(rpc_auth_table[k].or_operator ==
			      (strcmp(rpc_auth_table[k].method, "UnregisterLayout") == 0),
			      "%s.%s or_operator", rpc_auth_table[k].service,
			      rpc_auth_table[k].method);
	ck_assert_str_eq(rpc_cred_name(RPC_CRED_MEMBER), "member");
}
END_TEST

START_TEST(constant_time_eq)
{
	ck_assert(rpc_auth_eq("abc", 3, "abc"));
	ck_assert(!rpc_auth_eq("abd", 3, "abc"));
	ck_assert(!rpc_auth_eq("ab", 2, "abc"));        /* a prefix */
	ck_assert(!rpc_auth_eq("abcd", 4, "abc"));      /* longer */
	ck_assert(!rpc_auth_eq("abc\0", 4, "abc"));     /* a NUL after */
	ck_assert(!rpc_auth_eq(NULL, 0, "abc"));
	ck_assert(!rpc_auth_eq("", 0, "abc"));
	ck_assert(rpc_auth_eq("", 0, ""));
}
END_TEST

START_TEST(refusals_once_a_minute)
{
	rpc_refusals_t r;
	uint64_t quiet = 99, t = 1000, min = RPC_REFUSE_LOG_NS;

	rpc_refusals_init(&r);
	ck_assert(rpc_refusals_note(&r, "ipv4:10.0.0.9", t, &quiet));
	ck_assert_uint_eq(quiet, 0);
	for (int i = 0; i < 1000; i++)
		ck_assert(!rpc_refusals_note(&r, "ipv4:10.0.0.9", t + (uint64_t)i, &quiet));
	/* another host is logged at once */
	ck_assert(rpc_refusals_note(&r, "ipv4:10.0.0.8", t, &quiet));
	ck_assert(!rpc_refusals_note(&r, "ipv4:10.0.0.9", t + min - 1, &quiet));
	/* a minute on: logged, with the ones not logged */
	ck_assert(rpc_refusals_note(&r, "ipv4:10.0.0.9", t + min, &quiet));
	ck_assert_uint_eq(quiet, 1001);
	ck_assert(!rpc_refusals_note(&r, "ipv4:10.0.0.9", t + min + 1, &quiet));
	/* many hosts: the table stays bounded, the newest are remembered */
	for (int i = 0; i < 3 * RPC_REFUSE_HOSTS; i++) {
		char h[32];

		snprintf(h, sizeof(h), "ipv4:10.1.%d.%d", i / 256, i % 256);
		ck_assert(rpc_refusals_note(&r, h, t + min + 2 + (uint64_t)i, &quiet));
		ck_assert(!rpc_refusals_note(&r, h, t + min + 2 + (uint64_t)i, &quiet));
	}
	rpc_refusals_fini(&r);
}
END_TEST

START_TEST(loopback_addresses)
{
	static const struct {
		const char *addr;
		bool loop;
	} rows[] = {
		{"127.0.0.1:7070", true}, {"127.0.0.2:1", true}, {"localhost:7070", true},
		{"[::1]:7070", true}, {"unix:/run/refit/coord.sock", true},
		{"0.0.0.0:7070", false}, {"10.0.0.1:7070", false}, {"[::]:7070", false},
		{"coordinator.example:7070", false}, {"127.example:7070", true},
		{"1270.0.0.1:1", false}, {"localhostx:1", false},
	};

	for (size_t i = 0; i < NELEM(rows); i++)
		ck_assert_msg(config_is_loopback(rows[i].addr) == rows[i].loop, "%s",
			      rows[i].addr);
}
END_TEST

/* A coordinator on 0.0.0.0 with the keys of each row set: refused or not. */
START_TEST(secure_by_default)
{
	static const struct {
		const char *json;
		bool ok;
	} rows[] = {
		{"{}", false},
		{"{\"listen\": \"127.0.0.1:7070\"}", true},
		{"{\"listen\": \"unix:/tmp/c.sock\"}", true},
		{"{\"join_token_file\": \"/etc/refit/join.token\"}", true},
		{"{\"insecure\": true}", true},
		{"{\"insecure\": \"true\"}", true},
		{"{\"insecure\": false}", false},
		{"{\"token_file\": \"/etc/refit/operator.token\"}", false}, /* not a node's */
		{"{\"tls_cert\": \"c\", \"tls_key\": \"k\"}", false},  /* TLS, nodes anonymous */
		{"{\"tls_cert\": \"c\", \"tls_key\": \"k\", \"tls_client_ca\": \"ca\"}", true},
		/* the cluster CA verifies the callers too: mutual TLS */
		{"{\"tls_cert\": \"c\", \"tls_key\": \"k\", \"tls_ca\": \"ca\"}", true},
		{"{\"tls_ca\": \"ca\"}", false},  /* verifies, presents nothing */
	};

	for (size_t i = 0; i < NELEM(rows); i++) {
		refitd_config_t c;
		refit_err_t e;
		refit_status_t rc;

		config_init(&c);
		refit_err_clear(&e);
		ck_assert_int_eq(config_set(&c, "role", "coordinator", &e), REFIT_OK);
		ck_assert_int_eq(config_set(&c, "listen", "0.0.0.0:7070", &e), REFIT_OK);
		ck_assert_msg(config_parse(&c, rows[i].json, strlen(rows[i].json), &e) == REFIT_OK,
			      "%s: %s", rows[i].json, e.msg);
		rc = config_check(&c, &e);
		ck_assert_msg((rc == REFIT_OK) == rows[i].ok, "%s: %s", rows[i].json,
			      rc == REFIT_OK ? "passed" : e.msg);
		if (!rows[i].ok)
			ck_assert_msg(strstr(e.msg, "listen \"0.0.0.0:7070\"") &&
				      strstr(e.msg, "join_token_file") &&
				      strstr(e.msg, "\"insecure\": true"), "%s", e.msg);
		config_fini(&c);
	}
}
END_TEST

Suite *
suite_auth(void)
{
	return th_suite("auth", th_tcase("auth", 0, TH_TESTS(every_method_has_a_row, table_says,
							   constant_time_eq,
							   refusals_once_a_minute,
							   loopback_addresses,
							   secure_by_default)),
			NULL);
}
