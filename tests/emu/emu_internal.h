/*
 * emu_internal.h - the state the emulated libcudart.so.13 and libnccl.so.2
 * share inside one process (not for tests: see emu.h).
 *
 * libcudart.so.13 holds everything here (emu_mem.c, emu_stream.c); the
 * emu_* functions are exported from it so that libnccl.so.2 (which has it
 * as DT_NEEDED) uses the same device table, streams and sticky error.
 */
#ifndef REFIT_EMU_INTERNAL_H
#define REFIT_EMU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "tests/emu/cuda_abi.h"
#include "tests/emu/emu.h"

#define EMU_API __attribute__((visibility("default")))
#define EMU_PRINTF(a, b) __attribute__((format(printf, a, b)))
/* Format the arguments after fmt of the enclosing variadic function into
 * the array buf (truncated to fit). */
#define EMU_VFORMAT(buf, fmt)                              \
	do {                                               \
		va_list ap_;                               \
		va_start(ap_, fmt);                        \
		vsnprintf(buf, sizeof(buf), fmt, ap_);     \
		va_end(ap_);                               \
	} while (0)

/* ---- process state (emu_mem.c) ------------------------------------------ */

typedef struct emu_env {
	int ndev;                 /* devices this process sees (its ordinals) */
	int nphys;                /* REFIT_EMU_DEVICES: devices of the host */
	int phys[REFIT_EMU_MAX_DEVICES]; /* ordinal -> the host's device
				     (CUDA_VISIBLE_DEVICES; else the identity) */
	char dir[200];            /* REFIT_EMU_DIR */
	char host[64];            /* NCCL_HOSTID or the hostname */
	uint64_t host_hash;
	uint64_t dev_mem;         /* bytes per device */
	unsigned delay_min_us, delay_max_us;
	int nccl_version;         /* REFIT_EMU_NCCL_VERSION: what ncclGetVersion says */
	uint64_t hang_d2h;        /* REFIT_EMU_HANG_D2H: this device-to-host copy of the
				     process (counted from 1) never ends (0: none) */
	uint64_t fault_d2d;       /* REFIT_EMU_FAULT_D2D: this device-to-device copy of
				     the process (counted from 1) kills the context */
	uint64_t hang_abort;      /* REFIT_EMU_HANG_ABORT: this ncclCommAbort of the
				     process (counted from 1) never returns */
} emu_env_t;

/* The host's device of this process's ordinal ord (the identity without
 * CUDA_VISIBLE_DEVICES); this process's ordinal of the host's device phys,
 * -1 when it does not see it. */
EMU_API int emu_phys(int ord);
EMU_API int emu_ord(int phys);

/* Initialise once (environment, address space); NULL when that failed (and
 * said why on stderr).  Thread-safe. */
EMU_API const emu_env_t *emu_env(void);

/* The entry check of every CUDA call: initialised, no sticky error.
 * cudaSuccess, or the error to return. */
EMU_API cudaError_t emu_enter(void);
/* Return a non-sticky error: remembered for cudaGetLastError, said on
 * stderr with the call's reason. */
EMU_API cudaError_t emu_fail(cudaError_t e, const char *fmt, ...) EMU_PRINTF(2, 3);
/* The device context dies: e (cudaErrorIllegalAddress) is returned by every
 * later CUDA call of the process.  Says why on stderr (first time). */
EMU_API void emu_fault(cudaError_t e, const char *fmt, ...) EMU_PRINTF(2, 3);
EMU_API cudaError_t emu_sticky(void);
/* This thread's last (non-sticky) error becomes e; the previous one. */
EMU_API cudaError_t emu_last_swap(cudaError_t e);
EMU_API int emu_cur_dev(void);
EMU_API void emu_say(const char *fmt, ...) EMU_PRINTF(1, 2);
/* Sleep the randomized execution delay (REFIT_EMU_DELAY_US). */
EMU_API void emu_delay(void);
EMU_API uint64_t emu_rand(void);
EMU_API uint64_t emu_hash(const void *p, size_t n, uint64_t h);

/* ---- device memory (emu_mem.c) ------------------------------------------- */

typedef struct emu_alloc emu_alloc_t;

enum emu_where { EMU_HOST, EMU_DEVICE, EMU_BAD };

/*
 * Where [p, p + len) lies: EMU_HOST (outside the device address space),
 * EMU_DEVICE (inside one live allocation: *dev, *mem = its host-writable
 * view, *a pinned until emu_mem_unpin) or EMU_BAD (device addresses that are
 * not inside one allocation).  pin = false: only classify.
 */
