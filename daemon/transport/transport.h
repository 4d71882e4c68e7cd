/*
 * transport.h - the data-plane transport interface, one implementation per
 * backend (tcp.c, nccl.c), looked up by name.  Every backend fills every
 * slot (XPORT_OPS builds the table), so the node and the slice executor
 * have one path whatever the backend.
 *
 * A transport instance lives as long as the node daemon: it owns what
 * accepts peers (the tcp listener) or the communicators (nccl).  The node
 * tells it the epoch and the epoch's token (set_epoch) and the epoch's
 * ranks (set_world); peers of other epochs or with another token are
 * refused and logged.  A session carries one refit's messages between this
 * node and its peers: opened with the peers it sends to and receives from,
 * run with exchange until the executor says it is done, then closed.
 *
 * Messages are whole: the receiver gets the bytes the sender packed.  How
 * they move is the backend's: a stream (tcp, both directions of every pair
 * at once, each message named by a sequence number) or groups of
 * point-to-point operations posted in the same order on every node (nccl).
 * Everything is bounded by the session's deadline and its abort flag;
 * nothing waits forever.
 *
 * Threads: a session is driven by one thread (the executor's), never the
 * node's loop thread; set_epoch and set_world may be called from any thread.
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
	uint64_t gpu_staging_budget; /* nccl: each rank's staging arena (0: 1 GiB) */
	/* tcp, data_tls: TLS 1.3 on every data connection with this node's
	 * certificate and key and the cluster CA (PEM files); NULL: plain */
	const char *tls_cert, *tls_key, *tls_ca;
	/* tcp: refuse a data connection naming a member from another address
	 * than its registered data endpoint's; dial from the bound address */
	bool source_check;
	/* tcp: a data connection refused (any thread): the peer's address, a
	 * reason (token, source, epoch, handshake, full) and what happened;
	 * NULL: each is logged */
	void (*refused)(void *ctx, const char *host, const char *reason, const char *msg);
	void *refused_ctx;
} xport_cfg_t;

typedef struct xport_peer {
	const char *node_id;
	const char *endpoint; /* tcp: host:port */
	bool send_to;         /* this node sends to the peer in this refit */
	bool recv_from;       /* ... receives from it */
	uint64_t max_in_bytes;/* its largest message to this node in this refit (the
				 receive buffer's size; a peer announcing more is refused) */
} xport_peer_t;

/*
 * What a session saw wrong with one peer's link, so that the coordinator can
 * name the broken link rather than a bystander (docs/faults.md, "Failure
 * attribution").  Backends without such detail (nccl) leave it XPORT_LINK_OK.
 */
typedef enum xport_link_fault {
	XPORT_LINK_OK = 0,
	XPORT_LINK_CONNECT,     /* this node could not connect to the peer's data port */
	XPORT_LINK_HANDSHAKE,   /* it connected, but the peer refused or never answered */
	XPORT_LINK_BROKEN,      /* a connection failed: this node sending to the peer */
	XPORT_LINK_NO_DIAL,     /* the peer never connected to this node */
	XPORT_LINK_BROKEN_IN,   /* a connection failed: the peer sending to this node */
} xport_link_fault_t;

typedef struct xport_link {
	xport_link_fault_t fault;
	char what[128];          /* the error: "Connection timed out", "wrong token" */
} xport_link_t;

/* A client's CUDA IPC event (cudaIpcEventHandle_t), recorded on the
 * stream that wrote its memory, after the writes (WeightsReady). */
#define XPORT_EVENT_BYTES 64
typedef struct xport_event {
	uint8_t handle[XPORT_EVENT_BYTES];
	uint64_t client;          /* the librefit client that gave it (for errors) */
} xport_event_t;

