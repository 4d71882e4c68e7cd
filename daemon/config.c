/*
 * config.c - the configuration table (see config.h).
 */
#include <ctype.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "codec/json.h"
#include "common/alloc.h"
#include "common/parse.h"
#include "daemon/config.h"
#include "plan/plan.h"

typedef enum { K_STR, K_MS, K_SIZE, K_ENUM } ktype_t;

typedef struct key {
	const char *name;
	ktype_t type;
	size_t off;
	const char *def;            /* default, as text; NULL = unset */
	uint64_t lo, hi;            /* numbers */
	const char *choices;        /* enums: "a|b|c" */
	bool reloadable;
	const char *help;
} key_t_;

#define F(field) offsetof(refitd_config_t, field)

static const key_t_ keys[] = {
	{"role", K_ENUM, F(role), "node", 0, 0, "coordinator|node", false,
	 "which role this daemon plays"},
	{"listen", K_STR, F(listen), "127.0.0.1:7070", 0, 0, NULL, false,
	 "gRPC address: host:port or unix:/path"},
	{"coordinator", K_STR, F(coordinator), "127.0.0.1:7070", 0, 0, NULL, false,
	 "node role: the coordinator's address, or several separated by commas "
	 "(coordinators over etcd: the leader is followed; docs/ha.md)"},
	{"tls_cert", K_STR, F(tls_cert), NULL, 0, 0, NULL, false,
	 "PEM certificate: this process's name (refitctl init)"},
	{"tls_key", K_STR, F(tls_key), NULL, 0, 0, NULL, false, "PEM private key"},
	{"tls_client_ca", K_STR, F(tls_client_ca), NULL, 0, 0, NULL, false,
	 "server: CA for client certificates (default: tls_ca)"},
	{"tls_ca", K_STR, F(tls_ca), NULL, 0, 0, NULL, false,
	 "the cluster CA: verifies the peers (with tls_cert: mutual TLS)"},
	{"token_file", K_STR, F(token_file), NULL, 0, 0, NULL, true,
	 "bearer token required for operator methods"},
	{"join_token_file", K_STR, F(join_token_file), NULL, 0, 0, NULL, true,
	 "cluster join token (a secret of its own, not the operator token): the coordinator "
	 "and every node hold the same; every node-coordinator call carries it; SIGHUP "
	 "rereads it; docs/control-plane.md"},
	{"insecure", K_ENUM, F(insecure), "false", 0, 0, "false|true", false,
	 "true: listen beyond loopback without a join token or mutual TLS (anyone reaching "
	 "the port may join; warned at every start)"},
	{"lease_ttl_ms", K_MS, F(lease_ttl_ms), "10000", 100, 3600000, NULL, true,
	 "member lease"},
	{"heartbeat_ms", K_MS, F(heartbeat_ms), "2000", 10, 600000, NULL, true,
	 "heartbeat interval"},
	{"nic", K_ENUM, F(nic), "rank", 0, 0, "rank|node", false,
	 "coordinator: one NIC per rank (DGX/HGX) or one per node shared by its ranks"},
	{"transport", K_ENUM, F(transport), "tcp", 0, 0, "tcp|nccl", false,
	 "data-plane backend"},
	{"staging_bytes", K_SIZE, F(staging_bytes), "256MiB", 1 << 20, 1ull << 40, NULL,
	 false, "staging memory per rank"},
	{"max_msg_bytes", K_SIZE, F(max_msg_bytes), "64MiB", 4096, 1 << 30, NULL, false,
	 "largest RPC message"},
	{"state_file", K_STR, F(state_file), NULL, 0, 0, NULL, false,
	 "coordinator state file"},
	{"state_store", K_ENUM, F(state_store), "file", 0, 0, "file|etcd", false,
	 "coordinator: where the state lives: state_file (one coordinator), or etcd "
	 "(several coordinators, one elected leader, the others standbys); docs/ha.md"},
	{"etcd_endpoints", K_STR, F(etcd_endpoints), NULL, 0, 0, NULL, false,
	 "coordinator, state_store etcd: etcd's client endpoints, host:port separated by "
	 "commas (plaintext gRPC unless etcd_tls_ca)"},
	{"etcd_tls_ca", K_STR, F(etcd_tls_ca), NULL, 0, 0, NULL, false,
	 "coordinator, state_store etcd: PEM CA that verifies etcd's server certificate "
	 "(its SAN must name each endpoint's host as written): TLS to etcd"},
	{"etcd_tls_cert", K_STR, F(etcd_tls_cert), NULL, 0, 0, NULL, false,
	 "coordinator, state_store etcd: PEM client certificate presented to etcd "
	 "(etcd's --client-cert-auth), with etcd_tls_key; needs etcd_tls_ca"},
	{"etcd_tls_key", K_STR, F(etcd_tls_key), NULL, 0, 0, NULL, false,
	 "coordinator, state_store etcd: the key of etcd_tls_cert"},
	{"etcd_prefix", K_STR, F(etcd_prefix), "/refit", 0, 0, NULL, false,
	 "coordinator, state_store etcd: the prefix of refit's keys (one cluster of "
	 "coordinators per prefix)"},
	{"etcd_lease_ttl_ms", K_MS, F(etcd_lease_ttl_ms), "5000", 1000, 600000, NULL, false,
	 "coordinator, state_store etcd: the leader's lease (whole seconds, rounded up): a "
	 "leader that stops is replaced about this long after"},
	{"etcd_chunk_bytes", K_SIZE, F(etcd_chunk_bytes), "256KiB", 1024, 1 << 20, NULL, false,
	 "coordinator, state_store etcd: the largest chunk of the state document (cut by "
	 "content, about a quarter of this on average); keep it well under etcd's "
	 "--max-request-bytes"},
	{"log_level", K_ENUM, F(log_level), "info", 0, 0, "error|warn|info|debug", true,
	 "log level"},
	{"node_id", K_STR, F(node_id), NULL, 0, 0, NULL, false,
	 "node role: this node's name (default: the hostname)"},
	{"ranks", K_STR, F(ranks), NULL, 0, 0, NULL, false,
	 "node role: global ranks served here, e.g. 0-7"},
	{"domain", K_STR, F(domain), NULL, 0, 0, NULL, false,
	 "node role: NVLink domain (default: node_id)"},
	{"advertise", K_STR, F(advertise), NULL, 0, 0, NULL, false,
	 "node role: address the coordinator calls; coordinator with state_store etcd: the "
	 "address standbys name as the leader's (default: listen)"},
	{"data_listen", K_STR, F(data_listen), "127.0.0.1:0", 0, 0, NULL, false,
	 "node role: tcp data plane host:port (port 0: any free port)"},
	{"data_advertise", K_STR, F(data_advertise), NULL, 0, 0, NULL, false,
	 "node role: data endpoint peers connect to (default: the bound data_listen)"},
	{"local_socket", K_STR, F(local_socket), "/run/refit/refitd.sock", 0, 0, NULL, false,
	 "node role: unix socket librefit clients connect to"},
	{"local_socket_group", K_STR, F(local_socket_group), NULL, 0, 0, NULL, false,
	 "node role: the group of the local sockets (mode 0660: that group's processes may "
	 "register; unset: the daemon's own group)"},
	{"slice_timeout_ms", K_MS, F(slice_timeout_ms), NULL, 100, 86400000, NULL, false,
	 "a plan slice that runs longer fails (unset: the coordinator derives it from each "
	 "plan, max(30 s, 4 x its modelled time, its busiest node's bytes at 100 MB/s); set "
	 "on the coordinator it is every slice's, set on a node that node's); docs/faults.md"},
	{"connect_timeout_ms", K_MS, F(connect_timeout_ms), "5000", 100, 600000, NULL, false,
	 "node role: a data connection to a peer (connect and handshake) that takes longer "
	 "fails the slice, naming the peer; docs/faults.md"},
	{"delta_base_bytes", K_SIZE, F(delta_base_bytes), "1GiB", 0, 1ull << 44, NULL, false,
	 "node role: host memory for delta bases (the bytes of each tcp message last sent "
	 "and received, the base of the next delta refit); a message without room goes "
	 "dense, never refused; 0: every refit dense; docs/delta.md"},
	{"plan_cache_bytes", K_SIZE, F(plan_cache_bytes), "1GiB", 0, 1ull << 40, NULL, false,
	 "ignored: nodes keep no plans, they receive their slice of each plan (accepted so "
	 "older configuration files load)"},
	{"cuda_library", K_STR, F(cuda_library), NULL, 0, 0, NULL, false,
	 "node role, nccl: the CUDA runtime to load (default: $REFIT_CUDA_LIBRARY, then "
	 "libcudart.so.13, .so.12)"},
	{"nccl_library", K_STR, F(nccl_library), NULL, 0, 0, NULL, false,
	 "node role, nccl: the NCCL library to load (default: $REFIT_NCCL_LIBRARY, then "
	 "libnccl.so.2)"},
	{"gpu_kernels_library", K_STR, F(gpu_kernels_library), NULL, 0, 0, NULL, false,
	 "node role, nccl: refit's strided-copy kernels (default: "
	 "$REFIT_GPU_KERNELS_LIBRARY, then ../lib/librefit-gpu-kernels.so)"},
	{"gpu_devices", K_STR, F(gpu_devices), NULL, 0, 0, NULL, false,
	 "node role, nccl: CUDA device of each local rank in rank order, e.g. 0,1,2,3 "
	 "(default: local rank i on device i)"},
	{"gpu_staging_budget_bytes", K_SIZE, F(gpu_staging_budget_bytes), "1GiB", 16 << 20,
	 1ull << 40, NULL, false,
	 "node role, nccl: the GPU memory each local rank's data path may hold: one arena per "
	 "rank and epoch (ncclMemAlloc, registered with its communicator) for message "
	 "staging, relays and conversion scratch; a refit that needs more at once fails "
	 "naming the rank and the budget; docs/gpu.md"},
	{"data_source_check", K_ENUM, F(data_source_check), "on", 0, 0, "off|on", false,
	 "node role, tcp: a data connection naming a member must come from the address of "
	 "the data endpoint it registered (a numeric one), and nodes dial from the address "
	 "they listen on; off: the token alone (hosts whose traffic leaves from another "
	 "address, e.g. behind NAT)"},
	{"data_tls", K_ENUM, F(data_tls), "off", 0, 0, "off|on", false,
	 "node role, tcp: TLS 1.3 on the data connections with tls_cert, tls_key, tls_ca "
	 "(each peer's certificate must name it); set the same on every node"},
	{"poisoned_exit", K_ENUM, F(poisoned_exit), "off", 0, 0, "off|on", false,
	 "node role, nccl: on a poisoned node (GPU work that never ended, its memory kept) "
	 "exit with status 75 for systemd to restart refitd, instead of staying up "
	 "NOT_SERVING (after a sticky CUDA error it always exits); docs/operations.md"},
	{"test_msg_delay_ms", K_MS, F(test_msg_delay_ms), "0", 0, 10000, NULL, false,
	 "tests only: sleep this long before each message a node sends (nccl: each group)"},
	{"test_fail_commit", K_MS, F(test_fail_commit), "0", 0, 1000000, NULL, false,
	 "tests only: refuse this node's Nth Commit (counted from 1; 0: none)"},
	{"test_lose_publish", K_MS, F(test_lose_publish), "0", 0, 1000000, NULL, false,
	 "tests only: lose the Publish of every Nth refit committed on this node, and every "
	 "resend of it, until the node joins a coordinator again (0: none)"},
	{"test_hold_run_ms", K_MS, F(test_hold_run_ms), "0", 0, 60000, NULL, false,
	 "tests only: hold each RunSlice until an Abort of its refit came or this long passed"},
	{"test_hold_publish_ms", K_MS, F(test_hold_publish_ms), "0", 0, 60000, NULL, false,
	 "tests only: coordinator: hold each refit's Publish this long once the decision to "
	 "publish is durable (every node committed), logging it"},
	{"instance_grace_ms", K_MS, F(instance_grace_ms), "60000", 100, 86400000, NULL, false,
	 "coordinator: an instance whose node left is dropped after this long"},
	{"refit_records", K_MS, F(refit_records), "256", 1, 100000, NULL, false,
	 "coordinator: refit records kept for GetRefit, ListRefits, idempotent triggers and "
	 "the state file, the newest; older final ones are freed (about 2 KiB each); "
	 "docs/operations.md"},
	{"default_trigger", K_ENUM, F(default_trigger), "manual", 0, 0, "manual|on_ready", false,
	 "coordinator: a new model's trigger policy: refits start on refitctl trigger only "
	 "(manual) or on every WeightsReady (on_ready); refitctl policy --trigger changes a "
	 "model's; docs/control-plane.md"},
	{"default_min_interval_ms", K_MS, F(default_min_interval_ms), "0", 0, 86400000, NULL,
	 false, "coordinator: a new model's min_interval_ms (on_ready: between the starts of "
	 "the refits the policy starts)"},
	{"metrics_listen", K_STR, F(metrics_listen), NULL, 0, 0, NULL, false,
	 "Prometheus metrics at http://HOST:PORT/metrics (unset: off); docs/operations.md"},
	{"log_format", K_ENUM, F(log_format), "text", 0, 0, "text|json", true,
	 "log lines as text, or one JSON object per line (time, level, subsystem, node, "
	 "epoch, refit, message)"},
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static char **
str_at(refitd_config_t *c, const key_t_ *k)
{
	return (char **)((char *)c + k->off);
}

static uint64_t *
num_at(refitd_config_t *c, const key_t_ *k)
{
	return (uint64_t *)((char *)c + k->off);
}

static const key_t_ *
find_key(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

/* A known key sharing the longest prefix with name, for "did you mean". */
static const char *
suggest(const char *name)
{
	size_t best = 0;
	const char *hit = NULL;

	for (size_t i = 0; i < NKEYS; i++) {
		size_t n = 0;

		while (name[n] && name[n] == keys[i].name[n])
			n++;
		if (n > best) {
			best = n;
			hit = keys[i].name;
		}
	}
	return best >= 3 ? hit : NULL;
}

static bool
in_choices(const char *choices, const char *v)
{
	size_t n = strlen(v);

	for (const char *p = choices; *p;) {
		const char *e = strchr(p, '|');
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (len == n && strncmp(p, v, n) == 0)
			return true;
		p += len + (e != NULL);
	}
	return false;
}

static refit_status_t
set_key(refitd_config_t *c, const key_t_ *k, const char *v, refit_err_t *err)
{
	uint64_t n = 0;

	switch (k->type) {
	case K_ENUM:
		if (!in_choices(k->choices, v))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": "
					     "\"%s\" is not one of %s", k->name, v, k->choices);
		/* fall through */
	case K_STR:
		/* "" unsets a key; one with a default (node_id: the hostname)
		 * cannot be unset */
		if (v[0] == '\0' && strcmp(k->name, "node_id") == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"node_id\" "
					     "is empty (leave it out for the hostname)");
		if (v[0] == '\0' && k->def != NULL)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\" is "
					     "empty (leave it out for the default \"%s\")", k->name,
					     k->def);
		free(*str_at(c, k));
		*str_at(c, k) = v[0] ? xstrdup(v) : NULL;
		return REFIT_OK;
	case K_MS:
		CHECK(refit_parse_u64(v, k->lo, k->hi, &n, k->name, err));
		break;
	case K_SIZE:
		CHECK(refit_parse_size(v, &n, k->name, err));
		if (n < k->lo || n > k->hi)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": "
					     "\"%s\" (%" PRIu64 " bytes) is outside %" PRIu64
					     " to %" PRIu64 " bytes", k->name, v, n, k->lo, k->hi);
		break;
	}
	*num_at(c, k) = n;
	return REFIT_OK;
}

