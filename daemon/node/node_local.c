/*
 * node_local.c - librefit clients on a node: the Local service on the
 * node's unix socket, the clients' shared memory, and their state.
 *
 * RegisterClient checks a client's memory before anything is forwarded:
 * every piece of every tensor on the ranks this node serves needs memory,
 * each segment must have been passed to this node and be large enough for
 * the piece at its offset and strides (both copies for a double-buffered
 * inference client).  Memory comes only as memfds sealed against shrinking
 * (F_SEAL_SHRINK), passed with SCM_RIGHTS over the memory socket
 * (<local socket>.mem): a client cannot truncate memory the node has mapped
 * (no SIGBUS here), and no segment has a name another process could open.  Only then is the layout registered with the coordinator, and
 * the client exists here only once the coordinator accepted it: nothing
 * is half-registered.  A client whose process exits is dropped (the sweep
 * timer looks every 50 ms), and slices using its memory fail naming it;
 * the mapping stays valid until they stop.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/metrics.h"
#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"
#include "daemon/transport/transport.h"
#include "dataplane/view.h"

#define CALL_MS 10000

static const char *
nz(const char *s)
{
	return s ? s : "";
}

static bool
serves(const node_t *n, int32_t r)
{
	for (size_t i = 0; i < n->nranks; i++)
		if (n->ranks[i] == r)
			return true;
	return false;
}

static int
cmp_mem(const void *a, const void *b)
{
	const piece_mem_t *x = a, *y = b;

	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->piece > y->piece) - (x->piece < y->piece);
}

static void
client_free(client_t *c)
{
	for (size_t i = 0; i < c->segs.n; i++) {
		if (c->segs.v[i].cuda)
			c->xo->mem_close(c->x, c->segs.v[i].base);
		else if (c->segs.v[i].base)
			munmap(c->segs.v[i].base, c->segs.v[i].size ? c->segs.v[i].size : 1);
		free(c->segs.v[i].name);
	}
	VEC_FREE(&c->segs);
	VEC_FREE(&c->mem);
	plan_layout_set_fini(&c->layouts);
	free(c->reg);
	free(c->model);
	free(c->instance);
	free(c->failure);
	free(c);
}

client_t *
node_client(node_t *n, uint64_t id)
{
	for (size_t i = 0; i < n->clients.n; i++)
		if (n->clients.v[i]->id == id)
			return n->clients.v[i];
	return NULL;
}

void
node_client_release(node_t *n, client_t *c)
{
	(void)n;
	if (c->busy > 0)
		c->busy--;
	if (c->dead && c->busy == 0)
		client_free(c);
}

static void
on_unregistered(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	(void)resp;
	n->inflight--;
	if (st != REFIT_OK && st != REFIT_ERR_NOT_FOUND)
		log_warnx("node %s: UnregisterLayout: %s", n->node_id, msg);
	node_maybe_free(n);
}

/* The last client of (model, role, instance) here went: tell the coordinator,
 * so a replica whose processes are gone does not block the others. */
static void
unregister_if_last(node_t *n, const client_t *c)
{
	Refit__V1__UnregisterLayoutRequest rq = REFIT__V1__UNREGISTER_LAYOUT_REQUEST__INIT;
	refit_err_t err;

	if (n->closing || n->member_id == 0)
		return; /* a stopping node takes its clients' registrations with it */
	if (c->partial) {
		/* a group that lost a member no longer holds all of this node's
		 * ranks: the coordinator must not plan with it */
		if (!c->forwarded)
			return;
		node_group_forwarded(n, (client_t *)c, NULL, false);
		goto send;
	}
	for (size_t i = 0; i < n->clients.n; i++) {
		const client_t *o = n->clients.v[i];

		if (o != c && o->role == c->role && strcmp(o->model, c->model) == 0 &&
		    strcmp(o->instance, c->instance) == 0)
			return;
	}
send:
	rq.member_id = n->member_id;
	rq.model = c->model;
	rq.role = (Refit__V1__Role)c->role;
	rq.instance = c->instance;
	refit_err_clear(&err);
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "UnregisterLayout", &rq.base,
			   CALL_MS, on_unregistered, n, &err) == REFIT_OK)
		n->inflight++;
	else
		log_warnx("node %s: %s", n->node_id, err.msg);
}

void
node_client_drop(node_t *n, client_t *c, const char *why)
{
	for (size_t i = 0; i < n->clients.n; i++)
		if (n->clients.v[i] == c) {
			n->clients.v[i] = n->clients.v[--n->clients.n];
			break;
		}
	log_info("node %s: librefit client %" PRIu64 " (model \"%s\", %s \"%s\", pid %d) "
		 "dropped: %s", n->node_id, c->id, c->model,
		 c->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance", c->instance,
		 c->pid, why);
	c->dead = true;
	unregister_if_last(n, c);
	n->hooks->client_gone(n, c->id, why);
	c->busy++;
	node_client_release(n, c);
}

/* ---- the memory socket --------------------------------------------------------
 *
 * SOCK_SEQPACKET at <local socket>.mem.  A client sends one message per
 * segment: the segment's name (1..255 bytes) with one memfd (SCM_RIGHTS).
 * The node answers 0 + an 8-byte key (the same for the whole connection), or
 * 1 + a reason.  The memfd must be sealed against shrinking.  The key, sent
 * with RegisterClient, names this connection's segments; only the process
 * on the other end (its pid from SO_PEERCRED) may use them.  The fds are
 * closed when the connection closes; mappings made from them stay.
 */
#define MEM_MAX_CONNS 1024
#define MEM_MAX_SEGS 4096
#define MEM_NAME_MAX 255

typedef struct memseg {
	char *name;
	int fd;
} memseg_t;

typedef struct memconn {
	node_t *n;
	uv_poll_t poll;
	int fd, pid;
	uint64_t key;
	VEC(memseg_t) segs;
} memconn_t;

