/*
 * node_mem.c - the clients' memory on a node: the memory socket
 * (<local socket>.mem), over which a librefit client passes memfds sealed
 * against shrinking (SCM_RIGHTS), and the check of a registration's memory
 * against its layouts: every piece of every tensor on the ranks this node
 * serves needs memory, each segment must have been passed to this node by
 * the registering process and be large enough for the piece at its offset
 * and strides (both copies for a double-buffered inference client), or be
 * a CUDA IPC handle on the nccl transport.  Loop thread only.  Calls
 * nothing in node_local.c or node_client.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/wire.h"
#include "daemon/node/node_internal.h"
#include "daemon/transport/transport.h"
#include "dataplane/view.h"

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

refit_status_t
node_mem_listen(node_t *n, const char *local_socket, refit_err_t *err)
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
node_mem_close(node_t *n)
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
	seg_t s = {0};
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
			 .elem = plan_dtype_size(l->dtype), .cseg = -1};
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
		seg_t sg = {.size = pm->cuda_bytes, .cuda = true, .rank = pm->rank,
			    .device = pm->has_cuda_device ? pm->cuda_device : -1, .tensor = t};

		if (n->xo->memory != XPORT_MEM_DEVICE)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: "
					     "GPU memory (a CUDA IPC handle) needs the nccl "
					     "transport; this node uses %s", l->name, pm->rank,
					     n->xo->name);
		if (pm->cuda_uuid.len != 0 && pm->cuda_uuid.len != 16)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensor \"%s\" rank %d: "
					     "cuda_uuid has %zu bytes; a GPU's UUID has 16",
					     l->name, pm->rank, pm->cuda_uuid.len);
		/* opened later, off the loop (node_mem_open) */
		sg.name = xstrdup("(CUDA IPC)");
		sg.ipc = xmalloc(pm->cuda_ipc.len);
		memcpy(sg.ipc, pm->cuda_ipc.data, pm->cuda_ipc.len);
		sg.ipc_len = pm->cuda_ipc.len;
		sg.has_uuid = pm->cuda_uuid.len == 16;
		if (sg.has_uuid)
			memcpy(sg.uuid, pm->cuda_uuid.data, 16);
		VEC_PUSH(&c->segs, sg);
		seg = &c->segs.v[c->segs.n - 1];
		m.cseg = (int32_t)(c->segs.n - 1);
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
		/* a CUDA segment's base comes later: the offset until then */
		m.base[k] = m.cseg >= 0 ? (uint8_t *)(uintptr_t)pm->offsets[k] :
			    seg->base + pm->offsets[k];
	}
	if (copies == 1)
		m.base[1] = m.base[0];
	VEC_PUSH(&c->mem, m);
	return REFIT_OK;
}

bool
node_mem_pending(const client_t *c)
{
	for (size_t i = 0; i < c->segs.n; i++)
		if (c->segs.v[i].cuda && c->segs.v[i].base == NULL)
			return true;
	return false;
}

refit_status_t
node_mem_open(node_t *n, client_t *c, refit_err_t *err)
{
	for (size_t i = 0; i < c->segs.n; i++) {
		seg_t *s = &c->segs.v[i];
		void *b = NULL;

		if (!s->cuda || s->base != NULL)
			continue;
		if (n->xo->mem_open(n->x, s->rank, s->ipc, s->ipc_len, s->device,
				    s->has_uuid ? s->uuid : NULL, s->size, &b, err) == REFIT_OK) {
			s->base = b;
			continue;
		}
		refit_err_prefix(err, "tensor \"%s\" rank %d", c->layouts.v[s->tensor].name,
				 s->rank);
		for (size_t k = 0; k < i; k++)   /* none stays open */
			if (c->segs.v[k].cuda && c->segs.v[k].base) {
				n->xo->mem_close(n->x, c->segs.v[k].base);
				c->segs.v[k].base = NULL;
			}
		return err->status;
	}
	return REFIT_OK;
}

void
node_mem_resolve(client_t *c)
{
	for (size_t i = 0; i < c->mem.n; i++) {
		piece_mem_t *m = &c->mem.v[i];

		if (m->cseg < 0)
			continue;
		for (int k = 0; k < 2; k++)
			m->base[k] = c->segs.v[m->cseg].base + (uintptr_t)m->base[k];
		m->cseg = -1;
	}
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
refit_status_t
node_mem_check(node_t *n, client_t *c, const Refit__V1__LocalRegisterRequest *rq,
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