void
config_init(refitd_config_t *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < NKEYS; i++)
		if (keys[i].def && set_key(c, &keys[i], keys[i].def, NULL) != REFIT_OK)
			abort(); /* a bad default is a bug in this table */
}

void
config_fini(refitd_config_t *c)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (keys[i].type == K_STR || keys[i].type == K_ENUM)
			free(*str_at(c, &keys[i]));
	memset(c, 0, sizeof(*c));
}

refit_status_t
config_set(refitd_config_t *c, const char *name, const char *value, refit_err_t *err)
{
	const key_t_ *k = find_key(name);
	const char *s;

	if (k == NULL) {
		s = suggest(name);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: unknown key \"%s\"%s%s%s",
				     name, s ? " (did you mean \"" : "", s ? s : "", s ? "\"?)" : "");
	}
	return set_key(c, k, value, err);
}

/* Copy *c so a failed parse leaves the original untouched. */
static void
config_copy(refitd_config_t *dst, const refitd_config_t *src)
{
	*dst = *src;
	for (size_t i = 0; i < NKEYS; i++) {
		if (keys[i].type != K_STR && keys[i].type != K_ENUM)
			continue;
		char **p = str_at(dst, &keys[i]);

		*p = *p ? xstrdup(*p) : NULL;
	}
}