static void
memconn_closed(uv_handle_t *h)
{
	memconn_t *mc = h->data;
	node_t *n = mc->n;

	for (size_t i = 0; i < mc->segs.n; i++) {
		close(mc->segs.v[i].fd);
		free(mc->segs.v[i].name);
	}
	VEC_FREE(&mc->segs);
	close(mc->fd);
	free(mc);
	n->handles--;
	node_maybe_free(n);
}

static void
memconn_close(memconn_t *mc)
{
	node_t *n = mc->n;

	for (size_t i = 0; i < n->memconns.n; i++)
		if (n->memconns.v[i] == mc) {
			n->memconns.v[i] = n->memconns.v[--n->memconns.n];
			break;
		}
	uv_poll_stop(&mc->poll);
	uv_close((uv_handle_t *)&mc->poll, memconn_closed);
}

static void
mem_answer(memconn_t *mc, bool ok, const char *fmt, ...)
{
	uint8_t buf[1 + REFIT_ERR_MSG_MAX];
	size_t len = 9;
	va_list ap;

	buf[0] = ok ? 0 : 1;
	if (ok) {
		wire_put_le(buf + 1, mc->key, 8);
	} else {
		va_start(ap, fmt);
		vsnprintf((char *)buf + 1, sizeof(buf) - 1, fmt, ap);
		va_end(ap);
		len = 1 + strlen((char *)buf + 1);
	}
	if (send(mc->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		log_warnx("node %s: memory socket: answer to pid %d: %s", mc->n->node_id,
			  mc->pid, strerror(errno));
}

/* One message: a name and a memfd. */
static void
mem_take(memconn_t *mc, const char *name, size_t len, int fd, int nfds)
{
	int seals;
	struct stat sb;

	if (nfds != 1)
		return mem_answer(mc, false, "send exactly one memfd with each name (got %d)",
				  nfds);
	if (len == 0 || len > MEM_NAME_MAX || memchr(name, 0, len) != NULL)
		return mem_answer(mc, false, "a segment name is 1 to %d bytes, no NUL",
				  MEM_NAME_MAX);
	for (size_t i = 0; i < mc->segs.n; i++)
		if (strlen(mc->segs.v[i].name) == len && memcmp(mc->segs.v[i].name, name, len) == 0)
			return mem_answer(mc, false, "segment \"%.*s\" was passed already",
					  (int)len, name);
	if (mc->segs.n >= MEM_MAX_SEGS)
		return mem_answer(mc, false, "at most %d segments per connection", MEM_MAX_SEGS);
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return mem_answer(mc, false, "segment \"%.*s\" is not a memfd (F_GET_SEALS: %s)",
				  (int)len, name, strerror(errno));
	if (!(seals & F_SEAL_SHRINK))
		return mem_answer(mc, false, "segment \"%.*s\" is not sealed against shrinking: "
				  "add F_SEAL_SHRINK (refit_shm_create does)", (int)len, name);
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))
		return mem_answer(mc, false, "segment \"%.*s\": not a regular file", (int)len,
				  name);
	{
		memseg_t sg = {xmalloc(len + 1), fd};

		memcpy(sg.name, name, len);
		sg.name[len] = '\0';
		VEC_PUSH(&mc->segs, sg);
	}
	mem_answer(mc, true, NULL);
}

static void
memconn_read(uv_poll_t *p, int status, int events)
{
	memconn_t *mc = p->data;

	(void)events;
	if (status < 0)
		return memconn_close(mc);
	for (;;) {
		char name[MEM_NAME_MAX + 1];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(8 * sizeof(int))];
		} cb;
		struct iovec iov = {name, sizeof(name)};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
				    .msg_controllen = sizeof(cb.b)};
		int fds[8], nfds = 0;
		ssize_t r = recvmsg(mc->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		if (r <= 0)
			return memconn_close(mc);
		for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); ch; ch = CMSG_NXTHDR(&mh, ch))
			if (ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS) {
				size_t k = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);

				for (size_t i = 0; i < k && nfds < 8; i++)
					memcpy(&fds[nfds++], CMSG_DATA(ch) + i * sizeof(int),
					       sizeof(int));
			}
		if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
			mem_answer(mc, false, "message too long (a name is at most %d bytes, one "
				   "fd)", MEM_NAME_MAX);
		} else {
			size_t before = mc->segs.n;

			mem_take(mc, name, (size_t)r, nfds ? fds[0] : -1, nfds);
			if (mc->segs.n > before)
				fds[0] = -1; /* kept */
		}
		for (int i = 0; i < nfds; i++)
			if (fds[i] >= 0)
				close(fds[i]);
	}
}

static void
mem_accept(uv_poll_t *p, int status, int events)
{
	node_t *n = p->data;

	(void)events;
	if (status < 0)
		return;
	for (;;) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		memconn_t *mc;
		int fd = accept4(n->mem_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			return;
		if (n->memconns.n >= MEM_MAX_CONNS ||
		    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0) {
			log_warnx("node %s: memory socket: connection refused (%zu open)",
				  n->node_id, n->memconns.n);
			close(fd);
			continue;
		}
		mc = xcalloc(1, sizeof(*mc));
		mc->n = n;
		mc->fd = fd;
		mc->pid = (int)cr.pid;
		do {
			if (getrandom(&mc->key, sizeof(mc->key), 0) != (ssize_t)sizeof(mc->key))
				mc->key = 0;
		} while (mc->key == 0);
		if (uv_poll_init(n->loop, &mc->poll, fd) != 0) {
			close(fd);
			free(mc);
			continue;
		}
		mc->poll.data = mc;
		n->handles++;
		VEC_PUSH(&n->memconns, mc);
		uv_poll_start(&mc->poll, UV_READABLE | UV_DISCONNECT, memconn_read);
	}
}

