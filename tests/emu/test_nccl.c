/*
 * test_nccl.c - rule tests of the emulated NCCL: ids, init, shrink, groups,
 * send/recv matching, abort, errors (see README.md).
 */
#include "tests/emu/test_emu.h"

/* ---- NCCL ---------------------------------------------------------------------------------- */

/* n ranks of one communicator in this process, rank i on device i */

static void
make_comms(int n, ncclComm_t *c, bool blocking)
{
	ncclUniqueId id;
	ncclConfig_t cfg = nonblocking();

	cfg.blocking = blocking;
	NC(ncclGetUniqueId(&id));
	NC(ncclGroupStart());
	for (int i = 0; i < n; i++) {
		CU(cudaSetDevice(i));
		NC(ncclCommInitRankConfig(&c[i], n, id, i, &cfg));
	}
	NC(ncclGroupEnd());
	for (int i = 0; i < n; i++)
		CK(wait_comm(c[i], 20000) == ncclSuccess, "init of rank %d", i);
}

static cudaStream_t
stream_on(int dev)
{
	CU(cudaSetDevice(dev));
	return stream_nb();
}

static void *
dev_buf(int dev, size_t n, unsigned seed)
{
	uint8_t *h = malloc(n);
	void *d;

	fill(h, n, seed);
	CU(cudaSetDevice(dev));
	CU(cudaMalloc(&d, n));
	CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
	free(h);
	return d;
}

static int id_pipe[2];

/* Ranks 0 and 1 of fn, each in its own process on its host, sharing id_pipe;
 * both must exit 0. */
static void
run_pair(void (*fn)(int), const char *host0, const char *host1)
{
	pid_t a, b;

	CK(pipe(id_pipe) == 0, "pipe");
	a = spawn(fn, 0, host0);
	b = spawn(fn, 1, host1);
	reap_ok(a);
	reap_ok(b);
}

static size_t
xsize(int from, int to)
{
	return 1000 + 37 * (size_t)from + 11 * (size_t)to;
}

/* Ranks 2*proc and 2*proc+1 on devices 0 and 1 of host "host<proc>": each
 * sends a distinct pattern to every rank (itself too), all in one group. */

static void
exchange_proc(int proc)
{
	enum { R = 4 };
	ncclUniqueId id;
	ncclComm_t comm[2];
	cudaStream_t s[2];
	uint8_t *sb[2][R], *rb[2][R];
	ncclConfig_t cfg = nonblocking();

	if (proc == 0) {
		NC(ncclGetUniqueId(&id));
		put(id_pipe[1], &id, sizeof(id));
	} else {
		get(id_pipe[0], &id, sizeof(id));
	}
	NCIS(ncclGroupStart(), ncclSuccess);
	for (int l = 0; l < 2; l++) {
		int me = proc * 2 + l;

		s[l] = stream_on(l);
		for (int p = 0; p < R; p++) {
			sb[l][p] = dev_buf(l, xsize(me, p), (unsigned)(me * 16 + p));
			rb[l][p] = dev_buf(l, xsize(p, me), 0);
		}
		CU(cudaSetDevice(l));
		NCIS(ncclCommInitRankConfig(&comm[l], R, id, me, &cfg), ncclSuccess);
		CK(comm[l] != NULL, "no handle while in progress");
	}
	NCIS(ncclGroupEnd(), ncclInProgress);
	for (int l = 0; l < 2; l++)
		CK(wait_comm(comm[l], 20000) == ncclSuccess, "init of rank %d", proc * 2 + l);
	NCIS(ncclGroupStart(), ncclSuccess);
	for (int l = 0; l < 2; l++)
		for (int p = 0; p < R; p++) {
			int me = proc * 2 + l;

			NC(ncclSend(sb[l][p], xsize(me, p), ncclUint8, p, comm[l], s[l]));
			NC(ncclRecv(rb[l][p], xsize(p, me), ncclUint8, p, comm[l], s[l]));
		}
	NCIS(ncclGroupEnd(), ncclInProgress);
	for (int l = 0; l < 2; l++) {
		CK(wait_comm(comm[l], 20000) == ncclSuccess, "launch");
		CU(cudaStreamSynchronize(s[l]));
	}
	for (int l = 0; l < 2; l++)
		for (int p = 0; p < R; p++) {
			int me = proc * 2 + l;
			size_t n = xsize(p, me);
			uint8_t *got = malloc(n), *want = malloc(n);

			fill(want, n, (unsigned)(p * 16 + me));
			CU(cudaSetDevice(l)); /* the copy runs on the current device */
			CU(cudaMemcpy(got, rb[l][p], n, cudaMemcpyDeviceToHost));
			CK(memcmp(got, want, n) == 0, "rank %d from rank %d: bytes differ", me, p);
			free(got);
			free(want);
		}
	for (int l = 0; l < 2; l++) {
		NCIS(ncclCommDestroy(comm[l]), ncclSuccess);
		NCIS(ncclCommDestroy(comm[l]), ncclInvalidArgument); /* twice */
	}
	CK(counters().comms_live == 0 && counters().ids_unconsumed == 0, "comms %lld ids %lld",
	   (long long)counters().comms_live, (long long)counters().ids_unconsumed);
	CK(counters().pair_bytes[0][1] > 0 && counters().pair_bytes[1][0] > 0, "pair bytes");
}