refit_status_t
config_parse(refitd_config_t *c, const char *text, size_t len, refit_err_t *err)
{
	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
	const cJSON *it;
	refitd_config_t tmp;
	refit_status_t rc = REFIT_OK;

	if (root == NULL || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "config: not a JSON object (malformed JSON?)");
	}
	/* one object: cJSON stops after the first value and says nothing of
	 * what follows */
	while (end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
		end++;
	if (end < text + len) {
		cJSON_Delete(root);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: text after the JSON "
				     "object at byte %zu: \"%.20s\"", (size_t)(end - text), end);
	}
	config_copy(&tmp, c);
	cJSON_ArrayForEach(it, root) {
		char num[64];
		const char *v = NULL;
		const cJSON *prev;
		bool dup = false;

		/* cJSON keeps both copies of a key; which one would win is no
		 * answer to give a user */
		for (prev = root->child; prev != it && !dup; prev = prev->next)
			dup = strcmp(prev->string, it->string) == 0;
		if (dup) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\" appears "
					   "twice", it->string);
			break;
		}

		if (cJSON_IsString(it)) {
			v = it->valuestring;
		} else if (cJSON_IsBool(it) && find_key(it->string) != NULL &&
			   find_key(it->string)->type == K_ENUM &&
			   strcmp(find_key(it->string)->choices, "false|true") == 0) {
			v = cJSON_IsTrue(it) ? "true" : "false";
		} else if (cJSON_IsNumber(it) && it->valuedouble >= 0 &&
			   it->valuedouble < 1e18 && it->valuedouble == (double)(uint64_t)it->valuedouble) {
			snprintf(num, sizeof(num), "%" PRIu64, (uint64_t)it->valuedouble);
			v = num;
		} else {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": expected "
					   "a string or a whole number", it->string);
			break;
		}
		if ((rc = config_set(&tmp, it->string, v, err)) != REFIT_OK)
			break;
	}
	cJSON_Delete(root);
	if (rc != REFIT_OK) {
		config_fini(&tmp);
		return rc;
	}
	config_fini(c);
	*c = tmp;
	return REFIT_OK;
}

