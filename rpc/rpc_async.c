/*
 * rpc_async.c - the daemons' asynchronous unary gRPC client (see rpc.h).
 *
 * Calls start on the loop thread: the request is packed, a call is made on
 * the target's cached channel and the whole unary exchange goes as one
 * batch whose tag is the call.  One completion-queue thread per engine
 * (per process) waits on the queue and hands finished calls to the loop
 * through a locked list and uv_async_send; the loop decodes the answer and
 * runs the caller's done callback.  Nothing holds a thread per call: a
 * thousand outstanding calls are a thousand entries on the queue.
 *
 * Channels: one per target, created on first use and kept (keepalive and
 * reconnect back-off arguments below), dropped by rpc_async_forget (a
 * member left) or when the cache is full and a channel is idle.  A channel
 * dropped while calls use it is destroyed after the last of them.
 *
 * Connectivity: every cached channel has a connectivity watch on the same
 * queue (grpc_channel_watch_connectivity_state, re-armed after each change
 * and every WATCH_MS), so no thread waits for it.  Every change goes to
 * the owner's hook (rpc_async_on_conn), flagged when the channel enters
 * TRANSIENT_FAILURE or SHUTDOWN -- once until it is READY again, however
 * often the reconnect back-off retries -- or recovers; without a hook the
 * engine logs those two itself.  A connection that was READY and
 * went IDLE (gRPC's way of saying it was lost) is reconnected at once, so a
 * peer that is gone shows as TRANSIENT_FAILURE, not as a quiet IDLE.  A
 * dropped channel is destroyed, which ends its watch; its record is freed
 * when the watch's tag comes back.
 *
 * Deadlines are gRPC's own (every call has one).  rpc_async_cancel cancels
 * a group's calls (grpc_call_cancel; their done callbacks still run, with
 * REFIT_ERR_ABORTED); rpc_async_close cancels everything and frees the
 * engine once the last answer is delivered.
 *
 * Thread: everything here runs on the loop thread except cq_thread, which
 * touches only the completed list (under mu) and the queue.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/strmap.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_internal.h"

/* more targets than this: idle channels go, least recently used first */
#define MAX_CHANNELS 8192
/* a connectivity watch is re-armed at least this often */
#define WATCH_MS 60000

/* What a completion-queue tag is: every tag starts with one. */
typedef struct qent {
	enum { Q_CALL, Q_WATCH } kind;
	int ok;                   /* the event's success, from the queue */
	struct qent *qnext;       /* finished, waiting for the loop (under mu) */
} qent_t;

typedef struct chan {
	qent_t q;              /* the connectivity watch's tag */
	char *target;
	grpc_channel *ch;
	uint32_t calls;        /* outstanding calls using it */
	bool dropped;          /* out of the cache: destroyed after its last call */
	uint64_t used;         /* last use, a counter */
	rpc_conn_t state;      /* last observed */
	bool watching;         /* a watch is armed (the record lives until it ends) */
	bool lost_logged;      /* TRANSIENT_FAILURE/SHUTDOWN logged, not READY since */
} chan_t;

typedef struct acall {
	qent_t q;              /* first: the tag */
	rpc_async_t *a;
	chan_t *chan;
	grpc_call *call;
	const ProtobufCMethodDescriptor *md;
	uint64_t group;
	grpc_byte_buffer *send, *recv;
	grpc_metadata_array init_md, trail_md;
	grpc_metadata md_out[3];  /* authorization, join token, session */
	size_t n_md_out;
	grpc_status_code code;
	grpc_slice details;
	rpc_done_fn done;
	void *arg;
	struct acall *prev, *next;  /* outstanding calls (loop thread) */
} acall_t;

struct rpc_async {
	uv_loop_t *loop;
	uv_async_t wake;
	grpc_completion_queue *cq;
	pthread_t th;
	pthread_mutex_t mu;
	qent_t *qhead, *qtail;      /* under mu */
	/* loop thread only */
	grpc_channel_credentials *creds;
	size_t max_msg;
	char *auth;                 /* "Bearer <token>" or NULL */
	char *join;                 /* the join token or NULL */
	strmap_t sess_of;           /* target -> index in sess */
	VEC(char *) sess;           /* a target's session secret (NULL: none) */
	bool tls;                   /* channels verify the server (tls.ca_file) */
	rpc_tls_t tls_files;        /* the files (the caller's strings) */
	char *server_name;          /* tls.server_name (NULL: none) */
	strmap_t name_of;           /* target -> index in names */
	VEC(char *) names;          /* a target's certificate name (NULL: default) */
	VEC(chan_t *) chans;
	uint64_t clock;
	acall_t *live;
	size_t nlive;
	uint64_t started, finished, cancelled;
	rpc_conn_fn conn_fn;
	void *conn_arg;
	bool closing, torn_down;
};

