/*
 * nccl.c - the nccl transport: GPU memory, NCCL point-to-point in groups
 * (see transport.h, docs/dataplane.md).
 *
 * libcudart and libnccl are loaded with dlopen (gpu.c); without them, or
 * without a device, the backend says why it cannot run and refitd refuses
 * to start with it.  Communicators: one per local rank (GPU), all ranks of
 * the epoch in one NCCL world (communicator rank = index of the global rank
 * in the epoch's ascending rank list), created in non-blocking mode at the
 * first session of an epoch from the unique id the coordinator took from
 * the lowest rank's node, polled against the session's deadline, aborted
 * (ncclCommAbort) on any failure, timeout or abort request, and never
 * reused after that: a node whose communicators were aborted waits for a
 * new epoch and a new id (the coordinator bumps the epoch after every
 * failed or aborted nccl refit).  When members only left, the epoch comes
 * without an id and the survivors shrink (ncclCommShrink).  One session at
 * a time uses them (the coordinator also runs one nccl refit at a time, so
 * groups are posted in one order on every node: docs/dataplane.md).
 *
 * Devices: local rank i runs on the device gpu_devices names (default i);
 * its communicator, its stream, its staging and every copy that touches its
 * memory use that device, made current on the calling thread first (the
 * current device is per thread).  Box copies: cudaMemcpyAsync /
 * cudaMemcpy2DAsync for contiguous rows, refitGpuCopyStrided (a kernel)
 * when the innermost dim is strided.  Every CUDA return is checked; the
 * first failure of a session is kept and returned by the next sync, so a
 * slice with a failed copy fails and is never committed.
 *
 * This file: the backend's start and stop, endpoints, peer memory
 * (mem_open, the device's uuid checked), the ops table.  The rest, one
 * seam a file (nccl_internal.h says who calls whom): sessions and groups
 * (nccl_session.c), communicators (nccl_comm.c), device memory operations
 * and staging (nccl_dev.c), aborts and teardown (nccl_abort.c), errors and
 * poison (nccl_state.c).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/transport/gpu.h"
#include "daemon/transport/gpu_arena.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/nccl_internal.h"

#ifndef REFIT_HAVE_NCCL

static char nowhy[300];

static const char *
nccl_unavailable(void)
{
	gpu_load(1, nowhy, sizeof(nowhy));
	return nowhy;
}

/* never started: unavailable says why, and refitd refuses to start with it */
const xport_ops_t xport_nccl_ops = {.name = "nccl", .memory = XPORT_MEM_DEVICE,
				    .unavailable = nccl_unavailable};

#else

static char why_buf[1024];

static const char *
nccl_unavailable(void)
{
	return gpu_load(1, why_buf, sizeof(why_buf)) ? NULL : why_buf;
}

/* ---- the backend ------------------------------------------------------------------- */

static refit_status_t
nccl_start(const xport_cfg_t *cfg, xport_t **out, refit_err_t *err)
{
	char why[1024];
	const gpu_api_t *a = gpu_load(1, why, sizeof(why));
	xport_t *x;
	int *devs;
	refit_status_t rc;

	if (a == NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "nccl transport: %s", why);
	devs = xcalloc(cfg->nranks + 1, sizeof(*devs));
	if (cfg->gpu_devices != NULL) {
		const char *p = cfg->gpu_devices;
		size_t n = 0;

		while (*p && n <= cfg->nranks) {
			char *end;
			long v = strtol(p, &end, 10);

			if (end == p || v < 0 || v > 1 << 20 || n == cfg->nranks ||
			    (*end != ',' && *end != '\0')) {
				free(devs);
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "gpu_devices \"%s\" "
						     "is not a comma-separated list of one CUDA "
						     "device per rank (%zu ranks)", cfg->gpu_devices,
						     cfg->nranks);
			}
			devs[n++] = (int)v;
			p = *end ? end + 1 : end;
		}
		if (n != cfg->nranks) {
			free(devs);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "gpu_devices \"%s\" names "
					     "%zu devices for %zu ranks", cfg->gpu_devices, n,
					     cfg->nranks);
		}
	} else {
		for (size_t i = 0; i < cfg->nranks; i++)
			devs[i] = (int)i;
	}
	for (size_t i = 0; i < cfg->nranks; i++) {
		if (devs[i] >= a->ndevices) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "nccl transport: rank %d "
					   "would run on CUDA device %d, but %s sees %d device%s%s",
					   cfg->ranks[i], devs[i], a->cuda_path, a->ndevices,
					   a->ndevices == 1 ? "" : "s", cfg->gpu_devices ?
					   " (gpu_devices)" : " (set gpu_devices)");
			free(devs);
			return rc;
		}
		for (size_t k = 0; k < i; k++)
			if (devs[k] == devs[i]) {
				rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "nccl transport: ranks "
						   "%d and %d on one device (%d): NCCL refuses two "
						   "ranks of a communicator on one device (run one "
						   "refitd per rank with NCCL_HOSTID instead)",
						   cfg->ranks[k], cfg->ranks[i], devs[i]);
				free(devs);
				return rc;
			}
	}
	x = xcalloc(1, sizeof(*x));
	x->api = a;
	x->node_id = xstrdup(cfg->node_id);
	x->ncranks = cfg->nranks;
	x->cranks = xmalloc((cfg->nranks + 1) * sizeof(int32_t));
	memcpy(x->cranks, cfg->ranks, cfg->nranks * sizeof(int32_t));
	x->cdevs = devs;
	x->budget = cfg->gpu_staging_budget ? cfg->gpu_staging_budget : 1ull << 30;
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	x->dev = (dp_dev_ops_t){nccl_dev_copy_box, nccl_dev_alloc, nccl_dev_free, nccl_dev_copy, nccl_dev_to_host,
				nccl_dev_from_host, nccl_dev_sync, a->convert ? nccl_dev_convert : NULL,
				a->delta ? nccl_dev_delta : NULL, x, nccl_dev_alloc_top};
	for (size_t i = 0; i < cfg->nranks; i++)
		log_info("nccl: node %s: rank %d on CUDA device %d", x->node_id, x->cranks[i],
			 x->cdevs[i]);
	*out = x;
	return REFIT_OK;
}

