/*
 * emu_boot.c - the emulated NCCL's rendezvous: unique-id roots and the
 * joining of ranks.
 *
 * ncclGetUniqueId starts a root: a thread and a unix socket in REFIT_EMU_DIR
 * that lives until every rank of one communicator has joined it (an id
 * nothing consumes leaks both, as with NCCL, and shows in ids_unconsumed).
 * A rank joins by sending its (host, device, listening socket); when all
 * nranks have, the root checks that no two ranks share a (host, device) and
 * answers every rank with the table (or the error); every init ends only
 * once all ranks have their table (root_release).  A shrink rendezvous the
 * same way, its new rank 0 running the root at a path every member derives
 * from the parent.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tests/emu/emu_nccl.h"

struct emu_root {
	int fd;
	char path[PATH_MAX_UN];
	bool count_id;
	int refs;                  /* the thread, the comm that runs it (shrink) */
	emu_root_t *next;          /* live roots: their sockets go at exit */
};

typedef struct reply {
	uint32_t magic;
	int32_t status, nranks, pad;
	uint64_t uid;
	char msg[200];
} reply_t;

static pthread_mutex_t root_mu = PTHREAD_MUTEX_INITIALIZER;
static emu_root_t *roots;
static bool atexit_set;

int
write_full(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

int
read_full(int fd, void *p, size_t n)
{
	uint8_t *b = p;

	while (n) {
		ssize_t r = recv(fd, b, n, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = ECONNRESET;
			return -1;
		}
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int
sock_addr(const char *path, struct sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(a->sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(a->sun_path, path, strlen(path) + 1);
	return 0;
}

/* A stream socket connected to path, or listening on it; -1 with errno set. */
static int
sock_at(const char *path, bool listening)
{
	struct sockaddr_un a;
	int fd, rc;

	if (sock_addr(path, &a) != 0 || (fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return -1;
	if (listening) {
		unlink(path);
		rc = bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 256) != 0 ? -1 : 0;
	} else {
		rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
	}
	if (rc != 0) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

int
sock_connect(const char *path)
{
	return sock_at(path, false);
}

int
sock_listen(const char *path)
{
	return sock_at(path, true);
}

/* ---- roots -------------------------------------------------------------------- */

static void
roots_unlink_at_exit(void)
{
	pthread_mutex_lock(&root_mu);
	for (emu_root_t *r = roots; r; r = r->next)
		unlink(r->path);
	pthread_mutex_unlock(&root_mu);
}

void
root_unref(emu_root_t *r)
{
	bool last;

	if (r == NULL)
		return;
	pthread_mutex_lock(&root_mu);
	last = --r->refs == 0;
	if (last) {
		emu_root_t **pp;

		for (pp = &roots; *pp && *pp != r; pp = &(*pp)->next)
			;
		if (*pp)
			*pp = r->next;
	}
	pthread_mutex_unlock(&root_mu);
	if (!last)
		return;
	close(r->fd);
	free(r);
}

void
root_cancel(emu_root_t *r)
{
	if (r)
		shutdown(r->fd, SHUT_RDWR);
}

static void
reply_err(int fd, int status, const char *msg)
{
	reply_t rp = {WIRE_MAGIC, status, 0, 0, 0, ""};

	snprintf(rp.msg, sizeof(rp.msg), "%s", msg);
	write_full(fd, &rp, sizeof(rp));
}

/* Check a complete table: no two ranks on one (host, device). */
static int
table_check(const emu_peer_t *t, int n, char *msg, size_t len)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (t[i].host_hash == t[j].host_hash && t[i].dev == t[j].dev) {
				snprintf(msg, len, "ranks %d and %d are both on host \"%s\" device "
					 "%d: NCCL refuses two ranks of one communicator on one "
					 "device", i, j, t[i].host, t[i].dev);
				return ncclInvalidUsage;
			}
	return ncclSuccess;
}

/*
 * NCCL's init is collective: after the root's answer every rank joins a
 * ring allgather over all ranks (bootstrapInit, src/bootstrap.cc), so no
 * rank's init completes before every rank has read its answer -- and until
 * then the root's process (the one that made the id) must stay, or a rank
 * still waiting for its answer fails.  So here: each rank acknowledges its
 * table; once all have, the root releases them together.  A rank that never
 * acknowledges (gone, aborted) releases none: the others see the root close.
 */
static void
root_release(const int *fds, int n)
{
	for (int i = 0; i < n; i++) {
		char ack;

		if (read_full(fds[i], &ack, 1) != 0 || ack != 'a')
			return;
	}
	for (int i = 0; i < n; i++)
		write_full(fds[i], "g", 1);
}

/* Collect nranks hellos; answer all.  0 when answered, -1 when cancelled. */
static int
root_collect(emu_root_t *r)
{
	emu_peer_t *t = NULL, h;
	int *fds = NULL, n = 0, got = 0, rc = -1;
	reply_t rp = {WIRE_MAGIC, ncclSuccess, 0, 0, emu_rand(), ""};

	for (;;) {
		int fd = accept4(r->fd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0 && errno == EINTR)
			continue;
		if (fd < 0)
			goto out;
		if (read_full(fd, &h, sizeof(h)) != 0 || h.magic != WIRE_MAGIC) {
			close(fd);
			continue;
		}
		if (n == 0 && h.nranks > 0 && h.nranks <= 4096) {
			n = h.nranks;
			t = calloc((size_t)n, sizeof(*t));
			fds = malloc((size_t)n * sizeof(*fds));
			if (t == NULL || fds == NULL)
				abort();
			for (int i = 0; i < n; i++)
				fds[i] = -1;
		}
		if (h.nranks != n || h.rank < 0 || h.rank >= n || fds[h.rank] >= 0) {
			char m[200];

			snprintf(m, sizeof(m), "rank %d of %d joined a communicator of %d ranks "
				 "(or its rank joined twice)", h.rank, h.nranks, n);
			emu_say("nccl root %s: %s", r->path, m);
			reply_err(fd, ncclInvalidUsage, m);
			close(fd);
			continue;
		}
		t[h.rank] = h;
		fds[h.rank] = fd;
		if (++got == n)
			break;
	}
	/* every rank joined: the id is consumed (before anyone hears so) */
	unlink(r->path);
	if (r->count_id) {
		emu_count(EMU_IDS, -1);
		r->count_id = false;
	}
	rp.nranks = n;
	rp.status = table_check(t, n, rp.msg, sizeof(rp.msg));
	if (rp.status != ncclSuccess)
		emu_say("nccl init: %s", rp.msg);
	for (int i = 0; i < n; i++) {
		if (write_full(fds[i], &rp, sizeof(rp)) == 0 && rp.status == ncclSuccess) {
			write_full(fds[i], t, (size_t)n * sizeof(*t));
		}
	}
	if (rp.status == ncclSuccess)
		root_release(fds, n);
	rc = 0;
out:
	for (int i = 0; i < n && fds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
	free(t);
	return rc;
}

static void *
root_main(void *arg)
{
	emu_root_t *r = arg;

	if (root_collect(r) != 0) /* cancelled (a shrink aborted) */
		unlink(r->path);
	if (r->count_id)
		emu_count(EMU_IDS, -1);
	root_unref(r);
	return NULL;
}

emu_root_t *
root_start(const char *path, bool count_id, char *why, size_t n)
{
	emu_root_t *r = calloc(1, sizeof(*r));
	pthread_attr_t at;
	pthread_t th;

	if (r == NULL) {
		snprintf(why, n, "out of memory");
		return NULL;
	}
	snprintf(r->path, sizeof(r->path), "%s", path);
	r->count_id = count_id;
	r->refs = 2;
	if ((r->fd = sock_listen(path)) < 0) {
		snprintf(why, n, "cannot listen on %s: %s", path, strerror(errno));
		free(r);
		return NULL;
	}
	pthread_mutex_lock(&root_mu);
	r->next = roots;
	roots = r;
	if (!atexit_set)
		atexit(roots_unlink_at_exit);
	atexit_set = true;
	pthread_mutex_unlock(&root_mu);
	if (count_id)
		emu_count(EMU_IDS, 1);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 << 10);
	if (pthread_create(&th, &at, root_main, r) != 0) {
		pthread_attr_destroy(&at);
		snprintf(why, n, "cannot start the root thread");
		if (count_id)
			emu_count(EMU_IDS, -1);
		unlink(path);
		root_unref(r);
		root_unref(r);
		return NULL;
	}
	pthread_attr_destroy(&at);
	return r;
}

/* ---- joining ---------------------------------------------------------------------- */

/* Connect to the root: retry while it does not exist yet (10 s for an init,
 * until aborted for a shrink, whose root another rank starts). */
static int
join_connect(ncclComm_t c)
{
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int fd = sock_connect(c->root_path);

		if (fd >= 0 || (errno != ENOENT && errno != ECONNREFUSED))
			return fd;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (comm_flags(c).aborted || (!c->root_wait && now.tv_sec - t0.tv_sec >= 10))
			return -1;
		usleep(5000);
	}
}

/*
 * REFIT_EMU_HOLD_ACK=PATH (tests): a rank that has its table creates
 * PATH.held, then acknowledges only once PATH exists (or it is aborted, or
 * 60 s passed): the other ranks' inits must stay in progress meanwhile.
 */
static void
join_hold(ncclComm_t c)
{
	const char *p = getenv("REFIT_EMU_HOLD_ACK");
	char held[PATH_MAX_UN + 8];
	struct timespec t0, now;
	int fd;

	if (p == NULL || *p == '\0')
		return;
	snprintf(held, sizeof(held), "%s.held", p);
	if ((fd = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	else
		emu_say("REFIT_EMU_HOLD_ACK: cannot create %s: %s", held, strerror(errno));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		if (access(p, F_OK) == 0 || comm_flags(c).aborted)
			return;
		usleep(5000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - t0.tv_sec < 60);
}

static ncclResult_t
join(ncclComm_t c, char *msg, size_t n)
{
	const emu_env_t *env = emu_env();
	/* the host's device, as NCCL compares devices by bus id, not ordinal */
	emu_peer_t h = {WIRE_MAGIC, c->nranks, c->rank, emu_phys(c->dev), (int32_t)getpid(), 0,
			env->host_hash, "", ""};
	reply_t rp;
	char go;
	int fd;

	snprintf(h.host, sizeof(h.host), "%s", env->host);
	snprintf(h.path, sizeof(h.path), "%s", c->listen_path);
	if ((fd = join_connect(c)) < 0) {
		snprintf(msg, n, "cannot reach the root %s: %s", c->root_path,
			 comm_flags(c).aborted ? "aborted" : strerror(errno));
		return comm_flags(c).aborted ? ncclInvalidUsage : ncclSystemError;
	}
	pthread_mutex_lock(&c->mu);
	c->join_fd = fd;
	pthread_mutex_unlock(&c->mu);
	if (comm_flags(c).aborted || write_full(fd, &h, sizeof(h)) != 0 ||
	    read_full(fd, &rp, sizeof(rp)) != 0 || rp.magic != WIRE_MAGIC) {
		snprintf(msg, n, "the root %s went away before every rank joined", c->root_path);
		return comm_flags(c).aborted ? ncclInvalidUsage : ncclRemoteError;
	}
	if (rp.status != ncclSuccess) {
		snprintf(msg, n, "%s", rp.msg);
		return (ncclResult_t)rp.status;
	}
	if (rp.nranks != c->nranks || (c->peers = calloc((size_t)rp.nranks,
							 sizeof(*c->peers))) == NULL) {
		snprintf(msg, n, "bad answer from the root %s: %d ranks, this communicator has "
			 "%d", c->root_path, rp.nranks, c->nranks);
		return ncclInternalError;
	}
	/* the table, then the release once every rank has its own (root_release) */
	if (read_full(fd, c->peers, (size_t)rp.nranks * sizeof(*c->peers)) != 0 ||
	    (join_hold(c), write_full(fd, "a", 1) != 0) || read_full(fd, &go, 1) != 0 || go != 'g') {
		snprintf(msg, n, "the root %s went away, or a rank left, before every rank had "
			 "its answer: %s", c->root_path,
			 comm_flags(c).aborted ? "aborted" : strerror(errno));
		return comm_flags(c).aborted ? ncclInvalidUsage : ncclRemoteError;
	}
	if (c->uid == 0)
		c->uid = rp.uid;
	return ncclSuccess;
}

static ncclResult_t
comm_setup(ncclComm_t c, char *msg, size_t n)
{
	size_t k = (size_t)c->nranks;
	static _Atomic uint64_t seq;

	snprintf(c->listen_path, sizeof(c->listen_path), "%s/c.%d.%llu.sock", emu_env()->dir,
		 (int)getpid(), (unsigned long long)atomic_fetch_add(&seq, 1));
	if ((c->listen_fd = sock_listen(c->listen_path)) < 0) {
		snprintf(msg, n, "cannot listen on %s: %s", c->listen_path, strerror(errno));
		return ncclSystemError;
	}
	fcntl(c->listen_fd, F_SETFL, O_NONBLOCK);
	c->out_fd = malloc(k * sizeof(int));
	c->in_fd = malloc(k * sizeof(int));
	c->send_next = calloc(k, sizeof(uint64_t));
	c->send_turn = calloc(k, sizeof(uint64_t));
	c->recv_next = calloc(k, sizeof(uint64_t));
	c->recv_turn = calloc(k, sizeof(uint64_t));
	if (!c->out_fd || !c->in_fd || !c->send_next || !c->send_turn || !c->recv_next ||
	    !c->recv_turn) {
		snprintf(msg, n, "out of memory");
		return ncclSystemError;
	}
	for (size_t i = 0; i < k; i++)
		c->out_fd[i] = c->in_fd[i] = -1;
	return ncclSuccess;
}

void *
comm_join_main(void *arg)
{
	ncclComm_t c = arg;
	char msg[300] = "";
	ncclResult_t r = c->err; /* a shrink whose root did not start */
	bool reported;

	if (r == ncclSuccess)
		r = comm_setup(c, msg, sizeof(msg));
	if (r == ncclSuccess)
		r = join(c, msg, sizeof(msg));
	pthread_mutex_lock(&c->mu);
	if (c->join_fd >= 0) {
		close(c->join_fd);
		c->join_fd = -1;
	}
	pthread_mutex_unlock(&c->mu);
	/* the error and the end of the init change together: a poller sees
	 * either in progress or the outcome */
	pthread_mutex_lock(&c->mu);
	reported = r != ncclSuccess && !c->aborted && c->err == ncclSuccess && *msg;
	if (r != ncclSuccess && c->err == ncclSuccess)
		c->err = r;
	c->pending = 0;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (reported) /* ncclGetLastError's text too */
		nccl_fail(r, "rank %d of %d (device %d): init: %s", c->rank, c->nranks, c->dev,
			  msg);
	if (c->publish) /* a shrink: NCCL publishes the new communicator only now */
		*c->publish = c;
	if (c->parent) {
		ncclComm_t p = c->parent;

		pthread_mutex_lock(&p->mu);
		for (ncclComm_t *k = &p->kids; *k; k = &(*k)->sib)
			if (*k == c) {
				*k = c->sib;
				break;
			}
		p->children--;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		comm_unref(p);
	}
	pthread_mutex_lock(&c->mu);
	c->settled = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	comm_unref(c); /* the thread's reference */
	return NULL;
}

void
comm_shutdown_data(ncclComm_t c)
{
	for (int i = 0; c->out_fd && i < c->nranks; i++) {
		if (c->out_fd[i] >= 0)
			shutdown(c->out_fd[i], SHUT_RDWR);
		if (c->in_fd[i] >= 0)
			shutdown(c->in_fd[i], SHUT_RDWR);
	}
}

void
comm_shutdown_fds(ncclComm_t c)
{
	if (c->listen_fd >= 0)
		shutdown(c->listen_fd, SHUT_RDWR);
	if (c->join_fd >= 0)
		shutdown(c->join_fd, SHUT_RDWR);
	comm_shutdown_data(c);
}

void
comm_close_fds(ncclComm_t c)
{
	if (c->listen_fd >= 0) {
		close(c->listen_fd);
		unlink(c->listen_path);
	}
	for (int i = 0; c->out_fd && i < c->nranks; i++) {
		if (c->out_fd[i] >= 0)
			close(c->out_fd[i]);
		if (c->in_fd[i] >= 0)
			close(c->in_fd[i]);
	}
	c->listen_fd = -1;
}