static void
t_nccl_exchange_4_ranks_2_processes(void)
{
	run_pair(exchange_proc, "host0", "host1");
}

static void
late_joiner(int arg)
{
	ncclUniqueId id;
	ncclComm_t c;

	(void)arg;
	get(id_pipe[0], &id, sizeof(id));
	NCIS(ncclCommInitRankConfig(&c, 2, id, 1, NULL), ncclSuccess); /* blocking */
	NCIS(ncclCommDestroy(c), ncclSuccess);
}

static void
t_nccl_nonblocking_init(void)
{
	ncclUniqueId id;
	ncclComm_t c = NULL;
	ncclConfig_t cfg = nonblocking(), bad = nonblocking();
	ncclResult_t st;
	int n;
	void *buf;
	cudaStream_t s;
	pid_t pid;

	CK(pipe(id_pipe) == 0, "pipe");
	pid = spawn(late_joiner, 0, "hostB"); /* before this process starts the emulator */
	s = stream_on(0);
	buf = dev_buf(0, 64, 1);
	NC(ncclGetUniqueId(&id));
	bad.magic = 0;
	NCIS(ncclCommInitRankConfig(&c, 2, id, 0, &bad), ncclInvalidArgument);
	NCIS(ncclCommInitRankConfig(&c, 2, id, 2, &cfg), ncclInvalidArgument);
	NCIS(ncclCommInitRankConfig(&c, 2, id, 0, &cfg), ncclInProgress);
	CK(c != NULL, "the handle must be valid at once");
	NCIS(ncclCommGetAsyncError(c, &st), ncclSuccess);
	CK(st == ncclInProgress, "state %d", st);
	/* not ready: every use is refused, destroy too */
	NCIS(ncclCommDestroy(c), ncclInvalidArgument);
	NCIS(ncclSend(buf, 64, ncclUint8, 1, c, s), ncclInvalidArgument);
	NCIS(ncclCommCount(c, &n), ncclInvalidArgument);
	NCIS(ncclCommGetAsyncError(NULL, &st), ncclInvalidArgument);
	/* NCCL 2.28: the refused destroy left this thread inside a group */
	NCIS(ncclGroupEnd(), ncclSuccess);
	NCIS(ncclGroupEnd(), ncclInvalidUsage);
	CK(wait_comm(c, 300) == ncclInProgress, "ready before the other rank joined");
	put(id_pipe[1], &id, sizeof(id));
	CK(wait_comm(c, 20000) == ncclSuccess, "init");
	NCIS(ncclCommCount(c, &n), ncclSuccess);
	CK(n == 2, "count %d", n);
	NCIS(ncclCommDestroy(c), ncclSuccess);
	NCIS(ncclCommGetAsyncError(c, &st), ncclInvalidArgument); /* a dead handle */
	reap_ok(pid);
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
}

/* As NCCL's (its bootstrap ring allgather follows the root's answers): no
 * rank's init completes before every rank has its answer -- the root's
 * process, which may end once its own init did, must not cut another's. */
static void
t_nccl_init_completes_together(void)
{
	ncclUniqueId id;
	ncclComm_t c = NULL;
	ncclConfig_t cfg = nonblocking();
	char hold[300], held[310];
	struct stat st;
	int64_t t0;
	pid_t pid;
	int fd;

	snprintf(hold, sizeof(hold), "%s/hold.%d", tdir, (int)getpid());
	snprintf(held, sizeof(held), "%s.held", hold);
	CK(setenv("REFIT_EMU_HOLD_ACK", hold, 1) == 0, "setenv");
	CK(pipe(id_pipe) == 0, "pipe");
	pid = spawn(late_joiner, 0, "hostB"); /* holds its acknowledgement */
	CK(unsetenv("REFIT_EMU_HOLD_ACK") == 0, "unsetenv");
	CU(cudaSetDevice(0));
	NC(ncclGetUniqueId(&id));
	NCIS(ncclCommInitRankConfig(&c, 2, id, 0, &cfg), ncclInProgress);
	put(id_pipe[1], &id, sizeof(id));
	t0 = now_ms();
	while (stat(held, &st) != 0 && now_ms() - t0 < 60000)
		usleep(5000);
	CK(stat(held, &st) == 0, "rank 1 never had its answer (no %s)", held);
	/* rank 0 had its answer before rank 1 (the root answers in rank order) */
	CK(wait_comm(c, 300) == ncclInProgress, "rank 0's init completed while rank 1 "
	   "had not yet acknowledged its answer");
	CK((fd = open(hold, O_WRONLY | O_CREAT, 0600)) >= 0, "creating %s", hold);
	close(fd);
	CK(wait_comm(c, 20000) == ncclSuccess, "init");
	NCIS(ncclCommDestroy(c), ncclSuccess);
	reap_ok(pid);
	unlink(hold);
	unlink(held);
}

