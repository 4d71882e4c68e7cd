/*
 * refitctl_internal.h - what the files of refitctl share: the CLI's state
 * (ctl_t), a command's parsed arguments (args_t), a row of the command
 * table (cmd_t), and the printers of refitctl_show.c that the table and
 * run() in refitctl.c name.  refitctl.c calls refitctl_show.c, never the
 * other way.  Single-threaded, like the CLI.
 */
#ifndef REFIT_CLIENT_REFITCTL_INTERNAL_H
#define REFIT_CLIENT_REFITCTL_INTERNAL_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rpc/rpc.h"
#include "refit/v1/refit.pb-c.h"

#define MAX_OPTS 32

typedef struct ctl {
	rpc_client_t *cli;
	const char *addrs;          /* --coordinator: one address or several, commas */
	rpc_client_opts_t co;       /* to connect to another of them */
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
	/* a command that calls nothing (init): argv[0] is the command; its
	 * exit code (NULL: an RPC command) */
	int (*local)(int argc, char **argv);
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

/* `refitctl init DIR ...` (refitctl_init.c): argv[0] is "init"; the exit
 * code. */
int refitctl_init(int argc, char **argv);

/* p, or exit(1) after "out of memory" on stderr when p is NULL. */
void *refitctl_oom(void *p);

/* The response of cmd as text on stdout, or with c->json as one line of
 * JSON: the whole response, or with cmd->list each item of that repeated
 * field (cmd->none when there are none).  a: the command's arguments (NULL
 * where the printers need none). */
void refitctl_emit(ctl_t *c, const cmd_t *cmd, const void *resp, const args_t *a);

/* The printers of the command table: text_X prints resp (the command's
 * response, or one item of its list) on stdout; json_X returns a new cJSON
 * object the caller prints and frees (NULL: print nothing). */
void refitctl_text_members(const void *resp, const args_t *a);
cJSON *refitctl_json_members(const void *resp, const args_t *a);
void refitctl_text_model(const void *resp, const args_t *a);
cJSON *refitctl_json_model(const void *resp, const args_t *a);
void refitctl_text_plan(const void *resp, const args_t *a);
cJSON *refitctl_json_plan(const void *resp, const args_t *a);
void refitctl_text_refit(const void *resp, const args_t *a);
cJSON *refitctl_json_refit(const void *resp, const args_t *a);
void refitctl_text_trigger(const void *resp, const args_t *a);
cJSON *refitctl_json_trigger(const void *resp, const args_t *a);
void refitctl_text_unregister(const void *resp, const args_t *a);
cJSON *refitctl_json_unregister(const void *resp, const args_t *a);
void refitctl_text_drain(const void *resp, const args_t *a);
cJSON *refitctl_json_drain(const void *resp, const args_t *a);

#endif
