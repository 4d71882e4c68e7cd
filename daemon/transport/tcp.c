/*
 * tcp.c - the tcp transport: host memory over TCP (see transport.h).
 *
 * One connection per (sender, receiver, refit): the sender connects to the
 * receiver's listener and sends a handshake (magic, epoch, token, refit id,
 * its node id); the listener thread checks epoch and token against what the
 * node prepared, answers one byte (accepted or why not) and parks the
 * connection until the receiver's session for that refit picks it up.  A
 * connection with a wrong token or epoch is logged and closed, and so is
 * one before any epoch was prepared (epoch 0, no token).  Handshakes are
 * read concurrently, each with its own 5 s deadline: a peer that connects
 * and sends nothing delays nobody (at most PENDING_MAX wait at once; the
 * oldest goes when more come).  Parked connections stay when the epoch is
 * set again to the same value (concurrent refits of different models share
 * an epoch); they go when it changes.  Peers are dialed all at once
 * (tcp_dial.c), each dial (connect and handshake) bounded by the session's
 * connect_ms and its abort flag, and peers' endpoints must be numeric
 * addresses: no name resolution without a bound on the data path.  What
 * goes wrong with a peer's link is noted per peer (xport_link_t) for the
 * coordinator to name the broken link.  The listener's thread is in
 * tcp_listen.c, data_tls in tcp_tls.c.
 *
 * On the wire every message is a frame header of FRAME_BYTES (magic,
 * length, the sequence number the executor gave it, each a little-endian
 * u64) and the payload; the handshake is HS_BYTES, also encoded field by
 * field little-endian (hs_encode in tcp_dial.c), never a C struct's memory.  A session's
 * exchange polls all its connections: outgoing ones write whatever the
 * executor pulls, incoming ones read frames and push them, so both
 * directions of every pair move at once and a slow peer never stalls the
 * others.  What tcp has no use for in the interface (world, communicator
 * id, device memory) it answers plainly, at the end of this file.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/sha256.h"
#include "daemon/transport/tcp_internal.h"

static const char *
tcp_unavailable(void)
{
	return NULL;
}

static refit_status_t
tcp_start(const xport_cfg_t *cfg, xport_t **out, refit_err_t *err)
{
	char host[256], port[32];
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	xport_t *x;
	int one = 1, fd, rc;

	CHECK(tcp_split_endpoint(cfg->listen, host, sizeof(host), port, sizeof(port), err));
	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tcp: data endpoint \"%s\": %s",
				     cfg->listen, gai_strerror(rc));
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 256) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		int e = errno;

		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return refit_err_set(err, REFIT_ERR_SYS, "tcp: cannot listen on \"%s\": %s",
				     cfg->listen, strerror(e));
	}
	freeaddrinfo(ai);
	x = xcalloc(1, sizeof(*x));
	x->lfd = fd;
	x->node_id = xstrdup(cfg->node_id);
	x->source_check = cfg->source_check;
	x->refused = cfg->refused;
	x->refused_ctx = cfg->refused_ctx;
	tcp_ip_of_sockaddr((struct sockaddr *)&ss, &x->bound);
	/* advertised as the numeric address bound (peers do not resolve names) */
	if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), NULL, 0,
			NI_NUMERICHOST) != 0)
		snprintf(host, sizeof(host), "%s", "0.0.0.0");
	snprintf(x->endpoint, sizeof(x->endpoint), "%s%s%s:%u", strchr(host, ':') ? "[" : "",
		 host, strchr(host, ':') ? "]" : "",
		 ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						: ((struct sockaddr_in *)&ss)->sin_port));
	if (cfg->tls_cert != NULL &&
	    tcp_tls_new(cfg->tls_ca, cfg->tls_cert, cfg->tls_key, &x->tls, err) != REFIT_OK) {
		close(fd);
		free(x->node_id);
		free(x);
		return err->status;
	}
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	if (pipe2(x->wake, O_CLOEXEC) < 0 || pthread_create(&x->thr, NULL, tcp_listener, x) != 0) {
		close(fd);
		tcp_tls_free(x->tls);
		free(x->node_id);
		free(x);
		return refit_err_set(err, REFIT_ERR_SYS, "tcp: cannot start the listener");
	}
	*out = x;
	return REFIT_OK;
}

static const char *
tcp_endpoint(xport_t *x)
{
	return x->endpoint;
}

