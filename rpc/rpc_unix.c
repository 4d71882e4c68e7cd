/*
 * rpc_unix.c - a server's unix socket: the lock that keeps a second daemon
 * off its path, and (opts.peer_cred) the listener that knows who called.
 *
 * gRPC core tells a handler nothing of a unix-socket caller's process
 * (1.51: the peer string names a socket address, not a process; the auth
 * context of insecure credentials is empty, and local credentials add only
 * the transport type and security level).  So with
 * peer_cred the server accepts the connections itself, on a thread of its
 * own: each one's SO_PEERCRED (the pid, uid and gid of the process that
 * connected) is recorded under its fd number, and the fd is handed to gRPC
 * (grpc_server_add_channel_from_fd), which names the connection's peer
 * "fd:N".  A call's credentials are then those recorded under N.  That
 * holds while the call lives: a call holds its HTTP/2 stream, the stream
 * its transport, and the transport closes its endpoint (the fd) only when
 * destroyed, so N cannot be closed and given to another connection under
 * a live call (seen on 1.51: a client killed while its WaitVersion is
 * held leaves the node's fd open until the call is answered); a new accept
 * that gets N again overwrites the record before gRPC sees the new
 * connection.  Plaintext only (gRPC takes fds with
 * insecure credentials alone): the socket's file mode is the gate.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc_posix.h>

#include "common/alloc.h"
#include "common/log.h"
#include "rpc/rpc_internal.h"

typedef struct peer_slot {
	rpc_peer_cred_t cred;
	bool set;
} peer_slot_t;

struct rpc_unix {
	grpc_server *srv;
	grpc_server_credentials *creds;
	char *path;
	int fd;                     /* listening */
	pthread_t th;
	atomic_bool stopping;
	pthread_mutex_t mu;
	peer_slot_t *peers;         /* by fd number, under mu */
	size_t npeers;
	time_t logged;              /* accept thread: last accept error logged */
};

refit_status_t
rpc_unix_lock(const char *listen, int *lockfd, refit_err_t *err)
{
	char lock[4096];

	if (strncmp(listen, "unix:", 5) != 0)
		return REFIT_OK;
	snprintf(lock, sizeof(lock), "%s.lock", listen + 5);
	*lockfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (*lockfd < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: %s: %s", lock, strerror(errno));
	if (flock(*lockfd, LOCK_EX | LOCK_NB) < 0)
		return refit_err_set(err, errno == EWOULDBLOCK ? REFIT_ERR_EXISTS : REFIT_ERR_SYS,
				     "rpc: %s is in use by another process (lock %s held)",
				     listen + 5, lock);
	return REFIT_OK;
}

static void
record(rpc_unix_t *u, int fd, const struct ucred *cr)
{
	pthread_mutex_lock(&u->mu);
	if ((size_t)fd >= u->npeers) {
		size_t n = (size_t)fd + 64;

		u->peers = xrealloc(u->peers, n * sizeof(*u->peers));
		memset(u->peers + u->npeers, 0, (n - u->npeers) * sizeof(*u->peers));
		u->npeers = n;
	}
	u->peers[fd] = (peer_slot_t){{(int)cr->pid, (uint32_t)cr->uid, (uint32_t)cr->gid},
				     true};
	pthread_mutex_unlock(&u->mu);
}

/* Out of fds (or another passing error): wait a little, not spin; logged
 * once a minute at most. */
static void
accept_backoff(rpc_unix_t *u)
{
	struct timespec ts = {0, 20 * 1000 * 1000}, now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (u->logged == 0 || now.tv_sec - u->logged >= 60) {
		log_warnx("rpc: %s: accept: %s (retrying every 20 ms)", u->path,
			  strerror(errno));
		u->logged = now.tv_sec;
	}
	nanosleep(&ts, NULL);
}

static void *
accept_thread(void *arg)
{
	rpc_unix_t *u = arg;

	while (!atomic_load(&u->stopping)) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		int fd = accept4(u->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (atomic_load(&u->stopping))
				break;
			if (errno != EINTR && errno != ECONNABORTED)
				accept_backoff(u);
			continue;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0) {
			log_warnx("rpc: %s: SO_PEERCRED: %s", u->path, strerror(errno));
			close(fd);
			continue;
		}
		record(u, fd, &cr);
		grpc_server_add_channel_from_fd(u->srv, fd, u->creds);
	}
	return NULL;
}

/* A stale socket file (the lock is ours, so nobody serves it) goes, as
 * gRPC's own listener would remove it. */
static refit_status_t
bind_path(int fd, const char *path, refit_err_t *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat sb;

	if (strlen(path) >= sizeof(sa.sun_path))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: unix socket path \"%s\" "
				     "is longer than %zu bytes", path, sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode) && unlink(path) < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: %s: unlink: %s", path,
				     strerror(errno));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: cannot listen on unix:%s: %s",
				     path, strerror(errno));
	return REFIT_OK;
}

refit_status_t
rpc_unix_listen(grpc_server *srv, const char *listen, rpc_unix_t **out, refit_err_t *err)
{
	rpc_unix_t *u;

	*out = NULL;
	if (strncmp(listen, "unix:", 5) != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: peer credentials need a "
				     "unix socket, not \"%s\"", listen);
	u = xcalloc(1, sizeof(*u));
	u->srv = srv;
	u->path = xstrdup(listen + 5);
	u->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	pthread_mutex_init(&u->mu, NULL);
	if (u->fd < 0) {
		refit_err_set(err, REFIT_ERR_SYS, "rpc: unix socket: %s", strerror(errno));
		goto fail;
	}
	if (bind_path(u->fd, u->path, err) != REFIT_OK)
		goto fail;
	u->creds = grpc_insecure_server_credentials_create();
	if (pthread_create(&u->th, NULL, accept_thread, u) != 0) {
		refit_err_set(err, REFIT_ERR_SYS, "rpc: cannot start the accept thread");
		unlink(u->path);
		goto fail;
	}
	*out = u;
	return REFIT_OK;
fail:
	if (u->creds)
		grpc_server_credentials_release(u->creds);
	if (u->fd >= 0)
		close(u->fd);
	pthread_mutex_destroy(&u->mu);
	free(u->path);
	free(u);
	return err->status;
}

void
rpc_unix_stop(rpc_unix_t *u)
{
	if (u == NULL)
		return;
	atomic_store(&u->stopping, true);
	shutdown(u->fd, SHUT_RDWR);   /* wakes the blocked accept (EINVAL) */
	pthread_join(u->th, NULL);
	close(u->fd);
	unlink(u->path);
	grpc_server_credentials_release(u->creds);
	pthread_mutex_destroy(&u->mu);
	free(u->peers);
	free(u->path);
	free(u);
}

bool
rpc_unix_peer(rpc_unix_t *u, const char *peer, rpc_peer_cred_t *out)
{
	char *end;
	long fd;
	bool ok = false;

	if (u == NULL || peer == NULL || strncmp(peer, "fd:", 3) != 0)
		return false;
	errno = 0;
	fd = strtol(peer + 3, &end, 10);
	if (errno || end == peer + 3 || *end != '\0' || fd < 0)
		return false;
	pthread_mutex_lock(&u->mu);
	if ((size_t)fd < u->npeers && u->peers[fd].set) {
		*out = u->peers[fd].cred;
		ok = true;
	}
	pthread_mutex_unlock(&u->mu);
	return ok;
}