refit_status_t
config_load(refitd_config_t *c, const char *path, refit_err_t *err)
{
	char *buf;
	size_t len;
	refit_status_t rc;

	CHECK(codec_read_file(path, &buf, &len, err));
	rc = config_parse(c, buf, len, err);
	free(buf);
	if (rc != REFIT_OK)
		refit_err_prefix(err, "%s", path);
	return rc;
}

/* "host:port" with a port 0..65535 (0 only where allow0), or "unix:/path"
 * where unix_ok; NULL (unset) passes. */
static refit_status_t
check_port(const char *key, const char *v, bool allow0, bool unix_ok, refit_err_t *err)
{
	const char *p;
	char *end;
	unsigned long port;

	if (v == NULL || (unix_ok && strncmp(v, "unix:", 5) == 0))
		return REFIT_OK;
	p = strrchr(v, ':');
	if (p == NULL || p == v || p[1] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": \"%s\" is "
				     "not host:port%s", key, v, unix_ok ? " or unix:/path" : "");
	for (const char *q = p + 1; *q; q++)
		if (*q < '0' || *q > '9')
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": port "
					     "\"%s\" is not a number in \"%s\"", key, p + 1, v);
	port = strtoul(p + 1, &end, 10);
	if (strlen(p + 1) > 5 || port > 65535 || (port == 0 && !allow0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": port %s is "
				     "outside %d to 65535 in \"%s\"", key, p + 1, allow0 ? 0 : 1, v);
	return REFIT_OK;
}