static refit_status_t
mem_listen(node_t *n, const char *local_socket, refit_err_t *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[sizeof(sa.sun_path)];
	int fd;

	if ((size_t)snprintf(path, sizeof(path), "%s.mem", local_socket) >= sizeof(path))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: local_socket \"%s\" is "
				     "too long for its memory socket (\"%s.mem\")", local_socket,
				     local_socket);
	memcpy(sa.sun_path, path, sizeof(path));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "node: memory socket: %s",
				     strerror(errno));
	/* the local socket is ours (its lock was taken): a stale .mem is too */
	if (unlink(path) < 0 && errno != ENOENT) {
		close(fd);
		return refit_err_set(err, REFIT_ERR_SYS, "node: memory socket \"%s\": unlink: %s",
				     path, strerror(errno));
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0660) < 0 ||
	    listen(fd, 128) < 0) {
		refit_err_set(err, REFIT_ERR_SYS, "node: memory socket \"%s\": %s", path,
			      strerror(errno));
		close(fd);
		return err->status;
	}
	if (uv_poll_init(n->loop, &n->mem_poll, fd) != 0) {
		close(fd);
		unlink(path);
		return refit_err_set(err, REFIT_ERR_SYS, "node: memory socket: uv_poll_init");
	}
	n->mem_fd = fd;
	n->mem_path = xstrdup(path);
	n->mem_poll.data = n;
	n->handles++;
	uv_poll_start(&n->mem_poll, UV_READABLE, mem_accept);
	return REFIT_OK;
}

static void
mem_listener_closed(uv_handle_t *h)
{
	node_t *n = h->data;

	close(n->mem_fd);
	n->mem_fd = -1;
	n->handles--;
	node_maybe_free(n);
}

void
node_local_close(node_t *n)
{
	while (n->memconns.n)
		memconn_close(n->memconns.v[0]);
	if (n->mem_path && n->mem_fd >= 0 && !uv_is_closing((uv_handle_t *)&n->mem_poll)) {
		uv_poll_stop(&n->mem_poll);
		unlink(n->mem_path);
		uv_close((uv_handle_t *)&n->mem_poll, mem_listener_closed);
	}
}

/* ---- memory ------------------------------------------------------------------ */

static refit_status_t
map_seg(node_t *n, client_t *c, const char *name, uint64_t key, seg_t **out,
	refit_err_t *err)
{
	memconn_t *mc = NULL;
	struct stat sb;
	seg_t s;
	int fd = -1;

	for (size_t i = 0; i < c->segs.n; i++)
		if (strcmp(c->segs.v[i].name, name) == 0) {
			*out = &c->segs.v[i];
			return REFIT_OK;
		}
	for (size_t i = 0; i < n->memconns.n && mc == NULL; i++)
		if (key != 0 && n->memconns.v[i]->key == key && n->memconns.v[i]->pid == c->pid)
			mc = n->memconns.v[i];
	for (size_t i = 0; mc && i < mc->segs.n && fd < 0; i++)
		if (strcmp(mc->segs.v[i].name, name) == 0)
			fd = mc->segs.v[i].fd;
	if (fd < 0)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "shared memory \"%s\" was not "
				     "passed to this node by this process (memfds sealed "
				     "against shrinking, over %s: refit_shm_create and "
				     "refit_register do this)", name, nz(n->mem_path));
	if (fstat(fd, &sb) < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "shared memory \"%s\": fstat: %s", name,
				     strerror(errno));
	s.name = xstrdup(name);
	s.size = (uint64_t)sb.st_size;
	s.base = sb.st_size ? mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE,
				   MAP_SHARED, fd, 0) : NULL;
	if (s.base == MAP_FAILED) {
		free(s.name);
		return refit_err_set(err, REFIT_ERR_SYS, "shared memory \"%s\": mmap: %s", name,
				     strerror(errno));
	}
	VEC_PUSH(&c->segs, s);
	*out = &c->segs.v[c->segs.n - 1];
	return REFIT_OK;
}

/* Bytes a view spans from its base (0 for an empty piece) in *out; false
 * when that does not fit in 64 bits (client-supplied strides). */
static bool
span(const piece_mem_t *m, uint64_t *out)
{
	uint64_t last = 0, t;

	*out = 0;
	for (int d = 0; d < m->ndim; d++) {
		if (m->shape[d] == 0)
			return true;
	}
	for (int d = 0; d < m->ndim; d++) {
		if (__builtin_mul_overflow((uint64_t)(m->shape[d] - 1), (uint64_t)m->stride[d],
					   &t) ||
		    __builtin_add_overflow(last, t, &last))
			return false;
	}
	return !__builtin_add_overflow(last, 1, &last) &&
	       !__builtin_mul_overflow(last, (uint64_t)m->elem, out);
}

