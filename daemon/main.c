/*
 * main.c - refitd: the per-node daemon and, with --role coordinator, the
 * coordinator.  This build serves the coordinator role; the node role comes
 * with the data plane.
 *
 * Runs one libuv loop that owns all state; SIGTERM/SIGINT stop it cleanly;
 * under systemd (NOTIFY_SOCKET set) it reports READY=1 and STOPPING=1.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "codec/json.h"
#include "common/log.h"
#include "common/sdnotify.h"
#include "daemon/config.h"
#include "daemon/transport/gpu.h"
#include "daemon/coord/coord.h"
#include "daemon/node/node.h"
#include "daemon/metrics.h"
#include "daemon/ops.h"
#include "rpc/rpc.h"
#include "rpc/rpc_auth.h"

/* the most a stopping refitd waits for gRPC's shutdown (wait_grpc) */
#define GRPC_EXIT_WAIT_MS 2000

typedef struct daemon_state {
	uv_loop_t loop;
	uv_signal_t sigterm, sigint, sighup;
	int argc;
	char **argv;
	refitd_config_t *cfg;
	rpc_server_t *srv;
	coord_t *coord;
	node_t *node;
	rpc_async_t *rpc;     /* the one client engine: calls to nodes or the coordinator */
	ops_t *ops;           /* metrics, health, watchdog (daemon/ops.h) */
	bool stopping;
	int exit_status;      /* 0, or NODE_EXIT_POISONED (poisoned_exit) */
} daemon_state_t;

/* systemd's notify protocol (common/sdnotify.c); failures change nothing */
static void
sd_notify_msg(const char *msg)
{
	(void)sd_notify_send(msg);
}

/* The coordinator has finished its work in flight: the server can go. */
static void
on_coord_closed(void *arg)
{
	daemon_state_t *d = arg;

	rpc_server_free(d->srv);
	d->srv = NULL;
}

/* Stop gracefully (SIGTERM, or a poisoned node that must exit). */
static void
stop_daemon(daemon_state_t *d)
{
	sd_notify_msg("STOPPING=1");
	if (d->stopping)
		return; /* already on its way out */
	d->stopping = true;
	ops_stop(d->ops);
	d->ops = NULL;
	rpc_server_drain(d->srv);
	node_close(d->node);
	d->node = NULL;
	coord_close(d->coord, on_coord_closed, d); /* frees the server when done */
	d->coord = NULL;
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sighup, NULL);
}

/*
 * Everything of gRPC is freed: let gRPC's shutdown end before exiting, so
 * that its threads (and the OpenSSL state of their TLS handshakes) are
 * gone -- a channel destroyed while connecting ends on a thread of gRPC's
 * own, after main's last call (rpc_exit.c).  Bounded: a SIGTERM exits
 * promptly whatever gRPC does.
 */
static void
wait_grpc(void)
{
	if (!rpc_wait_shutdown(GRPC_EXIT_WAIT_MS))
		log_info("refitd: gRPC still shutting down after %d ms: exiting anyway",
			 GRPC_EXIT_WAIT_MS);
}

static void
on_signal(uv_signal_t *h, int signum)
{
	log_info("refitd: signal %d, stopping", signum);
	stop_daemon(h->data);
}

/* node_opts_t.poisoned_exit (config poisoned_exit = "on", or a sticky CUDA error) */
static void
on_poisoned_exit(void *arg)
{
	daemon_state_t *d = arg;

	d->exit_status = NODE_EXIT_POISONED;
	stop_daemon(d);
}

/*
 * A coordinator holds two connections per member (the member's calls in,
 * its own channel out) and a node one per peer it exchanges data with:
 * the soft descriptor limit (often 1,024) goes up to the hard one.
 */
static void
raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		log_warn("refitd: cannot raise the descriptor limit to %llu",
			 (unsigned long long)rl.rlim_max);
}

static int parse_args(int argc, char **argv, refitd_config_t *cfg, bool *check_only,
		      refit_err_t *err);

