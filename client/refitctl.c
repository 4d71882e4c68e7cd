/*
 * refitctl.c - the operator CLI for the coordinator.
 *
 * One binary, one table of subcommands (cmds[] at the bottom) that drives
 * --help, argument checks, the request, the RPC, the output and the exit
 * status: each row names the command, its arguments, the Coordinator
 * method, the request fields its arguments fill, a builder for what the
 * table cannot say (options), the printers (text through one row helper,
 * and a cJSON object for --json, so every string is escaped) and what
 * follows (trigger --wait, watch).  run() does request, call, print and
 * free for every command.  Exit codes:
 * 0 success, 1 the coordinator answered with an error, 2 usage or bad
 * input, 3 the coordinator could not be reached (address and reason
 * printed), 4 the refit waited for ended FAILED or ABORTED.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "codec/json.h"
#include "common/parse.h"
#include "common/str.h"
#include "rpc/rpc.h"
#include "refit/v1/refit.pb-c.h"

#define SVC (&refit__v1__coordinator__descriptor)
#define MAX_OPTS 32

typedef struct ctl {
	rpc_client_t *cli;
	int json;
	int64_t timeout_ms;
} ctl_t;

/* A command's arguments: positionals (argv after the command, options taken
 * out), the options in order, and what the builder made of them. */
typedef struct args {
	char **pos;
	int npos;
	struct {
		int code;
		const char *arg;
	} opt[MAX_OPTS];
	int nopt;
	bool wait;                     /* trigger --wait */
	Refit__V1__RefitPolicy policy; /* policy: what SetRefitPolicy sends */
} args_t;

typedef struct cmd cmd_t;
struct cmd {
	const char *name;
	const char *args;                  /* usage after the name */
	const char *help;
	int min_args, max_args;            /* positionals */
	const char *method;                /* the Coordinator method called */
	/* the request field each positional fills (a string, or a number
	 * parsed from it), and what the second one is when it is not given */
	const char *field[2];
	const char *dflt;
	const struct option *opts;         /* NULL: positionals taken verbatim */
	/* what the table cannot say: options, checks; 0 or an exit code, -1
	 * for a usage error (NULL: nothing to add) */
	int (*build)(ctl_t *c, args_t *a, ProtobufCMessage *rq);
	/* the output: of the response, or with `list` of each item of that
	 * repeated field of the response ({"list": [...]}; `none` when empty) */
	void (*text)(const void *resp, const args_t *a);
	cJSON *(*json)(const void *resp, const args_t *a); /* NULL result: print nothing */
	const char *list, *none;
	/* after the output, with the response; the exit code (NULL: 0) */
	int (*then)(ctl_t *c, args_t *a, const void *resp);
};

static int
exit_for(const refit_err_t *e)
{
	if (e->status == REFIT_ERR_UNAVAILABLE || e->status == REFIT_ERR_TIMEOUT)
		return 3;
	return e->status == REFIT_ERR_INVALID_ARG ? 2 : 1;
}

static int
call(ctl_t *c, const char *method, const ProtobufCMessage *req, ProtobufCMessage **resp)
{
	refit_err_t e;

	refit_err_clear(&e);
	if (rpc_client_call(c->cli, SVC, method, req, resp, c->timeout_ms, &e) != REFIT_OK) {
		fprintf(stderr, "refitctl: %s\n", e.msg);
		if (e.status == REFIT_ERR_UNAVAILABLE)
			fprintf(stderr, "refitctl: is a coordinator running at %s? (set "
				"--coordinator or REFIT_COORDINATOR)\n", rpc_client_target(c->cli));
		return exit_for(&e);
	}
	return 0;
}

static int
bad_input(const refit_err_t *e)
{
	fprintf(stderr, "refitctl: %s\n", e->msg);
	return 2;
}

/* The name protobuf gives an enum value ("FAILED", "TRAIN"), or "?". */
static const char *
enum_name(const ProtobufCEnumDescriptor *d, int v)
{
	const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);

	return ev ? ev->name : "?";
}

static const char *
role_name(Refit__V1__Role r)
{
	return r == REFIT__V1__ROLE__TRAIN ? "train" : r == REFIT__V1__ROLE__INFER ? "infer" : "?";
}

static const char *
trigger_name(Refit__V1__TriggerMode t)
{
	return t == REFIT__V1__TRIGGER_MODE__TRIGGER_ON_READY ? "on_ready" :
	       t == REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL ? "manual" : "?";
}

static const char *
state_name(Refit__V1__RefitState s)
{
	return enum_name(&refit__v1__refit_state__descriptor, (int)s);
}

static const char *
mode_name(Refit__V1__Mode m)
{
	return m == REFIT__V1__MODE__BROADCAST ? "broadcast" : "reshard";
}

static bool
final_state(Refit__V1__RefitState s)
{
	return s == REFIT__V1__REFIT_STATE__COMMITTED || s == REFIT__V1__REFIT_STATE__FAILED ||
	       s == REFIT__V1__REFIT_STATE__ABORTED;
}

/* ---- text: one row helper for every table ------------------------------ */

/* cell[i] left-aligned in w[i] columns, one space between, the last as is */
static void
row(int indent, size_t n, const int *w, const char *const *cell)
{
	printf("%*s", indent, "");
	for (size_t i = 0; i + 1 < n; i++)
		printf("%-*s ", w[i], cell[i]);
	printf("%s\n", n ? cell[n - 1] : "");
}

/* ---- --json: built with cJSON (every string escaped; 64-bit numbers exact) */