static refit_status_t
add_piece(node_t *n, client_t *c, const Refit__V1__PieceMemory *pm, uint32_t t,
	  uint64_t mem_key, refit_err_t *err)
{
	const plan_layout_t *l = &c->layouts.v[t];
	size_t copies = c->role == REFIT__V1__ROLE__INFER &&
			c->install == REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER ? 2 : 1;
	piece_mem_t m = {.tensor = t, .rank = pm->rank, .piece = pm->piece, .ndim = l->ndim,
			 .elem = plan_dtype_size(l->dtype)};
	seg_t *seg = NULL;
	uint64_t need;

	if (!serves(n, pm->rank))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\": memory for rank "
				     "%d, which this node does not serve", l->name, pm->rank);
	CHECK(dp_local_shape(l, pm->rank, pm->piece, m.shape, err));
	if (pm->n_offsets != copies)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: %zu "
				     "offsets, %s needs %zu", l->name, pm->rank, pm->n_offsets,
				     copies == 2 ? "double-buffer install" : "this client",
				     copies);
	if (pm->n_strides != 0 && pm->n_strides != (size_t)l->ndim)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: %zu "
				     "strides for %d dims", l->name, pm->rank, pm->n_strides,
				     l->ndim);
	/* contiguous when no strides are given (a local shape's numel fits: the
	 * layout was checked against PLAN_MAX_NUMEL) */
	for (int d = l->ndim - 1; d >= 0; d--) {
		m.stride[d] = pm->n_strides ? pm->strides[d] : d == l->ndim - 1 ? 1 :
			m.stride[d + 1] * (m.shape[d + 1] ? m.shape[d + 1] : 1);
		if (m.stride[d] < 0 || m.stride[d] > PLAN_MAX_NUMEL)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: "
					     "stride %" PRId64 " of dim %d is out of range",
					     l->name, pm->rank, m.stride[d], d);
	}
	if (pm->cuda_ipc.len) {
		seg_t sg = {xstrdup("(CUDA IPC)"), NULL, pm->cuda_bytes, true};
		void *b = NULL;

		if (n->xo->memory != XPORT_MEM_DEVICE) {
			free(sg.name);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: "
					     "GPU memory (a CUDA IPC handle) needs the nccl "
					     "transport; this node uses %s", l->name, pm->rank,
					     n->xo->name);
		}
		if (pm->cuda_uuid.len != 0 && pm->cuda_uuid.len != 16) {
			free(sg.name);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: "
					     "cuda_uuid has %zu bytes; a GPU's UUID has 16",
					     l->name, pm->rank, pm->cuda_uuid.len);
		}
		if (n->xo->mem_open(n->x, pm->rank, pm->cuda_ipc.data, pm->cuda_ipc.len,
				    pm->has_cuda_device ? pm->cuda_device : -1,
				    pm->cuda_uuid.len ? pm->cuda_uuid.data : NULL, pm->cuda_bytes,
				    &b, err) != REFIT_OK) {
			free(sg.name);
			refit_err_prefix(err, "tensor \"%s\" rank %d", l->name, pm->rank);
			return err->status;
		}
		sg.base = b;
		VEC_PUSH(&c->segs, sg);
		seg = &c->segs.v[c->segs.n - 1];
	} else if (n->xo->memory == XPORT_MEM_DEVICE) {
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: the %s "
				     "transport moves GPU memory: give a CUDA IPC handle, not "
				     "shared memory", l->name, pm->rank, n->xo->name);
	} else {
		CHECK(map_seg(n, c, nz(pm->shm_name), mem_key, &seg, err));
	}
	if (!span(&m, &need))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: the "
				     "strides given span more than 2^64 bytes", l->name, pm->rank);
	for (size_t k = 0; k < copies; k++) {
		if (pm->offsets[k] > seg->size || need > seg->size - pm->offsets[k])
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: "
					     "copy %zu at offset %" PRIu64 " needs %" PRIu64
					     " bytes, but shared memory \"%s\" has %" PRIu64,
					     l->name, pm->rank, k, pm->offsets[k], need,
					     seg->name, seg->size);
		m.base[k] = seg->base + pm->offsets[k];
	}
	if (copies == 1)
		m.base[1] = m.base[0];
	VEC_PUSH(&c->mem, m);
	return REFIT_OK;
}

static bool
gave_rank(const client_t *c, int32_t r)
{
	for (size_t i = 0; i < c->mem.n; i++)
		if (c->mem.v[i].rank == r)
			return true;
	return false;
}

/* Memory of every piece this node serves, and nothing else -- or of every
 * piece of some of its ranks and none of the others (c->partial: one of
 * several clients of the trainer or instance here, node_group.c). */
static refit_status_t
check_memory(node_t *n, client_t *c, const Refit__V1__LocalRegisterRequest *rq,
	     refit_err_t *err)
{
	for (uint32_t t = 0; t < c->layouts.n; t++) {
		const Refit__V1__LocalTensor *lt = rq->tensors[t];

		for (size_t k = 0; k < lt->n_memory; k++)
			CHECK(add_piece(n, c, lt->memory[k], t, rq->mem_key, err));
	}
	xqsort(c->mem.v, c->mem.n, sizeof(*c->mem.v), cmp_mem);
	for (size_t i = 1; i < c->mem.n; i++)
		if (cmp_mem(&c->mem.v[i - 1], &c->mem.v[i]) == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d "
					     "piece %d: memory given twice",
					     c->layouts.v[c->mem.v[i].tensor].name, c->mem.v[i].rank,
					     c->mem.v[i].piece);
	for (uint32_t t = 0; t < c->layouts.n; t++) {
		const plan_layout_t *l = &c->layouts.v[t];

		for (size_t k = 0; k < l->nshards; k++) {
			piece_mem_t key = {.tensor = t, .rank = l->shards[k].rank,
					   .piece = l->shards[k].piece};

			if (!serves(n, key.rank))
				continue;
			if (c->mem.n > 0 && !gave_rank(c, key.rank)) {
				c->partial = true;  /* another client's rank */
				continue;
			}
			if (xbsearch(&key, c->mem.v, c->mem.n, sizeof(key), cmp_mem) == NULL)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\": "
						     "rank %d (served by this node) holds piece %d "
						     "but no memory was given for it", l->name,
						     key.rank, key.piece);
		}
	}
	return REFIT_OK;
}

const piece_mem_t *
node_client_piece(const client_t *c, uint32_t tensor, int32_t rank, int32_t piece)
{
	piece_mem_t key = {.tensor = tensor, .rank = rank, .piece = piece};

	return xbsearch(&key, c->mem.v, c->mem.n, sizeof(key), cmp_mem);
}

/* ---- state ------------------------------------------------------------------ */

static void
state_msg(const client_t *c, Refit__V1__ClientState *s)
{
	refit__v1__client_state__init(s);
	s->version = c->version;
	s->active = c->active;
	s->valid = c->valid;
	s->reading = c->reading > 0;
	s->failure = c->failure ? c->failure : "";
	s->serving = c->serving;
}