static void
tcp_set_epoch(xport_t *x, uint64_t epoch, const uint8_t *token, size_t len)
{
	if (len > XPORT_TOKEN_MAX)
		len = XPORT_TOKEN_MAX;
	pthread_mutex_lock(&x->mu);
	/* connections of other epochs are dropped; those of this epoch stay
	 * (another refit of the same epoch may be collecting them) */
	for (size_t i = 0; i < x->parked.n;) {
		if (x->parked.v[i].epoch != epoch) {
			close(x->parked.v[i].fd);
			x->parked.v[i] = x->parked.v[--x->parked.n];
		} else {
			i++;
		}
	}
	x->epoch = epoch;
	memcpy(x->token, token, len);
	x->token_len = len;
	pthread_mutex_unlock(&x->mu);
}

static void
peers_clear(xport_t *x)
{
	for (size_t i = 0; i < x->peers.n; i++)
		free(x->peers.v[i].node_id);
	x->peers.n = 0;
}

static void
tcp_stop(xport_t *x)
{
	if (x == NULL)
		return;
	(void)!write(x->wake[1], "x", 1);
	pthread_join(x->thr, NULL);
	close(x->wake[0]);
	close(x->wake[1]);
	close(x->lfd);
	for (size_t i = 0; i < x->parked.n; i++)
		close(x->parked.v[i].fd);
	VEC_FREE(&x->parked);
	peers_clear(x);
	VEC_FREE(&x->peers);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	tcp_tls_free(x->tls);
	free(x->node_id);
	free(x);
}

/* ---- sessions -------------------------------------------------------------- */

/* Wait for the connections of every peer that sends to us. */
static refit_status_t
collect(xport_session_t *s, refit_err_t *err)
{
	xport_t *x = s->x;
	size_t want = 0, got = 0;
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < s->cfg.npeers; i++)
		want += s->peers[i].recv_from;
	pthread_mutex_lock(&x->mu);
	while (rc == REFIT_OK) {
		for (size_t k = 0; k < x->parked.n;) {
			parked_t *p = &x->parked.v[k];
			size_t i = s->cfg.npeers;

			if (p->refit_id == s->cfg.refit_id && p->attempt == s->cfg.attempt)
				for (i = 0; i < s->cfg.npeers; i++)
					if (s->peers[i].recv_from && s->in[i].fd < 0 &&
					    strcmp(s->peers[i].node_id, p->node_id) == 0)
						break;
			if (i < s->cfg.npeers) {
				s->in[i].fd = p->fd;
				got++;
				*p = x->parked.v[--x->parked.n];
			} else {
				k++;
			}
		}
		if (got == want)
			break;
		if (atomic_load(s->cfg.abort)) {
			rc = refit_err_set(err, REFIT_ERR_ABORTED, "tcp: aborted while waiting "
					   "for peers to connect");
		} else if (xport_now_ms() >= s->cfg.deadline_ms) {
			for (size_t i = 0; i < s->cfg.npeers; i++)
				if (s->peers[i].recv_from && s->in[i].fd < 0) {
					tcp_link_fault(s, i, XPORT_LINK_NO_DIAL, "never connected");
					if (rc == REFIT_OK)
						rc = refit_err_set(err, REFIT_ERR_TIMEOUT, "tcp: node "
								   "\"%s\" never connected for "
								   "refit %" PRIu64,
								   s->peers[i].node_id,
								   s->cfg.refit_id);
				}
		} else {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 50 * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&x->cv, &x->mu, &ts);
		}
	}
	pthread_mutex_unlock(&x->mu);
	return rc;
}

static void
tcp_close(xport_session_t *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->cfg.npeers; i++) {
		tcp_tls_conn_free(&s->out[i]);
		tcp_tls_conn_free(&s->in[i]);
		if (s->out[i].fd >= 0)
			close(s->out[i].fd);
		if (s->in[i].fd >= 0)
			close(s->in[i].fd);
		if (s->cfg.pool)
			dp_pool_put(s->cfg.pool, s->in[i].rbuf);
		else
			free(s->in[i].rbuf);
	}
	free(s->out);
	free(s->in);
	free(s->peers);
	free(s);
}