static void
t_nccl_unconsumed_id(void)
{
	ncclUniqueId a, b;
	ncclComm_t c;
	char path[300];
	struct stat st;

	NC(ncclGetUniqueId(&a));
	NC(ncclGetUniqueId(&b));
	CK(counters().ids_unconsumed == 2, "ids %lld", (long long)counters().ids_unconsumed);
	snprintf(path, sizeof(path), "%s/r.%d.1.sock", tdir, (int)getpid());
	CK(stat(path, &st) == 0, "the root socket %s of the second id is not there", path);
	NCIS(ncclCommInitRank(&c, 1, a, 0), ncclSuccess);
	CK(counters().ids_unconsumed == 1, "ids %lld", (long long)counters().ids_unconsumed);
	CK(stat(path, &st) == 0, "the unconsumed root went away");
	NCIS(ncclCommDestroy(c), ncclSuccess);
}

static void
same_device_rank(int rank)
{
	ncclUniqueId id;
	ncclComm_t c;
	ncclConfig_t cfg = nonblocking();

	if (rank == 0) {
		NC(ncclGetUniqueId(&id));
		put(id_pipe[1], &id, sizeof(id));
		put(id_pipe[1], &id, sizeof(id));
	}
	get(id_pipe[0], &id, sizeof(id));
	CU(cudaSetDevice(3));
	NC(ncclCommInitRankConfig(&c, 2, id, rank, &cfg));
	CK(wait_comm(c, 20000) == ncclInvalidUsage, "two ranks on one device were accepted");
	NCIS(ncclCommDestroy(c), ncclInvalidUsage); /* an error: abort it */
	NCIS(ncclGroupEnd(), ncclSuccess);         /* and close the group it left open */
	NCIS(ncclCommAbort(c), ncclSuccess);
	CK(counters().comms_live == 0, "comms");
}

static void
t_nccl_two_ranks_one_device(void)
{
	run_pair(same_device_rank, "hostA", "hostA");
}

static void
mismatch_case(size_t scount, ncclDataType_t st, size_t rcount, ncclDataType_t rt)
{
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	void *b0 = dev_buf(0, 1024, 1), *b1 = dev_buf(1, 1024, 2);
	ncclResult_t r0, r1;

	make_comms(2, c, true);
	NC(ncclGroupStart());
	NC(ncclSend(b0, scount, st, 1, c[0], s0));
	NC(ncclRecv(b1, rcount, rt, 0, c[1], s1));
	NC(ncclGroupEnd());
	CK(wait_stream(s0, 20000) == cudaSuccess && wait_stream(s1, 20000) == cudaSuccess,
	   "the mismatched operations did not end");
	NCIS(ncclCommGetAsyncError(c[0], &r0), ncclSuccess);
	NCIS(ncclCommGetAsyncError(c[1], &r1), ncclSuccess);
	CK(r0 == ncclInvalidUsage && r1 == ncclInvalidUsage, "sender %d receiver %d", r0, r1);
	CK(strstr(ncclGetLastError(NULL), "differ") != NULL, "message: %s",
	   ncclGetLastError(NULL));
	NCIS(ncclCommDestroy(c[0]), ncclInvalidUsage);
	NCIS(ncclGroupEnd(), ncclSuccess); /* the group the refused destroy left open */
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	NCIS(ncclCommAbort(c[1]), ncclSuccess);
}

static void
t_nccl_mismatch_fails_both(void)
{
	mismatch_case(100, ncclUint8, 200, ncclUint8);   /* sizes */
	mismatch_case(100, ncclUint8, 25, ncclInt32);    /* same bytes, datatypes */
	CK(counters().comms_live == 0, "comms");
}

/* one send of 256 bytes from a0 (device 0) to a1 (device 1); the two ranks' errors */
static void
reg_pair(ncclComm_t *c, void *a0, void *a1, ncclResult_t *r0, ncclResult_t *r1)
{
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);

	NC(ncclGroupStart());
	NC(ncclSend(a0, 256, ncclUint8, 1, c[0], s0));
	NC(ncclRecv(a1, 256, ncclUint8, 0, c[1], s1));
	NC(ncclGroupEnd());
	CK(wait_stream(s0, 20000) == cudaSuccess && wait_stream(s1, 20000) == cudaSuccess,
	   "the operations did not end");
	NCIS(ncclCommGetAsyncError(c[0], r0), ncclSuccess);
	NCIS(ncclCommGetAsyncError(c[1], r1), ncclSuccess);
}

/*
 * ncclMemAlloc / ncclCommRegister (emu_reg.c): registration on the
 * communicator's device only; an unknown handle refused at deregistration;
 * a matched send/recv with one side registered and the other not fails
 * (NCCL leaves the mix undefined); both registered moves the bytes.
 */
