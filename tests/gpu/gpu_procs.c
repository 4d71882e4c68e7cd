/*
 * gpu_procs.c - gpu-test's cases across processes: CUDA IPC (4), a ring and
 * a shrink (5), a peer dying mid-group (8), the staging budget (8b), an
 * abort that never returns (8c)
 * (the cases are listed in gpu_test.c; the harness is gpu_test.h).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/clock.h"
#include "daemon/transport/gpu.h"
#include "daemon/transport/transport.h"
#include "dataplane/delta_gpu.h"
#include "dataplane/view.h"
#include "tests/gpu/gpu_test.h"

#ifdef REFIT_HAVE_NCCL

/* ---- 4. CUDA IPC ------------------------------------------------------------------ */

/* The child: opens the handles (two allocations A and B) on rank 0's
 * device, reads pieces of A. */
int
ipc_child(int rfd)
{
	const xport_ops_t *o = &xport_nccl_ops;
	uint8_t handle[64], hb[64], buf[1024];
	int32_t r0 = 0;
	xport_t *x;
	refit_err_t err;
	void *base = NULL, *bb = NULL, *b2 = NULL;
	int bad = 0;
	const gpu_api_t *a;
	char why[1024];

	if (read(rfd, handle, sizeof(handle)) != (ssize_t)sizeof(handle) ||
	    read(rfd, hb, sizeof(hb)) != (ssize_t)sizeof(hb))
		return 3;   /* the parent skipped */
	if ((a = gpu_load(1, why, sizeof(why))) == NULL) {
		printf("FAIL ipc child: %s\n", why);
		return 1;
	}
	refit_err_clear(&err);
	if ((x = start(&r0, 1, "0", "gpu-test-ipc", &err)) == NULL) {
		printf("FAIL ipc child: %s\n", err.msg);
		return 1;
	}
	/* cuda_bytes beyond the allocation, and a wrong device, are refused */
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), -1, NULL, 1 << 24, &base, &err) ==
	       REFIT_ERR_INVALID_ARG && strstr(err.msg, "larger than the allocation"),
	       "cuda_bytes 16 MiB for a 2 MiB allocation: %s", err.msg);
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), 1, NULL, IPC_BYTES, &base, &err) ==
	       REFIT_ERR_INVALID_ARG && strstr(err.msg, "on CUDA device 1"),
	       "device 1 said for rank 0: %s", err.msg);
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), 0, NULL, IPC_BYTES, &base, &err) == REFIT_OK,
	       "mem_open: %s", err.msg);
	/* B, opened next: on the emulator its mapping starts where A's ends (as
	 * CUDA may place it), so the byte past A is device memory of device 0 */
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, hb, sizeof(hb), 0, NULL, IPC_BYTES, &bb, &err) == REFIT_OK,
	       "mem_open of the second allocation: %s", err.msg);
	if (base && bb) {
		printf("     the second mapping %s right after the first\n",
		       (uint8_t *)bb == (uint8_t *)base + IPC_BYTES ? "starts" : "does not start");
		if (emu)
			EXPECT((uint8_t *)bb == (uint8_t *)base + IPC_BYTES, "emulator: B's mapping "
			       "is not right after A's: the next case proves nothing");
	}
	/* A claimed 4 KiB larger than it is: the claim's last byte is in B */
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), 0, NULL, IPC_BYTES + 4096, &b2, &err) ==
	       REFIT_ERR_INVALID_ARG && strstr(err.msg, "larger than the allocation"),
	       "cuda_bytes 2 MiB + 4 KiB for a 2 MiB allocation, the next mapping right "
	       "after it: %s", b2 ? "accepted" : err.msg);
	if (b2)
		o->mem_close(x, b2);
	if (base) {
		/* pieces at offsets inside the one allocation */
		for (uint64_t off = 0; off < IPC_BYTES && !bad; off += IPC_BYTES / 4) {
			cudaError_t e = a->cudaSetDevice(0);

			if (e == cudaSuccess)
				e = a->cudaMemcpy(buf, (uint8_t *)base + off + 100, sizeof(buf),
						  cudaMemcpyDeviceToHost);
			EXPECT(e == cudaSuccess, "cudaMemcpy at offset %" PRIu64 ": %s", off + 100,
			       a->cudaGetErrorString(e));
			for (size_t i = 0; i < sizeof(buf) && e == cudaSuccess; i++)
				if (buf[i] != (uint8_t)((off + 100 + i) ^ 0x5a)) {
					EXPECT(0, "byte %" PRIu64 " of the allocation differs",
					       off + 100 + i);
					break;
				}
		}
		o->mem_close(x, base);
	}
	if (bb)
		o->mem_close(x, bb);
	o->stop(x);
	return bad ? 1 : 0;
}