/* A comma-separated list of check_port's host:port (or unix:/path), at
 * least one. */
static refit_status_t
check_ports(const char *key, const char *v, refit_err_t *err)
{
	char *list, *tok, *save = NULL;
	refit_status_t rc = REFIT_OK;
	size_t n = 0;

	if (v == NULL)
		return REFIT_OK;
	list = xstrdup(v);
	for (tok = strtok_r(list, ",", &save); tok && rc == REFIT_OK;
	     tok = strtok_r(NULL, ",", &save), n++)
		if ((rc = check_port(key, tok, false, true, err)) != REFIT_OK && strchr(v, ','))
			refit_err_prefix(err, "in \"%s\"", v);
	free(list);
	if (rc == REFIT_OK && n == 0)
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"%s\": \"%s\" names "
				   "no address", key, v);
	return rc;
}

/* TLS to etcd: a client certificate with its key, and over TLS (the CA). */
static refit_status_t
check_etcd_tls(const refitd_config_t *c, refit_err_t *err)
{
	if (c->etcd_tls_key != NULL && c->etcd_tls_cert == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: etcd_tls_key without "
				     "etcd_tls_cert (etcd's client certificate and its key go "
				     "together)");
	if (c->etcd_tls_cert != NULL && c->etcd_tls_key == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: etcd_tls_cert without "
				     "etcd_tls_key (etcd's client certificate and its key go "
				     "together)");
	if (c->etcd_tls_cert != NULL && c->etcd_tls_ca == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: etcd_tls_cert needs "
				     "etcd_tls_ca (a client certificate goes over TLS, which the "
				     "CA that verifies etcd turns on)");
	return REFIT_OK;
}

