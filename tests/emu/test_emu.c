/*
 * test_emu.c - rule tests of the CUDA + NCCL emulator: for each rule a
 * program that breaks it and a check that the emulator catches it, plus the
 * correct paths (byte-exact copies, IPC and exchanges between processes).
 *
 * Each test runs in its own process (a dead context or a leak stays there)
 * with its own REFIT_EMU_DIR, under alarm(); multi-process tests fork their
 * ranks before touching the emulator.  Usage: test-emu [name-substring].
 * Ends with "emu: N passed, N failed".  The stderr of a failed test is
 * printed; that of a passing one is dropped.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/emu/cuda_abi.h"
#include "tests/emu/emu.h"

#define CK(c, ...)                                                                         \
	do {                                                                               \
		if (!(c)) {                                                                \
			fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, \
				#c);                                                       \
			fprintf(stderr, __VA_ARGS__);                                      \
			fputc('\n', stderr);                                               \
			_exit(1);                                                          \
		}                                                                          \
	} while (0)
#define CU(call)                                                                           \
	do {                                                                               \
		cudaError_t e_ = (call);                                                   \
		CK(e_ == cudaSuccess, "%s -> %s", #call, cudaGetErrorName(e_));            \
	} while (0)
#define CUIS(call, want)                                                                   \
	do {                                                                               \
		cudaError_t e_ = (call);                                                   \
		CK(e_ == (want), "%s -> %s, want %s", #call, cudaGetErrorName(e_),         \
		   cudaGetErrorName(want));                                                \
	} while (0)
#define NC(call)                                                                           \
	do {                                                                               \
		ncclResult_t r_ = (call);                                                  \
		CK(r_ == ncclSuccess || r_ == ncclInProgress, "%s -> %d %s", #call, r_,    \
		   ncclGetErrorString(r_));                                                \
	} while (0)
#define NCIS(call, want)                                                                   \
	do {                                                                               \
		ncclResult_t r_ = (call);                                                  \
		CK(r_ == (want), "%s -> %d, want %d", #call, r_, want);                    \
	} while (0)

static char tdir[200];

/* ---- helpers --------------------------------------------------------------------- */

static int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pid_t
spawn(void (*fn)(int), int arg, const char *hostid)
{
	pid_t pid = fork();

	CK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		if (hostid)
			setenv("NCCL_HOSTID", hostid, 1);
		fn(arg);
		exit(0);
	}
	return pid;
}

