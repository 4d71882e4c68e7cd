/*
 * emu.h - what the CUDA + NCCL emulator (tests/emu) offers tests beyond the
 * CUDA and NCCL API: its counters.
 *
 * Both emulated libraries share one state per process (libnccl.so.2 needs
 * libcudart.so.13); refitEmuGetCounters is exported by libcudart.so.13.
 * Load it with dlsym from the libcudart handle, or link the library.
 * With REFIT_EMU_COUNTERS=1 the process also writes
 * $REFIT_EMU_DIR/counters/<pid>.json at exit (see README.md).
 */
#ifndef REFIT_EMU_H
#define REFIT_EMU_H

#include <stdint.h>

#define REFIT_EMU_MAX_DEVICES 16
/* index of host memory in pair_bytes */
#define REFIT_EMU_HOST REFIT_EMU_MAX_DEVICES

typedef struct refitEmuCounters {
	int devices;                                   /* REFIT_EMU_DEVICES */
	int64_t alloc_live[REFIT_EMU_MAX_DEVICES];      /* cudaMalloc not yet freed */
	int64_t alloc_bytes_live[REFIT_EMU_MAX_DEVICES];
	int64_t ipc_open;                               /* cudaIpcOpenMemHandle not closed */
	int64_t streams_live;                           /* created, not destroyed */
	int64_t comms_live;                             /* NCCL communicators not freed */
	int64_t ids_unconsumed;                         /* ncclGetUniqueId roots alive */
	/* bytes moved [src][dst]: copies, kernels and NCCL sends (counted by the
	 * sending process, with the peer's device index); REFIT_EMU_HOST = host */
	int64_t pair_bytes[REFIT_EMU_MAX_DEVICES + 1][REFIT_EMU_MAX_DEVICES + 1];
	char sticky[256];                               /* "" or the sticky error */
} refitEmuCounters_t;

/* Fill *out with this process's counters; 0, or -1 when out is NULL. */
int refitEmuGetCounters(refitEmuCounters_t *out);

#endif