/* state_store etcd: endpoints given, host:port each; a prefix like /refit;
 * its TLS files paired. */
static refit_status_t
check_etcd(const refitd_config_t *c, refit_err_t *err)
{
	size_t n = c->etcd_prefix ? strlen(c->etcd_prefix) : 0;

	if (strcmp(c->state_store, "etcd") != 0)
		return REFIT_OK;
	if (c->etcd_endpoints == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: state_store \"etcd\" "
				     "needs etcd_endpoints (host:port,...)");
	if (strstr(c->etcd_endpoints, "unix:") != NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"etcd_endpoints\": "
				     "\"%s\": host:port only", c->etcd_endpoints);
	CHECK(check_ports("etcd_endpoints", c->etcd_endpoints, err));
	if (n < 2 || c->etcd_prefix[0] != '/' || c->etcd_prefix[n - 1] == '/')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"etcd_prefix\": "
				     "\"%s\" must start with / and not end with one, e.g. /refit",
				     c->etcd_prefix ? c->etcd_prefix : "");
	if (c->state_file != NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: state_file and "
				     "state_store \"etcd\" exclude each other (the state is "
				     "etcd's)");
	return check_etcd_tls(c, err);
}

bool
config_is_loopback(const char *addr)
{
	const char *p = addr ? strrchr(addr, ':') : NULL;
	size_t n = p ? (size_t)(p - addr) : 0;

	if (addr == NULL || strncmp(addr, "unix:", 5) == 0)
		return true;
	if (p == NULL)
		return false;
	return (n == 9 && strncmp(addr, "localhost", 9) == 0) ||
	       (n == 5 && strncmp(addr, "[::1]", 5) == 0) ||
	       (n >= 4 && strncmp(addr, "127.", 4) == 0);
}

/* Secure by default: beyond loopback only with a join token, mutual TLS
 * or an explicit "insecure": true. */
static refit_status_t
check_exposed(const refitd_config_t *c, refit_err_t *err)
{
	if (config_is_loopback(c->listen) || c->join_token_file != NULL ||
	    (c->tls_cert != NULL && (c->tls_client_ca != NULL || c->tls_ca != NULL)) ||
	    strcmp(c->insecure, "true") == 0)
		return REFIT_OK;
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: listen \"%s\" is not loopback "
			     "or a unix socket, and nothing authenticates the nodes: set "
			     "join_token_file (or tls_cert, tls_key and tls_ca: mutual TLS), or "
			     "\"insecure\": true to let anyone who reaches the port join",
			     c->listen);
}