static void *
oom(void *p)
{
	if (p == NULL) {
		fprintf(stderr, "refitctl: out of memory\n");
		exit(1);
	}
	return p;
}

static cJSON *
jnew(void)
{
	return oom(cJSON_CreateObject());
}

static void
jstr(cJSON *o, const char *k, const char *v)
{
	cJSON_AddStringToObject(o, k, str_nz(v));
}

static cJSON *
ju64_item(uint64_t v)
{
	char b[24];

	snprintf(b, sizeof(b), "%" PRIu64, v);
	return oom(cJSON_CreateRaw(b));
}

static void
ju64(cJSON *o, const char *k, uint64_t v)
{
	cJSON_AddItemToObject(o, k, ju64_item(v));
}

/* a JSON array of n strings */
static cJSON *
jstrings(char **v, size_t n)
{
	cJSON *a = oom(cJSON_CreateArray());

	for (size_t k = 0; k < n; k++)
		cJSON_AddItemToArray(a, oom(cJSON_CreateString(str_nz(v[k]))));
	return a;
}

/* Print o on one line and free it. */
static void
jemit(cJSON *o)
{
	char *t = oom(cJSON_PrintUnformatted(o));

	puts(t);
	cJSON_free(t);
	cJSON_Delete(o);
}

/* A list response: each item's text, or `none` when there are none. */
static void
text_list(void *const *v, size_t n, void (*one)(const void *, const args_t *),
	  const char *none, const args_t *a)
{
	for (size_t i = 0; i < n; i++)
		one(v[i], a);
	if (n == 0)
		printf("%s\n", none);
}

/* A list response as {"key": [item, ...]}. */
static cJSON *
json_list(const char *key, void *const *v, size_t n,
	  cJSON *(*one)(const void *, const args_t *), const args_t *a)
{
	cJSON *o = jnew(), *arr = cJSON_AddArrayToObject(o, key);

	for (size_t i = 0; i < n; i++)
		cJSON_AddItemToArray(arr, one(v[i], a));
	return o;
}

/* ---- members ------------------------------------------------------------ */

/* "poisoned" (it runs no more refits until refitd restarts on it), else "member" */
static const char *
member_state(const Refit__V1__Member *m)
{
	return m->poisoned && m->poisoned[0] ? "poisoned" : "member";
}

static void
text_members(const void *resp, const args_t *a)
{
	static const int w[] = {6, 20, 22, 7, 12, 20, 9, 0};
	static const char *const head[] = {"ID", "NODE", "HOST", "RANKS", "JOINED@EPOCH",
					   "CONNECTION", "STATE", "LEASE AGE"};
	const Refit__V1__ListMembersResponse *r = resp;
	size_t npoisoned = 0;

	(void)a;
	printf("epoch %" PRIu64 ", %zu members\n", r->epoch, r->n_members);
	row(0, 8, w, head);
	for (size_t i = 0; i < r->n_members; i++) {
		const Refit__V1__Member *m = r->members[i];
		char id[24], nr[24], joined[24], lease[64];

		snprintf(id, sizeof(id), "%" PRIu64, m->member_id);
		snprintf(nr, sizeof(nr), "%zu", m->n_ranks);
		snprintf(joined, sizeof(joined), "%" PRIu64, m->joined_epoch);
		snprintf(lease, sizeof(lease), "%" PRIu64 " ms / %u ms", m->lease_age_ms,
			 m->lease_ttl_ms);
		row(0, 8, w, (const char *const[]){id, m->node_id, m->host, nr, joined,
						  m->connection, member_state(m), lease});
		npoisoned += m->poisoned && m->poisoned[0];
	}
	/* why, under the table: the reason is long */
	for (size_t i = 0; npoisoned && i < r->n_members; i++)
		if (r->members[i]->poisoned && r->members[i]->poisoned[0])
			printf("node %s is poisoned: restart refitd on it: %s\n",
			       r->members[i]->node_id, r->members[i]->poisoned);
	printf("node calls: %" PRIu64 " outstanding, %" PRIu64 " cancelled since start\n",
	       r->node_calls_outstanding, r->node_calls_cancelled);
}

static cJSON *
json_members(const void *resp, const args_t *a)
{
	const Refit__V1__ListMembersResponse *r = resp;
	cJSON *o = jnew(), *ms;

	(void)a;
	ju64(o, "epoch", r->epoch);
	ms = cJSON_AddArrayToObject(o, "members");
	for (size_t i = 0; i < r->n_members; i++) {
		const Refit__V1__Member *m = r->members[i];
		cJSON *j = jnew(), *rs;

		ju64(j, "member_id", m->member_id);
		jstr(j, "node_id", m->node_id);
		jstr(j, "host", m->host);
		rs = cJSON_AddArrayToObject(j, "ranks");
		for (size_t k = 0; k < m->n_ranks; k++) {
			cJSON *rk = jnew();

			cJSON_AddNumberToObject(rk, "rank", m->ranks[k]->rank);
			jstr(rk, "domain", m->ranks[k]->domain);
			cJSON_AddItemToArray(rs, rk);
		}
		ju64(j, "joined_epoch", m->joined_epoch);
		ju64(j, "lease_age_ms", m->lease_age_ms);
		jstr(j, "connection", m->connection);
		jstr(j, "state", member_state(m));
		jstr(j, "poisoned", m->poisoned ? m->poisoned : "");
		cJSON_AddItemToArray(ms, j);
	}
	ju64(o, "node_calls_outstanding", r->node_calls_outstanding);
	ju64(o, "node_calls_cancelled", r->node_calls_cancelled);
	return o;
}

/* ---- models ------------------------------------------------------------- */

