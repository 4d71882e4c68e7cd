/*
 * emu_mem.c - emulated device memory and CUDA IPC.
 *
 * Each device owns a slice of one address range reserved PROT_NONE at start:
 * device pointers point there, so host code that dereferences one gets
 * SIGSEGV as on a GPU.  The bytes live in a file per allocation under
 * $REFIT_EMU_DIR/mem (<pid>.<seq>), mapped read-write elsewhere; the table
 * below translates a device range to that mapping for the stream workers.
 * Addresses are not reused until the slice wraps around, so a freed pointer
 * stays invalid.  IPC handles name the exporter's (host, device, pid, seq);
 * opening one maps the same file into the importer's slice of that device;
 * using the mapping after the exporter freed the allocation (its file is
 * gone) faults.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/emu/emu_internal.h"

#define SLICE (64ULL << 30)        /* address space per device */
#define GRAIN (64ULL << 10)        /* allocation granularity and guard gap */
#define IPC_MAGIC 0x52454d49u      /* "REMI" */
/* cudaMalloc sub-allocation: an allocation below SUB_MAX bytes lives at
 * SUB_OFF in a block of SUB_BLOCK (as CUDA packs small allocations into
 * larger blocks); CUDA IPC maps the whole block */
#define SUB_MAX GRAIN
#define SUB_OFF GRAIN
#define SUB_BLOCK (2ULL << 20)

struct emu_alloc {
	uintptr_t va;
	size_t size;           /* of the block (the backing file, the mapping) */
	size_t uoff, usize;    /* what may be accessed: the allocation in its block,
				  or an IPC mapping's whole block */
	size_t poff;           /* where the pointer handed out points */
	uint8_t *mem;          /* the host-writable view */
	size_t maplen;
	int dev;
	bool ipc;              /* opened from another process's handle */
	int ipc_refs;
	int pid;               /* the exporter (this process unless ipc) */
	uint64_t seq;
	int pins;
	bool dying;
	char path[240];
};

struct ipc_handle {
	uint32_t magic;
	int32_t dev;
	uint64_t host_hash;
	int32_t pid;
	int32_t pad;
	uint64_t seq;
	uint64_t offset;       /* of the allocation in its block (its file) */
	uint64_t size;
	uint64_t dir_hash;     /* REFIT_EMU_DIR, where the file is */
};
_Static_assert(sizeof(struct ipc_handle) <= CUDA_IPC_HANDLE_SIZE, "IPC handle too big");

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t unpinned = PTHREAD_COND_INITIALIZER;
static uintptr_t arena;
static size_t arena_len;
static uintptr_t cursor[REFIT_EMU_MAX_DEVICES];
static uint64_t dev_used[REFIT_EMU_MAX_DEVICES];
static emu_alloc_t **tab;   /* sorted by va */
static size_t ntab, captab;
static _Atomic uint64_t seqno;

void
emu_mem_init(const emu_env_t *e)
{
	void *p;

	arena_len = (size_t)e->ndev * SLICE;
	p = mmap(NULL, arena_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		emu_say("cannot reserve %zu bytes of address space: %s", arena_len,
			strerror(errno));
		arena_len = 0;
		return;
	}
	arena = (uintptr_t)p;
	for (int d = 0; d < e->ndev; d++)
		cursor[d] = arena + (uintptr_t)d * SLICE + GRAIN;
}

bool
emu_is_dev_addr(const void *p)
{
	uintptr_t a = (uintptr_t)p;

	return arena_len && a >= arena && a < arena + arena_len;
}

/* index of the last entry with va <= a, or -1.  Locked. */
static long
tab_find(uintptr_t a)
{
	long lo = 0, hi = (long)ntab - 1, r = -1;

	while (lo <= hi) {
		long mid = (lo + hi) / 2;

		if (tab[mid]->va <= a) {
			r = mid;
			lo = mid + 1;
		} else {
			hi = mid - 1;
		}
	}
	return r;
}

static void
tab_insert(emu_alloc_t *a)
{
	long i = tab_find(a->va) + 1;

	if (ntab == captab) {
		captab = captab ? captab * 2 : 64;
		tab = realloc(tab, captab * sizeof(*tab));
		if (tab == NULL)
			abort();
	}
	memmove(&tab[i + 1], &tab[i], (ntab - (size_t)i) * sizeof(*tab));
	tab[i] = a;
	ntab++;
}

