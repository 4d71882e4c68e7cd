/*
 * emu_group.c - the emulated NCCL's groups (libnccl.so.2): ncclGroupStart
 * and ncclGroupEnd, ncclSend and ncclRecv posted inside them, and the inits
 * and shrinks a group defers (emu_nccl.c's communicators).  A non-blocking
 * group's operations reach their streams from a launcher thread, after
 * ncclGroupEnd returned ncclInProgress.  The group state is per thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/emu/emu_nccl.h"

static __thread int group_depth;
static __thread p2p_t *gops;
static __thread size_t ngops, capgops;
static __thread ncclComm_t *ginits;
static __thread size_t nginits, capginits;

bool
group_defer_init(ncclComm_t c)
{
	if (group_depth == 0)
		return false;
	if (nginits == capginits) {
		capginits = capginits ? capginits * 2 : 8;
		ginits = realloc(ginits, capginits * sizeof(*ginits));
		if (ginits == NULL)
			abort();
	}
	comm_ref(c);
	ginits[nginits++] = c;
	return true;
}

void
group_leave_open(void)
{
	group_depth++;
}

/* ---- groups ------------------------------------------------------------------------------ */

static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t launch_cv = PTHREAD_COND_INITIALIZER;
typedef struct job {
	struct job *next;
	p2p_t *ops;
	size_t n;
} job_t;
static job_t *jobs, *jobs_tail;
static bool launcher_up;

/* The launcher queues non-blocking groups on their streams, later. */
static void *
launcher(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&launch_mu);
	for (;;) {
		job_t *j;

		while (jobs == NULL)
			pthread_cond_wait(&launch_cv, &launch_mu);
		j = jobs;
		jobs = j->next;
		if (jobs == NULL)
			jobs_tail = NULL;
		pthread_mutex_unlock(&launch_mu);
		emu_delay();
		p2p_launch(j->ops, j->n);
		for (size_t i = 0; i < j->n; i++) {
			ncclComm_t c = j->ops[i].comm;

			pthread_mutex_lock(&c->mu);
			c->launching--;
			pthread_cond_broadcast(&c->cv);
			pthread_mutex_unlock(&c->mu);
			comm_unref(c); /* the job's reference */
		}
		free(j->ops);
		free(j);
		pthread_mutex_lock(&launch_mu);
	}
	return NULL;
}

static ncclResult_t
launch_later(p2p_t *ops, size_t n)
{
	job_t *j = calloc(1, sizeof(*j));
	pthread_t th;

	if (j == NULL)
		abort();
	j->ops = ops;
	j->n = n;
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&ops[i].comm->mu);
		ops[i].comm->launching++;
		ops[i].comm->refs++;
		pthread_mutex_unlock(&ops[i].comm->mu);
	}
	pthread_mutex_lock(&launch_mu);
	if (!launcher_up) {
		if (pthread_create(&th, NULL, launcher, NULL) != 0)
			abort();
		pthread_detach(th);
		launcher_up = true;
	}
	if (jobs_tail)
		jobs_tail->next = j;
	else
		jobs = j;
	jobs_tail = j;
	pthread_cond_broadcast(&launch_cv);
	pthread_mutex_unlock(&launch_mu);
	return ncclInProgress;
}

ncclResult_t
ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

/* Tickets fix the order per ordered pair: the order of the calls. */
static ncclResult_t
flush_ops(void)
{
	p2p_t *ops = gops;
	size_t n = ngops;
	bool later = false;

	gops = NULL;
	ngops = capgops = 0;
	if (n == 0) {
		free(ops);
		return ncclSuccess;
	}
	for (size_t i = 0; i < n; i++) {
		ncclComm_t c = ops[i].comm;

		pthread_mutex_lock(&c->mu);
		ops[i].ticket = ops[i].send ? c->send_next[ops[i].peer]++ :
					      c->recv_next[ops[i].peer]++;
		pthread_mutex_unlock(&c->mu);
		later |= !c->blocking;
	}
	if (later)
		return launch_later(ops, n);
	p2p_launch(ops, n);
	free(ops);
	return ncclSuccess;
}

static ncclResult_t
flush_inits(void)
{
	ncclResult_t res = ncclSuccess;

	for (size_t i = 0; i < nginits; i++) {
		ncclComm_t c = ginits[i];
		ncclResult_t r = ncclInProgress;

		if (c->blocking)
			r = comm_wait_ready(c);
		if (r != ncclSuccess && (res == ncclSuccess || res == ncclInProgress))
			res = r;
		comm_unref(c);
	}
	free(ginits);
	ginits = NULL;
	nginits = capginits = 0;
	return res;
}

ncclResult_t
ncclGroupEnd(void)
{
	ncclResult_t a, b;

	if (group_depth == 0)
		return nccl_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0)
		return ncclSuccess;
	a = flush_ops();
	b = flush_inits();
	if (a != ncclSuccess && a != ncclInProgress)
		return a;
	if (b != ncclSuccess && b != ncclInProgress)
		return b;
	return a == ncclInProgress || b == ncclInProgress ? ncclInProgress : ncclSuccess;
}

static ncclResult_t
p2p_post(bool send, void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
	 cudaStream_t stream)
{
	const char *w = send ? "ncclSend" : "ncclRecv";
	struct CUstream_st *s;
	ncclResult_t r = comm_ready(c, w);

	if (r != ncclSuccess)
		return r;
	if (c->terminated)
		return nccl_fail(ncclInvalidUsage, "%s: rank %d: ncclCommShrink(NCCL_SHRINK_ABORT) "
				 "ended this communicator's operations: destroy or abort it", w,
				 c->rank);
	if (type_size(type) == 0)
		return nccl_fail(ncclInvalidArgument, "%s: datatype %d", w, (int)type);
	if (peer < 0 || peer >= c->nranks)
		return nccl_fail(ncclInvalidArgument, "%s: rank %d: peer %d of %d", w, c->rank,
				 peer, c->nranks);
	if (buf == NULL && count)
		return nccl_fail(ncclInvalidArgument, "%s: NULL buffer", w);
	if (emu_stream_get(stream, &s) != cudaSuccess)
		return nccl_fail(ncclInvalidArgument, "%s: stream %p is not a live stream", w,
				 (void *)stream);
	if (emu_stream_dev(s) != c->dev)
		return nccl_fail(ncclInvalidArgument, "%s: rank %d: a stream of device %d for a "
				 "communicator of device %d", w, c->rank, emu_stream_dev(s),
				 c->dev);
	if (ngops == capgops) {
		capgops = capgops ? capgops * 2 : 16;
		gops = realloc(gops, capgops * sizeof(*gops));
		if (gops == NULL)
			abort();
	}
	comm_ref(c); /* the operation's */
	gops[ngops++] = (p2p_t){.send = send, .buf = buf, .count = count,
				.bytes = count * type_size(type), .type = type, .peer = peer,
				.comm = c, .s = s,
				.reg = emu_reg_covers(c, buf, count * type_size(type))};
	if (group_depth == 0)
		return flush_ops();
	return ncclSuccess;
}

ncclResult_t
ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
	 cudaStream_t stream)
{
	return p2p_post(true, (void *)buf, count, type, peer, comm, stream);
}

ncclResult_t
ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
	 cudaStream_t stream)
{
	return p2p_post(false, buf, count, type, peer, comm, stream);
}