static void
t_nccl_registration(void)
{
	ncclComm_t c[2];
	void *p0, *p1, *h0, *h1, *hx, *b1 = dev_buf(1, 1024, 2);
	uint8_t in[256], out[256];
	ncclResult_t r0, r1;

	CU(cudaSetDevice(0));
	NC(ncclMemAlloc(&p0, 1000));
	NCIS(ncclMemFree(b1), ncclInvalidArgument);
	CU(cudaSetDevice(1));
	NC(ncclMemAlloc(&p1, 1000));
	make_comms(2, c, true);
	NC(ncclCommRegister(c[0], p0, 1000, &h0));
	NCIS(ncclCommRegister(c[1], p0, 1000, &hx), ncclInvalidArgument); /* device 0's */
	NCIS(ncclCommDeregister(c[0], b1), ncclInvalidUsage);
	NC(ncclCommDeregister(c[0], NULL));
	reg_pair(c, p0, b1, &r0, &r1);    /* registered -> unregistered */
	CK(r1 == ncclInvalidUsage && r0 == ncclInvalidUsage, "a mixed pair: sender %d "
	   "receiver %d", r0, r1);
	CK(strstr(ncclGetLastError(NULL), "registered") != NULL || r0 != ncclSuccess,
	   "message: %s", ncclGetLastError(NULL));
	NC(ncclCommAbort(c[0]));
	NC(ncclCommAbort(c[1]));
	make_comms(2, c, true);
	NC(ncclCommRegister(c[0], p0, 1000, &h0));
	NC(ncclCommRegister(c[1], p1, 1000, &h1));
	fill(in, sizeof(in), 7);
	CU(cudaSetDevice(0));
	CU(cudaMemcpy(p0, in, sizeof(in), cudaMemcpyHostToDevice));
	reg_pair(c, p0, p1, &r0, &r1);
	CK(r0 == ncclSuccess && r1 == ncclSuccess, "both registered: %d %d", r0, r1);
	CU(cudaSetDevice(1));
	CU(cudaMemcpy(out, p1, sizeof(out), cudaMemcpyDeviceToHost));
	CK(memcmp(in, out, sizeof(in)) == 0, "the registered bytes differ");
	NC(ncclCommDeregister(c[0], h0));
	NCIS(ncclCommDeregister(c[0], h0), ncclInvalidUsage);   /* its last reference went */
	NC(ncclCommDestroy(c[0]));
	NC(ncclCommDestroy(c[1]));   /* drops h1 itself (ncclRegCleanup) */
	NC(ncclMemFree(p1));
	CU(cudaSetDevice(0));
	NC(ncclMemFree(p0));
	CU(cudaFree(b1));
}

static void
t_nccl_unmatched_blocks_until_abort(void)
{
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	void *b0 = dev_buf(0, 256, 1), *b1 = dev_buf(1, 256, 1);
	ncclResult_t r;

	make_comms(2, c, false);
	NCIS(ncclSend(b0, 256, ncclUint8, 1, c[0], s0), ncclInProgress); /* no receive */
	CK(wait_comm(c[0], 20000) == ncclSuccess, "launch");
	CK(wait_stream(s0, 500) == cudaErrorNotReady, "an unmatched send completed");
	NCIS(ncclCommGetAsyncError(c[0], &r), ncclSuccess);
	CK(r == ncclSuccess, "error %d while waiting", r);
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	CK(wait_stream(s0, 10000) == cudaSuccess, "abort did not release the stream");
	/* a receive that nobody sends to, released the same way (rank 0's
	 * announced send would match a receive from rank 0: take one from
	 * rank 1 itself, which never sends) */
	NCIS(ncclRecv(b1, 256, ncclUint8, 1, c[1], s1), ncclInProgress);
	CK(wait_comm(c[1], 20000) == ncclSuccess, "launch");
	CK(wait_stream(s1, 500) == cudaErrorNotReady, "an unmatched receive completed");
	NCIS(ncclCommAbort(c[1]), ncclSuccess);
	CK(wait_stream(s1, 10000) == cudaSuccess, "abort did not release the receive");
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
	CU(cudaSetDevice(0));
	CU(cudaFree(b0));
}

