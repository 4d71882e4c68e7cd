/*
 * emu_p2p.c - grouped ncclSend/ncclRecv, run by the stream workers.
 *
 * A group becomes one task per stream.  The task progresses all its
 * operations together (so a group's sends and receives never wait on each
 * other) over unix sockets, one per ordered pair of ranks, dialled by the
 * sender to the receiver's listening socket.  Per ordered pair the
 * operations match in posting order (tickets): the sender announces count
 * and datatype, the receiver compares them with its own and answers; a
 * mismatch fails both sides with ncclInvalidUsage and a message naming the
 * ranks and sizes; a match moves the bytes (rendezvous: a send completes
 * only once its receive is posted).  An operation without its match waits
 * forever, until ncclCommAbort, whose shutdown of the sockets ends it; a
 * connection that closes under an operation (the peer died or aborted) is
 * ncclRemoteError.  Buffers must be device memory of the communicator's
 * device, else the context dies (sticky cudaErrorIllegalAddress).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/emu/emu_nccl.h"

enum { ST_TURN, ST_CONN, ST_SHDR, ST_SREPLY, ST_SDATA, ST_RHDR, ST_RREPLY, ST_RDATA, ST_DONE };

typedef struct hello {
	uint32_t magic;
	int32_t rank;
	uint64_t uid;
} hello_t;

typedef struct hdr {               /* sender -> receiver, then receiver -> sender */
	uint32_t magic;
	int32_t type;
	uint64_t count, bytes;
	int32_t ok, pad;
} hdr_t;
_Static_assert(sizeof(hdr_t) <= 32, "header too big");

typedef struct task {
	emu_op_t h;
	size_t n;
	p2p_t ops[];
} task_t;

static bool
broken(ncclComm_t c)
{
	bool b;

	pthread_mutex_lock(&c->mu);
	b = c->aborted || c->terminated || c->err != ncclSuccess;
	pthread_mutex_unlock(&c->mu);
	return b;
}

/* The operation ends (ok or not): the next one of its pair may go. */
static void
op_finish(p2p_t *op, bool ok)
{
	ncclComm_t c = op->comm;

	if (op->state == ST_DONE)
		return;
	pthread_mutex_lock(&c->mu);
	if (op->send)
		c->send_turn[op->peer]++;
	else
		c->recv_turn[op->peer]++;
	pthread_mutex_unlock(&c->mu);
	emu_mem_unpin(op->pin);
	op->pin = NULL;
	op->ok = ok;
	op->state = ST_DONE;
	if (ok && op->send)
		emu_count_pair(c->dev, c->peers[op->peer].dev, op->bytes);
}

static const char *
state_name(int st)
{
	return st == ST_SHDR || st == ST_RHDR ? "announcing a message" :
	       st == ST_SREPLY || st == ST_RREPLY ? "matching a message" : "moving data";
}

/* I/O on a pair failed: remote error, unless the communicator was aborted. */
static void
op_io_fail(p2p_t *op, int err)
{
	ncclComm_t c = op->comm;

	if (!broken(c))
		comm_set_err(c, ncclRemoteError, "rank %d (device %d): the connection %s rank %d "
			     "closed while %s (%s): the peer died or aborted its communicator",
			     c->rank, c->dev, op->send ? "to" : "from", op->peer,
			     state_name(op->state), err ? strerror(err) : "end of stream");
	op_finish(op, false);
}

/* Pin the buffer: device memory of the communicator's device, or a fault. */
static void
op_begin(p2p_t *op)
{
	ncclComm_t c = op->comm;
	int dev = -1;
	enum emu_where w;

	op->state = ST_TURN;
	if (op->count == 0)
		return;
	w = emu_mem_find(op->buf, op->bytes, true, &dev, &op->mem, &op->pin);
	if (w == EMU_DEVICE && dev == c->dev)
		return;
	emu_fault(cudaErrorIllegalAddress, "%s rank %d (device %d) %s rank %d: buffer [%p, +%zu) "
		  "is %s", op->send ? "ncclSend" : "ncclRecv", c->rank, c->dev,
		  op->send ? "to" : "from", op->peer, op->buf, op->bytes,
		  w == EMU_HOST ? "host memory" : w == EMU_BAD ?
		  "not inside one live allocation" : "memory of another device");
	emu_mem_unpin(op->pin);
	op->pin = NULL;
	comm_set_err(c, ncclUnhandledCudaError, "rank %d: %s", c->rank,
		     cudaGetErrorString(cudaErrorIllegalAddress));
	op_finish(op, false);
}

