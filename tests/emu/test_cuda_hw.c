/*
 * test_cuda_hw.c - rule tests of what a GPU enforces on the data path that
 * a host loop would not (see README.md): the strided-copy kernel's element
 * accesses must be aligned to the element size; and a GPU fault on demand
 * (REFIT_EMU_FAULT_D2D), for the handling of sticky errors.
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

const test_t hw_tests[] = {
	TEST(kernel_misaligned_sticky), TEST(kernel_misaligned_dst),
	TEST_ENV(fault_d2d, "REFIT_EMU_FAULT_D2D=2"),
};
const size_t nhw_tests = sizeof(hw_tests) / sizeof(hw_tests[0]);
