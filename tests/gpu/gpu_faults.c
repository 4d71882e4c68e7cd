/*
 * gpu_faults.c - gpu-test's cases on the emulator's faults and the loader: a
 * destroy refused by a late error (9), a refused ncclGroupStart and a host
 * copy that never ends (11, 12), a failed shrink (13), the .so.12 fallback
 * (7), a kernel library of another runtime (14), a root holder without
 * pipes (10)
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

/* ---- 9. a destroy refused by a late error (emulator) ---------------------------------- */

/*
 * The transport destroys a communicator it found healthy; an asynchronous
 * error that comes between its ncclCommGetAsyncError and its
 * ncclCommDestroy makes NCCL refuse the destroy, and NCCL 2.28 then leaves
 * the thread inside a group.  The error is brought in exactly there: the
 * armed ncclCommGetAsyncError, once it read ncclSuccess for the old
 * communicator, posts a mismatched send/recv to itself on it and returns
 * only once that failed.  The old communicator must still be freed
 * (aborted) and the thread's next group (the new epoch's communicators)
 * must run: before, the destroy's refusal was logged and nothing else, the
 * communicator leaked and the next ncclGroupEnd never launched the inits.
 */
static __typeof__(ncclCommGetAsyncError) *real_async;
static __typeof__(ncclCommInitRankConfig) *real_init;
static ncclComm_t late_comm;       /* the first communicator made */
static bool late_armed;
static void *late_buf[2];
static cudaStream_t late_stream;
static const gpu_api_t *late_api;

static ncclResult_t
init_capture(ncclComm_t *c, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg)
{
	ncclResult_t r = real_init(c, n, id, rank, cfg);

	if (late_comm == NULL && (r == ncclSuccess || r == ncclInProgress))
		late_comm = *c;
	return r;
}

static ncclResult_t
async_then_error(ncclComm_t c, ncclResult_t *st)
{
	const gpu_api_t *a = late_api;
	ncclResult_t r = real_async(c, st), now = ncclSuccess;

	if (!late_armed || c != late_comm || r != ncclSuccess || *st != ncclSuccess)
		return r;
	late_armed = false;
	if (a->cudaMalloc(&late_buf[0], 64) != cudaSuccess ||
	    a->cudaMalloc(&late_buf[1], 64) != cudaSuccess ||
	    a->cudaStreamCreateWithFlags(&late_stream, cudaStreamNonBlocking) != cudaSuccess)
		return r;  /* the test then fails: no error came */
	a->ncclGroupStart();
	a->ncclSend(late_buf[0], 64, ncclUint8, 0, c, late_stream);
	a->ncclRecv(late_buf[1], 32, ncclUint8, 0, c, late_stream);
	a->ncclGroupEnd();
	for (int i = 0; i < 20000 && real_async(c, &now) == ncclSuccess &&
	     (now == ncclSuccess || now == ncclInProgress); i++)
		usleep(1000);
	return r;   /* what was true when it was read */
}

