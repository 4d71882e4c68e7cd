/*
 * kernels.cu - refit's device kernels (ABI: gpu_kernels.h), built by nvcc
 * into librefit-gpu-kernels.so and loaded by refitd with dlopen.
 *
 * refitGpuCopyStrided: one thread per element (grid-stride loop): the
 * linear index is split into coordinates over shape (row-major), and the
 * element moves from its source to its destination offset.  Used for boxes
 * whose innermost dim is strided, which DMA copies would move one element
 * per descriptor.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "daemon/transport/gpu_kernels.h"

struct box_arg {
	int ndim;
	int64_t shape[REFIT_GPU_MAX_DIMS];
	int64_t dst_stride[REFIT_GPU_MAX_DIMS];
	int64_t src_stride[REFIT_GPU_MAX_DIMS];
};

template <typename T>
__global__ void
copy_strided(T *dst, const T *src, box_arg a, int64_t total)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t rem = i, so = 0, dof = 0;

		for (int d = a.ndim - 1; d >= 0; d--) {
			int64_t c = rem % a.shape[d];

			rem /= a.shape[d];
			so += c * a.src_stride[d];
			dof += c * a.dst_stride[d];
		}
		dst[dof] = src[so];
	}
}

extern "C" int
refitGpuCopyStrided(void *stream, void *dst, const void *src, int ndim, const int64_t *shape,
		    const int64_t *dst_stride, const int64_t *src_stride, int elem_size)
{
	box_arg a;
	int64_t total = 1;
	cudaStream_t st = (cudaStream_t)stream;
	int threads = 256;
	int64_t blocks;

	if (ndim < 1 || ndim > REFIT_GPU_MAX_DIMS || dst == NULL || src == NULL)
		return (int)cudaErrorInvalidValue;
	a.ndim = ndim;
	for (int d = 0; d < ndim; d++) {
		if (shape[d] < 0 || dst_stride[d] < 0 || src_stride[d] < 0)
			return (int)cudaErrorInvalidValue;
		a.shape[d] = shape[d];
		a.dst_stride[d] = dst_stride[d];
		a.src_stride[d] = src_stride[d];
		total *= shape[d];
	}
	if (total == 0)
		return (int)cudaSuccess;
	blocks = (total + threads - 1) / threads;
	if (blocks > 65535)
		blocks = 65535;
#define LAUNCH(T)                                                                   \
	copy_strided<T><<<(unsigned)blocks, threads, 0, st>>>((T *)dst, (const T *)src, a, \
							      total)
	switch (elem_size) {
	case 1: LAUNCH(uint8_t); break;
	case 2: LAUNCH(uint16_t); break;
	case 4: LAUNCH(uint32_t); break;
	case 8: LAUNCH(uint64_t); break;
	default:
		return (int)cudaErrorInvalidValue;
	}
#undef LAUNCH
	return (int)cudaGetLastError();
}
