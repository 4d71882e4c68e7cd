/*
 * test_cuda_hw.c - rule tests of what a GPU enforces on the data path that
 * a host loop would not (see README.md): the strided-copy kernel's element
 * accesses must be aligned to the element size; device ordinals are per
 * process (CUDA_VISIBLE_DEVICES) and UUIDs name devices across processes;
 * CUDA IPC maps a sub-allocated allocation's whole block;
 * and a GPU fault on demand (REFIT_EMU_FAULT_D2D), for the handling of
 * sticky errors.
 */
#include "tests/emu/test_emu.h"

/* A kernel whose elements start at an address not a multiple of their size
 * kills the context (sticky cudaErrorMisalignedAddress), as T* loads and
 * stores on a GPU; byte elements and aligned bases are fine. */
static void
t_kernel_misaligned_sticky(void)
{
	uint8_t *a, *b, h[64];
	cudaStream_t s;
	int64_t n[1] = {4}, one[1] = {1}, two[1] = {2};
	void *x;

	CU(cudaMalloc((void **)&a, 256));
	CU(cudaMalloc((void **)&b, 256));
	CK((uintptr_t)a % 256 == 0 && (uintptr_t)b % 256 == 0, "cudaMalloc bases %p %p "
	   "not 256-byte aligned", (void *)a, (void *)b);
	s = stream_nb();
	fill(h, sizeof(h), 3);
	CU(cudaMemcpy(a, h, sizeof(h), cudaMemcpyHostToDevice));
	CU(refitGpuCopyStrided(s, b + 3, a + 5, 1, n, one, two, 1)); /* bytes: any address */
	CU(refitGpuCopyStrided(s, b + 16, a + 8, 1, n, one, two, 8)); /* aligned fp64 */
	CU(cudaStreamSynchronize(s));
	/* an fp64 source 4 bytes off: queued (the launch cannot know), faults when run */
	CU(refitGpuCopyStrided(s, b + 64, a + 4, 1, n, one, two, 8));
	CUIS(cudaStreamSynchronize(s), cudaErrorMisalignedAddress);
	CUIS(cudaMalloc(&x, 16), cudaErrorMisalignedAddress);
	CUIS(cudaGetLastError(), cudaErrorMisalignedAddress);
	CK(strstr(counters().sticky, "cudaErrorMisalignedAddress") != NULL, "sticky text: %s",
	   counters().sticky);
}

/* A misaligned destination of 2-byte elements faults the same way. */
static void
t_kernel_misaligned_dst(void)
{
	uint16_t *a, *b;
	cudaStream_t s;
	int64_t n[1] = {8}, one[1] = {1};

	CU(cudaMalloc((void **)&a, 256));
	CU(cudaMalloc((void **)&b, 256));
	s = stream_nb();
	CU(refitGpuCopyStrided(s, (uint8_t *)b + 1, a, 1, n, one, one, 2));
	CUIS(cudaStreamSynchronize(s), cudaErrorMisalignedAddress);
}

/*
 * REFIT_EMU_FAULT_D2D=2 (set by the driver): the second device-to-device
 * copy kills the context when it runs (a GPU fault refit's own code did not
 * cause, for the daemon's handling of sticky errors); the first runs.
 */
static void
t_fault_d2d(void)
{
	uint8_t *a, *b, h[64];
	cudaStream_t s = stream_nb();

	CU(cudaMalloc((void **)&a, 64));
	CU(cudaMalloc((void **)&b, 64));
	memset(h, 5, sizeof(h));
	CU(cudaMemcpyAsync(a, h, 64, cudaMemcpyHostToDevice, s));
	CU(cudaMemcpyAsync(b, a, 64, cudaMemcpyDeviceToDevice, s));
	CU(cudaStreamSynchronize(s));
	CU(cudaMemcpyAsync(a, b, 64, cudaMemcpyDeviceToDevice, s));
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
	CUIS(cudaMalloc((void **)&a, 16), cudaErrorIllegalAddress);
	CK(strstr(counters().sticky, "REFIT_EMU_FAULT_D2D") != NULL, "sticky text: %s",
	   counters().sticky);
}

typedef int (*uuid_fn)(unsigned char *uuid, int dev);

/* cuDeviceGetUuid, through the runtime's entry point */
static uuid_fn
uuid_get(void)
{
	enum cudaDriverEntryPointQueryResult st;
	void *fn = NULL;

	CU(cudaGetDriverEntryPointByVersion("cuDeviceGetUuid", &fn, 12000, 0, &st));
	CK(fn != NULL && st == cudaDriverEntryPointSuccess, "no cuDeviceGetUuid");
	return (uuid_fn)fn;
}

static int to_parent[2], to_child[2], to_importer[2];

/* CUDA_VISIBLE_DEVICES=2,0: two devices, ordinal 0 is the host's device 2;
 * memory of it exported, its UUID said; kept until the parent is done. */