/* ---- completion-queue thread --------------------------------------------- */

static void *
cq_thread(void *arg)
{
	rpc_async_t *a = arg;
	grpc_event ev;

	while (rpc_cq_next(a->cq, &ev)) {
		qent_t *x = ev.tag;

		x->ok = ev.success;
		x->qnext = NULL;
		pthread_mutex_lock(&a->mu);
		if (a->qtail)
			a->qtail->qnext = x;
		else
			a->qhead = x;
		a->qtail = x;
		pthread_mutex_unlock(&a->mu);
		uv_async_send(&a->wake);
	}
	return NULL;
}

/* ---- channels -------------------------------------------------------------- */

/* A dropped channel: destroyed after its last call (which ends its
 * watch), its record freed once the watch's tag is back. */
static void
chan_release(chan_t *c)
{
	if (!c->dropped || c->calls > 0)
		return;
	if (c->ch) {
		grpc_channel_destroy(c->ch);
		c->ch = NULL;
	}
	if (c->watching)
		return;
	free(c->target);
	free(c);
}

/* Take c out of the cache; it goes now or after its last call. */
static void
chan_drop(rpc_async_t *a, size_t i)
{
	chan_t *c = a->chans.v[i];

	a->chans.v[i] = a->chans.v[--a->chans.n];
	c->dropped = true;
	chan_release(c);
}

const char *
rpc_conn_name(rpc_conn_t st)
{
	static const char *const n[] = {"IDLE", "CONNECTING", "READY", "TRANSIENT_FAILURE",
					"SHUTDOWN"};

	return st >= RPC_CONN_IDLE && st <= RPC_CONN_SHUTDOWN ? n[st] : "NONE";
}

static void
watch_arm(rpc_async_t *a, chan_t *c)
{
	grpc_channel_watch_connectivity_state(c->ch, (grpc_connectivity_state)c->state,
					      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
							   gpr_time_from_millis(WATCH_MS,
										GPR_TIMESPAN)),
					      a->cq, &c->q);
	c->watching = true;
}

/* c's watch ended (a change, or its deadline): note the state, re-arm. */
static void
on_watch(rpc_async_t *a, chan_t *c)
{
	rpc_conn_t old = c->state, now;

	/* c->watching stays set until the end: the hook may drop c */
	if (c->dropped || a->closing || c->ch == NULL) {
		c->watching = false;
		chan_release(c);
		return;
	}
	now = (rpc_conn_t)grpc_channel_check_connectivity_state(c->ch, 0);
	if (now != old) {
		int outage = 0;

		c->state = now;
		log_debug(LOG_SUB_RPC, "rpc: channel to %s: %s -> %s", c->target,
			  rpc_conn_name(old), rpc_conn_name(now));
		if ((now == RPC_CONN_TRANSIENT_FAILURE || now == RPC_CONN_SHUTDOWN) &&
		    !c->lost_logged) {
			c->lost_logged = true;
			outage = 1;
		} else if (now == RPC_CONN_READY && c->lost_logged) {
			c->lost_logged = false;
			outage = -1;
		}
		/* the owner's hook says it with its own names; else it is said here */
		if (outage > 0 && a->conn_fn == NULL)
			log_warnx("rpc: channel to %s: %s (connection lost or refused; "
				  "reconnecting with back-off)", c->target, rpc_conn_name(now));
		else if (outage < 0 && a->conn_fn == NULL)
			log_info("rpc: channel to %s: READY again", c->target);
		/* READY -> IDLE: the connection went away; find out now whether
		 * the peer is still there */
		if (old == RPC_CONN_READY && now == RPC_CONN_IDLE)
			c->state = now = (rpc_conn_t)grpc_channel_check_connectivity_state(c->ch,
											    1);
		if (a->conn_fn)
			a->conn_fn(a->conn_arg, c->target, old, now, outage);
		/* the hook may have dropped the channel (rpc_async_forget) */
		if (c->dropped) {
			c->watching = false;
			chan_release(c);
			return;
		}
	}
	watch_arm(a, c);
}

