/*
 * metrics.c - see metrics.h.  Names, units and types follow the Prometheus
 * conventions: a refitd_ prefix, base units in the name (_seconds,
 * _bytes), counters ending in _total.  The table below is the list
 * docs/operations.md documents.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/alloc.h"
#include "common/str.h"
#include "daemon/metrics.h"

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind_t;

static const double phase_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
				       10, 30, 60, 120, 300, 600};
static const double rpc_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
				     0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
#define NB(a) (sizeof(a) / sizeof(a[0]))

typedef struct family {
	const char *name;
	kind_t kind;
	const char *help;
	const double *buckets;
	size_t nbuckets;
} family_t;

static const family_t families[M_COUNT] = {
	[M_REFIT_PHASE_SECONDS] = {"refitd_refit_phase_duration_seconds", KIND_HISTOGRAM,
		"Time refits spent in each phase (planning, preparing, running, committing); "
		"coordinator", phase_buckets, NB(phase_buckets)},
	[M_REFIT_SECONDS] = {"refitd_refit_duration_seconds", KIND_HISTOGRAM,
		"Time from trigger to final state, by outcome; coordinator", phase_buckets,
		NB(phase_buckets)},
	[M_REFITS_TOTAL] = {"refitd_refits_total", KIND_COUNTER,
		"Refits that reached a final state, by outcome; coordinator", NULL, 0},
	[M_REFIT_FAILURES_TOTAL] = {"refitd_refit_failures_total", KIND_COUNTER,
		"Failed or aborted refits by cause (final attempts only); coordinator", NULL, 0},
	[M_REFIT_RETRIES_TOTAL] = {"refitd_refit_retries_total", KIND_COUNTER,
		"Refit attempts that failed and were retried by the model's policy; coordinator",
		NULL, 0},
	[M_REFIT_BYTES_TOTAL] = {"refitd_refit_bytes_total", KIND_COUNTER,
		"Bytes the plans of committed refits moved, by link class (local, nvlink, "
		"network); coordinator", NULL, 0},
	[M_EPOCH] = {"refitd_epoch", KIND_GAUGE,
		"Membership epoch (coordinator: current; node: the one it was told)", NULL, 0},
	[M_MEMBERS] = {"refitd_members", KIND_GAUGE,
		"Node daemons in the membership; coordinator", NULL, 0},
	[M_LEASE_EXPIRIES_TOTAL] = {"refitd_lease_expiries_total", KIND_COUNTER,
		"Members removed because their lease expired; coordinator", NULL, 0},
	[M_COORD_STALLS_TOTAL] = {"refitd_coordinator_stalls_total", KIND_COUNTER,
		"Times the coordinator found it had not been running (its lease tick ran late "
		"past the tolerance); not counted against leases; coordinator", NULL, 0},
	[M_COORD_STALLED_SECONDS_TOTAL] = {"refitd_coordinator_stalled_seconds_total",
		KIND_COUNTER, "Time those stalls lasted (not counted against leases); "
		"coordinator", NULL, 0},
	[M_RPC_SECONDS] = {"refitd_rpc_duration_seconds", KIND_HISTOGRAM,
		"Time from a call's arrival to its answer, by method and gRPC status code",
		rpc_buckets, NB(rpc_buckets)},
	[M_STAGING_BYTES] = {"refitd_staging_bytes", KIND_GAUGE,
		"Staging bytes reserved by the slices running now (their staging_bytes "
		"budgets); node", NULL, 0},
	[M_SLICES_RUNNING] = {"refitd_slices_running", KIND_GAUGE,
		"Slices of refits running on this node; node", NULL, 0},
	[M_CLIENTS] = {"refitd_clients", KIND_GAUGE,
		"librefit clients registered with this node, by role; node", NULL, 0},
	[M_NODE_POISONED] = {"refitd_node_poisoned", KIND_GAUGE,
		"1 when this node runs no more refits until refitd restarts (GPU work never "
		"ended, its memory is kept), else 0; node", NULL, 0},
	[M_MEMBERS_POISONED] = {"refitd_members_poisoned", KIND_GAUGE,
		"Members that said they are poisoned (refits needing them fail); coordinator",
		NULL, 0},
	[M_REFIT_RECORDS] = {"refitd_refit_records", KIND_GAUGE,
		"Refit records kept for GetRefit, ListRefits and the state file (at most "
		"refit_records, plus refits in flight); coordinator", NULL, 0},
	[M_REFIT_RECORDS_ALLOCATED] = {"refitd_refit_records_allocated", KIND_GAUGE,
		"Refit records in memory, kept or not (equals refitd_refit_records unless a "
		"dropped record was not freed); coordinator", NULL, 0},
	[M_REFIT_RECORDS_FREED_TOTAL] = {"refitd_refit_records_freed_total", KIND_COUNTER,
		"Refit records freed (the oldest beyond refit_records); coordinator", NULL, 0},
	[M_REFIT_RECORDS_BYTES] = {"refitd_refit_records_bytes", KIND_GAUGE,
		"Bytes the kept refit records hold (their structs, arrays and strings, without "
		"malloc's overhead); coordinator", NULL, 0},
	[M_POLICY_REFITS_TOTAL] = {"refitd_policy_refits_total", KIND_COUNTER,
		"Refits started by a model's trigger policy (on_ready), not by an operator; "
		"coordinator", NULL, 0},
	[M_SKIPPED_VERSIONS_TOTAL] = {"refitd_skipped_versions_total", KIND_COUNTER,
		"Ready versions an on_ready policy never refit: replaced by a newer one while a "
		"refit was in flight, or older than the installed one; coordinator", NULL, 0},
	[M_HEAP_INUSE_BYTES] = {"refitd_heap_inuse_bytes", KIND_GAUGE,
		"Bytes allocated with malloc and not freed (glibc mallinfo2: uordblks + "
		"hblkhd)", NULL, 0},
	[M_HEAP_SYSTEM_BYTES] = {"refitd_heap_system_bytes", KIND_GAUGE,
		"Bytes malloc holds from the system, in use or free (glibc mallinfo2: arena + "
		"hblkhd); its excess over refitd_heap_inuse_bytes is the allocator's "
		"(fragmentation, free memory not yet returned)", NULL, 0},
	[M_AUTH_REFUSED_TOTAL] = {"refitd_auth_refused_total", KIND_COUNTER,
		"Calls refused UNAUTHENTICATED or PERMISSION_DENIED, by method path and reason "
		"(missing, wrong: a token; session: not this node's coordinator; identity: a "
		"member acting for another)", NULL, 0},
	[M_DELTA_BASE_BYTES] = {"refitd_delta_base_bytes", KIND_GAUGE,
		"Memory holding delta bases (the bytes of each message last sent and received, "
		"docs/delta.md), by store (where: host, the tcp messages'; gpu, the nccl "
		"messages' in the ranks' staging, every rank's); node", NULL, 0},
	[M_DELTA_BASE_LIMIT_BYTES] = {"refitd_delta_base_limit_bytes", KIND_GAUGE,
		"Its bound by store (host: delta_base_bytes; gpu: per rank, the smaller of "
		"delta_base_bytes and a quarter of gpu_staging_budget_bytes); node", NULL, 0},
	[M_DELTA_EVICTIONS_TOTAL] = {"refitd_delta_base_evictions_total", KIND_COUNTER,
		"Delta bases evicted, least recently used first, for another model's base "
		"(where: host, a table of one peer and direction; gpu, one message's); their "
		"model's next refit sends those messages dense; node", NULL, 0},
	[M_DELTA_SENT_BYTES_TOTAL] = {"refitd_delta_sent_bytes_total", KIND_COUNTER,
		"Bytes of tcp units this node sent, by kind (dense, delta: encoded against the "
		"base its receiver holds); node", NULL, 0},
	[M_DELTA_DENSE_BYTES_TOTAL] = {"refitd_delta_dense_bytes_total", KIND_COUNTER,
		"Dense bytes the units sent as delta stand for; node", NULL, 0},
	[M_DELTA_FALLBACK_TOTAL] = {"refitd_delta_fallback_total", KIND_COUNTER,
		"Slices offered a delta base that ran dense, by reason (nccl: the transport "
		"does not encode yet); node", NULL, 0},
	[M_COORD_LEADER] = {"refitd_coordinator_leader", KIND_GAUGE,
		"1 when this coordinator leads (serves the Coordinator service), 0 when it is "
		"a standby (state_store etcd: docs/ha.md); coordinator", NULL, 0},
	[M_STATE_STORE_SECONDS] = {"refitd_state_store_duration_seconds", KIND_HISTOGRAM,
		"Time a load or save of the coordinator's state took, by store (file, etcd), "
		"op and outcome (a save precedes every acknowledged change); coordinator",
		rpc_buckets, NB(rpc_buckets)},
};

typedef struct series {
	metric_id_t id;
	char *labels;      /* rendered: a="x",b="y" (empty: none) */
	double value;      /* counter, gauge */
	uint64_t *counts;  /* histogram: per bucket (not cumulative) */
	uint64_t count;
	double sum;
} series_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static VEC(series_t) all;

