/*
 * tcp_dial.c - the tcp transport's dialer (see tcp.c): a session's
 * connections to the peers it sends to, each a non-blocking connect to a
 * numeric address and the handshake (magic, epoch, token, refit id, node
 * id), all peers at once, each bounded by the session's connect_ms, its
 * deadline and its abort flag; what goes wrong with a link is noted per
 * peer (tcp_link_fault).  Runs on the thread driving the session (the
 * executor's), from tcp_open; calls nothing in tcp.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "daemon/transport/tcp_internal.h"

/* The handshake on the wire: each field little-endian, in order. */
static void
hs_encode(const hs_t *h, uint8_t *b)
{
	wire_put_le(b, h->magic, 4);
	wire_put_le(b + 4, h->token_len, 4);
	wire_put_le(b + 8, h->epoch, 8);
	wire_put_le(b + 16, h->refit_id, 8);
	wire_put_le(b + 24, h->attempt, 4);
	memcpy(b + HS_AT_TOKEN, h->token, XPORT_TOKEN_MAX);
	memcpy(b + HS_AT_NODE, h->node_id, HS_NODE_ID);
}

/* Note what went wrong with peer i's link (the first thing only). */
void
tcp_link_fault(xport_session_t *s, size_t i, xport_link_fault_t f, const char *what)
{
	xport_link_t *l = s->cfg.links ? &s->cfg.links[i] : NULL;

	if (l == NULL || l->fault != XPORT_LINK_OK)
		return;
	l->fault = f;
	snprintf(l->what, sizeof(l->what), "%s", what);
}

/*
 * Dials run concurrently: tcp_open starts one per peer it sends to, then
 * polls them all, each bounded by its own deadline (connect_ms from its
 * start, never past the session's), so one unreachable peer costs
 * connect_ms, not the slice deadline, and never delays the others.
 */
enum { D_CONNECT, D_SEND, D_ANSWER, D_DONE, D_FAILED };

typedef struct dialing {
	size_t peer;
	int fd, stage;          /* D_* */
	uint8_t hs[HS_BYTES];   /* the handshake to send */
	size_t off;             /* of it sent */
	int64_t start, deadline;
} dialing_t;

/* Dial d failed: close it, note the link, and keep the first error in err. */
static refit_status_t
dial_fail(xport_session_t *s, dialing_t *d, refit_status_t st, xport_link_fault_t f,
	  const char *what, refit_err_t *err, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));

static refit_status_t
dial_fail(xport_session_t *s, dialing_t *d, refit_status_t st, xport_link_fault_t f,
	  const char *what, refit_err_t *err, const char *fmt, ...)
{
	char msg[REFIT_ERR_MSG_MAX];
	va_list ap;

	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	d->stage = D_FAILED;
	if (f != XPORT_LINK_OK)
		tcp_link_fault(s, d->peer, f, what);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (err->status == REFIT_OK)
		refit_err_set(err, st, "%s", msg);
	return st;
}

/*
 * With the source check, a connection leaves from the address this node
 * listens on (its data endpoint's, when not a wildcard), so a host with
 * several addresses is seen by its peers where it registered; the port is
 * picked at connect (IP_BIND_ADDRESS_NO_PORT).  0, or -1 with errno.
 */
static int
bind_source(const xport_t *x, int fd, int fam)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1;

	if (!x->source_check || x->bound.fam == 0 || x->bound.fam != fam)
		return 0;
	memset(&ss, 0, sizeof(ss));
	if (fam == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;

		a->sin_family = AF_INET;
		memcpy(&a->sin_addr, x->bound.a, 4);
		sl = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

		a->sin6_family = AF_INET6;
		memcpy(&a->sin6_addr, x->bound.a, 16);
		sl = sizeof(*a);
	}
	(void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
	return bind(fd, (struct sockaddr *)&ss, sl);
}

