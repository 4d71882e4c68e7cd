/*
 * tcp_listen.c - the tcp transport's listener thread (see tcp.c): takes
 * connections, reads their handshakes concurrently (each on its own
 * deadline), checks epoch and per-member token against what the node
 * prepared, answers one byte and parks the accepted ones for the sessions
 * (tcp.c's collect).  Shares xport_t with tcp.c under x->mu.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/sha256.h"
#include "daemon/transport/tcp_internal.h"

/* The inverse of hs_encode; the node id comes out NUL-terminated. */
static void
hs_decode(const uint8_t *b, hs_t *h)
{
	h->magic = (uint32_t)wire_get_le(b, 4);
	h->token_len = (uint32_t)wire_get_le(b + 4, 4);
	h->epoch = wire_get_le(b + 8, 8);
	h->refit_id = wire_get_le(b + 16, 8);
	h->attempt = (uint32_t)wire_get_le(b + 24, 4);
	memcpy(h->token, b + HS_AT_TOKEN, XPORT_TOKEN_MAX);
	memcpy(h->node_id, b + HS_AT_NODE, HS_NODE_ID);
	h->node_id[HS_NODE_ID - 1] = '\0';
}

/* ---- addresses (the source check) ---------------------------------------- */

refit_status_t
tcp_split_endpoint(const char *ep, char *host, size_t hn, char *port, size_t pn,
		   refit_err_t *err)
{
	const char *c = strrchr(ep, ':');

	if (c == NULL || c == ep || c[1] == '\0' || (size_t)(c - ep) >= hn ||
	    strlen(c + 1) >= pn)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tcp: endpoint \"%s\" is not "
				     "host:port", ep);
	memcpy(host, ep, (size_t)(c - ep));
	host[c - ep] = '\0';
	if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = '\0';
	}
	strcpy(port, c + 1);
	return REFIT_OK;
}


static void
ip_set(tcp_ip_t *ip, int fam, const void *a)
{
	static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const uint8_t zero[16];

	memset(ip, 0, sizeof(*ip));
	if (fam == AF_INET6 && memcmp(a, v4mapped, 12) == 0) {
		fam = AF_INET;
		a = (const uint8_t *)a + 12;
	}
	if (memcmp(a, zero, fam == AF_INET ? 4 : 16) == 0)
		return; /* a wildcard names no address */
	ip->fam = fam;
	memcpy(ip->a, a, fam == AF_INET ? 4 : 16);
}

void
tcp_ip_of_endpoint(const char *ep, tcp_ip_t *ip)
{
	char host[256], port[32];
	uint8_t a[16];
	refit_err_t e;

	memset(ip, 0, sizeof(*ip));
	if (ep == NULL || tcp_split_endpoint(ep, host, sizeof(host), port, sizeof(port), &e) !=
	    REFIT_OK)
		return;
	if (inet_pton(AF_INET, host, a) == 1)
		ip_set(ip, AF_INET, a);
	else if (inet_pton(AF_INET6, host, a) == 1)
		ip_set(ip, AF_INET6, a);
}

void
tcp_ip_of_sockaddr(const struct sockaddr *sa, tcp_ip_t *ip)
{
	memset(ip, 0, sizeof(*ip));
	if (sa->sa_family == AF_INET)
		ip_set(ip, AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr);
	else if (sa->sa_family == AF_INET6)
		ip_set(ip, AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr);
}

const char *
tcp_ip_str(const tcp_ip_t *ip, char *buf, size_t n)
{
	if (ip->fam == 0 || inet_ntop(ip->fam, ip->a, buf, (socklen_t)n) == NULL)
		snprintf(buf, n, "%s", "an unknown address");
	return buf;
}

/*
 * With the source check, may a connection from fd speak for member m (its
 * registered data endpoint's address; none known: yes)?  why: the source,
 * for the refusal's log line.
 */
static bool
source_ok(const xport_t *x, const struct peer_verifier *m, int fd, tcp_ip_t *src)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	memset(src, 0, sizeof(*src));
	if (!x->source_check || m == NULL || m->ip.fam == 0)
		return true;
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0)
		return false;
	tcp_ip_of_sockaddr((struct sockaddr *)&ss, src);
	return src->fam == m->ip.fam && memcmp(src->a, m->ip.a, src->fam == AF_INET ? 4 : 16) == 0;
}

/* ---- the listener --------------------------------------------------------- */