typedef struct xport_session_cfg {
	uint64_t refit_id, epoch;
	uint32_t attempt;        /* the coordinator's attempt of the refit: a
				    connection of another attempt is never taken */
	const xport_peer_t *peers;
	size_t npeers;
	uint64_t max_msg_bytes;  /* a peer announcing more is refused */
	int64_t deadline_ms;     /* CLOCK_MONOTONIC ms */
	atomic_int *abort;       /* nonzero: stop at once */
	dp_pool_t *pool;         /* host receive buffers from here (NULL: malloc) */
	uint64_t connect_ms;     /* each dial (connect and handshake) fails after this
				    long (0: only the deadline bounds it) */
	xport_link_t *links;     /* per peer: what went wrong with its link, set by
				    open and exchange when they fail (NULL: not wanted;
				    the caller zeroes it) */
	/* device memory: the ready events of the clients this refit reads;
	 * open makes every device operation of the session wait for them (nccl:
	 * each local stream, cudaStreamWaitEvent) -- their asynchronous writes
	 * land before the first read.  Host transports ignore them. */
	const xport_event_t *events;
	size_t nevents;
	/* device memory: the most GPU staging one of this node's ranks needs at
	 * once for the session's groups (plan_gpu_staging_ranks), and that
	 * rank; open refuses more than a rank's budget before anything is
	 * allocated (0: not said) */
	uint64_t staging_need;
	int32_t staging_rank;
} xport_session_cfg_t;

/* One point-to-point operation of a group (grouped backends). */
typedef struct xport_op {
	bool send;
	int32_t rank, peer;       /* global ranks: ours and the other end */
	void *buf;                /* device memory */
	uint64_t bytes;
} xport_op_t;

/*
 * What the executor gives an exchange: callbacks on the session's thread.
 * The executor offers its messages in two forms and each backend drives
 * the one it can move; the executor itself has one path (open, exchange,
 * close) whatever the backend.
 *
 * As a stream (tcp): begin once, then pull and push per peer, in any
 * interleaving, until done.
 *
 * As groups (nccl): next_group hands the next group of operations, their
 * buffers packed on the devices, in an order every node computes the same
 * from the plan (so both ends of a message meet in one group); the backend
 * runs the group to completion and calls group_done, until next_group
 * says *end.
 */
typedef struct xport_io {
	void *arg;
	/* Stream: before the first pull: what needs no transfer runs now. */
	refit_status_t (*begin)(void *arg, refit_err_t *err);
	/*
	 * Stream: the next message for peer, if one may go now: buf and len
	 * point at the packed bytes (owned by the executor, valid until the next
	 * pull for that peer), seq names it for the receiver (messages may go in
	 * any order); *len == UINT64_MAX: nothing now.
	 */
	refit_status_t (*pull)(void *arg, size_t peer, const uint8_t **buf, uint64_t *len,
			       uint64_t *seq, refit_err_t *err);
	/* Stream: a whole message arrived from peer, with the seq its sender gave it. */
	refit_status_t (*push)(void *arg, size_t peer, uint64_t seq, const uint8_t *buf,
			       uint64_t len, refit_err_t *err);
	/* Stream: everything sent and received: the exchange returns. */
	bool (*done)(void *arg);
	/* Stream: every message expected from peer has arrived (its end may close). */
	bool (*peer_done)(void *arg, size_t peer);
	/* Groups: the next group (n may be 0: only copies), or *end: none left. */
	refit_status_t (*next_group)(void *arg, const xport_op_t **ops, size_t *n, bool *end,
				     refit_err_t *err);
	/* Groups: the group handed last has run: its arrivals are unpacked. */
	refit_status_t (*group_done)(void *arg, refit_err_t *err);
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
	/* tcp: the epoch's members by node id, each with the SHA-256 of its
	 * data-plane token (a connection naming a node presents that token) */
	const char *const *peers;
	const uint8_t (*verifiers)[32];
	/* ... and the data endpoint each registered ("host:port"): with
	 * source_check, a connection naming a member whose host is a numeric
	 * address (not a wildcard) must come from that address */
	const char *const *endpoints;
	size_t npeers;
} xport_world_t;

/* A node's state as its transport says (xport_ops_t.poisoned). */
typedef enum xport_poison {
	XPORT_POISON_NONE = 0,
	XPORT_POISON_KEPT,  /* memory kept for work that never ended: no more refits */
	XPORT_POISON_DEAD,  /* the device's context is dead: the process must restart */
} xport_poison_t;