static cJSON *
json_model(const void *resp, const args_t *a)
{
	const Refit__V1__Model *m = resp;
	cJSON *o = jnew(), *is;

	(void)a;
	jstr(o, "name", m->name);
	cJSON_AddNumberToObject(o, "tensors", m->tensors);
	ju64(o, "latest_version", m->latest_version);
	ju64(o, "installed_version", m->installed_version);
	is = cJSON_AddArrayToObject(o, "instances");
	for (size_t i = 0; i < m->n_instances; i++) {
		cJSON *j = jnew();

		jstr(j, "instance", m->instances[i]->instance);
		jstr(j, "role", role_name(m->instances[i]->role));
		jstr(j, "layout_digest", m->instances[i]->layout_digest);
		ju64(j, "member_id", m->instances[i]->member_id);
		if (m->instances[i]->role == REFIT__V1__ROLE__INFER) {
			ju64(j, "installed_version", m->instances[i]->installed_version);
			cJSON_AddBoolToObject(j, "invalid", m->instances[i]->invalid);
			jstr(j, "install", m->instances[i]->install ==
			     REFIT__V1__INSTALL_MODE__IN_PLACE ? "in-place" : "double-buffer");
		}
		cJSON_AddItemToArray(is, j);
	}
	if (m->policy) {
		cJSON *p = cJSON_AddObjectToObject(o, "policy");

		cJSON_AddNumberToObject(p, "retries", m->policy->retries);
		cJSON_AddNumberToObject(p, "retry_backoff_ms", m->policy->retry_backoff_ms);
		cJSON_AddBoolToObject(p, "catch_up", m->policy->catch_up);
		cJSON_AddBoolToObject(p, "strict_instances", m->policy->strict_instances);
		jstr(p, "trigger", trigger_name(m->policy->trigger));
		cJSON_AddNumberToObject(p, "min_interval_ms", m->policy->min_interval_ms);
	}
	ju64(o, "pending_version", m->pending_version);
	ju64(o, "skipped_versions", m->skipped_versions);
	ju64(o, "policy_refits", m->policy_refits);
	return o;
}

/* The trigger policy of m as text ("" under manual with nothing counted). */
static void
trigger_text(const Refit__V1__Model *m, char *out, size_t len)
{
	const Refit__V1__RefitPolicy *p = m->policy;
	int n;

	out[0] = '\0';
	if (p == NULL || (p->trigger == REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL &&
			  m->skipped_versions == 0 && m->policy_refits == 0))
		return;
	n = snprintf(out, len, ", trigger %s", trigger_name(p->trigger));
	if (n > 0 && (size_t)n < len && p->min_interval_ms)
		n += snprintf(out + n, len - (size_t)n, " (min interval %u ms)", p->min_interval_ms);
	if (n > 0 && (size_t)n < len)
		n += snprintf(out + n, len - (size_t)n, ", %" PRIu64 " by policy, %" PRIu64
			      " skipped", m->policy_refits, m->skipped_versions);
	if (n > 0 && (size_t)n < len && m->pending_version)
		snprintf(out + n, len - (size_t)n, ", v%" PRIu64 " waits", m->pending_version);
}

static void
text_model(const void *resp, const args_t *a)
{
	static const int w[] = {24, 14, 16, 0}, wi[] = {5, 16, 24, 16, 0};
	const Refit__V1__Model *m = resp;
	char t[24], latest[40], rest[400], trig[200];
	uint64_t newest = 0;  /* the newest an instance holds: others are behind */
	int n;

	(void)a;
	snprintf(t, sizeof(t), "tensors %u", m->tensors);
	snprintf(latest, sizeof(latest), "latest v%" PRIu64, m->latest_version);
	n = snprintf(rest, sizeof(rest), "installed v%" PRIu64, m->installed_version);
	trigger_text(m, trig, sizeof(trig));
	if (m->policy && n > 0 && (size_t)n < sizeof(rest))
		snprintf(rest + n, sizeof(rest) - (size_t)n, "  retries %u (backoff %u ms), "
			 "catch-up %s%s%s", m->policy->retries, m->policy->retry_backoff_ms,
			 m->policy->catch_up ? "on" : "off",
			 m->policy->strict_instances ? ", strict instances" : "", trig);
	row(0, 4, w, (const char *const[]){m->name, t, latest, rest});
	for (size_t i = 0; i < m->n_instances; i++)
		if (m->instances[i]->installed_version > newest)
			newest = m->instances[i]->installed_version;
	for (size_t i = 0; i < m->n_instances; i++) {
		const Refit__V1__Instance *in = m->instances[i];
		char lay[40], mem[40], held[80] = "";

		snprintf(lay, sizeof(lay), "layout %.16s", in->layout_digest);
		snprintf(mem, sizeof(mem), "member %" PRIu64, in->member_id);
		if (in->role == REFIT__V1__ROLE__INFER)   /* what it holds */
			snprintf(held, sizeof(held), "installed v%" PRIu64 "%s%s",
				 in->installed_version,
				 in->invalid ? " INVALID (in place, not published)" :
				 in->installed_version < newest ? " (behind)" : "",
				 in->install == REFIT__V1__INSTALL_MODE__IN_PLACE ? " in place" : "");
		row(2, 5, wi, (const char *const[]){role_name(in->role),
			in->instance[0] ? in->instance : "-", lay, mem, held});
	}
}

/* ---- plan --------------------------------------------------------------- */

static void
text_plan(const void *resp, const args_t *a)
{
	const Refit__V1__ExplainPlanResponse *r = resp;

	(void)a;
	fputs(r->table, stdout);
}