/* wait for pid; its exit status (or 128 + signal) */
static int
reap(pid_t pid)
{
	int st;

	CK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void
reap_ok(pid_t pid)
{
	int rc = reap(pid);

	CK(rc == 0, "helper process %d ended with %d", (int)pid, rc);
}

static void
put(int fd, const void *p, size_t n)
{
	CK(write(fd, p, n) == (ssize_t)n, "pipe write: %s", strerror(errno));
}

static void
get(int fd, void *p, size_t n)
{
	size_t off = 0;

	while (off < n) {
		ssize_t r = read(fd, (char *)p + off, n - off);

		CK(r > 0, "pipe read: %s", r ? strerror(errno) : "closed");
		off += (size_t)r;
	}
}

/* the communicator's state once it leaves ncclInProgress (or after ms) */
static ncclResult_t
wait_comm(ncclComm_t c, int ms)
{
	int64_t end = now_ms() + ms;
	ncclResult_t st = ncclInProgress;

	while (now_ms() < end) {
		NCIS(ncclCommGetAsyncError(c, &st), ncclSuccess);
		if (st != ncclInProgress)
			return st;
		usleep(1000);
	}
	return st;
}

static cudaError_t
wait_stream(cudaStream_t s, int ms)
{
	int64_t end = now_ms() + ms;
	cudaError_t e = cudaErrorNotReady;

	while (now_ms() < end && (e = cudaStreamQuery(s)) == cudaErrorNotReady)
		usleep(1000);
	return e;
}

static ncclConfig_t
nonblocking(void)
{
	ncclConfig_t c = NCCL_CONFIG_INITIALIZER;

	c.blocking = 0;
	return c;
}

static void
fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

static refitEmuCounters_t
counters(void)
{
	refitEmuCounters_t c;

	CK(refitEmuGetCounters(&c) == 0, "refitEmuGetCounters");
	return c;
}

/* ---- CUDA: devices, errors ---------------------------------------------------------- */

static void *
thread_dev(void *arg)
{
	int d = -1;

	cudaGetDevice(&d);
	*(int *)arg = d;
	return NULL;
}

static void
t_devices(void)
{
	int n = 0, d = -1, td = -1;
	pthread_t th;

	CU(cudaGetDeviceCount(&n));
	CK(n == 4, "%d devices with REFIT_EMU_DEVICES=4", n);
	CUIS(cudaSetDevice(4), cudaErrorInvalidDevice);
	CUIS(cudaGetLastError(), cudaErrorInvalidDevice); /* reported once */
	CUIS(cudaGetLastError(), cudaSuccess);
	CU(cudaSetDevice(2));
	CU(cudaGetDevice(&d));
	CK(d == 2, "device %d", d);
	pthread_create(&th, NULL, thread_dev, &td); /* per host thread, default 0 */
	pthread_join(th, NULL);
	CK(td == 0, "a new thread's device is %d", td);
}

static void
t_host_deref_segv(void)
{
	void *p;
	pid_t pid;

	CU(cudaMalloc(&p, 4096));
	pid = fork();
	if (pid == 0) {
		volatile uint8_t *b = p;

		signal(SIGSEGV, SIG_DFL); /* no sanitizer report: the plain signal */
		b[0] = 1; /* a device pointer: must fault */
		_exit(0);
	}
	CK(reap(pid) == 128 + SIGSEGV, "writing through a device pointer did not SIGSEGV");
	CK(cudaPointerGetAttributes(&(struct cudaPointerAttributes){0}, p) == cudaSuccess, "attrs");
}

static void
t_copies_exact(void)
{
	enum { N = 1 << 20 };
	uint8_t *h = malloc(N), *back = malloc(N);
	uint8_t *a, *b;
	cudaStream_t s;
	struct cudaPointerAttributes at;

	fill(h, N, 1);
	CU(cudaSetDevice(1));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(cudaMalloc((void **)&a, N));
	CU(cudaMalloc((void **)&b, N));
	CU(cudaMemcpyAsync(a, h, N, cudaMemcpyHostToDevice, s));
	CU(cudaMemcpyAsync(b + 100, a + 50, N - 100, cudaMemcpyDefault, s)); /* offsets */
	CU(cudaMemcpyAsync(back, b, N, cudaMemcpyDeviceToHost, s));
	CU(cudaStreamSynchronize(s));
	CK(memcmp(back + 100, h + 50, N - 100) == 0, "bytes differ");
	CU(cudaPointerGetAttributes(&at, b + 10));
	CK(at.type == cudaMemoryTypeDevice && at.device == 1, "attrs %d %d", at.type, at.device);
	CU(cudaPointerGetAttributes(&at, h));
	CK(at.type == cudaMemoryTypeUnregistered, "host attrs %d", at.type);
	CU(cudaMemset(a, 0xab, 10));
	CU(cudaMemcpy(back, a, 10, cudaMemcpyDeviceToHost));
	CK(back[0] == 0xab && back[9] == 0xab, "memset");
	CU(cudaFree(a));
	CU(cudaFree(b));
	CU(cudaStreamDestroy(s));
	CK(counters().alloc_live[1] == 0 && counters().streams_live == 0, "leaks");
	free(h);
	free(back);
}

static void
t_async_stale_notready(void)
{
	uint8_t h[64] = {0}, src[64];
	uint8_t *d;
	cudaStream_t s;
	cudaEvent_t ev;

	/* set by the driver: REFIT_EMU_DELAY_US=200000 */
	memset(src, 7, sizeof(src));
	CU(cudaMalloc((void **)&d, 64));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(cudaEventCreate(&ev));
	CU(cudaMemcpyAsync(d, src, 64, cudaMemcpyHostToDevice, s));
	CU(cudaMemcpyAsync(h, d, 64, cudaMemcpyDeviceToHost, s));
	CU(cudaEventRecord(ev, s));
	CUIS(cudaStreamQuery(s), cudaErrorNotReady);
	CUIS(cudaEventQuery(ev), cudaErrorNotReady);
	CK(h[0] == 0 && h[63] == 0, "read without synchronising saw the new bytes");
	CU(cudaEventSynchronize(ev));
	CK(h[0] == 7 && h[63] == 7, "after the sync the bytes are not there");
	CU(cudaStreamQuery(s));
	CU(cudaEventDestroy(ev));
}

static void
t_cross_device_copy_sticky(void)
{
	uint8_t *d0, *d1;
	void *x;
	cudaStream_t s;

	CU(cudaSetDevice(1));
	CU(cudaMalloc((void **)&d1, 256));
	CU(cudaSetDevice(0));
	CU(cudaMalloc((void **)&d0, 256));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(cudaMemcpyAsync(d0, d1, 256, cudaMemcpyDeviceToDevice, s)); /* queued fine */
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
	/* the context is dead: every later call fails the same way */
	CUIS(cudaMalloc(&x, 16), cudaErrorIllegalAddress);
	CUIS(cudaSetDevice(0), cudaErrorIllegalAddress);
	CUIS(cudaGetLastError(), cudaErrorIllegalAddress);
	CUIS(cudaGetLastError(), cudaErrorIllegalAddress);
	CK(strstr(counters().sticky, "device 1") != NULL, "sticky text: %s", counters().sticky);
}

static void
t_out_of_allocation_sticky(void)
{
	uint8_t *d, h[512];
	cudaStream_t s;

	CU(cudaMalloc((void **)&d, 256));
	CU(cudaStreamCreateWithFlags(&s, 0));
	CU(cudaMemcpyAsync(h, d + 128, 256, cudaMemcpyDeviceToHost, s)); /* 128 past the end */
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
	CUIS(cudaFree(d), cudaErrorIllegalAddress);
}

static void
t_use_after_free_sticky(void)
{
	uint8_t *d, h[16];

	CU(cudaMalloc((void **)&d, 256));
	CUIS(cudaFree(d + 8), cudaErrorInvalidValue); /* not the base */
	CU(cudaFree(d));
	CUIS(cudaFree(d), cudaErrorInvalidValue);       /* twice */
	CUIS(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost), cudaErrorIllegalAddress);
}