static chan_t *
chan_get(rpc_async_t *a, const char *target)
{
	grpc_arg args[RPC_CHANNEL_ARGS + 4];
	grpc_channel_args ca = {RPC_CHANNEL_ARGS + 3, args};
	int32_t ni = strmap_get(&a->name_of, target);
	const char *name = ni >= 0 && a->names.v[ni] ? a->names.v[ni] : a->server_name;
	chan_t *c;

	for (size_t i = 0; i < a->chans.n; i++)
		if (strcmp(a->chans.v[i]->target, target) == 0) {
			a->chans.v[i]->used = ++a->clock;
			return a->chans.v[i];
		}
	if (a->chans.n >= MAX_CHANNELS) {
		size_t lru = SIZE_MAX;

		for (size_t i = 0; i < a->chans.n; i++)
			if (a->chans.v[i]->calls == 0 &&
			    (lru == SIZE_MAX || a->chans.v[i]->used < a->chans.v[lru]->used))
				lru = i;
		if (lru != SIZE_MAX)
			chan_drop(a, lru);
	}
	/* the same size and back-off as the blocking client */
	rpc_channel_args(args, a->max_msg);
	/* a peer that vanished under a call in flight is noticed (servers
	 * here accept pings this often, see rpc_server.c) */
	args[RPC_CHANNEL_ARGS] = rpc_arg_int(GRPC_ARG_KEEPALIVE_TIME_MS, RPC_KEEPALIVE_MS);
	args[RPC_CHANNEL_ARGS + 1] = rpc_arg_int(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000); /* a busy peer is not a dead one */
	args[RPC_CHANNEL_ARGS + 2] = rpc_arg_int(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
	if (name != NULL && a->tls) /* mutual TLS: the peer is who the name says */
		args[ca.num_args++] = rpc_arg_str(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, name);
	c = xcalloc(1, sizeof(*c));
	c->q.kind = Q_WATCH;
	c->target = xstrdup(target);
	c->ch = grpc_channel_create(target, a->creds, &ca);
	c->used = ++a->clock;
	c->state = (rpc_conn_t)grpc_channel_check_connectivity_state(c->ch, 0);
	watch_arm(a, c);
	VEC_PUSH(&a->chans, c);
	return c;
}

void
rpc_async_forget(rpc_async_t *a, const char *target)
{
	if (a == NULL || target == NULL)
		return;
	for (size_t i = 0; i < a->chans.n; i++)
		if (strcmp(a->chans.v[i]->target, target) == 0) {
			chan_drop(a, i);
			return;
		}
}

/* ---- calls ------------------------------------------------------------------- */

static void teardown(rpc_async_t *a);

static void
call_free(rpc_async_t *a, acall_t *x)
{
	chan_t *c = x->chan;

	if (x->call)
		grpc_call_unref(x->call);
	if (x->send)
		grpc_byte_buffer_destroy(x->send);
	if (x->recv)
		grpc_byte_buffer_destroy(x->recv);
	(void)a;
	for (size_t i = 0; i < x->n_md_out; i++)
		grpc_slice_unref(x->md_out[i].value);
	grpc_metadata_array_destroy(&x->init_md);
	grpc_metadata_array_destroy(&x->trail_md);
	grpc_slice_unref(x->details);
	free(x);
	c->calls--;
	chan_release(c);
}

/* The answer of a finished call: status, message and decoded response. */
static refit_status_t
call_result(acall_t *x, ProtobufCMessage **resp, refit_err_t *err)
{
	const char *target = x->chan->target, *method = x->md->name;
	grpc_byte_buffer_reader rd;
	grpc_slice all;

	*resp = NULL;
	if (!x->q.ok)
		return refit_err_set(err, REFIT_ERR_INTERNAL, "%s %s: the call's batch failed",
				     target, method);
	if (x->code != GRPC_STATUS_OK) {
		char *d = grpc_slice_to_c_string(x->details);
		refit_status_t st = refit_err_set(err, rpc_status_from_grpc(x->code),
						  "%s %s: %s: %s", target, method,
						  rpc_grpc_code_name(x->code), d);

		gpr_free(d);
		return st;
	}
	if (x->recv == NULL || !grpc_byte_buffer_reader_init(&rd, x->recv))
		return refit_err_set(err, REFIT_ERR_REMOTE, "%s %s: empty answer", target, method);
	all = grpc_byte_buffer_reader_readall(&rd);
	grpc_byte_buffer_reader_destroy(&rd);
	*resp = protobuf_c_message_unpack(x->md->output, NULL, GRPC_SLICE_LENGTH(all),
					  GRPC_SLICE_START_PTR(all));
	grpc_slice_unref(all);
	if (*resp == NULL)
		return refit_err_set(err, REFIT_ERR_REMOTE, "%s %s: answer does not decode as %s",
				     target, method, x->md->output->name);
	return REFIT_OK;
}

static void
on_wake(uv_async_t *h)
{
	rpc_async_t *a = h->data;

	for (;;) {
		ProtobufCMessage *resp;
		refit_err_t err;
		acall_t *x;
		qent_t *q;

		pthread_mutex_lock(&a->mu);
		q = a->qhead;
		if (q != NULL && (a->qhead = q->qnext) == NULL)
			a->qtail = NULL;
		pthread_mutex_unlock(&a->mu);
		if (q == NULL)
			break;
		if (q->kind == Q_WATCH) {
			on_watch(a, (chan_t *)q);
			continue;
		}
		x = (acall_t *)q;
		if (x->prev)
			x->prev->next = x->next;
		else
			a->live = x->next;
		if (x->next)
			x->next->prev = x->prev;
		a->nlive--;
		a->finished++;
		refit_err_clear(&err);
		call_result(x, &resp, &err);
		x->done(x->arg, err.status, err.msg, resp);
		if (resp)
			protobuf_c_message_free_unpacked(resp, NULL);
		call_free(a, x);
	}
	if (a->nlive == 0) {
		if (a->closing)
			teardown(a);
		else
			uv_unref((uv_handle_t *)&a->wake); /* idle: the loop may end */
	}
}

static void
add_md(acall_t *x, const char *key, const char *value)
{
	x->md_out[x->n_md_out].key = grpc_slice_from_static_string(key);
	x->md_out[x->n_md_out].value = grpc_slice_from_copied_string(value);
	x->n_md_out++;
}

/* The session secret sent to target (NULL: none). */
static const char *
session_of(const rpc_async_t *a, const char *target)
{
	int32_t i = strmap_get(&a->sess_of, target);

	return i < 0 ? NULL : a->sess.v[i];
}

void
rpc_async_set_session(rpc_async_t *a, const char *target, const char *secret)
{
	int32_t i = strmap_get(&a->sess_of, target);

	if (i < 0) {
		if (secret == NULL)
			return;
		i = (int32_t)a->sess.n;
		VEC_PUSH(&a->sess, NULL);
		strmap_put(&a->sess_of, target, i);
	}
	free(a->sess.v[i]);
	a->sess.v[i] = secret ? xstrdup(secret) : NULL;
}

void
rpc_async_set_server_name(rpc_async_t *a, const char *target, const char *name)
{
	int32_t i = strmap_get(&a->name_of, target);
	const char *was = i >= 0 ? a->names.v[i] : NULL;

	if ((was == NULL && name == NULL) || (was && name && strcmp(was, name) == 0))
		return;
	if (i < 0) {
		i = (int32_t)a->names.n;
		VEC_PUSH(&a->names, NULL);
		strmap_put(&a->name_of, target, i);
	}
	free(a->names.v[i]);
	a->names.v[i] = name ? xstrdup(name) : NULL;
	rpc_async_forget(a, target); /* its channel checked the old name */
}

refit_status_t
rpc_async_reload_tls(rpc_async_t *a, refit_err_t *err)
{
	grpc_channel_credentials *creds;

	if (!a->tls)
		return REFIT_OK;
	CHECK(rpc_channel_creds(&a->tls_files, &creds, err));
	grpc_channel_credentials_release(a->creds);
	a->creds = creds;
	while (a->chans.n) /* calls in flight finish on the old ones */
		chan_drop(a, a->chans.n - 1);
	return REFIT_OK;
}

void
rpc_async_set_join_token(rpc_async_t *a, const char *token)
{
	free(a->join);
	a->join = token && token[0] ? xstrdup(token) : NULL;
}

/* The unary exchange as one batch tagged x. */
static grpc_call_error
start_batch(rpc_async_t *a, acall_t *x, const char *session)
{
	grpc_op ops[6];

	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (a->auth)
		add_md(x, "authorization", a->auth);
	if (a->join)
		add_md(x, RPC_MD_JOIN_TOKEN, a->join);
	if (session)
		add_md(x, RPC_MD_SESSION, session);
	ops[0].data.send_initial_metadata.count = x->n_md_out;
	ops[0].data.send_initial_metadata.metadata = x->n_md_out ? x->md_out : NULL;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = x->send;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &x->init_md;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &x->recv;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &x->trail_md;
	ops[5].data.recv_status_on_client.status = &x->code;
	ops[5].data.recv_status_on_client.status_details = &x->details;
	return grpc_call_start_batch(x->call, ops, 6, x, NULL);
}

refit_status_t
rpc_async_call(rpc_async_t *a, uint64_t group, const char *target,
	       const ProtobufCServiceDescriptor *svc, const char *method,
	       const ProtobufCMessage *req, int64_t timeout_ms, rpc_done_fn done, void *arg,
	       refit_err_t *err)
{
	const ProtobufCMethodDescriptor *md = rpc_method_of(svc, method);
	char path[256];
	grpc_slice sl;
	acall_t *x;

	if (md == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: %s has no method %s",
				     svc->name, method);
	if (target == NULL || target[0] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: %s: no address to call",
				     method);
	if (a->closing)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "rpc: %s to %s: the client is "
				     "shutting down", method, target);
	snprintf(path, sizeof(path), "/%s/%s", svc->name, method);
	x = xcalloc(1, sizeof(*x));
	x->q.kind = Q_CALL;
	x->a = a;
	x->md = md;
	x->group = group;
	x->done = done;
	x->arg = arg;
	x->code = GRPC_STATUS_UNKNOWN;
	x->details = grpc_empty_slice();
	grpc_metadata_array_init(&x->init_md);
	grpc_metadata_array_init(&x->trail_md);
	sl = grpc_slice_malloc(protobuf_c_message_get_packed_size(req));
	protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(sl));
	x->send = grpc_raw_byte_buffer_create(&sl, 1);
	grpc_slice_unref(sl);
	x->chan = chan_get(a, target);
	x->chan->calls++;
	/* a copy: gRPC keeps the method slice (its :path) until the call is sent,
	 * which may be after this returns (a channel still connecting); path
	 * is on this stack ("unknown method" with an empty name, seen) */
	sl = grpc_slice_from_copied_string(path);
	x->call = grpc_channel_create_call(x->chan->ch, NULL, GRPC_PROPAGATE_DEFAULTS, a->cq,
					   sl, NULL,
					   gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
							gpr_time_from_millis(timeout_ms,
									     GPR_TIMESPAN)),
					   NULL);
	grpc_slice_unref(sl);
	if (x->call == NULL || start_batch(a, x, session_of(a, target)) != GRPC_CALL_OK) {
		call_free(a, x);
		return refit_err_set(err, REFIT_ERR_INTERNAL, "rpc: cannot start %s to %s",
				     method, target);
	}
	x->next = a->live;
	if (a->live)
		a->live->prev = x;
	a->live = x;
	if (a->nlive++ == 0)
		uv_ref((uv_handle_t *)&a->wake);
	a->started++;
	return REFIT_OK;
}

