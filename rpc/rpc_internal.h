/*
 * rpc_internal.h - helpers shared by the RPC server and client.
 */
#ifndef REFIT_RPC_RPC_INTERNAL_H
#define REFIT_RPC_RPC_INTERNAL_H

#include <stdatomic.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "rpc/rpc.h"

/* clients ping an idle call this often; servers accept pings this often */
#define RPC_KEEPALIVE_MS 30000
#define RPC_MIN_PING_MS 10000

grpc_arg rpc_arg_int(const char *key, int value);
/* The channel arguments every client here uses (message size, reconnect
 * back-off, gRPC's retries off) into args[0..RPC_CHANNEL_ARGS-1]. */
#define RPC_CHANNEL_ARGS 6
void rpc_channel_args(grpc_arg *args, size_t max_msg);
grpc_arg rpc_arg_str(const char *key, const char *value);

/* A server's TLS files and their reload generation (rpc_tls.c). */
typedef struct rpc_tls_src {
	rpc_tls_t tls;
	atomic_uint gen, loaded, failed;
} rpc_tls_src_t;

/* Server credentials from src->tls (insecure when no cert file); with a
 * certificate, gRPC asks src at every handshake, so rpc_tls_src_reload
 * takes effect at the next connection.  src outlives the server. */
refit_status_t rpc_server_creds(rpc_tls_src_t *src, grpc_server_credentials **out,
				refit_err_t *err);
/* Read the files again at the next handshake.  Any thread. */
void rpc_tls_src_reload(rpc_tls_src_t *src);
/* Channel credentials from tls (insecure when no ca file). */
refit_status_t rpc_channel_creds(const rpc_tls_t *tls, grpc_channel_credentials **out,
				 refit_err_t *err);

/* Who a call's peer is by its verified certificate (rpc_tls.c). */
typedef struct rpc_tls_peer {
	bool has_cert;      /* presented a certificate the cluster CA verified */
	bool coordinator;   /* it names RPC_TLS_COORDINATOR */
	char *node;         /* the first "<id>.node.refit" it names (NULL: none) */
	unsigned nodes;     /* how many node names it carries */
} rpc_tls_peer_t;

void rpc_tls_peer_read(grpc_call *gc, rpc_tls_peer_t *p);
void rpc_tls_peer_fini(rpc_tls_peer_t *p);
/*
 * Mutual TLS: may p call path (member: a member method)?  A server with
 * tls->member_name (a node's) takes member methods only from that name;
 * else join and member methods need exactly one node's name.  OK, or the
 * code (UNAUTHENTICATED without a certificate, else PERMISSION_DENIED) and
 * msg naming what was presented.
 */
grpc_status_code rpc_tls_check(const rpc_tls_t *tls, bool member, const char *path,
			       const rpc_tls_peer_t *p, char *msg, size_t n);
/* rpc_unix.c: a unix socket path's lock ("<path>.lock", held while
 * serving; nothing for other addresses); the listener that records each
 * connection's SO_PEERCRED and hands it to srv (started after
 * grpc_server_start, stopped before its shutdown); a call's credentials
 * from its peer string ("fd:N"). */
typedef struct rpc_unix rpc_unix_t;
refit_status_t rpc_unix_lock(const char *listen, int *lockfd, refit_err_t *err);
refit_status_t rpc_unix_listen(grpc_server *srv, const char *listen, rpc_unix_t **out,
			       refit_err_t *err);
void rpc_unix_stop(rpc_unix_t *u);   /* NULL: no-op */
bool rpc_unix_peer(rpc_unix_t *u, const char *peer, rpc_peer_cred_t *out);

/* The channel of a synchronous client, for a streaming call of its own
 * (rpc/etcd_watch.c); the client outlives the call. */
grpc_channel *rpc_client_channel(rpc_client_t *c);

/* svc's method called name, or NULL (both clients). */
const ProtobufCMethodDescriptor *rpc_method_of(const ProtobufCServiceDescriptor *svc,
					       const char *name);

/* The next completed operation on cq into *ev, waiting without a deadline
 * (the queue's owner shuts it down to end the wait); false once it is shut
 * down. */
static inline bool
rpc_cq_next(grpc_completion_queue *cq, grpc_event *ev)
{
	do
		*ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	while (ev->type != GRPC_QUEUE_SHUTDOWN && ev->type != GRPC_OP_COMPLETE);
	return ev->type == GRPC_OP_COMPLETE;
}

#endif