static refit_status_t
tcp_open(xport_t *x, const xport_session_cfg_t *cfg, xport_session_t **out,
	 refit_err_t *err)
{
	xport_session_t *s = xcalloc(1, sizeof(*s));
	refit_status_t rc = REFIT_OK;

	s->x = x;
	s->cfg = *cfg;
	s->peers = xcalloc(cfg->npeers ? cfg->npeers : 1, sizeof(*s->peers));
	memcpy(s->peers, cfg->peers, cfg->npeers * sizeof(*s->peers));
	s->cfg.peers = s->peers;
	s->out = xcalloc(cfg->npeers ? cfg->npeers : 1, sizeof(*s->out));
	s->in = xcalloc(cfg->npeers ? cfg->npeers : 1, sizeof(*s->in));
	for (size_t i = 0; i < cfg->npeers; i++)
		s->out[i].fd = s->in[i].fd = -1;
	rc = tcp_dial_all(s, err);
	if (rc == REFIT_OK)
		rc = collect(s, err);
	for (size_t i = 0; i < cfg->npeers && rc == REFIT_OK; i++) {
		if (s->out[i].fd >= 0)
			fcntl(s->out[i].fd, F_SETFL, O_NONBLOCK);
		if (s->in[i].fd >= 0)
			fcntl(s->in[i].fd, F_SETFL, O_NONBLOCK);
	}
	if (rc == REFIT_OK && x->tls != NULL)
		rc = tcp_tls_handshake_all(s, err);
	if (rc != REFIT_OK) {
		tcp_close(s);
		return rc;
	}
	*out = s;
	return REFIT_OK;
}

/* Write what the outgoing connection to peer i can take now. */
static refit_status_t
do_send(xport_session_t *s, const xport_io_t *io, size_t i, refit_err_t *err)
{
	conn_t *c = &s->out[i];

	for (;;) {
		ssize_t k;

		if (!c->busy) {
			const uint8_t *b = NULL;
			uint64_t n = UINT64_MAX, seq = 0;

			CHECK(io->pull(io->arg, i, &b, &n, &seq, err));
			if (n == UINT64_MAX) {
				c->idle = true;
				return REFIT_OK;
			}
			c->idle = false;
			c->busy = true;
			c->buf = b;
			c->len = n;
			c->off = 0;
			wire_put_le(c->hdr, FRAME_MAGIC, 8);
			wire_put_le(c->hdr + 8, n, 8);
			wire_put_le(c->hdr + 16, seq, 8);
			c->seq++;
		}
		if (c->ssl != NULL) {
			k = c->off < FRAME_BYTES
				    ? tcp_tls_send(c, c->hdr + c->off, FRAME_BYTES - c->off)
				    : tcp_tls_send(c, c->buf + (c->off - FRAME_BYTES),
						   c->len - (c->off - FRAME_BYTES));
		} else if (c->off < FRAME_BYTES) {
			struct iovec iov[2] = {{c->hdr + c->off, FRAME_BYTES - c->off},
					       {(void *)c->buf, c->len}};
			struct msghdr mh = {.msg_iov = iov, .msg_iovlen = c->len ? 2 : 1};

			k = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		} else {
			k = send(c->fd, c->buf + (c->off - FRAME_BYTES), c->len - (c->off - FRAME_BYTES),
				 MSG_NOSIGNAL);
		}
		if (k < 0) {
			int e = errno;

			if (e == EAGAIN || e == EINTR)
				return REFIT_OK;
			tcp_link_fault(s, i, XPORT_LINK_BROKEN, strerror(e));
			return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "tcp: sending to node "
					     "\"%s\": %s (message %" PRIu64 ")",
					     s->peers[i].node_id, strerror(e), c->seq - 1);
		}
		c->off += (uint64_t)k;
		if (c->off < FRAME_BYTES + c->len)
			return REFIT_OK;
		c->busy = false;
	}
}

/* The receive buffer of c: the size of the peer's largest message, taken
 * once per session (from the node's pool when it has one). */
static refit_status_t
rbuf_get(xport_session_t *s, conn_t *c, uint64_t bytes, refit_err_t *err)
{
	if (c->rbuf != NULL)
		return REFIT_OK;
	if (s->cfg.pool == NULL) {
		c->rbuf = xmalloc(bytes ? bytes : 1);
		return REFIT_OK;
	}
	c->rbuf = dp_pool_get(s->cfg.pool, bytes);
	if (c->rbuf == NULL)
		return refit_err_set(err, REFIT_ERR_NOMEM, "tcp: cannot map a %" PRIu64
				     "-byte receive buffer", bytes);
	return REFIT_OK;
}