static void
tab_remove(emu_alloc_t *a)
{
	long i = tab_find(a->va);

	if (i < 0 || tab[i] != a)
		abort();
	memmove(&tab[i], &tab[i + 1], (ntab - (size_t)i - 1) * sizeof(*tab));
	ntab--;
}

/* A free range of len bytes in dev's slice: bump, then first fit from the
 * start once the slice is used up.  0 when none.  Locked. */
static uintptr_t
va_take(int dev, size_t len, bool guard)
{
	uintptr_t lo = arena + (uintptr_t)dev * SLICE, hi = lo + SLICE;
	size_t span = (len + GRAIN - 1) / GRAIN * GRAIN + (guard ? GRAIN : 0);
	uintptr_t at = lo + GRAIN;

	if (cursor[dev] + span <= hi) {
		at = cursor[dev];
		cursor[dev] += span;
		return at;
	}
	for (size_t i = 0; i < ntab; i++) {
		if (tab[i]->va < lo || tab[i]->va >= hi)
			continue;
		if (at + span <= tab[i]->va)
			break;
		at = tab[i]->va + (tab[i]->size + GRAIN - 1) / GRAIN * GRAIN + GRAIN;
	}
	return at + span <= hi ? at : 0;
}

enum emu_where
emu_mem_find(const void *p, size_t len, bool pin, int *dev, uint8_t **mem, emu_alloc_t **out)
{
	uintptr_t a = (uintptr_t)p;
	enum emu_where w = EMU_BAD;
	long i;

	if (!emu_is_dev_addr(p))
		return EMU_HOST;
	pthread_mutex_lock(&mu);
	i = tab_find(a);
	if (i >= 0 && !tab[i]->dying && a - tab[i]->va - tab[i]->uoff < tab[i]->usize &&
	    a >= tab[i]->va + tab[i]->uoff &&
	    len <= tab[i]->usize - (a - tab[i]->va - tab[i]->uoff)) {
		emu_alloc_t *x = tab[i];

		w = EMU_DEVICE;
		if (dev)
			*dev = x->dev;
		if (mem)
			*mem = x->mem + (a - x->va);
		if (pin) {
			x->pins++;
			*out = x;
		}
	}
	pthread_mutex_unlock(&mu);
	if (w == EMU_DEVICE && pin && (*out)->ipc && access((*out)->path, F_OK) != 0) {
		/* CUDA: undefined; here the use of it faults */
		emu_say("IPC memory %p (allocation %d.%llu of device %d) was freed by its "
			"exporting process", p, (*out)->pid, (unsigned long long)(*out)->seq,
			(*out)->dev);
		emu_mem_unpin(*out);
		*out = NULL;
		w = EMU_BAD;
	}
	return w;
}

void
emu_mem_unpin(emu_alloc_t *a)
{
	if (a == NULL)
		return;
	pthread_mutex_lock(&mu);
	if (--a->pins == 0)
		pthread_cond_broadcast(&unpinned);
	pthread_mutex_unlock(&mu);
}

/* Take a out of the table once nothing uses it; then unmap it. */
static void
alloc_drop(emu_alloc_t *a)
{
	pthread_mutex_lock(&mu);
	a->dying = true;
	while (a->pins > 0)
		pthread_cond_wait(&unpinned, &mu);
	tab_remove(a);
	if (!a->ipc)
		dev_used[a->dev] -= a->usize;
	pthread_mutex_unlock(&mu);
	munmap(a->mem, a->maplen);
	if (!a->ipc) {
		unlink(a->path);
		emu_count_alloc(a->dev, -1, -(int64_t)a->usize);
	} else {
		emu_count(EMU_IPC, -1);
	}
	free(a);
}

