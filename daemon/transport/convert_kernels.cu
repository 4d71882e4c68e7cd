/*
 * convert_kernels.cu - precision conversion kernels for the GPU path (see
 * convert_kernels.h, dataplane/cvt_op.h and docs/conversion.md).  The
 * element rules come from dataplane/convert_elem.h, shared with the host.
 *
 * Compile without --use_fast_math: the scale and the quotient are IEEE
 * fp32 divisions, as on the host.
 *
 * Grid sizes: every kernel loops (grid-stride) over its elements or its
 * scale blocks, so a launch never asks for more blocks than the caps
 * below, whatever the tensor (a 1-D grid of at most 2^19 blocks; the
 * scales' old 2-D grid put row blocks on gridDim.y, at most 65535).
 * Alignment: each operand's base is checked against its element size
 * before the launch (refused with cudaErrorInvalidValue, not left to a
 * sticky cudaErrorMisalignedAddress); strides are in elements, so every
 * element is then aligned.
 */
#include <cuda_runtime.h>

#include "dataplane/convert_elem.h"
#include "daemon/transport/convert_kernels.h"

/* plan_dtype_t values (plan/box.h), repeated so nvcc needs no C headers */
enum { DT_FP8E4M3 = 6, DT_FP16 = 8, DT_BF16 = 9, DT_FP32 = 10 };

#define THREADS 256
#define MAX_BLOCKS (1u << 19)

__device__ __forceinline__ uint32_t
widen(const void *p, int from, int64_t i)
{
	if (from == DT_FP32)
		return ((const uint32_t *)p)[i];
	if (from == DT_BF16)
		return (uint32_t)((const uint16_t *)p)[i] << 16;
	return dp_widen_fp16(((const uint16_t *)p)[i]);
}

__global__ void
k_cast(dp_cvt_op_t a)
{
	uint64_t n = (uint64_t)a.rows * (uint64_t)a.cols;

	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		int64_t r = (int64_t)(i / (uint64_t)a.cols), c = (int64_t)(i % (uint64_t)a.cols);
		uint32_t u = widen(a.src, a.from, r * a.src_ld + c * a.src_inc);
		uint16_t *d = (uint16_t *)a.dst + r * a.dst_ld + c * a.dst_inc;

		*d = a.to == DT_BF16 ? dp_elem_bf16(u) : dp_elem_fp16(u);
	}
}

/* scale blocks, grid-stride: one thread block reduces one scale block at a
 * time (max of |x| bits: NaN bits lie above inf), thread 0 stores it */
__global__ void
k_scales(dp_cvt_op_t a)
{
	__shared__ uint32_t red[THREADS];
	int64_t nbr = (a.rows + a.br - 1) / a.br, nbc = (a.cols + a.bc - 1) / a.bc;

	for (int64_t b = blockIdx.x; b < nbr * nbc; b += gridDim.x) {
		int64_t bi = b / nbc, bj = b % nbc;
		int64_t r_end = min((bi + 1) * a.br, a.rows), c_end = min((bj + 1) * a.bc, a.cols);
		int64_t h = r_end - bi * a.br, w = c_end - bj * a.bc;
		uint32_t m = 0;

		for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x) {
			int64_t r = bi * a.br + k / w, c = bj * a.bc + k % w;
			uint32_t x = widen(a.src, a.from, r * a.src_ld + c * a.src_inc) & 0x7fffffffu;

			m = x > m ? x : m;
		}
		red[threadIdx.x] = m;
		__syncthreads();
		for (int s = blockDim.x / 2; s > 0; s >>= 1) {
			if (threadIdx.x < s && red[threadIdx.x + s] > red[threadIdx.x])
				red[threadIdx.x] = red[threadIdx.x + s];
			__syncthreads();
		}
		if (threadIdx.x == 0) {
			int64_t at = bi * a.scale_ld + bj * a.scale_inc;

			if (a.mx)
				((uint8_t *)a.scale)[at] = dp_elem_mx_scale(red[0]);
			else
				((uint32_t *)a.scale)[at] = dp_elem_scale_inv(red[0]);
		}
		__syncthreads();   /* red is reused by the next block */
	}
}