static void
t_pitch_and_kind_errors(void)
{
	uint8_t *d, h[4096];
	cudaStream_t s;
	struct cudaMemcpy3DParms p = {0};

	CU(cudaMalloc((void **)&d, 4096));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CUIS(cudaMemcpy2DAsync(d, 8, h, 16, 16, 4, cudaMemcpyDefault, s),
	     cudaErrorInvalidPitchValue);                       /* dpitch < width */
	CUIS(cudaGetLastError(), cudaErrorInvalidPitchValue);
	CUIS(cudaGetLastError(), cudaSuccess);              /* not sticky */
	CUIS(cudaMemcpy2DAsync(d, 16, h, 0, 16, 4, cudaMemcpyDefault, s),
	     cudaErrorInvalidPitchValue);                       /* zero pitch */
	CUIS(cudaMemcpy2DAsync(d, 16, h, 8, 16, 1, cudaMemcpyDefault, s),
	     cudaErrorInvalidPitchValue);                       /* even for one row */
	CUIS(cudaMemcpy2DAsync(d, 1ULL << 31, h, 16, 16, 1, cudaMemcpyDefault, s),
	     cudaErrorInvalidPitchValue);                       /* above the maximum */
	CUIS(cudaMemcpy2DAsync(d, 16, h, 16, 16, 4, (enum cudaMemcpyKind)7, s),
	     cudaErrorInvalidMemcpyDirection);
	CUIS(cudaMemcpyAsync(d, d + 64, 16, cudaMemcpyHostToDevice, s),
	     cudaErrorInvalidValue);                            /* the source is device memory */
	CUIS(cudaMemcpyAsync(h, h + 64, 16, cudaMemcpyDeviceToHost, s), cudaErrorInvalidValue);
	CUIS(cudaMemcpyAsync(d, NULL, 16, cudaMemcpyDefault, s), cudaErrorInvalidValue);
	CUIS(cudaMemset(h, 0, 16), cudaErrorInvalidValue);  /* host memory */
	p.srcPtr = (struct cudaPitchedPtr){h, 8, 16, 4};
	p.dstPtr = (struct cudaPitchedPtr){d, 16, 16, 4};
	p.extent = (struct cudaExtent){16, 4, 2};
	p.kind = cudaMemcpyHostToDevice;
	CUIS(cudaMemcpy3DAsync(&p, s), cudaErrorInvalidPitchValue);
	CUIS(cudaStreamQuery((cudaStream_t)h), cudaErrorInvalidResourceHandle);
	CU(cudaStreamSynchronize(s)); /* nothing of the above was queued or is sticky */
	CU(cudaMemcpy2DAsync(d, 16, h, 16, 16, 4, cudaMemcpyDefault, s));
	CU(cudaStreamSynchronize(s));
}