size_t
rpc_async_cancel(rpc_async_t *a, uint64_t group)
{
	size_t n = 0;

	if (a == NULL)
		return 0;
	for (acall_t *x = a->live; x; x = x->next)
		if (group == RPC_GROUP_ALL || x->group == group) {
			grpc_call_cancel(x->call, NULL);
			n++;
		}
	a->cancelled += n;
	return n;
}

uint64_t
rpc_async_cancelled(const rpc_async_t *a)
{
	return a ? a->cancelled : 0;
}

void
rpc_async_on_conn(rpc_async_t *a, rpc_conn_fn fn, void *arg)
{
	if (a == NULL)
		return;
	a->conn_fn = fn;
	a->conn_arg = arg;
}

rpc_conn_t
rpc_async_conn(const rpc_async_t *a, const char *target)
{
	for (size_t i = 0; a && target && i < a->chans.n; i++)
		if (strcmp(a->chans.v[i]->target, target) == 0)
			return a->chans.v[i]->state;
	return RPC_CONN_NONE;
}

size_t
rpc_async_outstanding(const rpc_async_t *a)
{
	return a ? a->nlive : 0;
}

size_t
rpc_async_channels(const rpc_async_t *a)
{
	return a ? a->chans.n : 0;
}

/* ---- setup and teardown ------------------------------------------------------ */

