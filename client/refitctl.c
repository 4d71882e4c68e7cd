/*
 * refitctl.c - the operator CLI for the coordinator.
 *
 * One binary, one table of subcommands (cmds[] at the bottom) that drives
 * --help, argument checks, the request, the RPC, the output and the exit
 * status: each row names the command, its arguments, the Coordinator
 * method, the request fields its arguments fill, a builder for what the
 * table cannot say (options), the printers (text through one row helper,
 * and a cJSON object for --json, so every string is escaped; they live in
 * refitctl_show.c) and what follows (trigger --wait, watch).  run() does
 * request, call, print and free for every command.  This file holds the
 * table, the request builders, the RPC and main(); it calls
 * refitctl_show.c, never the other way.  Exit codes:
 * 0 success, 1 the coordinator answered with an error, 2 usage or bad
 * input, 3 the coordinator could not be reached (address and reason
 * printed), 4 the refit waited for ended FAILED or ABORTED.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/refitctl_internal.h"
#include "codec/json.h"
#include "common/parse.h"
#include "rpc/rpc.h"
#include "refit/v1/refit.pb-c.h"

#define SVC (&refit__v1__coordinator__descriptor)

static int
exit_for(const refit_err_t *e)
{
	if (e->status == REFIT_ERR_UNAVAILABLE || e->status == REFIT_ERR_TIMEOUT)
		return 3;
	return e->status == REFIT_ERR_INVALID_ARG ? 2 : 1;
}

/* The address after i in the list (wrapping), or the one "not the leader:
 * ADDR" names; NULL when the list has one address. */
static const char *
next_addr(const ctl_t *c, const char *msg, char *buf, size_t n)
{
	const char *cur = rpc_client_target(c->cli), *p = strstr(msg, "not the leader: ");
	const char *a = c->addrs, *first = NULL;
	bool after = false;

	if (p != NULL && strncmp(p + 16, "none", 4) != 0) {
		snprintf(buf, n, "%.*s", (int)strcspn(p + 16, " ),"), p + 16);
		return buf;
	}
	if (a == NULL || strchr(a, ',') == NULL)
		return NULL;
	while (*a) {
		size_t len = strcspn(a, ",");

		snprintf(buf, n, "%.*s", (int)len, a);
		if (first == NULL)
			first = a;
		if (after)
			return buf;
		after = strcmp(buf, cur) == 0;
		a += len + (a[len] == ',');
	}
	snprintf(buf, n, "%.*s", (int)strcspn(first, ","), first);
	return buf;
}

/*
 * Several coordinators (docs/ha.md): a standby's UNAVAILABLE "not the
 * leader: ADDR" is followed to ADDR at once, an unreachable one to the next
 * address; each at most twice the list's length.  A refusal that is not
 * about reaching the leader (etcd unreachable, say) is the answer.
 */
static refit_status_t
call_leader(ctl_t *c, const char *method, const ProtobufCMessage *req, ProtobufCMessage **resp,
	    refit_err_t *e)
{
	char buf[256];
	refit_status_t rc;

	for (int tries = 0;; tries++) {
		const char *to;
		rpc_client_t *nc;

		refit_err_clear(e);
		rc = rpc_client_call(c->cli, SVC, method, req, resp, c->timeout_ms, e);
		if (rc != REFIT_ERR_UNAVAILABLE || tries >= 8 || strstr(e->msg, "etcd") != NULL ||
		    (to = next_addr(c, e->msg, buf, sizeof(buf))) == NULL)
			return rc;
		if ((nc = rpc_client_new(to, &c->co, e)) == NULL)
			return e->status;
		rpc_client_free(c->cli);
		c->cli = nc;
	}
}

static int
call(ctl_t *c, const char *method, const ProtobufCMessage *req, ProtobufCMessage **resp)
{
	refit_err_t e;

	refit_err_clear(&e);
	if (call_leader(c, method, req, resp, &e) != REFIT_OK) {
		fprintf(stderr, "refitctl: %s\n", e.msg);
		if (e.status == REFIT_ERR_UNAVAILABLE)
			fprintf(stderr, "refitctl: is a coordinator running at %s? (set "
				"--coordinator or REFIT_COORDINATOR)\n", rpc_client_target(c->cli));
		return exit_for(&e);
	}
	return 0;
}

/* What the coordinator at addr answers ListMembers, in words: a standby
 * names the leader; into out. */
static void
probe(const ctl_t *c, const char *addr, char *out, size_t n)
{
	Refit__V1__ListMembersRequest rq = REFIT__V1__LIST_MEMBERS_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	rpc_client_t *pc;
	refit_err_t e;
	const char *p;

	refit_err_clear(&e);
	if ((pc = rpc_client_new(addr, &c->co, &e)) == NULL) {
		snprintf(out, n, "cannot be dialled: %s", e.msg);
		return;
	}
	if (rpc_client_call(pc, SVC, "ListMembers", &rq.base, &resp,
			    c->timeout_ms < 2000 ? c->timeout_ms : 2000, &e) == REFIT_OK) {
		snprintf(out, n, "answered as well (leading too: not over the same etcd and "
			 "prefix?)");
		protobuf_c_message_free_unpacked(resp, NULL);
	} else if ((p = strstr(e.msg, "not the leader: ")) != NULL) {
		snprintf(out, n, "standby (names the leader: %s)", p + 16);
	} else {
		snprintf(out, n, "unreachable or refusing: %s", e.msg);
	}
	rpc_client_free(pc);
}

