/*
 * rpc_auth.h - who may call what: the one authorization table of refitd's
 * gRPC services, and the constant-time comparison of presented secrets.
 *
 * Every method of every service refitd serves has exactly one row; the
 * server refuses to register a method without one (rpc_server_add_service)
 * and tests/unit/test_auth.c fails when a method of proto/ has none.  The
 * credentials, weakest first:
 *
 *   none      anyone who reaches the socket (the local unix socket is
 *             guarded by its file mode; health checks)
 *   operator  "authorization: Bearer <operator token>" (token_file)
 *   join      "refit-join-token: <join token>" (join_token_file): a node of
 *             the cluster
 *   member    the join token and "refit-session: <secret>", the secret the
 *             node sent with its Join: a node acting for its own membership
 *             (coordinator side: the member the request names; node side:
 *             the coordinator, which alone knows the node's secret)
 *
 * A credential that is not configured (no token file) is not checked.
 * Pure data and libc: no gRPC here, so the unit tests link it.
 */
#ifndef REFIT_RPC_RPC_AUTH_H
#define REFIT_RPC_RPC_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>

typedef enum rpc_cred {
	RPC_CRED_NONE,
	RPC_CRED_OPERATOR,
	RPC_CRED_JOIN,
	RPC_CRED_MEMBER,
} rpc_cred_t;

typedef struct rpc_auth_row {
	const char *service;   /* full name: "refit.v1.Coordinator" */
	const char *method;    /* "Join" */
	rpc_cred_t need;
	bool or_operator;      /* the operator token (when one is set) also does */
	const char *acts_for;  /* what the member check binds ("" when none) */
} rpc_auth_row_t;

/* metadata keys (lower case, as HTTP/2 carries them) */
#define RPC_MD_JOIN_TOKEN "refit-join-token"
#define RPC_MD_SESSION "refit-session"

extern const rpc_auth_row_t rpc_auth_table[];
extern const size_t rpc_auth_nrows;

/* The row of service.method, or NULL. */
const rpc_auth_row_t *rpc_auth_find(const char *service, const char *method);
/* "none", "operator", "join", "member" */
const char *rpc_cred_name(rpc_cred_t c);
/* Does the presented secret (p, n bytes; p may be NULL) equal want?  Time
 * depends on n and want's length only, never on where they differ. */
bool rpc_auth_eq(const void *p, size_t n, const char *want);
/*
 * Refusals are logged once a minute per peer host, the others counted:
 * a bounded table (the least recently logged host makes room).
 */
#define RPC_REFUSE_HOSTS 64
#define RPC_REFUSE_LOG_NS (60ull * 1000000000ull)

typedef struct rpc_refusals {
	pthread_mutex_t mu;
	struct {
		char host[64];
		uint64_t logged_ns;    /* 0: free */
		uint64_t quiet;        /* refused since, not logged */
	} e[RPC_REFUSE_HOSTS];
} rpc_refusals_t;

void rpc_refusals_init(rpc_refusals_t *r);
void rpc_refusals_fini(rpc_refusals_t *r);
/* A refusal from host at now_ns: true when it is to be logged, with *quiet
 * the refusals from host not logged since its last line.  Any thread. */
bool rpc_refusals_note(rpc_refusals_t *r, const char *host, uint64_t now_ns,
		       uint64_t *quiet);
/* The table as a Markdown table (docs/control-plane.md, `make figures`). */
void rpc_auth_print_markdown(FILE *f);

#endif