static void
t_copy_2d_3d_exact(void)
{
	uint8_t src[4096], out[4096];
	uint8_t *d;
	cudaStream_t s;
	struct cudaMemcpy3DParms p = {0};

	fill(src, sizeof(src), 3);
	memset(out, 0, sizeof(out));
	CU(cudaMalloc((void **)&d, 4096));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(cudaMemset(d, 0, 4096));
	/* 5 rows of 12 bytes, source pitch 40, device pitch 16, then back */
	CU(cudaMemcpy2DAsync(d, 16, src, 40, 12, 5, cudaMemcpyHostToDevice, s));
	CU(cudaMemcpy2DAsync(out, 12, d, 16, 12, 5, cudaMemcpyDeviceToHost, s));
	CU(cudaStreamSynchronize(s));
	for (int r = 0; r < 5; r++)
		CK(memcmp(out + r * 12, src + r * 40, 12) == 0, "2D row %d", r);
	/* 3-D: 2 slices of 3 rows of 4 bytes, source pitch 8 / 4 rows per slice */
	p.srcPtr = (struct cudaPitchedPtr){src, 8, 8, 4};
	p.dstPtr = (struct cudaPitchedPtr){d, 4, 4, 3};
	p.srcPos = (struct cudaPos){1, 0, 0};
	p.extent = (struct cudaExtent){4, 3, 2};
	p.kind = cudaMemcpyDefault;
	CU(cudaMemcpy3DAsync(&p, s));
	CU(cudaMemcpyAsync(out, d, 24, cudaMemcpyDefault, s));
	CU(cudaStreamSynchronize(s));
	for (int z = 0; z < 2; z++)
		for (int y = 0; y < 3; y++)
			CK(memcmp(out + z * 12 + y * 4, src + z * 32 + y * 8 + 1, 4) == 0,
			   "3D slice %d row %d", z, y);
}

