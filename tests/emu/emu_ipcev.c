/*
 * emu_ipcev.c - interprocess events (cudaEventInterprocess,
 * cudaIpcGetEventHandle, cudaIpcOpenEventHandle) and the "asynchronous
 * writer" knob REFIT_EMU_HOLD_STREAMS.
 *
 * An interprocess event's state lives in a file of the host's REFIT_EMU_DIR
 * (mem/ev-<pid>.<seq>), mapped by the exporter and every importer: two
 * counters, `recorded` (the generation of its latest cudaEventRecord) and
 * `completed` (the latest generation whose recording stream reached it).  A
 * record bumps `recorded` and queues, on the recording stream, an operation
 * that stores its generation into `completed` when it runs; a query, a
 * synchronize or a cudaStreamWaitEvent in any process takes `recorded` when
 * called and waits for `completed` to reach it -- CUDA's rule that a wait
 * covers the most recent record at the time of the call, across processes.
 * The file is removed when the exporter destroys the event (opening its
 * handle fails then); mappings stay until their last user goes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tests/emu/emu_internal.h"

#define IPCEV_MAGIC 0x49504345564e54ull   /* "IPCEVNT" */

typedef struct ev_shared {
	uint64_t magic;
	_Atomic uint64_t recorded, completed;
} ev_shared_t;

struct emu_ipcev {
	ev_shared_t *sh;
	_Atomic int refs;
	bool exporter;
	int pid;
	uint64_t seq;
	char path[256];
};

/* What cudaIpcEventHandle_t holds (64 bytes). */
struct ipcev_handle {
	uint64_t magic, host_hash, dir_hash, seq;
	int32_t pid;
};

static _Atomic uint64_t next_seq;

static uint64_t
dir_hash(void)
{
	const char *d = emu_env()->dir;

	return emu_hash(d, strlen(d), 0);
}

static void
ev_path(char *buf, size_t n, int pid, uint64_t seq)
{
	snprintf(buf, n, "%s/mem/ev-%d.%llu", emu_env()->dir, pid, (unsigned long long)seq);
}