/* The operator and join tokens the configuration names (NULL: none). */
static refit_status_t
read_tokens(const refitd_config_t *c, char **token, char **join, refit_err_t *err)
{
	*token = *join = NULL;
	if (c->token_file)
		CHECK(codec_read_token(c->token_file, token, err));
	if (c->join_token_file && codec_read_token(c->join_token_file, join, err) != REFIT_OK) {
		free(*token);
		*token = NULL;
		return err->status;
	}
	if (*token && *join && strcmp(*token, *join) == 0) {
		free(*token);
		free(*join);
		*token = *join = NULL;
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s and %s hold the same "
				     "token: the join token is a node's credential, the operator "
				     "token an operator's; give each its own", c->token_file,
				     c->join_token_file);
	}
	return REFIT_OK;
}

static void
note_change(void *ctx, const char *key, bool reloadable)
{
	int *restart_needed = ctx;

	if (reloadable) {
		log_info("refitd: reload: %s changed", key);
	} else {
		log_warnx("refitd: reload: %s changed, but it applies only at start: "
			  "restart to use it", key);
		*restart_needed = 1;
	}
}

/* SIGHUP: read the file and flags again; apply the reloadable keys. */
static void
on_hup(uv_signal_t *h, int signum)
{
	daemon_state_t *d = h->data;
	refitd_config_t n;
	refit_err_t err;
	bool check_only;
	int restart = 0;
	char *token = NULL, *join = NULL;

	(void)signum;
	refit_err_clear(&err);
	config_init(&n);
	if (parse_args(d->argc, d->argv, &n, &check_only, &err) >= 0 ||
	    read_tokens(&n, &token, &join, &err) != REFIT_OK) {
		log_warnx("refitd: reload refused, configuration unchanged: %s", err.msg);
		free(token);
		config_fini(&n);
		return;
	}
	config_diff(d->cfg, &n, note_change, &restart);
	log_init("refitd", (enum log_level)log_level_parse(n.log_level), LOG_SUB_ALL);
	ops_set_log_format(n.log_format);
	if (d->srv) {
		rpc_server_set_token(d->srv, token);
		rpc_server_set_join_token(d->srv, join);
		rpc_server_reload_tls(d->srv); /* rotated certificates, same paths */
	}
	if (d->rpc) {
		rpc_async_set_join_token(d->rpc, join);
		if (rpc_async_reload_tls(d->rpc, &err) != REFIT_OK)
			log_warnx("refitd: reload: the client keeps its certificate: %s", err.msg);
	}
	if (d->coord)
		coord_set_timing(d->coord, (uint32_t)n.lease_ttl_ms, (uint32_t)n.heartbeat_ms);
	if (d->node) {
		node_set_heartbeat(d->node, (uint32_t)n.heartbeat_ms);
		node_set_bound(d->node, join != NULL);
	}
	free(token);
	free(join);
	config_apply_reloadable(d->cfg, &n); /* start-only keys keep their running value */
	config_fini(&n);
	log_info("refitd: configuration reloaded%s", restart ? " (some keys need a restart)" : "");
}

static void
usage(FILE *f)
{
	strbuf_t keys;

	strbuf_init(&keys);
	config_help(&keys);  /* from the key table: every key, as it is */
	fprintf(f,
		"usage: refitd [--config FILE] [--KEY VALUE ...]\n"
		"       refitd --check-config FILE   validate FILE, print the effective config\n"
		"       refitd --auth-table          the credential each RPC method needs\n"
		"Every config key is also a flag (--lease-ttl-ms 5000 sets lease_ttl_ms);\n"
		"flags override the file.  See config/*.json, docs/control-plane.md and\n"
		"docs/operations.md.  Keys:\n%s", keys.s);
	strbuf_fini(&keys);
}

static char hostname_buf[256];

/* A client's TLS: verify with tls_ca, present tls_cert (mutual TLS); the
 * server must carry name (NULL: the target's host). */
static void
client_tls(const refitd_config_t *cfg, rpc_tls_t *t, const char *name)
{
	t->ca_file = cfg->tls_ca;
	t->cert_file = cfg->tls_cert;
	t->key_file = cfg->tls_key;
	t->server_name = name;
}