static int
map_file(emu_alloc_t *a, int flags)
{
	int fd = open(a->path, flags, 0600);

	if (fd < 0)
		return -1;
	if ((flags & O_CREAT) && ftruncate(fd, (off_t)a->size) != 0) {
		close(fd);
		unlink(a->path);
		return -1;
	}
	a->maplen = a->size;
	a->mem = mmap(NULL, a->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (a->mem == MAP_FAILED) {
		if (flags & O_CREAT)
			unlink(a->path);
		return -1;
	}
	return 0;
}

/* Register a at a fresh address of its device; cudaSuccess or why not. */
static cudaError_t
alloc_place(emu_alloc_t *a)
{
	const emu_env_t *e = emu_env();

	pthread_mutex_lock(&mu);
	if (!a->ipc && dev_used[a->dev] + a->usize > e->dev_mem) {
		pthread_mutex_unlock(&mu);
		return emu_fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu) on device %d: %llu "
				"of %llu bytes in use (REFIT_EMU_DEVICE_MEM)", a->usize, a->dev,
				(unsigned long long)dev_used[a->dev],
				(unsigned long long)e->dev_mem);
	}
	/* an IPC mapping gets no guard gap after it: what the importer maps
	 * next (a mapping, an allocation) starts right at its rounded end, as
	 * CUDA packs them, so a byte past a mapping can be live device memory
	 * of the same device (cudaPointerGetAttributes says so); only
	 * cuMemGetAddressRange tells where the mapping ends */
	a->va = va_take(a->dev, a->size, !a->ipc);
	if (a->va == 0) {
		pthread_mutex_unlock(&mu);
		return emu_fail(cudaErrorMemoryAllocation, "device %d: address space used up",
				a->dev);
	}
	if (!a->ipc)
		dev_used[a->dev] += a->usize;
	tab_insert(a);
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

cudaError_t
cudaMalloc(void **p, size_t size)
{
	cudaError_t e = emu_enter();
	emu_alloc_t *a;

	if (e)
		return e;
	if (p == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaMalloc(NULL, %zu)", size);
	*p = NULL;
	if (size == 0)
		return cudaSuccess;
	if (arena_len == 0)
		return emu_fail(cudaErrorMemoryAllocation, "no device address space");
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu): out of host memory",
				size);
	a->usize = size;
	a->size = size < SUB_MAX ? SUB_BLOCK : size;
	a->uoff = a->poff = size < SUB_MAX ? SUB_OFF : 0;
	a->dev = emu_cur_dev();
	a->pid = (int)getpid();
	a->seq = atomic_fetch_add(&seqno, 1) + 1;
	snprintf(a->path, sizeof(a->path), "%s/mem/%d.%llu", emu_env()->dir, a->pid,
		 (unsigned long long)a->seq);
	if (map_file(a, O_RDWR | O_CREAT | O_EXCL) != 0) {
		e = emu_fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu): backing file %s: %s",
			     size, a->path, strerror(errno));
		free(a);
		return e;
	}
	if ((e = alloc_place(a)) != cudaSuccess) {
		munmap(a->mem, a->maplen);
		unlink(a->path);
		free(a);
		return e;
	}
	emu_count_alloc(a->dev, 1, (int64_t)size);
	*p = (void *)(a->va + a->poff);
	return cudaSuccess;
}

/* The entry whose base is p, or NULL.  Locked. */
static emu_alloc_t *
base_of(const void *p)
{
	long i = tab_find((uintptr_t)p);

	return i >= 0 && tab[i]->va + tab[i]->poff == (uintptr_t)p && !tab[i]->dying ? tab[i] :
		NULL;
}

cudaError_t
cudaFree(void *p)
{
	cudaError_t e = emu_enter();
	emu_alloc_t *a;

	if (e)
		return e;
	if (p == NULL)
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	a = base_of(p);
	if (a && a->ipc)
		a = NULL;
	pthread_mutex_unlock(&mu);
	if (a == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaFree(%p): not the base of a live "
				"cudaMalloc allocation", p);
	/* cudaFree synchronises the device, as CUDA does */
	emu_streams_sync(a->dev);
	alloc_drop(a);
	return emu_sticky();
}

