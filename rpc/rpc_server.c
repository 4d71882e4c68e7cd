/*
 * rpc_server.c - the unary gRPC server (see rpc.h for the threading).
 *
 * A call holds references: one for its RECV_CLOSE_ON_SERVER batch (started
 * at once, so cancellation is noticed), one for the batch in flight (the
 * request read, or the final send), and one while a handler owns it.  The
 * completion-queue thread destroys a call when the last goes.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/utf8.h"
#include "rpc/proto_conv.h"
#include "rpc/rpc.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_internal.h"

typedef enum tag_kind { TAG_NEW, TAG_RECV, TAG_CLOSE, TAG_SENT, TAG_SHUTDOWN } tag_kind_t;

typedef struct tag {
	rpc_call_t *call;
	tag_kind_t kind;
} tag_t;

typedef struct method_ent {
	char *path;
	const ProtobufCMethodDescriptor *md;
	rpc_handler_fn fn;
	rpc_cred_t need;       /* its row in rpc_auth.c */
	bool or_operator;
	void *ctx;
} method_ent_t;


struct rpc_call {
	rpc_server_t *srv;
	grpc_call *gc;
	grpc_call_details details;
	grpc_metadata_array md;
	grpc_byte_buffer *recv_buf, *send_buf;
	grpc_slice status_details;
	int close_cancelled;
	atomic_int cancelled;
	atomic_int refs;
	tag_t t_new, t_recv, t_close, t_sent;
	const method_ent_t *m;
	ProtobufCMessage *req;
	char *peer;
	char *session;              /* refit-session presented (NULL: none) */
	bool by_operator;           /* or_operator methods: the operator token did */
	size_t session_len;
	uint64_t t0_ns;             /* arrival (for opts.observe) */
	rpc_call_t *next;
};

struct rpc_server {
	grpc_server *srv;
	grpc_completion_queue *cq;
	pthread_t th;
	bool started;
	uv_loop_t *loop;
	uv_async_t async;
	pthread_mutex_t mu;
	rpc_call_t *qhead, *qtail;
	bool stopping;              /* under mu */
	VEC(method_ent_t) methods;
	char *listen, *token, *join_token, *session;  /* the secrets under mu */
	size_t max_msg;
	rpc_tls_t tls;
	int lockfd;
	tag_t t_shutdown;
	void (*observe)(const char *method, const char *code, double seconds);
	void (*refused)(const char *method, const char *reason);
	rpc_refusals_t refusals;    /* the refusal log's limiter (own lock) */
};

/* ---- calls ---------------------------------------------------------------- */

static void request_new(rpc_server_t *s);

static void
call_destroy(rpc_call_t *c)
{
	if (c->gc != NULL)
		grpc_call_unref(c->gc);
	grpc_call_details_destroy(&c->details);
	grpc_metadata_array_destroy(&c->md);
	if (c->recv_buf)
		grpc_byte_buffer_destroy(c->recv_buf);
	if (c->send_buf)
		grpc_byte_buffer_destroy(c->send_buf);
	grpc_slice_unref(c->status_details);
	if (c->req)
		protobuf_c_message_free_unpacked(c->req, NULL);
	if (c->peer)
		gpr_free(c->peer);
	free(c->session);
	free(c);
}

static void
call_unref(rpc_call_t *c)
{
	if (atomic_fetch_sub(&c->refs, 1) == 1)
		call_destroy(c);
}

/* The call's latency by method and status code (unknown methods: "unknown"). */
static void
rpc_server_observe(const rpc_call_t *c, int code)
{
	const char *method = c->m ? c->m->md->name : "unknown";

	if (c->srv->observe == NULL)
		return;
	c->srv->observe(method, rpc_grpc_code_name(code),
			c->t0_ns ? (double)(uv_hrtime() - c->t0_ns) / 1e9 : 0.0);
}

