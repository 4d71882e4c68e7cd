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

#include "codec/json.h"
#include "common/parse.h"
#include "daemon/rpc.h"
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
		printf("{\"epoch\": %" PRIu64 ", \"members\": [", r->epoch);
		for (size_t i = 0; i < r->n_members; i++) {
			Refit__V1__Member *m = r->members[i];

			printf("%s\n  {\"member_id\": %" PRIu64 ", \"node_id\": \"%s\", "
			       "\"host\": \"%s\", \"ranks\": [", i ? "," : "", m->member_id,
			       m->node_id, m->host);
			for (size_t k = 0; k < m->n_ranks; k++)
				printf("%s{\"rank\": %d, \"domain\": \"%s\"}", k ? ", " : "",
				       m->ranks[k]->rank, m->ranks[k]->domain);
			printf("], \"joined_epoch\": %" PRIu64 ", \"lease_age_ms\": %" PRIu64 "}",
			       m->joined_epoch, m->lease_age_ms);
		}
		printf("\n]}\n");
	} else {
		printf("epoch %" PRIu64 ", %zu members\n", r->epoch, r->n_members);
		printf("%-6s %-20s %-22s %-7s %-12s %s\n", "ID", "NODE", "HOST", "RANKS",
		       "JOINED@EPOCH", "LEASE AGE");
		for (size_t i = 0; i < r->n_members; i++) {
			Refit__V1__Member *m = r->members[i];

			printf("%-6" PRIu64 " %-20s %-22s %-7zu %-12" PRIu64 " %" PRIu64 " ms / %u ms\n",
			       m->member_id, m->node_id, m->host, m->n_ranks, m->joined_epoch,
			       m->lease_age_ms, m->lease_ttl_ms);
		}
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static void
print_model(const Refit__V1__Model *m, int json)
{
	if (json) {
		printf("{\"name\": \"%s\", \"tensors\": %u, \"latest_version\": %" PRIu64
		       ", \"installed_version\": %" PRIu64 ", \"instances\": [", m->name,
		       m->tensors, m->latest_version, m->installed_version);
		for (size_t i = 0; i < m->n_instances; i++)
			printf("%s{\"instance\": \"%s\", \"role\": \"%s\", \"layout_digest\": "
			       "\"%s\", \"member_id\": %" PRIu64 "}", i ? ", " : "",
			       m->instances[i]->instance, role_name(m->instances[i]->role),
			       m->instances[i]->layout_digest, m->instances[i]->member_id);
		printf("]}");
		return;
	}
	printf("%-24s tensors %-6u latest v%-8" PRIu64 " installed v%" PRIu64 "\n", m->name,
	       m->tensors, m->latest_version, m->installed_version);
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
	if (c->json)
		printf("{\"models\": [");
	for (size_t i = 0; i < r->n_models; i++) {
		if (c->json && i)
			printf(", ");
		print_model(r->models[i], c->json);
	}
	printf(c->json ? "]}\n" : r->n_models ? "" : "no models registered\n");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_model(ctl_t *c, int argc, char **argv)
{
	Refit__V1__GetModelRequest rq = REFIT__V1__GET_MODEL_REQUEST__INIT;
	Refit__V1__Model *r;
	int rc;

	if (argc != 1) {
		fprintf(stderr, "usage: refitctl model NAME\n");
		return 2;
	}
	rq.model = argv[0];
	if ((rc = call(c, "GetModel", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	print_model(r, c->json);
	if (c->json)
		printf("\n");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}

static int
cmd_plan(ctl_t *c, int argc, char **argv)
{
	Refit__V1__ExplainPlanRequest rq = REFIT__V1__EXPLAIN_PLAN_REQUEST__INIT;
	Refit__V1__ExplainPlanResponse *r;
	int rc;

	if (argc != 1) {
		fprintf(stderr, "usage: refitctl plan MODEL\n");
		return 2;
	}
	rq.model = argv[0];
	if ((rc = call(c, "ExplainPlan", &rq.base, (ProtobufCMessage **)&r)) != 0)
		return rc;
	if (c->json)
		printf("{\"reshard_digest\": \"%s\", \"reshard_seconds\": %.9g, "
		       "\"broadcast_seconds\": %.9g, \"lower_bound_seconds\": %.9g}\n",
		       r->reshard_digest, r->reshard_seconds, r->broadcast_seconds,
		       r->lower_bound_seconds);
	else
		fputs(r->table, stdout);
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
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: refitctl [--coordinator ADDR] [--token-file F] [--tls-ca F]\n"
		"                [--timeout-ms N] [--json] COMMAND [ARGS]\n\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  %-8s %-7s %s\n", cmds[i].name, cmds[i].args, cmds[i].help);
	fprintf(f, "\nADDR defaults to $REFIT_COORDINATOR, else 127.0.0.1:7070.\n"
		"Exit codes: 0 ok, 1 error from the coordinator, 2 usage or bad input,\n"
		"3 coordinator unreachable.\n");
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"coordinator", required_argument, NULL, 'c'},
		{"token-file", required_argument, NULL, 't'},
		{"tls-ca", required_argument, NULL, 'a'},
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
		rc = cmds[i].run(&c, argc - optind - 1, argv + optind + 1);
		rpc_client_free(c.cli);
		free(token);
		return rc;
	}
	fprintf(stderr, "refitctl: unknown command \"%s\"\n", argv[optind]);
	usage(stderr);
	free(token);
	return 2;
}