int
late_error_child(void)
{
	int32_t me = 0, world[1] = {0};
	uint8_t id[512];
	size_t idlen;
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	if ((x = child_start("late", me, &a)) == NULL)
		return 1;
	late_api = a;
	session_ms = 20000;  /* the inits a group left open never launch: fail sooner */
	real_async = a->ncclCommGetAsyncError;
	real_init = a->ncclCommInitRankConfig;
	a->ncclCommGetAsyncError = async_then_error;
	a->ncclCommInitRankConfig = init_capture;
	refit_err_clear(&err);
	for (uint64_t epoch = 1; epoch <= 2 && !bad; epoch++) {
		idlen = sizeof(id);
		EXPECT(xport_nccl_ops.unique_id(x, id, &idlen, &err) == REFIT_OK, "unique id: %s",
		       err.msg);
		/* epoch 2: its new id makes the transport drop epoch 1's communicator */
		late_armed = epoch == 2;
		s = session(x, epoch, world, 1, &me, 1, id, idlen, &err);
		EXPECT(s != NULL, "epoch %" PRIu64 ": the communicator: %s", epoch, err.msg);
		if (s) {
			bad += group_two(s, me, me, 4096, 0);
			xport_nccl_ops.close(s);
		}
	}
	EXPECT(late_buf[0] != NULL && !late_armed, "the late error was never brought in");
	xport_nccl_ops.stop(x);
	{
		ncclResult_t r = a->ncclGroupEnd();

		EXPECT(r == ncclInvalidUsage, "the thread was left inside a group (ncclGroupEnd "
		       "said %s)", a->ncclGetErrorString(r));
	}
	a->cudaSetDevice(0);
	if (late_buf[0] && a->cudaFree(late_buf[0]) != cudaSuccess)
		bad++;
	if (late_buf[1] && a->cudaFree(late_buf[1]) != cudaSuccess)
		bad++;
	if (late_stream && a->cudaStreamDestroy(late_stream) != cudaSuccess)
		bad++;
	bad += emu_check("the late-error child");
	return bad ? 1 : 0;
}

/* ---- 11, 12. a refused ncclGroupStart; a host copy that never ends (emulator) -------- */

/* 11: ncclGroupStart refuses gstart_refuse times (as NCCL before 2.27 did
 * while the previous non-blocking group was being launched): no group
 * opened. */
static __typeof__(ncclGroupStart) *real_gstart;
static int gstart_refuse;

static ncclResult_t
gstart_refused(void)
{
	if (gstart_refuse > 0) {
		gstart_refuse--;
		return ncclInvalidUsage;
	}
	return real_gstart();
}

/*
 * 12: the armed copy to the host is held, not queued, and its stream says
 * cudaErrorNotReady from then on: a device that never ends the copy.  The
 * test runs the held copy itself later, once the transport returned and
 * the caller reused its buffer: the copy's destination must not be the
 * caller's buffer (before: the transport queued the copy into it, waited
 * 60 s and returned, and the copy could still write it).
 */
static __typeof__(cudaMemcpyAsync) *real_memcpy;
static __typeof__(cudaStreamQuery) *real_query_stuck;
static bool stuck_armed;
static cudaStream_t stuck_st;
static struct {
	void *dst;
	const void *src;
	size_t n;
	enum cudaMemcpyKind kind;
} held;

static cudaError_t
memcpy_held(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t st)
{
	if (!stuck_armed || kind != cudaMemcpyDeviceToHost)
		return real_memcpy(dst, src, n, kind, st);
	stuck_armed = false;
	held.dst = dst;
	held.src = src;
	held.n = n;
	held.kind = kind;
	stuck_st = st;
	return cudaSuccess;
}

static cudaError_t
query_stuck(cudaStream_t st)
{
	if (held.dst != NULL && st == stuck_st)
		return cudaErrorNotReady;
	return real_query_stuck(st);
}

/* A session of epoch on a world of one rank (me), from a new id. */
static xport_session_t *
own_session(xport_t *x, uint64_t epoch, int32_t me, refit_err_t *err)
{
	uint8_t id[512];
	size_t idlen = sizeof(id);

	refit_err_clear(err);
	if (xport_nccl_ops.unique_id(x, id, &idlen, err) != REFIT_OK)
		return NULL;
	return session(x, epoch, &me, 1, &me, 1, id, idlen, err);
}