/* Start the final batch: status, and a message when resp is given. */
static void
send_final(rpc_call_t *c, int code, const char *msg, const ProtobufCMessage *resp)
{
	grpc_op ops[3];
	size_t n = 0;

	memset(ops, 0, sizeof(ops));
	ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
	n++;
	if (resp != NULL) {
		size_t len = protobuf_c_message_get_packed_size(resp);
		grpc_slice sl = grpc_slice_malloc(len);

		protobuf_c_message_pack(resp, GRPC_SLICE_START_PTR(sl));
		c->send_buf = grpc_raw_byte_buffer_create(&sl, 1);
		grpc_slice_unref(sl);
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n].data.send_message.send_message = c->send_buf;
		n++;
	}
	rpc_server_observe(c, code);
	grpc_slice_unref(c->status_details);
	c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = (grpc_status_code)code;
	ops[n].data.send_status_from_server.status_details = &c->status_details;
	n++;
	atomic_fetch_add(&c->refs, 1);
	if (grpc_call_start_batch(c->gc, ops, n, &c->t_sent, NULL) != GRPC_CALL_OK) {
		log_warnx("rpc: cannot answer a call from %s", c->peer ? c->peer : "?");
		call_unref(c);
	}
}

static void
fail_now(rpc_call_t *c, int code, const char *fmt, ...)
{
	char msg[REFIT_ERR_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	utf8_vformat(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_final(c, code, msg, NULL);
}

void
rpc_call_reply(rpc_call_t *c, const ProtobufCMessage *resp)
{
	send_final(c, GRPC_STATUS_OK, NULL, resp);
	call_unref(c); /* the handler's reference */
}

void
rpc_call_fail(rpc_call_t *c, refit_status_t st, const char *fmt, ...)
{
	refit_err_t e;
	va_list ap;

	refit_err_clear(&e);
	va_start(ap, fmt);
	refit_err_vset(&e, st, fmt, ap);
	va_end(ap);
	send_final(c, rpc_status_to_grpc(st), e.msg, NULL);
	call_unref(c);
}

bool
rpc_call_cancelled(const rpc_call_t *c)
{
	return atomic_load(&c->cancelled) != 0;
}

int64_t
rpc_call_ms_left(const rpc_call_t *c)
{
	gpr_timespec dl = gpr_convert_clock_type(c->details.deadline, GPR_CLOCK_MONOTONIC);
	gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);

	if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0)
		return INT64_MAX;
	return (int64_t)gpr_time_to_millis(gpr_time_sub(dl, now));
}

const char *
rpc_call_peer(const rpc_call_t *c)
{
	return c->peer ? c->peer : "?";
}

/* ---- completion-queue thread --------------------------------------------- */

static const method_ent_t *
find_method(const rpc_server_t *s, grpc_slice path)
{
	for (size_t i = 0; i < s->methods.n; i++)
		if (grpc_slice_str_cmp(path, s->methods.v[i].path) == 0)
			return &s->methods.v[i];
	return NULL;
}

/* The value of metadata key (NULL: not sent). */
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
static void
refusal_note(rpc_server_t *s, const rpc_call_t *c, const char *reason, const char *msg)
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

/* Answer c refused (not releasing the handler's reference). */
static void
refuse_v(rpc_call_t *c, int code, const char *reason, const char *fmt, va_list ap)
{
	char msg[REFIT_ERR_MSG_MAX];

	utf8_vformat(msg, sizeof(msg), fmt, ap);
	refusal_note(c->srv, c, reason, msg);
	send_final(c, code, msg, NULL);
}

/* Refuse from the completion-queue thread (the handler never sees it). */
static void __attribute__((format(printf, 4, 5)))
refuse_now(rpc_call_t *c, int code, const char *reason, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	refuse_v(c, code, reason, fmt, ap);
	va_end(ap);
}

