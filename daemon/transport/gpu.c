/*
 * gpu.c - dlopen of the CUDA runtime and NCCL (see gpu.h).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/transport/gpu.h"

#ifndef REFIT_HAVE_NCCL
const gpu_api_t *
gpu_load(int need_device, char *why, size_t n)
{
	(void)need_device;
	snprintf(why, n, "this refitd was built without the CUDA and NCCL headers "
		 "(rebuild where %s exists: see `make config`)", "cuda_runtime_api.h and nccl.h");
	return NULL;
}
#else

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static gpu_api_t api;
static int state;          /* 0 not tried, 1 loaded, -1 failed */
static char load_why[512];

static void *
open_first(const char *const *names, char *tried, size_t n)
{
	const char *home = getenv("CUDA_HOME");
	char path[512];

	for (size_t i = 0; names[i]; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);

		if (h)
			return h;
		if (home) {
			snprintf(path, sizeof(path), "%s/lib64/%s", home, names[i]);
			if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL)
				return h;
		}
		snprintf(path, sizeof(path), "/usr/local/cuda/lib64/%s", names[i]);
		if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL)
			return h;
	}
	snprintf(tried, n, "%s", dlerror());
	return NULL;
}

#define SYM(lib, name)                                                               \
	do {                                                                         \
		*(void **)&api.name = dlsym(lib, #name);                             \
		if (api.name == NULL) {                                              \
			snprintf(load_why, sizeof(load_why), "%s has no symbol %s",  \
				 lib == cudart ? "libcudart" : "libnccl", #name);     \
			return -1;                                                   \
		}                                                                    \
	} while (0)

static int
load(void)
{
	static const char *const cudart_names[] = {"libcudart.so", "libcudart.so.13",
						   "libcudart.so.12", NULL};
	static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so", NULL};
	char tried[300];
	void *cudart, *nccl;

	if ((cudart = open_first(cudart_names, tried, sizeof(tried))) == NULL) {
		snprintf(load_why, sizeof(load_why), "cannot load the CUDA runtime (libcudart): "
			 "%s", tried);
		return -1;
	}
	if ((nccl = open_first(nccl_names, tried, sizeof(tried))) == NULL) {
		snprintf(load_why, sizeof(load_why), "cannot load NCCL (libnccl.so.2): %s",
			 tried);
		return -1;
	}
	SYM(cudart, cudaGetDeviceCount);
	SYM(cudart, cudaSetDevice);
	SYM(cudart, cudaGetDevice);
	SYM(cudart, cudaMalloc);
	SYM(cudart, cudaFree);
	SYM(cudart, cudaMemcpy);
	SYM(cudart, cudaMemcpyAsync);
	SYM(cudart, cudaMemcpy2DAsync);
	SYM(cudart, cudaMemset);
	SYM(cudart, cudaStreamCreateWithFlags);
	SYM(cudart, cudaStreamDestroy);
	SYM(cudart, cudaStreamSynchronize);
	SYM(cudart, cudaStreamQuery);
	SYM(cudart, cudaIpcGetMemHandle);
	SYM(cudart, cudaIpcOpenMemHandle);
	SYM(cudart, cudaIpcCloseMemHandle);
	SYM(cudart, cudaGetErrorString);
	SYM(cudart, cudaGetLastError);
	SYM(cudart, cudaDriverGetVersion);
	SYM(nccl, ncclGetUniqueId);
	SYM(nccl, ncclCommInitRankConfig);
	SYM(nccl, ncclCommGetAsyncError);
	SYM(nccl, ncclCommAbort);
	SYM(nccl, ncclCommDestroy);
	SYM(nccl, ncclSend);
	SYM(nccl, ncclRecv);
	SYM(nccl, ncclGroupStart);
	SYM(nccl, ncclGroupEnd);
	SYM(nccl, ncclGetErrorString);
	SYM(nccl, ncclGetVersion);
	*(void **)&api.ncclCommShrink = dlsym(nccl, "ncclCommShrink"); /* optional */
	return 1;
}

const gpu_api_t *
gpu_load(int need_device, char *why, size_t n)
{
	const gpu_api_t *r = NULL;

	pthread_mutex_lock(&mu);
	if (state == 0)
		state = load();
	if (state < 0) {
		snprintf(why, n, "%s", load_why);
	} else if (need_device && api.ndevices == 0) {
		int cnt = 0;
		cudaError_t e = api.cudaGetDeviceCount(&cnt);

		if (e != cudaSuccess)
			snprintf(why, n, "CUDA: %s", api.cudaGetErrorString(e));
		else if (cnt == 0)
			snprintf(why, n, "CUDA: no device");
		else
			api.ndevices = cnt;
		if (api.ndevices)
			r = &api;
	} else {
		r = &api;
	}
	pthread_mutex_unlock(&mu);
	return r;
}
#endif