rpc_async_t *
rpc_async_new(uv_loop_t *loop, const rpc_client_opts_t *o, refit_err_t *err)
{
	rpc_tls_t none = {0};
	rpc_async_t *a = xcalloc(1, sizeof(*a));

	if (rpc_channel_creds(o ? &o->tls : &none, &a->creds, err) != REFIT_OK) {
		free(a);
		return NULL;
	}
	grpc_init();
	a->loop = loop;
	a->max_msg = o && o->max_msg_bytes ? o->max_msg_bytes : RPC_DEFAULT_MAX_MSG;
	if (o && o->token && o->token[0]) {
		size_t n = strlen(o->token) + 8;

		a->auth = xmalloc(n);
		snprintf(a->auth, n, "Bearer %s", o->token);
	}
	rpc_async_set_join_token(a, o ? o->join_token : NULL);
	strmap_init(&a->sess_of);
	strmap_init(&a->name_of);
	a->tls = o && o->tls.ca_file && o->tls.ca_file[0];
	if (a->tls)
		a->tls_files = o->tls;
	a->server_name = o && o->tls.server_name ? xstrdup(o->tls.server_name) : NULL;
	pthread_mutex_init(&a->mu, NULL);
	a->cq = grpc_completion_queue_create_for_next(NULL);
	uv_async_init(loop, &a->wake, on_wake);
	a->wake.data = a;
	uv_unref((uv_handle_t *)&a->wake);
	if (pthread_create(&a->th, NULL, cq_thread, a) != 0) {
		refit_err_set(err, REFIT_ERR_SYS, "rpc: cannot start the client's thread");
		a->th = 0;
		a->closing = true;
		teardown(a);
		return NULL;
	}
	return a;
}