static void
reply_state(rpc_call_t *call, const client_t *c)
{
	Refit__V1__ClientState s;

	state_msg(c, &s);
	rpc_call_reply(call, &s.base);
}

/* ---- Local service ------------------------------------------------------------ */

static void
h_hello(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	Refit__V1__HelloResponse rsp = REFIT__V1__HELLO_RESPONSE__INIT;

	(void)msg;
	rsp.node_id = n->node_id;
	rsp.ranks = n->ranks;
	rsp.n_ranks = n->nranks;
	rsp.epoch = n->epoch;
	rsp.joined = n->member_id != 0;
	rpc_call_reply(call, &rsp.base);
}

typedef struct regjob {
	node_t *n;
	rpc_call_t *call;
	client_t *c;
} regjob_t;

/* A client id is its capability on the local socket: random, so one process
 * cannot act on another's registration by counting (never 0, never one in
 * use). */
static uint64_t
new_client_id(node_t *n)
{
	uint64_t id = 0;

	while (id == 0 || node_client(n, id) != NULL)
		if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
			id = ++n->next_client; /* no entropy: still unique */
	return id;
}

static void
on_registered(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	regjob_t *j = arg;
	node_t *n = j->n;
	client_t *c = j->c;

	n->inflight--;
	if (st != REFIT_OK || n->closing) {
		rpc_call_fail(j->call, st != REFIT_OK ? st : REFIT_ERR_UNAVAILABLE,
			      "register model \"%s\": %s", c->model,
			      st != REFIT_OK ? msg : "the node daemon is shutting down");
		client_free(c);
	} else {
		Refit__V1__LocalRegisterResponse rsp = REFIT__V1__LOCAL_REGISTER_RESPONSE__INIT;
		const Refit__V1__RegisterLayoutResponse *r = (const void *)resp;

		snprintf(c->digest, sizeof(c->digest), "%s", nz(r->layout_digest));
		c->id = new_client_id(n);
		VEC_PUSH(&n->clients, c);
		if (c->partial)
			node_group_forwarded(n, c, c->digest, true);
		log_info("node %s: librefit client %" PRIu64 " (pid %d): model \"%s\" %s \"%s\", "
			 "%zu tensors, %zu pieces here, %s", n->node_id, c->id, c->pid,
			 c->model, c->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance",
			 c->instance, c->layouts.n, c->mem.n,
			 c->role == REFIT__V1__ROLE__TRAIN ? "source" :
			 c->install == REFIT__V1__INSTALL_MODE__IN_PLACE ? "in-place" :
			 "double-buffer");
		rsp.client_id = c->id;
		rsp.layout_digest = c->digest;
		rpc_call_reply(j->call, &rsp.base);
	}
	free(j);
	node_maybe_free(n);
}

/*
 * The client's tensors' layouts into c->layouts, for this node's own use
 * (its memory checks, then slices).  The layouts themselves are validated
 * by the planner on the way, as every struct is built; the checks of the
 * registration as a whole (coverage, ranks held by members, agreement with
 * the other side) are the coordinator's.
 */
static refit_status_t
local_layouts(client_t *c, const Refit__V1__LocalRegisterRequest *rq,
	      Refit__V1__TensorLayout **v, refit_err_t *err)
{
	for (size_t i = 0; i < rq->n_tensors; i++) {
		v[i] = rq->tensors[i]->layout;
		if (v[i] == NULL)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensors[%zu] has no "
					     "layout", i);
	}
	return conv_layouts_from_proto(v, rq->n_tensors, &c->layouts, err);
}

/*
 * RegisterClient: the node checks what only it can (the install mode, the
 * process, its own ranks' memory), then forwards the layouts as the client
 * sent them, with its member id; the coordinator checks the registration
 * (the model's name, the role, the layouts against each other and the
 * members).  Errors from there come back prefixed "register model ...".
 */
static void
h_register(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__LocalRegisterRequest *rq = (const void *)msg;
	Refit__V1__RegisterLayoutRequest fw = REFIT__V1__REGISTER_LAYOUT_REQUEST__INIT;
	Refit__V1__TensorLayout **tl;
	client_t *c;
	regjob_t *j;
	refit_err_t err;

	/* the model's name and the role are the coordinator's to check */
	refit_err_clear(&err);
	if (rq->install != REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER &&
	    rq->install != REFIT__V1__INSTALL_MODE__IN_PLACE)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "register \"%s\": unknown "
				     "install mode %d", nz(rq->model), (int)rq->install);
	if (rq->pid == 0 || kill((pid_t)rq->pid, 0) < 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "register \"%s\": pid %u is "
				     "not a running process", nz(rq->model), rq->pid);
	if (n->member_id == 0)
		return rpc_call_fail(call, REFIT_ERR_UNAVAILABLE, "register \"%s\": node %s has "
				     "not joined the coordinator yet: retry", nz(rq->model),
				     n->node_id);
	c = xcalloc(1, sizeof(*c));
	c->model = xstrdup(nz(rq->model));
	c->instance = xstrdup(nz(rq->instance));
	c->role = (int)rq->role;
	c->install = (int)rq->install;
	c->pid = (int)rq->pid;
	c->valid = true;
	c->serving = -1;
	c->xo = n->xo;
	c->x = n->x;
	tl = xcalloc(rq->n_tensors ? rq->n_tensors : 1, sizeof(*tl));
	if (local_layouts(c, rq, tl, &err) == REFIT_OK)
		check_memory(n, c, rq, &err);
	if (err.status == REFIT_OK) {
		conv_layouts_digest(&c->layouts, c->ldigest);
		node_group_check(n, c, &err);
	}
	if (err.status != REFIT_OK) {
		rpc_call_fail(call, err.status, "register \"%s\": %s", nz(rq->model), err.msg);
		client_free(c);
		free(tl);
		return;
	}
	if (c->partial && !node_group_complete(n, c)) {
		/* the coordinator hears of the group when its last member comes */
		Refit__V1__LocalRegisterResponse rsp = REFIT__V1__LOCAL_REGISTER_RESPONSE__INIT;

		c->id = new_client_id(n);
		VEC_PUSH(&n->clients, c);
		log_info("node %s: librefit client %" PRIu64 " (pid %d): model \"%s\" %s \"%s\", "
			 "%zu pieces of some of this node's ranks; the others' clients to come",
			 n->node_id, c->id, c->pid, c->model,
			 c->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance", c->instance,
			 c->mem.n);
		rsp.client_id = c->id;
		rsp.layout_digest = c->ldigest;
		rpc_call_reply(call, &rsp.base);
		free(tl);
		return;
	}
	/* forward the layouts as received; the client exists once the coordinator agrees */
	fw.model = c->model;
	fw.role = rq->role;
	fw.instance = c->instance;
	fw.install = rq->install;   /* in place or not: the coordinator shows it */
	fw.tensors = tl;
	fw.n_tensors = rq->n_tensors;
	c->reg_len = protobuf_c_message_get_packed_size(&fw.base);
	c->reg = xmalloc(c->reg_len ? c->reg_len : 1);
	protobuf_c_message_pack(&fw.base, c->reg);
	fw.member_id = n->member_id;
	j = xcalloc(1, sizeof(*j));
	*j = (regjob_t){n, call, c};
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "RegisterLayout", &fw.base,
			   CALL_MS, on_registered, j, &err) != REFIT_OK) {
		rpc_call_fail(call, err.status, "register \"%s\": %s", nz(rq->model), err.msg);
		client_free(c);
		free(j);
	} else {
		n->inflight++;
	}
	free(tl);
}