static int
dial(ncclComm_t c, int peer)
{
	hello_t h = {WIRE_MAGIC, c->rank, c->uid};
	int fd = sock_connect(c->peers[peer].path);

	if (fd < 0)
		return -1;
	if (write_full(fd, &h, sizeof(h)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Take the connections waiting on the listening socket (without blocking). */
static void
accept_pending(ncclComm_t c)
{
	struct timeval tv = {5, 0};

	pthread_mutex_lock(&c->accept_mu);
	for (;;) {
		int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		hello_t h;

		if (fd < 0)
			break;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		if (read_full(fd, &h, sizeof(h)) != 0 || h.magic != WIRE_MAGIC ||
		    h.uid != c->uid || h.rank < 0 || h.rank >= c->nranks ||
		    c->in_fd[h.rank] >= 0) {
			close(fd);
			continue;
		}
		c->in_fd[h.rank] = fd;
	}
	pthread_mutex_unlock(&c->accept_mu);
}

/* Move bytes without blocking: 1 done, 0 would block, -1 failed (errno, 0 =
 * end of stream). */
static int
io(int fd, bool out, uint8_t *p, size_t len, size_t *off)
{
	while (*off < len) {
		ssize_t r = out ? send(fd, p + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT)
				: recv(fd, p + *off, len - *off, MSG_DONTWAIT);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (r <= 0) {
			if (r == 0)
				errno = 0;
			return -1;
		}
		*off += (size_t)r;
	}
	return 1;
}

static bool
step_turn(p2p_t *op)
{
	ncclComm_t c = op->comm;
	bool go;

	pthread_mutex_lock(&c->mu);
	go = (op->send ? c->send_turn : c->recv_turn)[op->peer] == op->ticket;
	pthread_mutex_unlock(&c->mu);
	if (go)
		op->state = ST_CONN;
	return go;
}

static bool
step_conn(p2p_t *op)
{
	ncclComm_t c = op->comm;
	hdr_t h = {WIRE_MAGIC, op->type, op->count, op->bytes, 0, op->reg};

	if (op->send) {
		if (c->out_fd[op->peer] < 0 && (c->out_fd[op->peer] = dial(c, op->peer)) < 0) {
			if (!broken(c))
				comm_set_err(c, ncclRemoteError, "rank %d cannot reach rank %d at "
					     "%s: %s", c->rank, op->peer, c->peers[op->peer].path,
					     strerror(errno));
			op_finish(op, false);
			return true;
		}
		memcpy(op->hbuf, &h, sizeof(h));
		op->hoff = 0;
		op->state = ST_SHDR;
		return true;
	}
	if (c->in_fd[op->peer] < 0)
		accept_pending(c);
	if (c->in_fd[op->peer] < 0)
		return false;
	op->hoff = 0;
	op->state = ST_RHDR;
	return true;
}

static void
mismatch(p2p_t *op, const hdr_t *other)
{
	ncclComm_t c = op->comm;

	comm_set_err(c, ncclInvalidUsage, "%s rank %d (device %d, host %s) %s rank %d: this "
		     "side has %zu x %s (%zu bytes), rank %d has %llu x %s (%llu bytes): sizes "
		     "or datatypes of a matched send/recv differ", op->send ? "ncclSend" :
		     "ncclRecv", c->rank, c->dev, emu_env()->host, op->send ? "to" : "from",
		     op->peer, op->count, type_name(op->type), op->bytes, op->peer,
		     (unsigned long long)other->count, type_name((ncclDataType_t)other->type),
		     (unsigned long long)other->bytes);
}

/* Receiver: got the announcement; compare and prepare the answer. */
static void
recv_compare(p2p_t *op)
{
	hdr_t got, ans = {WIRE_MAGIC, op->type, op->count, op->bytes, 1, 0};

	memcpy(&got, op->hbuf, sizeof(got));
	if (got.magic != WIRE_MAGIC || got.type != (int32_t)op->type || got.count != op->count ||
	    got.bytes != op->bytes) {
		op->mismatch = true;
		ans.ok = 0;
		mismatch(op, &got);
	} else if (got.pad != (int32_t)op->reg) {
		/* NCCL (user buffer registration): "mixing registered and
		 * non-registered buffers can result in undefined behavior" */
		ncclComm_t c = op->comm;

		op->mismatch = true;
		ans.ok = 0;
		comm_set_err(c, ncclInvalidUsage, "ncclRecv rank %d from rank %d: the send's "
			     "buffer is %sregistered (ncclCommRegister), this receive's is %s: NCCL "
			     "leaves mixing registered and unregistered buffers undefined",
			     c->rank, op->peer, got.pad ? "" : "not ", op->reg ? "" : "not");
	}
	memcpy(op->hbuf, &ans, sizeof(ans));
	op->hoff = 0;
	op->state = ST_RREPLY;
}

/* One step of op; true when it moved. */
static bool
op_step(p2p_t *op)
{
	ncclComm_t c = op->comm;
	int fd, r = 1;
	hdr_t ans;

	if (op->state == ST_DONE)
		return false;
	if (broken(c) && !op->mismatch) {
		op_finish(op, false);
		return true;
	}
	if (op->state == ST_TURN)
		return step_turn(op);
	if (op->state == ST_CONN)
		return step_conn(op);
	fd = op->send ? c->out_fd[op->peer] : c->in_fd[op->peer];
	switch (op->state) {
	case ST_SHDR:
	case ST_RREPLY:
		r = io(fd, true, op->hbuf, sizeof(hdr_t), &op->hoff);
		break;
	case ST_SREPLY:
	case ST_RHDR:
		r = io(fd, false, op->hbuf, sizeof(hdr_t), &op->hoff);
		break;
	case ST_SDATA:
	case ST_RDATA:
		r = io(fd, op->state == ST_SDATA, op->mem, op->bytes, &op->off);
		break;
	}
	if (r < 0) {
		op_io_fail(op, errno);
		return true;
	}
	if (r == 0)
		return false;
	switch (op->state) {
	case ST_SHDR:
		op->hoff = 0;
		op->state = ST_SREPLY;
		break;
	case ST_SREPLY:
		memcpy(&ans, op->hbuf, sizeof(ans));
		if (!ans.ok) {
			mismatch(op, &ans);
			op_finish(op, false);
			break;
		}
		op->off = 0;
		op->state = ST_SDATA;
		break;
	case ST_RHDR:
		recv_compare(op);
		break;
	case ST_RREPLY:
		if (op->mismatch) {
			op_finish(op, false);
			break;
		}
		op->off = 0;
		op->state = ST_RDATA;
		break;
	default: /* data moved */
		op_finish(op, true);
	}
	return true;
}

/* Sleep until a socket of an operation can move (or briefly, for turns). */
static void
task_wait(task_t *t)
{
	struct pollfd fds[64];
	nfds_t n = 0;
	int timeout = 200;

	for (size_t i = 0; i < t->n && n < 64; i++) {
		p2p_t *op = &t->ops[i];
		ncclComm_t c = op->comm;
		short ev = 0;
		int fd = -1;

		switch (op->state) {
		case ST_DONE:
			continue;
		case ST_TURN:
			timeout = 2;
			continue;
		case ST_CONN:
			fd = c->listen_fd;
			ev = POLLIN;
			timeout = 20;
			break;
		case ST_SHDR: case ST_RREPLY: case ST_SDATA:
			ev = POLLOUT;
			break;
		default:
			ev = POLLIN;
		}
		if (fd < 0)
			fd = op->send ? c->out_fd[op->peer] : c->in_fd[op->peer];
		fds[n++] = (struct pollfd){fd, ev, 0};
	}
	if (t->n > 64)
		timeout = 2;
	poll(fds, n, timeout);
}

static void
task_run(emu_op_t *h, struct CUstream_st *s)
{
	task_t *t = (task_t *)h;
	size_t active;

	(void)s;
	for (size_t i = 0; i < t->n; i++)
		op_begin(&t->ops[i]);
	do {
		bool moved = false;

		active = 0;
		for (size_t i = 0; i < t->n; i++) {
			moved |= op_step(&t->ops[i]);
			active += t->ops[i].state != ST_DONE;
		}
		if (active && !moved)
			task_wait(t);
	} while (active);
}

/* Also when the task never ran (dead context): end what is left. */
static void
task_fini(emu_op_t *h)
{
	task_t *t = (task_t *)h;

	for (size_t i = 0; i < t->n; i++) {
		op_finish(&t->ops[i], false);
		comm_unref(t->ops[i].comm);
	}
	free(t);
}

void
p2p_launch(p2p_t *ops, size_t n)
{
	bool *taken = calloc(n + 1, sizeof(bool));

	if (taken == NULL)
		abort();
	for (size_t i = 0; i < n; i++) {
		size_t k = 0;
		task_t *t;

		if (taken[i])
			continue;
		for (size_t j = i; j < n; j++)
			k += ops[j].s == ops[i].s && !taken[j];
		if ((t = calloc(1, sizeof(*t) + k * sizeof(p2p_t))) == NULL)
			abort();
		t->h.run = task_run;
		t->h.fini = task_fini;
		for (size_t j = i; j < n; j++)
			if (ops[j].s == ops[i].s && !taken[j]) {
				t->ops[t->n++] = ops[j];
				taken[j] = true;
			}
		emu_stream_push(ops[i].s, &t->h);
	}
	free(taken);
}