/* The role's state on the loop: coordinator or node. */
static refit_status_t
start_role(daemon_state_t *d, const refitd_config_t *cfg, const coord_opts_t *co,
	   const char *token, const char *join, refit_err_t *err)
{
	node_opts_t no;
	int32_t *ranks = NULL;
	size_t nranks = 0;
	refit_status_t rc;

	if (strcmp(cfg->role, "coordinator") == 0) {
		coord_opts_t o = *co;
		rpc_client_opts_t to_nodes = {.join_token = join};

		/* calls to nodes: with the join token and each node's session;
		 * with mutual TLS, each node verified by its name (coord.c) */
		client_tls(cfg, &to_nodes.tls, NULL);
		if ((d->rpc = o.rpc = rpc_async_new(&d->loop, &to_nodes, err)) == NULL)
			return err->status;
		return (d->coord = coord_new(&d->loop, d->srv, &o, err)) ? REFIT_OK : err->status;
	}
	CHECK(config_parse_ranks(cfg->ranks, &ranks, &nranks, err));
	memset(&no, 0, sizeof(no));
	if (cfg->node_id == NULL && gethostname(hostname_buf, sizeof(hostname_buf) - 1) < 0)
		snprintf(hostname_buf, sizeof(hostname_buf), "node");
	no.node_id = cfg->node_id ? cfg->node_id : hostname_buf;
	log_set_node(no.node_id); /* every line of this process names the node */
	no.coordinator = cfg->coordinator;
	no.advertise = cfg->advertise ? cfg->advertise : cfg->listen;
	no.domain = cfg->domain;
	no.ranks = ranks;
	no.nranks = nranks;
	no.heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	client_tls(cfg, &no.client.tls, RPC_TLS_COORDINATOR);
	no.client.token = token;
	no.client.join_token = join;
	no.transport = cfg->transport;
	no.data_listen = cfg->data_listen;
	no.data_advertise = cfg->data_advertise;
	no.data_tls = strcmp(cfg->data_tls, "on") == 0;
	no.source_check = strcmp(cfg->data_source_check, "on") == 0;
	no.local_socket = cfg->local_socket;
	no.local_socket_group = cfg->local_socket_group;
	no.slice_timeout_ms = cfg->slice_timeout_ms;
	no.connect_timeout_ms = cfg->connect_timeout_ms;
	no.delta_base_bytes = cfg->delta_base_bytes;
	no.test_msg_delay_ms = cfg->test_msg_delay_ms;
	no.test_fail_commit = cfg->test_fail_commit;
	no.test_lose_publish = cfg->test_lose_publish;
	no.test_hold_run_ms = cfg->test_hold_run_ms;
	no.cuda_library = cfg->cuda_library;
	no.nccl_library = cfg->nccl_library;
	no.gpu_kernels_library = cfg->gpu_kernels_library;
	no.gpu_devices = cfg->gpu_devices;
	no.gpu_staging_budget = cfg->gpu_staging_budget_bytes;
	no.poisoned_exit = on_poisoned_exit;
	no.poisoned_exit_arg = d;
	no.exit_poisoned = cfg->poisoned_exit && strcmp(cfg->poisoned_exit, "on") == 0;
	if ((d->rpc = no.rpc = rpc_async_new(&d->loop, &no.client, err)) == NULL) {
		free(ranks);
		return err->status;
	}
	d->node = node_new(&d->loop, d->srv, &no, err);
	rc = d->node ? REFIT_OK : err->status;
	free(ranks);
	return rc;
}

/*
 * Options: --config FILE and --check-config FILE are read first; every
 * other --key-name VALUE sets config key key_name, after the file.
 */