static void
label_value(strbuf_t *sb, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			strbuf_printf(sb, "\\%c", *v);
		else if (*v == '\n')
			strbuf_puts(sb, "\\n");
		else
			strbuf_add(sb, v, 1);
	}
}

/* The series of (id, labels), made when new; under mu. */
static series_t *
series_get(metric_id_t id, const char *const *labels)
{
	strbuf_t sb;
	series_t s;

	strbuf_init(&sb);
	for (size_t i = 0; labels && labels[i] && labels[i + 1]; i += 2) {
		strbuf_printf(&sb, "%s%s=\"", i ? "," : "", labels[i]);
		label_value(&sb, labels[i + 1]);
		strbuf_puts(&sb, "\"");
	}
	for (size_t i = 0; i < all.n; i++)
		if (all.v[i].id == id && strcmp(all.v[i].labels, str_nz(sb.s)) == 0) {
			strbuf_fini(&sb);
			return &all.v[i];
		}
	memset(&s, 0, sizeof(s));
	s.id = id;
	s.labels = xstrdup(str_nz(sb.s));
	if (families[id].kind == KIND_HISTOGRAM)
		s.counts = xcalloc(families[id].nbuckets + 1, sizeof(*s.counts));
	strbuf_fini(&sb);
	VEC_PUSH(&all, s);
	return &all.v[all.n - 1];
}