refit_status_t
config_check(const refitd_config_t *c, refit_err_t *err)
{
	CHECK(check_port("listen", c->listen, true, true, err));
	CHECK(check_exposed(c, err));
	/* metrics: TCP only (metrics.c), port 0 binds any free port */
	CHECK(check_port("metrics_listen", c->metrics_listen, true, false, err));
	CHECK(check_etcd(c, err));
	if (strcmp(c->role, "node") == 0) {
		CHECK(check_ports("coordinator", c->coordinator, err));
		CHECK(check_port("advertise", c->advertise, false, true, err));
		CHECK(check_port("data_listen", c->data_listen, true, true, err));
		CHECK(check_port("data_advertise", c->data_advertise, false, true, err));
	}
	if (c->staging_bytes < PLAN_DEFAULT_CHUNK_BYTES)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: staging_bytes %" PRIu64
				     " is smaller than the chunk size %llu bytes: every refit "
				     "would fail", c->staging_bytes, PLAN_DEFAULT_CHUNK_BYTES);
	if (c->heartbeat_ms >= c->lease_ttl_ms)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: heartbeat_ms %" PRIu64
				     " must be shorter than lease_ttl_ms %" PRIu64,
				     c->heartbeat_ms, c->lease_ttl_ms);
	if ((c->tls_cert == NULL) != (c->tls_key == NULL))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: tls_cert and tls_key "
				     "go together");
	if (strcmp(c->role, "node") == 0) {
		int32_t *r = NULL;
		size_t n = 0;
		refit_status_t rc = config_parse_ranks(c->ranks, &r, &n, err);

		free(r);
		CHECK(rc);
		if (c->gpu_devices != NULL) {
			int32_t *d = NULL;
			size_t nd = 0;

			/* no err: its message would name "ranks", and the first
			 * error set is the one kept */
			if (config_parse_ranks(c->gpu_devices, &d, &nd, NULL) != REFIT_OK || nd != n) {
				free(d);
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key "
						     "\"gpu_devices\": \"%s\" must list one CUDA "
						     "device per rank of \"ranks\" (%zu), in that "
						     "order, e.g. 0,1,2,3 or 0-3", c->gpu_devices, n);
			}
			free(d);
		}
	}
	if (strcmp(c->data_tls, "on") == 0 && (c->tls_cert == NULL || c->tls_ca == NULL))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: data_tls \"on\" needs "
				     "tls_cert, tls_key and tls_ca (the data connections use this "
				     "node's certificate and verify the peers' with the CA)");
	if (c->tls_client_ca && c->tls_cert == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: tls_client_ca needs "
				     "tls_cert and tls_key (mutual TLS is TLS first)");
	return REFIT_OK;
}

void
config_dump(const refitd_config_t *c, strbuf_t *out)
{
	strbuf_puts(out, "{");
	for (size_t i = 0; i < NKEYS; i++) {
		const key_t_ *k = &keys[i];

		strbuf_printf(out, "%s\n  \"%s\": ", i ? "," : "", k->name);
		if (k->type == K_STR || k->type == K_ENUM) {
			const char *v = *str_at((refitd_config_t *)c, k);

			if (v)
				strbuf_json_str(out, v);
			else
				strbuf_puts(out, "null");
		} else {
			strbuf_printf(out, "%" PRIu64, *num_at((refitd_config_t *)c, k));
		}
	}
	strbuf_puts(out, "\n}\n");
}

