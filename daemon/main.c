/*
 * main.c - refitd: the per-node daemon and, with --role coordinator, the
 * coordinator.  This build serves the coordinator role; the node role comes
 * with the data plane.
 *
 * Runs one libuv loop that owns all state; SIGTERM/SIGINT stop it cleanly;
 * under systemd (NOTIFY_SOCKET set) it reports READY=1 and STOPPING=1.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "codec/json.h"
#include "common/log.h"
#include "common/parse.h"
#include "daemon/coord.h"

typedef struct daemon_state {
	uv_loop_t loop;
	uv_signal_t sigterm, sigint;
	rpc_server_t *srv;
	coord_t *coord;
} daemon_state_t;

/* systemd's notify protocol: one datagram to $NOTIFY_SOCKET. */
static void
sd_notify_msg(const char *msg)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	int fd;

	if (path == NULL || (path[0] != '/' && path[0] != '@') ||
	    strlen(path) >= sizeof(sa.sun_path))
		return;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0';
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	(void)!sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&sa,
		      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path)));
	close(fd);
}

static void
on_signal(uv_signal_t *h, int signum)
{
	daemon_state_t *d = h->data;

	log_info("refitd: signal %d, stopping", signum);
	sd_notify_msg("STOPPING=1");
	coord_close(d->coord);
	d->coord = NULL;
	rpc_server_free(d->srv);
	d->srv = NULL;
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
}

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: refitd --role coordinator --listen ADDR [options]\n"
		"  --listen ADDR        host:port or unix:/path (default 127.0.0.1:7070)\n"
		"  --lease-ttl-ms N     member lease (default 10000)\n"
		"  --heartbeat-ms N     heartbeat interval told to members (default 2000)\n"
		"  --token-file F       bearer token required for operator methods\n"
		"  --tls-cert F --tls-key F [--tls-client-ca F]   TLS (mutual with a CA)\n"
		"  --max-msg-bytes N    largest RPC message (default 64MiB)\n"
		"  --log-level L        error|warn|info|debug (default info)\n");
}

static char *
read_token(const char *path, refit_err_t *err)
{
	char *buf;
	size_t len;

	if (codec_read_file(path, &buf, &len, err) != REFIT_OK)
		return NULL;
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
		buf[--len] = '\0';
	if (len == 0) {
		refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: the token file is empty", path);
		free(buf);
		return NULL;
	}
	return buf;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"role", required_argument, NULL, 'r'},
		{"listen", required_argument, NULL, 'l'},
		{"lease-ttl-ms", required_argument, NULL, 'L'},
		{"heartbeat-ms", required_argument, NULL, 'H'},
		{"token-file", required_argument, NULL, 't'},
		{"tls-cert", required_argument, NULL, 'c'},
		{"tls-key", required_argument, NULL, 'k'},
		{"tls-client-ca", required_argument, NULL, 'a'},
		{"max-msg-bytes", required_argument, NULL, 'm'},
		{"log-level", required_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *role = NULL, *token_file = NULL;
	rpc_server_opts_t so = {.listen = "127.0.0.1:7070"};
	coord_opts_t co = {.lease_ttl_ms = 10000, .heartbeat_ms = 2000};
	daemon_state_t d;
	refit_err_t err;
	uint64_t v;
	char *token = NULL;
	int c, lvl = LOG_LVL_INFO, port = 0;

	refit_err_clear(&err);
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'r': role = optarg; break;
		case 'l': so.listen = optarg; break;
		case 't': token_file = optarg; break;
		case 'c': so.tls.cert_file = optarg; break;
		case 'k': so.tls.key_file = optarg; break;
		case 'a': so.tls.ca_file = optarg; so.tls.require_client_cert = true; break;
		case 'L':
			if (refit_parse_u64(optarg, 100, 3600000, &v, "--lease-ttl-ms", &err))
				goto bad;
			co.lease_ttl_ms = (uint32_t)v;
			break;
		case 'H':
			if (refit_parse_u64(optarg, 10, 600000, &v, "--heartbeat-ms", &err))
				goto bad;
			co.heartbeat_ms = (uint32_t)v;
			break;
		case 'm':
			if (refit_parse_size(optarg, &v, "--max-msg-bytes", &err) ||
			    v < 4096 || v > (1u << 30)) {
				refit_err_set(&err, REFIT_ERR_INVALID_ARG, "--max-msg-bytes: "
					      "\"%s\" must be from 4KiB to 1GiB", optarg);
				goto bad;
			}
			so.max_msg_bytes = (size_t)v;
			break;
		case 'v':
			if ((lvl = log_level_parse(optarg)) < 0) {
				refit_err_set(&err, REFIT_ERR_INVALID_ARG, "--log-level: \"%s\" is "
					      "not error, warn, info or debug", optarg);
				goto bad;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (role == NULL || strcmp(role, "coordinator") != 0) {
		fprintf(stderr, "refitd: --role %s: this build serves --role coordinator; "
			"the node role arrives with the data plane\n", role ? role : "(missing)");
		return 2;
	}
	if (co.heartbeat_ms >= co.lease_ttl_ms) {
		refit_err_set(&err, REFIT_ERR_INVALID_ARG, "--heartbeat-ms %u must be shorter "
			      "than --lease-ttl-ms %u", co.heartbeat_ms, co.lease_ttl_ms);
		goto bad;
	}
	if (token_file && (token = read_token(token_file, &err)) == NULL)
		goto bad;
	so.token = token;
	log_init("refitd", (enum log_level)lvl, LOG_SUB_ALL);
	signal(SIGPIPE, SIG_IGN);
	memset(&d, 0, sizeof(d));
	uv_loop_init(&d.loop);
	if ((d.srv = rpc_server_new(&so, &d.loop, &err)) == NULL ||
	    (d.coord = coord_new(&d.loop, d.srv, &co, &err)) == NULL ||
	    rpc_server_start(d.srv, &port, &err) != REFIT_OK) {
		fprintf(stderr, "refitd: %s\n", err.msg);
		coord_close(d.coord);
		rpc_server_free(d.srv);
		uv_run(&d.loop, UV_RUN_DEFAULT);
		uv_loop_close(&d.loop);
		free(token);
		return 1;
	}
	uv_signal_init(&d.loop, &d.sigterm);
	uv_signal_init(&d.loop, &d.sigint);
	d.sigterm.data = d.sigint.data = &d;
	uv_signal_start(&d.sigterm, on_signal, SIGTERM);
	uv_signal_start(&d.sigint, on_signal, SIGINT);
	log_info("refitd: coordinator listening on %s (port %d), lease %u ms", so.listen,
		 port, co.lease_ttl_ms);
	sd_notify_msg("READY=1\nSTATUS=coordinator serving");
	uv_run(&d.loop, UV_RUN_DEFAULT);
	uv_loop_close(&d.loop);
	free(token);
	log_info("refitd: stopped");
	return 0;
bad:
	fprintf(stderr, "refitd: %s\n", err.msg);
	free(token);
	return 2;
}
