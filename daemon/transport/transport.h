/*
 * transport.h - the data-plane transport interface, one implementation per
 * backend (tcp.c, nccl.c), looked up by name.
 *
 * A transport instance lives as long as the node daemon: it owns what
 * accepts peers (the tcp listener).  The node tells it the epoch and the
 * epoch's token (xport_set_epoch); peers of other epochs or with another
 * token are refused and logged.  A session carries one refit's messages
 * between this node and its peers: opened with the peers it sends to and
 * receives from, run with xport_exchange until the executor says it is
 * done, then closed (or aborted).
 *
 * Messages on a session are whole: the sender hands a packed buffer and a
 * sequence number naming it, the receiver gets the same bytes and number.
 * Both directions of every pair move at once.  Everything is bounded by the
 * session's deadline and its abort flag; nothing waits forever.
 *
 * Threads: a session is driven by one thread (the executor's), never the
 * node's loop thread; xport_set_epoch may be called from any thread.
 */
#ifndef REFIT_DAEMON_TRANSPORT_H
#define REFIT_DAEMON_TRANSPORT_H

#include "dataplane/pool.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "dataplane/exec.h"

#define XPORT_TOKEN_MAX 64

typedef struct xport xport_t;
typedef struct xport_session xport_session_t;

typedef struct xport_cfg {
	const char *listen;   /* tcp: "host:port" to accept peers on (port 0: any) */
	const char *node_id;  /* names this node in handshakes and logs */
	const int32_t *ranks; /* this node's ranks, as configured */
	size_t nranks;
	const char *gpu_devices; /* nccl: "0,1,..." device of each rank (NULL: identity) */
} xport_cfg_t;

typedef struct xport_peer {
	const char *node_id;
	const char *endpoint; /* tcp: host:port */
	bool send_to;         /* this node sends to the peer in this refit */
	bool recv_from;       /* ... receives from it */
	uint64_t max_in_bytes;/* its largest message to this node in this refit (the
				 receive buffer's size; a peer announcing more is refused) */
} xport_peer_t;

typedef struct xport_session_cfg {
	uint64_t refit_id, epoch;
	const xport_peer_t *peers;
	size_t npeers;
	uint64_t max_msg_bytes;  /* a peer announcing more is refused */
	int64_t deadline_ms;     /* CLOCK_MONOTONIC ms */
	atomic_int *abort;       /* nonzero: stop at once */
	dp_pool_t *pool;         /* host receive buffers from here (NULL: malloc) */
} xport_session_cfg_t;

/* What the executor gives an exchange: callbacks on the session's thread. */
typedef struct xport_io {
	void *arg;
	/*
	 * The next message for peer, if one may go now: buf and len point at the
	 * packed bytes (owned by the executor, valid until the next pull for
	 * that peer), seq names it for the receiver (messages may go in any
	 * order); *len == UINT64_MAX: nothing now.
	 */
	refit_status_t (*pull)(void *arg, size_t peer, const uint8_t **buf, uint64_t *len,
			       uint64_t *seq, refit_err_t *err);
	/* A whole message arrived from peer, with the seq its sender gave it. */
	refit_status_t (*push)(void *arg, size_t peer, uint64_t seq, const uint8_t *buf,
			       uint64_t len, refit_err_t *err);
	/* Everything sent and received: the exchange returns. */
	bool (*done)(void *arg);
	/* Every message expected from peer has arrived (its end may close). */
	bool (*peer_done)(void *arg, size_t peer);
} xport_io_t;

/* The ranks of an epoch (grouped backends: communicator rank = index). */
typedef struct xport_world {
	uint64_t epoch;
	const int32_t *ranks;     /* every rank of the epoch, ascending */
	size_t nranks;
	const int32_t *local;     /* this node's ranks */
	size_t nlocal;
	const uint8_t *id;        /* nccl: the unique id from the lowest rank's node */
	size_t id_len;
} xport_world_t;

/* One point-to-point operation of a group (grouped backends). */
typedef struct xport_op {
	bool send;
	int32_t rank, peer;       /* global ranks: ours and the other end */
	void *buf;                /* device memory */
	uint64_t bytes;
} xport_op_t;

typedef struct xport_ops {
	const char *name;
	/* NULL when the backend can run here, else why it cannot */
	const char *(*unavailable)(void);
	refit_status_t (*start)(const xport_cfg_t *cfg, xport_t **out, refit_err_t *err);
	/* The endpoint peers reach this node at (after start). */
	const char *(*endpoint)(xport_t *x);
	void (*set_epoch)(xport_t *x, uint64_t epoch, const uint8_t *token, size_t len);
	refit_status_t (*open)(xport_t *x, const xport_session_cfg_t *cfg,
			       xport_session_t **out, refit_err_t *err);
	refit_status_t (*exchange)(xport_session_t *s, const xport_io_t *io,
				   refit_err_t *err);
	void (*close)(xport_session_t *s);
	void (*stop)(xport_t *x);
	/*
	 * Grouped backends (nccl) only; NULL for stream backends (tcp).
	 * set_world: the epoch's ranks and id (at PrepareEpoch).  unique_id:
	 * a new communicator id (on the lowest rank's node).  group: run ops as
	 * one group, to completion, bounded by the session's deadline and abort
	 * flag (a failure aborts the communicators).  dev: the session's device
	 * memory operations.  mem_open/mem_close: client memory from a CUDA IPC
	 * handle, opened on rank's device; device: the ordinal the client says
	 * it allocated on (-1: not said), bytes: the allocation's size the
	 * client gives; both are checked against the memory.
	 */
	void (*set_world)(xport_t *x, const xport_world_t *w);
	refit_status_t (*unique_id)(xport_t *x, uint8_t *out, size_t *len, refit_err_t *err);
	refit_status_t (*group)(xport_session_t *s, const xport_op_t *ops, size_t n,
				refit_err_t *err);
	const dp_dev_ops_t *(*dev)(xport_session_t *s);
	refit_status_t (*mem_open)(xport_t *x, int32_t rank, const void *ipc, size_t len,
				   int32_t device, uint64_t bytes, void **base, refit_err_t *err);
	void (*mem_close)(xport_t *x, void *base);
} xport_ops_t;

/* The backend called name, or NULL (then *known lists the names). */
const xport_ops_t *xport_lookup(const char *name);
/* Comma-separated names of every backend compiled in. */
const char *xport_names(void);

extern const xport_ops_t xport_tcp_ops;
extern const xport_ops_t xport_nccl_ops;

/* CLOCK_MONOTONIC in ms. */
int64_t xport_now_ms(void);

#endif
