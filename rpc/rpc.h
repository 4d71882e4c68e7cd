/*
 * rpc.h - a small generic unary RPC layer over gRPC core and protobuf-c.
 *
 * There is no C code generator for gRPC services, so methods are found by
 * protobuf-c's service descriptors: the path of method i of a service is
 * "/" + desc->name + "/" + desc->methods[i].name ("/refit.v1.Coordinator/Join")
 * and its messages are desc->methods[i].input / .output.  Adding a method is
 * one table entry and one handler.
 *
 * Server threads: one completion-queue thread receives calls, decodes the
 * request, checks the credential the method needs (rpc_auth.h: one table
 * for every service; a refusal is logged once per peer host a minute and
 * counted through opts.refused), and hands the call
 * to the daemon's libuv loop through a queue + uv_async_send.  Handlers run
 * on the loop thread, own nothing of gRPC, and answer with rpc_call_reply or
 * rpc_call_fail (at once or later, from the loop thread).  A call the
 * client cancelled, or whose deadline passed, is noticed and reported by
 * rpc_call_cancelled; answering it is harmless.
 *
 * Clients: rpc_client_call is synchronous with a deadline (refitctl,
 * librefit, benchmarks); the daemons use the asynchronous engine
 * (rpc_async_*).  Connection errors are explained (which address, which
 * reason).
 */
#ifndef REFIT_RPC_RPC_H
#define REFIT_RPC_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include <uv.h>

#include "common/err.h"

#define RPC_DEFAULT_MAX_MSG (64u << 20)

typedef struct rpc_server rpc_server_t;
typedef struct rpc_call rpc_call_t;

/* Runs on the loop thread; req is owned by the call. */
typedef void (*rpc_handler_fn)(void *ctx, rpc_call_t *call, const ProtobufCMessage *req);

/* The credential a method needs is its row in rpc_auth.c, not here. */
typedef struct rpc_method_cfg {
	const char *name;      /* method name in the service descriptor */
	rpc_handler_fn fn;
} rpc_method_cfg_t;

/*
 * Mutual TLS (rpc_tls.c; docs/control-plane.md): a node's certificate
 * carries the SAN dNSName "<node id>" RPC_TLS_NODE_SUFFIX, the
 * coordinator's RPC_TLS_COORDINATOR; a client verifies the server by that
 * name, whatever address it dials.
 */
#define RPC_TLS_COORDINATOR "coordinator.refit"
#define RPC_TLS_NODE_SUFFIX ".node.refit"

typedef struct rpc_tls {
	const char *cert_file;      /* PEM; NULL = plaintext */
	const char *key_file;       /* PEM (server) */
	const char *ca_file;        /* PEM: server: client CA (mutual TLS);
				       client: roots to verify the server */
	bool require_client_cert;   /* server: mutual TLS: join and member
				       methods need a certificate of ca_file */
	const char *server_name;    /* client: the name the server's certificate
				       must carry (NULL: the target's host) */
	const char *member_name;    /* server with mutual TLS: the name member
				       methods' callers carry (NULL: a node's;
				       the handler binds it to the member) */
} rpc_tls_t;

/* The process at the other end of a unix socket: SO_PEERCRED when it
 * connected. */
typedef struct rpc_peer_cred {
	int pid;
	uint32_t uid, gid;
} rpc_peer_cred_t;

typedef struct rpc_server_opts {
	const char *listen;    /* "host:port" or "unix:/path" */
	/* "unix:" only, plaintext: accept the connections here and record
	 * each one's SO_PEERCRED for rpc_call_peer_cred (rpc_unix.c) */
	bool peer_cred;
	size_t max_msg_bytes;  /* 0 = RPC_DEFAULT_MAX_MSG */
	rpc_tls_t tls;
	const char *token;     /* bearer token for operator methods; NULL = none */
	const char *join_token; /* join and member methods; NULL = none */
	/* a refusal (UNAUTHENTICATED, PERMISSION_DENIED), on any thread: the
	 * method and why ("missing", "wrong", "session", "identity"); NULL = none */
	void (*refused)(const char *method, const char *reason);
	/* called on the loop when a call ends: its method ("unknown" for methods
	 * not registered), gRPC code name and seconds since arrival; NULL = none
	 * (refitd passes its metrics histogram, so rpc/ knows nothing of it) */
	void (*observe)(const char *method, const char *code, double seconds);
} rpc_server_opts_t;

/* Create a server whose handlers run on loop.  Thread: the loop's. */
rpc_server_t *rpc_server_new(const rpc_server_opts_t *o, uv_loop_t *loop,
			     refit_err_t *err);
/* Register handlers for some methods of a service; ctx is passed back. */
refit_status_t rpc_server_add_service(rpc_server_t *s,
				      const ProtobufCServiceDescriptor *svc,
				      const rpc_method_cfg_t *methods, size_t n,
				      void *ctx, refit_err_t *err);