static cJSON *
json_plan(const void *resp, const args_t *a)
{
	const Refit__V1__ExplainPlanResponse *r = resp;
	cJSON *o = jnew();

	(void)a;
	jstr(o, "reshard_digest", r->reshard_digest);
	cJSON_AddNumberToObject(o, "reshard_seconds", r->reshard_seconds);
	cJSON_AddNumberToObject(o, "broadcast_seconds", r->broadcast_seconds);
	cJSON_AddNumberToObject(o, "lower_bound_seconds", r->lower_bound_seconds);
	return o;
}

/* ---- refits ------------------------------------------------------------- */

/* Planning (the coordinator's) and the nodes' slices: the largest, the
 * slowest to decode, the mean decode time. */
static void
text_nodes(const Refit__V1__Refit *r)
{
	uint64_t max = 0, sum = 0, most = 0;
	size_t reported = 0, slow = 0;

	if (r->running_after_ms)
		printf("       every slice running %" PRIu64 " ms after the trigger\n",
		       r->running_after_ms);
	if (r->plan_xfers && r->plan_cached)
		printf("       plan of %" PRIu64 " transfers: from the coordinator's cache\n",
		       r->plan_xfers);
	else if (r->plan_xfers)
		printf("       plan of %" PRIu64 " transfers: built by the coordinator in %.1f "
		       "ms\n", r->plan_xfers, r->plan_micros / 1e3);
	for (size_t k = 0; k < r->n_nodes; k++) {
		if (!r->nodes[k]->reported)
			continue;
		reported++;
		sum += r->nodes[k]->decode_micros;
		if (r->nodes[k]->slice_xfers > most)
			most = r->nodes[k]->slice_xfers;
		if (r->nodes[k]->decode_micros >= max) {
			max = r->nodes[k]->decode_micros;
			slow = k;
		}
	}
	if (reported)
		printf("       slices on the nodes: %zu of %zu reported, at most %" PRIu64
		       " transfers; decoded in %.1f ms at most (%s), mean %.1f ms\n", reported,
		       r->n_nodes, most, max / 1e3, r->nodes[slow]->node_id,
		       sum / 1e3 / (double)reported);
}

/* A committed refit: bytes, end-to-end time, the stages' data time. */
static void
text_timing(const Refit__V1__Refit *r)
{
	uint64_t data_us = 0;

	for (size_t k = 0; k < r->n_stages; k++)
		if (r->stages[k]->micros > data_us)
			data_us = r->stages[k]->micros;
	printf("       %" PRIu64 " bytes over the transport; %.1f ms end to end, %.1f ms "
	       "moving data (%zu stages:", r->bytes,
	       (double)(r->finished_unix_ms - r->created_unix_ms), data_us / 1e3, r->n_stages);
	for (size_t k = 0; k < r->n_stages && k < 8; k++)
		printf(" %.1f ms", r->stages[k]->micros / 1e3);
	printf("%s)\n", r->n_stages > 8 ? " ..." : "");
	printf("       transport sessions ready in %.1f ms (slowest node)\n",
	       r->comm_micros / 1e3);
}

static void
text_refit(const void *resp, const args_t *a)
{
	static const int w[] = {6, 16, 8, 10, 9, 18, 0, 0};
	const Refit__V1__Refit *r = resp;
	char id[24], ver[24], ep[32], dig[24];

	(void)a;
	snprintf(id, sizeof(id), "%" PRIu64, r->id);
	snprintf(ver, sizeof(ver), "v%" PRIu64, r->version);
	snprintf(ep, sizeof(ep), "epoch %" PRIu64, r->epoch);
	/* the failure, last and unbounded, three spaces after the digest */
	snprintf(dig, sizeof(dig), "%.12s%s", r->plan_digest[0] ? r->plan_digest : "-",
		 r->failure[0] ? "  " : "");
	row(0, 8, w, (const char *const[]){id, r->model, ver, state_name(r->state),
		mode_name(r->mode), ep, dig, r->failure});
	if (r->instance && r->instance[0])
		printf("       catch-up of instance \"%s\"\n", r->instance);
	for (size_t k = 0; k < r->n_skipped; k++)
		printf("       skipped instance \"%s\" (not healthy)\n", r->skipped[k]);
	for (size_t k = 0; k < r->n_attempts; k++)
		printf("       attempt %zu failed: %s\n", k + 1, r->attempts[k]);
	if (r->state == REFIT__V1__REFIT_STATE__COMMITTED && r->finished_unix_ms)
		text_timing(r);
	text_nodes(r);
}

