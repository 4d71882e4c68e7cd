/*
 * refitctl.c - the operator CLI for the coordinator.
 *
 * One binary, a table of subcommands driving dispatch and --help.  Exit
 * codes: 0 success, 1 the coordinator answered with an error, 2 usage or
 * bad input, 3 the coordinator could not be reached (address and reason
 * printed).
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
#include "rpc/rpc.h"
#include "refit/v1/refit.pb-c.h"

#define SVC (&refit__v1__coordinator__descriptor)

typedef struct ctl {
	rpc_client_t *cli;
	int json;
	int64_t timeout_ms;
} ctl_t;

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

static const char *
role_name(Refit__V1__Role r)
{
	return r == REFIT__V1__ROLE__TRAIN ? "train" : r == REFIT__V1__ROLE__INFER ? "infer" : "?";
}

/* ---- --json: built with cJSON (every string escaped; 64-bit numbers exact) */

static cJSON *
jnew(void)
{
	cJSON *o = cJSON_CreateObject();

	if (o == NULL) {
		fprintf(stderr, "refitctl: out of memory\n");
		exit(1);
	}
	return o;
}

static void
jstr(cJSON *o, const char *k, const char *v)
{
	cJSON_AddStringToObject(o, k, v ? v : "");
}

static void
ju64(cJSON *o, const char *k, uint64_t v)
{
	char b[24];

	snprintf(b, sizeof(b), "%" PRIu64, v);
	cJSON_AddRawToObject(o, k, b);
}

static void
jadd_u64(cJSON *a, uint64_t v)
{
	char b[24];

	snprintf(b, sizeof(b), "%" PRIu64, v);
	cJSON_AddItemToArray(a, cJSON_CreateRaw(b));
}

/* Print o on one line and free it. */
static void
jemit(cJSON *o)
{
	char *t = cJSON_PrintUnformatted(o);

	if (t == NULL) {
		fprintf(stderr, "refitctl: out of memory\n");
		exit(1);
	}
	puts(t);
	cJSON_free(t);
	cJSON_Delete(o);
}