/* ---- 5. three processes, a ring, a shrink ----------------------------------------- */

static int
ring(xport_session_t *s, int32_t me, const int32_t *world, size_t n, uint64_t bytes,
     uint64_t salt)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	size_t k = 0;
	int32_t next, prev;
	uint8_t *a, *b, *h = malloc(bytes), *g = malloc(bytes);
	refit_err_t err;
	int bad = 0;

	while (world[k] != me)
		k++;
	next = world[(k + 1) % n];
	prev = world[(k + n - 1) % n];
	a = dev->alloc(dev->ctx, me, bytes);
	b = dev->alloc(dev->ctx, me, bytes);
	EXPECT(a && b, "cudaMalloc");
	for (uint64_t i = 0; i < bytes; i++)
		h[i] = (uint8_t)((uint64_t)me * 37 + i * 13 + salt);
	dev->from_host(dev->ctx, me, a, h, bytes);
	refit_err_clear(&err);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	{
		xport_op_t ops[2] = {{true, me, next, a, bytes}, {false, me, prev, b, bytes}};

		EXPECT(group_run(s, ops, 2, &err) == REFIT_OK, "rank %d: group: %s",
		       me, err.msg);
	}
	dev->to_host(dev->ctx, me, g, b, bytes);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	for (uint64_t i = 0; i < bytes; i++)
		if (g[i] != (uint8_t)((uint64_t)prev * 37 + i * 13 + salt)) {
			EXPECT(0, "rank %d: byte %" PRIu64 " from rank %d differs", me, i, prev);
			break;
		}
	dev->free(dev->ctx, me, a);
	dev->free(dev->ctx, me, b);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	free(h);
	free(g);
	return bad;
}


/*
 * The NCCL unique id of a session across processes: rank 0 makes it (into
 * id, *idlen bytes on entry: its room) and writes it to each of outs; the
 * others read it from idfd.  Returns the failures.
 */
static int
share_id(xport_t *x, int32_t me, const int *outs, int nouts, int idfd, uint8_t *id,
	 size_t *idlen)
{
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	if (me == 0) {
		EXPECT(xport_nccl_ops.unique_id(x, id, idlen, &err) == REFIT_OK, "unique id: %s",
		       err.msg);
		for (int i = 0; i < nouts; i++)
			if (write(outs[i], id, *idlen) != (ssize_t)*idlen)
				bad++;
	} else {
		ssize_t r = read(idfd, id, *idlen);

		*idlen = r > 0 ? (size_t)r : 0;
	}
	return bad;
}

/*
 * Rank me of {0, 1, 2}: ids come on idfd (rank 0 makes one and writes it to
 * out0/out1), after the ring rank 2 leaves; 0 and 1 wait for a byte on
 * gofd (the parent writes it once rank 2 has exited) and shrink.
 */
int
ring_child(int32_t me, int idfd, int out1, int out2, int gofd, int donefd)
{
	int32_t world[3] = {0, 1, 2}, world2[2] = {0, 1};
	uint8_t id[512];
	size_t idlen = sizeof(id);
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;
	char c;

	if ((x = child_start("r", me, &a)) == NULL)
		return 1;
	refit_err_clear(&err);
	bad += share_id(x, me, (const int[]){out1, out2}, 2, idfd, id, &idlen);
	s = session(x, 1, world, 3, &me, 1, id, idlen, &err);
	EXPECT(s != NULL, "rank %d: communicators of 3: %s", me, err.msg);
	if (s) {
		bad += ring(s, me, world, 3, 1 << 20, 1);
		xport_nccl_ops.close(s);
	}
	if (me == 2) {
		xport_nccl_ops.stop(x);
		bad += emu_check("rank 2 (left)");
		return bad ? 1 : 0;
	}
	if (read(gofd, &c, 1) != 1)
		bad++;
	/* epoch 2 without a unique id: shrink */
	s = session(x, 2, world2, 2, &me, 1, NULL, 0, &err);
	EXPECT(s != NULL, "rank %d: shrinking to 2: %s", me, err.msg);
	if (s) {
		bad += ring(s, me, world2, 2, 1 << 20, 2);
		xport_nccl_ops.close(s);
	}
	/* tell the parent this rank's shrunk ring ran */
	if (write(donefd, "x", 1) != 1)
		bad++;
	xport_nccl_ops.stop(x);
	bad += emu_check(me ? "rank 1" : "rank 0");
	return bad ? 1 : 0;
}

/* ---- 8. a peer dies mid-group (emulator) -------------------------------------------- */