/* Start dialing peer d->peer: a non-blocking connect to its numeric address. */
static void
dial_start(xport_session_t *s, dialing_t *d, int64_t now, refit_err_t *err)
{
	const xport_peer_t *p = &s->peers[d->peer];
	char host[256], port[32];
	/* numeric only: resolving a name could block past every deadline */
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICSERV | AI_NUMERICHOST};
	struct addrinfo *ai = NULL;
	hs_t h = {.magic = HS_MAGIC, .epoch = s->cfg.epoch, .refit_id = s->cfg.refit_id,
		    .attempt = s->cfg.attempt};
	refit_err_t e2;
	int rc;

	d->fd = -1;
	d->stage = D_CONNECT;
	d->start = now;
	d->deadline = s->cfg.deadline_ms;
	if (s->cfg.connect_ms && now + (int64_t)s->cfg.connect_ms < d->deadline)
		d->deadline = now + (int64_t)s->cfg.connect_ms;
	refit_err_clear(&e2);
	if (tcp_split_endpoint(p->endpoint, host, sizeof(host), port, sizeof(port), &e2) != REFIT_OK) {
		dial_fail(s, d, e2.status, XPORT_LINK_CONNECT, "not host:port", err, "%s",
			  e2.msg);
		return;
	}
	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc != 0) {
		dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_CONNECT, gai_strerror(rc), err,
			  "tcp: node \"%s\" at \"%s\": %s (data endpoints are numeric "
			  "addresses: set data_advertise)", p->node_id, p->endpoint,
			  gai_strerror(rc));
		return;
	}
	pthread_mutex_lock(&s->x->mu);
	h.token_len = (uint32_t)s->x->token_len;
	memcpy(h.token, s->x->token, s->x->token_len);
	pthread_mutex_unlock(&s->x->mu);
	snprintf(h.node_id, sizeof(h.node_id), "%s", s->x->node_id);
	hs_encode(&h, d->hs);
	d->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (d->fd < 0) {
		freeaddrinfo(ai);
		dial_fail(s, d, REFIT_ERR_SYS, XPORT_LINK_OK, NULL, err, "tcp: socket: %s",
			  strerror(errno));
		return;
	}
	if (bind_source(s->x, d->fd, ai->ai_family) < 0) {
		int e = errno;
		char b[64];

		freeaddrinfo(ai);
		dial_fail(s, d, REFIT_ERR_SYS, XPORT_LINK_OK, NULL, err, "tcp: cannot dial from "
			  "%s, the data address (data_source_check): %s",
			  tcp_ip_str(&s->x->bound, b, sizeof(b)), strerror(e));
		return;
	}
	rc = connect(d->fd, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	if (rc == 0)
		d->stage = D_SEND;
	else if (errno != EINPROGRESS)
		dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_CONNECT, strerror(errno), err,
			  "tcp: cannot reach node \"%s\" at %s: %s", p->node_id, p->endpoint,
			  strerror(errno));
}

/* Dial d ran out of time: say what it was waiting for. */
static void
dial_late(xport_session_t *s, dialing_t *d, refit_err_t *err)
{
	const xport_peer_t *p = &s->peers[d->peer];
	uint64_t ms = d->deadline > d->start ? (uint64_t)(d->deadline - d->start) : 0;

	if (d->stage == D_CONNECT)
		dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_CONNECT, strerror(ETIMEDOUT),
			  err, "tcp: cannot reach node \"%s\" at %s: %s (no answer within %"
			  PRIu64 " ms)", p->node_id, p->endpoint, strerror(ETIMEDOUT), ms);
	else
		dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_HANDSHAKE,
			  "no answer to the handshake", err, "tcp: node \"%s\" at %s took the "
			  "connection but did not answer the handshake within %" PRIu64 " ms",
			  p->node_id, p->endpoint, ms);
}