/*
 * A data connection on fd refused for reason (a metric label): handed to
 * the node's xport_cfg_t.refused with the peer's address (counted, logged
 * once a minute per host there), else logged.
 */
static void __attribute__((format(printf, 4, 5)))
refuse(const xport_t *x, int fd, const char *reason, const char *fmt, ...)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	tcp_ip_t ip = {0};
	char msg[512], host[64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
		tcp_ip_of_sockaddr((struct sockaddr *)&ss, &ip);
	tcp_ip_str(&ip, host, sizeof(host));
	if (x->refused != NULL)
		x->refused(x->refused_ctx, host, reason, msg);
	else
		log_warnx("tcp: refused a data connection from %s: %s", host, msg);
}

/*
 * Does h carry the token of the node it names (the SHA-256 of it is that
 * member's verifier from PrepareEpoch), or, with no verifiers, this node's
 * token?  Compared without an early exit.  Under x->mu.
 */
static bool
token_ok(const xport_t *x, const hs_t *h, const struct peer_verifier **who)
{
	uint8_t d[SHA256_DIGEST_LEN], diff = 0;
	sha256_ctx_t c;

	for (size_t i = 0; x->peers.n == 0 && i < h->token_len; i++)
		diff |= h->token[i] ^ x->token[i];
	if (x->peers.n == 0)
		return h->token_len == x->token_len && diff == 0;
	for (size_t i = 0; i < x->peers.n; i++) {
		if (strcmp(x->peers.v[i].node_id, h->node_id) != 0)
			continue;
		sha256_init(&c);
		sha256_update(&c, h->token, h->token_len);
		sha256_final(&c, d);
		for (size_t k = 0; k < sizeof(d); k++)
			diff |= d[k] ^ x->peers.v[i].v[k];
		*who = &x->peers.v[i];
		return diff == 0;
	}
	return false; /* not a member of the epoch */
}

