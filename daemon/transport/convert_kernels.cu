/*
 * convert_kernels.cu - precision conversion kernels for the GPU path (see
 * convert_kernels.h and docs/conversion.md).  The element rules come from
 * dataplane/convert_elem.h, shared with the host code.
 *
 * Compile without --use_fast_math: the scale and the quotient are IEEE
 * fp32 divisions, as on the host.
 */
#include <cuda_runtime.h>

#include "dataplane/convert_elem.h"
#include "daemon/transport/convert_kernels.h"

/* plan_dtype_t values (plan/box.h), repeated so nvcc needs no C headers */
enum { DT_FP8E4M3 = 6, DT_FP16 = 8, DT_BF16 = 9, DT_FP32 = 10 };

#define THREADS 256

__device__ __forceinline__ uint32_t
widen(const void *p, int from, int64_t i)
{
	if (from == DT_FP32)
		return ((const uint32_t *)p)[i];
	if (from == DT_BF16)
		return (uint32_t)((const uint16_t *)p)[i] << 16;
	return dp_widen_fp16(((const uint16_t *)p)[i]);
}

extern "C" __global__ void
refit_k_cast(const void *src, int from, void *dst, int to, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t u = widen(src, from, (int64_t)i);

		if (to == DT_BF16)
			((uint16_t *)dst)[i] = dp_elem_bf16(u);
		else
			((uint16_t *)dst)[i] = dp_elem_fp16(u);
	}
}

/* one thread block per scale block: max of |x| bits, then the scale */
extern "C" __global__ void
refit_k_block_scales(const void *src, int from, int64_t ld, int64_t rows, int64_t cols,
		     int64_t br, int64_t bc, uint32_t *scale, int64_t scale_ld)
{
	__shared__ uint32_t red[THREADS];
	int64_t bi = blockIdx.y, bj = blockIdx.x;
	int64_t r_end = min((bi + 1) * br, rows), c_end = min((bj + 1) * bc, cols);
	int64_t h = r_end - bi * br, w = c_end - bj * bc;
	uint32_t m = 0;

	for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x) {
		int64_t r = bi * br + k / w, c = bj * bc + k % w;
		uint32_t a = widen(src, from, r * ld + c) & 0x7fffffffu;

		m = a > m ? a : m;
	}
	red[threadIdx.x] = m;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s && red[threadIdx.x + s] > red[threadIdx.x])
			red[threadIdx.x] = red[threadIdx.x + s];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		scale[bi * scale_ld + bj] = dp_elem_scale_inv(red[0]);
}

extern "C" __global__ void
refit_k_quant_e4m3(const void *src, int from, int64_t src_ld, uint8_t *dst, int64_t dst_ld,
		   int64_t rows, int64_t cols, int64_t r0, int64_t c0, int64_t br, int64_t bc,
		   const uint32_t *scale, int64_t scale_ld)
{
	uint64_t n = (uint64_t)rows * (uint64_t)cols;

	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		int64_t r = (int64_t)(i / (uint64_t)cols), c = (int64_t)(i % (uint64_t)cols);
		float s = dp_float_of(scale[((r0 + r) / br) * scale_ld + (c0 + c) / bc]);
		float x = dp_float_of(widen(src, from, r * src_ld + c));

		dst[r * dst_ld + c] = dp_elem_e4m3(dp_bits_of(x / s));
	}
}

static unsigned
blocks_for(uint64_t n)
{
	uint64_t b = (n + THREADS - 1) / THREADS;

	return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

extern "C" int
refit_cuda_cast(const void *src, int from, void *dst, int to, uint64_t n, void *stream)
{
	if (n == 0)
		return 0;
	refit_k_cast<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(src, from, dst, to, n);
	return (int)cudaGetLastError();
}

extern "C" int
refit_cuda_block_scales(const void *src, int from, int64_t src_ld, int64_t rows, int64_t cols,
			int64_t br, int64_t bc, uint32_t *scale_inv, int64_t scale_ld,
			void *stream)
{
	dim3 grid((unsigned)((cols + bc - 1) / bc), (unsigned)((rows + br - 1) / br));

	if (rows <= 0 || cols <= 0)
		return 0;
	refit_k_block_scales<<<grid, THREADS, 0, (cudaStream_t)stream>>>(
		src, from, src_ld, rows, cols, br, bc, scale_inv, scale_ld);
	return (int)cudaGetLastError();
}

extern "C" int
refit_cuda_quant_e4m3(const void *src, int from, int64_t src_ld, uint8_t *dst, int64_t dst_ld,
		      int64_t rows, int64_t cols, int64_t r0, int64_t c0, int64_t br, int64_t bc,
		      const uint32_t *scale_inv, int64_t scale_ld, void *stream)
{
	uint64_t n = (uint64_t)(rows > 0 ? rows : 0) * (uint64_t)(cols > 0 ? cols : 0);

	if (n == 0)
		return 0;
	refit_k_quant_e4m3<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(
		src, from, src_ld, dst, dst_ld, rows, cols, r0, c0, br, bc, scale_inv, scale_ld);
	return (int)cudaGetLastError();
}

/* ---- test helpers --------------------------------------------------------------- */

extern "C" int
refit_cuda_devices(void)
{
	int n = 0;

	return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" void *
refit_cuda_alloc(uint64_t bytes)
{
	void *p = NULL;

	return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

extern "C" void
refit_cuda_free(void *p)
{
	cudaFree(p);
}

extern "C" int
refit_cuda_copy(void *dst, const void *src, uint64_t n, int to_device)
{
	return (int)cudaMemcpy(dst, src, n, to_device ? cudaMemcpyHostToDevice :
						     cudaMemcpyDeviceToHost);
}

extern "C" int
refit_cuda_sync(void)
{
	return (int)cudaDeviceSynchronize();
}