static void
t_kernel_strided(void)
{
	int32_t m[6] = {1, 2, 3, 4, 5, 6}, t[6] = {0}, b[6] = {0}, one[3] = {7, 8, 9};
	int32_t *dm, *dt;
	cudaStream_t s, s1;
	int64_t shape[2] = {3, 2}, dst[2] = {2, 1}, src[2] = {1, 3};
	int64_t bshape[2] = {2, 3}, bdst[2] = {3, 1}, bsrc[2] = {0, 1};

	CU(cudaMalloc((void **)&dm, sizeof(m)));
	CU(cudaMalloc((void **)&dt, sizeof(t)));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(cudaMemcpy(dm, m, sizeof(m), cudaMemcpyHostToDevice));
	/* transpose a 2x3 matrix into 3x2 */
	CU(refitGpuCopyStrided(s, dt, dm, 2, shape, dst, src, 4));
	CU(cudaMemcpyAsync(t, dt, sizeof(t), cudaMemcpyDeviceToHost, s));
	CU(cudaStreamSynchronize(s));
	CK(t[0] == 1 && t[1] == 4 && t[2] == 2 && t[3] == 5 && t[4] == 3 && t[5] == 6,
	   "transpose %d %d %d %d %d %d", t[0], t[1], t[2], t[3], t[4], t[5]);
	/* broadcast a row: source stride 0 */
	CU(cudaMemcpy(dm, one, sizeof(one), cudaMemcpyHostToDevice));
	CU(refitGpuCopyStrided(s, dt, dm, 2, bshape, bdst, bsrc, 4));
	CU(cudaMemcpyAsync(b, dt, sizeof(b), cudaMemcpyDeviceToHost, s));
	CU(cudaStreamSynchronize(s));
	CK(b[0] == 7 && b[2] == 9 && b[3] == 7 && b[5] == 9, "broadcast");
	/* argument errors are not sticky */
	CUIS(refitGpuCopyStrided(s, dt, dm, 0, shape, dst, src, 4), cudaErrorInvalidValue);
	CUIS(refitGpuCopyStrided(s, dt, dm, 2, shape, dst, src, 3), cudaErrorInvalidValue);
	CUIS(refitGpuCopyStrided(s, dt, dm, 2, shape, bsrc, src, 4), cudaErrorInvalidValue);
	/* a launch on a stream of another device than the current one */
	CU(cudaSetDevice(1));
	CU(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CU(cudaSetDevice(0));
	CUIS(refitGpuCopyStrided(s1, dt, dm, 2, shape, dst, src, 4),
	     cudaErrorInvalidResourceHandle);
	CU(cudaStreamSynchronize(s));
	/* a kernel reading host memory faults */
	CU(refitGpuCopyStrided(s, dt, m, 2, shape, dst, src, 4));
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
}

static void
t_kernel_cross_device_sticky(void)
{
	int32_t *d0, *d1;
	cudaStream_t s;
	int64_t shape[1] = {4}, st[1] = {1};

	CU(cudaSetDevice(1));
	CU(cudaMalloc((void **)&d1, 64));
	CU(cudaSetDevice(0));
	CU(cudaMalloc((void **)&d0, 64));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(refitGpuCopyStrided(s, d0, d1, 1, shape, st, st, 4));
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
	CUIS(cudaStreamQuery(s), cudaErrorIllegalAddress);
}

static void
t_memory_limit(void)
{
	void *p, *q;

	/* REFIT_EMU_DEVICE_MEM=1048576 */
	CUIS(cudaMalloc(&p, 2 << 20), cudaErrorMemoryAllocation);
	CU(cudaMalloc(&p, 1 << 19));
	CU(cudaMalloc(&q, 1 << 19));
	CUIS(cudaMalloc(&p, 1), cudaErrorMemoryAllocation);
	CU(cudaSetDevice(1)); /* per device */
	CU(cudaMalloc(&p, 1 << 19));
	CU(cudaMalloc(&p, 0));
	CK(p == NULL, "cudaMalloc(0)");
}

static void
dump_child(int arg)
{
	void *p;
	uint8_t h[100];

	(void)arg;
	CU(cudaSetDevice(2));
	CU(cudaMalloc(&p, 100));
	CU(cudaMemcpy(p, h, 100, cudaMemcpyHostToDevice));
	exit(0); /* leaks p on purpose: the dump (atexit) must show it */
}

static void
t_counters_and_dump(void)
{
	char path[300], buf[2000] = "";
	pid_t pid;
	FILE *f;
	size_t n;

	setenv("REFIT_EMU_COUNTERS", "1", 1);
	pid = spawn(dump_child, 0, NULL);
	reap_ok(pid);
	snprintf(path, sizeof(path), "%s/counters/%d.json", tdir, (int)pid);
	f = fopen(path, "r");
	CK(f != NULL, "no %s", path);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	CK(strstr(buf, "\"alloc_live\":[0,0,1,0]") != NULL, "%s", buf);
	CK(strstr(buf, "\"alloc_bytes_live\":[0,0,100,0]") != NULL, "%s", buf);
	CK(strstr(buf, "\"h->2\":100") != NULL, "%s", buf);
	CK(strstr(buf, "\"sticky\":\"\"") != NULL, "%s", buf);
	CK(strstr(buf, "\"ids_unconsumed\":0") != NULL, "%s", buf);
}

/* ---- CUDA IPC ------------------------------------------------------------------------------ */

static int chan_a[2], chan_b[2]; /* to the helper, from the helper */

static void
ipc_reader(int mode)
{
	cudaIpcMemHandle_t h;
	uint8_t *p, *q, got[256], want[256];
	cudaStream_t s;

	get(chan_a[0], &h, sizeof(h));
	CU(cudaSetDevice(1));
	CU(cudaIpcOpenMemHandle((void **)&p, h, cudaIpcMemLazyEnablePeerAccess));
	CU(cudaIpcOpenMemHandle((void **)&q, h, cudaIpcMemLazyEnablePeerAccess));
	CK(p == q, "the same handle opened twice gives %p and %p", (void *)p, (void *)q);
	CK(counters().ipc_open == 2, "ipc_open %lld", (long long)counters().ipc_open);
	CU(cudaIpcCloseMemHandle(q));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	fill(want, sizeof(want), 9);
	CU(cudaMemcpyAsync(got, p + 100, 256, cudaMemcpyDeviceToHost, s)); /* an offset */
	CU(cudaStreamSynchronize(s));
	CK(memcmp(got, want, 256) == 0, "IPC bytes differ");
	memset(got, 0x5a, 256);
	CU(cudaMemcpyAsync(p, got, 256, cudaMemcpyHostToDevice, s));
	CU(cudaStreamSynchronize(s));
	if (mode == 1) { /* the mapping belongs to device 1: a device-0 stream faults */
		cudaStream_t s0;

		CU(cudaSetDevice(0));
		CU(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
		CU(cudaMemcpyAsync(got, p, 16, cudaMemcpyDeviceToHost, s0));
		CUIS(cudaStreamSynchronize(s0), cudaErrorIllegalAddress);
		put(chan_b[1], "k", 1);
		return;
	}
	CU(cudaIpcCloseMemHandle(p));
	CUIS(cudaIpcCloseMemHandle(p), cudaErrorInvalidValue);
	CK(counters().ipc_open == 0, "ipc_open %lld", (long long)counters().ipc_open);
	put(chan_b[1], "k", 1);
}

static void
ipc_exporter(int mode)
{
	uint8_t *d, h[512], back[256];
	cudaIpcMemHandle_t ih;
	void *self;
	pid_t pid;
	char k;

	pid = spawn(ipc_reader, mode, NULL);
	fill(h, sizeof(h), 9);
	CU(cudaSetDevice(1));
	CU(cudaMalloc((void **)&d, 512));
	CU(cudaMemcpy(d + 100, h, 256, cudaMemcpyHostToDevice));
	/* a handle of an interior pointer names the whole allocation (as CUDA) */
	CU(cudaIpcGetMemHandle(&ih, d + 100));
	CUIS(cudaIpcOpenMemHandle(&self, ih, cudaIpcMemLazyEnablePeerAccess),
	     cudaErrorDeviceUninitialized); /* one's own allocation */
	put(chan_a[1], &ih, sizeof(ih));
	get(chan_b[0], &k, 1);
	CU(cudaMemcpy(back, d, 256, cudaMemcpyDeviceToHost));
	CK(back[0] == 0x5a && back[255] == 0x5a, "the importer's write is not visible");
	reap_ok(pid);
}

static void
t_ipc_between_processes(void)
{
	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	ipc_exporter(0);
}

static void
t_ipc_mapping_device(void)
{
	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	ipc_exporter(1);
}

static void
ipc_refuser(int arg)
{
	cudaIpcMemHandle_t h, bad;
	void *p;

	(void)arg;
	get(chan_a[0], &h, sizeof(h));
	if (strcmp(getenv("NCCL_HOSTID"), "hostB") == 0) {
		CUIS(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
		     cudaErrorMapBufferObjectFailed);
	} else {
		CU(cudaSetDevice(0)); /* the memory is on device 1 */
		CUIS(cudaIpcOpenMemHandle(&p, h, 0), cudaErrorInvalidValue);
		CUIS(cudaIpcOpenMemHandle(&p, h, 6), cudaErrorInvalidValue);
		memset(&bad, 0x11, sizeof(bad));
		CUIS(cudaIpcOpenMemHandle(&p, bad, 1), cudaErrorInvalidResourceHandle);
		CU(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
		CU(cudaIpcCloseMemHandle(p));
	}
	put(chan_b[1], "k", 1);
}

static void
t_ipc_refused(void)
{
	cudaIpcMemHandle_t ih;
	void *d;
	pid_t other_host, same_host;
	char k;

	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	other_host = spawn(ipc_refuser, 0, "hostB");
	same_host = spawn(ipc_refuser, 0, "hostA");
	CU(cudaSetDevice(1));
	CU(cudaMalloc(&d, 64));
	CU(cudaIpcGetMemHandle(&ih, d));
	CUIS(cudaIpcGetMemHandle(&ih, (uint8_t *)d + 64), cudaErrorInvalidValue);
	put(chan_a[1], &ih, sizeof(ih));
	put(chan_a[1], &ih, sizeof(ih));
	get(chan_b[0], &k, 1);
	get(chan_b[0], &k, 1);
	reap_ok(other_host);
	reap_ok(same_host);
	CU(cudaFree(d));
}

/* ---- NCCL ---------------------------------------------------------------------------------- */

/* n ranks of one communicator in this process, rank i on device devs[i] */
static void
make_comms(int n, const int *devs, ncclComm_t *c, bool blocking)
{
	ncclUniqueId id;
	ncclConfig_t cfg = nonblocking();

	cfg.blocking = blocking;
	NC(ncclGetUniqueId(&id));
	NC(ncclGroupStart());
	for (int i = 0; i < n; i++) {
		CU(cudaSetDevice(devs[i]));
		NC(ncclCommInitRankConfig(&c[i], n, id, i, &cfg));
	}
	NC(ncclGroupEnd());
	for (int i = 0; i < n; i++)
		CK(wait_comm(c[i], 20000) == ncclSuccess, "init of rank %d", i);
}

static cudaStream_t
stream_on(int dev)
{
	cudaStream_t s;

	CU(cudaSetDevice(dev));
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	return s;
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
	pid_t a, b;

	CK(pipe(id_pipe) == 0, "pipe");
	a = spawn(exchange_proc, 0, "host0");
	b = spawn(exchange_proc, 1, "host1");
	reap_ok(a);
	reap_ok(b);
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
	NCIS(ncclCommAbort(c), ncclSuccess);
	CK(counters().comms_live == 0, "comms");
}

static void
t_nccl_two_ranks_one_device(void)
{
	pid_t a, b;

	CK(pipe(id_pipe) == 0, "pipe");
	a = spawn(same_device_rank, 0, "hostA");
	b = spawn(same_device_rank, 1, "hostA");
	reap_ok(a);
	reap_ok(b);
}

static void
mismatch_case(size_t scount, ncclDataType_t st, size_t rcount, ncclDataType_t rt)
{
	const int devs[2] = {0, 1};
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	void *b0 = dev_buf(0, 1024, 1), *b1 = dev_buf(1, 1024, 2);
	ncclResult_t r0, r1;

	make_comms(2, devs, c, true);
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

static void
t_nccl_unmatched_blocks_until_abort(void)
{
	const int devs[2] = {0, 1};
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0);
	void *b0 = dev_buf(0, 256, 1);
	ncclResult_t r;

	make_comms(2, devs, c, false);
	NCIS(ncclSend(b0, 256, ncclUint8, 1, c[0], s0), ncclInProgress); /* no receive */
	CK(wait_comm(c[0], 20000) == ncclSuccess, "launch");
	CK(wait_stream(s0, 500) == cudaErrorNotReady, "an unmatched send completed");
	NCIS(ncclCommGetAsyncError(c[0], &r), ncclSuccess);
	CK(r == ncclSuccess, "error %d while waiting", r);
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	CK(wait_stream(s0, 10000) == cudaSuccess, "abort did not release the stream");
	NCIS(ncclCommDestroy(c[1]), ncclSuccess);
	CK(counters().comms_live == 0, "comms %lld", (long long)counters().comms_live);
	CU(cudaFree(b0));
}

static void
t_nccl_shrink(void)
{
	const int devs[3] = {0, 1, 2};
	ncclComm_t c[3], n0 = (ncclComm_t)1, n1 = (ncclComm_t)1;
	ncclConfig_t cfg = nonblocking();
	int ex[1] = {2}, self[1] = {0};
	ncclResult_t st;
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	uint8_t *b0 = dev_buf(0, 512, 5), *b1 = dev_buf(1, 512, 0), got[512], want[512];

	make_comms(3, devs, c, false);
	NCIS(ncclCommShrink(c[0], self, 1, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], ex, 0, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
	NCIS(ncclCommShrink(c[0], ex, 1, &n0, &cfg, NCCL_SHRINK_DEFAULT), ncclInProgress);
	CK(n0 == NULL, "newcomm is published before the shrink completed");
	NCIS(ncclCommGetAsyncError(c[0], &st), ncclSuccess);
	CK(st == ncclInProgress, "parent state %d during the shrink", st);
	NCIS(ncclCommDestroy(c[0]), ncclInvalidArgument);
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

static void
t_nccl_buffer_of_another_device(void)
{
	const int devs[2] = {0, 1};
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0);
	void *on1 = dev_buf(1, 64, 1);
	ncclResult_t r;

	make_comms(2, devs, c, true);
	NCIS(ncclSend(on1, 64, ncclUint8, 1, c[0], s0), ncclSuccess);
	CUIS(cudaStreamSynchronize(s0), cudaErrorIllegalAddress);
	NCIS(ncclCommGetAsyncError(c[0], &r), ncclSuccess);
	CK(r == ncclUnhandledCudaError, "async %d", r);
	NCIS(ncclCommAbort(c[0]), ncclSuccess);
	NCIS(ncclCommAbort(c[1]), ncclSuccess);
}

static void
t_nccl_stream_of_another_device(void)
{
	const int devs[2] = {0, 1};
	ncclComm_t c[2];
	cudaStream_t s1 = stream_on(1);
	void *b = dev_buf(0, 64, 1), *h = malloc(64);

	make_comms(2, devs, c, true);
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
	const int devs[2] = {0, 1};
	ncclComm_t c[2];
	cudaStream_t s0 = stream_on(0), s1 = stream_on(1);
	uint8_t *b0 = dev_buf(0, 128, 4), *b1 = dev_buf(1, 128, 0), got[128], want[128];
	ncclResult_t st;

	/* REFIT_EMU_DELAY_US=300000: the launch takes that long */
	make_comms(2, devs, c, false);
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
	pid_t a, b;

	CK(pipe(id_pipe) == 0, "pipe");
	a = spawn(dying_peer, 0, "hostA");
	b = spawn(dying_peer, 1, "hostB");
	reap_ok(b);
	reap_ok(a);
}

/* ---- the driver ------------------------------------------------------------------------------ */

typedef struct test {
	const char *name;
	void (*fn)(void);
	const char *env;            /* extra NAME=VALUE settings, space separated */
} test_t;

static const test_t tests[] = {
	{"devices", t_devices, NULL},
	{"host_deref_segv", t_host_deref_segv, NULL},
	{"copies_exact", t_copies_exact, NULL},
	{"async_stale_notready", t_async_stale_notready, "REFIT_EMU_DELAY_US=200000"},
	{"cross_device_copy_sticky", t_cross_device_copy_sticky, NULL},
	{"out_of_allocation_sticky", t_out_of_allocation_sticky, NULL},
	{"use_after_free_sticky", t_use_after_free_sticky, NULL},
	{"pitch_and_kind_errors", t_pitch_and_kind_errors, NULL},
	{"copy_2d_3d_exact", t_copy_2d_3d_exact, NULL},
	{"kernel_strided", t_kernel_strided, NULL},
	{"kernel_cross_device_sticky", t_kernel_cross_device_sticky, NULL},
	{"memory_limit", t_memory_limit, "REFIT_EMU_DEVICE_MEM=1048576"},
	{"counters_and_dump", t_counters_and_dump, NULL},
	{"ipc_between_processes", t_ipc_between_processes, NULL},
	{"ipc_mapping_device", t_ipc_mapping_device, NULL},
	{"ipc_refused", t_ipc_refused, NULL},
	{"nccl_exchange_4_ranks_2_processes", t_nccl_exchange_4_ranks_2_processes, NULL},
	{"nccl_nonblocking_init", t_nccl_nonblocking_init, NULL},
	{"nccl_unconsumed_id", t_nccl_unconsumed_id, NULL},
	{"nccl_two_ranks_one_device", t_nccl_two_ranks_one_device, NULL},
	{"nccl_mismatch_fails_both", t_nccl_mismatch_fails_both, NULL},
	{"nccl_unmatched_blocks_until_abort", t_nccl_unmatched_blocks_until_abort, NULL},
	{"nccl_shrink", t_nccl_shrink, NULL},
	{"nccl_buffer_of_another_device", t_nccl_buffer_of_another_device, NULL},
	{"nccl_stream_of_another_device", t_nccl_stream_of_another_device, NULL},
	{"nccl_group_in_progress_until_launched", t_nccl_group_in_progress_until_launched,
	 "REFIT_EMU_DELAY_US=300000"},
	{"nccl_peer_death_remote_error", t_nccl_peer_death_remote_error, NULL},
};

static int
rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static void
set_env(const char *spec)
{
	char buf[300], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", spec ? spec : "");
	for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(t, '=');

		if (eq) {
			*eq = 0;
			setenv(t, eq + 1, 1);
		}
	}
}

/* Run one test in a child; 0 passed. */
static int
run_one(const test_t *t)
{
	char log[300];
	pid_t pid;
	int rc;

	snprintf(tdir, sizeof(tdir), "/tmp/refit-emu-test-XXXXXX");
	if (mkdtemp(tdir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(log, sizeof(log), "%s/stderr.log", tdir);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd >= 0)
			dup2(fd, 2);
		setpgid(0, 0);
		setenv("REFIT_EMU_DIR", tdir, 1);
		setenv("REFIT_EMU_DEVICES", "4", 1);
		setenv("REFIT_EMU_DELAY_US", "50-300", 1);
		setenv("NCCL_HOSTID", "hostA", 1);
		unsetenv("REFIT_EMU_COUNTERS");
		set_env(t->env);
		alarm(60);
		t->fn();
		exit(0); /* atexit: counters, leak checks of sanitizer builds */
	}
	rc = reap(pid);
	kill(-pid, SIGKILL); /* helpers left behind */
	if (rc != 0) {
		char line[512];
		FILE *f = fopen(log, "r");

		printf("FAIL %s (status %d)\n", t->name, rc);
		while (f && fgets(line, sizeof(line), f))
			printf("    %s", line);
		if (f)
			fclose(f);
	} else {
		printf("ok   %s\n", t->name);
	}
	nftw(tdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return rc != 0;
}

int
main(int argc, char **argv)
{
	int pass = 0, fail = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		if (argc > 1 && strstr(tests[i].name, argv[1]) == NULL)
			continue;
		if (run_one(&tests[i]))
			fail++;
		else
			pass++;
	}
	printf("emu: %d passed, %d failed\n", pass, fail);
	return fail != 0;
}