static cJSON *
json_refit(const void *resp, const args_t *a)
{
	const Refit__V1__Refit *r = resp;
	cJSON *o = jnew(), *arr;

	(void)a;
	ju64(o, "id", r->id);
	jstr(o, "model", r->model);
	ju64(o, "version", r->version);
	ju64(o, "epoch", r->epoch);
	jstr(o, "mode", mode_name(r->mode));
	cJSON_AddBoolToObject(o, "verify", r->verify);
	jstr(o, "state", state_name(r->state));
	jstr(o, "plan_digest", r->plan_digest);
	ju64(o, "bytes", r->bytes);
	ju64(o, "created_unix_ms", r->created_unix_ms);
	ju64(o, "finished_unix_ms", r->finished_unix_ms);
	jstr(o, "failure", r->failure);
	arr = cJSON_AddArrayToObject(o, "stages");
	for (size_t k = 0; k < r->n_stages; k++) {
		cJSON *j = jnew();

		cJSON_AddNumberToObject(j, "stage", r->stages[k]->stage);
		ju64(j, "micros", r->stages[k]->micros);
		ju64(j, "bytes", r->stages[k]->bytes);
		cJSON_AddItemToArray(arr, j);
	}
	ju64(o, "comm_micros", r->comm_micros);
	cJSON_AddNumberToObject(o, "attempt", r->attempt);
	jstr(o, "instance", r->instance);
	cJSON_AddItemToObject(o, "attempts", jstrings(r->attempts, r->n_attempts));
	ju64(o, "running_after_ms", r->running_after_ms);
	ju64(o, "plan_micros", r->plan_micros);
	cJSON_AddBoolToObject(o, "plan_cached", r->plan_cached);
	ju64(o, "plan_xfers", r->plan_xfers);
	arr = cJSON_AddArrayToObject(o, "nodes");
	for (size_t k = 0; k < r->n_nodes; k++) {
		cJSON *j = jnew();

		jstr(j, "node_id", r->nodes[k]->node_id);
		ju64(j, "plan_micros", r->nodes[k]->plan_micros);
		cJSON_AddBoolToObject(j, "plan_cached", r->nodes[k]->plan_cached);
		ju64(j, "decode_micros", r->nodes[k]->decode_micros);
		ju64(j, "slice_xfers", r->nodes[k]->slice_xfers);
		ju64(j, "slice_micros", r->nodes[k]->slice_micros);
		cJSON_AddBoolToObject(j, "reported", r->nodes[k]->reported);
		cJSON_AddItemToArray(arr, j);
	}
	cJSON_AddItemToObject(o, "skipped", jstrings(r->skipped, r->n_skipped));
	return o;
}

/* The repeated message field `name` of m: its items and their count. */
static void
items(const ProtobufCMessage *m, const char *name, void *const **v, size_t *n)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);

	*v = *(void *const *const *)((const char *)m + f->offset);
	*n = *(const size_t *)((const char *)m + f->quantifier_offset);
}

/* the response as text, or as one line of JSON with --json */
static void
emit(ctl_t *c, const cmd_t *cmd, const void *resp, const args_t *a)
{
	void *const *v;
	cJSON *o;
	size_t n;

	if (cmd->list != NULL) {
		items(resp, cmd->list, &v, &n);
		if (c->json)
			jemit(json_list(cmd->list, v, n, cmd->json, a));
		else
			text_list(v, n, cmd->text, cmd->none, a);
	} else if (!c->json) {
		cmd->text(resp, a);
	} else if ((o = cmd->json(resp, a)) != NULL) {
		jemit(o);
	}
}

/* Poll until the refit is final; prints each new state (--json: the final
 * one).  Exit 0 when it committed, 4 when it failed or was aborted. */
static int
watch(ctl_t *c, uint64_t id)
{
	static const cmd_t show = {.text = text_refit, .json = json_refit};
	Refit__V1__GetRefitRequest rq = REFIT__V1__GET_REFIT_REQUEST__INIT;
	int last = -1, rc;

	rq.refit_id = id;
	for (;;) {
		Refit__V1__Refit *r;
		bool final;

		if ((rc = call(c, "GetRefit", &rq.base, (ProtobufCMessage **)&r)) != 0)
			return rc;
		final = final_state(r->state);
		if (final || (!c->json && (int)r->state != last))
			emit(c, &show, r, NULL);
		last = (int)r->state;
		rc = r->state == REFIT__V1__REFIT_STATE__COMMITTED ? 0 : 4;
		protobuf_c_message_free_unpacked(&r->base, NULL);
		if (final)
			return rc;
		usleep(200 * 1000);
	}
}

/* ---- the other outputs -------------------------------------------------- */

static void
text_trigger(const void *resp, const args_t *a)
{
	const Refit__V1__TriggerRefitResponse *r = resp;

	(void)a;
	printf("refit %" PRIu64 "%s\n", r->refit_id, r->existing ? " (existing, same key)" : "");
}

static cJSON *
json_trigger(const void *resp, const args_t *a)
{
	const Refit__V1__TriggerRefitResponse *r = resp;
	cJSON *o;

	if (a->wait)
		return NULL; /* the final refit is printed instead */
	o = jnew();
	ju64(o, "refit_id", r->refit_id);
	cJSON_AddBoolToObject(o, "existing", r->existing);
	return o;
}

static int
then_trigger(ctl_t *c, args_t *a, const void *resp)
{
	const Refit__V1__TriggerRefitResponse *r = resp;

	return a->wait ? watch(c, r->refit_id) : 0;
}

/* watch: the first GetRefit found the refit; follow it */
static int
then_watch(ctl_t *c, args_t *a, const void *resp)
{
	(void)a;
	return watch(c, ((const Refit__V1__Refit *)resp)->id);
}

static void
text_unregister(const void *resp, const args_t *a)
{
	(void)resp;
	printf("model %s: instance %s unregistered\n", a->pos[0], a->pos[1]);
}

static cJSON *
json_unregister(const void *resp, const args_t *a)
{
	cJSON *o = jnew();

	(void)resp;
	jstr(o, "model", a->pos[0]);
	jstr(o, "unregistered", a->pos[1]);
	return o;
}

static void
text_drain(const void *resp, const args_t *a)
{
	const Refit__V1__DrainMemberResponse *r = resp;

	printf("node %s (member %" PRIu64 ") drained; it leaves at its next heartbeat",
	       a->pos[0], r->member_id);
	for (size_t i = 0; i < r->n_aborted_refits; i++)
		printf("%s%" PRIu64, i ? ", " : "; refits aborted: ", r->aborted_refits[i]);
	printf("\n");
}