/* Bind and start; *port gets the bound TCP port (0 for unix sockets). */
refit_status_t rpc_server_start(rpc_server_t *s, int *port, refit_err_t *err);
/* Replace the operator token (NULL: none) while serving.  Any thread. */
void rpc_server_set_token(rpc_server_t *s, const char *token);
/* Replace the join token (NULL: none) while serving.  Any thread. */
void rpc_server_set_join_token(rpc_server_t *s, const char *token);
/* Is a join token configured (join and member methods checked)? */
bool rpc_server_join_required(rpc_server_t *s);
/* Mutual TLS: do join and member methods need a node's certificate? */
bool rpc_server_mtls(const rpc_server_t *s);
/* Read the certificate, key and CA files again; new connections use them
 * (SIGHUP rotation; a file that does not read keeps the old ones, logged
 * at the next handshake).  Any thread. */
void rpc_server_reload_tls(rpc_server_t *s);
/*
 * The secret member methods must present (refit-session); a node sets its
 * own, so that only the coordinator it joined may call it.  NULL (the
 * coordinator): the handler checks rpc_call_session against the member
 * the request names.  Any thread.
 */
void rpc_server_set_session(rpc_server_t *s, const char *secret);
/*
 * Stop handing new calls to handlers (they are answered UNAVAILABLE);
 * calls handlers already hold may still be answered.  Loop thread.
 */
void rpc_server_drain(rpc_server_t *s);
/* Stop accepting, cancel calls, join the thread, free.  NULL is a no-op.
 * Handlers must not hold calls any more (drain first, wait for them). */
void rpc_server_free(rpc_server_t *s);

