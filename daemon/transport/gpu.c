/*
 * gpu.c - dlopen of the CUDA runtime, NCCL and refit's kernels (see gpu.h).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/clock.h"
#include "daemon/transport/gpu.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char cfg_cuda[PATH_MAX], cfg_nccl[PATH_MAX], cfg_kernels[PATH_MAX];

void
gpu_configure(const gpu_paths_t *p)
{
	pthread_mutex_lock(&mu);
	snprintf(cfg_cuda, sizeof(cfg_cuda), "%s", p && p->cuda ? p->cuda : "");
	snprintf(cfg_nccl, sizeof(cfg_nccl), "%s", p && p->nccl ? p->nccl : "");
	snprintf(cfg_kernels, sizeof(cfg_kernels), "%s", p && p->kernels ? p->kernels : "");
	pthread_mutex_unlock(&mu);
}

extern char **environ;

void
gpu_root_release(gpu_root_t *r)
{
	int st;

	if (r->fd >= 0)
		close(r->fd);   /* the holder sees EOF and exits */
	r->fd = -1;
	if (r->pid > 0) {
		/* bounded: a holder that does not go within 5 s is killed */
		for (int i = 0; i < 500 && waitpid(r->pid, &st, WNOHANG) == 0; i++)
			usleep(10000);
		if (waitpid(r->pid, &st, WNOHANG) == 0) {
			kill(r->pid, SIGKILL);
			waitpid(r->pid, &st, 0);
		}
	}
	r->pid = 0;
}

/*
 * Start the holder: this executable with GPU_ROOT_HOLDER_ARG, stdin from
 * in[0], stdout to out[1], loading the libraries this process was
 * configured to load.  0 or a posix_spawn error.
 */
