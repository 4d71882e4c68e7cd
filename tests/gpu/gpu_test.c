/*
 * gpu_test.c - the nccl transport's device code, on a real GPU
 * (tests/gpu/run.sh) or on the CUDA + NCCL emulator (tests/run-check-nccl.sh,
 * REFIT_GPU_TEST_EMU=1): the same program, the libraries chosen as refitd
 * chooses them (REFIT_CUDA_LIBRARY, REFIT_NCCL_LIBRARY, ...).
 *
 *   1. box copies: random boxes between random views -- padded rows, a
 *      strided innermost dim (the strided-copy kernel), size-1 dims,
 *      stride-0 (broadcast) source dims -- through the transport's device
 *      operations on every local rank's device, byte for byte against the
 *      host copy (dp_copy_box); every error checked at sync; and a box
 *      whose rows are 2^31 + 64 bytes apart (above CUDA's largest 2D
 *      pitch: copied row by row);
 *   2. a failed copy is reported at sync, not dropped (a 2D copy with a
 *      zero pitch, which CUDA refuses without poisoning the context);
 *   3. two local ranks on two devices (where there are two): each one's
 *      staging on its own device, a grouped send/recv between them;
 *      a delta unit between them (or to itself on one device): encoded
 *      by the delta kernels, its size message, then its bytes, decoded in
 *      place, byte-exact (issue 26);
 *   4. CUDA IPC: a child process opens an allocation through the
 *      transport (mem_open) and reads pieces at offsets inside it; wrong
 *      cuda_bytes and a wrong device are refused, also a claim that ends
 *      inside the next mapping (a second allocation, opened after the
 *      first: device memory of the same device right past the first);
 *   5. three processes, one rank each (their own NCCL_HOSTID, so on one
 *      GPU NCCL uses its network transport): a ring of sends, then one
 *      process leaves and the two others shrink their communicators
 *      (ncclCommShrink, no new unique id) and exchange again;
 *   6. a loopback communicator: 256 MiB to itself, byte-exact, GB/s;
 *   7. (emulator) the loader's fallback: on a machine without
 *      libcudart.so.13 the search loads libcudart.so.12;
 *   8. (emulator) a peer killed mid-group: the sender's group fails, naming
 *      the peer, even when its stream drained before the transport looked;
 *   9. (emulator) a destroy refused by an asynchronous error that came after
 *      the transport's check: aborted instead, no group left open;
 *  10. gpu_root_new whose second pipe fails leaves no descriptor open;
 *  11. ncclGroupStart refused (NCCL < 2.27 did, while the
 *      previous non-blocking group was launching): the group fails naming
 *      it, nothing is posted outside a group;
 *  12. a host copy that never ends (a stuck device): the call
 *      returns by the session's deadline, the communicators are aborted,
 *      the node is poisoned (refuses the next refit, keeps the memory the
 *      copy may still write), and the caller's buffer, reused after the
 *      call, is never written when the copy finally runs;
 *  13. (emulator) a shrink that fails (a survivor never shrinks: the
 *      deadline): the parent is aborted first, which ends the shrink and
 *      makes NCCL write its new communicator, then that one is aborted:
 *      no communicator is left (before, the variable NCCL writes was freed
 *      first and the new communicator never freed);
 *  14. (emulator) a kernel library bound to another CUDA runtime than the
 *      one refitd loaded (here: a copy of the emulated runtime as the
 *      runtime, the original as the kernels) is refused at load, naming
 *      both (its launches would use the other runtime's current device);
 *  15. stream ordering (gpu_order.c): a writer process's queued write, an
 *      interprocess event recorded after it; a session given the event
 *      reads the written bytes (the emulator holds the writer's stream
 *      until the reader's copy could have run).
 * On the emulator each process finally checks the emulator's counters:
 * nothing allocated, mapped, created or left unconsumed.
 *
 * Prints "gpu: N passed, N failed" last.  Exit 0: passed; 1: failed; 77:
 * skipped (built without the headers, or the libraries or a device are
 * missing: the reason is printed; tests/gpu/run.sh decides whether that
 * is a failure).
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
#include "tests/gpu/gpu_order.h"
#include "tests/gpu/gpu_test.h"

#ifndef REFIT_HAVE_NCCL
int
main(void)
{
	printf("gpu: skipped: built without the CUDA and NCCL headers\n");
	return 77;
}
#else

int passed, failed;
bool emu;


void
result(const char *name, int bad)
{
	if (bad) {
		failed++;
		printf("FAIL %s\n", name);
	} else {
		passed++;
		printf("ok   %s\n", name);
	}
	fflush(stdout);
}

atomic_int no_abort;
int64_t session_ms = 120000;   /* a session's deadline */

