/*
 * test_cuda_hw.c - rule tests of what a GPU enforces on the data path that
 * a host loop would not (see README.md): the strided-copy kernel's element
 * accesses must be aligned to the element size.
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

const test_t hw_tests[] = {
	TEST(kernel_misaligned_sticky), TEST(kernel_misaligned_dst),
};
const size_t nhw_tests = sizeof(hw_tests) / sizeof(hw_tests[0]);