static void
visible_exporter(int arg)
{
	cudaIpcMemHandle_t h;
	unsigned char u[16];
	int n = 0;
	void *d;
	char k;

	(void)arg;
	setenv("CUDA_VISIBLE_DEVICES", "2,0", 1);
	CU(cudaGetDeviceCount(&n));
	CK(n == 2, "%d devices under CUDA_VISIBLE_DEVICES=2,0", n);
	CUIS(cudaSetDevice(2), cudaErrorInvalidDevice);
	CK(uuid_get()(u, 0) == 0, "cuDeviceGetUuid(0)");
	CU(cudaSetDevice(0));
	CU(cudaMalloc(&d, 256));
	CU(cudaMemset(d, 7, 256));
	CU(cudaIpcGetMemHandle(&h, d));
	put(to_parent[1], u, sizeof(u));
	put(to_parent[1], &h, sizeof(h));
	get(to_child[0], &k, 1);
	CU(cudaFree(d));
}

/* CUDA_VISIBLE_DEVICES=1: the host's device 2 is not there. */
static void
hidden_importer(int arg)
{
	cudaIpcMemHandle_t h;
	void *p;

	(void)arg;
	setenv("CUDA_VISIBLE_DEVICES", "1", 1);
	get(to_importer[0], &h, sizeof(h));
	CUIS(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidDevice);
}

/*
 * Ordinals are per process under CUDA_VISIBLE_DEVICES; what names a device
 * across processes is its UUID (cuDeviceGetUuid) and, in an IPC handle, the
 * host's device: memory a process allocated on its ordinal 0 is opened on
 * the host's device 2 by a process that sees every device.
 */
static void
t_visible_devices_uuid(void)
{
	unsigned char u[16], mine[16], other[16];
	cudaIpcMemHandle_t h;
	struct cudaPointerAttributes at;
	uint8_t b[256];
	pid_t ex, im;
	void *p;

	CK(pipe(to_parent) == 0 && pipe(to_child) == 0 && pipe(to_importer) == 0, "pipe");
	ex = spawn(visible_exporter, 0, NULL);
	close(to_parent[1]); /* a failed exporter closes the pipe: no wait for the alarm */
	get(to_parent[0], u, sizeof(u));
	get(to_parent[0], &h, sizeof(h));
	im = spawn(hidden_importer, 0, NULL);
	put(to_importer[1], &h, sizeof(h));
	reap_ok(im);
	CK(uuid_get()(mine, 2) == 0 && uuid_get()(other, 0) == 0, "cuDeviceGetUuid");
	CK(memcmp(u, mine, 16) == 0, "the exporter's ordinal 0 is not the host's device 2 "
	   "by UUID");
	CK(memcmp(u, other, 16) != 0, "two devices with one UUID");
	CK(uuid_get()(mine, 4) == 101, "cuDeviceGetUuid of a device that does not exist");
	CU(cudaSetDevice(2));
	CU(cudaIpcOpenMemHandle(&p, h, 0));
	CU(cudaPointerGetAttributes(&at, p));
	CK(at.type == cudaMemoryTypeDevice && at.device == 2, "the mapping is on device %d",
	   at.device);
	CU(cudaMemcpy(b, p, sizeof(b), cudaMemcpyDeviceToHost));
	CK(b[0] == 7 && b[255] == 7, "the exporter's bytes");
	CU(cudaIpcCloseMemHandle(p));
	put(to_child[1], "k", 1);
	reap_ok(ex);
}

typedef int (*range_fn)(unsigned long long *base, size_t *size, unsigned long long p);

static range_fn
range_get(void)
{
	enum cudaDriverEntryPointQueryResult st;
	void *fn = NULL;

	CU(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, 0, &st));
	CK(fn != NULL, "no cuMemGetAddressRange");
	return (range_fn)fn;
}

/* The importer of a small allocation: the mapping is the whole block. */
static void
suballoc_importer(int arg)
{
	cudaIpcMemHandle_t h;
	unsigned long long base = 0;
	size_t size = 0;
	uint8_t *b, x[256];

	(void)arg;
	get(to_importer[0], &h, sizeof(h));
	CU(cudaIpcOpenMemHandle((void **)&b, h, cudaIpcMemLazyEnablePeerAccess));
	CK(range_get()(&base, &size, (unsigned long long)(uintptr_t)b) == 0, "range of b");
	CK(base < (uintptr_t)b && (uintptr_t)b - base == 65536 && size == 2u << 20,
	   "the mapping of a 256-byte allocation: 0x%llx + %zu, b %p", base, size, (void *)b);
	CU(cudaMemcpy(x, b, sizeof(x), cudaMemcpyDeviceToHost));
	CK(x[0] == 9 && x[255] == 9, "the exporter's bytes at b");
	CU(cudaMemcpy(x, (void *)(uintptr_t)base, 16, cudaMemcpyDeviceToHost)); /* the block */
	CU(cudaIpcCloseMemHandle(b));
	put(to_parent[1], "k", 1);
}