static void
t_nccl_shrink(void)
{
	ncclComm_t c[3], n0 = (ncclComm_t)1, n1 = (ncclComm_t)1;
	ncclConfig_t cfg = nonblocking();
	int ex[1] = {2}, self[1] = {0};
	ncclResult_t st;
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	uint8_t *b0 = dev_buf(0, 512, 5), *b1 = dev_buf(1, 512, 0), got[512], want[512];

	make_comms(3, c, false);
	NCIS(ncclCommShrink(c[0], self, 1, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], ex, 0, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], ex, 1, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInProgress);
	CK(n0 == NULL, "newcomm is published before the shrink completed");
	NCIS(ncclCommGetAsyncError(c[0], &st), ncclSuccess);
	CK(st == ncclInProgress, "parent state %d during the shrink", st);
	NCIS(ncclCommDestroy(c[0]), ncclInvalidArgument);
	NCIS(ncclGroupEnd(), ncclSuccess); /* the group the refused destroy left open */
	CK(wait_comm(c[0], 300) == ncclInProgress, "a shrink completed without rank 1");
	CK(n0 == NULL, "newcomm published without rank 1");
	NCIS(ncclCommShrink(c[1], ex, 1, &n1, &cfg, NCCL_SHRINK_DEFAULT), ncclInProgress);
	CK(wait_comm(c[0], 20000) == ncclSuccess && wait_comm(c[1], 20000) == ncclSuccess,
	   "parents");
	CK(n0 != NULL && n1 != NULL, "newcomm %p %p", (void *)n0, (void *)n1);
	CK(wait_comm(n0, 20000) == ncclSuccess && wait_comm(n1, 20000) == ncclSuccess, "new");
	{
		int n = 0, r = -1;

		NCIS(ncclCommCount(n1, &n), ncclSuccess);
		NCIS(ncclCommUserRank(n1, &r), ncclSuccess);
		CK(n == 2 && r == 1, "count %d rank %d", n, r);
	}
	NCIS(ncclSend(b0, 512, ncclUint8, 1, n0, s0), ncclInProgress);
	NCIS(ncclRecv(b1, 512, ncclUint8, 0, n1, s1), ncclInProgress);
	/* non-blocking: queued on the streams only once no longer in progress */
	CK(wait_comm(n0, 20000) == ncclSuccess && wait_comm(n1, 20000) == ncclSuccess, "launch");
	CU(cudaStreamSynchronize(s0));
	CU(cudaStreamSynchronize(s1));
	CU(cudaMemcpy(got, b1, 512, cudaMemcpyDeviceToHost));
	fill(want, 512, 5);
	CK(memcmp(got, want, 512) == 0, "bytes over the shrunk communicator differ");
	for (int i = 0; i < 3; i++)
		NCIS(ncclCommDestroy(c[i]), ncclSuccess);
	NCIS(ncclCommDestroy(n0), ncclSuccess);
	NCIS(ncclCommDestroy(n1), ncclSuccess);
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
}

/* Two blocking ranks on devices 0 and 1, a stream on device 0 and 64 bytes
 * on device buf_dev, for one send from rank 0 to rank 1. */
typedef struct send_pair {
	ncclComm_t c[2];
	cudaStream_t s0;
	void *buf;
} send_pair_t;

static send_pair_t
send_pair(int buf_dev)
{
	send_pair_t p;

	p.s0 = stream_on(0);
	p.buf = dev_buf(buf_dev, 64, 1);
	make_comms(2, p.c, true);
	return p;
}

static void
t_nccl_buffer_of_another_device(void)
{
	send_pair_t p = send_pair(1);
	ncclResult_t r;

	NCIS(ncclSend(p.buf, 64, ncclUint8, 1, p.c[0], p.s0), ncclSuccess);
	CUIS(cudaStreamSynchronize(p.s0), cudaErrorIllegalAddress);
	NCIS(ncclCommGetAsyncError(p.c[0], &r), ncclSuccess);
	CK(r == ncclUnhandledCudaError, "async %d", r);
	NCIS(ncclCommAbort(p.c[0]), ncclSuccess);
	NCIS(ncclCommAbort(p.c[1]), ncclSuccess);
}

static void
t_nccl_stream_of_another_device(void)
{
	ncclComm_t c[2];
	cudaStream_t s1 = stream_on(1);
	void *b = dev_buf(0, 64, 1), *h = malloc(64);

	make_comms(2, c, true);
	NCIS(ncclSend(b, 64, ncclUint8, 1, c[0], s1), ncclInvalidArgument);
	NCIS(ncclSend(b, 64, (ncclDataType_t)99, 1, c[0], s1), ncclInvalidArgument);
	NCIS(ncclSend(b, 64, ncclUint8, 2, c[0], s1), ncclInvalidArgument);
	CU(cudaGetLastError());
	/* a host buffer: a kernel would fault */
	NCIS(ncclSend(h, 64, ncclUint8, 1, c[1], s1), ncclSuccess);
	CUIS(cudaStreamSynchronize(s1), cudaErrorIllegalAddress);
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	NCIS(ncclCommAbort(c[1]), ncclSuccess);
	free(h);
}

static void
t_nccl_group_in_progress_until_launched(void)
{
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	uint8_t *b0 = dev_buf(0, 128, 4), *b1 = dev_buf(1, 128, 0), got[128], want[128];
	ncclResult_t st;

	/* REFIT_EMU_DELAY_US=1000000: the launch takes that long */
	make_comms(2, c, false);
	NCIS(ncclGroupStart(), ncclSuccess);
	NC(ncclSend(b0, 128, ncclUint8, 1, c[0], s0));
	NC(ncclRecv(b1, 128, ncclUint8, 0, c[1], s1));
	NCIS(ncclGroupEnd(), ncclInProgress);
	NCIS(ncclCommGetAsyncError(c[0], &st), ncclSuccess);
	CK(st == ncclInProgress, "state %d right after ncclGroupEnd", st);
	/* the trap: the stream is still empty */
	CU(cudaStreamQuery(s0));
	NCIS(ncclSend(b0, 128, ncclUint8, 1, c[0], s0), ncclInvalidArgument);
	CK(wait_comm(c[0], 20000) == ncclSuccess && wait_comm(c[1], 20000) == ncclSuccess, "after the launch");
	CU(cudaStreamSynchronize(s1));
	CU(cudaMemcpy(got, b1, 128, cudaMemcpyDeviceToHost));
	fill(want, 128, 4);
	CK(memcmp(got, want, 128) == 0, "bytes");
	NCIS(ncclCommDestroy(c[0]), ncclSuccess);
	NCIS(ncclCommDestroy(c[1]), ncclSuccess);
}