static client_t *
find_or_fail(node_t *n, rpc_call_t *call, uint64_t id, int role)
{
	client_t *c = node_client(n, id);

	if (c == NULL) {
		rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "node %s: no librefit client %" PRIu64
			      " (never registered, unregistered, or the node restarted)",
			      n->node_id, id);
		return NULL;
	}
	if (role && c->role != role) {
		rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "client %" PRIu64 " is %s: this call "
			      "is for %s clients", id, c->role == REFIT__V1__ROLE__TRAIN ?
			      "a trainer" : "an inference instance",
			      role == REFIT__V1__ROLE__TRAIN ? "trainer" : "inference");
		return NULL;
	}
	return c;
}

typedef struct readyjob {
	node_t *n;
	rpc_call_t *call;
	uint64_t client_id, version;
	uint32_t resent;            /* to another coordinator (several: docs/ha.md) */
	const char *to;             /* the coordinator it went to (one of n->coords) */
} readyjob_t;

static refit_status_t send_ready(node_t *n, const client_t *c, readyjob_t *j,
				 refit_err_t *err);

static void
on_ready_fw(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	readyjob_t *j = arg;
	node_t *n = j->n;
	client_t *c = node_client(n, j->client_id);

	refit_err_t err;

	(void)resp;
	n->inflight--;
	refit_err_clear(&err);
	if (c != NULL && !n->closing && j->resent < 2 * n->ncoords &&
	    (st == REFIT_ERR_UNAVAILABLE || st == REFIT_ERR_TIMEOUT) &&
	    strstr(msg, "etcd") == NULL &&
	    (j->to != n->coordinator || node_follow(n, st, msg))) {
		/* a standby named the leader, or this one is unreachable: there */
		j->resent++;
		if (send_ready(n, c, j, &err) == REFIT_OK)
			return;
		st = err.status;
		msg = err.msg;
	}
	if (st != REFIT_OK)
		rpc_call_fail(j->call, st, "weights ready: %s", msg);
	else if (c == NULL)
		rpc_call_fail(j->call, REFIT_ERR_NOT_FOUND, "client %" PRIu64 " went away",
			      j->client_id);
	else
		reply_state(j->call, c);
	free(j);
	node_maybe_free(n);
}

static void
h_ready(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__TRAIN);
	readyjob_t *j;
	refit_err_t err;

	if (c == NULL)
		return;
	if (rq->version <= c->version && c->readable)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "weights ready: version %"
				     PRIu64 " is not newer than %" PRIu64, rq->version,
				     c->version);
	c->version = rq->version;
	c->readable = true;
	if (c->partial && !(c->forwarded && node_group_ready(n, c, rq->version)))
		/* the coordinator hears of it when every member of the group holds it */
		return reply_state(call, c);
	refit_err_clear(&err);
	j = xcalloc(1, sizeof(*j));
	*j = (readyjob_t){n, call, c->id, rq->version, 0, NULL};
	if (send_ready(n, c, j, &err) != REFIT_OK) {
		free(j);
		return rpc_call_fail(call, err.status, "weights ready: %s", err.msg);
	}
}

/* WeightsReady for j (c's version j->version) to the coordinator. */
static refit_status_t
send_ready(node_t *n, const client_t *c, readyjob_t *j, refit_err_t *err)
{
	Refit__V1__WeightsReadyRequest fw = REFIT__V1__WEIGHTS_READY_REQUEST__INIT;

	fw.member_id = n->member_id;
	fw.model = c->model;
	fw.version = j->version;
	fw.layout_digest = (char *)c->digest;
	j->to = n->coordinator;
	CHECK(rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			     &refit__v1__coordinator__descriptor, "WeightsReady", &fw.base,
			     CALL_MS, on_ready_fw, j, err));
	n->inflight++;
	return REFIT_OK;
}

static void
add_waiter(node_t *n, rpc_call_t *call, const Refit__V1__ClientRequest *rq, bool bw)
{
	waiter_t w = {call, rq->client_id, rq->version,
		      xport_now_ms() + (int64_t)rq->timeout_ms, bw};

	VEC_PUSH(&n->waiters, w);
	node_waiters_sweep(n);
}