/*
 * cudaMalloc sub-allocation: a small allocation lives inside a larger block
 * and CUDA IPC maps the whole block ("the entire underlying memory block",
 * the CUDA programming guide): the importer's pointer is the allocation's
 * place inside the mapping, which cuMemGetAddressRange says starts before
 * it.  The exporter's own range is its allocation alone.
 */
static void
t_suballocation_ipc_block(void)
{
	cudaIpcMemHandle_t h;
	unsigned long long base = 0;
	size_t size = 0;
	pid_t im;
	void *d;
	char k;

	CK(pipe(to_parent) == 0 && pipe(to_importer) == 0, "pipe");
	im = spawn(suballoc_importer, 0, NULL);
	close(to_parent[1]);
	CU(cudaMalloc(&d, 256));
	CU(cudaMemset(d, 9, 256));
	CK(range_get()(&base, &size, (unsigned long long)(uintptr_t)d) == 0 &&
	   base == (uintptr_t)d && size == 256, "the exporter's range: 0x%llx + %zu", base, size);
	CU(cudaIpcGetMemHandle(&h, d));
	put(to_importer[1], &h, sizeof(h));
	get(to_parent[0], &k, 1);
	reap_ok(im);
	CU(cudaFree(d));
}

/* A CUDA_VISIBLE_DEVICES that names no device of the host: a bad environment. */
static void
t_visible_devices_bad(void)
{
	int n;

	setenv("CUDA_VISIBLE_DEVICES", "7", 1);
	CUIS(cudaGetDeviceCount(&n), cudaErrorInitializationError);
}

/*
 * The conversion launcher (refit_cuda_convert) refuses a base not aligned
 * to its element size at the launch (cudaErrorInvalidValue, not sticky:
 * the real launcher checks before a misaligned load could fault), and
 * converts aligned ones.
 */
static void
t_convert_misaligned_refused(void)
{
	uint8_t *a, *b;
	cudaStream_t s;
	void *x;
	dp_cvt_op_t op = {.op = DP_CVT_CAST, .from = 10, .to = 9, .rows = 1, .cols = 8,
			  .src_inc = 1, .dst_inc = 1, .br = 1, .bc = 1};

	CU(cudaMalloc((void **)&a, 256));
	CU(cudaMalloc((void **)&b, 256));
	CU(cudaMemset(a, 0, 256));
	s = stream_nb();
	op.src = a;
	op.dst = b;
	CU(refit_cuda_convert(&op, s));
	op.src = a + 2;            /* fp32 two bytes off */
	CUIS(refit_cuda_convert(&op, s), cudaErrorInvalidValue);
	op.src = a;
	op.dst = b + 1;            /* a bf16 destination one byte off */
	CUIS(refit_cuda_convert(&op, s), cudaErrorInvalidValue);
	CU(cudaStreamSynchronize(s));
	CU(cudaMalloc(&x, 16));    /* not sticky */
	CU(cudaFree(x));
}

/*
 * A quantization whose block grid offset (r0) reaches scales past their
 * allocation: the kernel's stray read kills the context when it runs
 * (sticky cudaErrorIllegalAddress) -- the driver's geometry
 * (dataplane/conv_dev.c) must keep every access inside its buffers.
 */
static void
t_convert_scales_out_of_bounds(void)
{
	uint8_t *a, *q;
	uint32_t *sc;
	cudaStream_t s;
	dp_cvt_op_t op = {.op = DP_CVT_QUANT, .from = 9, .to = 6, .rows = 4, .cols = 4,
			  .src_ld = 4, .src_inc = 1, .dst_ld = 4, .dst_inc = 1, .scale_ld = 1,
			  .scale_inc = 1, .br = 2, .bc = 4};

	CU(cudaMalloc((void **)&a, 32));
	CU(cudaMalloc((void **)&q, 16));
	CU(cudaMalloc((void **)&sc, 8));   /* the two blocks of the 4 x 4 region */
	CU(cudaMemset(a, 0, 32));
	CU(cudaMemset(sc, 0, 8));
	s = stream_nb();
	op.src = a;
	op.dst = q;
	op.scale = sc;
	CU(refit_cuda_convert(&op, s));
	CU(cudaStreamSynchronize(s));
	op.r0 = 2;                          /* rows 2..5 of the grid: block 2 is past it */
	CU(refit_cuda_convert(&op, s));
	CUIS(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
	CUIS(cudaGetLastError(), cudaErrorIllegalAddress);
}

const test_t hw_tests[] = {
	TEST(convert_misaligned_refused), TEST(convert_scales_out_of_bounds),
	TEST(visible_devices_uuid), TEST(visible_devices_bad), TEST(suballocation_ipc_block),
	TEST(kernel_misaligned_sticky), TEST(kernel_misaligned_dst),
	TEST_ENV(fault_d2d, "REFIT_EMU_FAULT_D2D=2"),
};
const size_t nhw_tests = sizeof(hw_tests) / sizeof(hw_tests[0]);
