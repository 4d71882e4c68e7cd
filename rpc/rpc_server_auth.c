/*
 * rpc_server_auth.c - the server's side of rpc_auth.h: the secrets a call
 * presents (operator token, join token, session) and, with mutual TLS, the
 * certificate (rpc_tls.c); refusals counted and logged once a minute per
 * peer host.  The secrets are under the server's mutex; any thread.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/utf8.h"
#include "rpc/rpc_server_internal.h"

static const grpc_slice *
md_find(const rpc_call_t *c, const char *key)
{
	for (size_t i = 0; i < c->md.count; i++)
		if (grpc_slice_str_cmp(c->md.metadata[i].key, key) == 0)
			return &c->md.metadata[i].value;
	return NULL;
}

/*
 * Does metadata key hold prefix + *secret, compared in constant time?  A
 * secret not configured (NULL) is not checked.  *absent: key not sent.
 */
static bool
secret_ok(rpc_server_t *s, const rpc_call_t *c, const char *key, const char *prefix,
	  char *const *secret, bool *absent)
{
	const grpc_slice *v = md_find(c, key);
	char *want;
	bool ok;

	*absent = v == NULL;
	pthread_mutex_lock(&s->mu);
	want = *secret ? xmalloc(strlen(prefix) + strlen(*secret) + 1) : NULL;
	if (want)
		strcat(strcpy(want, prefix), *secret);
	pthread_mutex_unlock(&s->mu);
	if (want == NULL)
		return true;
	ok = v && rpc_auth_eq(GRPC_SLICE_START_PTR(*v), GRPC_SLICE_LENGTH(*v), want);
	free(want);
	return ok;
}

/*
 * A refusal: counted (opts.refused) every time, logged once a minute per
 * peer host (the address without its port), with how many were refused
 * since the last line.  Any thread.
 */
void
rpc_server_refusal_note(rpc_server_t *s, const rpc_call_t *c, const char *reason,
			const char *msg)
{
	const char *peer = c->peer ? c->peer : "?", *colon = strrchr(peer, ':');
	int hl = colon && colon != peer ? (int)(colon - peer) : (int)strlen(peer);
	uint64_t quiet = 0;
	char host[64];

	snprintf(host, sizeof(host), "%.*s", hl, peer);
	if (s->refused)
		s->refused(c->m ? c->m->path : "unknown", reason);
	if (!rpc_refusals_note(&s->refusals, host, uv_hrtime(), &quiet))
		return;
	log_warnx("rpc: refused a call from %s: %s (%" PRIu64 " more from %s since the last "
		  "line; they are logged once a minute)", peer, msg, quiet, host);
}

/* Say why c is refused (rpc_server.c answers it and notes the refusal). */
static void __attribute__((format(printf, 4, 5)))
refuse_now(rpc_call_t *c, int code, const char *reason, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	utf8_vformat(c->deny_msg, sizeof(c->deny_msg), fmt, ap);
	va_end(ap);
	c->deny_code = code;
	c->deny_reason = reason;
}

const char *
rpc_call_session(const rpc_call_t *c, size_t *len)
{
	*len = c->session_len;
	return c->session;
}

/* Is the secret in *slot configured?  Any thread. */
static bool
secret_set(rpc_server_t *s, char *const *slot)
{
	bool yes;

	pthread_mutex_lock(&s->mu);
	yes = *slot != NULL;
	pthread_mutex_unlock(&s->mu);
	return yes;
}

const char *
rpc_call_cert_node(const rpc_call_t *c)
{
	return c->cert.nodes == 1 ? c->cert.node : NULL;
}

bool
rpc_call_by_operator(const rpc_call_t *c)
{
	return c->by_operator;
}

/* Mutual TLS: the certificate join and member methods need (rpc_tls.c). */
static bool
cert_ok(rpc_server_t *s, rpc_call_t *c)
{
	char msg[REFIT_ERR_MSG_MAX];
	int code;

	if (!s->tls.tls.require_client_cert)
		return true;
	rpc_tls_peer_read(c->gc, &c->cert);
	code = rpc_tls_check(&s->tls.tls, c->m->need == RPC_CRED_MEMBER, c->m->path, &c->cert,
			     msg, sizeof(msg));
	if (code != GRPC_STATUS_OK)
		refuse_now(c, code, "identity", "%s", msg);
	return code == GRPC_STATUS_OK;
}