static void
dying_peer(int rank)
{
	ncclUniqueId id;
	ncclComm_t c;
	cudaStream_t s = stream_on(rank);
	void *b = dev_buf(rank, 64, 1);
	ncclResult_t r;

	if (rank == 0) {
		NC(ncclGetUniqueId(&id));
		put(id_pipe[1], &id, sizeof(id));
	} else {
		get(id_pipe[0], &id, sizeof(id));
	}
	NCIS(ncclCommInitRank(&c, 2, id, rank), ncclSuccess);
	if (rank == 1) {
		NCIS(ncclSend(b, 64, ncclUint8, 0, c, s), ncclSuccess);
		CU(cudaStreamSynchronize(s));
		_exit(0); /* dies with its communicator */
	}
	NCIS(ncclRecv(b, 64, ncclUint8, 1, c, s), ncclSuccess);
	NCIS(ncclRecv(b, 64, ncclUint8, 1, c, s), ncclSuccess);
	CK(wait_stream(s, 20000) == cudaSuccess, "the receive from a dead peer never ended");
	NCIS(ncclCommGetAsyncError(c, &r), ncclSuccess);
	CK(r == ncclRemoteError, "async %d", r);
	NCIS(ncclCommAbort(c), ncclSuccess);
}

static void
t_nccl_peer_death_remote_error(void)
{
	run_pair(dying_peer, "hostA", "hostB");
}

static void
t_nccl_abort_during_init(void)
{
	ncclUniqueId id;
	ncclComm_t c;
	ncclConfig_t cfg = nonblocking();

	NC(ncclGetUniqueId(&id));
	NCIS(ncclCommInitRankConfig(&c, 2, id, 0, &cfg), ncclInProgress); /* rank 1 never comes */
	CK(wait_comm(c, 200) == ncclInProgress, "init finished alone");
	NCIS(ncclCommAbort(c), ncclSuccess);
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
	CK(counters().ids_unconsumed == 1, "the root must still wait (NCCL leaks it too)");
}

static void
exporter_of_id(int arg)
{
	ncclUniqueId id;

	(void)arg;
	NC(ncclGetUniqueId(&id));
	put(id_pipe[1], &id, sizeof(id));
	exit(0);
}

/*
 * A refused ncclCommDestroy (an asynchronous error here) leaves the thread
 * inside a group in NCCL 2.28 (it opens one and returns without closing
 * it): a send posted next is held until the thread's next ncclGroupEnd,
 * which closes that group and runs it.  NCCL 2.27 opened none.
 */
static void
destroy_refused(bool leaves_group)
{
	ncclComm_t c[2], g[2];
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	void *b0 = dev_buf(0, 64, 1), *b1 = dev_buf(1, 64, 2);
	ncclResult_t r;

	make_comms(2, c, true);
	make_comms(2, g, true);
	NC(ncclGroupStart());
	NC(ncclSend(b0, 64, ncclUint8, 1, c[0], s0));
	NC(ncclRecv(b1, 32, ncclUint8, 0, c[1], s1));
	NC(ncclGroupEnd());
	CK(wait_stream(s0, 20000) == cudaSuccess && wait_stream(s1, 20000) == cudaSuccess,
	   "the mismatched operations did not end");
	CK(wait_comm(c[0], 20000) == ncclInvalidUsage, "no mismatch error");
	NCIS(ncclCommDestroy(c[0]), ncclInvalidUsage);
	if (leaves_group) {
		uint8_t want[64], got[64];

		fill(want, 64, 1);
		NCIS(ncclSend(b0, 64, ncclUint8, 1, g[0], s0), ncclSuccess);
		NCIS(ncclRecv(b1, 64, ncclUint8, 0, g[1], s1), ncclSuccess);
		CK(wait_stream(s1, 20000) == cudaSuccess, "stream");
		CU(cudaSetDevice(1));
		CU(cudaMemcpy(got, b1, 64, cudaMemcpyDeviceToHost));
		CK(memcmp(got, want, 64) != 0, "the receive ran inside the group left open");
		NCIS(ncclGroupEnd(), ncclSuccess); /* closes it: now they run */
		CK(wait_stream(s0, 20000) == cudaSuccess && wait_stream(s1, 20000) == cudaSuccess,
		   "the held send/recv did not end after ncclGroupEnd");
		CU(cudaMemcpy(got, b1, 64, cudaMemcpyDeviceToHost));
		CK(memcmp(got, want, 64) == 0, "the held receive did not run after ncclGroupEnd");
		NCIS(ncclCommGetAsyncError(g[0], &r), ncclSuccess);
		CK(r == ncclSuccess, "state %d", r);
	}
	NCIS(ncclGroupEnd(), ncclInvalidUsage);
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	NCIS(ncclCommAbort(c[1]), ncclSuccess);
	NCIS(ncclCommDestroy(g[0]), ncclSuccess);
	NCIS(ncclCommDestroy(g[1]), ncclSuccess);
}

