/*
 * gpu.h - the CUDA runtime and NCCL, loaded with dlopen at run time.
 *
 * Built only where the CUDA and NCCL headers exist (REFIT_HAVE_NCCL, see
 * `make config`); the binary never links against libcudart or libnccl, so
 * it starts on machines without them.  gpu_load() loads both libraries
 * once and checks that a device is usable; when anything is missing it
 * returns NULL and says exactly what (library not found, symbol missing,
 * driver too old, no device).
 */
#ifndef REFIT_DAEMON_GPU_H
#define REFIT_DAEMON_GPU_H

#include <stddef.h>

#ifdef REFIT_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#define GPU_FN(name) __typeof__(name) *name
typedef struct gpu_api {
	GPU_FN(cudaGetDeviceCount);
	GPU_FN(cudaSetDevice);
	GPU_FN(cudaGetDevice);
	GPU_FN(cudaMalloc);
	GPU_FN(cudaFree);
	GPU_FN(cudaMemcpy);
	GPU_FN(cudaMemcpyAsync);
	GPU_FN(cudaMemcpy2DAsync);
	GPU_FN(cudaMemset);
	GPU_FN(cudaStreamCreateWithFlags);
	GPU_FN(cudaStreamDestroy);
	GPU_FN(cudaStreamSynchronize);
	GPU_FN(cudaStreamQuery);
	GPU_FN(cudaIpcGetMemHandle);
	GPU_FN(cudaIpcOpenMemHandle);
	GPU_FN(cudaIpcCloseMemHandle);
	GPU_FN(cudaGetErrorString);
	GPU_FN(cudaGetLastError);
	GPU_FN(cudaDriverGetVersion);
	GPU_FN(ncclGetUniqueId);
	GPU_FN(ncclCommInitRankConfig);
	GPU_FN(ncclCommGetAsyncError);
	GPU_FN(ncclCommAbort);
	GPU_FN(ncclCommDestroy);
	GPU_FN(ncclSend);
	GPU_FN(ncclRecv);
	GPU_FN(ncclGroupStart);
	GPU_FN(ncclGroupEnd);
	GPU_FN(ncclGetErrorString);
	GPU_FN(ncclGetVersion);
	GPU_FN(ncclCommShrink);   /* NULL where the NCCL loaded has none */
	int ndevices;
} gpu_api_t;
#undef GPU_FN
#else
typedef struct gpu_api gpu_api_t;
#endif

/*
 * The loaded API (NULL when unusable; why says why).  need_device: also
 * require a working CUDA device (ncclGetUniqueId needs none).
 */
const gpu_api_t *gpu_load(int need_device, char *why, size_t n);

#endif