static int
spawn_holder(const int *in, const int *out, pid_t *pid)
{
	char *argv[] = {(char *)"refit-nccl-root", (char *)GPU_ROOT_HOLDER_ARG, NULL};
	char cu[PATH_MAX + 32], nc[PATH_MAX + 32], **env;
	posix_spawn_file_actions_t fa;
	size_t ne = 0, k = 0;
	int rc;

	while (environ[ne])
		ne++;
	env = calloc(ne + 3, sizeof(*env));
	if (env == NULL)
		return ENOMEM;
	pthread_mutex_lock(&mu);
	snprintf(cu, sizeof(cu), "REFIT_CUDA_LIBRARY=%s", cfg_cuda);
	snprintf(nc, sizeof(nc), "REFIT_NCCL_LIBRARY=%s", cfg_nccl);
	pthread_mutex_unlock(&mu);
	for (size_t i = 0; i < ne; i++)
		if (!(cu[19] && strncmp(environ[i], "REFIT_CUDA_LIBRARY=", 19) == 0) &&
		    !(nc[19] && strncmp(environ[i], "REFIT_NCCL_LIBRARY=", 19) == 0))
			env[k++] = environ[i];
	if (cu[19])
		env[k++] = cu;
	if (nc[19])
		env[k++] = nc;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	rc = posix_spawn(pid, "/proc/self/exe", &fa, NULL, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	free(env);
	return rc;
}

/* Read the holder's unique id from fd until end (CLOCK_MONOTONIC ms). */
static int
read_id(gpu_root_t *r, int fd, int64_t end, int timeout_ms, char *why, size_t n)
{
	size_t got = 0;

	while (got < sizeof(r->id)) {
		struct pollfd pf = {fd, POLLIN, 0};
		int64_t left = end - clock_mono_ms();
		ssize_t k;

		if (left <= 0 || poll(&pf, 1, (int)left) <= 0) {
			snprintf(why, n, "root holder (pid %d): no unique id within %d ms",
				 (int)r->pid, timeout_ms);
			return -1;
		}
		k = read(fd, r->id + got, sizeof(r->id) - got);
		if (k <= 0) {
			snprintf(why, n, "root holder (pid %d) ended without an id (see its "
				 "message above)", (int)r->pid);
			return -1;
		}
		got += (size_t)k;
	}
	r->len = got;
	return 0;
}

int
gpu_root_new(gpu_root_t *r, int timeout_ms, char *why, size_t n)
{
	int in[2], out[2], rc;
	pid_t pid;
	int64_t end = clock_mono_ms() + timeout_ms;

	memset(r, 0, sizeof(*r));
	r->fd = -1;
	if (pipe2(in, O_CLOEXEC) < 0) {
		snprintf(why, n, "root holder: pipe: %s", strerror(errno));
		return -1;
	}
	if (pipe2(out, O_CLOEXEC) < 0) {
		snprintf(why, n, "root holder: pipe: %s", strerror(errno));
		close(in[0]);
		close(in[1]);
		return -1;
	}
	rc = spawn_holder(in, out, &pid);
	close(in[0]);
	close(out[1]);
	if (rc != 0) {
		close(in[1]);
		close(out[0]);
		snprintf(why, n, "root holder: posix_spawn /proc/self/exe: %s", strerror(rc));
		return -1;
	}
	r->pid = pid;
	r->fd = in[1];
	rc = read_id(r, out[0], end, timeout_ms, why, n);
	close(out[0]);
	if (rc != 0)
		gpu_root_release(r);
	return rc;
}

#ifndef REFIT_HAVE_NCCL
int
gpu_root_holder_main(void)
{
	fprintf(stderr, "refit: root holder: built without NCCL\n");
	return 1;
}

const gpu_api_t *
gpu_load(int need_device, char *why, size_t n)
{
	(void)need_device;
	snprintf(why, n, "this refitd was built without the CUDA and NCCL headers "
		 "(rebuild where %s exists: see `make config`)", "cuda_runtime_api.h and nccl.h");
	return NULL;
}
#else

static gpu_api_t api;
static int state;          /* 0 not tried, 1 loaded, -1 failed */
static char load_why[1024];

/* The file a handle was loaded from. */
static void
path_of(void *h, const char *fallback, char *out, size_t n)
{
	struct link_map *lm = NULL;

	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
		snprintf(out, n, "%s", lm->l_name);
	else
		snprintf(out, n, "%s", fallback);
}

/*
 * The configured path, else the environment's, else the first of names
 * that loads.  what names the library in errors; key and env the settings.
 */
static void *
open_lib(const char *cfg, const char *env, const char *key, const char *const *names,
	 const char *what, char *path_out, size_t pn)
{
	const char *ev = getenv(env);
	const char *home = getenv("CUDA_HOME");
	char path[PATH_MAX], tried[600] = "";
	void *h;

	if ((cfg && cfg[0]) || (ev && ev[0])) {
		const char *p = cfg && cfg[0] ? cfg : ev;

		if ((h = dlopen(p, RTLD_NOW | RTLD_LOCAL)) == NULL) {
			snprintf(load_why, sizeof(load_why), "cannot load %s from \"%s\" (set by %s): "
				 "%s", what, p, cfg && cfg[0] ? key : env, dlerror());
			return NULL;
		}
		path_of(h, p, path_out, pn);
		return h;
	}
	for (size_t i = 0; names[i]; i++) {
		if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)) != NULL) {
			path_of(h, names[i], path_out, pn);
			return h;
		}
		snprintf(tried + strlen(tried), sizeof(tried) - strlen(tried), "%s%s",
			 tried[0] ? ", " : "", names[i]);
		if (home) {
			snprintf(path, sizeof(path), "%s/lib64/%s", home, names[i]);
			if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) {
				path_of(h, path, path_out, pn);
				return h;
			}
		}
		snprintf(path, sizeof(path), "/usr/local/cuda/lib64/%s", names[i]);
		if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) {
			path_of(h, path, path_out, pn);
			return h;
		}
	}
	snprintf(load_why, sizeof(load_why), "cannot load %s: tried %s (in the loader's path, "
		 "$CUDA_HOME/lib64 and /usr/local/cuda/lib64); set %s or %s", what, tried, key,
		 env);
	return NULL;
}

