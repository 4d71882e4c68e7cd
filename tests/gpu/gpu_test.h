/*
 * gpu_test.h - what gpu-test's files share: the harness (gpu_test.c: the
 * counts, EXPECT, a transport and a session of the test's ranks, a child
 * process's transport, the emulator's counters) and each case file's
 * cases (gpu_copy.c, gpu_procs.c, gpu_faults.c; gpu_order.c has its own
 * header).  Only with the CUDA and NCCL headers (REFIT_HAVE_NCCL).
 */
#ifndef REFIT_TESTS_GPU_TEST_H
#define REFIT_TESTS_GPU_TEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "daemon/transport/gpu.h"
#include "daemon/transport/transport.h"

#ifdef REFIT_HAVE_NCCL

extern int passed, failed;
extern bool emu;                 /* REFIT_GPU_TEST_EMU: on the emulator */
extern atomic_int no_abort;
extern int64_t session_ms;       /* a session's deadline */

/* A failed condition: printed with where, counted in the caller's `bad`. */
#define EXPECT(cond, ...)                                                          \
	do {                                                                       \
		if (!(cond)) {                                                     \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                \
			printf(__VA_ARGS__);                                       \
			printf("\n");                                              \
			fflush(stdout);                                            \
			bad++;                                                     \
		}                                                                  \
	} while (0)

/* One case's result line ("ok" or "FAIL"), counted. */
void result(const char *name, int bad);
/* A transport serving ranks (on devices devs, "0,1": NULL = identity). */
xport_t *start(const int32_t *ranks, size_t n, const char *devs, const char *name,
	       refit_err_t *err);
/* A session of epoch over world (all ranks), this transport's local ranks;
 * id: NULL for none (shrink). */
xport_session_t *session(xport_t *x, uint64_t epoch, const int32_t *world, size_t nworld,
			 const int32_t *local, size_t nlocal, const uint8_t *id, size_t idlen,
			 refit_err_t *err);
/* A child process's transport for rank me on its own host (NCCL_HOSTID +
 * suffix), device 0; the loaded table in *api.  NULL: said why. */
xport_t *child_start(const char *suffix, int32_t me, gpu_api_t **api);
/* Rank 0 alone on x: a fresh unique id, the world of epoch 1 of it only. */
refit_status_t alone_world(xport_t *x, refit_err_t *err);
/* On the emulator: nothing left allocated, mapped or alive in this
 * process (who names it in a failure); the failures' count. */
int emu_check(const char *who);

/* gpu_copy.c: one process's devices (1, 2, 3, 6); each returns its failures */
int box_copies(xport_session_t *s, const int32_t *ranks, size_t nranks);
int big_pitch(xport_session_t *s, int32_t rank);
int copy_error(xport_t *x, const int32_t *world, size_t nworld, const uint8_t *id,
	       size_t idlen);
/* ops as one group, through the transport's one entry point */
refit_status_t group_run(xport_session_t *s, const xport_op_t *ops, size_t n,
			 refit_err_t *err);
int group_two(xport_session_t *s, int32_t r0, int32_t r1, uint64_t n, int reps);
int delta_two(xport_session_t *s, int32_t r0, int32_t r1, uint64_t n);
int loopback(xport_session_t *s, int32_t r);

/* gpu_procs.c: across processes (4, 5, 8, 8b, 8c); a child's exit status,
 * or the failures */
/* the IPC case's allocations: 2 MiB, as CUDA advises for IPC (sub-allocations
 * of a larger block would share the block) */
#define IPC_BYTES (2u << 20)
int ipc_child(int rfd);
int ring_child(int32_t me, int idfd, int out1, int out2, int gofd, int donefd);
int dead_peer_child(int32_t me, int idfd, pid_t peer);
int staging_budget(void);
int hang_abort_child(void);

/* gpu_faults.c: the emulator's faults and the loader (9-14, 7) */
int late_error_child(void);
int stuck_child(void);
int shrink_fail_child(int role, int idfd, int donefd);
int so12_child(const char *cudart);
int two_runtimes_child(const char *cudart);
int root_pipe_failure(void);

#endif
#endif
