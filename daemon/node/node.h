/*
 * node.h - the node role: joins the coordinator, keeps its lease, and
 * serves refit.v1.Node (epoch preparation with fencing, slices, aborts).
 * State is owned by the daemon's loop thread.
 */
#ifndef REFIT_DAEMON_NODE_NODE_H
#define REFIT_DAEMON_NODE_NODE_H

#include "rpc/rpc.h"

typedef struct node_opts {
	const char *coordinator;  /* coordinator address */
	const char *node_id;
	const char *advertise;    /* where the coordinator reaches our Node service */
	const char *domain;       /* NULL = node_id */
	const int32_t *ranks;
	size_t nranks;
	uint32_t heartbeat_ms;    /* until the coordinator says otherwise */
	rpc_client_opts_t client; /* TLS / token towards the coordinator */
	const char *transport;    /* data-plane backend: "tcp" */
	const char *data_listen;  /* tcp: host:port */
	const char *data_advertise; /* NULL: the bound data_listen */
	bool source_check;        /* tcp: data_source_check */
	bool data_tls;            /* tcp: TLS with client.tls's files */
	const char *local_socket; /* unix socket path for librefit */
	const char *local_socket_group; /* the sockets' group (mode 0660); NULL: ours */
	uint64_t slice_timeout_ms;  /* 0: the coordinator's (RunSliceRequest.timeout_ms) */
	uint64_t connect_timeout_ms; /* each data connection to a peer (0: 5000) */
	uint64_t delta_base_bytes;  /* host memory for delta bases (0: none kept) */
	uint64_t test_msg_delay_ms;
	uint64_t test_fail_commit;  /* tests: refuse the Nth Commit (0: none) */
	uint64_t test_lose_publish; /* tests: lose every Nth refit's Publish until joined again */
	uint64_t test_hold_run_ms;  /* tests: hold RunSlice until its Abort (0: no) */
	const char *cuda_library, *nccl_library, *gpu_kernels_library; /* nccl */
	const char *gpu_devices;  /* nccl: "0,1,..." (NULL: local rank i -> device i) */
	uint64_t gpu_staging_budget;  /* nccl: each rank's GPU staging arena, bytes */
	rpc_async_t *rpc;         /* the process's client for calls (not owned) */
	/* called once on the loop when the node must stop: its transport
	 * poisoned it and exit_poisoned is set (config poisoned_exit), or a
	 * sticky CUDA error killed its device's context (always: nothing of
	 * the process's CUDA works again).  Otherwise a poisoned node stays
	 * up, reports it and refuses refits. */
	void (*poisoned_exit)(void *arg);
	void *poisoned_exit_arg;
	bool exit_poisoned;
} node_opts_t;

/* refitd's exit status after poisoned_exit (EX_TEMPFAIL): not 0, so
 * systemd's Restart=on-failure starts it again */
#define NODE_EXIT_POISONED 75

typedef struct node node_t;

node_t *node_new(uv_loop_t *loop, rpc_server_t *srv, const node_opts_t *o,
		 refit_err_t *err);
/* New heartbeat interval (SIGHUP). */
void node_set_heartbeat(node_t *n, uint32_t heartbeat_ms);
/* A join token is configured (SIGHUP): the Node service answers only
 * calls presenting this process's session (the coordinator's), or, false,
 * anyone who reaches it. */
void node_set_bound(node_t *n, bool bound);
/* Leave the membership (best effort, bounded) and free when done. */
void node_close(node_t *n);

#endif