/*
 * The credential c's method needs (its row in rpc_auth.c), checked before
 * the request is decoded, so a refusal costs less than any call; false:
 * refused (c->deny_*).  Member methods: the join token here, and the
 * session when this server has one (a node); else the handler matches
 * rpc_call_session with the member the request names (the coordinator).
 */
bool
rpc_server_cred_ok(rpc_server_t *s, rpc_call_t *c)
{
	const grpc_slice *v;
	bool absent;

	if (c->m->need == RPC_CRED_NONE)
		return true;
	if (c->m->need == RPC_CRED_OPERATOR) {
		if (s->tls.tls.require_client_cert && !secret_set(s, &s->token)) {
			/* mutual TLS and no operator token: a certificate of the CA */
			rpc_tls_peer_read(c->gc, &c->cert);
			if (c->cert.has_cert)
				return true;
			refuse_now(c, GRPC_STATUS_UNAUTHENTICATED, "missing", "%s needs a client "
				   "certificate from the cluster CA (mutual TLS without an "
				   "operator token)", c->m->path);
			return false;
		}
		if (secret_ok(s, c, "authorization", "Bearer ", &s->token, &absent))
			return true;
		refuse_now(c, GRPC_STATUS_UNAUTHENTICATED, absent ? "missing" : "wrong",
			   "%s needs the operator token (metadata \"authorization: Bearer "
			   "<token>\")%s", c->m->path, absent ? "" : ": the one sent is not it");
		return false;
	}
	if (c->m->or_operator && secret_set(s, &s->token) &&
	    secret_ok(s, c, "authorization", "Bearer ", &s->token, &absent) && !absent) {
		c->by_operator = true;
		return true;
	}
	if (!cert_ok(s, c))
		return false;
	if (!secret_ok(s, c, RPC_MD_JOIN_TOKEN, "", &s->join_token, &absent)) {
		refuse_now(c, GRPC_STATUS_UNAUTHENTICATED, absent ? "missing" : "wrong",
			   "%s needs the cluster join token (metadata \"%s\")%s", c->m->path,
			   RPC_MD_JOIN_TOKEN, absent ? "" : ": the one sent is not it");
		return false;
	}
	if ((v = md_find(c, RPC_MD_SESSION)) != NULL) {
		c->session_len = GRPC_SLICE_LENGTH(*v);
		c->session = xmalloc(c->session_len + 1);
		memcpy(c->session, GRPC_SLICE_START_PTR(*v), c->session_len);
		c->session[c->session_len] = '\0';
	}
	if (c->m->need != RPC_CRED_MEMBER ||
	    secret_ok(s, c, RPC_MD_SESSION, "", &s->session, &absent))
		return true;
	refuse_now(c, absent ? GRPC_STATUS_UNAUTHENTICATED : GRPC_STATUS_PERMISSION_DENIED,
		   "session", "%s: only the coordinator this node joined may call it: the "
		   "session secret (metadata \"%s\") is %s", c->m->path, RPC_MD_SESSION,
		   absent ? "missing" : "another session's");
	return false;
}

static void
set_secret(rpc_server_t *s, char **slot, const char *secret)
{
	char *t = secret && secret[0] ? xstrdup(secret) : NULL, *old;

	pthread_mutex_lock(&s->mu);
	old = *slot;
	*slot = t;
	pthread_mutex_unlock(&s->mu);
	free(old);
}

void
rpc_server_set_token(rpc_server_t *s, const char *token)
{
	set_secret(s, &s->token, token);
}

void
rpc_server_set_join_token(rpc_server_t *s, const char *token)
{
	set_secret(s, &s->join_token, token);
}

bool
rpc_server_join_required(rpc_server_t *s)
{
	return secret_set(s, &s->join_token);
}

void
rpc_server_set_session(rpc_server_t *s, const char *secret)
{
	set_secret(s, &s->session, secret);
}

bool
rpc_server_mtls(const rpc_server_t *s)
{
	return s->tls.tls.require_client_cert;
}

void
rpc_server_reload_tls(rpc_server_t *s)
{
	rpc_tls_src_reload(&s->tls);
}