static cudaError_t
ev_map(emu_ipcev_t *ev, int flags)
{
	int fd = open(ev->path, flags, 0600);
	void *p;

	if (fd < 0)
		return cudaErrorMapBufferObjectFailed;
	if ((flags & O_CREAT) && ftruncate(fd, sizeof(ev_shared_t)) != 0) {
		close(fd);
		return cudaErrorMemoryAllocation;
	}
	p = mmap(NULL, sizeof(ev_shared_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return cudaErrorMapBufferObjectFailed;
	ev->sh = p;
	return cudaSuccess;
}

cudaError_t
emu_ipcev_new(emu_ipcev_t **out)
{
	emu_ipcev_t *ev = calloc(1, sizeof(*ev));
	cudaError_t e;

	if (ev == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaEventCreateWithFlags");
	ev->exporter = true;
	ev->pid = (int)getpid();
	ev->seq = atomic_fetch_add(&next_seq, 1) + 1;
	ev->refs = 1;
	ev_path(ev->path, sizeof(ev->path), ev->pid, ev->seq);
	if ((e = ev_map(ev, O_RDWR | O_CREAT | O_EXCL)) != cudaSuccess) {
		e = emu_fail(e, "cudaEventCreateWithFlags(cudaEventInterprocess): %s: %s",
			     ev->path, strerror(errno));
		free(ev);
		return e;
	}
	ev->sh->magic = IPCEV_MAGIC;
	*out = ev;
	return cudaSuccess;
}

void
emu_ipcev_ref(emu_ipcev_t *ev)
{
	atomic_fetch_add(&ev->refs, 1);
}

void
emu_ipcev_unref(emu_ipcev_t *ev)
{
	if (atomic_fetch_sub(&ev->refs, 1) != 1)
		return;
	munmap(ev->sh, sizeof(ev_shared_t));
	free(ev);
}

/* The exporter destroys its event: no importer can open it any more. */
void
emu_ipcev_destroy(emu_ipcev_t *ev)
{
	if (ev->exporter)
		unlink(ev->path);
	emu_ipcev_unref(ev);
}

bool
emu_ipcev_imported(const emu_ipcev_t *ev)
{
	return !ev->exporter;
}

uint64_t
emu_ipcev_recorded(const emu_ipcev_t *ev)
{
	return atomic_load(&ev->sh->recorded);
}

bool
emu_ipcev_done(const emu_ipcev_t *ev, uint64_t gen)
{
	return atomic_load(&ev->sh->completed) >= gen;
}

void
emu_ipcev_wait(const emu_ipcev_t *ev, uint64_t gen)
{
	struct timespec ts = {0, 100000};

	while (!emu_ipcev_done(ev, gen))
		nanosleep(&ts, NULL);
}

/* The operation a record queues: its generation completes when it runs. */
typedef struct complete_op {
	emu_op_t h;
	emu_ipcev_t *ev;
	uint64_t gen;
} complete_op_t;

static void
complete_run(emu_op_t *op, struct CUstream_st *s)
{
	complete_op_t *c = (complete_op_t *)op;
	uint64_t cur = atomic_load(&c->ev->sh->completed);

	(void)s;
	while (cur < c->gen &&
	       !atomic_compare_exchange_weak(&c->ev->sh->completed, &cur, c->gen))
		;
}

static void
complete_fini(emu_op_t *op)
{
	complete_op_t *c = (complete_op_t *)op;

	emu_ipcev_unref(c->ev);
	free(c);
}

void
emu_ipcev_record(emu_ipcev_t *ev, struct CUstream_st *s)
{
	complete_op_t *c = calloc(1, sizeof(*c));

	if (c == NULL)
		abort();
	c->h.run = complete_run;
	c->h.fini = complete_fini;
	c->ev = ev;
	c->gen = atomic_fetch_add(&ev->sh->recorded, 1) + 1;
	emu_ipcev_ref(ev);
	emu_stream_push(s, &c->h);
}

/* The operation cudaStreamWaitEvent queues for an interprocess event (a
 * complete_op_t: the generation it waits for). */
static void
wait_run(emu_op_t *op, struct CUstream_st *s)
{
	complete_op_t *w = (complete_op_t *)op;

	(void)s;
	emu_ipcev_wait(w->ev, w->gen);
}

void
emu_ipcev_push_wait(emu_ipcev_t *ev, struct CUstream_st *s)
{
	complete_op_t *w = calloc(1, sizeof(*w));

	if (w == NULL)
		abort();
	w->h.run = wait_run;
	w->h.fini = complete_fini;
	w->ev = ev;
	w->gen = emu_ipcev_recorded(ev);
	emu_ipcev_ref(ev);
	emu_stream_push(s, &w->h);
}

cudaError_t
cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t event)
{
	cudaError_t e = emu_enter();
	emu_ipcev_t *ev;
	struct ipcev_handle ih;

	if (e)
		return e;
	if (h == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcGetEventHandle(NULL)");
	if ((e = emu_event_ipc(event, &ev)) != cudaSuccess)
		return e;
	if (ev == NULL)
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaIpcGetEventHandle(%p): not "
				"created with cudaEventInterprocess | cudaEventDisableTiming",
				(void *)event);
	if (!ev->exporter) {
		emu_ipcev_unref(ev);
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaIpcGetEventHandle(%p): an "
				"event opened from another process's handle cannot be exported "
				"again (a choice)", (void *)event);
	}
	ih = (struct ipcev_handle){IPCEV_MAGIC, emu_env()->host_hash, dir_hash(), ev->seq,
				   ev->pid};
	emu_ipcev_unref(ev);
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &ih, sizeof(ih));
	return cudaSuccess;
}

