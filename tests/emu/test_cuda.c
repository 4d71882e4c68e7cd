/*
 * test_cuda.c - rule tests of the emulated CUDA runtime: devices, memory,
 * streams, copies, the kernel, IPC, counters (see README.md).
 */
#include "tests/emu/test_emu.h"

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

/* the device allocation of a test, for the processes it forks */
static void *forked_buf;

static void
write_device_pointer(int arg)
{
	volatile uint8_t *b = forked_buf;

	(void)arg;
	signal(SIGSEGV, SIG_DFL); /* no sanitizer report: the plain signal */
	b[0] = 1; /* a device pointer: must fault */
	_exit(0);
}

static void
t_host_deref_segv(void)
{
	CU(cudaMalloc(&forked_buf, 4096));
	CK(reap(spawn(write_device_pointer, 0, NULL)) == 128 + SIGSEGV,
	   "writing through a device pointer did not SIGSEGV");
	CK(cudaPointerGetAttributes(&(struct cudaPointerAttributes){0}, forked_buf) == cudaSuccess,
	   "attrs");
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
	s = stream_nb();
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

/*
 * REFIT_EMU_HANG_D2H=2 (set by the driver): the second device-to-host copy
 * never ends and writes nothing; its stream stays not ready (the first and
 * the copies of other kinds run); another stream is not held up.
 */
static void
t_hang_d2h(void)
{
	uint8_t src[64], h1[64] = {0}, h2[64] = {0}, h3[64] = {0};
	uint8_t *d;
	cudaStream_t s = stream_nb(), o = stream_nb();

	memset(src, 9, sizeof(src));
	CU(cudaMalloc((void **)&d, 64));
	CU(cudaMemcpyAsync(d, src, 64, cudaMemcpyHostToDevice, s));
	CU(cudaMemcpyAsync(h1, d, 64, cudaMemcpyDeviceToHost, s));
	CU(cudaStreamSynchronize(s));
	CK(h1[0] == 9 && h1[63] == 9, "the first copy to the host did not run");
	CU(cudaMemcpyAsync(h2, d, 64, cudaMemcpyDeviceToHost, s));
	CU(cudaMemcpyAsync(h3, d, 64, cudaMemcpyDeviceToHost, o));
	CU(cudaStreamSynchronize(o));
	CK(h3[0] == 9, "the third copy (another stream) did not run");
	for (int i = 0; i < 200; i++) {
		CK(cudaStreamQuery(s) == cudaErrorNotReady, "the hung copy's stream drained");
		usleep(1000);
	}
	CK(h2[0] == 0, "the hung copy wrote");
	/* exit without freeing: the copy may still "run" (as on a stuck GPU) */
}

static void
t_async_stale_notready(void)
{
	uint8_t h[64] = {0}, src[64];
	uint8_t *d;
	cudaStream_t s;
	cudaEvent_t ev;

	/* set by the driver: REFIT_EMU_DELAY_US=1000000 */
	memset(src, 7, sizeof(src));
	CU(cudaMalloc((void **)&d, 64));
	s = stream_nb();
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
	s = stream_nb();
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
	s = stream_nb();
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
	uint8_t *d = dev_alloc(4096);
	cudaStream_t s = stream_nb();
	struct cudaMemcpy3DParms p = {0};

	fill(src, sizeof(src), 3);
	memset(out, 0, sizeof(out));
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
	s = stream_nb();
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
	s1 = stream_nb();
	CU(cudaSetDevice(0));
	CUIS(refitGpuCopyStrided(s1, dt, dm, 2, shape, dst, src, 4),
	     cudaErrorInvalidResourceHandle);
	CU(cudaStreamSynchronize(s));
	/* a kernel reading host memory faults */
	CU(refitGpuCopyStrided(s, dt, m, 2, shape, dst, src, 4));
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
}

/*
 * kernels.cu ends a launch with cudaGetLastError(): an error an earlier
 * call on this thread left unconsumed is returned by the next launch,
 * which ran all the same; the kernel's own argument errors leave the last
 * error alone.
 */
static void
t_kernel_stale_last_error(void)
{
	int32_t h[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[4] = {0};
	int32_t *d;
	cudaStream_t s;
	int64_t shape[1] = {4}, dst[1] = {1}, src[1] = {2};

	CU(cudaMalloc((void **)&d, 64));
	s = stream_nb();
	CU(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice));
	CUIS(cudaMemcpy2DAsync(d + 8, 0, d, 16, 16, 2, cudaMemcpyDeviceToDevice, s),
	     cudaErrorInvalidPitchValue);
	CUIS(refitGpuCopyStrided(s, d + 8, d, 1, shape, dst, src, 4), cudaErrorInvalidPitchValue);
	CU(cudaMemcpyAsync(out, d + 8, sizeof(out), cudaMemcpyDeviceToHost, s));
	CU(cudaStreamSynchronize(s));
	CK(out[0] == 1 && out[1] == 3 && out[2] == 5 && out[3] == 7, "the kernel did not run: "
	   "%d %d %d %d", out[0], out[1], out[2], out[3]);
	CUIS(cudaGetLastError(), cudaSuccess);   /* the launch consumed it */
	CU(refitGpuCopyStrided(s, d + 8, d, 1, shape, dst, src, 4));
	CUIS(cudaMemcpy2DAsync(d + 8, 0, d, 16, 16, 2, cudaMemcpyDeviceToDevice, s),
	     cudaErrorInvalidPitchValue);
	CUIS(refitGpuCopyStrided(s, d + 8, d, 0, shape, dst, src, 4), cudaErrorInvalidValue);
	CUIS(cudaGetLastError(), cudaErrorInvalidPitchValue);
	CU(cudaStreamSynchronize(s));
	CU(cudaFree(d));
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
	s = stream_nb();
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
	s = stream_nb();
	fill(want, sizeof(want), 9);
	CU(cudaMemcpyAsync(got, p + 100, 256, cudaMemcpyDeviceToHost, s)); /* an offset */
	CU(cudaStreamSynchronize(s));
	CK(memcmp(got, want, 256) == 0, "IPC bytes differ");
	memset(got, 0x5a, 256);
	CU(cudaMemcpyAsync(p, got, 256, cudaMemcpyHostToDevice, s));
	CU(cudaStreamSynchronize(s));
	if (mode == 2) { /* the exporter frees it: using it faults */
		put(chan_b[1], "k", 1);
		get(chan_a[0], got, 1);
		CU(cudaMemcpyAsync(got, p, 16, cudaMemcpyDeviceToHost, s));
		CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
		return;
	}
	if (mode == 1) { /* the mapping belongs to device 1: a device-0 stream faults */
		cudaStream_t s0;

		CU(cudaSetDevice(0));
		s0 = stream_nb();
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
	if (mode == 2) {
		CU(cudaFree(d));
		put(chan_a[1], "f", 1);
	}
	reap_ok(pid);
}

static void
t_ipc_between_processes(void)
{
	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	ipc_exporter(0);
}

static void
t_ipc_use_after_exporter_free(void)
{
	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	ipc_exporter(2);
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

	get(chan_a[0], &h, sizeof(h));
	if (strcmp(getenv("NCCL_HOSTID"), "hostB") == 0) {
		CUIS(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
		     cudaErrorMapBufferObjectFailed);
	} else if (arg == 1) { /* same host, another REFIT_EMU_DIR */
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

/*
 * The importer maps A, then B: B starts where A ends, so the byte past A is
 * device memory (cudaPointerGetAttributes cannot tell a claim past A from
 * A); cuMemGetAddressRange, from cudaGetDriverEntryPointByVersion, gives
 * each mapping's own base and size.
 */
typedef int (*range_fn)(unsigned long long *, size_t *, unsigned long long);

static void
ipc_ranger(int arg)
{
	cudaIpcMemHandle_t h[2];
	struct cudaPointerAttributes at;
	enum cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
	unsigned long long base = 0;
	size_t size = 0;
	uint8_t *p[2];
	void *fn = NULL, *pin = NULL, *plain = malloc(16);
	range_fn range;

	(void)arg;
	get(chan_a[0], h, sizeof(h));
	CU(cudaSetDevice(1));
	for (int i = 0; i < 2; i++)
		CU(cudaIpcOpenMemHandle((void **)&p[i], h[i], cudaIpcMemLazyEnablePeerAccess));
	CK(p[1] == p[0] + 65536, "B (%p) does not start where A (%p, 64 KiB) ends", p[1], p[0]);
	CU(cudaPointerGetAttributes(&at, p[0] + 65536));
	CK(at.type == cudaMemoryTypeDevice && at.device == 1, "the byte past A: type %d",
	   (int)at.type);
	CU(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
					    &qr));
	CK(fn != NULL && qr == cudaDriverEntryPointSuccess, "no cuMemGetAddressRange (%d)", qr);
	*(void **)&range = fn;
	CK(range(&base, &size, (unsigned long long)(uintptr_t)(p[0] + 100)) == 0 &&
	   base == (uintptr_t)p[0] && size == 65536, "A's range: 0x%llx + %zu", base, size);
	CK(range(&base, &size, (unsigned long long)(uintptr_t)(p[0] + 65536)) == 0 &&
	   base == (uintptr_t)p[1], "the byte past A is not in B (0x%llx)", base);
	CK(range(&base, &size, (unsigned long long)(uintptr_t)plain) == 500, "host memory");
	CU(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 12000, 0, &qr));
	CK(fn == NULL && qr == cudaDriverEntryPointSymbolNotFound, "an unknown symbol: %p %d", fn,
	   qr);
	CUIS(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 13010, 0, NULL),
	     cudaErrorInvalidValue);
	CU(cudaMallocHost(&pin, 4096));
	CUIS(cudaFreeHost(plain), cudaErrorInvalidValue);
	CU(cudaFreeHost(pin));
	CUIS(cudaFreeHost(pin), cudaErrorInvalidValue);
	free(plain);
	for (int i = 0; i < 2; i++)
		CU(cudaIpcCloseMemHandle(p[i]));
	put(chan_b[1], "k", 1);
}

static void
t_ipc_mappings_packed_address_range(void)
{
	cudaIpcMemHandle_t h[2];
	void *d[2];
	pid_t pid;
	char k;

	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	pid = spawn(ipc_ranger, 0, NULL);
	CU(cudaSetDevice(1));
	for (int i = 0; i < 2; i++) {
		CU(cudaMalloc(&d[i], 65536));
		CU(cudaIpcGetMemHandle(&h[i], d[i]));
	}
	put(chan_a[1], h, sizeof(h));
	get(chan_b[0], &k, 1);
	reap_ok(pid);
	for (int i = 0; i < 2; i++)
		CU(cudaFree(d[i]));
}

static void
t_ipc_refused(void)
{
	cudaIpcMemHandle_t ih;
	void *d;
	pid_t other_host, same_host, other_dir;
	char k, dir[300];

	CK(pipe(chan_a) == 0 && pipe(chan_b) == 0, "pipe");
	other_host = spawn(ipc_refuser, 0, "hostB");
	same_host = spawn(ipc_refuser, 0, "hostA");
	snprintf(dir, sizeof(dir), "%s/other", tdir);
	setenv("REFIT_EMU_DIR", dir, 1);
	other_dir = spawn(ipc_refuser, 1, "hostA");
	setenv("REFIT_EMU_DIR", tdir, 1);
	CU(cudaSetDevice(1));
	CU(cudaMalloc(&d, 64));
	CU(cudaIpcGetMemHandle(&ih, d));
	CUIS(cudaIpcGetMemHandle(&ih, (uint8_t *)d + 64), cudaErrorInvalidValue);
	for (int i = 0; i < 3; i++)
		put(chan_a[1], &ih, sizeof(ih));
	for (int i = 0; i < 3; i++)
		get(chan_b[0], &k, 1);
	reap_ok(other_host);
	reap_ok(same_host);
	reap_ok(other_dir);
	CU(cudaFree(d));
}

static void
t_stream_destroy_and_free_sync(void)
{
	uint8_t src[4096], dst[4096];
	uint8_t *d = dev_alloc(sizeof(src));
	cudaStream_t s = stream_nb();

	/* REFIT_EMU_DELAY_US=1000000 */
	memset(src, 3, sizeof(src));
	memset(dst, 0, sizeof(dst));
	CU(cudaMemcpyAsync(d, src, sizeof(src), cudaMemcpyHostToDevice, s));
	CU(cudaMemcpyAsync(dst, d, sizeof(dst), cudaMemcpyDeviceToHost, s));
	CU(cudaStreamDestroy(s)); /* returns at once; the work still runs */
	CK(counters().streams_live == 0, "streams %lld", (long long)counters().streams_live);
	CUIS(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
	CK(dst[0] == 0, "the copy ran before its delay");
	CU(cudaFree(d)); /* synchronises the device first */
	CK(dst[0] == 3 && dst[4095] == 3, "cudaFree did not wait for the queued copies");
}

static void
bad_env_child(int which)
{
	static const char *const bad[][2] = {
		{"REFIT_EMU_DEVICES", "0"}, {"REFIT_EMU_DEVICES", "3x"},
		{"REFIT_EMU_DEVICE_MEM", "-1"}, {"REFIT_EMU_DELAY_US", "9-2"},
		{"REFIT_EMU_DIR", "/tmp/a-directory-name-that-is-far-too-long-for-the-unix-socket-"
				  "paths-that-live-in-it"},
		{"REFIT_EMU_NCCL_VERSION", "2.27"}, {"REFIT_EMU_HANG_D2H", "1x"},
		{"REFIT_EMU_FAULT_D2D", "-1"},
	};
	int n;
	void *p;
	ncclUniqueId id;

	setenv(bad[which][0], bad[which][1], 1);
	CUIS(cudaGetDeviceCount(&n), cudaErrorInitializationError);
	CUIS(cudaMalloc(&p, 16), cudaErrorInitializationError);
	NCIS(ncclGetUniqueId(&id), ncclSystemError);
}

static void
t_bad_environment(void)
{
	for (int i = 0; i < 8; i++)
		reap_ok(spawn(bad_env_child, i, NULL));
}

static void
t_cuda_argument_errors(void)
{
	void *d, *m;
	cudaStream_t s0, s1;
	cudaEvent_t ev;
	cudaIpcMemHandle_t h;
	struct cudaPointerAttributes at;
	uint8_t host[16];

	CUIS(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
	CUIS(cudaGetDeviceCount(NULL), cudaErrorInvalidValue);
	CUIS(cudaStreamCreateWithFlags(&s0, 8), cudaErrorInvalidValue);
	CUIS(cudaEventCreateWithFlags(&ev, 16), cudaErrorInvalidValue);
	CU(cudaMalloc(&d, 64));
	s0 = stream_nb();
	CU(cudaSetDevice(1));
	s1 = stream_nb();
	CU(cudaEventCreate(&ev));
	CUIS(cudaEventRecord(ev, s0), cudaErrorInvalidResourceHandle); /* device 0's stream */
	CU(cudaEventRecord(ev, s1));
	CU(cudaEventSynchronize(ev));
	CU(cudaEventDestroy(ev));
	CUIS(cudaEventDestroy(ev), cudaErrorInvalidResourceHandle);
	CUIS(cudaEventQuery(ev), cudaErrorInvalidResourceHandle);
	CU(cudaStreamDestroy(s1));
	CUIS(cudaStreamDestroy(s1), cudaErrorInvalidResourceHandle);
	CUIS(cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle); /* a default stream */
	CUIS(cudaIpcGetMemHandle(&h, host), cudaErrorInvalidValue);
	CUIS(cudaIpcCloseMemHandle(d), cudaErrorInvalidValue); /* not an IPC mapping */
	CU(cudaSetDevice(0));
	CU(cudaMalloc(&m, 64));
	CU(cudaFree(m));
	CUIS(cudaPointerGetAttributes(&at, m), cudaErrorInvalidValue); /* freed */
	CUIS(cudaPointerGetAttributes(NULL, d), cudaErrorInvalidValue);
	CUIS(cudaMemcpy3DAsync(NULL, s0), cudaErrorInvalidValue);
	{
		int v = 0;

		CU(cudaDriverGetVersion(&v));
		CK(v >= 13000, "driver %d", v);
		CK(strcmp(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress") == 0,
		   "name");
	}
	CU(cudaStreamSynchronize(s0));
	CU(cudaDeviceSynchronize());
	CK(counters().sticky[0] == 0, "an argument error became sticky: %s", counters().sticky);
}

static void
freed_exporter(int arg)
{
	cudaIpcMemHandle_t h;
	void *d;

	(void)arg;
	CU(cudaMalloc(&d, 64));
	CU(cudaIpcGetMemHandle(&h, d));
	CU(cudaFree(d));
	put(chan_a[1], &h, sizeof(h));
}

static void
t_ipc_of_freed_memory(void)
{
	cudaIpcMemHandle_t h;
	void *p;

	CK(pipe(chan_a) == 0, "pipe");
	reap_ok(spawn(freed_exporter, 0, NULL));
	get(chan_a[0], &h, sizeof(h));
	CUIS(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
	     cudaErrorMapBufferObjectFailed);
}


static void
t_legacy_default_stream(void)
{
	uint8_t src[256], out[256];
	uint8_t *d, *big_a, *big_b;
	cudaStream_t blocking;
	int64_t n[1] = {32 << 20}, one[1] = {1};

	/* REFIT_EMU_DELAY_US=200000: without the implicit synchronisation the
	 * NULL stream's copy would run while the long kernel still holds the
	 * blocking stream, before the copy it must see */
	memset(src, 9, sizeof(src));
	CU(cudaMalloc((void **)&d, 256));
	CU(cudaMalloc((void **)&big_a, (size_t)n[0]));
	CU(cudaMalloc((void **)&big_b, (size_t)n[0]));
	CU(cudaStreamCreate(&blocking)); /* no cudaStreamNonBlocking */
	CU(refitGpuCopyStrided(blocking, big_b, big_a, 1, n, one, one, 1));
	CU(cudaMemcpyAsync(d, src, 256, cudaMemcpyHostToDevice, blocking));
	CU(cudaMemcpy(out, d, 256, cudaMemcpyDeviceToHost)); /* waits for the blocking stream */
	CK(out[0] == 9 && out[255] == 9, "the NULL stream did not wait for a blocking stream");
	/* and the other way round */
	CU(cudaMemsetAsync(d, 4, 256, NULL));
	CU(cudaMemcpyAsync(out, d, 256, cudaMemcpyDeviceToHost, blocking));
	CU(cudaStreamSynchronize(blocking));
	CK(out[0] == 4 && out[255] == 4, "a blocking stream did not wait for the NULL stream");
	CU(cudaStreamDestroy(blocking));
}


/* A child of an initialised process: every call fails. */
static void
use_after_fork(int arg)
{
	int n;
	void *p;
	ncclUniqueId id;

	(void)arg;
	CUIS(cudaGetDeviceCount(&n), cudaErrorInitializationError);
	CUIS(cudaMalloc(&p, 64), cudaErrorInitializationError);
	NCIS(ncclGetUniqueId(&id), ncclSystemError);
}

static void
t_fork_after_init(void)
{
	void *p;

	CU(cudaMalloc(&p, 64));
	reap_ok(spawn(use_after_fork, 0, NULL));
	CU(cudaFree(p)); /* the parent is fine */
}

const test_t cuda_tests[] = {
	TEST(fork_after_init), TEST_ENV(legacy_default_stream, "REFIT_EMU_DELAY_US=200000"),
	TEST(devices), TEST(host_deref_segv), TEST(copies_exact),
	TEST_ENV(async_stale_notready, "REFIT_EMU_DELAY_US=1000000"),
	TEST(cross_device_copy_sticky), TEST(out_of_allocation_sticky), TEST(use_after_free_sticky),
	TEST(pitch_and_kind_errors), TEST(copy_2d_3d_exact), TEST(kernel_strided),
	TEST(kernel_stale_last_error),
	TEST(kernel_cross_device_sticky), TEST_ENV(memory_limit, "REFIT_EMU_DEVICE_MEM=1048576"),
	TEST(counters_and_dump), TEST(ipc_between_processes), TEST(ipc_mapping_device),
	TEST(ipc_use_after_exporter_free), TEST(ipc_refused),
	TEST_ENV(stream_destroy_and_free_sync, "REFIT_EMU_DELAY_US=1000000"), TEST(bad_environment),
	TEST(cuda_argument_errors), TEST(ipc_of_freed_memory), TEST(ipc_mappings_packed_address_range),
	TEST_ENV(hang_d2h, "REFIT_EMU_HANG_D2H=2"),
};
const size_t ncuda_tests = sizeof(cuda_tests) / sizeof(cuda_tests[0]);
