/*
 * delta_kernels.h - the delta codec on the GPU (docs/delta.md): the C ABI
 * of daemon/transport/delta_kernels.cu, built with nvcc, where it exists,
 * into build/lib/librefit-gpu-kernels.so beside the copy and conversion
 * kernels.  The emulator's libcudart.so.13 exports the same
 * (tests/emu/emu_delta.c).  The phases are dataplane/delta_dev.h's, and
 * the encoding is the host codec's (dataplane/delta.h) byte for byte.
 */
#ifndef REFIT_DAEMON_TRANSPORT_DELTA_KERNELS_H
#define REFIT_DAEMON_TRANSPORT_DELTA_KERNELS_H

#include "dataplane/delta_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Queue one encode or decode (dataplane/delta_dev.h) on stream (a
 * cudaStream_t; NULL: the default stream); every pointer is memory of the
 * stream's device.  Its result words are written on the stream: read them
 * after a sync.  Returns a cudaError_t: 0 queued, cudaErrorInvalidValue
 * for a descriptor dpd_op_refused refuses, else cudaGetLastError() after
 * the launches.
 */
int refit_cuda_delta(const dp_delta_op_t *a, void *stream);

typedef int (*refit_cuda_delta_fn)(const dp_delta_op_t *, void *);

#ifdef __cplusplus
}
#endif

#endif