/* Answer OK with resp (not freed here).  Loop thread. */
void rpc_call_reply(rpc_call_t *c, const ProtobufCMessage *resp);
/* Answer with an error; the status maps to a gRPC code (rpc_status.c). */
void rpc_call_fail(rpc_call_t *c, refit_status_t st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
bool rpc_call_cancelled(const rpc_call_t *c);
/* Milliseconds until the client's deadline (INT64_MAX when none). */
int64_t rpc_call_ms_left(const rpc_call_t *c);
/* "ipv4:127.0.0.1:5432" style; valid until the call is answered. */
const char *rpc_call_peer(const rpc_call_t *c);
/* The caller's process (a server with opts.peer_cred); false when not
 * known.  Loop thread, while the call is held. */
bool rpc_call_peer_cred(const rpc_call_t *c, rpc_peer_cred_t *out);
/* The refit-session secret the caller presented (NULL: none) and its
 * length; valid until the call is answered. */
const char *rpc_call_session(const rpc_call_t *c, size_t *len);
/* Mutual TLS: the node id the caller's verified certificate names
 * ("<id>" RPC_TLS_NODE_SUFFIX), or NULL; valid until the call is answered.
 * A certificate naming two nodes names none. */
const char *rpc_call_cert_node(const rpc_call_t *c);
/* A method whose row allows the operator token too: did the caller
 * present it (rather than a member's credentials)? */
bool rpc_call_by_operator(const rpc_call_t *c);
/*
 * Refuse the call: st is REFIT_ERR_UNAUTHENTICATED or
 * REFIT_ERR_PERMISSION_DENIED, reason a short word for the metric
 * ("identity"), the message names what the caller tried.  Logged once a
 * minute per peer host (with the count refused meanwhile), counted by
 * opts.refused.  Loop thread, like rpc_call_fail.
 */
void rpc_call_refuse(rpc_call_t *c, refit_status_t st, const char *reason,
		     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- client ---------------------------------------------------------- */

typedef struct rpc_client rpc_client_t;

typedef struct rpc_client_opts {
	size_t max_msg_bytes;  /* 0 = RPC_DEFAULT_MAX_MSG */
	rpc_tls_t tls;         /* cert/key for mutual TLS, ca to verify */
	const char *token;     /* sent as "authorization: Bearer <token>" */
	const char *join_token; /* sent as "refit-join-token: <token>" (daemons) */
} rpc_client_opts_t;

rpc_client_t *rpc_client_new(const char *target, const rpc_client_opts_t *o,
			     refit_err_t *err);
/*
 * Call svc.method with req; on success *resp is a new message of the
 * method's output type (free with protobuf_c_message_free_unpacked).  Never
 * waits past timeout_ms.  Thread: any; one call at a time per thread.
 */
refit_status_t rpc_client_call(rpc_client_t *c, const ProtobufCServiceDescriptor *svc,
			       const char *method, const ProtobufCMessage *req,
			       ProtobufCMessage **resp, int64_t timeout_ms,
			       refit_err_t *err);
void rpc_client_free(rpc_client_t *c);
const char *rpc_client_target(const rpc_client_t *c);

/*
 * A process's last step with gRPC (rpc_exit.c), after every server, client
 * and async engine is freed: wait at most ms for gRPC's own shutdown to
 * end (a channel's last reference may go on one of gRPC's threads, which
 * then cleans up on a detached thread; exiting first leaves its threads
 * running).  false: still shutting down at the bound.  Thread: main.
 */
bool rpc_wait_shutdown(int64_t ms);

/* ---- asynchronous client (rpc_async.c) ------------------------------------ */

/*
 * The daemons' client: calls start on the loop thread and never block it;
 * one completion-queue thread per engine hands finished calls back to the
 * loop, whatever the number of calls outstanding.  One channel per target
 * is kept and reused.  Everything but the thread runs on the loop thread.
 */
typedef struct rpc_async rpc_async_t;

/* done(arg, status, message, resp) runs on the loop thread once per call;
 * resp (NULL on error) is freed after done returns. */
typedef void (*rpc_done_fn)(void *arg, refit_status_t st, const char *msg,
			    ProtobufCMessage *resp);

#define RPC_GROUP_NONE 0u
#define RPC_GROUP_ALL UINT64_MAX

/* An engine on loop; o (TLS, token, message size) applies to every call.
 * The loop does not stay alive for an idle engine. */
rpc_async_t *rpc_async_new(uv_loop_t *loop, const rpc_client_opts_t *o, refit_err_t *err);
/*
 * Start svc.method(req) to target with a deadline of timeout_ms; req is
 * packed at once (the caller keeps it).  group tags the call for
 * rpc_async_cancel (RPC_GROUP_NONE: none).  On an error return done is
 * never called.
 */
refit_status_t rpc_async_call(rpc_async_t *a, uint64_t group, const char *target,
			      const ProtobufCServiceDescriptor *svc, const char *method,
			      const ProtobufCMessage *req, int64_t timeout_ms,
			      rpc_done_fn done, void *arg, refit_err_t *err);
/* Cancel the outstanding calls of group (RPC_GROUP_ALL: every call); their
 * done callbacks run later, with REFIT_ERR_ABORTED.  Returns how many. */
size_t rpc_async_cancel(rpc_async_t *a, uint64_t group);
/* Replace the join token every later call sends (NULL: none). */
void rpc_async_set_join_token(rpc_async_t *a, const char *token);
/* Verify target's certificate by name (a node's: "<id>.node.refit")
 * rather than by the engine's tls.server_name; a cached channel of target
 * is replaced.  NULL: back to the default. */
void rpc_async_set_server_name(rpc_async_t *a, const char *target, const char *name);
/* Read the TLS files again (SIGHUP rotation): later calls open new
 * channels with them; calls in flight finish on the old.  An error keeps
 * the old credentials. */
refit_status_t rpc_async_reload_tls(rpc_async_t *a, refit_err_t *err);
/* Send "refit-session: secret" on every later call to target (NULL: stop). */
void rpc_async_set_session(rpc_async_t *a, const char *target, const char *secret);
/* Calls cancelled by rpc_async_cancel since the engine started. */
uint64_t rpc_async_cancelled(const rpc_async_t *a);

/*
 * Connectivity of the cached channels (gRPC's states, same values), watched
 * on the engine's completion queue.  RPC_CONN_NONE: no channel is cached
 * for the target.
 */
typedef enum rpc_conn {
	RPC_CONN_NONE = -1,
	RPC_CONN_IDLE = 0,
	RPC_CONN_CONNECTING = 1,
	RPC_CONN_READY = 2,
	RPC_CONN_TRANSIENT_FAILURE = 3,
	RPC_CONN_SHUTDOWN = 4,
} rpc_conn_t;

/*
 * fn(arg, target, old, now, outage) runs on the loop thread on every change
 * of a cached channel's state that the watch observes (one hook per
 * engine).  outage is 1 on the first TRANSIENT_FAILURE/SHUTDOWN since the
 * channel was last READY (however often the back-off retries), -1 when it
 * is READY again after one, else 0.  With no hook the engine logs outages
 * itself (warning, naming the target); with one, the hook does.
 */
typedef void (*rpc_conn_fn)(void *arg, const char *target, rpc_conn_t old, rpc_conn_t now,
			    int outage);
void rpc_async_on_conn(rpc_async_t *a, rpc_conn_fn fn, void *arg);
/* The last observed state of target's channel (RPC_CONN_NONE: none). */
rpc_conn_t rpc_async_conn(const rpc_async_t *a, const char *target);
/* "IDLE", "CONNECTING", "READY", "TRANSIENT_FAILURE", "SHUTDOWN", "NONE" */
const char *rpc_conn_name(rpc_conn_t st);
/* Drop target's cached channel (a member left); calls on it finish first. */
void rpc_async_forget(rpc_async_t *a, const char *target);
size_t rpc_async_outstanding(const rpc_async_t *a);
size_t rpc_async_channels(const rpc_async_t *a);
/* Cancel everything and free once the last done callback ran (run the
 * loop after).  NULL is a no-op. */
void rpc_async_close(rpc_async_t *a);

/* ---- status mapping (rpc_status.c, the one place) ---------------------- */
int rpc_status_to_grpc(refit_status_t st);
refit_status_t rpc_status_from_grpc(int code);
const char *rpc_grpc_code_name(int code);

#endif