static cJSON *
json_drain(const void *resp, const args_t *a)
{
	const Refit__V1__DrainMemberResponse *r = resp;
	cJSON *o = jnew(), *arr;

	(void)a;
	ju64(o, "member_id", r->member_id);
	arr = cJSON_AddArrayToObject(o, "aborted_refits");
	for (size_t i = 0; i < r->n_aborted_refits; i++)
		cJSON_AddItemToArray(arr, ju64_item(r->aborted_refits[i]));
	return o;
}

/* ---- request builders -------------------------------------------------- */

/* the request field `name` set from the command line's text v */
static int
set_field(ProtobufCMessage *rq, const char *name, char *v)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(rq->descriptor, name);
	char what[64], *p;
	refit_err_t e;

	if (f == NULL || (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_UINT64)) {
		fprintf(stderr, "refitctl: internal: %s has no string or uint64 field \"%s\"\n",
			rq->descriptor->name, name);
		return 1;
	}
	if (f->type == PROTOBUF_C_TYPE_STRING) {
		*(char **)((char *)rq + f->offset) = v;
		return 0;
	}
	snprintf(what, sizeof(what), "%s", name); /* refit_id -> "refit id" */
	for (p = what; *p; p++)
		*p = *p == '_' ? ' ' : *p;
	refit_err_clear(&e);
	if (refit_parse_u64(v, 1, UINT64_MAX, (uint64_t *)((char *)rq + f->offset), what, &e))
		return bad_input(&e);
	return 0;
}

static int
build_unregister(ctl_t *c, args_t *a, ProtobufCMessage *rq)
{
	(void)c;
	if (!a->pos[1][0])
		return -1;
	((Refit__V1__UnregisterLayoutRequest *)rq)->role = REFIT__V1__ROLE__INFER;
	return 0;
}

static const struct option trigger_opts[] = {
	{"version", required_argument, NULL, 'v'},
	{"mode", required_argument, NULL, 'm'},
	{"verify", no_argument, NULL, 'V'},
	{"wait", no_argument, NULL, 'w'},
	{"key", required_argument, NULL, 'k'},
	{NULL, 0, NULL, 0},
};

static int
build_trigger(ctl_t *c, args_t *a, ProtobufCMessage *rq)
{
	Refit__V1__TriggerRefitRequest *t = (Refit__V1__TriggerRefitRequest *)rq;
	refit_err_t e;

	(void)c;
	refit_err_clear(&e);
	for (int i = 0; i < a->nopt; i++) {
		const char *v = a->opt[i].arg;

		switch (a->opt[i].code) {
		case 'v':
			if (refit_parse_u64(v, 1, UINT64_MAX, &t->version, "--version", &e))
				return bad_input(&e);
			break;
		case 'm':
			if (strcmp(v, "reshard") == 0) {
				t->mode = REFIT__V1__MODE__RESHARD;
			} else if (strcmp(v, "broadcast") == 0) {
				t->mode = REFIT__V1__MODE__BROADCAST;
			} else {
				fprintf(stderr, "refitctl: --mode \"%s\": reshard or broadcast\n", v);
				return 2;
			}
			break;
		case 'V': t->verify = 1; break;
		case 'w': a->wait = true; break;
		case 'k': t->idempotency_key = (char *)v; break;
		}
	}
	return 0;
}

static const struct option policy_opts[] = {
	{"retries", required_argument, NULL, 'r'},
	{"backoff-ms", required_argument, NULL, 'b'},
	{"catch-up", required_argument, NULL, 'c'},
	{"strict-instances", required_argument, NULL, 's'},
	{"trigger", required_argument, NULL, 't'},
	{"min-interval-ms", required_argument, NULL, 'i'},
	{NULL, 0, NULL, 0},
};

/* "manual" or "on_ready" of --trigger into *out */
static int
parse_trigger(const char *v, Refit__V1__TriggerMode *out)
{
	if (strcmp(v, "manual") == 0)
		*out = REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL;
	else if (strcmp(v, "on_ready") == 0)
		*out = REFIT__V1__TRIGGER_MODE__TRIGGER_ON_READY;
	else {
		fprintf(stderr, "refitctl: --trigger takes manual or on_ready, not \"%s\"\n", v);
		return 2;
	}
	return 0;
}

/* "on" or "off" of --NAME into *out */
static int
parse_on_off(const char *name, const char *v, protobuf_c_boolean *out)
{
	if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
		fprintf(stderr, "refitctl: --%s takes on or off, not \"%s\"\n", name, v);
		return 2;
	}
	*out = strcmp(v, "on") == 0;
	return 0;
}

/* The model's policy as the coordinator has it, with the options applied:
 * options are checked first, the current policy read next. */