int
stuck_child(void)
{
	int32_t me = 0;
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	if ((x = child_start("stuck", me, &a)) == NULL)
		return 1;
	session_ms = 3000;  /* the stuck copy waits for the deadline */
	/* 11 */
	s = own_session(x, 1, me, &err);
	EXPECT(s != NULL, "epoch 1: %s", err.msg);
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint8_t *b0 = dev->alloc(dev->ctx, 0, 4096), *b1 = dev->alloc(dev->ctx, 0, 4096);
		xport_op_t ops[2] = {{true, 0, 0, b0, 4096}, {false, 0, 0, b1, 4096}};
		refit_status_t rc;
		ncclResult_t r;

		EXPECT(b0 && b1, "cudaMalloc");
		real_gstart = a->ncclGroupStart;
		a->ncclGroupStart = gstart_refused;
		gstart_refuse = 1;
		rc = group_run(s, ops, 2, &err);
		a->ncclGroupStart = real_gstart;
		EXPECT(rc == REFIT_ERR_NCCL && strstr(err.msg, "ncclGroupStart"), "a group whose "
		       "ncclGroupStart was refused: %s (%s)", rc == REFIT_OK ? "done" : "failed",
		       err.msg);
		r = a->ncclGroupEnd();
		EXPECT(r == ncclInvalidUsage, "a group was left open (ncclGroupEnd said %s)",
		       a->ncclGetErrorString(r));
		dev->free(dev->ctx, 0, b0);
		dev->free(dev->ctx, 0, b1);
		xport_nccl_ops.close(s);
	}
	/* 12, a new epoch (the communicators were aborted) */
	s = own_session(x, 2, me, &err);
	EXPECT(s != NULL, "epoch 2: %s", err.msg);
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint8_t *buf = dev->alloc(dev->ctx, 0, 4096), *h = malloc(4096);
		cudaStream_t ts = NULL;
		refit_status_t rc;
		cudaError_t e;
		size_t i;

		EXPECT(buf != NULL, "cudaMalloc");
		memset(h, 0x11, 4096);
		dev->from_host(dev->ctx, 0, buf, h, 4096);
		EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
		real_memcpy = a->cudaMemcpyAsync;
		real_query_stuck = a->cudaStreamQuery;
		a->cudaMemcpyAsync = memcpy_held;
		a->cudaStreamQuery = query_stuck;
		stuck_armed = true;
		refit_err_clear(&err);
		dev->to_host(dev->ctx, 0, h, buf, 4096);
		rc = dev->sync(dev->ctx, &err);
		EXPECT(held.dst != NULL, "the copy to the host was never queued");
		EXPECT(rc == REFIT_ERR_TIMEOUT && strstr(err.msg, "communicators were aborted"),
		       "a copy to the host that never ends: %s (%s)", rc == REFIT_OK ? "done" :
		       "failed", err.msg);
		/* the caller reuses its buffer; then the device runs the copy */
		memset(h, 0xee, 4096);
		e = a->cudaSetDevice(0);
		if (e == cudaSuccess)
			e = a->cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking);
		if (e == cudaSuccess && held.dst)
			e = real_memcpy(held.dst, held.src, held.n, held.kind, ts);
		if (e == cudaSuccess)
			e = a->cudaStreamSynchronize(ts);
		EXPECT(e == cudaSuccess, "the held copy: %s", a->cudaGetErrorString(e));
		for (i = 0; i < 4096 && h[i] == 0xee; i++)
			;
		EXPECT(i == 4096, "the copy that ran after the call returned wrote the caller's "
		       "buffer (byte %zu is 0x%02x)", i, i < 4096 ? h[i] : 0);
		if (ts)
			a->cudaStreamDestroy(ts);
		held.dst = NULL;
		a->cudaMemcpyAsync = real_memcpy;
		a->cudaStreamQuery = real_query_stuck;
		dev->free(dev->ctx, 0, buf);   /* kept: the node is poisoned */
		xport_nccl_ops.close(s);
		free(h);
	}
	/* the next refit is refused, saying why */
	s = own_session(x, 3, me, &err);
	EXPECT(s == NULL && err.status == REFIT_ERR_UNAVAILABLE && strstr(err.msg, "poisoned") &&
	       strstr(err.msg, "kept"), "the refit after a stuck copy: %s",
	       s ? "opened" : err.msg);
	if (s)
		xport_nccl_ops.close(s);
	xport_nccl_ops.stop(x);
	return bad ? 1 : 0;
}

