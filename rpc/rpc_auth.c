/*
 * rpc_auth.c - the authorization table (see rpc_auth.h).  Adding a method
 * to proto/ means adding its row here; the unit test says which is missing.
 */
#include <string.h>

#include "rpc/rpc_auth.h"

#define COORD "refit.v1.Coordinator"
#define NODE "refit.v1.Node"
#define LOCAL "refit.v1.Local"
#define HEALTH "grpc.health.v1.Health"

const rpc_auth_row_t rpc_auth_table[] = {
	{COORD, "Join", RPC_CRED_JOIN, false,
	 "node id, ranks, endpoints: a live member's only by its own session"},
	{COORD, "Heartbeat", RPC_CRED_MEMBER, false, "member_id"},
	{COORD, "Leave", RPC_CRED_MEMBER, false, "member_id"},
	{COORD, "RegisterLayout", RPC_CRED_MEMBER, false, "member_id, its ranks"},
	{COORD, "UnregisterLayout", RPC_CRED_MEMBER, true,
	 "member_id, an instance it registered (refitctl unregister: the operator token)"},
	{COORD, "WeightsReady", RPC_CRED_MEMBER, false, "member_id, a trainer it registered"},
	{COORD, "SliceDone", RPC_CRED_MEMBER, false, "member_id and node_id of a node of the refit"},
	{COORD, "GetInstalled", RPC_CRED_MEMBER, false, "member_id, a trainer it registered"},
	{COORD, "TriggerRefit", RPC_CRED_OPERATOR, false, ""},
	{COORD, "GetRefit", RPC_CRED_OPERATOR, false, ""},
	{COORD, "ListRefits", RPC_CRED_OPERATOR, false, ""},
	{COORD, "AbortRefit", RPC_CRED_OPERATOR, false, ""},
	{COORD, "ListMembers", RPC_CRED_OPERATOR, false, ""},
	{COORD, "DrainMember", RPC_CRED_OPERATOR, false, ""},
	{COORD, "ListModels", RPC_CRED_OPERATOR, false, ""},
	{COORD, "GetModel", RPC_CRED_OPERATOR, false, ""},
	{COORD, "ExplainPlan", RPC_CRED_OPERATOR, false, ""},
	{COORD, "SetRefitPolicy", RPC_CRED_OPERATOR, false, ""},
	{NODE, "PrepareEpoch", RPC_CRED_MEMBER, false, "the node's session (the coordinator)"},
	{NODE, "RunSlice", RPC_CRED_MEMBER, false, "the node's session (the coordinator)"},
	{NODE, "Commit", RPC_CRED_MEMBER, false, "the node's session (the coordinator)"},
	{NODE, "NcclId", RPC_CRED_MEMBER, false, "the node's session (the coordinator)"},
	{NODE, "Abort", RPC_CRED_MEMBER, false, "the node's session (the coordinator)"},
	{NODE, "Publish", RPC_CRED_MEMBER, false, "the node's session (the coordinator)"},
	{LOCAL, "Hello", RPC_CRED_NONE, false, "the unix socket's file mode"},
	{LOCAL, "RegisterClient", RPC_CRED_NONE, false,
	 "the unix socket's file mode; pid: the caller's (SO_PEERCRED)"},
	{LOCAL, "WeightsReady", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "BeginWrite", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "WaitVersion", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "GetState", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "Unregister", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "Serve", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "Describe", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{LOCAL, "WaitInstalled", RPC_CRED_NONE, false,
	 "the unix socket's file mode; client_id: one the calling process registered "
	 "(SO_PEERCRED)"},
	{HEALTH, "Check", RPC_CRED_NONE, false, "probes"},
	{HEALTH, "Watch", RPC_CRED_NONE, false, "probes (not served)"},
};

const size_t rpc_auth_nrows = sizeof(rpc_auth_table) / sizeof(rpc_auth_table[0]);

const rpc_auth_row_t *
rpc_auth_find(const char *service, const char *method)
{
	for (size_t i = 0; i < rpc_auth_nrows; i++)
		if (strcmp(rpc_auth_table[i].service, service) == 0 &&
		    strcmp(rpc_auth_table[i].method, method) == 0)
			return &rpc_auth_table[i];
	return NULL;
}

const char *
rpc_cred_name(rpc_cred_t c)
{
	switch (c) {
	case RPC_CRED_NONE: return "none";
	case RPC_CRED_OPERATOR: return "operator";
	case RPC_CRED_JOIN: return "join";
	case RPC_CRED_MEMBER: return "member";
	}
	return "?";
}

bool
rpc_auth_eq(const void *p, size_t n, const char *want)
{
	const unsigned char *a = p;
	size_t wn = strlen(want);
	unsigned diff = n != wn;

	if (a == NULL)
		return false;
	/* no early exit: every byte of the presented secret is looked at */
	for (size_t i = 0; i < n; i++)
		diff |= a[i] ^ (unsigned char)(i < wn ? want[i] : 0);
	return diff == 0;
}

void
rpc_refusals_init(rpc_refusals_t *r)
{
	memset(r, 0, sizeof(*r));
	pthread_mutex_init(&r->mu, NULL);
}

void
rpc_refusals_fini(rpc_refusals_t *r)
{
	pthread_mutex_destroy(&r->mu);
}

bool
rpc_refusals_note(rpc_refusals_t *r, const char *host, uint64_t now_ns, uint64_t *quiet)
{
	size_t at = RPC_REFUSE_HOSTS, lru = 0;
	bool log = false;

	pthread_mutex_lock(&r->mu);
	for (size_t i = 0; i < RPC_REFUSE_HOSTS && at == RPC_REFUSE_HOSTS; i++) {
		if (r->e[i].logged_ns != 0 && strcmp(r->e[i].host, host) == 0)
			at = i;
		else if (r->e[i].logged_ns < r->e[lru].logged_ns)
			lru = i;
	}
	if (at == RPC_REFUSE_HOSTS) {
		at = lru;
		memset(&r->e[at], 0, sizeof(r->e[at]));
		snprintf(r->e[at].host, sizeof(r->e[at].host), "%s", host);
	}
	*quiet = 0;
	if (r->e[at].logged_ns == 0 || now_ns - r->e[at].logged_ns >= RPC_REFUSE_LOG_NS) {
		log = true;
		*quiet = r->e[at].quiet;
		r->e[at].quiet = 0;
		r->e[at].logged_ns = now_ns ? now_ns : 1;
	} else {
		r->e[at].quiet++;
	}
	pthread_mutex_unlock(&r->mu);
	return log;
}

void
rpc_auth_print_markdown(FILE *f)
{
	fprintf(f, "| service | method | credential | bound to |\n"
		"|---|---|---|---|\n");
	for (size_t i = 0; i < rpc_auth_nrows; i++) {
		const rpc_auth_row_t *r = &rpc_auth_table[i];

		fprintf(f, "| `%s` | `%s` | %s%s | %s |\n", r->service, r->method,
			rpc_cred_name(r->need), r->or_operator ? " or operator" : "",
			r->acts_for[0] ? r->acts_for : "-");
	}
}