static void
t_nccl_destroy_refused_leaves_group(void)
{
	destroy_refused(true);
}

static void
t_nccl_destroy_refused_227_no_group(void)
{
	destroy_refused(false);
}

/* 2.27.6 already opens the group (v2.27.6-1 init.cc), as 2.28 */
static void
t_nccl_destroy_refused_2276_leaves_group(void)
{
	destroy_refused(true);
}

/* REFIT_EMU_NCCL_VERSION: what ncclGetVersion says (refitd's minimum check) */
static void
t_nccl_version_env(void)
{
	int v = 0;

	NCIS(ncclGetVersion(&v), ncclSuccess);
	CK(v == 22610, "version %d with REFIT_EMU_NCCL_VERSION=22610", v);
}

static void
t_nccl_argument_errors(void)
{
	ncclComm_t c[3], n = NULL, x;
	ncclUniqueId junk;
	int v = 0, dup[2] = {2, 2}, far[1] = {7}, all[2] = {1, 2};
	ncclConfig_t cfg = nonblocking();

	NCIS(ncclGetVersion(&v), ncclSuccess);
	CK(v == 22809, "version %d", v);
	memset(&junk, 0x42, sizeof(junk));
	NCIS(ncclCommInitRankConfig(&x, 2, junk, 0, NULL), ncclInvalidArgument);
	NCIS(ncclCommInitRankConfig(NULL, 2, junk, 0, NULL), ncclInvalidArgument);
	cfg.blocking = 5;
	NCIS(ncclCommInitRankConfig(&x, 1, junk, 0, &cfg), ncclInvalidArgument);
	make_comms(3, c, true);
	NCIS(ncclCommShrink(c[0], dup, 2, &n, NULL, 0), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], far, 1, &n, NULL, 0), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], all, 2, NULL, NULL, 0), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], far, 1, &n, NULL, 4), ncclInvalidArgument);
	NCIS(ncclCommCuDevice(c[2], &v), ncclSuccess);
	CK(v == 2, "device %d", v);
	NCIS(ncclCommUserRank(c[2], NULL), ncclInvalidArgument);
	NCIS(ncclSend(NULL, 4, ncclUint8, 1, c[0], NULL), ncclInvalidArgument);
	for (int i = 0; i < 3; i++)
		NCIS(ncclCommDestroy(c[i]), ncclSuccess);
	NCIS(ncclCommAbort(c[0]), ncclInvalidArgument); /* destroyed */
	NCIS(ncclCommDestroy(NULL), ncclSuccess);
	NCIS(ncclCommAbort(NULL), ncclSuccess);
	CK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0, "text");
}

static void
wrong_size_rank(int rank)
{
	ncclUniqueId id;
	ncclComm_t c;

	get(id_pipe[0], &id, sizeof(id));
	CU(cudaSetDevice(rank));
	/* claims a world of 3 where rank 0 said 2 (or joins as rank 0 again) */
	NCIS(ncclCommInitRankConfig(&c, rank == 1 ? 3 : 2, id, rank == 1 ? 1 : 0, NULL),
	     ncclInvalidUsage);
	NCIS(ncclCommAbort(c), ncclSuccess);
}

static void
t_nccl_inconsistent_ranks(void)
{
	ncclUniqueId id;
	ncclComm_t c;
	ncclConfig_t cfg = nonblocking();
	pid_t a, b;

	CK(pipe(id_pipe) == 0, "pipe");
	a = spawn(wrong_size_rank, 1, "hostB");
	b = spawn(wrong_size_rank, 2, "hostC");
	NC(ncclGetUniqueId(&id));
	NCIS(ncclCommInitRankConfig(&c, 2, id, 0, &cfg), ncclInProgress);
	usleep(100000); /* not a synchronisation: rank 0 only has to be first */
	put(id_pipe[1], &id, sizeof(id));
	put(id_pipe[1], &id, sizeof(id));
	reap_ok(a);
	reap_ok(b);
	CK(wait_comm(c, 200) == ncclInProgress, "the wrong ranks completed the world");
	NCIS(ncclCommAbort(c), ncclSuccess);
}

static void
t_nccl_root_gone(void)
{
	ncclUniqueId id;
	ncclComm_t c;
	int64_t t0;

	CK(pipe(id_pipe) == 0, "pipe");
	reap_ok(spawn(exporter_of_id, 0, NULL)); /* makes an id and exits */
	get(id_pipe[0], &id, sizeof(id));
	t0 = now_ms();
	NCIS(ncclCommInitRankConfig(&c, 2, id, 1, NULL), ncclSystemError);
	CK(now_ms() - t0 >= 5000, "gave up after %lld ms", (long long)(now_ms() - t0));
	NCIS(ncclCommAbort(c), ncclSuccess);
}

