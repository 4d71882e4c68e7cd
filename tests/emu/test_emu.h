/*
 * test_emu.h - what the emulator's rule tests share (test_emu.c: helpers and
 * the driver; test_cuda.c, test_cuda_hw.c, test_nccl.c: the tests).
 */
#ifndef REFIT_EMU_TEST_H
#define REFIT_EMU_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/emu/cuda_abi.h"
#include "tests/emu/emu.h"

#define CK(c, ...)                                                                         \
	do {                                                                               \
		if (!(c)) {                                                                \
			fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, \
				#c);                                                       \
			fprintf(stderr, __VA_ARGS__);                                      \
			fputc('\n', stderr);                                               \
			_exit(1);                                                          \
		}                                                                          \
	} while (0)
#define CU(call)                                                                           \
	do {                                                                               \
		cudaError_t e_ = (call);                                                   \
		CK(e_ == cudaSuccess, "%s -> %s", #call, cudaGetErrorName(e_));            \
	} while (0)
#define CUIS(call, want)                                                                   \
	do {                                                                               \
		cudaError_t e_ = (call);                                                   \
		CK(e_ == (want), "%s -> %s, want %s", #call, cudaGetErrorName(e_),         \
		   cudaGetErrorName(want));                                                \
	} while (0)
#define NC(call)                                                                           \
	do {                                                                               \
		ncclResult_t r_ = (call);                                                  \
		CK(r_ == ncclSuccess || r_ == ncclInProgress, "%s -> %d %s", #call, r_,    \
		   ncclGetErrorString(r_));                                                \
	} while (0)
#define NCIS(call, want)                                                                   \
	do {                                                                               \
		ncclResult_t r_ = (call);                                                  \
		CK(r_ == (want), "%s -> %d, want %d", #call, r_, want);                    \
	} while (0)

typedef struct test {
	const char *name;
	void (*fn)(void);
	const char *env;            /* extra NAME=VALUE settings, space separated */
} test_t;

/* Rows of a test table: the test "name" runs t_name, with extra environment. */
#define TEST(name) {#name, t_##name, NULL}
#define TEST_ENV(name, env) {#name, t_##name, env}

extern const test_t cuda_tests[], nccl_tests[], hw_tests[], ev_tests[];
extern const size_t ncuda_tests, nnccl_tests, nhw_tests, nev_tests;

/* the test's REFIT_EMU_DIR */
extern char tdir[200];

int64_t now_ms(void);
pid_t spawn(void (*fn)(int), int arg, const char *hostid);
int reap(pid_t pid);
void reap_ok(pid_t pid);
void put(int fd, const void *p, size_t n);
void get(int fd, void *p, size_t n);
ncclResult_t wait_comm(ncclComm_t c, int ms);
cudaError_t wait_stream(cudaStream_t s, int ms);
/* n bytes on the current device */
void *dev_alloc(size_t n);
/* a new non-blocking stream on the current device */
cudaStream_t stream_nb(void);
ncclConfig_t nonblocking(void);
void fill(uint8_t *p, size_t n, unsigned seed);
refitEmuCounters_t counters(void);

#endif