/* A transport serving ranks (on devices devs, "0,1": NULL = identity). */
xport_t *
start(const int32_t *ranks, size_t n, const char *devs, const char *name, refit_err_t *err)
{
	/* 3 GiB of staging: big_pitch needs 2 GiB */
	xport_cfg_t xc = {"", name, ranks, n, devs, 3ull << 30, NULL, NULL, NULL, false, NULL, NULL};
	xport_t *x = NULL;

	if (xport_nccl_ops.start(&xc, &x, err) != REFIT_OK)
		return NULL;
	return x;
}

/* A session of epoch over world (all ranks), this transport's local ranks;
 * id: NULL for none (shrink). */
xport_session_t *
session(xport_t *x, uint64_t epoch, const int32_t *world, size_t nworld,
	const int32_t *local, size_t nlocal, const uint8_t *id, size_t idlen, refit_err_t *err)
{
	xport_world_t w = {epoch, world, nworld, local, nlocal, id, id ? idlen : 0, NULL, NULL, NULL, 0};
	xport_peer_t self = {"gpu-test", "nccl", true, true, 1 << 30};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = epoch, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 1 << 30, .abort = &no_abort};
	xport_session_t *s = NULL;

	xport_nccl_ops.set_world(x, &w);
	sc.deadline_ms = xport_now_ms() + session_ms;
	if (xport_nccl_ops.open(x, &sc, &s, err) != REFIT_OK)
		return NULL;
	return s;
}

/*
 * A child process's transport for rank me, on its own host
 * (NCCL_HOSTID + suffix: on one GPU NCCL then uses its network transport
 * and refuses nothing), device 0; the loaded table in *api (a static,
 * writable: tests put their stand-ins in it).  NULL: said why.
 */
xport_t *
child_start(const char *suffix, int32_t me, gpu_api_t **api)
{
	char host[64], why[1024];
	refit_err_t err;
	xport_t *x;

	snprintf(host, sizeof(host), "%s-%s%d", getenv("NCCL_HOSTID") ? getenv("NCCL_HOSTID") :
		 "gpu-test", suffix, me);
	setenv("NCCL_HOSTID", host, 1);
	if ((*api = (gpu_api_t *)gpu_load(1, why, sizeof(why))) == NULL) {
		printf("FAIL %s rank %d: %s\n", suffix, me, why);
		return NULL;
	}
	refit_err_clear(&err);
	if ((x = start(&me, 1, "0", host, &err)) == NULL)
		printf("FAIL %s rank %d: %s\n", suffix, me, err.msg);
	return x;
}

/* Rank 0 alone on x: a fresh unique id and the world of epoch 1 holding
 * only it (the set-up of the cases whose session is one rank's). */
refit_status_t
alone_world(xport_t *x, refit_err_t *err)
{
	static const int32_t me = 0;
	uint8_t id[512];
	size_t idlen = sizeof(id);
	xport_world_t w = {1, &me, 1, &me, 1, id, 0, NULL, NULL, NULL, 0};

	CHECK(xport_nccl_ops.unique_id(x, id, &idlen, err));
	w.id_len = idlen;
	xport_nccl_ops.set_world(x, &w);
	return REFIT_OK;
}

/* ---- the emulator's counters --------------------------------------------------------- */

