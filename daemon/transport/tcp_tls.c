/*
 * tcp_tls.c - data_tls: TLS 1.3 (OpenSSL) on the tcp data connections.
 *
 * A connection is made and its refit handshake (epoch, per-member token,
 * node id) answered in the clear as without TLS; then, in tcp_open, every
 * connection of the session does its TLS handshake at once (a node is the
 * client on the connections it dialed, the server on those it accepted;
 * both present their certificates, verified against the cluster CA), and
 * the peer's certificate must name the node the connection is with
 * (SAN dNSName "<node id>.node.refit", as for gRPC).  Frames then go
 * through SSL_write/SSL_read on the same non-blocking sockets.  Called by
 * tcp.c (the session's thread); calls tcp_dial.c for link faults.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/log.h"
#include "daemon/transport/tcp_internal.h"

#define NODE_SUFFIX ".node.refit" /* rpc.h's RPC_TLS_NODE_SUFFIX */

static void
ssl_why(char *buf, size_t n)
{
	unsigned long e = ERR_get_error();

	if (e == 0)
		snprintf(buf, n, "%s", errno ? strerror(errno) : "connection closed");
	else
		ERR_error_string_n(e, buf, n);
	ERR_clear_error();
}

/* A TLS 1.3 context with cert and key, verifying peers with ca. */
static SSL_CTX *
ctx_new(const char *ca, const char *cert, const char *key, char *why, size_t n)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_method());

	if (ctx == NULL || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
	    SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1 ||
	    SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 ||
	    SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		ssl_why(why, n);
		SSL_CTX_free(ctx);
		return NULL;
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	/* a frame's header and payload are two writes; either may go in parts */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	/* a sender that is done closes without close_notify: its frames are
	 * counted, a cut one is an error anyway */
	SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
	/* no TLS 1.3 session tickets: a sender never reads its connection, and
	 * a ticket left unread there makes its close a reset that can cut the
	 * data it sent before the receiver has read it */
	SSL_CTX_set_num_tickets(ctx, 0);
	return ctx;
}

/* The files' identity (inode, size, change time): rotated files differ. */
static void
stamp(const tcp_tls_t *t, uint64_t out[9])
{
	const char *f[3] = {t->ca, t->cert, t->key};
	struct stat st;

	for (int i = 0; i < 3; i++) {
		memset(&st, 0, sizeof(st));
		(void)stat(f[i], &st);
		out[3 * i] = (uint64_t)st.st_ino;
		out[3 * i + 1] = (uint64_t)st.st_size;
		out[3 * i + 2] = (uint64_t)st.st_mtim.tv_sec * 1000000000u +
				 (uint64_t)st.st_mtim.tv_nsec;
	}
}

refit_status_t
tcp_tls_new(const char *ca, const char *cert, const char *key, tcp_tls_t **out,
	    refit_err_t *err)
{
	tcp_tls_t *t = xcalloc(1, sizeof(*t));
	char why[256];

	*out = NULL;
	t->ca = xstrdup(ca);
	t->cert = xstrdup(cert);
	t->key = xstrdup(key);
	stamp(t, t->stamp);
	if ((t->ctx = ctx_new(ca, cert, key, why, sizeof(why))) == NULL) {
		tcp_tls_free(t);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tcp: data_tls: %s, %s, %s: %s",
				     ca, cert, key, why);
	}
	pthread_mutex_init(&t->mu, NULL);
	t->mu_init = true;
	*out = t;
	return REFIT_OK;
}

void
tcp_tls_free(tcp_tls_t *t)
{
	if (t == NULL)
		return;
	SSL_CTX_free(t->ctx);
	if (t->mu_init)
		pthread_mutex_destroy(&t->mu);
	free(t->ca);
	free(t->cert);
	free(t->key);
	free(t);
}

/*
 * The context for a new session (a reference the caller frees): rebuilt
 * from the files when they changed since (rotation needs no restart; a set
 * that does not load keeps the old one, logged).  Any session thread.
 */
static SSL_CTX *
ctx_current(tcp_tls_t *t)
{
	uint64_t now[9];
	SSL_CTX *ctx, *fresh = NULL;
	char why[256];

	stamp(t, now);
	pthread_mutex_lock(&t->mu);
	if (memcmp(now, t->stamp, sizeof(now)) != 0) {
		memcpy(t->stamp, now, sizeof(now));
		fresh = ctx_new(t->ca, t->cert, t->key, why, sizeof(why));
		if (fresh == NULL) {
			log_warnx("tcp: data_tls: %s, %s, %s changed but do not load (%s): the "
				  "certificate in use stays", t->ca, t->cert, t->key, why);
		} else {
			SSL_CTX_free(t->ctx);
			t->ctx = fresh;
			log_info("tcp: data_tls: certificate files changed: reloaded");
		}
	}
	ctx = t->ctx;
	SSL_CTX_up_ref(ctx);
	pthread_mutex_unlock(&t->mu);
	return ctx;
}

/* c's SSL for the connection with node (client: we dialed it). */
static refit_status_t
conn_ssl(SSL_CTX *ctx, conn_t *c, const char *node, bool client, refit_err_t *err)
{
	char name[HS_NODE_ID + sizeof(NODE_SUFFIX)];

	snprintf(name, sizeof(name), "%s%s", node, NODE_SUFFIX);
	if ((c->ssl = SSL_new(ctx)) == NULL || !SSL_set_fd(c->ssl, c->fd) ||
	    !SSL_set1_host(c->ssl, name))
		return refit_err_set(err, REFIT_ERR_NOMEM, "tcp: data_tls: cannot set up TLS");
	if (client)
		SSL_set_connect_state(c->ssl);
	else
		SSL_set_accept_state(c->ssl);
	c->tls_done = false;
	return REFIT_OK;
}

