/*
 * coord.h - the coordinator role: membership with leases and epochs, and
 * the layout registry.  All state is owned by the daemon's libuv loop
 * thread; RPC handlers run there (see rpc.h).
 */
#ifndef REFIT_DAEMON_COORD_COORD_H
#define REFIT_DAEMON_COORD_COORD_H

#include <uv.h>

#include "rpc/rpc.h"

typedef struct coord_opts {
	uint32_t lease_ttl_ms;  /* a member is removed this long after its last beat */
	uint32_t heartbeat_ms;  /* what members are told to use */
	const char *state_file; /* NULL: nothing survives a restart (state_store file) */
	const char *state_store; /* "file" (NULL too) or "etcd" (docs/ha.md) */
	const char *etcd_endpoints; /* etcd: "host:port,..." */
	const char *etcd_prefix;    /* etcd: the keys' prefix ("/refit") */
	rpc_tls_t etcd_tls;         /* etcd: ca_file to verify it, cert + key (none: plain) */
	uint32_t etcd_lease_ttl_ms; /* etcd: the election lease (whole seconds, rounded up) */
	size_t etcd_chunk_bytes;    /* etcd: the state's chunks' maximum size (0: default) */
	const char *advertise;      /* etcd: this coordinator's address, as standbys name it */
	uint64_t staging_bytes; /* plans: relay data a rank holds per round (0: default) */
	bool nic_per_node;      /* plans: one NIC per node, shared by its ranks */
	rpc_async_t *rpc;       /* the process's client for calls to nodes (not owned) */
	uint64_t instance_grace_ms; /* an instance whose node left is dropped after
				       this long (0: 60 s) */
	uint64_t slice_timeout_ms;  /* every slice's deadline (RunSliceRequest.timeout_ms;
				       0: derived from each plan's modelled time) */
	uint32_t refit_records;     /* refit records kept, the newest (0: 256); the
				       oldest final ones beyond are freed */
	bool default_on_ready;      /* a new model's trigger policy: on_ready (else manual) */
	uint32_t default_min_interval_ms; /* and its min_interval_ms */
	uint32_t test_hold_publish_ms; /* tests: the decision durable, Publish held this long */
} coord_opts_t;

typedef struct coord coord_t;

/* Create on loop and register the Coordinator service on srv. */
coord_t *coord_new(uv_loop_t *loop, rpc_server_t *srv, const coord_opts_t *o,
		   refit_err_t *err);
/* New lease and heartbeat figures (SIGHUP). */
void coord_set_timing(coord_t *c, uint32_t lease_ttl_ms, uint32_t heartbeat_ms);
/*
 * Stop timers, wait for node calls and plans in flight, free, then call
 * done(arg) on the loop (run the loop after).  NULL: done is called at once.
 */
void coord_close(coord_t *c, void (*done)(void *arg), void *arg);

#endif