const char *
metrics_name(metric_id_t id)
{
	return id < M_COUNT ? families[id].name : "?";
}

void
metrics_add(metric_id_t id, const char *const *labels, double v)
{
	pthread_mutex_lock(&mu);
	series_get(id, labels)->value += v;
	pthread_mutex_unlock(&mu);
}

void
metrics_set(metric_id_t id, const char *const *labels, double v)
{
	pthread_mutex_lock(&mu);
	series_get(id, labels)->value = v;
	pthread_mutex_unlock(&mu);
}

void
metrics_observe(metric_id_t id, const char *const *labels, double v)
{
	const family_t *f = &families[id];
	series_t *s;
	size_t b = 0;

	while (b < f->nbuckets && v > f->buckets[b])
		b++;
	pthread_mutex_lock(&mu);
	s = series_get(id, labels);
	s->counts[b]++;
	s->count++;
	s->sum += v;
	pthread_mutex_unlock(&mu);
}

static void
render_histogram(strbuf_t *out, const family_t *f, const series_t *s)
{
	const char *sep = s->labels[0] ? "," : "";
	uint64_t cum = 0;

	for (size_t b = 0; b <= f->nbuckets; b++) {
		cum += s->counts[b];
		if (b < f->nbuckets)
			strbuf_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", f->name, s->labels, sep,
				      f->buckets[b], (unsigned long long)cum);
		else
			strbuf_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name, s->labels,
				      sep, (unsigned long long)cum);
	}
	strbuf_printf(out, "%s_sum%s%s%s %.9g\n", f->name, s->labels[0] ? "{" : "", s->labels,
		      s->labels[0] ? "}" : "", s->sum);
	strbuf_printf(out, "%s_count%s%s%s %llu\n", f->name, s->labels[0] ? "{" : "", s->labels,
		      s->labels[0] ? "}" : "", (unsigned long long)s->count);
}

