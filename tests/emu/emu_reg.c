/*
 * emu_reg.c - NCCL's memory allocator and user buffer registration:
 * ncclMemAlloc / ncclMemFree and ncclCommRegister / ncclCommDeregister
 * (nccl.h; NCCL's src/register/register.cc and src/allocator.cc).
 *
 * Rules (tests/emu/test_nccl.c):
 * - ncclMemAlloc: device memory of the current device, its size rounded
 *   up to 2 MiB (NCCL: "the actual allocated size might be larger than
 *   requested due to granularity"); NULL ptr or size 0 refused
 *   (ncclInvalidArgument).  ncclMemFree of a pointer ncclMemAlloc did not
 *   return: ncclInvalidArgument (NCCL fails in the driver; a choice).
 * - ncclCommRegister on a ready communicator (ncclCommEnsureReady's rules):
 *   [buff, buff + size) must lie inside one live allocation of the
 *   communicator's device, size > 0, else ncclInvalidArgument (a choice:
 *   NCCL fails when it maps the range).  A range inside one registered
 *   before shares its record and counts a reference, as NCCL's cache.
 * - ncclCommDeregister of a handle this communicator did not hand out:
 *   ncclInvalidUsage ("Could not find handle"); NULL: success.  Its last
 *   reference drops the record.  Destroy and abort drop every record
 *   (ncclRegCleanup).
 * - A send and its matched receive whose buffers differ in being inside a
 *   registered buffer fail the receiver's communicator with
 *   ncclInvalidUsage (NCCL leaves the mix undefined; emu_p2p.c).
 */
#include <stdlib.h>
#include <string.h>

#include "tests/emu/emu_nccl.h"

#define MEM_GRANULE (2u << 20)

typedef struct emu_reg {
	uintptr_t beg, end;
	int refs;
	struct emu_reg *next;
} emu_reg_t;

typedef struct mem_rec {
	void *p;
	struct mem_rec *next;
} mem_rec_t;

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_rec_t *mems;   /* what ncclMemAlloc returned, not freed */

ncclResult_t
ncclMemAlloc(void **ptr, size_t size)
{
	mem_rec_t *m;
	cudaError_t e;

	if (ptr == NULL || size == 0)
		return nccl_fail(ncclInvalidArgument, "ncclMemAlloc: ptr %p, size %zu", (void *)ptr,
				 size);
	size = (size + MEM_GRANULE - 1) / MEM_GRANULE * MEM_GRANULE;
	if ((e = cudaMalloc(ptr, size)) != cudaSuccess)
		return nccl_fail(ncclUnhandledCudaError, "ncclMemAlloc(%zu): %s", size,
				 cudaGetErrorString(e));
	if ((m = malloc(sizeof(*m))) == NULL)
		abort();
	pthread_mutex_lock(&mem_mu);
	*m = (mem_rec_t){*ptr, mems};
	mems = m;
	pthread_mutex_unlock(&mem_mu);
	return ncclSuccess;
}

ncclResult_t
ncclMemFree(void *ptr)
{
	mem_rec_t **pp, *m = NULL;
	cudaError_t e;

	pthread_mutex_lock(&mem_mu);
	for (pp = &mems; *pp; pp = &(*pp)->next)
		if ((*pp)->p == ptr) {
			m = *pp;
			*pp = m->next;
			break;
		}
	pthread_mutex_unlock(&mem_mu);
	if (m == NULL)
		return nccl_fail(ncclInvalidArgument, "ncclMemFree(%p): not a pointer ncclMemAlloc "
				 "returned (or freed already)", ptr);
	free(m);
	if ((e = cudaFree(ptr)) != cudaSuccess)
		return nccl_fail(ncclUnhandledCudaError, "ncclMemFree(%p): %s", ptr,
				 cudaGetErrorString(e));
	return ncclSuccess;
}

ncclResult_t
ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
	ncclResult_t r = comm_ready(comm, "ncclCommRegister");
	uintptr_t b = (uintptr_t)buff;
	emu_reg_t *g;
	uint8_t *mem;
	emu_alloc_t *pin = NULL;
	int dev = -1;

	if (r != ncclSuccess)
		return r;
	if (handle == NULL || buff == NULL || size == 0)
		return nccl_fail(ncclInvalidArgument, "ncclCommRegister: rank %d: buff %p, size %zu, "
				 "handle %p", comm->rank, buff, size, (void *)handle);
	if (emu_mem_find(buff, size, false, &dev, &mem, &pin) != EMU_DEVICE || dev != comm->dev)
		return nccl_fail(ncclInvalidArgument, "ncclCommRegister: rank %d: [%p, +%zu) is not "
				 "inside one allocation of its device %d", comm->rank, buff, size,
				 comm->dev);
	pthread_mutex_lock(&comm->mu);
	for (g = comm->regs; g; g = g->next)
		if (g->beg <= b && b + size <= g->end)
			break;
	if (g) {
		g->refs++;
	} else if ((g = calloc(1, sizeof(*g))) != NULL) {
		*g = (emu_reg_t){b, b + size, 1, comm->regs};
		comm->regs = g;
	}
	pthread_mutex_unlock(&comm->mu);
	if (g == NULL)
		abort();
	*handle = g;
	return ncclSuccess;
}

ncclResult_t
ncclCommDeregister(const ncclComm_t comm, void *handle)
{
	ncclResult_t r = comm_check(comm, "ncclCommDeregister");
	emu_reg_t **pp, *g = NULL;

	if (r != ncclSuccess)
		return r;
	if (handle == NULL)
		return ncclSuccess;
	pthread_mutex_lock(&comm->mu);
	for (pp = &comm->regs; *pp; pp = &(*pp)->next)
		if (*pp == handle) {
			g = *pp;
			if (--g->refs == 0)
				*pp = g->next;
			break;
		}
	pthread_mutex_unlock(&comm->mu);
	if (g == NULL)
		return nccl_fail(ncclInvalidUsage, "ncclCommDeregister: rank %d: handle %p was not "
				 "registered with this communicator (NCCL: \"Could not find "
				 "handle\")", comm->rank, handle);
	if (g->refs == 0)
		free(g);
	return ncclSuccess;
}

bool
emu_reg_covers(ncclComm_t c, const void *p, size_t n)
{
	uintptr_t b = (uintptr_t)p;
	bool in = false;

	pthread_mutex_lock(&c->mu);
	for (emu_reg_t *g = c->regs; g && !in; g = g->next)
		in = g->beg <= b && b + n <= g->end;
	pthread_mutex_unlock(&c->mu);
	return in;
}

void
emu_reg_free_all(ncclComm_t c)
{
	while (c->regs) {
		emu_reg_t *g = c->regs;

		c->regs = g->next;
		free(g);
	}
}
