/*
 * nccl_state.c - the nccl transport's shared state helpers: CUDA errors (a
 * sticky one poisons the node for good), the session's first device error,
 * the poison that stops refits, worlds (copy, free) and rank lookups
 * (configured device, local communicator index), making a rank's device
 * current.  Calls no other file of the transport (nccl_internal.h).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/transport/nccl_internal.h"

#ifdef REFIT_HAVE_NCCL

static void poison_dead(xport_t *x, int32_t rank, const char *what, cudaError_t e);


/*
 * The errors after which, as CUDA documents them (driver_types.h), "the
 * process must be terminated and relaunched": the device's context is dead
 * and every later CUDA call returns the same error.
 */
bool
nccl_sticky(cudaError_t e)
{
	switch ((int)e) {
	case cudaErrorIllegalAddress:      /* 700 */
	case cudaErrorLaunchTimeout:       /* 702 */
	case cudaErrorAssert:              /* 710 */
	case cudaErrorHardwareStackError:  /* 714 */
	case cudaErrorIllegalInstruction:  /* 715 */
	case cudaErrorMisalignedAddress:   /* 716 */
	case cudaErrorInvalidAddressSpace: /* 717 */
	case cudaErrorInvalidPc:           /* 718 */
	case cudaErrorLaunchFailure:       /* 719 */
	case 721:                          /* cudaErrorTensorMemoryLeak (CUDA 12.8+) */
	case 810:                          /* cudaErrorMpsClientTerminated */
		return true;
	default:
		return false;
	}
}

refit_status_t
nccl_cuda_err(xport_t *x, cudaError_t e, const char *what, refit_err_t *err)
{
	if (nccl_sticky(e))
		poison_dead(x, -1, what, e);
	return refit_err_set(err, REFIT_ERR_CUDA, "nccl transport: %s: %s (cudaError %d)", what,
			     x->api->cudaGetErrorString(e), (int)e);
}

void
nccl_world_free(world_t *w)
{
	free(w->ranks);
	free(w->local);
	memset(w, 0, sizeof(*w));
}

void
nccl_world_copy(world_t *dst, const world_t *src)
{
	*dst = *src;
	dst->ranks = xmalloc((src->nranks + 1) * sizeof(int32_t));
	dst->local = xmalloc((src->nlocal + 1) * sizeof(int32_t));
	memcpy(dst->ranks, src->ranks, src->nranks * sizeof(int32_t));
	memcpy(dst->local, src->local, src->nlocal * sizeof(int32_t));
}

int
nccl_index_in(const int32_t *v, size_t n, int32_t r)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (v[mid] < r)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && v[lo] == r ? (int)lo : -1;
}

/* Index of rank r among the communicators' local ranks (-1: none). */
int
nccl_local_index(const comms_t *cm, int32_t r)
{
	for (size_t i = 0; i < cm->nlocal; i++)
		if (cm->local[i] == r)
			return (int)i;
	return -1;
}

/* The configured device of rank r (-1: not a rank of this node). */
int
nccl_device_of(const xport_t *x, int32_t r)
{
	for (size_t i = 0; i < x->ncranks; i++)
		if (x->cranks[i] == r)
			return x->cdevs[i];
	return -1;
}

/* ---- device memory operations -------------------------------------------------- */

/* A device error of the session so far (refit_err_set keeps the first:
 * later ones follow from it). */
bool
nccl_dfailed(const xport_t *x)
{
	return x->derr.status != REFIT_OK;
}

void
nccl_dfail(xport_t *x, cudaError_t e, int32_t rank, const char *what)
{
	if (nccl_sticky(e))
		poison_dead(x, rank, what, e);
	refit_err_set(&x->derr, REFIT_ERR_CUDA, "nccl transport: rank %d: %s: %s (cudaError "
		      "%d)", rank, what, x->api->cudaGetErrorString(e), (int)e);
}

/* The session's device error, into err. */
refit_status_t
nccl_dfail_out(const xport_t *x, refit_err_t *err)
{
	return refit_err_set(err, x->derr.status, "%s", x->derr.msg);
}

/* The node is poisoned (see xport.poison): why, or NULL. */
bool
nccl_is_poisoned(xport_t *x)
{
	bool p;

	pthread_mutex_lock(&x->mu);
	p = x->poison[0] != '\0';
	pthread_mutex_unlock(&x->mu);
	return p;
}

/* Work on rank's stream did not end in time and may still write memory:
 * from now on nothing that work may touch is freed or reused, and the node
 * refuses refits (the first reason stays). */
void
nccl_poison(xport_t *x, int32_t rank, const char *what)
{
	pthread_mutex_lock(&x->mu);
	if (x->poison[0] == '\0')
		snprintf(x->poison, sizeof(x->poison), "rank %d: %s; the memory it may still "
			 "write is kept (never freed or reused) and this node runs no more "
			 "refits until refitd restarts", rank, what);
	pthread_mutex_unlock(&x->mu);
	log_warnx("nccl: node %s: rank %d: %s: the node is poisoned (restart refitd)",
		  x->node_id, rank, what);
}

/* A sticky CUDA error (what returned e, on rank's device; -1: not known):
 * the context is dead, nothing of this process's CUDA works again, and the
 * node must exit for systemd to restart refitd (nccl_poisoned says so).
 * The first reason stays. */
static void
poison_dead(xport_t *x, int32_t rank, const char *what, cudaError_t e)
{
	char who[32] = "";
	bool first;

	if (rank >= 0)
		snprintf(who, sizeof(who), "rank %d: ", (int)rank);
	pthread_mutex_lock(&x->mu);
	first = !x->dead;
	if (first) {
		x->dead = true;
		snprintf(x->poison, sizeof(x->poison), "%s%s: %s (cudaError %d), a sticky CUDA "
			 "error: the device's context is dead and every later CUDA call of "
			 "refitd fails; refitd must restart", who, what,
			 x->api->cudaGetErrorString(e), (int)e);
	}
	pthread_mutex_unlock(&x->mu);
	if (first)
		log_errorx("nccl: node %s: %s: %s (cudaError %d): a sticky CUDA error, the node is "
			   "poisoned and exits", x->node_id, what, x->api->cudaGetErrorString(e),
			   (int)e);
}

/* Poll stream st until it drained, for at most ms: true when it did (or
 * failed: a failed stream runs nothing more). */
bool
nccl_drained(const gpu_api_t *a, cudaStream_t st, int64_t ms)
{
	for (int64_t end = xport_now_ms() + ms;; usleep(100)) {
		if (a->cudaStreamQuery(st) != cudaErrorNotReady)
			return true;
		if (xport_now_ms() >= end)
			return false;
	}
}

/* Make rank's device current on this thread; its stream (NULL: failed). */
bool
nccl_on_rank(xport_t *x, int32_t rank, cudaStream_t *st)
{
	int li = nccl_local_index(&x->cm, rank);
	cudaError_t e;

	if (li < 0) {
		refit_err_set(&x->derr, REFIT_ERR_INTERNAL, "nccl transport: rank %d has no "
			      "communicator on this node", rank);
		return false;
	}
	if ((e = x->api->cudaSetDevice(x->cm.dev[li])) != cudaSuccess) {
		nccl_dfail(x, e, rank, "cudaSetDevice");
		return false;
	}
	*st = x->cm.stream[li];
	return true;
}

#endif