EMU_API enum emu_where emu_mem_find(const void *p, size_t len, bool pin, int *dev,
				    uint8_t **mem, emu_alloc_t **a);
EMU_API void emu_mem_unpin(emu_alloc_t *a);
EMU_API bool emu_is_dev_addr(const void *p);
/* Reserve the device address space (once, from emu_env). */
void emu_mem_init(const emu_env_t *e);

/* ---- counters (emu_mem.c) ------------------------------------------------- */

EMU_API void emu_count_pair(int src, int dst, uint64_t bytes);
EMU_API void emu_count_alloc(int dev, int64_t n, int64_t bytes);
/* The process-wide live counts (refitEmuCounters_t's ipc_open, streams_live,
 * comms_live, ids_unconsumed). */
typedef enum emu_counter { EMU_IPC, EMU_STREAMS, EMU_COMMS, EMU_IDS, EMU_NCOUNTERS } emu_counter_t;
EMU_API void emu_count(emu_counter_t which, int delta);

/* ---- streams (emu_stream.c) ----------------------------------------------- */

typedef struct emu_op emu_op_t;
struct emu_op {
	emu_op_t *next;
	/* executed by the stream's worker, in order; the op is freed by fini */
	void (*run)(emu_op_t *op, struct CUstream_st *s);
	void (*fini)(emu_op_t *op);
};

/* The stream behind a handle (NULL: the current device's default stream);
 * cudaErrorInvalidResourceHandle for a handle that is not a live stream. */
EMU_API cudaError_t emu_stream_get(cudaStream_t h, struct CUstream_st **out);
EMU_API int emu_stream_dev(const struct CUstream_st *s);
/* Queue op on s; it runs after everything queued before it. */
EMU_API void emu_stream_push(struct CUstream_st *s, emu_op_t *op);
/* Wait until every op queued so far on the streams of dev (-1: all) ran. */
EMU_API void emu_streams_sync(int dev);

/* ---- interprocess events (emu_ipcev.c) ------------------------------------ */

typedef struct emu_ipcev emu_ipcev_t;

/* An exporter's new shared record (cudaEventInterprocess). */
EMU_API cudaError_t emu_ipcev_new(emu_ipcev_t **out);
EMU_API void emu_ipcev_ref(emu_ipcev_t *ev);
EMU_API void emu_ipcev_unref(emu_ipcev_t *ev);
/* cudaEventDestroy: the exporter's removes the record's file. */
EMU_API void emu_ipcev_destroy(emu_ipcev_t *ev);
EMU_API bool emu_ipcev_imported(const emu_ipcev_t *ev);
/* A record on s: the next generation, completed when s reaches it. */
EMU_API void emu_ipcev_record(emu_ipcev_t *ev, struct CUstream_st *s);
EMU_API uint64_t emu_ipcev_recorded(const emu_ipcev_t *ev);
EMU_API bool emu_ipcev_done(const emu_ipcev_t *ev, uint64_t gen);
EMU_API void emu_ipcev_wait(const emu_ipcev_t *ev, uint64_t gen);
/* cudaStreamWaitEvent: s waits for the generation recorded now. */
EMU_API void emu_ipcev_push_wait(emu_ipcev_t *ev, struct CUstream_st *s);
/* REFIT_EMU_HOLD_STREAMS: block until its file exists (stream workers of
 * created streams, before each operation). */
EMU_API void emu_hold_streams(void);
/* REFIT_EMU_SLOW_IPC_OPEN: cudaIpcOpenMemHandle waits while its file exists. */
EMU_API void emu_slow_ipc_open(void);
EMU_API void emu_slow_unique_id(void);
/* REFIT_EMU_SLOW_IPC_CLOSE: cudaIpcCloseMemHandle waits while its file exists. */
EMU_API void emu_slow_ipc_close(void);
/* emu_stream.c: an event's shared record (referenced; NULL: not an
 * interprocess event), or cudaErrorInvalidResourceHandle. */
EMU_API cudaError_t emu_event_ipc(cudaEvent_t h, emu_ipcev_t **ev);
/* emu_stream.c: a new event of this process for an imported record (its
 * reference moves to the event). */
EMU_API cudaError_t emu_event_import(emu_ipcev_t *ev, cudaEvent_t *out);

#endif