static int
parse_args(int argc, char **argv, refitd_config_t *cfg, bool *check_only,
	   refit_err_t *err)
{
	const char *file = NULL;

	*check_only = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		}
		if ((strcmp(argv[i], "--config") == 0 ||
		     strcmp(argv[i], "--check-config") == 0) && i + 1 < argc) {
			*check_only |= strcmp(argv[i], "--check-config") == 0;
			file = argv[++i];
		}
	}
	if (file && config_load(cfg, file, err) != REFIT_OK)
		return 2;
	for (int i = 1; i < argc; i++) {
		char key[64];

		if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "--check-config") == 0) {
			i++;
			continue;
		}
		if (strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc ||
		    strlen(argv[i]) - 2 >= sizeof(key)) {
			refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: expected --key value "
				      "(see --help)", argv[i]);
			return 2;
		}
		snprintf(key, sizeof(key), "%s", argv[i] + 2);
		for (char *p = key; *p; p++)
			if (*p == '-')
				*p = '_';
		if (config_set(cfg, key, argv[++i], err) != REFIT_OK)
			return 2;
	}
	if (config_check(cfg, err) != REFIT_OK)
		return 2;
	return -1;
}

int
main(int argc, char **argv)
{
	refitd_config_t cfg;
	rpc_server_opts_t so;
	coord_opts_t co;
	daemon_state_t d;
	refit_err_t err;
	bool check_only;
	char *token = NULL, *join = NULL;
	int rc, port = 0;

	if (argc == 2 && strcmp(argv[1], GPU_ROOT_HOLDER_ARG) == 0)
		return gpu_root_holder_main(); /* an NCCL unique id's holder (gpu.h) */
	if (argc == 2 && strcmp(argv[1], "--auth-table") == 0) {
		rpc_auth_print_markdown(stdout); /* docs/control-plane.md (make figures) */
		return 0;
	}

	refit_err_clear(&err);
	config_init(&cfg);
	rc = parse_args(argc, argv, &cfg, &check_only, &err);
	if (rc >= 0) {
		if (rc)
			fprintf(stderr, "refitd: %s\n", err.msg);
		config_fini(&cfg);
		return rc;
	}
	if (check_only) {
		strbuf_t sb;

		strbuf_init(&sb);
		config_dump(&cfg, &sb);
		fputs(sb.s, stdout);
		strbuf_fini(&sb);
		config_fini(&cfg);
		return 0;
	}
	if (read_tokens(&cfg, &token, &join, &err) != REFIT_OK) {
		fprintf(stderr, "refitd: %s\n", err.msg);
		config_fini(&cfg);
		return 2;
	}
	memset(&so, 0, sizeof(so));
	so.listen = cfg.listen;
	so.max_msg_bytes = (size_t)cfg.max_msg_bytes;
	so.tls.cert_file = cfg.tls_cert;
	so.tls.key_file = cfg.tls_key;
	/* mutual TLS: the cluster CA verifies the callers too */
	so.tls.ca_file = cfg.tls_client_ca ? cfg.tls_client_ca : cfg.tls_ca;
	so.tls.require_client_cert = cfg.tls_cert != NULL && so.tls.ca_file != NULL;
	if (so.tls.require_client_cert && strcmp(cfg.role, "node") == 0)
		so.tls.member_name = RPC_TLS_COORDINATOR;
	so.token = token;
	so.join_token = join;
	so.refused = metrics_auth_refused;
	/* every field not set here is zero: NULL, false (etcd_tls.server_name
	 * left as stack garbage was the SNI and the "Peer name" gRPC checked) */
	memset(&co, 0, sizeof(co));
	co.lease_ttl_ms = (uint32_t)cfg.lease_ttl_ms;
	co.heartbeat_ms = (uint32_t)cfg.heartbeat_ms;
	co.state_file = cfg.state_file;
	co.state_store = cfg.state_store;
	co.etcd_endpoints = cfg.etcd_endpoints;
	co.etcd_prefix = cfg.etcd_prefix;
	co.etcd_tls.ca_file = cfg.etcd_tls_ca;
	co.etcd_tls.cert_file = cfg.etcd_tls_cert;
	co.etcd_tls.key_file = cfg.etcd_tls_key;
	co.etcd_lease_ttl_ms = (uint32_t)cfg.etcd_lease_ttl_ms;
	co.etcd_chunk_bytes = (size_t)cfg.etcd_chunk_bytes;
	co.advertise = cfg.advertise ? cfg.advertise : cfg.listen;
	co.staging_bytes = cfg.staging_bytes;
	co.nic_per_node = strcmp(cfg.nic, "node") == 0;
	co.instance_grace_ms = cfg.instance_grace_ms;
	co.refit_records = (uint32_t)cfg.refit_records;
	co.default_on_ready = strcmp(cfg.default_trigger, "on_ready") == 0;
	co.default_min_interval_ms = (uint32_t)cfg.default_min_interval_ms;
	co.slice_timeout_ms = cfg.slice_timeout_ms;
	co.test_hold_publish_ms = (uint32_t)cfg.test_hold_publish_ms;
	log_init("refitd", (enum log_level)log_level_parse(cfg.log_level), LOG_SUB_ALL);
	ops_set_log_format(cfg.log_format);
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();
	/* calls to other processes do not use libuv's pool (rpc_async.c); the
	 * coordinator plans on it (4 threads, the default), a node runs each
	 * slice on it for the slice's length, so a node gets a few more */
	if (strcmp(cfg.role, "node") == 0)
		setenv("UV_THREADPOOL_SIZE", "8", 0);
	so.observe = metrics_observe_rpc;
	memset(&d, 0, sizeof(d));
	uv_loop_init(&d.loop);
	if ((d.srv = rpc_server_new(&so, &d.loop, &err)) == NULL ||
	    start_role(&d, &cfg, &co, token, join, &err) != REFIT_OK ||
	    (d.ops = ops_start(&d.loop, d.srv, d.coord, d.node, &cfg, &err)) == NULL ||
	    rpc_server_start(d.srv, &port, &err) != REFIT_OK) {
		fprintf(stderr, "refitd: %s\n", err.msg);
		ops_stop(d.ops);
		if (d.srv)
			rpc_server_drain(d.srv);
		node_close(d.node);
		coord_close(d.coord, on_coord_closed, &d);
		uv_run(&d.loop, UV_RUN_DEFAULT);
		rpc_async_close(d.rpc);
		uv_run(&d.loop, UV_RUN_DEFAULT);
		uv_loop_close(&d.loop);
		wait_grpc();
		free(token);
		free(join);
		config_fini(&cfg);
		return 1;
	}
	uv_signal_init(&d.loop, &d.sigterm);
	uv_signal_init(&d.loop, &d.sigint);
	uv_signal_init(&d.loop, &d.sighup);
	d.sigterm.data = d.sigint.data = d.sighup.data = &d;
	d.argc = argc;
	d.argv = argv;
	d.cfg = &cfg;
	uv_signal_start(&d.sigterm, on_signal, SIGTERM);
	uv_signal_start(&d.sigint, on_signal, SIGINT);
	uv_signal_start(&d.sighup, on_hup, SIGHUP);
	log_info("refitd: %s listening on %s (port %d)", cfg.role, cfg.listen, port);
	if (!config_is_loopback(cfg.listen) && join == NULL && !so.tls.require_client_cert)
		log_warnx("refitd: INSECURE: listening on %s with no join token and no mutual "
			  "TLS (\"insecure\": true): anyone who reaches the port can join the "
			  "cluster and be sent model weights; set join_token_file",
			  cfg.listen);
	sd_notify_msg(d.coord ? "READY=1\nSTATUS=coordinator serving" :
		      "READY=1\nSTATUS=node serving");
	uv_run(&d.loop, UV_RUN_DEFAULT);
	rpc_async_close(d.rpc);  /* idle by now: stop its thread */
	uv_run(&d.loop, UV_RUN_DEFAULT);
	uv_loop_close(&d.loop);
	wait_grpc();
	free(token);
	free(join);
	config_fini(&cfg);
	log_info("refitd: stopped%s", d.exit_status ? " (poisoned_exit)" : "");
	return d.exit_status;
}