void
metrics_render(strbuf_t *out)
{
	static const char *const kinds[] = {"counter", "gauge", "histogram"};

	pthread_mutex_lock(&mu);
	for (int id = 0; id < M_COUNT; id++) {
		const family_t *f = &families[id];
		size_t n = 0;

		strbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
			      kinds[f->kind]);
		for (size_t i = 0; i < all.n; i++) {
			const series_t *s = &all.v[i];

			if (s->id != (metric_id_t)id)
				continue;
			n++;
			if (f->kind == KIND_HISTOGRAM)
				render_histogram(out, f, s);
			else
				strbuf_printf(out, "%s%s%s%s %.17g\n", f->name, s->labels[0] ? "{" : "",
					      s->labels, s->labels[0] ? "}" : "", s->value);
		}
		/* a family without labels reads 0 before anything happened */
		if (n == 0 && f->kind == KIND_COUNTER && id != M_REFITS_TOTAL &&
		    id != M_REFIT_FAILURES_TOTAL && id != M_REFIT_BYTES_TOTAL)
			strbuf_printf(out, "%s 0\n", f->name);
	}
	pthread_mutex_unlock(&mu);
}

/* ---- the HTTP endpoint ------------------------------------------------------ */

static struct MHD_Daemon *mhd;

static enum MHD_Result
answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
       const char *version, const char *upload, size_t *upload_len, void **state)
{
	struct MHD_Response *rsp;
	enum MHD_Result rc;
	unsigned code = MHD_HTTP_OK;
	strbuf_t sb;

	(void)cls;
	(void)version;
	(void)upload;
	(void)upload_len;
	(void)state;
	strbuf_init(&sb);
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		code = MHD_HTTP_METHOD_NOT_ALLOWED;
		strbuf_printf(&sb, "method %s: only GET /metrics\n", method);
	} else if (strcmp(url, "/metrics") != 0) {
		code = MHD_HTTP_NOT_FOUND;
		strbuf_puts(&sb, "not found: the metrics are at /metrics\n");
	} else {
		metrics_render(&sb);
	}
	rsp = MHD_create_response_from_buffer(sb.len, sb.s ? sb.s : (char *)"",
					      MHD_RESPMEM_MUST_COPY);
	strbuf_fini(&sb);
	if (rsp == NULL)
		return MHD_NO;
	MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE,
				code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8" :
				"text/plain; charset=utf-8");
	rc = MHD_queue_response(conn, code, rsp);
	MHD_destroy_response(rsp);
	return rc;
}

refit_status_t
metrics_serve_start(const char *listen, int *port, refit_err_t *err)
{
	struct addrinfo hints, *ai = NULL;
	char host[256];
	const char *colon = strrchr(listen, ':');
	const union MHD_DaemonInfo *info;
	size_t hl;
	int rc;

	if (mhd != NULL)
		return refit_err_set(err, REFIT_ERR_EXISTS, "metrics: already serving");
	if (colon == NULL || colon == listen || !colon[1] ||
	    (hl = (size_t)(colon - listen)) >= sizeof(host))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "metrics_listen \"%s\": expected "
				     "HOST:PORT", listen);
	if (listen[0] == '[' && colon[-1] == ']') { /* [v6]:port */
		memcpy(host, listen + 1, hl - 2);
		host[hl - 2] = '\0';
	} else {
		memcpy(host, listen, hl);
		host[hl] = '\0';
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	rc = getaddrinfo(host, colon + 1, &hints, &ai);
	if (rc != 0 || ai == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "metrics_listen \"%s\": %s",
				     listen, rc ? gai_strerror(rc) : "no address");
	mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
			       (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0),
			       0, NULL, NULL, answer, NULL,
			       MHD_OPTION_SOCK_ADDR, ai->ai_addr,
			       MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
			       MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
			       MHD_OPTION_END);
	freeaddrinfo(ai);
	if (mhd == NULL)
		return refit_err_set(err, REFIT_ERR_SYS, "metrics_listen \"%s\": cannot listen "
				     "there (in use, or not an address of this host)", listen);
	info = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_BIND_PORT);
	*port = info ? info->port : 0;
	return REFIT_OK;
}

void
metrics_serve_stop(void)
{
	if (mhd != NULL)
		MHD_stop_daemon(mhd);
	mhd = NULL;
}

void
metrics_observe_rpc(const char *method, const char *code, double seconds)
{
	metrics_observe(M_RPC_SECONDS, (const char *[]){"method", method, "code", code, NULL},
			seconds);
}

void
metrics_auth_refused(const char *method, const char *reason)
{
	metrics_add(M_AUTH_REFUSED_TOTAL, (const char *[]){"method", method, "reason", reason,
							   NULL}, 1);
}