typedef struct emu_counters {    /* tests/emu/emu.h, REFIT_EMU_MAX_DEVICES 16 */
	int devices;
	int64_t alloc_live[16], alloc_bytes_live[16];
	int64_t ipc_open, streams_live, comms_live, ids_unconsumed;
	int64_t pair_bytes[17][17];
	char sticky[256];
} emu_counters_t;

/* On the emulator: nothing left allocated, mapped or alive in this process. */
int
emu_check(const char *who)
{
	const gpu_api_t *a = gpu_load(0, NULL, 0);
	int (*get)(emu_counters_t *);
	emu_counters_t c;
	void *h;
	int bad = 0;
	int64_t alloc = 0;

	if (!emu || a == NULL)
		return 0;
	h = dlopen(a->cuda_path, RTLD_NOW | RTLD_NOLOAD);
	*(void **)&get = h ? dlsym(h, "refitEmuGetCounters") : NULL;
	EXPECT(get != NULL, "%s: the emulator has no refitEmuGetCounters", who);
	if (get == NULL)
		return bad;
	memset(&c, 0, sizeof(c));
	EXPECT(get(&c) == 0, "refitEmuGetCounters");
	for (int d = 0; d < 16; d++)
		alloc += c.alloc_live[d];
	EXPECT(alloc == 0 && c.ipc_open == 0 && c.streams_live == 0 && c.comms_live == 0 &&
	       c.ids_unconsumed == 0 && c.sticky[0] == '\0', "%s: left behind: %" PRId64
	       " allocations, %" PRId64 " IPC mappings, %" PRId64 " streams, %" PRId64
	       " communicators, %" PRId64 " unique ids; sticky \"%s\"", who, alloc, c.ipc_open,
	       c.streams_live, c.comms_live, c.ids_unconsumed, c.sticky);
	dlclose(h);
	return bad;
}

/* ---- main ------------------------------------------------------------------------------ */