static void
h_begin_write(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;

	if (find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__TRAIN) == NULL)
		return;
	add_waiter(n, call, rq, true);
}

static void
h_wait(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;

	if (find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__INFER) == NULL)
		return;
	add_waiter(n, call, rq, false);
}

static void
h_state(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, 0);

	if (c != NULL)
		reply_state(call, c);
}

/* The engine reading a double-buffered instance now serves `version`, the
 * one installed (the active copy): slices that would write that copy are
 * refused until it serves another (node_run.c). */
static void
h_serve(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__INFER);

	if (c == NULL)
		return;
	if (c->install != REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "client %" PRIu64 " of model "
				     "\"%s\" is installed in place: Serve is for double buffers",
				     c->id, c->model);
	if (rq->version != c->version || !c->valid || c->version == 0)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "client %" PRIu64 " of model "
				     "\"%s\": version %" PRIu64 " is not installed here (installed: "
				     "%" PRIu64 ")", c->id, c->model, rq->version, c->version);
	c->serving = (int32_t)c->active;
	reply_state(call, c);
}

static void
h_unregister(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, 0);

	if (c == NULL)
		return;
	reply_state(call, c);
	node_client_drop(n, c, "unregistered by the client");
}

/* ---- joining again -------------------------------------------------------------- */

typedef struct rejob {
	node_t *n;
	uint64_t client_id, member_id;
} rejob_t;

static void
on_reready(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	rejob_t *j = arg;

	(void)resp;
	j->n->inflight--;
	if (st != REFIT_OK)
		log_warnx("node %s: client %" PRIu64 ": WeightsReady again: %s", j->n->node_id,
			  j->client_id, msg);
	node_maybe_free(j->n);
	free(j);
}

static void
on_reregistered(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	rejob_t *j = arg;
	node_t *n = j->n;
	client_t *c = node_client(n, j->client_id);
	refit_err_t err;

	n->inflight--;
	if (st != REFIT_OK) {
		log_warnx("node %s: client %" PRIu64 ": RegisterLayout again: %s", n->node_id,
			  j->client_id, msg);
	} else if (c != NULL && !n->closing && n->member_id == j->member_id) {
		const Refit__V1__RegisterLayoutResponse *r = (const void *)resp;
		Refit__V1__WeightsReadyRequest fw = REFIT__V1__WEIGHTS_READY_REQUEST__INIT;

		snprintf(c->digest, sizeof(c->digest), "%s", nz(r->layout_digest));
		if (c->partial)
			node_group_forwarded(n, c, c->digest, true);
		log_info("node %s: client %" PRIu64 " (model \"%s\") registered again",
			 n->node_id, c->id, c->model);
		if (c->role == REFIT__V1__ROLE__TRAIN && c->readable && c->version > 0 &&
		    (!c->partial || node_group_ready(n, c, c->version))) {
			fw.member_id = n->member_id;
			fw.model = c->model;
			fw.version = c->version;
			fw.layout_digest = c->digest;
			refit_err_clear(&err);
			if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
					   &refit__v1__coordinator__descriptor, "WeightsReady",
					   &fw.base, CALL_MS, on_reready, j, &err) == REFIT_OK) {
				n->inflight++;
				node_maybe_free(n);
				return;
			}
			log_warnx("node %s: %s", n->node_id, err.msg);
		}
	}
	node_maybe_free(n);
	free(j);
}

void
node_local_rejoined(node_t *n)
{
	for (size_t i = 0; i < n->clients.n; i++) {
		client_t *c = n->clients.v[i];
		Refit__V1__RegisterLayoutRequest *fw;
		rejob_t *j;
		refit_err_t err;

		if (c->partial && (!c->forwarded || !node_group_first(n, c)))
			continue;   /* a group registers once, when whole */

		/* the request forwarded at registration, under the new member id */
		fw = (Refit__V1__RegisterLayoutRequest *)protobuf_c_message_unpack(
			&refit__v1__register_layout_request__descriptor, NULL, c->reg_len, c->reg);
		if (fw == NULL) { /* packed by this process: cannot happen but for memory */
			log_warnx("node %s: client %" PRIu64 ": its registration does not unpack",
				  n->node_id, c->id);
			continue;
		}
		j = xcalloc(1, sizeof(*j));
		*j = (rejob_t){n, c->id, n->member_id};
		fw->member_id = n->member_id;
		fw->again = true;
		refit_err_clear(&err);
		if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
				   &refit__v1__coordinator__descriptor, "RegisterLayout", &fw->base,
				   CALL_MS, on_reregistered, j, &err) == REFIT_OK) {
			n->inflight++;
		} else {
			log_warnx("node %s: client %" PRIu64 ": %s", n->node_id, c->id, err.msg);
			free(j);
		}
		protobuf_c_message_free_unpacked(&fw->base, NULL);
	}
}

static const rpc_method_cfg_t local_methods[] = {
	{"Hello", h_hello},
	{"RegisterClient", h_register},
	{"WeightsReady", h_ready},
	{"BeginWrite", h_begin_write},
	{"WaitVersion", h_wait},
	{"GetState", h_state},
	{"Unregister", h_unregister},
	{"Serve", h_serve},
};

/* ---- waiters ---------------------------------------------------------------- */

/* How often the sweep checks that registered clients' processes live when no
 * slice runs (while one runs: every sweep, so a refit into a client that died
 * fails instead of committing into memory nobody reads). */
#define NODE_PID_CHECK_MS 500

/* A process is gone when kill() says so or it is a zombie. */
static bool
pid_gone(int pid)
{
	char path[64], buf[256];
	FILE *f;
	bool zombie = false;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if ((f = fopen(path, "r")) != NULL) {
		if (fgets(buf, sizeof(buf), f)) {
			char *p = strrchr(buf, ')');

			zombie = p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
		}
		fclose(f);
	}
	return zombie;
}