__global__ void
k_quant(dp_cvt_op_t a)
{
	uint64_t n = (uint64_t)a.rows * (uint64_t)a.cols;

	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		int64_t r = (int64_t)(i / (uint64_t)a.cols), c = (int64_t)(i % (uint64_t)a.cols);
		int64_t at = ((a.r0 + r) / a.br) * a.scale_ld + ((a.c0 + c) / a.bc) * a.scale_inc;
		uint32_t sb = a.mx ? dp_elem_mx_divisor(((const uint8_t *)a.scale)[at])
				   : ((const uint32_t *)a.scale)[at];
		float x = dp_float_of(widen(a.src, a.from, r * a.src_ld + c * a.src_inc));

		((uint8_t *)a.dst)[r * a.dst_ld + c * a.dst_inc] =
			dp_elem_e4m3(dp_bits_of(x / dp_float_of(sb)));
	}
}

static unsigned
blocks_for(uint64_t n)
{
	uint64_t b = (n + THREADS - 1) / THREADS;

	return (unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

static int
dt_size(int dt)
{
	return dt == DT_FP32 ? 4 : dt == DT_BF16 || dt == DT_FP16 ? 2 : dt == DT_FP8E4M3 ? 1 : 0;
}

static bool
aligned(const void *p, int size)
{
	return size > 0 && (uintptr_t)p % (uintptr_t)size == 0;
}

/* The descriptor's own checks (no runtime state touched): 0 or why not. */
extern "C" int
refit_cvt_op_check(const dp_cvt_op_t *a)
{
	int fs = dt_size(a->from), ss = a->mx ? 1 : 4;
	bool src_ok = (a->from == DT_FP32 || a->from == DT_BF16 || a->from == DT_FP16) &&
		      aligned(a->src, fs);

	if (a->rows < 0 || a->cols < 0 || a->src_ld < 0 || a->src_inc < 0 || a->dst_ld < 0 ||
	    a->dst_inc < 0 || a->scale_ld < 0 || a->scale_inc < 0 || !src_ok)
		return 1;
	switch (a->op) {
	case DP_CVT_CAST:
		return (a->to == DT_BF16 || a->to == DT_FP16) && aligned(a->dst, 2) ? 0 : 2;
	case DP_CVT_SCALES:
		return a->br >= 1 && a->bc >= 1 && aligned(a->scale, ss) ? 0 : 3;
	case DP_CVT_QUANT:
		return a->to == DT_FP8E4M3 && a->dst != NULL && a->br >= 1 && a->bc >= 1 &&
		       a->r0 >= 0 && a->c0 >= 0 && aligned(a->scale, ss) ? 0 : 4;
	}
	return 5;
}

extern "C" int
refit_cuda_convert(const dp_cvt_op_t *a, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	uint64_t n;

	if (a == NULL || refit_cvt_op_check(a) != 0)
		return (int)cudaErrorInvalidValue;
	n = (uint64_t)a->rows * (uint64_t)a->cols;
	if (n == 0)
		return (int)cudaSuccess;
	if (a->op == DP_CVT_CAST) {
		k_cast<<<blocks_for(n), THREADS, 0, st>>>(*a);
	} else if (a->op == DP_CVT_QUANT) {
		k_quant<<<blocks_for(n), THREADS, 0, st>>>(*a);
	} else {
		uint64_t nb = (uint64_t)((a->rows + a->br - 1) / a->br) *
			      (uint64_t)((a->cols + a->bc - 1) / a->bc);

		k_scales<<<(unsigned)(nb > MAX_BLOCKS ? MAX_BLOCKS : nb), THREADS, 0, st>>>(*a);
	}
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