static int
build_policy(ctl_t *c, args_t *a, ProtobufCMessage *rq)
{
	Refit__V1__RefitPolicy p = REFIT__V1__REFIT_POLICY__INIT, cur = p;
	Refit__V1__GetModelRequest gq = REFIT__V1__GET_MODEL_REQUEST__INIT;
	bool set[6] = {false};
	Refit__V1__Model *m;
	refit_err_t e;
	uint64_t v;
	int rc = 0;

	refit_err_clear(&e);
	for (int i = 0; i < a->nopt && rc == 0; i++) {
		const char *s = a->opt[i].arg;

		switch (a->opt[i].code) {
		case 'r':
			if (refit_parse_u64(s, 0, 100, &v, "--retries", &e))
				return bad_input(&e);
			p.retries = (uint32_t)v;
			set[0] = true;
			break;
		case 'b':
			if (refit_parse_u64(s, 0, 3600000, &v, "--backoff-ms", &e))
				return bad_input(&e);
			p.retry_backoff_ms = (uint32_t)v;
			set[1] = true;
			break;
		case 'c': rc = parse_on_off("catch-up", s, &p.catch_up); set[2] = true; break;
		case 's':
			rc = parse_on_off("strict-instances", s, &p.strict_instances);
			set[3] = true;
			break;
		case 't': rc = parse_trigger(s, &p.trigger); set[4] = true; break;
		case 'i':
			if (refit_parse_u64(s, 0, 86400000, &v, "--min-interval-ms", &e))
				return bad_input(&e);
			p.min_interval_ms = (uint32_t)v;
			set[5] = true;
			break;
		}
	}
	if (rc != 0)
		return rc;
	gq.model = a->pos[0];
	if ((rc = call(c, "GetModel", &gq.base, (ProtobufCMessage **)&m)) != 0)
		return rc;
	if (m->policy != NULL)
		cur = *m->policy; /* its numbers only: the strings go with m */
	protobuf_c_message_free_unpacked(&m->base, NULL);
	a->policy = (Refit__V1__RefitPolicy)REFIT__V1__REFIT_POLICY__INIT;
	a->policy.model = a->pos[0];
	a->policy.retries = set[0] ? p.retries : cur.retries;
	a->policy.retry_backoff_ms = set[1] ? p.retry_backoff_ms : cur.retry_backoff_ms;
	a->policy.catch_up = set[2] ? p.catch_up : cur.catch_up;
	a->policy.strict_instances = set[3] ? p.strict_instances : cur.strict_instances;
	a->policy.trigger = set[4] ? p.trigger : cur.trigger;
	a->policy.min_interval_ms = set[5] ? p.min_interval_ms : cur.min_interval_ms;
	((Refit__V1__SetRefitPolicyRequest *)rq)->policy = &a->policy;
	return 0;
}

/* ---- the table ---------------------------------------------------------- */

