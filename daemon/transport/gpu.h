/*
 * gpu.h - the CUDA runtime and NCCL, loaded with dlopen at run time.
 *
 * Built only where the CUDA and NCCL headers exist (REFIT_HAVE_NCCL, see
 * `make config`); the binary never links against libcudart or libnccl, so
 * it starts on machines without them.  gpu_load() loads both libraries
 * once and checks that a device is usable; when anything is missing it
 * returns NULL and says exactly what (library not found, symbol missing,
 * NCCL too old, no device).
 *
 * Where the libraries come from (gpu_configure, before the first
 * gpu_load): the config keys cuda_library, nccl_library and
 * gpu_kernels_library; when empty, the environment variables
 * REFIT_CUDA_LIBRARY, REFIT_NCCL_LIBRARY and REFIT_GPU_KERNELS_LIBRARY;
 * when those are empty too, the usual search (libcudart.so.13, .so.12,
 * libcudart.so; libnccl.so.2, libnccl.so; librefit-gpu-kernels.so next
 * to the executable's ../lib, then the loader's path).  The strided-copy
 * kernel may also come from the CUDA runtime library itself (the test
 * emulator exports it there).  A path that is configured and cannot be
 * loaded is an error, never a silent fallback.
 */
#ifndef REFIT_DAEMON_GPU_H
#define REFIT_DAEMON_GPU_H

#include <stddef.h>

#include "daemon/transport/convert_kernels.h"
#include "daemon/transport/delta_kernels.h"
#include "daemon/transport/gpu_kernels.h"

/* The oldest NCCL refit runs on (see gpu.c for why). */
#define GPU_NCCL_MIN_VERSION 22700

#ifdef REFIT_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

/*
 * cuMemGetAddressRange (cuda.h: "the base address ... and size ... of the
 * allocation ... that contains the input pointer"), a driver function: the
 * runtime hands it out through cudaGetDriverEntryPointByVersion (CUDA
 * 12.5+) or cudaGetDriverEntryPoint (12.0+).  CUresult is an enum (0:
 * CUDA_SUCCESS), CUdeviceptr an unsigned long long.
 */
typedef int (*gpu_mem_range_fn)(unsigned long long *base, size_t *size,
				unsigned long long ptr);
/* cuDeviceGetUuid (cuda.h: CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice
 * dev), dev an ordinal of this process): the 16 bytes that name a GPU in
 * every process, whatever CUDA_VISIBLE_DEVICES says. */
#define GPU_UUID_BYTES 16
typedef int (*gpu_uuid_fn)(unsigned char *uuid, int dev);

#define GPU_FN(name) __typeof__(name) *name
typedef struct gpu_api {
	GPU_FN(cudaGetDeviceCount);
	GPU_FN(cudaSetDevice);
	GPU_FN(cudaGetDevice);
	GPU_FN(cudaMalloc);
	GPU_FN(cudaFree);
	GPU_FN(cudaMallocHost);
	GPU_FN(cudaFreeHost);
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
	GPU_FN(cudaIpcOpenEventHandle);  /* a client's ready event (nccl_wait_events) */
	GPU_FN(cudaStreamWaitEvent);
	GPU_FN(cudaEventDestroy);
	GPU_FN(cudaGetErrorString);
	GPU_FN(cudaGetLastError);
	GPU_FN(cudaDriverGetVersion);
	GPU_FN(cudaPointerGetAttributes);
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
	GPU_FN(ncclCommShrink);
	GPU_FN(ncclMemAlloc);
	GPU_FN(ncclMemFree);
	GPU_FN(ncclCommRegister);
	GPU_FN(ncclGetLastError); /* optional: NULL when the library lacks it */
	gpu_mem_range_fn mem_range;            /* cuMemGetAddressRange */
	gpu_uuid_fn device_uuid;               /* cuDeviceGetUuid */
	refit_gpu_copy_strided_fn copy_strided; /* NULL: no kernel library */
	refit_cuda_convert_fn convert;          /* NULL: no conversion kernels (a kernel
						   library built before them) */
	refit_cuda_delta_fn delta;              /* NULL: no delta kernels (likewise) */
	int ndevices;
	int nccl_version;         /* ncclGetVersion's code, e.g. 22809 */
	char cuda_path[256], nccl_path[256], kernels_path[256];
} gpu_api_t;
#undef GPU_FN
#else
typedef struct gpu_api gpu_api_t;
#endif

/* Library paths (NULL or "": the environment, then the search). */
typedef struct gpu_paths {
	const char *cuda, *nccl, *kernels;
} gpu_paths_t;

/* Where to load from; only before the first gpu_load (later: ignored). */
void gpu_configure(const gpu_paths_t *p);

/*
 * The loaded API (NULL when unusable; why says why).  need_device: also
 * require a working CUDA device (ncclGetUniqueId needs none).
 */
const gpu_api_t *gpu_load(int need_device, char *why, size_t n);

/*
 * Unique ids come from a root holder: a child process (this executable,
 * run with GPU_ROOT_HOLDER_ARG) that calls ncclGetUniqueId, writes the id
 * to its stdout and lives until its stdin closes.  The bootstrap root NCCL
 * starts in ncclGetUniqueId lives in that process, so a root whose
 * communicators never formed (a member died mid-bootstrap) ends when the
 * holder is released, instead of staying in the daemon for good.
 * Every program that makes ids calls gpu_root_holder_main first thing in
 * main when argv[1] is GPU_ROOT_HOLDER_ARG.
 */
#define GPU_ROOT_HOLDER_ARG "--refit-nccl-root-holder"

typedef struct gpu_root {
	int pid;
	int fd;                   /* the holder's stdin: closing it ends the holder */
	unsigned char id[128];
	size_t len;
} gpu_root_t;

/* A new id and its holder (bounded by timeout_ms); 0, or -1 and why. */
int gpu_root_new(gpu_root_t *r, int timeout_ms, char *why, size_t n);
/* End the holder (its root goes, consumed or not) and reap it. */
void gpu_root_release(gpu_root_t *r);
/* The holder's main: returns the exit status. */
int gpu_root_holder_main(void);

#ifdef REFIT_HAVE_NCCL
/*
 * PyTorch's shareable handle (c10/cuda/CUDACachingAllocator.cpp,
 * shareIpcHandle; what storage._share_cuda_() answers as its handle): a
 * version byte, a type byte, then for type 'c' (memory of cudaMalloc) the
 * cudaIpcMemHandle_t of the allocation's base; type 'e' (expandable
 * segments, memory of the driver's VMM API) carries another format.
 */
#define GPU_TORCH_HANDLE_VERSION 2
#define GPU_TORCH_HANDLE_CUDA_MALLOC 'c'
#define GPU_TORCH_HANDLE_VMM 'e'

/*
 * The cudaIpcMemHandle_t in the len bytes a client gave (ipc): the handle
 * itself, or PyTorch's shareable handle of type 'c' (its 2-byte header
 * stripped).  Type 'e' is refused: VMM memory cannot be opened by
 * cudaIpcOpenMemHandle.  0, or -1 and why (n bytes).  Any thread.
 */
int gpu_ipc_handle_parse(const void *ipc, size_t len, cudaIpcMemHandle_t *out, char *why,
			 size_t n);
#endif

#endif