static const char *
nccl_endpoint(xport_t *x)
{
	(void)x;
	return "nccl";
}

static void
nccl_set_epoch(xport_t *x, uint64_t epoch, const uint8_t *token, size_t len)
{
	(void)x;
	(void)epoch;
	(void)token;
	(void)len; /* NCCL ids are secret enough: only the coordinator hands them out */
}

/* uuid as nvidia-smi writes it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
static void
uuid_str(const uint8_t *u, char *out, size_t n)
{
	size_t o = (size_t)snprintf(out, n, "GPU-");

	for (int i = 0; i < GPU_UUID_BYTES && o + 3 < n; i++)
		o += (size_t)snprintf(out + o, n - o, "%s%02x",
				      i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", u[i]);
}

/*
 * The GPU a client named by UUID must be the device this node runs rank on
 * (dev): the client's own ordinal means nothing here (CUDA_VISIBLE_DEVICES
 * numbers every process's GPUs from 0).
 */
static refit_status_t
uuid_check(xport_t *x, int32_t rank, const uint8_t *uuid, int dev, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	char s[64];
	int here = -1, r = 0;

	for (int d = 0; d < a->ndevices && here < 0; d++) {
		unsigned char u[GPU_UUID_BYTES];

		if ((r = a->device_uuid(u, d)) == 0 && memcmp(u, uuid, GPU_UUID_BYTES) == 0)
			here = d;
		else if (r != 0)
			return refit_err_set(err, REFIT_ERR_CUDA, "rank %d: cuDeviceGetUuid of CUDA "
					     "device %d failed (CUresult %d)", rank, d, r);
	}
	uuid_str(uuid, s, sizeof(s));
	if (here < 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the client's memory "
				     "is on %s, which is none of this node's %d CUDA devices",
				     rank, s, a->ndevices);
	if (here != dev)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the client's memory "
				     "is on %s, CUDA device %d here, but this node runs rank %d "
				     "on device %d (gpu_devices)", rank, s, here, rank, dev);
	return REFIT_OK;
}