/* Read what the incoming connection from peer i has; push whole frames. */
static refit_status_t
do_recv(xport_session_t *s, const xport_io_t *io, size_t i, refit_err_t *err)
{
	conn_t *c = &s->in[i];

	for (int rounds = 0; rounds < 64; rounds++) {
		ssize_t k;

		if (c->roff < FRAME_BYTES)
			k = c->ssl ? tcp_tls_recv(c, c->rhdr + c->roff, FRAME_BYTES - c->roff)
				   : recv(c->fd, c->rhdr + c->roff, FRAME_BYTES - c->roff, 0);
		else
			k = c->ssl ? tcp_tls_recv(c, c->rbuf + (c->roff - FRAME_BYTES),
						  c->rlen - (c->roff - FRAME_BYTES))
				   : recv(c->fd, c->rbuf + (c->roff - FRAME_BYTES),
					  c->rlen - (c->roff - FRAME_BYTES), 0);
		if (k == 0 && c->roff == 0 && io->peer_done(io->arg, i)) {
			close(c->fd); /* the peer sent everything and left */
			c->fd = -1;
			return REFIT_OK;
		}
		if (k == 0) {
			tcp_link_fault(s, i, XPORT_LINK_BROKEN_IN, "the peer closed the connection");
			return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "tcp: node \"%s\" closed "
					     "the connection after %" PRIu64 " messages",
					     s->peers[i].node_id, c->rseq);
		}
		if (k < 0) {
			int e = errno;

			if (e == EAGAIN || e == EINTR)
				return REFIT_OK;
			tcp_link_fault(s, i, XPORT_LINK_BROKEN_IN, strerror(e));
			return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "tcp: receiving from "
					     "node \"%s\": %s", s->peers[i].node_id, strerror(e));
		}
		c->roff += (uint64_t)k;
		if (c->roff == FRAME_BYTES) {
			uint64_t magic = wire_get_le(c->rhdr, 8), len = wire_get_le(c->rhdr + 8, 8);
			uint64_t seq = wire_get_le(c->rhdr + 16, 8);

			if (magic != FRAME_MAGIC || len > s->cfg.max_msg_bytes ||
			    len > s->peers[i].max_in_bytes)
				tcp_link_fault(s, i, XPORT_LINK_BROKEN_IN, "bad frame");
			if (magic != FRAME_MAGIC)
				return refit_err_set(err, REFIT_ERR_REMOTE, "tcp: node \"%s\" sent "
						     "a bad frame (message %" PRIu64 ")%s",
						     s->peers[i].node_id, c->rseq,
						     /* a TLS record: handshake, TLS 1.x */
						     c->rhdr[0] == 0x16 && c->rhdr[1] == 3 && !c->ssl
						     ? ": a TLS handshake (data_tls is on there, "
						       "off here)" : "");
			if (len > s->cfg.max_msg_bytes || len > s->peers[i].max_in_bytes)
				return refit_err_set(err, REFIT_ERR_REMOTE, "tcp: node \"%s\" "
						     "announced a %" PRIu64 "-byte message (at "
						     "most %" PRIu64 " in this refit)",
						     s->peers[i].node_id, len,
						     s->peers[i].max_in_bytes);
			CHECK(rbuf_get(s, c, s->peers[i].max_in_bytes, err));
			c->rlen = len;
			c->rmsg = seq;
		}
		if (c->roff >= FRAME_BYTES && c->roff == FRAME_BYTES + c->rlen) {
			CHECK(io->push(io->arg, i, c->rmsg, c->rbuf, c->rlen, err));
			c->rseq++;
			c->roff = 0;
			if (io->peer_done(io->arg, i))
				return REFIT_OK;
		}
	}
	return REFIT_OK;
}

static bool
sending(const xport_session_t *s)
{
	for (size_t i = 0; i < s->cfg.npeers; i++)
		if (s->out[i].fd >= 0 && s->out[i].busy)
			return true;
	return false;
}

/* " (still owed by node \"a\", ...)": the peers whose messages have not all
 * arrived, for the deadline's error ("" when none). */
static const char *
owed_by(const xport_session_t *s, const xport_io_t *io, char *buf, size_t len)
{
	size_t at = 0, named = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < s->cfg.npeers && at + 1 < len; i++) {
		if (!s->peers[i].recv_from || io->peer_done(io->arg, i))
			continue;
		at += (size_t)snprintf(buf + at, len - at, "%s\"%s\"", named++ ? ", " :
				       " (still owed by node ", s->peers[i].node_id);
	}
	if (named && at + 2 < len)
		snprintf(buf + at, len - at, ")");
	return buf;
}