void
rpc_call_refuse(rpc_call_t *c, refit_status_t st, const char *reason, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	refuse_v(c, rpc_status_to_grpc(st), reason, fmt, ap);
	va_end(ap);
	call_unref(c);
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

bool
rpc_call_by_operator(const rpc_call_t *c)
{
	return c->by_operator;
}

/*
 * The credential c's method needs (its row in rpc_auth.c), checked before
 * the request is decoded, so a refusal costs less than any call; false:
 * refused and answered.  Member methods: the join token here, and the
 * session when this server has one (a node); else the handler matches
 * rpc_call_session with the member the request names (the coordinator).
 */
static bool
cred_ok(rpc_server_t *s, rpc_call_t *c)
{
	const grpc_slice *v;
	bool absent;

	if (c->m->need == RPC_CRED_NONE)
		return true;
	if (c->m->need == RPC_CRED_OPERATOR) {
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
on_new(rpc_server_t *s, rpc_call_t *c)
{
	grpc_op op;

	request_new(s); /* keep one request outstanding */
	c->t0_ns = uv_hrtime();
	c->peer = grpc_call_get_peer(c->gc);
	atomic_store(&c->refs, 2); /* close batch + recv batch */
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	op.data.recv_close_on_server.cancelled = &c->close_cancelled;
	if (grpc_call_start_batch(c->gc, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK)
		call_unref(c);
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &c->recv_buf;
	if (grpc_call_start_batch(c->gc, &op, 1, &c->t_recv, NULL) != GRPC_CALL_OK)
		call_unref(c);
}

/* Decode and check a request; then hand it to the loop. */
static void
on_recv(rpc_server_t *s, rpc_call_t *c, bool ok)
{
	grpc_byte_buffer_reader rd;
	grpc_slice all;
	bool queued = false;

	c->m = find_method(s, c->details.method);
	if (!ok || c->recv_buf == NULL) {
		if (c->m == NULL)
			goto unknown;
		fail_now(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: no request message",
			 c->m->path);
		goto out;
	}
	if (c->m == NULL)
		goto unknown;
	if (!cred_ok(s, c))
		goto out;
	grpc_byte_buffer_reader_init(&rd, c->recv_buf);
	all = grpc_byte_buffer_reader_readall(&rd);
	grpc_byte_buffer_reader_destroy(&rd);
	{
		/* strings checked once, here: UTF-8, no NUL, bounded */
		refit_err_t e;

		refit_err_clear(&e);
		if (conv_check_strings(c->m->md->input, GRPC_SLICE_START_PTR(all),
				       GRPC_SLICE_LENGTH(all), &e) != REFIT_OK) {
			fail_now(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", c->m->path, e.msg);
			grpc_slice_unref(all);
			goto out;
		}
	}
	c->req = protobuf_c_message_unpack(c->m->md->input, NULL, GRPC_SLICE_LENGTH(all),
					   GRPC_SLICE_START_PTR(all));
	if (c->req == NULL) {
		fail_now(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: malformed request: %zu bytes "
			 "that do not decode as %s", c->m->path, GRPC_SLICE_LENGTH(all),
			 c->m->md->input->name);
		grpc_slice_unref(all);
		goto out;
	}
	grpc_slice_unref(all);
	pthread_mutex_lock(&s->mu);
	if (!s->stopping) {
		atomic_fetch_add(&c->refs, 1); /* the handler's */
		c->next = NULL;
		if (s->qtail)
			s->qtail->next = c;
		else
			s->qhead = c;
		s->qtail = c;
		queued = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (queued)
		uv_async_send(&s->async);
	else
		fail_now(c, GRPC_STATUS_UNAVAILABLE, "server is shutting down");
	goto out;
unknown:
	{
		char *path = grpc_slice_to_c_string(c->details.method);

		fail_now(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method %s", path);
		gpr_free(path);
	}
out:
	call_unref(c); /* the recv batch's */
}

static void *
cq_thread(void *arg)
{
	rpc_server_t *s = arg;
	bool shut = false;

	grpc_event ev;

	while (rpc_cq_next(s->cq, &ev)) {
		tag_t *t = ev.tag;

		switch (t->kind) {
		case TAG_SHUTDOWN:
			/* no batch may start on the queue after this */
			shut = true;
			grpc_completion_queue_shutdown(s->cq);
			break;
		case TAG_NEW:
			if (ev.success && !shut)
				on_new(s, t->call);
			else
				call_destroy(t->call); /* the server stopped */
			break;
		case TAG_RECV:
			if (shut)
				call_unref(t->call);
			else
				on_recv(s, t->call, ev.success);
			break;
		case TAG_CLOSE:
			atomic_store(&t->call->cancelled, t->call->close_cancelled ? 1 : 0);
			call_unref(t->call);
			break;
		case TAG_SENT:
			call_unref(t->call);
			break;
		}
	}
	return NULL;
}

static void
request_new(rpc_server_t *s)
{
	rpc_call_t *c = xcalloc(1, sizeof(*c));

	c->srv = s;
	grpc_call_details_init(&c->details);
	grpc_metadata_array_init(&c->md);
	c->status_details = grpc_empty_slice();
	c->t_new = (tag_t){c, TAG_NEW};
	c->t_recv = (tag_t){c, TAG_RECV};
	c->t_close = (tag_t){c, TAG_CLOSE};
	c->t_sent = (tag_t){c, TAG_SENT};
	if (grpc_server_request_call(s->srv, &c->gc, &c->details, &c->md, s->cq, s->cq,
				     &c->t_new) != GRPC_CALL_OK)
		call_destroy(c);
}

/* ---- loop side ----------------------------------------------------------- */

static void
on_async(uv_async_t *a)
{
	rpc_server_t *s = a->data;

	for (;;) {
		rpc_call_t *c;

		pthread_mutex_lock(&s->mu);
		c = s->qhead;
		if (c) {
			s->qhead = c->next;
			if (s->qhead == NULL)
				s->qtail = NULL;
		}
		pthread_mutex_unlock(&s->mu);
		if (c == NULL)
			break;
		if (rpc_call_cancelled(c)) {
			rpc_call_fail(c, REFIT_ERR_ABORTED, "cancelled before it ran");
			continue;
		}
		c->m->fn(c->m->ctx, c, c->req);
	}
}

/* ---- setup and teardown -------------------------------------------------- */

rpc_server_t *
rpc_server_new(const rpc_server_opts_t *o, uv_loop_t *loop, refit_err_t *err)
{
	rpc_server_t *s;

	if (o->listen == NULL || o->listen[0] == '\0') {
		refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: no listen address");
		return NULL;
	}
	grpc_init();
	s = xcalloc(1, sizeof(*s));
	s->loop = loop;
	s->listen = xstrdup(o->listen);
	s->token = o->token && o->token[0] ? xstrdup(o->token) : NULL;
	s->join_token = o->join_token && o->join_token[0] ? xstrdup(o->join_token) : NULL;
	s->refused = o->refused;
	rpc_refusals_init(&s->refusals);
	s->max_msg = o->max_msg_bytes ? o->max_msg_bytes : RPC_DEFAULT_MAX_MSG;
	s->observe = o->observe;
	s->tls = o->tls;
	s->lockfd = -1;
	s->t_shutdown = (tag_t){NULL, TAG_SHUTDOWN};
	pthread_mutex_init(&s->mu, NULL);
	uv_async_init(loop, &s->async, on_async);
	s->async.data = s;
	return s;
}

refit_status_t
rpc_server_add_service(rpc_server_t *s, const ProtobufCServiceDescriptor *svc,
		       const rpc_method_cfg_t *methods, size_t n, void *ctx,
		       refit_err_t *err)
{
	for (size_t i = 0; i < n; i++) {
		const rpc_auth_row_t *row = rpc_auth_find(svc->name, methods[i].name);
		const ProtobufCMethodDescriptor *md = NULL;
		method_ent_t e;
		size_t len;

		if (row == NULL)
			return refit_err_set(err, REFIT_ERR_INTERNAL, "rpc: %s.%s has no row in "
					     "the authorization table (rpc/rpc_auth.c)", svc->name,
					     methods[i].name);

		for (unsigned k = 0; k < svc->n_methods; k++)
			if (strcmp(svc->methods[k].name, methods[i].name) == 0)
				md = &svc->methods[k];
		if (md == NULL)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "rpc: service %s has no method %s", svc->name,
					     methods[i].name);
		len = strlen(svc->name) + strlen(md->name) + 3;
		e.path = xmalloc(len);
		snprintf(e.path, len, "/%s/%s", svc->name, md->name);
		e.md = md;
		e.fn = methods[i].fn;
		e.need = row->need;
		e.or_operator = row->or_operator;
		e.ctx = ctx;
		VEC_PUSH(&s->methods, e);
	}
	return REFIT_OK;
}

/* Guard a unix socket path: gRPC unlinks an existing socket file, so a
 * second daemon would steal the first one's path without this lock. */
static refit_status_t
lock_unix_path(rpc_server_t *s, refit_err_t *err)
{
	char lock[4096];

	if (strncmp(s->listen, "unix:", 5) != 0)
		return REFIT_OK;
	snprintf(lock, sizeof(lock), "%s.lock", s->listen + 5);
	s->lockfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (s->lockfd < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: %s: %s", lock, strerror(errno));
	if (flock(s->lockfd, LOCK_EX | LOCK_NB) < 0)
		return refit_err_set(err, errno == EWOULDBLOCK ? REFIT_ERR_EXISTS : REFIT_ERR_SYS,
				     "rpc: %s is in use by another process (lock %s held)",
				     s->listen + 5, lock);
	return REFIT_OK;
}

refit_status_t
rpc_server_start(rpc_server_t *s, int *port, refit_err_t *err)
{
	grpc_arg args[4];
	grpc_channel_args ca = {4, args};
	grpc_server_credentials *creds;
	int p;

	CHECK(lock_unix_path(s, err));
	args[0] = rpc_arg_int(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)s->max_msg);
	args[1] = rpc_arg_int(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)s->max_msg);
	args[2] = rpc_arg_int(GRPC_ARG_ALLOW_REUSEPORT, 0);
	args[3] = rpc_arg_int(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, RPC_MIN_PING_MS);
	CHECK(rpc_server_creds(&s->tls, &creds, err));
	s->srv = grpc_server_create(&ca, NULL);
	s->cq = grpc_completion_queue_create_for_next(NULL);
	grpc_server_register_completion_queue(s->srv, s->cq, NULL);
	p = grpc_server_add_http2_port(s->srv, s->listen, creds);
	grpc_server_credentials_release(creds);
	if (p == 0)
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: cannot listen on %s (address "
				     "in use, or not an address)", s->listen);
	grpc_server_start(s->srv);
	s->started = true;
	request_new(s);
	if (pthread_create(&s->th, NULL, cq_thread, s) != 0)
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: cannot start a thread");
	if (port)
		*port = strncmp(s->listen, "unix:", 5) == 0 ? 0 : p;
	return REFIT_OK;
}

static void
on_closed(uv_handle_t *h)
{
	rpc_server_t *s = h->data;

	for (size_t i = 0; i < s->methods.n; i++)
		free(s->methods.v[i].path);
	VEC_FREE(&s->methods);
	pthread_mutex_destroy(&s->mu);
	rpc_refusals_fini(&s->refusals);
	free(s->listen);
	free(s->token);
	free(s->join_token);
	free(s->session);
	free(s);
	grpc_shutdown();
}

void
rpc_server_drain(rpc_server_t *s)
{
	rpc_call_t *q;

	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	q = s->qhead;
	s->qhead = s->qtail = NULL;
	pthread_mutex_unlock(&s->mu);
	while (q) {
		rpc_call_t *next = q->next;

		rpc_call_fail(q, REFIT_ERR_UNAVAILABLE, "server is shutting down");
		q = next;
	}
}

void
rpc_server_free(rpc_server_t *s)
{
	if (s == NULL)
		return;
	rpc_server_drain(s);
	if (s->started) {
		grpc_server_shutdown_and_notify(s->srv, s->cq, &s->t_shutdown);
		grpc_server_cancel_all_calls(s->srv);
		pthread_join(s->th, NULL);
		grpc_server_destroy(s->srv);
		grpc_completion_queue_destroy(s->cq);
	} else if (s->srv) {
		grpc_server_destroy(s->srv);
		grpc_completion_queue_shutdown(s->cq);
		while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
						  NULL).type != GRPC_QUEUE_SHUTDOWN)
			;
		grpc_completion_queue_destroy(s->cq);
	}
	if (s->lockfd >= 0)
		close(s->lockfd);
	uv_close((uv_handle_t *)&s->async, on_closed);
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