/* A complete handshake arrived on fd (b: HS_BYTES): park it or refuse it. */
static void
handshake(xport_t *x, int fd, const uint8_t *b)
{
	hs_t h;
	uint8_t ans = HS_OK;
	uint64_t here;
	const struct peer_verifier *who = NULL;
	tcp_ip_t src, reg = {0};
	char s1[64], s2[64];

	hs_decode(b, &h);
	pthread_mutex_lock(&x->mu);
	here = x->epoch;
	if (h.magic != HS_MAGIC || h.token_len > XPORT_TOKEN_MAX)
		ans = HS_BAD_MAGIC;
	else if (x->epoch == 0 || x->token_len == 0 || h.epoch != x->epoch)
		ans = HS_BAD_EPOCH; /* nothing prepared yet, or another epoch */
	else if (!token_ok(x, &h, &who))
		ans = HS_BAD_TOKEN;
	else if (!source_ok(x, who, fd, &src)) {
		ans = HS_BAD_SOURCE;
		reg = who->ip;
	}
	else if (x->parked.n >= PARK_MAX)
		ans = HS_FULL;
	if (ans == HS_OK) {
		parked_t p = {fd, h.refit_id, h.epoch, h.attempt, "", xport_now_ms()};

		memcpy(p.node_id, h.node_id, sizeof(p.node_id));
		VEC_PUSH(&x->parked, p);
		pthread_cond_broadcast(&x->cv);
	}
	pthread_mutex_unlock(&x->mu);
	(void)!send(fd, &ans, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (ans == HS_OK)
		return;
	h.node_id[sizeof(h.node_id) - 1] = 0;
	if (ans == HS_BAD_MAGIC)
		refuse(x, fd, "handshake", "a peer that does not speak refit tcp");
	else if (ans == HS_BAD_EPOCH && here == 0)
		refuse(x, fd, "epoch", "node \"%s\" for epoch %" PRIu64 ": no epoch is prepared "
		       "here yet", h.node_id, h.epoch);
	else if (ans == HS_BAD_EPOCH)
		refuse(x, fd, "epoch", "node \"%s\" for epoch %" PRIu64 ": this node is at epoch %"
		       PRIu64, h.node_id, h.epoch, here);
	else if (ans == HS_BAD_SOURCE)
		refuse(x, fd, "source", "node \"%s\": it comes from %s, but the node's data "
		       "endpoint is at %s (data_source_check)", h.node_id,
		       tcp_ip_str(&src, s1, sizeof(s1)), tcp_ip_str(&reg, s2, sizeof(s2)));
	else if (ans == HS_BAD_TOKEN)
		refuse(x, fd, "token", "node \"%s\": not its token for epoch %" PRIu64 " (or not a "
		       "member of it)", h.node_id, h.epoch);
	else
		refuse(x, fd, "full", "node \"%s\": %d connections parked", h.node_id, PARK_MAX);
	close(fd);
}

/* A connection whose handshake is still arriving. */
typedef struct pending {
	int fd;
	size_t got;
	int64_t deadline;
	uint8_t hb[HS_BYTES];
} pending_t;

typedef VEC(pending_t) pending_vec_t;

static void
pending_drop(const xport_t *x, pending_vec_t *pend, size_t i, const char *why)
{
	if (why)
		refuse(x, pend->v[i].fd, "handshake", "a peer connected but %s", why);
	close(pend->v[i].fd);
	pend->v[i] = pend->v[--pend->n];
}

/* Connections nobody picked up within a minute go. */
static void
expire_parked(xport_t *x, int64_t now)
{
	pthread_mutex_lock(&x->mu);
	for (size_t i = 0; i < x->parked.n;) {
		if (now - x->parked.v[i].at_ms > 60000) {
			log_warnx("tcp: connection from node \"%s\" for refit %" PRIu64 " was "
				  "never used: closed", x->parked.v[i].node_id,
				  x->parked.v[i].refit_id);
			close(x->parked.v[i].fd);
			x->parked.v[i] = x->parked.v[--x->parked.n];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&x->mu);
}

/*
 * Handshakes arriving, each on its own deadline; pf[i] is pending i's poll
 * entry (from the back: the entries of those not yet looked at keep their
 * index).
 */
static void
read_pending(xport_t *x, pending_vec_t *pend, const struct pollfd *pf, int64_t now)
{
	for (size_t i = pend->n; i-- > 0;) {
		pending_t *q = &pend->v[i];

		if (pf[i].revents) {
			ssize_t k = recv(q->fd, q->hb + q->got, HS_BYTES - q->got, MSG_DONTWAIT);

			if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
				pending_drop(x, pend, i, "closed before its handshake");
				continue;
			}
			if (k > 0)
				q->got += (size_t)k;
			if (q->got == HS_BYTES) {
				pending_t done = *q;

				pend->v[i] = pend->v[--pend->n];
				handshake(x, done.fd, done.hb);
				continue;
			}
		}
		if (now >= q->deadline)
			pending_drop(x, pend, i, "sent no complete handshake in time");
	}
}

/* Take every new connection; its handshake has HS_TIMEOUT_MS to arrive. */
static void
accept_new(xport_t *x, pending_vec_t *pend, int64_t now)
{
	for (;;) {
		int fd = accept4(x->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		size_t old = 0;
		pending_t q = {.fd = fd, .deadline = now + HS_TIMEOUT_MS};

		if (fd < 0)
			return;
		if (pend->n >= PENDING_MAX) { /* the oldest makes room */
			for (size_t i = 1; i < pend->n; i++)
				if (pend->v[i].deadline < pend->v[old].deadline)
					old = i;
			pending_drop(x, pend, old, "was the oldest of too many handshakes waiting");
		}
		VEC_PUSH(pend, q);
	}
}

void *
tcp_listener(void *arg)
{
	xport_t *x = arg;
	pending_vec_t pend = {0};
	VEC(struct pollfd) pf = {0};

	for (;;) {
		int64_t now = xport_now_ms(), wait = 1000;

		pf.n = 0;
		VEC_RESERVE(&pf, pend.n + 2);
		pf.v[pf.n++] = (struct pollfd){x->lfd, POLLIN, 0};
		pf.v[pf.n++] = (struct pollfd){x->wake[0], POLLIN, 0};
		for (size_t i = 0; i < pend.n; i++) {
			pf.v[pf.n++] = (struct pollfd){pend.v[i].fd, POLLIN, 0};
			if (pend.v[i].deadline - now < wait)
				wait = pend.v[i].deadline - now;
		}
		if (poll(pf.v, pf.n, (int)(wait > 0 ? wait : 0)) < 0 && errno != EINTR)
			break;
		if (pf.v[1].revents)
			break;
		now = xport_now_ms();
		expire_parked(x, now);
		read_pending(x, &pend, pf.v + 2, now);
		if (pf.v[0].revents & POLLIN)
			accept_new(x, &pend, now);
	}
	for (size_t i = 0; i < pend.n; i++)
		close(pend.v[i].fd);
	VEC_FREE(&pend);
	VEC_FREE(&pf);
	return NULL;
}