static int
wait_child(pid_t pid, int timeout_s)
{
	int st = 0;

	for (int i = 0; i < timeout_s * 20; i++) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(50000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return 124;
}

/* Wait for a child that ran one case (bounded): the case's result. */
static void
child_result(pid_t pid, int timeout_s, const char *name)
{
	int bad = 0, rc = wait_child(pid, timeout_s);

	EXPECT(rc == 0, "the child exited %d", rc);
	result(name, bad);
}

int
main(int argc, char **argv)
{
	char why[1024];
	int ipc[2], idp[2][2], gop[2][2], donep[2], deadp[2];
	pid_t ipc_pid, rp[3], so12_pid = -1, dead_pid[2] = {-1, -1}, late_pid = -1;
	pid_t late2276_pid = -1, hang_abort_pid = -1;
	pid_t stuck_pid = -1, sf_pid[2] = {-1, -1}, rt2_pid = -1, order_pid;
	int sfid[2], sfdone[2];
	const char *cudart = getenv("REFIT_CUDA_LIBRARY");
	int32_t two[2] = {0, 1};
	const gpu_api_t *a;
	uint8_t id[512];
	size_t idlen = sizeof(id);
	xport_t *x = NULL;
	xport_session_t *s;
	refit_err_t err;
	int bad;

	if (argc == 2 && strcmp(argv[1], GPU_ROOT_HOLDER_ARG) == 0)
		return gpu_root_holder_main();
	emu = getenv("REFIT_GPU_TEST_EMU") != NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* children first, before CUDA starts in this process */
	if (pipe(ipc) < 0 || pipe(idp[0]) < 0 || pipe(idp[1]) < 0 || pipe(gop[0]) < 0 ||
	    pipe(gop[1]) < 0 || pipe(donep) < 0 || pipe(deadp) < 0)
		return 1;
	if ((ipc_pid = fork()) == 0) {
		close(ipc[1]);
		_exit(ipc_child(ipc[0]));
	}
	close(ipc[0]);
	if (emu && cudart != NULL && (so12_pid = fork()) == 0)
		_exit(so12_child(cudart));
	if (emu && cudart != NULL && (rt2_pid = fork()) == 0)
		_exit(two_runtimes_child(cudart));
	for (int k = 0; k < 3; k++)
		if ((rp[k] = fork()) == 0) {
			int rc = ring_child(k, k ? idp[k - 1][0] : -1, idp[0][1], idp[1][1],
					    k < 2 ? gop[k][0] : -1, donep[1]);
			_exit(rc);
		}
	/* 8, on the emulator only: real NCCL may hang or end a send to a dead
	 * peer without an error (its proxy sends what the kernel buffered) */
	if (emu && (dead_pid[1] = fork()) == 0) {
		close(deadp[1]);
		_exit(dead_peer_child(1, deadp[0], -1));
	}
	if (emu && dead_pid[1] > 0 && (dead_pid[0] = fork()) == 0)
		_exit(dead_peer_child(0, deadp[1], dead_pid[1]));
	close(deadp[0]);
	close(deadp[1]);
	if (emu && (late_pid = fork()) == 0)
		_exit(late_error_child());
	if (emu && (hang_abort_pid = fork()) == 0)
		_exit(hang_abort_child());
	/* the same on NCCL 2.27.6, whose refused destroy already leaves a group */
	if (emu && (late2276_pid = fork()) == 0) {
		setenv("REFIT_EMU_NCCL_VERSION", "22706", 1);
		_exit(late_error_child());
	}
	/* 11, 12 on a GPU too: the stand-ins are in the loaded table, and the
	 * real ncclCommAbort and cudaMallocHost run */
	if ((stuck_pid = fork()) == 0)
		_exit(stuck_child());
	if ((order_pid = fork()) == 0)
		_exit(order_child(emu));
	if (pipe(sfid) < 0 || pipe(sfdone) < 0)
		return 1;
	for (int k = 0; emu && k < 2; k++)
		if ((sf_pid[k] = fork()) == 0)
			_exit(shrink_fail_child(k, k ? sfid[0] : sfid[1],
						k ? sfdone[0] : sfdone[1]));
	close(sfid[0]);
	close(sfid[1]);
	close(sfdone[0]);
	close(sfdone[1]);
	a = gpu_load(1, why, sizeof(why));
	if (a == NULL) {
		printf("gpu: skipped: %s\n", why);
		close(ipc[1]);
		for (int k = 0; k < 3; k++) {
			kill(rp[k], SIGKILL);
			waitpid(rp[k], NULL, 0);
		}
		for (int k = 0; k < 2; k++)
			if (dead_pid[k] > 0) {
				kill(dead_pid[k], SIGKILL);
				waitpid(dead_pid[k], NULL, 0);
			}
		if (late2276_pid > 0) {
			kill(late2276_pid, SIGKILL);
			waitpid(late2276_pid, NULL, 0);
		}
		if (hang_abort_pid > 0) {
			kill(hang_abort_pid, SIGKILL);
			waitpid(hang_abort_pid, NULL, 0);
		}
		if (late_pid > 0) {
			kill(late_pid, SIGKILL);
			waitpid(late_pid, NULL, 0);
		}
		if (stuck_pid > 0) {
			kill(stuck_pid, SIGKILL);
			waitpid(stuck_pid, NULL, 0);
		}
		if (order_pid > 0) {
			kill(order_pid, SIGKILL);
			waitpid(order_pid, NULL, 0);
		}
		for (int k = 0; k < 2; k++)
			if (sf_pid[k] > 0) {
				kill(sf_pid[k], SIGKILL);
				waitpid(sf_pid[k], NULL, 0);
			}
		waitpid(ipc_pid, NULL, 0);
		if (so12_pid > 0)
			waitpid(so12_pid, NULL, 0);
		if (rt2_pid > 0)
			waitpid(rt2_pid, NULL, 0);
		return 77;
	}
	printf("     CUDA runtime %s, NCCL %d from %s, %d device(s), kernel %s\n", a->cuda_path,
	       a->nccl_version, a->nccl_path, a->ndevices,
	       a->copy_strided ? a->kernels_path : "none");

	/* 1, 2, 3, 6 in this process: rank 0 (and rank 1 where a second device is) */
	refit_err_clear(&err);
	x = start(two, a->ndevices >= 2 ? 2 : 1, a->ndevices >= 2 ? "0,1" : "0", "gpu-test",
		  &err);
	if (x == NULL || xport_nccl_ops.unique_id(x, id, &idlen, &err) != REFIT_OK) {
		printf("FAIL start: %s\n", err.msg);
		failed++;
	} else {
		size_t nl = a->ndevices >= 2 ? 2 : 1;

		s = session(x, 1, two, nl, two, nl, id, idlen, &err);
		if (s == NULL) {
			printf("FAIL open (%zu local communicators): %s\n", nl, err.msg);
			failed++;
		} else {
			result("box copies on the GPU equal the host copies (strided innermost "
			       "dims, size-1 and stride-0 dims, padded rows)", box_copies(s, two, nl));
			if (nl == 2)
				result("two local ranks on devices 0 and 1: staging on each rank's "
				       "device, grouped send/recv between them",
				       group_two(s, 0, 1, 1 << 20, 0) + group_two(s, 1, 0, 12345, 0));
			else
				printf("     skipped: two local ranks on two devices (one device)\n");
			result("a delta unit between two ranks: encoded by the kernels, its size "
			       "message, then its bytes, decoded in place byte-exact",
			       delta_two(s, 0, (int32_t)(nl - 1), 1 << 20));
			result("loopback communicator: send/recv to itself",
			       loopback(s, 0));
			/* last in the session: a failure here stays in its error */
			result("a box whose rows are 2^31 + 64 bytes apart (above CUDA's "
			       "largest 2D pitch) is copied row by row", big_pitch(s, 0));
			xport_nccl_ops.close(s);
		}
		/* same epoch, same id: the communicators are reused */
		result("a failed copy is reported at sync, and the next session is clean",
		       copy_error(x, two, nl, id, idlen));
		xport_nccl_ops.stop(x);
		result("a rank's staging within gpu_staging_budget_bytes: messages larger than "
		       "the budget refused at open, a plan needing more at once than the "
		       "budget refused at open, what does not fit at once fails naming it",
		       staging_budget());
	}

	/* 4. IPC: two allocations of 2 MiB, the first with a pattern, pieces of
	 * it read at offsets */
	{
		uint8_t *host = malloc(IPC_BYTES);
		void *p = NULL, *q = NULL;
		cudaIpcMemHandle_t h, hq;
		cudaError_t e;
		int rc;

		bad = 0;
		for (size_t i = 0; i < IPC_BYTES; i++)
			host[i] = (uint8_t)(i ^ 0x5a);
		e = a->cudaSetDevice(0);
		if (e == cudaSuccess)
			e = a->cudaMalloc(&p, IPC_BYTES);
		if (e == cudaSuccess)
			e = a->cudaMalloc(&q, IPC_BYTES);
		if (e == cudaSuccess)
			e = a->cudaMemcpy(p, host, IPC_BYTES, cudaMemcpyHostToDevice);
		if (e == cudaSuccess)
			e = a->cudaIpcGetMemHandle(&h, p);
		if (e == cudaSuccess)
			e = a->cudaIpcGetMemHandle(&hq, q);
		EXPECT(e == cudaSuccess, "IPC setup: %s", a->cudaGetErrorString(e));
		if (e == cudaSuccess && (write(ipc[1], &h, sizeof(h)) != (ssize_t)sizeof(h) ||
					 write(ipc[1], &hq, sizeof(hq)) != (ssize_t)sizeof(hq)))
			bad++;
		close(ipc[1]);
		rc = wait_child(ipc_pid, 120);
		EXPECT(rc == 0, "the IPC child exited %d", rc);
		if (p != NULL && (e = a->cudaFree(p)) != cudaSuccess)
			EXPECT(0, "cudaFree: %s", a->cudaGetErrorString(e));
		if (q != NULL && (e = a->cudaFree(q)) != cudaSuccess)
			EXPECT(0, "cudaFree: %s", a->cudaGetErrorString(e));
		free(host);
		result("CUDA IPC: another process opens the allocation on rank 0's device, reads "
		       "pieces at offsets inside it; wrong cuda_bytes or device refused, also a "
		       "claim ending inside the next mapping", bad);
	}

	/* 5. three processes */
	{
		int rc2, rc0, rc1;
		char c;

		bad = 0;
		rc2 = wait_child(rp[2], 180);
		EXPECT(rc2 == 0, "rank 2 exited %d", rc2);
		if (write(gop[0][1], "g", 1) != 1 || write(gop[1][1], "g", 1) != 1)
			bad++;
		/* ranks 0 and 1 each say done once their shrunk ring ran */
		for (int k = 0; k < 2; k++)
			if (read(donep[0], &c, 1) != 1)
				bad++;
		rc0 = wait_child(rp[0], 180);
		rc1 = wait_child(rp[1], 180);
		EXPECT(rc0 == 0 && rc1 == 0, "ranks 0 and 1 exited %d and %d", rc0, rc1);
		result("three processes, one rank each: a ring of sends; one leaves, the two "
		       "others shrink their communicators (no new id) and exchange again", bad);
	}
	if (so12_pid > 0) {
		int rc = wait_child(so12_pid, 60);

		bad = 0;
		EXPECT(rc == 0, "the child exited %d", rc);
		result("no libcudart.so.13 on the machine: the search loads libcudart.so.12 "
		       "($CUDA_HOME/lib64)", bad);
	}
	if (dead_pid[0] > 0) {
		int rc0 = wait_child(dead_pid[0], 180), rc1 = wait_child(dead_pid[1], 60);

		bad = 0;
		EXPECT(rc0 == 0, "the sender exited %d", rc0);
		EXPECT(rc1 == 128 + SIGKILL, "the peer exited %d, not killed by the sender", rc1);
		result("a peer killed mid-group: the sender's group fails naming the peer "
		       "(ncclCommGetAsyncError after its stream drained), not done", bad);
	} else if (dead_pid[1] > 0) {
		kill(dead_pid[1], SIGKILL);
		waitpid(dead_pid[1], NULL, 0);
	}
	if (late_pid > 0)
		child_result(late_pid, 60, "a destroy refused by an error that came after the "
			     "check: the communicator is aborted, the thread is not left inside "
			     "a group, the next epoch's communicators form");
	if (hang_abort_pid > 0)
		child_result(hang_abort_pid, 90, "an ncclCommAbort that never returns: the group "
			     "fails within 10 s of it, the node is poisoned naming it");
	if (late2276_pid > 0)
		child_result(late2276_pid, 60, "the same on NCCL 2.27.6, whose refused destroy "
			     "already leaves a group (v2.27.6 init.cc)");
	if (stuck_pid > 0)
		child_result(stuck_pid, 180, "a refused ncclGroupStart fails the group naming "
			     "it; a copy to the host that never ends: aborted by the deadline, "
			     "the node poisoned (next refit refused, memory kept), the caller's "
			     "buffer never written");
	if (order_pid > 0)
		child_result(order_pid, 90, "stream ordering: a client's write queued on its own "
			     "stream, an interprocess event recorded after it; the session given "
			     "the event reads the written bytes");
	if (rt2_pid > 0)
		child_result(rt2_pid, 60, "a kernel library bound to another CUDA runtime than "
			     "refitd's is refused at load, naming both");
	if (sf_pid[0] > 0 && sf_pid[1] > 0) {
		int rc0 = wait_child(sf_pid[0], 180), rc1 = wait_child(sf_pid[1], 60);

		bad = 0;
		EXPECT(rc0 == 0 && rc1 == 0, "the children exited %d and %d", rc0, rc1);
		result("a shrink that fails (a survivor never shrinks): parents aborted first, "
		       "the new communicators NCCL then publishes aborted, none left", bad);
	}
	result("a root holder whose second pipe fails (descriptor limit) leaves no "
	       "descriptor open", root_pipe_failure());
	bad = emu_check("the main process");
	if (emu)
		result("emulator counters: nothing left allocated, mapped or alive", bad);
	printf("gpu: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
#endif