/*
 * The sender's side of a group whose peer dies: the emulated NCCL fails
 * the send with ncclRemoteError and its stream then completes.  The first
 * cudaStreamQuery of the group kills the peer and returns only once the
 * stream drained (a poller descheduled while the error came: the stream is
 * done, the communicator's asynchronous error is set).  The transport must
 * report the group failed, naming the peer, and not done (the defect: only
 * a stream still running had its communicator's error checked).
 */
static pid_t kill_on_query;
static __typeof__(cudaStreamQuery) *real_query;

static cudaError_t
query_after_death(cudaStream_t st)
{
	if (kill_on_query > 0) {
		kill(kill_on_query, SIGKILL);
		kill_on_query = 0;
		for (int i = 0; i < 60000 && real_query(st) == cudaErrorNotReady; i++)
			usleep(1000);
	}
	return real_query(st);
}

/* Rank me of {0, 1} on its own host: rank 0 makes the id (writes it on
 * idfd), rank 1 reads it (idfd), opens the session and waits to be
 * killed; rank 0 sends to it and kills it (peer) mid-group. */
int
dead_peer_child(int32_t me, int idfd, pid_t peer)
{
	int32_t world[2] = {0, 1};
	uint8_t id[512];
	size_t idlen = sizeof(id);
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	if ((x = child_start("dead", me, &a)) == NULL)
		return 1;
	refit_err_clear(&err);
	bad += share_id(x, me, &idfd, 1, idfd, id, &idlen);
	s = session(x, 1, world, 2, &me, 1, id, idlen, &err);
	EXPECT(s != NULL, "dead-peer rank %d: communicators of 2: %s", me, err.msg);
	if (me == 1) {
		for (;;)      /* killed by rank 0 */
			pause();
	}
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint64_t n = 1 << 20;
		uint8_t *buf = dev->alloc(dev->ctx, 0, n);
		xport_op_t op = {true, 0, 1, buf, n};
		refit_status_t rc;
		const char *says;

		EXPECT(buf != NULL, "cudaMalloc");
		real_query = a->cudaStreamQuery;
		a->cudaStreamQuery = query_after_death;
		kill_on_query = peer;
		rc = group_run(s, &op, 1, &err);
		a->cudaStreamQuery = real_query;
		EXPECT(kill_on_query == 0, "the group never queried its stream");
		/* the emulator's own text too, through ncclGetLastError: the
		 * connection to rank 1 closed, or rank 1 could not be reached */
		says = strstr(err.msg, "NCCL's last error: ");
		EXPECT(rc == REFIT_ERR_NCCL && strstr(err.msg, "sends to rank 1") &&
		       strstr(err.msg, "remote process exited") && says &&
		       strstr(says, "rank 1"), "a send to a peer killed "
		       "mid-group: %s (%s)", rc == REFIT_OK ? "done" : "failed", err.msg);
		/* freed although the communicators are gone (the counters check) */
		dev->free(dev->ctx, 0, buf);
		xport_nccl_ops.close(s);
	}
	xport_nccl_ops.stop(x);
	bad += emu_check("the sender of a dead peer");
	return bad ? 1 : 0;
}

/* ---- 8b. the staging budget ---------------------------------------------------------- */

/*
 * A rank's staging comes from one arena of gpu_staging_budget_bytes (16 MiB
 * here): a session whose messages exceed it is refused at open, naming the
 * key; inside one, what does not fit at once fails at the next sync naming
 * the budget; given back, the free ranges merge (16 MiB fits again).
 */