static int
cmd_members(ctl_t *c, int argc, char **argv)
{
	Refit__V1__ListMembersRequest rq = REFIT__V1__LIST_MEMBERS_REQUEST__INIT;
	Refit__V1__ListMembersResponse *r;
	int rc;

	(void)argc;
	(void)argv;
	if ((rc = call(c, "ListMembers", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	if (c->json) {
		cJSON *o = jnew(), *ms;

		ju64(o, "epoch", r->epoch);
		ms = cJSON_AddArrayToObject(o, "members");
		for (size_t i = 0; i < r->n_members; i++) {
			Refit__V1__Member *m = r->members[i];
			cJSON *j = jnew(), *rs = NULL;

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
			cJSON_AddItemToArray(ms, j);
		}
		ju64(o, "node_calls_outstanding", r->node_calls_outstanding);
		ju64(o, "node_calls_cancelled", r->node_calls_cancelled);
		jemit(o);
	} else {
		printf("epoch %" PRIu64 ", %zu members\n", r->epoch, r->n_members);
		printf("%-6s %-20s %-22s %-7s %-12s %-20s %s\n", "ID", "NODE", "HOST", "RANKS",
		       "JOINED@EPOCH", "CONNECTION", "LEASE AGE");
		for (size_t i = 0; i < r->n_members; i++) {
			Refit__V1__Member *m = r->members[i];

			printf("%-6" PRIu64 " %-20s %-22s %-7zu %-12" PRIu64 " %-20s %" PRIu64
			       " ms / %u ms\n", m->member_id, m->node_id, m->host, m->n_ranks,
			       m->joined_epoch, m->connection, m->lease_age_ms, m->lease_ttl_ms);
		}
		printf("node calls: %" PRIu64 " outstanding, %" PRIu64 " cancelled since start\n",
		       r->node_calls_outstanding, r->node_calls_cancelled);
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static cJSON *
json_model(const Refit__V1__Model *m)
{
	cJSON *o = jnew(), *is;

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
		cJSON_AddItemToArray(is, j);
	}
	if (m->policy) {
		cJSON *p = cJSON_AddObjectToObject(o, "policy");

		cJSON_AddNumberToObject(p, "retries", m->policy->retries);
		cJSON_AddNumberToObject(p, "retry_backoff_ms", m->policy->retry_backoff_ms);
		cJSON_AddBoolToObject(p, "catch_up", m->policy->catch_up);
		cJSON_AddBoolToObject(p, "strict_instances", m->policy->strict_instances);
	}
	return o;
}

static void
print_model(const Refit__V1__Model *m, int json)
{
	if (json) {
		jemit(json_model(m));
		return;
	}
	printf("%-24s tensors %-6u latest v%-8" PRIu64 " installed v%" PRIu64, m->name,
	       m->tensors, m->latest_version, m->installed_version);
	if (m->policy)
		printf("  retries %u (backoff %u ms), catch-up %s%s", m->policy->retries,
		       m->policy->retry_backoff_ms, m->policy->catch_up ? "on" : "off",
		       m->policy->strict_instances ? ", strict instances" : "");
	printf("\n");
	for (size_t i = 0; i < m->n_instances; i++)
		printf("  %-5s %-16s layout %.16s  member %" PRIu64 "\n",
		       role_name(m->instances[i]->role), m->instances[i]->instance[0] ?
		       m->instances[i]->instance : "-", m->instances[i]->layout_digest,
		       m->instances[i]->member_id);
}

static int
cmd_models(ctl_t *c, int argc, char **argv)
{
	Refit__V1__ListModelsRequest rq = REFIT__V1__LIST_MODELS_REQUEST__INIT;
	Refit__V1__ListModelsResponse *r;
	int rc;

	(void)argc;
	(void)argv;
	if ((rc = call(c, "ListModels", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	if (c->json) {
		cJSON *o = jnew(), *ms = cJSON_AddArrayToObject(o, "models");

		for (size_t i = 0; i < r->n_models; i++)
			cJSON_AddItemToArray(ms, json_model(r->models[i]));
		jemit(o);
	} else {
		for (size_t i = 0; i < r->n_models; i++)
			print_model(r->models[i], 0);
		printf(r->n_models ? "" : "no models registered\n");
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_model(ctl_t *c, int argc, char **argv)
{
	Refit__V1__GetModelRequest rq = REFIT__V1__GET_MODEL_REQUEST__INIT;
	Refit__V1__Model *r;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc != 1) {
		fprintf(stderr, "usage: refitctl model NAME\n");
		return 2;
	}
	rq.model = argv[0];
	if ((rc = call(c, "GetModel", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	print_model(r, c->json);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_plan(ctl_t *c, int argc, char **argv)
{
	Refit__V1__ExplainPlanRequest rq = REFIT__V1__EXPLAIN_PLAN_REQUEST__INIT;
	Refit__V1__ExplainPlanResponse *r;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc != 1) {
		fprintf(stderr, "usage: refitctl plan MODEL\n");
		return 2;
	}
	rq.model = argv[0];
	if ((rc = call(c, "ExplainPlan", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	if (c->json) {
		cJSON *o = jnew();

		jstr(o, "reshard_digest", r->reshard_digest);
		cJSON_AddNumberToObject(o, "reshard_seconds", r->reshard_seconds);
		cJSON_AddNumberToObject(o, "broadcast_seconds", r->broadcast_seconds);
		cJSON_AddNumberToObject(o, "lower_bound_seconds", r->lower_bound_seconds);
		jemit(o);
	} else
		fputs(r->table, stdout);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static const char *
state_str(Refit__V1__RefitState s)
{
	static const char *const n[] = {"PENDING", "PREPARING", "RUNNING", "COMMITTED",
					"FAILED", "ABORTED"};

	return (unsigned)s <= 5 ? n[s] : "?";
}

static bool
final_state(Refit__V1__RefitState s)
{
	return s == REFIT__V1__REFIT_STATE__COMMITTED || s == REFIT__V1__REFIT_STATE__FAILED ||
	       s == REFIT__V1__REFIT_STATE__ABORTED;
}

/* Per-node planning: the slowest node, the mean, how many used a cached plan. */
static void
print_nodes(const Refit__V1__Refit *r)
{
	uint64_t max = 0, sum = 0;
	size_t cached = 0, reported = 0, slow = 0;

	if (r->running_after_ms)
		printf("       every slice running %" PRIu64 " ms after the trigger\n",
		       r->running_after_ms);
	for (size_t k = 0; k < r->n_nodes; k++) {
		if (!r->nodes[k]->reported)
			continue;
		reported++;
		cached += r->nodes[k]->plan_cached;
		sum += r->nodes[k]->plan_micros;
		if (r->nodes[k]->plan_micros >= max) {
			max = r->nodes[k]->plan_micros;
			slow = k;
		}
	}
	if (reported)
		printf("       planning on the nodes: %zu of %zu reported, %zu from their cache; "
		       "slowest %.1f ms (%s), mean %.1f ms\n", reported, r->n_nodes, cached,
		       max / 1e3, r->nodes[slow]->node_id, sum / 1e3 / (double)reported);
}

static cJSON *
json_refit(const Refit__V1__Refit *r)
{
	cJSON *o = jnew(), *a;

	ju64(o, "id", r->id);
	jstr(o, "model", r->model);
	ju64(o, "version", r->version);
	ju64(o, "epoch", r->epoch);
	jstr(o, "mode", r->mode == REFIT__V1__MODE__BROADCAST ? "broadcast" : "reshard");
	cJSON_AddBoolToObject(o, "verify", r->verify);
	jstr(o, "state", state_str(r->state));
	jstr(o, "plan_digest", r->plan_digest);
	ju64(o, "bytes", r->bytes);
	ju64(o, "created_unix_ms", r->created_unix_ms);
	ju64(o, "finished_unix_ms", r->finished_unix_ms);
	jstr(o, "failure", r->failure);
	a = cJSON_AddArrayToObject(o, "stages");
	for (size_t k = 0; k < r->n_stages; k++) {
		cJSON *j = jnew();

		cJSON_AddNumberToObject(j, "stage", r->stages[k]->stage);
		ju64(j, "micros", r->stages[k]->micros);
		ju64(j, "bytes", r->stages[k]->bytes);
		cJSON_AddItemToArray(a, j);
	}
	ju64(o, "comm_micros", r->comm_micros);
	cJSON_AddNumberToObject(o, "attempt", r->attempt);
	jstr(o, "instance", r->instance);
	a = cJSON_AddArrayToObject(o, "attempts");
	for (size_t k = 0; k < r->n_attempts; k++)
		cJSON_AddItemToArray(a, cJSON_CreateString(r->attempts[k] ? r->attempts[k] : ""));
	ju64(o, "running_after_ms", r->running_after_ms);
	a = cJSON_AddArrayToObject(o, "nodes");
	for (size_t k = 0; k < r->n_nodes; k++) {
		cJSON *j = jnew();

		jstr(j, "node_id", r->nodes[k]->node_id);
		ju64(j, "plan_micros", r->nodes[k]->plan_micros);
		cJSON_AddBoolToObject(j, "plan_cached", r->nodes[k]->plan_cached);
		ju64(j, "slice_micros", r->nodes[k]->slice_micros);
		cJSON_AddBoolToObject(j, "reported", r->nodes[k]->reported);
		cJSON_AddItemToArray(a, j);
	}
	a = cJSON_AddArrayToObject(o, "skipped");
	for (size_t k = 0; k < r->n_skipped; k++)
		cJSON_AddItemToArray(a, cJSON_CreateString(r->skipped[k] ? r->skipped[k] : ""));
	return o;
}

static void
print_refit(const Refit__V1__Refit *r, int json)
{
	if (json) {
		jemit(json_refit(r));
		return;
	}
	printf("%-6" PRIu64 " %-16s v%-7" PRIu64 " %-10s %-9s epoch %-12" PRIu64 " %.12s %s%s\n",
	       r->id, r->model, r->version, state_str(r->state),
	       r->mode == REFIT__V1__MODE__BROADCAST ? "broadcast" : "reshard", r->epoch,
	       r->plan_digest[0] ? r->plan_digest : "-", r->failure[0] ? "  " : "", r->failure);
	if (r->instance && r->instance[0])
		printf("       catch-up of instance \"%s\"\n", r->instance);
	for (size_t k = 0; k < r->n_skipped; k++)
		printf("       skipped instance \"%s\" (not healthy)\n", r->skipped[k]);
	for (size_t k = 0; k < r->n_attempts; k++)
		printf("       attempt %zu failed: %s\n", k + 1, r->attempts[k]);
	if (r->state == REFIT__V1__REFIT_STATE__COMMITTED && r->finished_unix_ms) {
		uint64_t data_us = 0;

		for (size_t k = 0; k < r->n_stages; k++)
			if (r->stages[k]->micros > data_us)
				data_us = r->stages[k]->micros;
		printf("       %" PRIu64 " bytes over the transport; %.1f ms end to end, %.1f ms "
		       "moving data (%zu stages:", r->bytes,
		       (double)(r->finished_unix_ms - r->created_unix_ms), data_us / 1e3,
		       r->n_stages);
		for (size_t k = 0; k < r->n_stages && k < 8; k++)
			printf(" %.1f ms", r->stages[k]->micros / 1e3);
		printf("%s)\n", r->n_stages > 8 ? " ..." : "");
		printf("       transport sessions ready in %.1f ms (slowest node)\n",
		       r->comm_micros / 1e3);
	}
	print_nodes(r);
}

/* exit status for a refit in a final state */
static int
refit_exit(const Refit__V1__Refit *r)
{
	return r->state == REFIT__V1__REFIT_STATE__COMMITTED ? 0 : 4;
}

static int
get_refit(ctl_t *c, uint64_t id, Refit__V1__Refit **out)
{
	Refit__V1__GetRefitRequest rq = REFIT__V1__GET_REFIT_REQUEST__INIT;

	rq.refit_id = id;
	return call(c, "GetRefit", &rq.base, (ProtobufCMessage **)out);
}

/* Poll until the refit is final; prints state changes. */
static int
watch(ctl_t *c, uint64_t id)
{
	int last = -1, rc;

	for (;;) {
		Refit__V1__Refit *r;

		if ((rc = get_refit(c, id, &r)) != 0)
			return rc;
		if ((int)r->state != last || final_state(r->state)) {
			if (!c->json || final_state(r->state))
				print_refit(r, c->json);
			last = (int)r->state;
		}
		if (final_state(r->state)) {
			rc = refit_exit(r);
			protobuf_c_message_free_unpacked(&r->base, NULL);
			return rc;
		}
		protobuf_c_message_free_unpacked(&r->base, NULL);
		usleep(200 * 1000);
	}
}

static int
parse_id(const char *s, uint64_t *id)
{
	refit_err_t e;

	refit_err_clear(&e);
	if (refit_parse_u64(s, 1, UINT64_MAX, id, "refit id", &e) != REFIT_OK) {
		fprintf(stderr, "refitctl: %s\n", e.msg);
		return 2;
	}
	return 0;
}

static int
cmd_trigger(ctl_t *c, int argc, char **argv)
{
	static const struct option lo[] = {
		{"version", required_argument, NULL, 'v'},
		{"mode", required_argument, NULL, 'm'},
		{"verify", no_argument, NULL, 'V'},
		{"wait", no_argument, NULL, 'w'},
		{"key", required_argument, NULL, 'k'},
		{NULL, 0, NULL, 0},
	};
	Refit__V1__TriggerRefitRequest rq = REFIT__V1__TRIGGER_REFIT_REQUEST__INIT;
	Refit__V1__TriggerRefitResponse *r;
	refit_err_t e;
	uint64_t v;
	int o, wait = 0, rc;

	refit_err_clear(&e);
	optind = 0; /* reinitialise GNU getopt for the subcommand */
	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'v':
			if (refit_parse_u64(optarg, 1, UINT64_MAX, &v, "--version", &e)) {
				fprintf(stderr, "refitctl: %s\n", e.msg);
				return 2;
			}
			rq.version = v;
			break;
		case 'm':
			if (strcmp(optarg, "reshard") == 0) {
				rq.mode = REFIT__V1__MODE__RESHARD;
			} else if (strcmp(optarg, "broadcast") == 0) {
				rq.mode = REFIT__V1__MODE__BROADCAST;
			} else {
				fprintf(stderr, "refitctl: --mode \"%s\": reshard or broadcast\n",
					optarg);
				return 2;
			}
			break;
		case 'V': rq.verify = 1; break;
		case 'w': wait = 1; break;
		case 'k': rq.idempotency_key = optarg; break;
		default:
			fprintf(stderr, "usage: refitctl trigger MODEL [--version N] [--mode "
				"reshard|broadcast] [--verify] [--key K] [--wait]\n");
			return 2;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, "usage: refitctl trigger MODEL [--version N] [--mode "
			"reshard|broadcast] [--verify] [--key K] [--wait]\n");
		return 2;
	}
	rq.model = argv[optind];
	if ((rc = call(c, "TriggerRefit", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	v = r->refit_id;
	if (c->json && !wait) {
		cJSON *o = jnew();

		ju64(o, "refit_id", v);
		cJSON_AddBoolToObject(o, "existing", r->existing);
		jemit(o);
	} else if (!c->json)
		printf("refit %" PRIu64 "%s\n", v, r->existing ? " (existing, same key)" : "");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return wait ? watch(c, v) : 0;
}

static int
cmd_status(ctl_t *c, int argc, char **argv)
{
	Refit__V1__Refit *r;
	uint64_t id;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc != 1) {
		fprintf(stderr, "usage: refitctl status ID\n");
		return 2;
	}
	if ((rc = parse_id(argv[0], &id)) != 0 || (rc = get_refit(c, id, &r)) != 0)
		return rc;
	print_refit(r, c->json);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_watch(ctl_t *c, int argc, char **argv)
{
	uint64_t id;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc != 1) {
		fprintf(stderr, "usage: refitctl watch ID\n");
		return 2;
	}
	if ((rc = parse_id(argv[0], &id)) != 0)
		return rc;
	return watch(c, id);
}

static int
cmd_list(ctl_t *c, int argc, char **argv)
{
	Refit__V1__ListRefitsRequest rq = REFIT__V1__LIST_REFITS_REQUEST__INIT;
	Refit__V1__ListRefitsResponse *r;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc > 1) {
		fprintf(stderr, "usage: refitctl list [MODEL]\n");
		return 2;
	}
	rq.model = argc ? argv[0] : "";
	if ((rc = call(c, "ListRefits", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	if (c->json) {
		cJSON *o = jnew(), *rs = cJSON_AddArrayToObject(o, "refits");

		for (size_t i = 0; i < r->n_refits; i++)
			cJSON_AddItemToArray(rs, json_refit(r->refits[i]));
		jemit(o);
	} else {
		for (size_t i = 0; i < r->n_refits; i++)
			print_refit(r->refits[i], 0);
		printf(r->n_refits ? "" : "no refits\n");
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_unregister(ctl_t *c, int argc, char **argv)
{
	Refit__V1__UnregisterLayoutRequest rq = REFIT__V1__UNREGISTER_LAYOUT_REQUEST__INIT;
	Refit__V1__UnregisterLayoutResponse *r;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc != 2 || !argv[1][0]) {
		fprintf(stderr, "usage: refitctl unregister MODEL INSTANCE\n");
		return 2;
	}
	rq.model = argv[0];
	rq.role = REFIT__V1__ROLE__INFER;
	rq.instance = argv[1];
	if ((rc = call(c, "UnregisterLayout", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	protobuf_c_message_free_unpacked(&r->base, NULL);
	if (c->json) {
		cJSON *o = jnew();

		jstr(o, "model", argv[0]);
		jstr(o, "unregistered", argv[1]);
		jemit(o);
	} else {
		printf("model %s: instance %s unregistered\n", argv[0], argv[1]);
	}
	return 0;
}

static int
cmd_abort(ctl_t *c, int argc, char **argv)
{
	Refit__V1__AbortRefitRequest rq = REFIT__V1__ABORT_REFIT_REQUEST__INIT;
	Refit__V1__Refit *r;
	uint64_t id;
	int rc;

	argc--; /* argv[0] is the command */
	argv++;

	if (argc < 1 || argc > 2) {
		fprintf(stderr, "usage: refitctl abort ID [REASON]\n");
		return 2;
	}
	if ((rc = parse_id(argv[0], &id)) != 0)
		return rc;
	rq.refit_id = id;
	rq.reason = argc > 1 ? argv[1] : "refitctl abort";
	if ((rc = call(c, "AbortRefit", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	print_refit(r, c->json);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_policy(ctl_t *c, int argc, char **argv)
{
	static const struct option lo[] = {
		{"retries", required_argument, NULL, 'r'},
		{"backoff-ms", required_argument, NULL, 'b'},
		{"catch-up", required_argument, NULL, 'c'},
		{"strict-instances", required_argument, NULL, 's'},
		{NULL, 0, NULL, 0},
	};
	Refit__V1__GetModelRequest gq = REFIT__V1__GET_MODEL_REQUEST__INIT;
	Refit__V1__SetRefitPolicyRequest rq = REFIT__V1__SET_REFIT_POLICY_REQUEST__INIT;
	Refit__V1__RefitPolicy p = REFIT__V1__REFIT_POLICY__INIT;
	Refit__V1__Model *m;
	refit_err_t e;
	uint64_t v;
	int o, rc;

	if (argc < 2) {
		fprintf(stderr, "usage: refitctl policy MODEL [--retries N] [--backoff-ms MS] "
			"[--catch-up on|off] [--strict-instances on|off]\n");
		return 2;
	}
	gq.model = argv[1];
	if ((rc = call(c, "GetModel", &gq.base, (ProtobufCMessage **)&m)) != 0)
		return rc;
	p.model = argv[1];
	if (m->policy) {
		p.retries = m->policy->retries;
		p.retry_backoff_ms = m->policy->retry_backoff_ms;
		p.catch_up = m->policy->catch_up;
		p.strict_instances = m->policy->strict_instances;
	}
	protobuf_c_message_free_unpacked(&m->base, NULL);
	refit_err_clear(&e);
	optind = 0;
	while ((o = getopt_long(argc - 1, argv + 1, "", lo, NULL)) != -1) {
		switch (o) {
		case 'r':
		case 'b':
			if (refit_parse_u64(optarg, 0, o == 'r' ? 100 : 3600000, &v,
					    o == 'r' ? "--retries" : "--backoff-ms", &e)) {
				fprintf(stderr, "refitctl: %s\n", e.msg);
				return 2;
			}
			if (o == 'r')
				p.retries = (uint32_t)v;
			else
				p.retry_backoff_ms = (uint32_t)v;
			break;
		case 'c':
			if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0) {
				fprintf(stderr, "refitctl: --catch-up takes on or off, not \"%s\"\n",
					optarg);
				return 2;
			}
			p.catch_up = strcmp(optarg, "on") == 0;
			break;
		case 's':
			if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0) {
				fprintf(stderr, "refitctl: --strict-instances takes on or off, not "
					"\"%s\"\n", optarg);
				return 2;
			}
			p.strict_instances = strcmp(optarg, "on") == 0;
			break;
		default:
			return 2;
		}
	}
	rq.policy = &p;
	if ((rc = call(c, "SetRefitPolicy", &rq.base, (ProtobufCMessage **)&m)) != 0)
		return rc;
	print_model(m, c->json);
	protobuf_c_message_free_unpacked(&m->base, NULL);
	return 0;
}

static int
cmd_drain(ctl_t *c, int argc, char **argv)
{
	Refit__V1__DrainMemberRequest rq = REFIT__V1__DRAIN_MEMBER_REQUEST__INIT;
	Refit__V1__DrainMemberResponse *r;
	int rc;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: refitctl drain NODE [REASON]\n");
		return 2;
	}
	rq.node_id = argv[1];
	rq.reason = argc > 2 ? argv[2] : "refitctl drain";
	if ((rc = call(c, "DrainMember", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	if (c->json) {
		cJSON *o = jnew(), *a;

		ju64(o, "member_id", r->member_id);
		a = cJSON_AddArrayToObject(o, "aborted_refits");
		for (size_t i = 0; i < r->n_aborted_refits; i++)
			jadd_u64(a, r->aborted_refits[i]);
		jemit(o);
	} else {
		printf("node %s (member %" PRIu64 ") drained; it leaves at its next heartbeat",
		       argv[1], r->member_id);
		for (size_t i = 0; i < r->n_aborted_refits; i++)
			printf("%s%" PRIu64, i ? ", " : "; refits aborted: ", r->aborted_refits[i]);
		printf("\n");
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

typedef struct cmd {
	const char *name, *args, *help;
	int (*run)(ctl_t *c, int argc, char **argv);
} cmd_t;

static const cmd_t cmds[] = {
	{"members", "", "membership: nodes, ranks, epoch, lease ages", cmd_members},
	{"models", "", "registered models, instances, versions, digests", cmd_models},
	{"model", "NAME", "one model", cmd_model},
	{"plan", "MODEL", "the planner's explain table for MODEL's layouts", cmd_plan},
	{"trigger", "MODEL", "start a refit [--version N] [--mode M] [--verify] [--key K] [--wait]",
	 cmd_trigger},
	{"status", "ID", "one refit: state, epoch, plan, bytes, failure", cmd_status},
	{"list", "[MODEL]", "refits, newest first", cmd_list},
	{"watch", "ID", "follow a refit until it is final", cmd_watch},
	{"abort", "ID", "stop a refit [REASON]", cmd_abort},
	{"unregister", "MODEL INSTANCE", "forget a stale inference instance (its clients "
	 "are gone)", cmd_unregister},
	{"drain", "NODE", "abort the node's refits, have it leave and stay out [REASON]",
	 cmd_drain},
	{"policy", "MODEL", "retries and catch-up [--retries N] [--backoff-ms MS] "
	 "[--catch-up on|off] [--strict-instances on|off]", cmd_policy},
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: refitctl [--coordinator ADDR] [--token-file F]\n"
		"                [--tls-ca F [--tls-cert F --tls-key F]]\n"
		"                [--timeout-ms N] [--json] COMMAND [ARGS]\n\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  %-8s %-8s %s\n", cmds[i].name, cmds[i].args, cmds[i].help);
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
	refit_err_t e;
	char *token = NULL;
	uint64_t v;
	int o, rc = 2;

	refit_err_clear(&e);
	while ((o = getopt_long(argc, argv, "+", lo, NULL)) != -1) {
		switch (o) {
		case 'c': addr = optarg; break;
		case 'a': co.tls.ca_file = optarg; break;
		case 'C': co.tls.cert_file = optarg; break;
		case 'K': co.tls.key_file = optarg; break;
		case 'j': c.json = 1; break;
		case 't': {
			size_t len;

			if (codec_read_file(optarg, &token, &len, &e) != REFIT_OK) {
				fprintf(stderr, "refitctl: %s\n", e.msg);
				return 2;
			}
			while (len && (token[len - 1] == '\n' || token[len - 1] == ' '))
				token[--len] = '\0';
			co.token = token;
			break;
		}
		case 'T':
			if (refit_parse_u64(optarg, 1, 3600000, &v, "--timeout-ms", &e)) {
				fprintf(stderr, "refitctl: %s\n", e.msg);
				return 2;
			}
			c.timeout_ms = (int64_t)v;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		if (strcmp(cmds[i].name, argv[optind]) != 0)
			continue;
		c.cli = rpc_client_new(addr ? addr : "127.0.0.1:7070", &co, &e);
		if (c.cli == NULL) {
			fprintf(stderr, "refitctl: %s\n", e.msg);
			free(token);
			return 2;
		}
		rc = cmds[i].run(&c, argc - optind, argv + optind); /* argv[0]: the command */
		rpc_client_free(c.cli);
		free(token);
		return rc;
	}
	fprintf(stderr, "refitctl: unknown command \"%s\"\n", argv[optind]);
	usage(stderr);
	free(token);
	return 2;
}
