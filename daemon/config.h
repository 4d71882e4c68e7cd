/*
 * config.h - refitd's configuration: one table of keys (type, default,
 * bounds, reloadable) drives parsing, validation, defaults and the
 * --check-config printout.  Files are JSON objects with flat keys; unknown
 * keys and bad values are errors that name the key.
 */
#ifndef REFIT_DAEMON_CONFIG_H
#define REFIT_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/strbuf.h"

typedef struct refitd_config {
	char *role;           /* "coordinator" | "node" */
	char *listen;         /* host:port or unix:/path */
	char *coordinator;    /* node role: the coordinator's address */
	char *tls_cert, *tls_key, *tls_client_ca, *tls_ca;
	char *token_file;
	char *join_token_file; /* the cluster join token (node credential) */
	char *insecure;       /* "true": listen beyond loopback unauthenticated */
	uint64_t lease_ttl_ms, heartbeat_ms;
	char *transport;      /* "tcp" | "nccl" */
	char *nic;            /* coordinator: "rank" | "node" (plans' NIC model) */
	uint64_t staging_bytes;
	uint64_t max_msg_bytes;
	char *state_file;
	char *state_store;    /* coordinator: "file" | "etcd" (docs/ha.md) */
	char *etcd_endpoints; /* etcd: "host:port,..." */
	char *etcd_prefix;    /* etcd: the keys' prefix */
	char *etcd_tls_ca, *etcd_tls_cert, *etcd_tls_key; /* etcd over TLS (PEM files) */
	uint64_t etcd_lease_ttl_ms; /* etcd: the leader's lease */
	uint64_t etcd_chunk_bytes;  /* etcd: the state's chunks' maximum size */
	char *log_level;      /* error | warn | info | debug */
	char *node_id;        /* node role: this node's name (default: hostname) */
	char *ranks;          /* node role: "0-7" or "0,2,4-5" */
	char *domain;         /* node role: NVLink domain (default: node_id) */
	char *advertise;      /* node role: address the coordinator calls (default: listen) */
	char *data_listen;    /* node role: tcp data plane host:port */
	char *data_advertise; /* node role: data endpoint peers use (default: bound data_listen) */
	char *local_socket;   /* node role: unix socket for librefit */
	char *local_socket_group; /* node role: its group (mode 0660); NULL: ours */
	uint64_t slice_timeout_ms;    /* 0 (unset): derived from the plan */
	uint64_t connect_timeout_ms;  /* node: each data connection to a peer */
	uint64_t delta_base_bytes;    /* node: host memory for delta bases (0: none kept) */
	uint64_t plan_cache_bytes;    /* ignored (nodes keep no plans): older files load */
	uint64_t test_msg_delay_ms;   /* tests: slow every sent message down */
	uint64_t test_fail_commit;    /* tests: refuse the node's Nth Commit */
	uint64_t test_lose_publish;   /* tests: lose every Nth refit's Publish until it joins again */
	uint64_t test_hold_run_ms;    /* tests: hold RunSlice until its Abort */
	uint64_t test_hold_publish_ms; /* tests: coordinator, hold each Publish after its decision is durable */
	char *cuda_library, *nccl_library, *gpu_kernels_library; /* nccl: what to load */
	char *data_source_check; /* node, tcp: "on" or "off" */
	char *data_tls;       /* node, tcp: "off" or "on" (TLS on data connections) */
	char *poisoned_exit;  /* node: "off" (stay up, report, refuse refits) or "on" (exit 75) */
	char *gpu_devices;    /* nccl: "0,1,..." local rank i -> CUDA device */
	uint64_t gpu_staging_budget_bytes; /* nccl: each rank's GPU staging arena */
	uint64_t instance_grace_ms;   /* coordinator: an instance whose node is gone
					 is dropped after this long */
	uint64_t refit_records;       /* coordinator: refit records kept (the newest) */
	char *default_trigger;        /* coordinator: a new model's trigger, "manual" | "on_ready" */
	uint64_t default_min_interval_ms; /* coordinator: a new model's min_interval_ms */
	char *metrics_listen; /* Prometheus /metrics HOST:PORT (NULL: off) */
	char *log_format;     /* "text" | "json" */
} refitd_config_t;

/* All keys at their defaults. */
void config_init(refitd_config_t *c);
void config_fini(refitd_config_t *c);
/* Apply a JSON document on top of *c; nothing changes on error. */
refit_status_t config_parse(refitd_config_t *c, const char *text, size_t len,
			    refit_err_t *err);
refit_status_t config_load(refitd_config_t *c, const char *path, refit_err_t *err);
/* Set one key from text (command-line flags use the same table). */
refit_status_t config_set(refitd_config_t *c, const char *key, const char *value,
			  refit_err_t *err);
/* Cross-key checks (heartbeat < lease, TLS pairs, ...). */
refit_status_t config_check(const refitd_config_t *c, refit_err_t *err);
/* Is addr ("host:port", "unix:/path") loopback or a unix socket? */
bool config_is_loopback(const char *addr);
/* "0-3,8" -> {0,1,2,3,8}; *out is heap memory the caller frees. */
refit_status_t config_parse_ranks(const char *spec, int32_t **out, size_t *n,
				  refit_err_t *err);
/*
 * Call fn for every key whose value differs between a and b, saying
 * whether it may change while the daemon runs (SIGHUP).
 */
void config_diff(const refitd_config_t *a, const refitd_config_t *b,
		 void (*fn)(void *ctx, const char *key, bool reloadable), void *ctx);
/* Copy the reloadable keys of fresh into running. */
void config_apply_reloadable(refitd_config_t *running, const refitd_config_t *fresh);
/* The effective configuration as JSON, every key. */
void config_dump(const refitd_config_t *c, strbuf_t *out);
/* Every key as its flag (--lease-ttl-ms), two lines each: the value (its
 * kind or choices), bounds, default, whether reloadable; then the help. */
void config_help(strbuf_t *out);

#endif