/*
 * members, text, given several coordinators or one that named the leader
 * (docs/ha.md): which one leads (it answered) and what each other one of
 * the list answers -- a standby naming the leader, or unreachable.
 */
static void
coordinators_report(const ctl_t *c)
{
	const char *lead = rpc_client_target(c->cli), *a = c->addrs;
	char addr[256], what[REFIT_ERR_MSG_MAX + 64];

	if (strchr(a, ',') == NULL) {
		if (strcmp(a, lead) != 0)
			printf("coordinator leading: %s (followed from %s, a standby)\n", lead, a);
		return;
	}
	printf("coordinator leading: %s (answered)\n", lead);
	while (*a) {
		size_t len = strcspn(a, ",");

		snprintf(addr, sizeof(addr), "%.*s", (int)len, a);
		a += len + (a[len] == ',');
		if (addr[0] == '\0' || strcmp(addr, lead) == 0)
			continue;
		probe(c, addr, what, sizeof(what));
		printf("coordinator %s: %s\n", addr, what);
	}
}

static int
bad_input(const refit_err_t *e)
{
	fprintf(stderr, "refitctl: %s\n", e->msg);
	return 2;
}

static bool
final_state(Refit__V1__RefitState s)
{
	return s == REFIT__V1__REFIT_STATE__COMMITTED || s == REFIT__V1__REFIT_STATE__FAILED ||
	       s == REFIT__V1__REFIT_STATE__ABORTED;
}

/* Poll until the refit is final; prints each new state (--json: the final
 * one).  Exit 0 when it committed, 4 when it failed or was aborted. */
static int
watch(ctl_t *c, uint64_t id)
{
	static const cmd_t show = {.text = refitctl_text_refit, .json = refitctl_json_refit};
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
			refitctl_emit(c, &show, r, NULL);
		last = (int)r->state;
		rc = r->state == REFIT__V1__REFIT_STATE__COMMITTED ? 0 : 4;
		protobuf_c_message_free_unpacked(&r->base, NULL);
		if (final)
			return rc;
		usleep(200 * 1000);
	}
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
	{"delta", required_argument, NULL, 'd'},
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