void
config_help(strbuf_t *out)
{
	static const char *const kind[] = {
		[K_STR] = "TEXT", [K_MS] = "MS", [K_SIZE] = "SIZE", [K_ENUM] = "",
	};

	for (size_t i = 0; i < NKEYS; i++) {
		const key_t_ *k = &keys[i];
		const char *sep = " (";

		strbuf_puts(out, "  --");
		for (const char *p = k->name; *p; p++)
			strbuf_add(out, *p == '_' ? "-" : p, 1);
		strbuf_printf(out, " %s", k->type == K_ENUM ? k->choices : kind[k->type]);
		if (k->type == K_MS || k->type == K_SIZE) {
			strbuf_printf(out, "%s%" PRIu64 " to %" PRIu64 "%s", sep, k->lo, k->hi,
				      k->type == K_SIZE ? " bytes" : "");
			sep = ", ";
		}
		if (k->def != NULL) {
			strbuf_printf(out, "%sdefault %s", sep, k->def);
			sep = ", ";
		}
		if (k->reloadable) {
			strbuf_printf(out, "%sreloadable", sep);
			sep = ", ";
		}
		strbuf_printf(out, "%s\n      %s\n", sep[0] == ',' ? ")" : "", k->help);
	}
}

static int
cmp_rank(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

refit_status_t
config_parse_ranks(const char *spec, int32_t **out, size_t *n, refit_err_t *err)
{
	VEC(int32_t) v = {0};
	const char *p = spec;

	*out = NULL;
	*n = 0;
	if (spec == NULL || spec[0] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config: the node role needs "
				     "\"ranks\" (e.g. \"0-7\")");
	for (;;) {
		char *end;
		long a, b;

		/* digits only: strtol would also take blanks and signs */
		if (!isdigit((unsigned char)*p))
			goto bad;
		a = b = strtol(p, &end, 10);
		if (a >= (1 << 24))
			goto bad;
		p = end;
		if (*p == '-') {
			if (!isdigit((unsigned char)p[1]))
				goto bad;
			b = strtol(p + 1, &end, 10);
			if (b < a || b >= (1 << 24) || b - a > 65536)
				goto bad;
			p = end;
		}
		for (long r = a; r <= b; r++)
			VEC_PUSH(&v, (int32_t)r);
		if (*p == '\0')
			break;
		if (*p++ != ',')
			goto bad;
	}
	{
		/* overlapping ranges or a rank given twice */
		int32_t *s = xmalloc((v.n ? v.n : 1) * sizeof(*s));

		memcpy(s, v.v, v.n * sizeof(*s));
		xqsort(s, v.n, sizeof(*s), cmp_rank);
		for (size_t i = 1; i < v.n; i++)
			if (s[i] == s[i - 1]) {
				int32_t r = s[i];

				free(s);
				VEC_FREE(&v);
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key "
						     "\"ranks\": \"%s\" lists rank %d twice "
						     "(overlapping ranges?)", spec, r);
			}
		free(s);
	}
	*out = v.v;
	*n = v.n;
	return REFIT_OK;
bad:
	VEC_FREE(&v);
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config key \"ranks\": \"%s\" is not "
			     "a list of ranks and ranges such as 0-7 or 0,2,4-5", spec);
}

void
config_diff(const refitd_config_t *a, const refitd_config_t *b,
	    void (*fn)(void *ctx, const char *key, bool reloadable), void *ctx)
{
	for (size_t i = 0; i < NKEYS; i++) {
		const key_t_ *k = &keys[i];
		bool same;

		if (k->type == K_STR || k->type == K_ENUM) {
			const char *x = *str_at((refitd_config_t *)a, k);
			const char *y = *str_at((refitd_config_t *)b, k);

			same = (x == NULL && y == NULL) || (x && y && strcmp(x, y) == 0);
		} else {
			same = *num_at((refitd_config_t *)a, k) == *num_at((refitd_config_t *)b, k);
		}
		if (!same)
			fn(ctx, k->name, k->reloadable);
	}
}

void
config_apply_reloadable(refitd_config_t *running, const refitd_config_t *fresh)
{
	for (size_t i = 0; i < NKEYS; i++) {
		const key_t_ *k = &keys[i];

		if (!k->reloadable)
			continue;
		if (k->type == K_STR || k->type == K_ENUM) {
			const char *v = *str_at((refitd_config_t *)fresh, k);

			free(*str_at(running, k));
			*str_at(running, k) = v ? xstrdup(v) : NULL;
		} else {
			*num_at(running, k) = *num_at((refitd_config_t *)fresh, k);
		}
	}
}