cudaError_t
cudaIpcOpenEventHandle(cudaEvent_t *out, cudaIpcEventHandle_t h)
{
	cudaError_t e = emu_enter();
	struct ipcev_handle ih;
	emu_ipcev_t *ev;

	if (e)
		return e;
	if (out == NULL)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcOpenEventHandle(NULL)");
	memcpy(&ih, h.reserved, sizeof(ih));
	if (ih.magic != IPCEV_MAGIC)
		return emu_fail(cudaErrorInvalidValue, "cudaIpcOpenEventHandle: not a handle "
				"from cudaIpcGetEventHandle");
	if (ih.host_hash != emu_env()->host_hash || ih.dir_hash != dir_hash())
		return emu_fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenEventHandle: the "
				"event is on another host than \"%s\" or its exporter used another "
				"REFIT_EMU_DIR", emu_env()->host);
	if (ih.pid == (int)getpid())
		return emu_fail(cudaErrorDeviceUninitialized, "cudaIpcOpenEventHandle: the "
				"handle is of this process's own event");
	if ((ev = calloc(1, sizeof(*ev))) == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaIpcOpenEventHandle");
	ev->pid = ih.pid;
	ev->seq = ih.seq;
	ev->refs = 1;
	ev_path(ev->path, sizeof(ev->path), ih.pid, ih.seq);
	if (ev_map(ev, O_RDWR) != cudaSuccess || ev->sh->magic != IPCEV_MAGIC) {
		e = emu_fail(cudaErrorMapBufferObjectFailed, "cudaIpcOpenEventHandle: %s: %s "
			     "(destroyed by its process, or another REFIT_EMU_DIR)", ev->path,
			     ev->sh ? "not an event" : strerror(errno));
		if (ev->sh)
			munmap(ev->sh, sizeof(ev_shared_t));
		free(ev);
		return e;
	}
	if ((e = emu_event_import(ev, out)) != cudaSuccess)
		emu_ipcev_unref(ev);
	return e;
}

/* While the file named by `var` exists, block (a driver whose locks other
 * threads hold: the caller's thread stalls). */
static void
slow_while(const char *var)
{
	const char *path = getenv(var);
	struct timespec ts = {0, 1000000};

	if (path == NULL || *path == '\0')
		return;
	while (access(path, F_OK) == 0)
		nanosleep(&ts, NULL);
}

/* REFIT_EMU_SLOW_IPC_OPEN=PATH: cudaIpcOpenMemHandle blocks while PATH
 * exists. */
void
emu_slow_ipc_open(void)
{
	slow_while("REFIT_EMU_SLOW_IPC_OPEN");
}

/* REFIT_EMU_SLOW_IPC_CLOSE=PATH: cudaIpcCloseMemHandle blocks while PATH
 * exists. */
void
emu_slow_ipc_close(void)
{
	slow_while("REFIT_EMU_SLOW_IPC_CLOSE");
}

/* REFIT_EMU_SLOW_UNIQUE_ID=PATH: ncclGetUniqueId blocks while PATH exists
 * (a root that is slow to bind: refitd's holder child makes the id). */
void
emu_slow_unique_id(void)
{
	slow_while("REFIT_EMU_SLOW_UNIQUE_ID");
}

/* REFIT_EMU_HOLD_STREAMS=PATH: work on the streams this process created
 * (not the NULL streams) runs only once PATH exists: an asynchronous writer
 * whose queued work lands late. */
void
emu_hold_streams(void)
{
	static const char *path;
	static _Atomic int once;
	struct timespec ts = {0, 1000000};

	if (atomic_load(&once) == 0) {
		path = getenv("REFIT_EMU_HOLD_STREAMS");
		atomic_store(&once, 1);
	}
	if (path == NULL || *path == '\0')
		return;
	while (access(path, F_OK) != 0)
		nanosleep(&ts, NULL);
}
