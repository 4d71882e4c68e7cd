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
 * Messages on a session are whole: the sender hands a packed buffer, the
 * receiver gets the same bytes, in the order sent per (sender, receiver).
 * Both directions of every pair move at once.  Everything is bounded by the
 * session's deadline and its abort flag; nothing waits forever.
 *
 * Threads: a session is driven by one thread (the executor's), never the
 * node's loop thread; xport_set_epoch may be called from any thread.
 */
#ifndef REFIT_DAEMON_TRANSPORT_H
#define REFIT_DAEMON_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define XPORT_TOKEN_MAX 64

typedef struct xport xport_t;
typedef struct xport_session xport_session_t;

typedef struct xport_cfg {
	const char *listen;   /* tcp: "host:port" to accept peers on (port 0: any) */
	const char *node_id;  /* names this node in handshakes and logs */
} xport_cfg_t;

typedef struct xport_peer {
	const char *node_id;
	const char *endpoint; /* tcp: host:port */
	bool send_to;         /* this node sends to the peer in this refit */
	bool recv_from;       /* ... receives from it */
} xport_peer_t;

typedef struct xport_session_cfg {
	uint64_t refit_id, epoch;
	const xport_peer_t *peers;
	size_t npeers;
	uint64_t max_msg_bytes;  /* a peer announcing more is refused */
	int64_t deadline_ms;     /* CLOCK_MONOTONIC ms */
	atomic_int *abort;       /* nonzero: stop at once */
} xport_session_cfg_t;

/* What the executor gives an exchange: callbacks on the session's thread. */
typedef struct xport_io {
	void *arg;
	/*
	 * The next message for peer, if one may go now: buf and len point at the
	 * packed bytes (owned by the executor, valid until the next pull for
	 * that peer); *len == UINT64_MAX: nothing now.
	 */
	refit_status_t (*pull)(void *arg, size_t peer, const uint8_t **buf, uint64_t *len,
			       refit_err_t *err);
	/* A whole message arrived from peer. */
	refit_status_t (*push)(void *arg, size_t peer, const uint8_t *buf, uint64_t len,
			       refit_err_t *err);
	/* Everything sent and received: the exchange returns. */
	bool (*done)(void *arg);
	/* Every message expected from peer has arrived (its end may close). */
	bool (*peer_done)(void *arg, size_t peer);
} xport_io_t;

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