#define SYM(lib, name)                                                               \
	do {                                                                         \
		*(void **)&api.name = dlsym(lib, #name);                             \
		if (api.name == NULL) {                                              \
			snprintf(load_why, sizeof(load_why), "%s has no symbol %s",  \
				 lib == cudart ? api.cuda_path : api.nccl_path, #name); \
			return -1;                                                   \
		}                                                                    \
	} while (0)

/*
 * Driver functions through the runtime (the driver's libcuda is not loaded
 * here): cudaGetDriverEntryPointByVersion (CUDA 12.5 and later), else
 * cudaGetDriverEntryPoint (12.0 to 12.4; deprecated in 13).  The node needs
 * cuMemGetAddressRange to check a client's cuda_bytes against the mapping it
 * opened, and cuDeviceGetUuid (its _v2 at version 12000) to know which of
 * its devices a client's UUID names.
 */
static int
load_driver_fn(void *cudart, const char *name, void **out, const char *use)
{
	typedef cudaError_t (*by_version_fn)(const char *, void **, unsigned int,
					     unsigned long long, int *);
	typedef cudaError_t (*entry_fn)(const char *, void **, unsigned long long, int *);
	by_version_fn byv;
	entry_fn ent;
	void *fn = NULL;
	int qr = -1;
	cudaError_t e = cudaErrorNotSupported;

	*(void **)&byv = dlsym(cudart, "cudaGetDriverEntryPointByVersion");
	*(void **)&ent = dlsym(cudart, "cudaGetDriverEntryPoint");
	if (byv != NULL)
		e = byv(name, &fn, 12000, 0 /* cudaEnableDefault */, &qr);
	else if (ent != NULL)
		e = ent(name, &fn, 0 /* cudaEnableDefault */, &qr);
	if (byv == NULL && ent == NULL) {
		snprintf(load_why, sizeof(load_why), "%s has neither "
			 "cudaGetDriverEntryPointByVersion nor cudaGetDriverEntryPoint (CUDA "
			 "12.0 or newer is needed: %s %s)", api.cuda_path, name, use);
		return -1;
	}
	if (e != cudaSuccess || fn == NULL) {
		snprintf(load_why, sizeof(load_why), "%s: the driver's %s is not available (%s, "
			 "query result %d): it %s", api.cuda_path, name, e != cudaSuccess ?
			 api.cudaGetErrorString(e) : "no such function", qr, use);
		return -1;
	}
	*out = fn;
	return 0;
}

/* The kernel library: configured, else next to the executable, else the
 * loader's path, else the CUDA runtime itself (the emulator's). */
static int
load_kernels(void *cudart)
{
	const char *ev = getenv("REFIT_GPU_KERNELS_LIBRARY");
	const char *p = cfg_kernels[0] ? cfg_kernels : (ev && ev[0] ? ev : NULL);
	char exe[PATH_MAX], cand[PATH_MAX + 64];
	void *h = NULL;

	if (p != NULL) {
		if ((h = dlopen(p, RTLD_NOW | RTLD_LOCAL)) == NULL) {
			snprintf(load_why, sizeof(load_why), "cannot load the GPU kernels from "
				 "\"%s\" (set by %s): %s", p, cfg_kernels[0] ?
				 "gpu_kernels_library" : "REFIT_GPU_KERNELS_LIBRARY", dlerror());
			return -1;
		}
	} else {
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

		if (n > 0) {
			char *slash;

			exe[n] = '\0';
			if ((slash = strrchr(exe, '/')) != NULL) {
				*slash = '\0';
				snprintf(cand, sizeof(cand), "%s/../lib/librefit-gpu-kernels.so", exe);
				h = dlopen(cand, RTLD_NOW | RTLD_LOCAL);
			}
		}
		if (h == NULL)
			h = dlopen("librefit-gpu-kernels.so", RTLD_NOW | RTLD_LOCAL);
	}
	if (h != NULL) {
		void *their;

		*(void **)&api.copy_strided = dlsym(h, "refitGpuCopyStrided");
		if (api.copy_strided == NULL) {
			snprintf(load_why, sizeof(load_why), "the GPU kernel library has no symbol "
				 "refitGpuCopyStrided");
			return -1;
		}
		*(void **)&api.convert = dlsym(h, "refit_cuda_convert");
		*(void **)&api.delta = dlsym(h, "refit_cuda_delta");
		path_of(h, p ? p : "librefit-gpu-kernels.so", api.kernels_path,
			sizeof(api.kernels_path));
		/*
		 * Its launches must go through refitd's CUDA runtime: another one
		 * (a static cudart, or a libcudart of another file or major
		 * version) keeps its own current device per thread, so a kernel
		 * for a rank on device 1 would be launched in device 0's context
		 * with device 1's stream.  dlsym on the handle finds the runtime
		 * the library binds to.
		 */
		their = dlsym(h, "cudaGetLastError");
		if (their != NULL && their != *(void **)&api.cudaGetLastError) {
			Dl_info di;

			snprintf(load_why, sizeof(load_why), "the GPU kernel library %s uses another "
				 "CUDA runtime (%s) than the one refitd loaded (%s): build it with "
				 "nvcc -cudart shared against that runtime's major version, or set "
				 "cuda_library to the runtime it needs", api.kernels_path,
				 dladdr(their, &di) && di.dli_fname ? di.dli_fname : "linked in",
				 api.cuda_path);
			return -1;
		}
		return 0;
	}
	*(void **)&api.copy_strided = dlsym(cudart, "refitGpuCopyStrided");
	*(void **)&api.convert = dlsym(cudart, "refit_cuda_convert");
	*(void **)&api.delta = dlsym(cudart, "refit_cuda_delta");
	if (api.copy_strided != NULL)
		snprintf(api.kernels_path, sizeof(api.kernels_path), "%s", api.cuda_path);
	return 0;
}

/*
 * NCCL reads its NCCL_* environment when it initialises.  Every one of them
 * is logged, so what NCCL ran with is on record; two break refit's design
 * and are refused (0, or -1 and load_why):
 *   - NCCL_COMM_BLOCKING=1 (any value but 0) overrides the non-blocking
 *     config of every communicator (NCCL's docs: "Setting this environment
 *     variable will override the blocking configuration in all
 *     communicators"): init, groups and destroy would block the transport's
 *     thread past every deadline and abort;
 *   - NCCL_LAUNCH_MODE=GROUP makes the kernel launches of one process's
 *     devices wait for each other, where refit runs each rank's operations
 *     as their own non-blocking group.
 */
static int
check_nccl_env(void)
{
	const char *b = getenv("NCCL_COMM_BLOCKING"), *l = getenv("NCCL_LAUNCH_MODE");

	for (char **e = environ; *e; e++)
		if (strncmp(*e, "NCCL_", 5) == 0)
			log_info("gpu: environment: %s", *e);
	if (b && *b && strtol(b, NULL, 10) != 0) {
		snprintf(load_why, sizeof(load_why), "NCCL_COMM_BLOCKING=%s in refitd's "
			 "environment makes every NCCL communicator blocking, and refit's "
			 "deadlines and aborts need non-blocking ones: unset it (or set 0)", b);
		return -1;
	}
	if (l && strcasecmp(l, "GROUP") == 0) {
		snprintf(load_why, sizeof(load_why), "NCCL_LAUNCH_MODE=%s in refitd's "
			 "environment makes the launches of its devices wait for each other; "
			 "refit runs each rank's operations as a non-blocking group of their "
			 "own: unset it (or set PARALLEL)", l);
		return -1;
	}
	return 0;
}

static int
load(void)
{
	static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12",
						   "libcudart.so", NULL};
	static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so", NULL};
	void *cudart, *nccl;
	ncclResult_t r;

	if ((cudart = open_lib(cfg_cuda, "REFIT_CUDA_LIBRARY", "cuda_library", cudart_names,
			       "the CUDA runtime (libcudart)", api.cuda_path,
			       sizeof(api.cuda_path))) == NULL)
		return -1;
	if ((nccl = open_lib(cfg_nccl, "REFIT_NCCL_LIBRARY", "nccl_library", nccl_names,
			     "NCCL (libnccl)", api.nccl_path, sizeof(api.nccl_path))) == NULL)
		return -1;
	SYM(cudart, cudaGetDeviceCount);
	SYM(cudart, cudaSetDevice);
	SYM(cudart, cudaGetDevice);
	SYM(cudart, cudaMalloc);
	SYM(cudart, cudaFree);
	SYM(cudart, cudaMallocHost);
	SYM(cudart, cudaFreeHost);
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
	SYM(cudart, cudaIpcOpenEventHandle);
	SYM(cudart, cudaStreamWaitEvent);
	SYM(cudart, cudaEventDestroy);
	SYM(cudart, cudaGetErrorString);
	SYM(cudart, cudaGetLastError);
	SYM(cudart, cudaDriverGetVersion);
	SYM(cudart, cudaPointerGetAttributes);
	if (load_driver_fn(cudart, "cuMemGetAddressRange", (void **)&api.mem_range,
			   "checks the size of clients' memory") != 0 ||
	    load_driver_fn(cudart, "cuDeviceGetUuid", (void **)&api.device_uuid,
			   "tells which device a client's memory is on") != 0)
		return -1;
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
	if ((r = api.ncclGetVersion(&api.nccl_version)) != ncclSuccess) {
		snprintf(load_why, sizeof(load_why), "%s: ncclGetVersion: %s", api.nccl_path,
			 api.ncclGetErrorString(r));
		return -1;
	}
	/*
	 * 2.27: ncclCommShrink.  When members leave, the survivors shrink their
	 * communicators and the coordinator sends no new unique id for that
	 * epoch, so every node must be able to shrink.  (Non-blocking
	 * communicators, ncclCommInitRankConfig and ncclCommGetAsyncError date
	 * from 2.14.)
	 */
	if (api.nccl_version < GPU_NCCL_MIN_VERSION) {
		snprintf(load_why, sizeof(load_why), "%s is NCCL %d.%d.%d; refit needs %d.%d or "
			 "newer (ncclCommShrink, used when nodes leave an epoch)", api.nccl_path,
			 api.nccl_version / 10000, api.nccl_version / 100 % 100,
			 api.nccl_version % 100, GPU_NCCL_MIN_VERSION / 10000,
			 GPU_NCCL_MIN_VERSION / 100 % 100);
		return -1;
	}
	SYM(nccl, ncclCommShrink);
	SYM(nccl, ncclMemAlloc);
	SYM(nccl, ncclMemFree);
	SYM(nccl, ncclCommRegister);
	*(void **)&api.ncclGetLastError = dlsym(nccl, "ncclGetLastError"); /* optional */
	if (load_kernels(cudart) != 0 || check_nccl_env() != 0)
		return -1;
	log_info("gpu: CUDA runtime %s, NCCL %d.%d.%d from %s, strided-copy kernel: %s, "
		 "conversion kernels: %s, delta kernels: %s", api.cuda_path, api.nccl_version / 10000,
		 api.nccl_version / 100 % 100, api.nccl_version % 100, api.nccl_path,
		 api.copy_strided ? api.kernels_path : "none (row-by-row copies)",
		 api.convert ? api.kernels_path : "none (converting models refused)",
		 api.delta ? api.kernels_path : "none (delta refits dense)");
	return 1;
}

/*
 * The holder: an id on stdout, then wait for stdin to close (the daemon
 * releasing it, or ending).  The root NCCL started for the id lives here.
 */
int
gpu_root_holder_main(void)
{
	char why[1024], b[64];
	const gpu_api_t *a;
	ncclUniqueId id;
	ncclResult_t r;
	size_t off = 0;

	signal(SIGPIPE, SIG_IGN);
	if ((a = gpu_load(0, why, sizeof(why))) == NULL) {
		fprintf(stderr, "refit: root holder: %s\n", why);
		return 1;
	}
	if ((r = a->ncclGetUniqueId(&id)) != ncclSuccess) {
		fprintf(stderr, "refit: root holder: ncclGetUniqueId: %s\n",
			a->ncclGetErrorString(r));
		return 1;
	}
	while (off < sizeof(id)) {
		ssize_t k = write(1, (char *)&id + off, sizeof(id) - off);

		if (k <= 0)
			return 1;
		off += (size_t)k;
	}
	while (read(0, b, sizeof(b)) > 0)
		;
	return 0;
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
			snprintf(why, n, "CUDA (%s): cudaGetDeviceCount: %s", api.cuda_path,
				 api.cudaGetErrorString(e));
		else if (cnt <= 0)
			snprintf(why, n, "CUDA (%s): no device", api.cuda_path);
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

int
gpu_ipc_handle_parse(const void *ipc, size_t len, cudaIpcMemHandle_t *out, char *why,
		     size_t n)
{
	const unsigned char *b = ipc;

	if (len == sizeof(*out)) {
		memcpy(out, b, sizeof(*out));
		return 0;
	}
	if (len >= 2 && b[1] == GPU_TORCH_HANDLE_VMM) {
		snprintf(why, n, "the memory is PyTorch's expandable segments (a shareable "
			 "handle of type 'e'): expandable segments / VMM memory cannot be "
			 "exported by legacy CUDA IPC; set PYTORCH_CUDA_ALLOC_CONF="
			 "expandable_segments:False");
		return -1;
	}
	if (len == 2 + sizeof(*out) && b[0] == GPU_TORCH_HANDLE_VERSION &&
	    b[1] == GPU_TORCH_HANDLE_CUDA_MALLOC) {
		memcpy(out, b + 2, sizeof(*out));
		return 0;
	}
	if (len >= 2 && b[0] != GPU_TORCH_HANDLE_VERSION)
		snprintf(why, n, "the CUDA IPC handle given has %zu bytes and starts with "
			 "byte %u: neither a cudaIpcMemHandle_t (%zu bytes) nor a PyTorch "
			 "shareable handle of version %d", len, b[0], sizeof(*out),
			 GPU_TORCH_HANDLE_VERSION);
	else
		snprintf(why, n, "the CUDA IPC handle given has %zu bytes%s: neither a "
			 "cudaIpcMemHandle_t (%zu bytes) nor a PyTorch shareable handle of "
			 "type 'c' (%zu bytes)", len, len >= 2 ? ", type byte" : "",
			 sizeof(*out), 2 + sizeof(*out));
	return -1;
}
#endif
