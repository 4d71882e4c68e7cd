/*
 * rpc_server_internal.h - the server's records, shared by rpc_server.c
 * (calls, threads, set-up) and rpc_server_auth.c (credentials, refusals).
 */
#ifndef REFIT_RPC_RPC_SERVER_INTERNAL_H
#define REFIT_RPC_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/alloc.h"
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
	rpc_tls_peer_t cert;        /* mutual TLS: who the certificate names */
	int deny_code;              /* rpc_server_cred_ok refused: gRPC code, */
	const char *deny_reason;    /* the metric's reason and the message */
	char deny_msg[REFIT_ERR_MSG_MAX];
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
	rpc_tls_src_t tls;          /* files, reload generation */
	int lockfd;
	bool peer_cred;             /* opts.peer_cred: the listener is ux */
	rpc_unix_t *ux;
	tag_t t_shutdown;
	void (*observe)(const char *method, const char *code, double seconds);
	void (*refused)(const char *method, const char *reason);
	rpc_refusals_t refusals;    /* the refusal log's limiter (own lock) */
};

/* A refusal: counted (opts.refused) every time, logged once a minute per
 * peer host with how many were refused since the last line.  Any thread. */
void rpc_server_refusal_note(rpc_server_t *s, const rpc_call_t *c, const char *reason,
			     const char *msg);
/*
 * The credential c's method needs (its row in rpc_auth.c), checked on the
 * completion-queue thread before the request is decoded; false: refused,
 * c->deny_* say how (rpc_server_auth.c; rpc_server.c answers).
 */
bool rpc_server_cred_ok(rpc_server_t *s, rpc_call_t *c);

#endif