static refit_status_t
nccl_mem_open(xport_t *x, int32_t rank, const void *ipc, size_t len, int32_t device,
	      const uint8_t *uuid, uint64_t bytes, void **base, refit_err_t *err)
{
	const gpu_api_t *a = x->api;
	cudaIpcMemHandle_t h;
	struct cudaPointerAttributes at;
	int dev = nccl_device_of(x, rank);
	cudaError_t e;
	void *b = NULL;
	refit_status_t rc;
	char why[320];

	*base = NULL;
	if (gpu_ipc_handle_parse(ipc, len, &h, why, sizeof(why)) != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: %s", rank, why);
	if (dev < 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d is not served by this "
				     "node", rank);
	if (uuid != NULL)
		CHECK(uuid_check(x, rank, uuid, dev, err));
	else if (device >= 0 && device != dev)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the client's memory "
				     "is on CUDA device %d, but this node runs rank %d on device "
				     "%d (gpu_devices)", rank, device, rank, dev);
	if (bytes == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: cuda_bytes (the size "
				     "of the allocation) is 0", rank);
	/* the current device is per thread: set it on this one */
	if ((e = a->cudaSetDevice(dev)) != cudaSuccess)
		return nccl_cuda_err(x, e, "cudaSetDevice", err);
	if ((e = a->cudaIpcOpenMemHandle(&b, h, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess)
		return nccl_cuda_err(x, e, "cudaIpcOpenMemHandle", err);
	memset(&at, 0, sizeof(at));
	if ((e = a->cudaPointerGetAttributes(&at, b)) != cudaSuccess) {
		rc = nccl_cuda_err(x, e, "cudaPointerGetAttributes", err);
		goto fail;
	}
	if (at.type != cudaMemoryTypeDevice || at.device != dev) {
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: the memory of the IPC handle "
			      "is %s %d, not on device %d where this node runs rank %d",
			      rank, at.type == cudaMemoryTypeDevice ? "on device" :
			      "not device memory, type", at.type == cudaMemoryTypeDevice ?
			      at.device : (int)at.type, dev, rank);
		goto fail;
	}
	/*
	 * The client's claim must lie inside what the handle mapped.  The last
	 * claimed byte being device memory proves nothing: the runtime places
	 * mappings and allocations next to each other, so a claim past the
	 * mapping may end in another client's mapping or this node's staging,
	 * and copies into the claim would write there.  cuMemGetAddressRange
	 * gives the range the pointer lies in (cuda.h: "the base address ... and
	 * size ... of the allocation ... that contains the input pointer").  The
	 * mapping may start before b: CUDA sub-allocates small cudaMalloc
	 * allocations from larger blocks and IPC maps "the entire underlying
	 * memory block" (the programming guide), cudaIpcOpenMemHandle returning
	 * the exported allocation's address inside it; the claim runs from b to
	 * at most the block's end.
	 */
	{
		unsigned long long rb = 0;
		size_t rsz = 0;
		int cr = a->mem_range(&rb, &rsz, (unsigned long long)(uintptr_t)b);

		if (cr != 0) {
			rc = refit_err_set(err, REFIT_ERR_CUDA, "rank %d: cuMemGetAddressRange of "
					   "the client's IPC mapping failed (CUresult %d): its "
					   "size cannot be checked", rank, cr);
			goto fail;
		}
		uint64_t at = (uint64_t)((uintptr_t)b - rb);

		if (rb > (unsigned long long)(uintptr_t)b || at >= rsz || bytes > rsz - at) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "rank %d: cuda_bytes %" PRIu64
					   " is larger than the allocation of the IPC handle (%zu "
					   "bytes mapped from offset %llu of it): refused before "
					   "anything was written", rank, bytes, rsz - (size_t)at,
					   (unsigned long long)at);
			goto fail;
		}
	}
	*base = b;
	return REFIT_OK;
fail:
	if ((e = a->cudaIpcCloseMemHandle(b)) != cudaSuccess)
		log_warnx("nccl: node %s: cudaIpcCloseMemHandle: %s", x->node_id,
			  a->cudaGetErrorString(e));
	return rc;
}

static void
nccl_mem_close(xport_t *x, void *base)
{
	struct cudaPointerAttributes at;
	cudaError_t e;

	/* closed in the context it was opened in (cudaIpcOpenMemHandle counts
	 * opens per context): its device current on this thread */
	memset(&at, 0, sizeof(at));
	if ((e = x->api->cudaPointerGetAttributes(&at, base)) != cudaSuccess)
		log_warnx("nccl: node %s: cudaPointerGetAttributes of a client's mapping: %s",
			  x->node_id, x->api->cudaGetErrorString(e));
	else if (at.type == cudaMemoryTypeDevice &&
		 (e = x->api->cudaSetDevice(at.device)) != cudaSuccess)
		log_warnx("nccl: node %s: cudaSetDevice(%d): %s", x->node_id, at.device,
			  x->api->cudaGetErrorString(e));
	e = x->api->cudaIpcCloseMemHandle(base);

	if (e != cudaSuccess)
		log_warnx("nccl: node %s: cudaIpcCloseMemHandle: %s", x->node_id,
			  x->api->cudaGetErrorString(e));
}

static void
nccl_stop(xport_t *x)
{
	if (x == NULL)
		return;
	pthread_mutex_lock(&x->mu);
	if (x->busy)
		log_warnx("nccl: node %s: stopping while a refit holds the communicators",
			  x->node_id);
	pthread_mutex_unlock(&x->mu);
	/* a graceful stop destroys them; mid-refit ones are aborted */
	nccl_drop_comms(x, x->busy);
	if (x->bounce != NULL && !nccl_is_poisoned(x)) {
		cudaError_t e = x->api->cudaFreeHost(x->bounce);

		if (e != cudaSuccess)
			log_warnx("nccl: node %s: cudaFreeHost: %s", x->node_id,
				  x->api->cudaGetErrorString(e));
	}
	if (x->kept)
		log_warnx("nccl: node %s: %" PRIu64 " buffers kept (never freed): work on "
			  "them did not end", x->node_id, x->kept);
	nccl_release_roots(x, NULL);
	VEC_FREE(&x->roots);
	nccl_world_free(&x->w);
	free(x->cranks);
	free(x->cdevs);
	free(x->node_id);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	free(x);
}

static xport_poison_t
nccl_poisoned(xport_t *x, char *why, size_t len)
{
	xport_poison_t p;

	pthread_mutex_lock(&x->mu);
	p = x->dead ? XPORT_POISON_DEAD : x->poison[0] != '\0' ? XPORT_POISON_KEPT :
		XPORT_POISON_NONE;
	if (p && len)
		snprintf(why, len, "%s", x->poison);
	pthread_mutex_unlock(&x->mu);
	return p;
}

const xport_ops_t xport_nccl_ops = XPORT_OPS("nccl", XPORT_MEM_DEVICE, nccl);
#endif