/* ---- 13. a shrink that fails (emulator) -------------------------------------------- */

/*
 * role 0: rank 0 (its own host), makes the id (to idfd), forms the world
 * {0, 1, 2}, then shrinks to {0, 1} -- which rank 1 never does: the shrink
 * fails at the deadline; then says done (donefd).  role 1: ranks 1 and 2
 * on devices 0 and 1 (another host), reads the id, forms the world, waits
 * for done.
 */
int
shrink_fail_child(int role, int idfd, int donefd)
{
	int32_t world[3] = {0, 1, 2}, mine[2] = {1, 2}, me = 0;
	uint8_t id[512];
	size_t idlen = sizeof(id);
	char host[64], why[1024], c = 'd';
	const gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	snprintf(host, sizeof(host), "%s-sf%d", getenv("NCCL_HOSTID") ?
		 getenv("NCCL_HOSTID") : "gpu-test", role);
	setenv("NCCL_HOSTID", host, 1);
	if ((a = gpu_load(1, why, sizeof(why))) == NULL) {
		printf("FAIL shrink-fail role %d: %s\n", role, why);
		return 1;
	}
	refit_err_clear(&err);
	x = role == 0 ? start(&me, 1, "0", host, &err) : start(mine, 2, "0,1", host, &err);
	if (x == NULL) {
		printf("FAIL shrink-fail role %d: %s\n", role, err.msg);
		return 1;
	}
	if (role == 0) {
		EXPECT(xport_nccl_ops.unique_id(x, id, &idlen, &err) == REFIT_OK, "unique id: %s",
		       err.msg);
		EXPECT(write(idfd, &idlen, sizeof(idlen)) == (ssize_t)sizeof(idlen) &&
		       write(idfd, id, idlen) == (ssize_t)idlen, "writing the id");
	} else {
		EXPECT(read(idfd, &idlen, sizeof(idlen)) == (ssize_t)sizeof(idlen) &&
		       idlen <= sizeof(id) && read(idfd, id, idlen) == (ssize_t)idlen,
		       "reading the id");
	}
	s = session(x, 1, world, 3, role == 0 ? &me : mine, role == 0 ? 1 : 2, id, idlen, &err);
	EXPECT(s != NULL, "shrink-fail role %d: the world of 3: %s", role, err.msg);
	if (s)
		xport_nccl_ops.close(s);
	if (role == 0 && !bad) {
		session_ms = 3000;
		refit_err_clear(&err);
		s = session(x, 2, world, 2, &me, 1, NULL, 0, &err);
		EXPECT(s == NULL && err.status == REFIT_ERR_TIMEOUT && strstr(err.msg, "shrink"),
		       "a shrink rank 1 never joins: %s", s ? "opened" : err.msg);
		if (s)
			xport_nccl_ops.close(s);
		EXPECT(write(donefd, &c, 1) == 1, "done");
	} else if (role == 1) {
		EXPECT(read(donefd, &c, 1) == 1, "waiting for rank 0");
	}
	xport_nccl_ops.stop(x);
	bad += emu_check(role == 0 ? "the rank whose shrink failed" : "ranks 1 and 2");
	return bad ? 1 : 0;
}

/* ---- 7. libcudart.so.12 when there is no .so.13 ----------------------------------------- */

/*
 * The child plays a machine with CUDA 12 only: this program's dlopen (it
 * takes the place of libc's for gpu.c) refuses libcudart.so.13 by name and
 * in /usr/local/cuda/lib64 (this machine may have a real one there), and
 * CUDA_HOME is a directory whose lib64 holds only libcudart.so.12, a link
 * to the emulator's runtime.  Nothing is configured: the search must find
 * the .so.12 (issue 10, defect 10: it never fell back).
 */
static bool no_cudart13;