void
node_waiters_sweep(node_t *n)
{
	int64_t now = xport_now_ms();

	/* Reading /proc/PID/stat for every client 20 times a second was most of
	 * an idle node's CPU (1,024 nodes on 2 cores: over a core). */
	bool check_pids = n->jobs.n || now - n->pids_checked_ms >= NODE_PID_CHECK_MS;

	if (check_pids)
		n->pids_checked_ms = now;
	for (size_t i = 0; check_pids && i < n->clients.n;) {
		client_t *c = n->clients.v[i];

		if (pid_gone(c->pid)) {
			char why[96];

			snprintf(why, sizeof(why), "its process (pid %d) exited", c->pid);
			node_client_drop(n, c, why);
		} else {
			i++;
		}
	}
	for (size_t i = 0; i < n->waiters.n;) {
		waiter_t *w = &n->waiters.v[i];
		client_t *c = node_client(n, w->client_id);
		bool done = true;

		if (c == NULL) {
			rpc_call_fail(w->call, REFIT_ERR_NOT_FOUND, "client %" PRIu64 " was "
				      "dropped while waiting", w->client_id);
		} else if (w->begin_write && c->reading == 0) {
			c->readable = false;
			reply_state(w->call, c);
		} else if (!w->begin_write && c->version >= w->min_version && c->valid &&
			   c->version > 0) {
			reply_state(w->call, c);
		} else if (rpc_call_cancelled(w->call)) {
			rpc_call_fail(w->call, REFIT_ERR_ABORTED, "cancelled by the client");
		} else if (now >= w->deadline_ms) {
			if (w->begin_write)
				rpc_call_fail(w->call, REFIT_ERR_TIMEOUT, "begin write: a refit "
					      "still reads the trainer's buffers");
			else
				rpc_call_fail(w->call, REFIT_ERR_TIMEOUT, "version %" PRIu64
					      " not installed in time (installed %" PRIu64
					      "%s%s%s)", w->min_version, c->version,
					      c->valid ? "" : ", weights invalid",
					      c->failure ? "; last failure: " : "",
					      c->failure ? c->failure : "");
		} else {
			done = false;
		}
		if (done)
			n->waiters.v[i] = n->waiters.v[--n->waiters.n];
		else
			i++;
	}
}

void
node_waiters_fail_all(node_t *n, const char *why)
{
	for (size_t i = 0; i < n->waiters.n; i++)
		rpc_call_fail(n->waiters.v[i].call, REFIT_ERR_UNAVAILABLE, "%s", why);
	n->waiters.n = 0;
}

/* ---- start / stop ----------------------------------------------------------- */

/* local_socket_group's id ((gid_t)-1: unset), looked up before anything starts */
static refit_status_t
socket_gid(const node_opts_t *o, gid_t *gid, refit_err_t *err)
{
	struct group *g;

	*gid = (gid_t)-1;
	if (o->local_socket_group == NULL || !o->local_socket_group[0])
		return REFIT_OK;
	g = getgrnam(o->local_socket_group);
	if (g == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: local_socket_group \"%s\" "
				     "is no group here", o->local_socket_group);
	*gid = g->gr_gid;
	return REFIT_OK;
}

/* Both local sockets mode 0660, in group gid when set: only the daemon's
 * user and that group's processes may register (and pass memory). */
static refit_status_t
socket_access(const node_opts_t *o, gid_t gid, refit_err_t *err)
{
	char mem[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	const char *paths[2] = {o->local_socket, mem};

	snprintf(mem, sizeof(mem), "%s.mem", o->local_socket);
	for (int i = 0; i < 2; i++) {
		if (gid != (gid_t)-1 && chown(paths[i], (uid_t)-1, gid) < 0)
			return refit_err_set(err, REFIT_ERR_SYS, "node: chown %s to group %s: %s",
					     paths[i], o->local_socket_group, strerror(errno));
		if (chmod(paths[i], 0660) < 0)
			return refit_err_set(err, REFIT_ERR_SYS, "node: chmod 0660 %s: %s",
					     paths[i], strerror(errno));
	}
	return REFIT_OK;
}

refit_status_t
node_local_start(node_t *n, const node_opts_t *o, refit_err_t *err)
{
	rpc_server_opts_t so = {0};
	char addr[300];
	gid_t gid;

	if (o->local_socket == NULL || o->local_socket[0] != '/')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: local_socket \"%s\" must "
				     "be an absolute path", nz(o->local_socket));
	CHECK(socket_gid(o, &gid, err));
	snprintf(addr, sizeof(addr), "unix:%s", o->local_socket);
	so.listen = addr;
	so.observe = metrics_observe_rpc;
	n->local = rpc_server_new(&so, n->loop, err);
	if (n->local == NULL)
		return err->status;
	n->local_path = xstrdup(o->local_socket);
	CHECK(rpc_server_add_service(n->local, &refit__v1__local__descriptor, local_methods,
				     sizeof(local_methods) / sizeof(local_methods[0]), n, err));
	CHECK(rpc_server_start(n->local, NULL, err));
	CHECK(mem_listen(n, o->local_socket, err));
	return socket_access(o, gid, err);
}

void
node_local_stop(node_t *n)
{
	if (n->local) {
		rpc_server_drain(n->local);
		rpc_server_free(n->local);
		n->local = NULL;
	}
	while (n->clients.n)
		node_client_drop(n, n->clients.v[0], "the node daemon stopped");
	VEC_FREE(&n->clients);
	VEC_FREE(&n->waiters);
	VEC_FREE(&n->prepared);
	VEC_FREE(&n->jobs);
	VEC_FREE(&n->memconns);
	free(n->local_path);
	free(n->mem_path);
}
