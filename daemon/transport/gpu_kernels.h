/*
 * gpu_kernels.h - the device kernels refit loads at run time (kernels.cu,
 * built by nvcc into librefit-gpu-kernels.so where nvcc exists).
 *
 * refitGpuCopyStrided copies an ndim box, element by element, from src to
 * dst: element (i0, ..., i{n-1}) is at src + sum(i_d * src_stride[d]) *
 * elem_size and goes to dst + sum(i_d * dst_stride[d]) * elem_size.
 * Strides are in elements, >= 0 (0 only on the source: broadcast dims);
 * ndim 1..8; elem_size 1, 2, 4 or 8.  Asynchronous on stream (a
 * cudaStream_t); both pointers are memory of the stream's device.  Returns
 * a cudaError_t value (0: launched).
 */
#ifndef REFIT_DAEMON_GPU_KERNELS_H
#define REFIT_DAEMON_GPU_KERNELS_H

#include <stdint.h>

#define REFIT_GPU_MAX_DIMS 8

#ifdef __cplusplus
extern "C" {
#endif

typedef int (*refit_gpu_copy_strided_fn)(void *stream, void *dst, const void *src, int ndim,
					 const int64_t *shape, const int64_t *dst_stride,
					 const int64_t *src_stride, int elem_size);

int refitGpuCopyStrided(void *stream, void *dst, const void *src, int ndim,
			const int64_t *shape, const int64_t *dst_stride,
			const int64_t *src_stride, int elem_size);

#ifdef __cplusplus
}
#endif

#endif