/* "auto" or "off" of --delta into *out */
static int
parse_delta(const char *v, Refit__V1__DeltaMode *out)
{
	if (strcmp(v, "auto") == 0)
		*out = REFIT__V1__DELTA_MODE__DELTA_AUTO;
	else if (strcmp(v, "off") == 0)
		*out = REFIT__V1__DELTA_MODE__DELTA_OFF;
	else {
		fprintf(stderr, "refitctl: --delta takes auto or off, not \"%s\"\n", v);
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
	bool set[7] = {false};
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
		case 'd': rc = parse_delta(s, &p.delta); set[6] = true; break;
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
	a->policy.delta = set[6] ? p.delta : cur.delta;
	((Refit__V1__SetRefitPolicyRequest *)rq)->policy = &a->policy;
	return 0;
}

/* ---- the table ---------------------------------------------------------- */

static const cmd_t cmds[] = {
	{.name = "init", .args = "DIR [--nodes N|ID,ID,...] [--days D]",
	 .help = "make the cluster's secrets in DIR (mode 0600, never over a file): "
	 "operator.token, join.token, a CA, the coordinator's and the nodes' certificates; "
	 "calls nothing", .local = refitctl_init},
	{.name = "members", .args = "", .help = "membership: nodes, ranks, epoch, lease ages",
	 .method = "ListMembers", .text = refitctl_text_members, .json = refitctl_json_members},
	{.name = "models", .args = "", .help = "registered models, instances, versions, digests",
	 .method = "ListModels", .text = refitctl_text_model, .json = refitctl_json_model,
	 .list = "models", .none = "no models registered"},
	{.name = "model", .args = "NAME", .help = "one model", .min_args = 1, .max_args = 1,
	 .method = "GetModel", .field = {"model"}, .text = refitctl_text_model,
	 .json = refitctl_json_model},
	{.name = "plan", .args = "MODEL", .help = "the planner's explain table for MODEL's layouts",
	 .min_args = 1, .max_args = 1, .method = "ExplainPlan", .field = {"model"},
	 .text = refitctl_text_plan, .json = refitctl_json_plan},
	{.name = "trigger",
	 .args = "MODEL [--version N] [--mode reshard|broadcast] [--verify] [--key K] [--wait]",
	 .help = "start a refit (--wait: follow it until it is final)", .min_args = 1,
	 .max_args = 1, .method = "TriggerRefit", .field = {"model"}, .opts = trigger_opts,
	 .build = build_trigger, .text = refitctl_text_trigger, .json = refitctl_json_trigger,
	 .then = then_trigger},
	{.name = "status", .args = "ID", .help = "one refit: state, epoch, plan, bytes, failure",
	 .min_args = 1, .max_args = 1, .method = "GetRefit", .field = {"refit_id"},
	 .text = refitctl_text_refit, .json = refitctl_json_refit},
	{.name = "list", .args = "[MODEL]", .help = "refits, newest first", .max_args = 1,
	 .method = "ListRefits", .field = {"model"}, .text = refitctl_text_refit,
	 .json = refitctl_json_refit, .list = "refits", .none = "no refits"},
	{.name = "watch", .args = "ID", .help = "follow a refit until it is final", .min_args = 1,
	 .max_args = 1, .method = "GetRefit", .field = {"refit_id"}, .then = then_watch},
	{.name = "abort", .args = "ID [REASON]", .help = "stop a refit", .min_args = 1,
	 .max_args = 2, .method = "AbortRefit", .field = {"refit_id", "reason"},
	 .dflt = "refitctl abort", .text = refitctl_text_refit, .json = refitctl_json_refit},
	{.name = "unregister", .args = "MODEL INSTANCE",
	 .help = "forget a stale inference instance (its clients are gone)", .min_args = 2,
	 .max_args = 2, .method = "UnregisterLayout", .field = {"model", "instance"},
	 .build = build_unregister, .text = refitctl_text_unregister,
	 .json = refitctl_json_unregister},
	{.name = "drain", .args = "NODE [REASON]",
	 .help = "abort the node's refits, have it leave and stay out", .min_args = 1,
	 .max_args = 2, .method = "DrainMember", .field = {"node_id", "reason"},
	 .dflt = "refitctl drain", .text = refitctl_text_drain, .json = refitctl_json_drain},
	{.name = "policy", .args = "MODEL [--retries N] [--backoff-ms MS] [--catch-up on|off] "
	 "[--strict-instances on|off] [--trigger manual|on_ready] [--min-interval-ms MS] "
	 "[--delta auto|off]",
	 .help = "retries, back-off, catch-up, trigger and delta policy of a model",
	 .min_args = 1, .max_args = 1, .method = "SetRefitPolicy", .opts = policy_opts,
	 .build = build_policy, .text = refitctl_text_model, .json = refitctl_json_model},
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
	rq = refitctl_oom(calloc(1, m->input->sizeof_message));
	protobuf_c_message_init(m->input, rq);
	if ((rc = build(c, cmd, &a, rq)) == 0 && (rc = call(c, cmd->method, rq, &resp)) == 0) {
		if (cmd->text != NULL)
			refitctl_emit(c, cmd, resp, &a);
		if (cmd->text != NULL && !c->json && strcmp(cmd->method, "ListMembers") == 0)
			coordinators_report(c);
		rc = cmd->then ? cmd->then(c, &a, resp) : 0;
		protobuf_c_message_free_unpacked(resp, NULL);
	}
	free(rq); /* its strings are argv's */
	return rc;
}

static void
usage(FILE *f)
{
	fprintf(f, "usage: refitctl [--coordinator ADDR[,ADDR...]] [--token-file F]\n"
		"                [--tls-ca F [--tls-cert F --tls-key F] [--tls-name N]]\n"
		"                [--timeout-ms N] [--json] COMMAND [ARGS]\n\n");
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  %s%s%s\n        %s\n", cmds[i].name, cmds[i].args[0] ? " " : "",
			cmds[i].args, cmds[i].help);
	fprintf(f, "\nADDR defaults to $REFIT_COORDINATOR, else 127.0.0.1:7070.  With --tls-ca the\n"
		"coordinator's certificate must name N (default coordinator.refit, as\n"
		"refitctl init makes it).\n"
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
		{"tls-name", required_argument, NULL, 'N'},
		{"timeout-ms", required_argument, NULL, 'T'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *addr = getenv("REFIT_COORDINATOR");
	rpc_client_opts_t co = {.tls.server_name = RPC_TLS_COORDINATOR};
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
		case 'N': co.tls.server_name = optarg; break;
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
	if (cmd->local != NULL) {
		free(token);
		return cmd->local(argc - optind, argv + optind);
	}
	c.addrs = addr ? addr : "127.0.0.1:7070";
	c.co = co;
	{
		char first[256];

		snprintf(first, sizeof(first), "%.*s", (int)strcspn(c.addrs, ","), c.addrs);
		c.cli = rpc_client_new(first, &co, &e);
	}
	if (c.cli == NULL) {
		free(token);
		return bad_input(&e);
	}
	rc = run(&c, cmd, argc - optind, argv + optind); /* argv[0]: the command */
	rpc_client_free(c.cli);
	free(token);
	return rc;
}