int
staging_budget(void)
{
	int32_t me = 0;
	xport_cfg_t xc = {"", "gpu-test-budget", &me, 1, "0", 16u << 20, NULL, NULL, NULL, false,
			  NULL, NULL};
	xport_peer_t self = {"gpu-test-budget", "nccl", true, true, 4 << 20};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = 1, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 4 << 20, .abort = &no_abort};
	xport_t *x = NULL;
	xport_session_t *s = NULL;
	const dp_dev_ops_t *dev;
	uint8_t id[512], *p8, *p9, *p16;
	size_t idlen = sizeof(id);
	xport_world_t w = {1, &me, 1, &me, 1, id, 0, NULL, NULL, NULL, 0};
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	if (xport_nccl_ops.start(&xc, &x, &err) != REFIT_OK ||
	    xport_nccl_ops.unique_id(x, id, &idlen, &err) != REFIT_OK) {
		EXPECT(0, "start: %s", err.msg);
		return bad;
	}
	w.id_len = idlen;
	s = session(x, 1, &me, 1, &me, 1, id, idlen, &err);   /* 1 GiB messages */
	EXPECT(s == NULL && strstr(err.msg, "gpu_staging_budget_bytes 16777216"),
	       "a session of 1 GiB messages on a 16 MiB budget: %s", s ? "opened" : err.msg);
	refit_err_clear(&err);
	xport_nccl_ops.set_world(x, &w);
	sc.deadline_ms = xport_now_ms() + session_ms;
	/* a plan whose groups need 20 MiB at once on rank 0 (slice.c: the
	 * whole plan's staging), messages of 4 MiB: refused at open */
	sc.staging_need = 20u << 20;
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_ERR_LIMIT &&
	       strstr(err.msg, "needs 20971520 bytes of GPU staging at once on rank 0") &&
	       strstr(err.msg, "gpu_staging_budget_bytes 16777216") &&
	       strstr(err.msg, "before anything was allocated"),
	       "a plan needing 20 MiB at once on a 16 MiB budget: %s", s ? "opened" : err.msg);
	if (s) {
		xport_nccl_ops.close(s);
		s = NULL;
	}
	sc.staging_need = 16u << 20;   /* exactly the budget: runs */
	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_OK, "open: %s", err.msg);
	if (s == NULL)
		goto out;
	dev = xport_nccl_ops.dev(s);
	p8 = dev->alloc(dev->ctx, 0, 8 << 20);
	p9 = dev->alloc(dev->ctx, 0, 9 << 20);
	EXPECT(p8 != NULL && p9 == NULL, "8 MiB then 9 MiB of a 16 MiB arena: %p %p",
	       (void *)p8, (void *)p9);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_ERR_NOMEM &&
	       strstr(err.msg, "gpu_staging_budget_bytes 16777216") &&
	       strstr(err.msg, "8388608 in use"), "the failed allocation at sync: %s", err.msg);
	dev->free(dev->ctx, 0, p8);
	xport_nccl_ops.close(s);
	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_OK, "open again: %s", err.msg);
	if (s == NULL)
		goto out;
	dev = xport_nccl_ops.dev(s);
	p16 = dev->alloc(dev->ctx, 0, 16 << 20);
	EXPECT(p16 != NULL, "the whole arena after everything was given back");
	dev->free(dev->ctx, 0, p16);
	xport_nccl_ops.close(s);
out:
	xport_nccl_ops.stop(x);
	return bad;
}

/* ---- 8c. an abort that never returns (emulator: REFIT_EMU_HANG_ABORT) ----------------- */

/*
 * A group aborted by its session's abort flag: the communicators are
 * aborted, and that ncclCommAbort never returns (a stuck proxy or device).
 * The transport waits 10 s for it on a thread of its own, then returns the
 * group's failure and poisons the node (the next session refused, naming
 * the abort); before, the pool thread waited in ncclCommAbort forever.
 */
int
hang_abort_child(void)
{
	int32_t me = 0;
	uint8_t *buf;
	atomic_int stop = 0;
	xport_peer_t self = {"gpu-test-hangabort", "nccl", true, true, 1 << 20};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = 1, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 1 << 20, .abort = &stop};
	xport_session_t *s = NULL;
	const dp_dev_ops_t *dev;
	gpu_api_t *a;
	xport_t *x;
	refit_err_t err;
	char why[REFIT_ERR_MSG_MAX];
	int64_t t0;
	int bad = 0;

	setenv("REFIT_EMU_HANG_ABORT", "1", 1);
	if ((x = child_start("hangabort", me, &a)) == NULL)
		return 1;
	refit_err_clear(&err);
	if (alone_world(x, &err) != REFIT_OK)
		return 1;
	sc.deadline_ms = xport_now_ms() + session_ms;
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_OK, "open: %s", err.msg);
	if (s == NULL)
		return 1;
	dev = xport_nccl_ops.dev(s);
	buf = dev->alloc(dev->ctx, 0, 4096);
	EXPECT(buf != NULL, "staging");
	{
		xport_op_t op = {true, 0, 0, buf, 4096};   /* a send to itself, never received */

		atomic_store(&stop, 1);
		t0 = xport_now_ms();
		EXPECT(group_run(s, &op, 1, &err) != REFIT_OK, "the aborted group succeeded");
		EXPECT(xport_now_ms() - t0 < 30000, "the abort held the caller %lld ms",
		       (long long)(xport_now_ms() - t0));
	}
	EXPECT(xport_nccl_ops.poisoned(x, why, sizeof(why)) != XPORT_POISON_NONE &&
	       strstr(why, "ncclCommAbort did not return"), "poisoned: %s", why);
	xport_nccl_ops.close(s);
	s = NULL;
	atomic_store(&stop, 0);
	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) != REFIT_OK && strstr(err.msg, "poisoned"),
	       "the next session: %s", s ? "opened" : err.msg);
	return bad ? 1 : 0;   /* no stop: the abandoned abort holds its communicator */
}

#endif