static void
on_closed(uv_handle_t *h)
{
	rpc_async_t *a = h->data;

	pthread_mutex_destroy(&a->mu);
	free(a->auth);
	free(a->join);
	for (size_t i = 0; i < a->sess.n; i++)
		free(a->sess.v[i]);
	VEC_FREE(&a->sess);
	strmap_fini(&a->sess_of);
	for (size_t i = 0; i < a->names.n; i++)
		free(a->names.v[i]);
	VEC_FREE(&a->names);
	strmap_fini(&a->name_of);
	free(a->server_name);
	free(a);
	grpc_shutdown();
}

/*
 * No call is outstanding: destroy the channels (which ends their watches),
 * stop the thread once the queue has given back every tag, free the
 * channels' records and the queue.
 */
static void
teardown(rpc_async_t *a)
{
	qent_t *q;

	if (a->torn_down)
		return;
	a->torn_down = true;
	while (a->chans.n)
		chan_drop(a, a->chans.n - 1);
	VEC_FREE(&a->chans);
	grpc_completion_queue_shutdown(a->cq);
	if (a->th) {
		pthread_join(a->th, NULL);
	} else {
		for (;;) {
			grpc_event ev = grpc_completion_queue_next(
				a->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

			if (ev.type == GRPC_QUEUE_SHUTDOWN)
				break;
			if (ev.type == GRPC_OP_COMPLETE)
				on_watch(a, ev.tag);  /* no call was ever made */
		}
	}
	/* what the thread handed over last: only watches (no call is out) */
	while ((q = a->qhead) != NULL) {
		a->qhead = q->qnext;
		if (q->kind == Q_WATCH)
			on_watch(a, (chan_t *)q);
	}
	a->qtail = NULL;
	grpc_completion_queue_destroy(a->cq);
	grpc_channel_credentials_release(a->creds);
	uv_ref((uv_handle_t *)&a->wake);
	uv_close((uv_handle_t *)&a->wake, on_closed);
}

void
rpc_async_close(rpc_async_t *a)
{
	if (a == NULL || a->closing)
		return;
	a->closing = true;
	rpc_async_cancel(a, RPC_GROUP_ALL);
	if (a->nlive == 0)
		teardown(a);
}
