/*
 * gpu_order.h - gpu-test's case on stream ordering (gpu_order.c): a
 * client's asynchronous writes land before the transport reads them.
 */
#ifndef REFIT_TESTS_GPU_ORDER_H
#define REFIT_TESTS_GPU_ORDER_H

#include <stdbool.h>

/* Fork first (before CUDA in the caller): a child process, the exit status
 * says (0 passed, 1 failed, 77 skipped); it prints FAIL lines. */
int order_child(bool emu);

#endif