/* One step of c's handshake with peer i: 1 done, 0 wants *ev, -1 failed. */
static int
step(xport_session_t *s, size_t i, conn_t *c, short *ev, refit_err_t *err)
{
	int r = SSL_do_handshake(c->ssl);
	char why[256];

	if (r == 1) {
		c->tls_done = true;
		return 1;
	}
	switch (SSL_get_error(c->ssl, r)) {
	case SSL_ERROR_WANT_READ:
		*ev = POLLIN;
		return 0;
	case SSL_ERROR_WANT_WRITE:
		*ev = POLLOUT;
		return 0;
	default:
		ssl_why(why, sizeof(why));
		if (SSL_get_verify_result(c->ssl) != X509_V_OK)
			snprintf(why, sizeof(why), "its certificate: %s", X509_verify_cert_error_string(
					 SSL_get_verify_result(c->ssl)));
		tcp_link_fault(s, i, c == &s->out[i] ? XPORT_LINK_BROKEN : XPORT_LINK_BROKEN_IN,
			       "TLS handshake failed");
		refit_err_set(err, REFIT_ERR_UNAVAILABLE, "tcp: data_tls: TLS with node \"%s\" "
			      "(%s) failed: %s (its certificate must name \"%s%s\"; data_tls must be "
			      "on at both ends)", s->peers[i].node_id, s->peers[i].endpoint, why,
			      s->peers[i].node_id, NODE_SUFFIX);
		return -1;
	}
}

refit_status_t
tcp_tls_handshake_all(xport_session_t *s, refit_err_t *err)
{
	size_t n = s->cfg.npeers, left = 0;
	struct pollfd *pf = xcalloc(2 * n + 1, sizeof(*pf));
	conn_t **who = xcalloc(2 * n + 1, sizeof(*who));
	refit_status_t rc = REFIT_OK;
	SSL_CTX *ctx = ctx_current(s->x->tls);

	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		if (s->out[i].fd >= 0 && (rc = conn_ssl(ctx, &s->out[i], s->peers[i].node_id,
							 true, err)) == REFIT_OK)
			left++;
		if (rc == REFIT_OK && s->in[i].fd >= 0 &&
		    (rc = conn_ssl(ctx, &s->in[i], s->peers[i].node_id, false, err)) == REFIT_OK)
			left++;
	}
	SSL_CTX_free(ctx); /* each SSL holds its own reference */
	while (rc == REFIT_OK && left > 0) {
		size_t np = 0;
		int64_t wait = s->cfg.deadline_ms - xport_now_ms();

		for (size_t i = 0; i < 2 * n && rc == REFIT_OK; i++) {
			conn_t *c = i < n ? &s->out[i] : &s->in[i - n];
			short ev = 0;
			int r;

			if (c->ssl == NULL || c->tls_done)
				continue;
			if ((r = step(s, i % n, c, &ev, err)) < 0)
				rc = err->status;
			else if (r == 1)
				left--;
			else {
				pf[np] = (struct pollfd){c->fd, ev, 0};
				who[np++] = c;
			}
		}
		if (rc != REFIT_OK || left == 0)
			break;
		if (atomic_load(s->cfg.abort))
			rc = refit_err_set(err, REFIT_ERR_ABORTED, "tcp: aborted during TLS handshakes");
		else if (wait <= 0)
			rc = refit_err_set(err, REFIT_ERR_TIMEOUT, "tcp: data_tls: TLS handshakes "
					   "ran past the refit's deadline");
		else if (poll(pf, np, wait < SLICE_MS ? (int)wait : SLICE_MS) < 0 && errno != EINTR)
			rc = refit_err_set(err, REFIT_ERR_SYS, "tcp: poll: %s", strerror(errno));
	}
	free(pf);
	free(who);
	return rc;
}

/* errno-style results: -1 with errno EAGAIN (try again when the socket is
 * ready), EPIPE/ECONNRESET-like EIO (broken), or the count (0: closed). */
static ssize_t
result(conn_t *c, int r)
{
	switch (SSL_get_error(c->ssl, r)) {
	case SSL_ERROR_WANT_READ:
	case SSL_ERROR_WANT_WRITE:
		errno = EAGAIN;
		return -1;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	default:
		ERR_clear_error();
		errno = EIO;
		return -1;
	}
}

ssize_t
tcp_tls_send(conn_t *c, const void *b, size_t n)
{
	int r = SSL_write(c->ssl, b, (int)(n > (1u << 30) ? 1u << 30 : n));

	return r > 0 ? r : result(c, r);
}

ssize_t
tcp_tls_recv(conn_t *c, void *b, size_t n)
{
	int r = SSL_read(c->ssl, b, (int)(n > (1u << 30) ? 1u << 30 : n));

	return r > 0 ? r : result(c, r);
}

bool
tcp_tls_pending(const conn_t *c)
{
	return c->ssl != NULL && c->fd >= 0 && SSL_pending(c->ssl) > 0;
}

void
tcp_tls_conn_free(conn_t *c)
{
	SSL_free(c->ssl);
	c->ssl = NULL;
}
