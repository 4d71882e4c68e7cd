/*
 * tcp_internal.h - what the files of the tcp transport share: the wire
 * format (handshake, frames), the listener's and a session's state, and
 * what tcp_dial.c offers tcp.c.  tcp.c (the listener, sessions, the
 * exchange) calls tcp_dial.c (dials, endpoints, link faults), never the
 * other way.  Threads as in tcp.c.
 */
#ifndef REFIT_DAEMON_TRANSPORT_TCP_INTERNAL_H
#define REFIT_DAEMON_TRANSPORT_TCP_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "common/alloc.h"
#include "common/wire.h"
#include "daemon/transport/transport.h"


#define HS_MAGIC 0x32544652u    /* "RFT2" (RFT1: no attempt) */
#define FRAME_MAGIC 0x4d544652u /* "RFTM" */
#define FRAME_BYTES 24          /* magic, length, seq: u64 each */
#define HS_NODE_ID 128          /* node id bytes in a handshake, NUL-padded */
/* handshake: magic u32, token length u32, epoch u64, refit id u64,
 * attempt u32 (all little-endian), then the token and the node id at
 * these offsets.  The attempt: a connection a peer made for an attempt
 * that was aborted (parked here after this node's session of it ended)
 * is never taken by the next attempt of the same refit, whose session
 * would read its close as a broken link */
#define HS_AT_TOKEN (4 + 4 + 8 + 8 + 4)
#define HS_AT_NODE (HS_AT_TOKEN + XPORT_TOKEN_MAX)
#define HS_BYTES (HS_AT_NODE + HS_NODE_ID)
#define HS_TIMEOUT_MS 5000
#define PARK_MAX 1024
#define PENDING_MAX 256
#define SLICE_MS 50             /* how often blocking waits look at the abort flag */

enum { HS_OK = 0, HS_BAD_EPOCH = 1, HS_BAD_TOKEN = 2, HS_BAD_MAGIC = 3, HS_FULL = 4,
       HS_BAD_SOURCE = 5 };

/* A numeric IPv4 or IPv6 address (v4-mapped v6 kept as v4); fam 0: none. */
typedef struct tcp_ip {
	int fam;
	uint8_t a[16];
} tcp_ip_t;

typedef struct hs {
	uint32_t magic, token_len;
	uint64_t epoch, refit_id;
	uint32_t attempt;
	uint8_t token[XPORT_TOKEN_MAX];
	char node_id[HS_NODE_ID];
} hs_t;

typedef struct parked {
	int fd;
	uint64_t refit_id, epoch;
	uint32_t attempt;
	char node_id[HS_NODE_ID];
	int64_t at_ms;
} parked_t;

struct xport {
	int lfd, wake[2];
	pthread_t thr;
	char endpoint[300];
	char *node_id;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t epoch;
	uint8_t token[XPORT_TOKEN_MAX];  /* this node's own, sent when it dials */
	size_t token_len;
	/* the epoch's members: a connection naming one presents the token
	 * whose SHA-256 is its verifier (none: every peer presents token) */
	VEC(struct peer_verifier { char *node_id; uint8_t v[32]; tcp_ip_t ip; }) peers;
	bool source_check;               /* xport_cfg_t.source_check */
	void (*refused)(void *, const char *, const char *, const char *); /* cfg's */
	void *refused_ctx;
	tcp_ip_t bound;                  /* the listening address (fam 0: a wildcard) */
	VEC(parked_t) parked;
	bool stopping;
	struct tcp_tls *tls;             /* data_tls (tcp_tls.c); NULL: plain */
};

typedef struct conn {
	int fd;
	struct ssl_st *ssl;     /* data_tls: the connection's TLS (NULL: plain) */
	bool tls_done;          /* its handshake finished */
	/* outgoing */
	uint8_t hdr[FRAME_BYTES];
	const uint8_t *buf;
	uint64_t len, off;      /* off counts header + payload */
	bool busy, idle;        /* idle: pull said nothing now */
	uint64_t seq;
	/* incoming */
	uint8_t rhdr[FRAME_BYTES];
	uint8_t *rbuf;
	uint64_t rlen, roff;
	uint64_t rseq;          /* messages received */
	uint64_t rmsg;          /* the seq of the one arriving */
} conn_t;

struct xport_session {
	xport_t *x;
	xport_session_cfg_t cfg;
	xport_peer_t *peers;
	conn_t *out, *in;       /* per peer; fd -1 when unused */
};

/* tcp_listen.c: ep ("host:port", host maybe [v6]) into host and port; REFIT_OK or err */
refit_status_t tcp_split_endpoint(const char *ep, char *host, size_t hn, char *port,
				  size_t pn, refit_err_t *err);
/* tcp_listen.c: the numeric host of ep ("host:port") as an address (a
 * name, a wildcard or no host: fam 0); of a socket address; printed */
void tcp_ip_of_endpoint(const char *ep, tcp_ip_t *ip);
void tcp_ip_of_sockaddr(const struct sockaddr *sa, tcp_ip_t *ip);
const char *tcp_ip_str(const tcp_ip_t *ip, char *buf, size_t n);
/* Note what went wrong with peer i's link (the first thing only). */
void tcp_link_fault(xport_session_t *s, size_t i, xport_link_fault_t f, const char *what);
/* Dial every peer s sends to, all at once; s->out[i].fd holds each link made. */
refit_status_t tcp_dial_all(xport_session_t *s, refit_err_t *err);


/* tcp_listen.c: the listener thread of x (arg), until x->wake is written. */
void *tcp_listener(void *arg);

/* tcp_tls.c (data_tls): this node's certificate and key and the CA to
 * verify peers with, as a TLS 1.3 context, rebuilt when the files change
 * (checked as each session starts). */
typedef struct tcp_tls {
	char *ca, *cert, *key;
	uint64_t stamp[9];          /* the files' inode, size, mtime (under mu) */
	struct ssl_ctx_st *ctx;     /* under mu */
	pthread_mutex_t mu;
	bool mu_init;
} tcp_tls_t;

/* REFIT_OK, or err naming the files and OpenSSL's reason. */
refit_status_t tcp_tls_new(const char *ca, const char *cert, const char *key,
			   tcp_tls_t **out, refit_err_t *err);
void tcp_tls_free(tcp_tls_t *t);
/* The TLS handshakes of every connection of s at once (after its refit
 * handshakes); each peer's certificate must name it.  REFIT_OK or err
 * (naming the peer; its link fault noted). */
refit_status_t tcp_tls_handshake_all(xport_session_t *s, refit_err_t *err);
/* send/recv through c's TLS: the count, 0 (closed) or -1 with errno (EAGAIN:
 * wait for the socket; EIO: broken). */
ssize_t tcp_tls_send(conn_t *c, const void *b, size_t n);
ssize_t tcp_tls_recv(conn_t *c, void *b, size_t n);
/* Has c decrypted bytes waiting (poll does not see them)? */
bool tcp_tls_pending(const conn_t *c);
void tcp_tls_conn_free(conn_t *c);

#endif
