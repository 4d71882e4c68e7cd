/*
 * etcd.h - a small synchronous etcd v3 client: the KV and Lease calls the
 * coordinator's state store and leader election need (daemon/coord/
 * coord_backend_etcd.c, coord_leader.c), spoken over gRPC core with the
 * protobuf-c messages of proto/etcd/ (etcd's own API, a subset).
 *
 * Endpoints are a comma-separated list of host:port; a call that finds its
 * endpoint unreachable (UNAVAILABLE, deadline) is tried on the next one,
 * each once.  Errors name etcd, the endpoint and the method.  Not TLS yet.
 * One client per thread (each call blocks its thread until answered or its
 * deadline passes).
 */
#ifndef REFIT_RPC_ETCD_H
#define REFIT_RPC_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct etcd etcd_t;

/* A key as read: key NULL when it does not exist. */
typedef struct etcd_kv {
	char *key;
	char *value;             /* NUL-terminated copy */
	size_t value_len;
	int64_t create_rev, mod_rev, lease;
	int64_t read_rev;        /* the store's revision when read (etcd_get,
				    etcd_first_created): watch from read_rev + 1 */
} etcd_kv_t;

/* endpoints "h1:p1,h2:p2"; timeout_ms bounds each call.  NULL on bad input. */
struct rpc_tls;
/* tls: ca_file verifies etcd's certificate (by each endpoint's host, or
 * tls->server_name), cert_file + key_file for etcd's --client-cert-auth;
 * NULL or no ca_file: plaintext */
etcd_t *etcd_new(const char *endpoints, int64_t timeout_ms, const struct rpc_tls *tls,
		 refit_err_t *err);
void etcd_free(etcd_t *e);
/* The endpoint the last call used. */
const char *etcd_endpoint(const etcd_t *e);
void etcd_kv_fini(etcd_kv_t *kv);
/* The end of the range of keys starting with prefix (prefix + 1 in its
 * last byte that is not 0xff; heap, the caller frees).  A prefix of only
 * 0xff bytes has no such end: "" (refit's prefixes end in '/'). */
char *etcd_prefix_end(const char *prefix);

/* Read key (out->key NULL: absent). */
refit_status_t etcd_get(etcd_t *e, const char *key, etcd_kv_t *out, refit_err_t *err);
/* The key under prefix with the lowest create revision (out->key NULL: none). */
refit_status_t etcd_first_created(etcd_t *e, const char *prefix, etcd_kv_t *out,
				  refit_err_t *err);
/* Create key = value attached to lease unless it exists; *create_rev: its
 * create revision (made now or earlier). */
refit_status_t etcd_create(etcd_t *e, const char *key, const char *value, int64_t lease,
			   int64_t *create_rev, refit_err_t *err);
/*
 * Put key = value (len bytes) if guard's create revision is guard_rev, in
 * one Txn (fencing: guard is the leader's election key).  *ok false: the
 * guard failed and nothing was written.
 */
refit_status_t etcd_put_if(etcd_t *e, const char *guard, int64_t guard_rev, const char *key,
			   const char *value, size_t len, bool *ok, refit_err_t *err);
/* One operation of etcd_txn_if: put key = value (len bytes), or delete key. */
typedef struct etcd_op {
	const char *key;
	const char *value;
	size_t len;
	bool del;
} etcd_op_t;
/*
 * The n operations (etcd's --max-txn-ops bounds n, 128 by default) in one
 * Txn if guard's create revision is guard_rev (as etcd_put_if).  *ok false:
 * the guard failed and nothing was done.
 */
refit_status_t etcd_txn_if(etcd_t *e, const char *guard, int64_t guard_rev,
			   const etcd_op_t *ops, size_t n, bool *ok, refit_err_t *err);
/* The keys under prefix, keys only (*keys: heap array of heap strings, the
 * caller frees each and it; *n how many). */
refit_status_t etcd_keys(etcd_t *e, const char *prefix, char ***keys, size_t *n,
			 refit_err_t *err);
/* Delete key (absent: fine). */
refit_status_t etcd_delete(etcd_t *e, const char *key, refit_err_t *err);

/* A lease of ttl_s seconds; *id its id. */
refit_status_t etcd_lease_grant(etcd_t *e, int64_t ttl_s, int64_t *id, refit_err_t *err);
/* Renew lease id; *ttl_s: the TTL left (0: the lease is gone). */
refit_status_t etcd_lease_keepalive(etcd_t *e, int64_t id, int64_t *ttl_s, refit_err_t *err);
refit_status_t etcd_lease_revoke(etcd_t *e, int64_t id, refit_err_t *err);

/* For rpc/etcd_watch.c: the number of endpoints; endpoint i's address and
 * client (its channel carries the TLS of etcd_new); whether TLS. */
size_t etcd_endpoint_count(const etcd_t *e);
struct rpc_client *etcd_endpoint_client(etcd_t *e, size_t i, const char **addr);
bool etcd_tls(const etcd_t *e);

#endif