cudaError_t
cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p)
{
	cudaError_t e = emu_enter();
	int dev = -1;

	if (e)
		return e;
	if (at == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaPointerGetAttributes(NULL)");
	memset(at, 0, sizeof(*at));
	switch (emu_mem_find(p, 1, false, &dev, NULL, NULL)) {
	case EMU_HOST:
		at->type = cudaMemoryTypeUnregistered;
		at->device = -2;
		at->hostPointer = (void *)p;
		return cudaSuccess;
	case EMU_DEVICE:
		at->type = cudaMemoryTypeDevice;
		at->device = dev;
		at->devicePointer = (void *)p;
		return cudaSuccess;
	default:
		return emu_fail(cudaErrorInvalidValue, "cudaPointerGetAttributes(%p): device "
				"address outside every allocation", p);
	}
}

/*
 * The driver's cuMemGetAddressRange (cuda.h: "the base address ... and size
 * ... of the allocation by cuMemAlloc() ... that contains the input
 * pointer"; CUDA_ERROR_NOT_FOUND, 500, where none does), handed out by
 * cudaGetDriverEntryPointByVersion: for an IPC mapping, the mapping (its
 * exporter's allocation).  CUresult as int.
 */
static int
emu_cu_mem_get_address_range(unsigned long long *pbase, size_t *psize, unsigned long long p)
{
	int r = 500;
	long i;

	if (emu_enter() != cudaSuccess)
		return 3; /* CUDA_ERROR_NOT_INITIALIZED */
	pthread_mutex_lock(&mu);
	i = emu_is_dev_addr((void *)(uintptr_t)p) ? tab_find((uintptr_t)p) : -1;
	if (i >= 0 && !tab[i]->dying && p >= tab[i]->va + tab[i]->uoff &&
	    p - tab[i]->va - tab[i]->uoff < tab[i]->usize) {
		if (pbase)
			*pbase = tab[i]->va + tab[i]->uoff;
		if (psize)
			*psize = tab[i]->usize;
		r = 0;
	}
	pthread_mutex_unlock(&mu);
	if (r != 0)
		emu_say("cuMemGetAddressRange(0x%llx): not inside a live allocation or IPC "
			"mapping (CUDA_ERROR_NOT_FOUND)", p);
	return r;
}

/*
 * The driver's cuDeviceGetUuid (cuda.h: CUresult cuDeviceGetUuid(CUuuid
 * *uuid, CUdevice dev), dev an ordinal of this process): 16 bytes that name
 * the host's device, the same in every process of the host whatever
 * CUDA_VISIBLE_DEVICES says ("REFITEMU", the host's hash, the device).
 * 101 (CUDA_ERROR_INVALID_DEVICE) for an ordinal this process lacks, 1
 * (CUDA_ERROR_INVALID_VALUE) for NULL.
 */
static int
emu_cu_device_get_uuid(unsigned char *uuid, int dev)
{
	const emu_env_t *env = emu_env();
	uint32_t h;

	if (env == NULL || emu_sticky() != cudaSuccess)
		return env ? (int)emu_sticky() : 3;
	if (uuid == NULL)
		return 1;
	if (emu_phys(dev) < 0)
		return 101;
	memcpy(uuid, "REFITEMU", 8);
	h = (uint32_t)(env->host_hash ^ (env->host_hash >> 32));
	memcpy(uuid + 8, &h, 4);
	uuid[12] = uuid[13] = uuid[14] = 0;
	uuid[15] = (unsigned char)emu_phys(dev);
	return 0;
}

/*
 * cudaGetDriverEntryPointByVersion (cuda_runtime_api.h, CUDA 12.5+): the
 * driver functions refit asks for, cuMemGetAddressRange and
 * cuDeviceGetUuid.  Any other symbol:
 * cudaSuccess with *funcPtr NULL and cudaDriverEntryPointSymbolNotFound, as
 * the runtime says of a symbol it does not know; a version above the
 * emulated driver's (13000) → cudaErrorInvalidValue.
 */
cudaError_t
cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
				 unsigned long long flags,
				 enum cudaDriverEntryPointQueryResult *driverStatus)
{
	cudaError_t e = emu_enter();

	if (e)
		return e;
	if (symbol == NULL || funcPtr == NULL || flags > 2)
		return emu_fail(cudaErrorInvalidValue, "cudaGetDriverEntryPointByVersion(%s, "
				"%p, %u, %llu)", symbol ? symbol : "NULL", (void *)funcPtr,
				cudaVersion, flags);
	if (cudaVersion > 13000)
		return emu_fail(cudaErrorInvalidValue, "cudaGetDriverEntryPointByVersion(%s): "
				"version %u is above the driver's 13000", symbol, cudaVersion);
	*funcPtr = NULL;
	if (strcmp(symbol, "cuMemGetAddressRange") == 0)
		*(int (**)(unsigned long long *, size_t *, unsigned long long))funcPtr =
			emu_cu_mem_get_address_range;
	else if (strcmp(symbol, "cuDeviceGetUuid") == 0)
		*(int (**)(unsigned char *, int))funcPtr = emu_cu_device_get_uuid;
	if (driverStatus)
		*driverStatus = *funcPtr ? cudaDriverEntryPointSuccess :
					   cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}