static void
t_nccl_peer_gone_before_send(void)
{
	send_pair_t p = send_pair(0);
	ncclResult_t r;

	NCIS(ncclCommDestroy(p.c[1]), ncclSuccess);
	NCIS(ncclSend(p.buf, 64, ncclUint8, 1, p.c[0], p.s0), ncclSuccess);
	CK(wait_stream(p.s0, 20000) == cudaSuccess, "a send to a destroyed peer hung");
	NCIS(ncclCommGetAsyncError(p.c[0], &r), ncclSuccess);
	CK(r == ncclRemoteError, "async %d", r);
	NCIS(ncclCommAbort(p.c[0]), ncclSuccess);
}


static void
t_nccl_shrink_abort_ends_operations(void)
{
	ncclComm_t c[3], n0 = NULL, n1 = NULL;
	int ex[1] = {2};
	cudaStream_t s0 = stream_on(0);
	void *b0 = dev_buf(0, 64, 1);

	make_comms(3, c, true);
	/* rank 0 waits for rank 2, which is leaving and never sends */
	NCIS(ncclRecv(b0, 64, ncclUint8, 2, c[0], s0), ncclSuccess);
	CK(wait_stream(s0, 300) == cudaErrorNotReady, "an unmatched receive completed");
	NC(ncclGroupStart());
	NC(ncclCommShrink(c[0], ex, 1, &n0, NULL, NCCL_SHRINK_ABORT));
	NC(ncclCommShrink(c[1], ex, 1, &n1, NULL, NCCL_SHRINK_ABORT));
	NCIS(ncclGroupEnd(), ncclSuccess); /* blocking, like the parents */
	CK(n0 && n1, "no new communicators");
	CK(wait_stream(s0, 10000) == cudaSuccess, "NCCL_SHRINK_ABORT left the receive waiting");
	NCIS(ncclSend(b0, 64, ncclUint8, 1, c[0], s0), ncclInvalidUsage);
	for (int i = 0; i < 3; i++)
		NCIS(ncclCommDestroy(c[i]), ncclSuccess);
	NCIS(ncclCommDestroy(n0), ncclSuccess);
	NCIS(ncclCommDestroy(n1), ncclSuccess);
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
}

/* An aborted parent ends its shrink in progress, which publishes its (failed)
 * new handle before the abort returns (NCCL 2.28.9 init.cc: the child's
 * abort flag, ncclGroupJobAbort, the job's exit writes *newcomm). */
static void
t_nccl_abort_parent_publishes_shrink(void)
{
	ncclComm_t c[3], n0 = (ncclComm_t)1;
	ncclConfig_t cfg = nonblocking();
	int ex[1] = {2};
	ncclResult_t st = ncclSuccess;

	make_comms(3, c, false);
	NCIS(ncclCommShrink(c[0], ex, 1, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInProgress);
	CK(wait_comm(c[0], 300) == ncclInProgress, "a shrink completed without rank 1");
	CK(n0 == NULL, "newcomm published without rank 1");
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	CK(n0 != NULL, "the aborted parent's shrink published nothing");
	if (n0 != NULL) {
		NCIS(ncclCommGetAsyncError(n0, &st), ncclSuccess);
		CK(st != ncclSuccess && st != ncclInProgress, "the new handle says %d", st);
		CK(counters().comms_live == 3, "comms %lld (2 others + the new one)",
		   (long long)counters().comms_live);
		NCIS(ncclCommAbort(n0), ncclSuccess);
	}
	NCIS(ncclCommAbort(c[1]), ncclSuccess);
	NCIS(ncclCommAbort(c[2]), ncclSuccess);
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
}

const test_t nccl_tests[] = {
	TEST(nccl_abort_parent_publishes_shrink),
	TEST(nccl_shrink_abort_ends_operations), TEST(nccl_exchange_4_ranks_2_processes),
	TEST(nccl_nonblocking_init), TEST(nccl_init_completes_together),
	TEST(nccl_unconsumed_id), TEST(nccl_two_ranks_one_device),
	TEST(nccl_mismatch_fails_both), TEST(nccl_unmatched_blocks_until_abort), TEST(nccl_shrink),
	TEST(nccl_registration),
	TEST(nccl_buffer_of_another_device), TEST(nccl_stream_of_another_device),
	TEST_ENV(nccl_group_in_progress_until_launched, "REFIT_EMU_DELAY_US=1000000"),
	TEST(nccl_peer_death_remote_error), TEST(nccl_abort_during_init),
	TEST(nccl_argument_errors), TEST_ENV(nccl_version_env, "REFIT_EMU_NCCL_VERSION=22610"),
	TEST(nccl_inconsistent_ranks), TEST(nccl_root_gone), TEST(nccl_peer_gone_before_send),
	TEST(nccl_destroy_refused_leaves_group),
	TEST_ENV(nccl_destroy_refused_227_no_group, "REFIT_EMU_NCCL_VERSION=22705"),
	TEST_ENV(nccl_destroy_refused_2276_leaves_group, "REFIT_EMU_NCCL_VERSION=22706"),
};
const size_t nnccl_tests = sizeof(nccl_tests) / sizeof(nccl_tests[0]);
