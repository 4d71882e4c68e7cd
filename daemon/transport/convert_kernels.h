/*
 * convert_kernels.h - precision conversion on the GPU (docs/conversion.md):
 * the C ABI of daemon/transport/convert_kernels.cu.
 *
 * Built with nvcc, where it exists, into build/lib/librefit-gpu-kernels.so
 * (with the strided-copy kernel, -cudart shared: refitd's one runtime) and
 * build/lib/librefit-convert-cuda.so (tests/conversion/cvt_gpu_test.c).
 * The nccl transport looks refit_cuda_convert up in the kernel library;
 * the emulator's libcudart.so.13 exports the same (tests/emu/emu_convert.c).
 * Element rules are dataplane/convert_elem.h, the host code's own, so GPU
 * and host results are bit-identical.
 */
#ifndef REFIT_DAEMON_TRANSPORT_CONVERT_KERNELS_H
#define REFIT_DAEMON_TRANSPORT_CONVERT_KERNELS_H

#include <stdint.h>

#include "dataplane/cvt_op.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Queue one conversion (dataplane/cvt_op.h) on stream (a cudaStream_t;
 * NULL: the default stream); pointers are memory of the stream's device.
 * Returns a cudaError_t: 0 queued (or nothing to do), cudaErrorInvalidValue
 * for a descriptor refit_cvt_op_check refuses (a misaligned base, a bad
 * dtype or geometry), else cudaGetLastError() after the launch.
 */
int refit_cuda_convert(const dp_cvt_op_t *a, void *stream);
/* 0, or which check a descriptor fails (1 source, 2 cast, 3 scales, 4 quant, 5 op). */
int refit_cvt_op_check(const dp_cvt_op_t *a);

/* Test helpers (tests/conversion/cvt_gpu_test.c): device count, memory,
 * synchronous copies (to_device 1: host -> device), device sync. */
int refit_cuda_devices(void);
void *refit_cuda_alloc(uint64_t bytes);
void refit_cuda_free(void *p);
int refit_cuda_copy(void *dst, const void *src, uint64_t n, int to_device);
int refit_cuda_sync(void);

typedef int (*refit_cuda_convert_fn)(const dp_cvt_op_t *, void *);

#ifdef __cplusplus
}
#endif

#endif