/* ---- page-locked host memory ---------------------------------------------- */

/* cudaMallocHost's buffers (cudaFreeHost accepts only those).  Host memory
 * behaves as pinned everywhere in the emulator; these are plain memory. */
static void **pinned;
static size_t npinned, cappinned;

cudaError_t
cudaMallocHost(void **p, size_t size)
{
	cudaError_t e = emu_enter();
	void *b;

	if (e)
		return e;
	if (p == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaMallocHost(NULL, %zu)", size);
	*p = NULL;
	if (size == 0)
		return cudaSuccess;
	if ((b = malloc(size)) == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu): out of host "
				"memory", size);
	pthread_mutex_lock(&mu);
	if (npinned == cappinned) {
		void **n = realloc(pinned, (cappinned ? cappinned * 2 : 16) * sizeof(*pinned));

		if (n == NULL) {
			pthread_mutex_unlock(&mu);
			free(b);
			return emu_fail(cudaErrorMemoryAllocation, "cudaMallocHost: out of memory");
		}
		pinned = n;
		cappinned = cappinned ? cappinned * 2 : 16;
	}
	pinned[npinned++] = b;
	pthread_mutex_unlock(&mu);
	*p = b;
	return cudaSuccess;
}

cudaError_t
cudaFreeHost(void *p)
{
	cudaError_t e = emu_enter();
	size_t i;
	bool found;

	if (e)
		return e;
	if (p == NULL)
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	for (i = 0; i < npinned && pinned[i] != p; i++)
		;
	found = i < npinned;
	if (found)
		pinned[i] = pinned[--npinned];
	pthread_mutex_unlock(&mu);
	if (!found)
		return emu_fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not from "
				"cudaMallocHost", p);
	/* as cudaFree: the device synchronises first (queued copies may use it) */
	emu_streams_sync(-1);
	free(p);
	return emu_sticky();
}

/* ---- CUDA IPC --------------------------------------------------------------- */

static uint64_t
dir_hash(void)
{
	const char *d = emu_env()->dir;

	return emu_hash(d, strlen(d), 0);
}

cudaError_t
cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
	cudaError_t e = emu_enter();
	struct ipc_handle ih = {0};
	emu_alloc_t *a = NULL;
	long i;

	if (e)
		return e;
	if (h == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle(NULL, %p)", p);
	pthread_mutex_lock(&mu);
	i = emu_is_dev_addr(p) ? tab_find((uintptr_t)p) : -1;
	if (i >= 0 && (uintptr_t)p >= tab[i]->va + tab[i]->uoff &&
	    (uintptr_t)p - tab[i]->va - tab[i]->uoff < tab[i]->usize && !tab[i]->dying)
		a = tab[i];
	if (a && !a->ipc) {
		/* like CUDA: the handle names the whole allocation, whatever p is,
		 * and maps its whole block; the host's device (the importer may
		 * number it otherwise) */
		ih = (struct ipc_handle){IPC_MAGIC, emu_phys(a->dev), emu_env()->host_hash,
					 a->pid, 0, a->seq, a->poff, a->size, dir_hash()};
	}
	pthread_mutex_unlock(&mu);
	if (a == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle(%p): not device "
				"memory of a live allocation", p);
	if (a->ipc)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle(%p): memory opened "
				"from another process's handle cannot be exported again", p);
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &ih, sizeof(ih));
	return cudaSuccess;
}

/* An open mapping of (pid, seq), reference counted; NULL if none.  Locked. */
static emu_alloc_t *
ipc_find(int pid, uint64_t seq)
{
	for (size_t i = 0; i < ntab; i++)
		if (tab[i]->ipc && tab[i]->pid == pid && tab[i]->seq == seq && !tab[i]->dying)
			return tab[i];
	return NULL;
}