static const cmd_t cmds[] = {
	{.name = "members", .args = "", .help = "membership: nodes, ranks, epoch, lease ages",
	 .method = "ListMembers", .text = text_members, .json = json_members},
	{.name = "models", .args = "", .help = "registered models, instances, versions, digests",
	 .method = "ListModels", .text = text_model, .json = json_model, .list = "models",
	 .none = "no models registered"},
	{.name = "model", .args = "NAME", .help = "one model", .min_args = 1, .max_args = 1,
	 .method = "GetModel", .field = {"model"}, .text = text_model, .json = json_model},
	{.name = "plan", .args = "MODEL", .help = "the planner's explain table for MODEL's layouts",
	 .min_args = 1, .max_args = 1, .method = "ExplainPlan", .field = {"model"},
	 .text = text_plan, .json = json_plan},
	{.name = "trigger",
	 .args = "MODEL [--version N] [--mode reshard|broadcast] [--verify] [--key K] [--wait]",
	 .help = "start a refit (--wait: follow it until it is final)", .min_args = 1,
	 .max_args = 1, .method = "TriggerRefit", .field = {"model"}, .opts = trigger_opts,
	 .build = build_trigger, .text = text_trigger, .json = json_trigger,
	 .then = then_trigger},
	{.name = "status", .args = "ID", .help = "one refit: state, epoch, plan, bytes, failure",
	 .min_args = 1, .max_args = 1, .method = "GetRefit", .field = {"refit_id"},
	 .text = text_refit, .json = json_refit},
	{.name = "list", .args = "[MODEL]", .help = "refits, newest first", .max_args = 1,
	 .method = "ListRefits", .field = {"model"}, .text = text_refit, .json = json_refit,
	 .list = "refits", .none = "no refits"},
	{.name = "watch", .args = "ID", .help = "follow a refit until it is final", .min_args = 1,
	 .max_args = 1, .method = "GetRefit", .field = {"refit_id"}, .then = then_watch},
	{.name = "abort", .args = "ID [REASON]", .help = "stop a refit", .min_args = 1,
	 .max_args = 2, .method = "AbortRefit", .field = {"refit_id", "reason"},
	 .dflt = "refitctl abort", .text = text_refit, .json = json_refit},
	{.name = "unregister", .args = "MODEL INSTANCE",
	 .help = "forget a stale inference instance (its clients are gone)", .min_args = 2,
	 .max_args = 2, .method = "UnregisterLayout", .field = {"model", "instance"},
	 .build = build_unregister, .text = text_unregister, .json = json_unregister},
	{.name = "drain", .args = "NODE [REASON]",
	 .help = "abort the node's refits, have it leave and stay out", .min_args = 1,
	 .max_args = 2, .method = "DrainMember", .field = {"node_id", "reason"},
	 .dflt = "refitctl drain", .text = text_drain, .json = json_drain},
	{.name = "policy", .args = "MODEL [--retries N] [--backoff-ms MS] [--catch-up on|off] "
	 "[--strict-instances on|off] [--trigger manual|on_ready] [--min-interval-ms MS]",
	 .help = "retries, back-off, catch-up and trigger policy of a model",
	 .min_args = 1, .max_args = 1, .method = "SetRefitPolicy", .opts = policy_opts,
	 .build = build_policy, .text = text_model, .json = json_model},
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static int
cmd_usage(const cmd_t *cmd)
{
	fprintf(stderr, "usage: refitctl %s%s%s\n", cmd->name, cmd->args[0] ? " " : "",
		cmd->args);
	return 2;
}

/* argv[0] is the command: options (getopt over cmd->opts) and positionals */
static int
parse_args(const cmd_t *cmd, int argc, char **argv, args_t *a)
{
	int o;

	if (cmd->opts != NULL) {
		optind = 0; /* reinitialise GNU getopt for the subcommand */
		while ((o = getopt_long(argc, argv, "", cmd->opts, NULL)) != -1) {
			if (o == '?' || o == ':' || a->nopt == MAX_OPTS)
				return cmd_usage(cmd);
			a->opt[a->nopt].code = o;
			a->opt[a->nopt++].arg = optarg;
		}
	} else {
		optind = 1;
	}
	a->pos = argv + optind;
	a->npos = argc - optind;
	if (a->npos < cmd->min_args || a->npos > cmd->max_args)
		return cmd_usage(cmd);
	return 0;
}

/* The request: the method's message with the positionals in their fields
 * (and the default of a second one left out), then the builder's part. */
static int
build(ctl_t *c, const cmd_t *cmd, args_t *a, ProtobufCMessage *rq)
{
	int rc = 0;

	for (int i = 0; i < 2 && cmd->field[i] && rc == 0; i++) {
		if (i < a->npos)
			rc = set_field(rq, cmd->field[i], a->pos[i]);
		else if (i == 1 && cmd->dflt)
			rc = set_field(rq, cmd->field[i], (char *)cmd->dflt);
	}
	if (rc == 0 && cmd->build)
		rc = cmd->build(c, a, rq);
	return rc < 0 ? cmd_usage(cmd) : rc;
}

/* Every command: arguments, request, call, output, free. */
static int
run(ctl_t *c, const cmd_t *cmd, int argc, char **argv)
{
	const ProtobufCMethodDescriptor *m =
		protobuf_c_service_descriptor_get_method_by_name(SVC, cmd->method);
	ProtobufCMessage *rq, *resp = NULL;
	args_t a = {0};
	int rc;

	if ((rc = parse_args(cmd, argc, argv, &a)) != 0)
		return rc;
	rq = oom(calloc(1, m->input->sizeof_message));
	protobuf_c_message_init(m->input, rq);
	if ((rc = build(c, cmd, &a, rq)) == 0 && (rc = call(c, cmd->method, rq, &resp)) == 0) {
		if (cmd->text != NULL)
			emit(c, cmd, resp, &a);
		rc = cmd->then ? cmd->then(c, &a, resp) : 0;
		protobuf_c_message_free_unpacked(resp, NULL);
	}
	free(rq); /* its strings are argv's */
	return rc;
}

static void
usage(FILE *f)
{
	fprintf(f, "usage: refitctl [--coordinator ADDR] [--token-file F]\n"
		"                [--tls-ca F [--tls-cert F --tls-key F]]\n"
		"                [--timeout-ms N] [--json] COMMAND [ARGS]\n\n");
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  %s%s%s\n        %s\n", cmds[i].name, cmds[i].args[0] ? " " : "",
			cmds[i].args, cmds[i].help);
	fprintf(f, "\nADDR defaults to $REFIT_COORDINATOR, else 127.0.0.1:7070.\n"
		"Exit codes: 0 ok, 1 error from the coordinator, 2 usage or bad input,\n"
		"3 coordinator unreachable, 4 the refit waited for ended FAILED or ABORTED.\n");
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"coordinator", required_argument, NULL, 'c'},
		{"token-file", required_argument, NULL, 't'},
		{"tls-ca", required_argument, NULL, 'a'},
		{"tls-cert", required_argument, NULL, 'C'},
		{"tls-key", required_argument, NULL, 'K'},
		{"timeout-ms", required_argument, NULL, 'T'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *addr = getenv("REFIT_COORDINATOR");
	rpc_client_opts_t co = {0};
	ctl_t c = {.timeout_ms = 10000};
	const cmd_t *cmd = NULL;
	refit_err_t e;
	char *token = NULL;
	uint64_t v;
	int o, rc;

	refit_err_clear(&e);
	while ((o = getopt_long(argc, argv, "+", lo, NULL)) != -1) {
		switch (o) {
		case 'c': addr = optarg; break;
		case 'a': co.tls.ca_file = optarg; break;
		case 'C': co.tls.cert_file = optarg; break;
		case 'K': co.tls.key_file = optarg; break;
		case 'j': c.json = 1; break;
		case 't':
			free(token);
			if (codec_read_token(optarg, &token, &e) != REFIT_OK)
				return bad_input(&e);
			co.token = token;
			break;
		case 'T':
			if (refit_parse_u64(optarg, 1, 3600000, &v, "--timeout-ms", &e)) {
				free(token);
				return bad_input(&e);
			}
			c.timeout_ms = (int64_t)v;
			break;
		case 'h':
			usage(stdout);
			free(token);
			return 0;
		default:
			usage(stderr);
			free(token);
			return 2;
		}
	}
	for (size_t i = 0; optind < argc && i < NCMDS && cmd == NULL; i++)
		if (strcmp(cmds[i].name, argv[optind]) == 0)
			cmd = &cmds[i];
	if (cmd == NULL) {
		if (optind < argc)
			fprintf(stderr, "refitctl: unknown command \"%s\"\n", argv[optind]);
		usage(stderr);
		free(token);
		return 2;
	}
	c.cli = rpc_client_new(addr ? addr : "127.0.0.1:7070", &co, &e);
	if (c.cli == NULL) {
		free(token);
		return bad_input(&e);
	}
	rc = run(&c, cmd, argc - optind, argv + optind); /* argv[0]: the command */
	rpc_client_free(c.cli);
	free(token);
	return rc;
}