void *
dlopen(const char *file, int mode)
{
	static void *(*real)(const char *, int);

	if (real == NULL)
		*(void **)&real = dlsym(RTLD_NEXT, "dlopen");
	if (no_cudart13 && file != NULL && (strcmp(file, "libcudart.so.13") == 0 ||
	    strcmp(file, "/usr/local/cuda/lib64/libcudart.so.13") == 0))
		return NULL;
	return real(file, mode);
}

int
so12_child(const char *cudart)
{
	char dir[] = "/tmp/refit-so12-XXXXXX", lib64[64], link[96], target[PATH_MAX], why[1024];
	const gpu_api_t *a;
	int bad = 0;

	if (mkdtemp(dir) == NULL || realpath(cudart, target) == NULL)
		return 1;
	snprintf(lib64, sizeof(lib64), "%s/lib64", dir);
	snprintf(link, sizeof(link), "%s/libcudart.so.12", lib64);
	if (mkdir(lib64, 0700) != 0 || symlink(target, link) != 0)
		return 1;
	setenv("CUDA_HOME", dir, 1);
	unsetenv("REFIT_CUDA_LIBRARY");
	no_cudart13 = true;
	a = gpu_load(1, why, sizeof(why));
	EXPECT(a != NULL, "no CUDA runtime: %s", why);
	if (a != NULL)
		EXPECT(strcmp(a->cuda_path, link) == 0, "the CUDA runtime loaded is %s, not %s",
		       a->cuda_path, link);
	unlink(link);
	rmdir(lib64);
	rmdir(dir);
	return bad ? 1 : 0;
}

/* ---- 14. a kernel library of another CUDA runtime (emulator) ------------------------- */

int
two_runtimes_child(const char *cudart)
{
	char dir[] = "/tmp/refit-2rt-XXXXXX", copy[96], target[PATH_MAX], why[1024], cmd[600];
	const gpu_api_t *a;
	int bad = 0;

	if (mkdtemp(dir) == NULL || realpath(cudart, target) == NULL)
		return 1;
	snprintf(copy, sizeof(copy), "%s/libcudart.so.13", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", target, copy);
	if (system(cmd) != 0)
		return 1;
	setenv("REFIT_CUDA_LIBRARY", copy, 1);
	setenv("REFIT_GPU_KERNELS_LIBRARY", target, 1);
	a = gpu_load(1, why, sizeof(why));
	EXPECT(a == NULL && strstr(why, "another CUDA runtime") && strstr(why, copy),
	       "a kernel library bound to another runtime: %s", a ? "loaded" : why);
	unlink(copy);
	rmdir(dir);
	return bad ? 1 : 0;
}

/* ---- 10. a root holder that cannot get its pipes ------------------------------------- */

static int
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (d == NULL)
		return -1;
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n;
}

/* A descriptor limit that leaves exactly two free below it: the first pipe
 * of gpu_root_new gets them, the second fails; nothing may stay open. */
int
root_pipe_failure(void)
{
	struct rlimit old, lim;
	gpu_root_t r;
	char why[256];
	int bad = 0, before, after, rc, fd, freefds = 0;

	if (getrlimit(RLIMIT_NOFILE, &old) != 0)
		return 1;
	for (fd = 0; fd < 4096 && freefds < 2; fd++)
		if (fcntl(fd, F_GETFD) < 0)
			freefds++;
	lim = old;
	lim.rlim_cur = (rlim_t)fd;
	before = open_fds();
	if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
		return 1;
	rc = gpu_root_new(&r, 10000, why, sizeof(why));
	after = open_fds();     /* the opendir fd fits again: the pipes' are back */
	if (setrlimit(RLIMIT_NOFILE, &old) != 0)
		bad++;
	after = after < 0 ? open_fds() : after;
	EXPECT(rc != 0 && strstr(why, "pipe"), "gpu_root_new with one free pipe: rc %d (%s)",
	       rc, why);
	if (rc == 0)
		gpu_root_release(&r);
	EXPECT(after == before, "%d descriptors open before, %d after the failed pipe", before,
	       after);
	return bad;
}

#endif
