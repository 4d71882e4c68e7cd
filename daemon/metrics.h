/*
 * metrics.h - refitd's Prometheus metrics: a fixed table of families
 * (metrics.c, docs/operations.md), series made on first use, the text
 * exposition format, and an HTTP endpoint (libmicrohttpd) serving
 * GET /metrics on its own thread.  Every function is thread-safe.
 *
 * Labels are given as a NULL-terminated array of name, value pairs:
 *   metrics_observe(M_RPC_SECONDS, (const char *[]){"method", "Join", NULL}, 0.002);
 */
#ifndef REFIT_DAEMON_METRICS_H
#define REFIT_DAEMON_METRICS_H

#include "common/err.h"
#include "common/strbuf.h"

typedef enum metric_id {
	M_REFIT_PHASE_SECONDS,   /* histogram {phase} */
	M_REFIT_SECONDS,         /* histogram {outcome} */
	M_REFITS_TOTAL,          /* counter {outcome} */
	M_REFIT_FAILURES_TOTAL,  /* counter {cause} */
	M_REFIT_RETRIES_TOTAL,   /* counter */
	M_REFIT_BYTES_TOTAL,     /* counter {link} */
	M_EPOCH,                 /* gauge */
	M_MEMBERS,               /* gauge */
	M_LEASE_EXPIRIES_TOTAL,  /* counter */
	M_COORD_STALLS_TOTAL,    /* counter */
	M_COORD_STALLED_SECONDS_TOTAL, /* counter */
	M_RPC_SECONDS,           /* histogram {method, code} */
	M_STAGING_BYTES,         /* gauge */
	M_SLICES_RUNNING,        /* gauge */
	M_CLIENTS,               /* gauge {role} */
	M_NODE_POISONED,         /* gauge: 0 or 1 */
	M_MEMBERS_POISONED,      /* gauge */
	M_REFIT_RECORDS,         /* gauge: records kept */
	M_REFIT_RECORDS_ALLOCATED, /* gauge: records made, not yet freed */
	M_REFIT_RECORDS_FREED_TOTAL, /* counter */
	M_REFIT_RECORDS_BYTES,   /* gauge: bytes the kept records hold */
	M_POLICY_REFITS_TOTAL,   /* counter: refits a trigger policy started */
	M_SKIPPED_VERSIONS_TOTAL, /* counter: ready versions a policy skipped */
	M_HEAP_INUSE_BYTES,      /* gauge: malloc'd bytes in use (mallinfo2) */
	M_HEAP_SYSTEM_BYTES,     /* gauge: bytes malloc holds from the system */
	M_AUTH_REFUSED_TOTAL,    /* counter {method, reason}: calls refused */
	M_DELTA_BASE_BYTES,      /* gauge {where}: node's delta bases held */
	M_DELTA_BASE_LIMIT_BYTES,/* gauge {where}: its bound */
	M_DELTA_EVICTIONS_TOTAL, /* counter {where}: bases evicted for another model's */
	M_DELTA_SENT_BYTES_TOTAL,/* counter {kind}: wire bytes of units sent dense or delta */
	M_DELTA_DENSE_BYTES_TOTAL, /* counter: dense bytes the delta units stood for */
	M_DELTA_FALLBACK_TOTAL,  /* counter {reason}: slices offered a base that ran dense */
	M_COORD_LEADER,          /* gauge: 0 or 1 */
	M_STATE_STORE_SECONDS,   /* histogram {store, op, outcome} */
	M_COUNT
} metric_id_t;

void metrics_add(metric_id_t id, const char *const *labels, double v);
void metrics_set(metric_id_t id, const char *const *labels, double v);
void metrics_observe(metric_id_t id, const char *const *labels, double v);
/* The metric's family name ("refitd_epoch"). */
const char *metrics_name(metric_id_t id);

/* Every family in the text exposition format (version 0.0.4). */
void metrics_render(strbuf_t *out);

/* Serve GET /metrics on listen ("HOST:PORT", "[V6]:PORT"); *port gets the
 * bound port.  One server per process. */
refit_status_t metrics_serve_start(const char *listen, int *port, refit_err_t *err);
void metrics_serve_stop(void);

/* refitd_rpc_duration_seconds{method, code}: the servers' observe hook
 * (rpc_server_opts_t.observe). */
void metrics_observe_rpc(const char *method, const char *code, double seconds);
/* refitd_auth_refused_total{method, reason}: the servers' refused hook
 * (rpc_server_opts_t.refused). */
void metrics_auth_refused(const char *method, const char *reason);

#endif