static refit_status_t
tcp_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err)
{
	size_t n = s->cfg.npeers;
	struct pollfd *pf = xcalloc(2 * n + 1, sizeof(*pf));
	size_t *who = xcalloc(2 * n + 1, sizeof(*who));
	refit_status_t rc = io->begin(io->arg, err);

	for (size_t i = 0; i < n && rc == REFIT_OK; i++)
		if (s->out[i].fd >= 0)
			rc = do_send(s, io, i, err);
	while (rc == REFIT_OK && (!io->done(io->arg) || sending(s))) {
		size_t np = 0;
		int64_t left = s->cfg.deadline_ms - xport_now_ms();

		if (atomic_load(s->cfg.abort)) {
			rc = refit_err_set(err, REFIT_ERR_ABORTED, "aborted");
			break;
		}
		if (left <= 0) {
			char who[256];

			rc = refit_err_set(err, REFIT_ERR_TIMEOUT, "tcp: refit %" PRIu64 " ran past "
					   "its deadline with messages outstanding%s",
					   s->cfg.refit_id, owed_by(s, io, who, sizeof(who)));
			break;
		}
		/* an idle sender may have something now: received data can unblock it */
		for (size_t i = 0; i < n && rc == REFIT_OK; i++)
			if (s->out[i].fd >= 0 && s->out[i].idle)
				rc = do_send(s, io, i, err);
		if (rc != REFIT_OK || (io->done(io->arg) && !sending(s)))
			break;
		bool pending = false;

		for (size_t i = 0; i < n; i++) {
			pending = pending || tcp_tls_pending(&s->in[i]);
			if (s->out[i].fd >= 0 && s->out[i].busy) {
				pf[np] = (struct pollfd){s->out[i].fd, POLLOUT, 0};
				who[np++] = i;
			}
			if (s->in[i].fd >= 0) {
				pf[np] = (struct pollfd){s->in[i].fd, POLLIN, 0};
				who[np++] = n + i;
			}
		}
		/* data_tls: bytes already decrypted are not seen by poll */
		if (poll(pf, np, pending ? 0 : left < 50 ? (int)left : 50) < 0 && errno != EINTR) {
			rc = refit_err_set(err, REFIT_ERR_SYS, "tcp: poll: %s", strerror(errno));
			break;
		}
		for (size_t k = 0; k < np && rc == REFIT_OK; k++) {
			if (!pf[k].revents && !(who[k] >= n && tcp_tls_pending(&s->in[who[k] - n])))
				continue;
			if (who[k] < n)
				rc = do_send(s, io, who[k], err);
			else
				rc = do_recv(s, io, who[k] - n, err);
		}
	}
	free(pf);
	free(who);
	return rc;
}

/* ---- what tcp has no use for ------------------------------------------------ */

/* The epoch's members and their verifiers (peers are found by endpoint,
 * not by a world of ranks). */
static void
tcp_set_world(xport_t *x, const xport_world_t *w)
{
	pthread_mutex_lock(&x->mu);
	peers_clear(x);
	for (size_t i = 0; i < w->npeers; i++) {
		struct peer_verifier pv = {xstrdup(w->peers[i]), {0}, {0, {0}}};

		memcpy(pv.v, w->verifiers[i], sizeof(pv.v));
		if (w->endpoints != NULL)
			tcp_ip_of_endpoint(w->endpoints[i], &pv.ip);
		VEC_PUSH(&x->peers, pv);
	}
	pthread_mutex_unlock(&x->mu);
}

static refit_status_t
tcp_unique_id(xport_t *x, uint8_t *out, size_t *len, refit_err_t *err)
{
	(void)x;
	(void)out;
	(void)len;
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "NcclId: this node uses the tcp "
			     "transport (no communicators)");
}

static const dp_dev_ops_t *
tcp_dev(xport_session_t *s)
{
	(void)s;
	return NULL; /* host memory: the executor copies itself */
}

static refit_status_t
tcp_mem_open(xport_t *x, int32_t rank, const void *ipc, size_t len, int32_t device,
	     const uint8_t *uuid, uint64_t bytes, void **base, refit_err_t *err)
{
	(void)x;
	(void)ipc;
	(void)len;
	(void)device;
	(void)uuid;
	(void)bytes;
	*base = NULL;
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: GPU memory (a CUDA IPC "
			     "handle) needs the nccl transport; this node uses tcp", rank);
}

static void
tcp_mem_close(xport_t *x, void *base)
{
	(void)x; /* tcp_mem_open never opens anything */
	(void)base;
}

static xport_poison_t
tcp_poisoned(xport_t *x, char *why, size_t len)
{
	(void)x; /* no device work to outlive a session */
	(void)why;
	(void)len;
	return XPORT_POISON_NONE;
}

const xport_ops_t xport_tcp_ops = XPORT_OPS("tcp", XPORT_MEM_HOST, tcp);