static cudaError_t
ipc_check(const struct ipc_handle *ih, unsigned flags)
{
	const emu_env_t *env = emu_env();
	int cur = emu_cur_dev();

	if (ih->magic != IPC_MAGIC || ih->dev < 0 || ih->size == 0 || ih->offset >= ih->size)
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaIpcOpenMemHandle: not a "
				"handle from cudaIpcGetMemHandle");
	if (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: flags 0x%x", flags);
	if (ih->host_hash != env->host_hash)
		return emu_fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenMemHandle: the "
				"memory is on another host than \"%s\" (CUDA IPC works within "
				"one host only)", env->host);
	if (ih->dir_hash != dir_hash())
		return emu_fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenMemHandle: the "
				"exporter used another REFIT_EMU_DIR than \"%s\" (all processes "
				"of a host must share it)", env->dir);
	if (ih->dev >= env->nphys)
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaIpcOpenMemHandle: device "
				"%d of %d", ih->dev, env->nphys);
	if (emu_ord(ih->dev) < 0)
		return emu_fail(cudaErrorInvalidDevice, "cudaIpcOpenMemHandle: the memory is on "
				"the host's device %d, which this process does not see "
				"(CUDA_VISIBLE_DEVICES)", ih->dev);
	if (ih->pid == (int)getpid())
		return emu_fail(cudaErrorDeviceUninitialized, "cudaIpcOpenMemHandle: the "
				"handle is of this process's own allocation");
	if (emu_ord(ih->dev) != cur && !(flags & cudaIpcMemLazyEnablePeerAccess))
		return emu_fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: memory of device "
				"%d opened on device %d without "
				"cudaIpcMemLazyEnablePeerAccess", emu_ord(ih->dev), cur);
	return cudaSuccess;
}

cudaError_t
cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags)
{
	cudaError_t e = emu_enter();
	struct ipc_handle ih;
	emu_alloc_t *a;

	if (e)
		return e;
	if (p == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle(NULL)");
	emu_slow_ipc_open();
	memcpy(&ih, h.reserved, sizeof(ih));
	if ((e = ipc_check(&ih, flags)) != cudaSuccess)
		return e;
	pthread_mutex_lock(&mu);
	if ((a = ipc_find(ih.pid, ih.seq)) != NULL) { /* CUDA: same pointer, one more ref */
		a->ipc_refs++;
		*p = (void *)(a->va + a->poff);
		pthread_mutex_unlock(&mu);
		emu_count(EMU_IPC, 1);
		return cudaSuccess;
	}
	pthread_mutex_unlock(&mu);
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaIpcOpenMemHandle: out of memory");
	*a = (emu_alloc_t){.size = ih.size, .usize = ih.size, .poff = ih.offset,
			   .dev = emu_ord(ih.dev), .ipc = true, .ipc_refs = 1, .pid = ih.pid,
			   .seq = ih.seq};
	snprintf(a->path, sizeof(a->path), "%s/mem/%d.%llu", emu_env()->dir, ih.pid,
		 (unsigned long long)ih.seq);
	if (map_file(a, O_RDWR) != 0) {
		e = emu_fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenMemHandle: %s: %s (freed "
			     "by its process, or another REFIT_EMU_DIR)", a->path, strerror(errno));
		free(a);
		return e;
	}
	if ((e = alloc_place(a)) != cudaSuccess) {
		munmap(a->mem, a->maplen);
		free(a);
		return e;
	}
	emu_count(EMU_IPC, 1);
	*p = (void *)(a->va + a->poff);
	return cudaSuccess;
}

cudaError_t
cudaIpcCloseMemHandle(void *p)
{
	cudaError_t e = emu_enter();
	emu_alloc_t *a;
	bool last;

	if (e)
		return e;
	emu_slow_ipc_close();
	pthread_mutex_lock(&mu);
	a = base_of(p);
	if (a && !a->ipc)
		a = NULL;
	last = a && --a->ipc_refs == 0;
	pthread_mutex_unlock(&mu);
	if (a == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcCloseMemHandle(%p): not a pointer "
				"from cudaIpcOpenMemHandle", p);
	if (last)
		alloc_drop(a);
	else
		emu_count(EMU_IPC, -1);
	return cudaSuccess;
}