/* Where a backend moves data from: the clients' memory it takes. */
typedef enum xport_mem {
	XPORT_MEM_HOST,    /* shared host memory (memfd / shm segments) */
	XPORT_MEM_DEVICE,  /* GPU memory, given as CUDA IPC handles (mem_open) */
} xport_mem_t;

/*
 * A backend fills every slot; the callers never test one for NULL.  What a
 * backend has no use for it answers plainly: tcp's set_world does nothing,
 * its unique_id and mem_open are refused with an error naming the
 * transport, its dev is NULL (host memory: the executor copies itself).
 */
typedef struct xport_ops {
	const char *name;
	xport_mem_t memory;
	/* NULL when the backend can run here, else why it cannot */
	const char *(*unavailable)(void);
	refit_status_t (*start)(const xport_cfg_t *cfg, xport_t **out, refit_err_t *err);
	/* The endpoint peers reach this node at (after start). */
	const char *(*endpoint)(xport_t *x);
	void (*set_epoch)(xport_t *x, uint64_t epoch, const uint8_t *token, size_t len);
	/* The epoch's ranks and communicator id (at PrepareEpoch). */
	void (*set_world)(xport_t *x, const xport_world_t *w);
	/* A new communicator id (on the lowest rank's node). */
	refit_status_t (*unique_id)(xport_t *x, uint8_t *out, size_t *len, refit_err_t *err);
	refit_status_t (*open)(xport_t *x, const xport_session_cfg_t *cfg,
			       xport_session_t **out, refit_err_t *err);
	/* The session's device memory operations (NULL: host memory). */
	const dp_dev_ops_t *(*dev)(xport_session_t *s);
	/* Move every message of the session, bounded by its deadline and abort
	 * flag (grouped: a failure aborts the communicators). */
	refit_status_t (*exchange)(xport_session_t *s, const xport_io_t *io,
				   refit_err_t *err);
	void (*close)(xport_session_t *s);
	void (*stop)(xport_t *x);
	/*
	 * Client memory from a CUDA IPC handle, opened on rank's device; uuid:
	 * the UUID (16 bytes) of the GPU the client says it allocated on (NULL:
	 * not said), else device: the ordinal it says (-1: not said; an ordinal
	 * of the client's process); bytes: the allocation's size the client
	 * gives; all are checked against the memory.  mem_close unmaps what
	 * mem_open gave.
	 */
	refit_status_t (*mem_open)(xport_t *x, int32_t rank, const void *ipc, size_t len,
				   int32_t device, const uint8_t *uuid, uint64_t bytes,
				   void **base, refit_err_t *err);
	void (*mem_close)(xport_t *x, void *base);
	/*
	 * Whether this node runs no more refits until refitd restarts, and why
	 * (into why, len bytes): nccl's poisoning (work on a stream never ended,
	 * even after its communicators were aborted; the memory it may still
	 * write is kept), or a sticky CUDA error (the device's context is dead:
	 * the process must exit).  Any thread.  tcp: never.
	 */
	xport_poison_t (*poisoned)(xport_t *x, char *why, size_t len);
} xport_ops_t;

/* A backend's table from its functions prefix_name: a slot left out does
 * not compile. */
#define XPORT_OPS(label, mem, p)                                                          \
	{                                                                                 \
		.name = label, .memory = mem, .unavailable = p##_unavailable,             \
		.start = p##_start, .endpoint = p##_endpoint, .set_epoch = p##_set_epoch, \
		.set_world = p##_set_world, .unique_id = p##_unique_id, .open = p##_open, \
		.dev = p##_dev, .exchange = p##_exchange, .close = p##_close,             \
		.stop = p##_stop, .mem_open = p##_mem_open, .mem_close = p##_mem_close,  \
		.poisoned = p##_poisoned,                                                 \
	}

/* The backend called name, or NULL (then *known lists the names). */
const xport_ops_t *xport_lookup(const char *name);
/* Comma-separated names of every backend compiled in. */
const char *xport_names(void);

extern const xport_ops_t xport_tcp_ops;
extern const xport_ops_t xport_nccl_ops;

/* CLOCK_MONOTONIC in ms. */
int64_t xport_now_ms(void);

#endif