/* Dial d's socket is ready (revents): move it on as far as it goes. */
static void
dial_step(xport_session_t *s, dialing_t *d, refit_err_t *err)
{
	static const char *const why[] = {"", "it is at another epoch", "wrong token",
					  "bad handshake", "too many connections",
					  "not from this node's data address"};
	const xport_peer_t *p = &s->peers[d->peer];
	int e = 0, one = 1;
	socklen_t el = sizeof(e);
	uint8_t ans = 0xff;
	ssize_t k;

	if (d->stage == D_CONNECT) {
		if (getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
			e = errno;
		if (e == EINPROGRESS || e == EALREADY)
			return;
		if (e != 0) {
			dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_CONNECT, strerror(e), err,
				  "tcp: cannot reach node \"%s\" at %s: %s", p->node_id,
				  p->endpoint, strerror(e));
			return;
		}
		setsockopt(d->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		d->stage = D_SEND;
	}
	if (d->stage == D_SEND) {
		k = send(d->fd, d->hs + d->off, HS_BYTES - d->off, MSG_NOSIGNAL);
		if (k < 0 && errno != EAGAIN && errno != EINTR) {
			e = errno;
			dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_HANDSHAKE, strerror(e), err,
				  "tcp: node \"%s\" refused the data connection for epoch %"
				  PRIu64 ": %s", p->node_id, s->cfg.epoch, strerror(e));
			return;
		}
		if (k > 0)
			d->off += (size_t)k;
		if (d->off < HS_BYTES)
			return;
		d->stage = D_ANSWER;
		return;  /* the answer comes with a later POLLIN */
	}
	k = recv(d->fd, &ans, 1, 0);
	if (k < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (k == 1 && ans == HS_OK) {
		s->out[d->peer].fd = d->fd;
		d->fd = -1;
		d->stage = D_DONE;
		return;
	}
	e = k < 0 ? errno : 0;
	dial_fail(s, d, REFIT_ERR_UNAVAILABLE, XPORT_LINK_HANDSHAKE,
		  k < 0 ? strerror(e) : k == 0 ? "closed during the handshake" :
		  ans < 6 ? why[ans] : "unknown answer", err,
		  "tcp: node \"%s\" refused the data connection for epoch %" PRIu64 ": %s",
		  p->node_id, s->cfg.epoch, k < 0 ? strerror(e) : k == 0 ?
		  "closed during the handshake" : ans < 6 ? why[ans] : "unknown answer");
}

/*
 * Dial every peer this node sends to, all at once; each dial is bounded by
 * connect_ms (and the session's deadline) and the abort flag.  Every dial
 * runs to its end, so every unreachable peer is noted in links; the first
 * failure is the error.
 */
refit_status_t
tcp_dial_all(xport_session_t *s, refit_err_t *err)
{
	size_t n = s->cfg.npeers, nd = 0, left = 0;
	dialing_t *d = xcalloc(n ? n : 1, sizeof(*d));
	struct pollfd *pf = xcalloc(n ? n : 1, sizeof(*pf));
	size_t *who = xcalloc(n ? n : 1, sizeof(*who));
	refit_err_t first;
	int64_t now = xport_now_ms();

	refit_err_clear(&first);
	if (s->x->token_len == 0 || s->cfg.epoch == 0) {
		for (size_t i = 0; i < n; i++)
			if (s->peers[i].send_to) {
				refit_err_set(&first, REFIT_ERR_STALE_EPOCH, "tcp: no epoch "
					      "prepared here: nothing to connect to node \"%s\" "
					      "with", s->peers[i].node_id);
				break;
			}
		n = 0;
	}
	for (size_t i = 0; i < n; i++)
		if (s->peers[i].send_to) {
			d[nd].peer = i;
			dial_start(s, &d[nd++], now, &first);
		}
	for (;;) {
		size_t np = 0;
		int64_t wait = SLICE_MS;

		now = xport_now_ms();
		left = 0;
		for (size_t k = 0; k < nd; k++) {
			if (d[k].stage >= D_DONE)
				continue;
			if (atomic_load(s->cfg.abort)) {
				dial_fail(s, &d[k], REFIT_ERR_ABORTED, XPORT_LINK_OK, NULL, &first,
					  "tcp: aborted while connecting to node \"%s\"",
					  s->peers[d[k].peer].node_id);
				continue;
			}
			if (now >= d[k].deadline) {
				dial_late(s, &d[k], &first);
				continue;
			}
			if (d[k].deadline - now < wait)
				wait = d[k].deadline - now;
			pf[np] = (struct pollfd){d[k].fd, d[k].stage == D_ANSWER ? POLLIN : POLLOUT,
						 0};
			who[np++] = k;
			left++;
		}
		if (left == 0)
			break;
		if (poll(pf, np, (int)wait) < 0 && errno != EINTR) {
			for (size_t k = 0; k < np; k++)
				dial_fail(s, &d[who[k]], REFIT_ERR_SYS, XPORT_LINK_OK, NULL, &first,
					  "tcp: poll: %s", strerror(errno));
			break;
		}
		for (size_t k = 0; k < np; k++)
			if (pf[k].revents)
				dial_step(s, &d[who[k]], &first);
	}
	free(d);
	free(pf);
	free(who);
	if (first.status == REFIT_OK)
		return REFIT_OK;
	*err = first;
	return first.status;
}
