/*
 * delta_kernels.cu - the delta codec's steps (dataplane/delta_dev.h) as
 * kernels, all queued on the caller's stream in order (delta_kernels.h):
 * one thread per tile for the tile steps; one block of DPD_SCAN_MAX
 * threads, a chunk of tiles each, for the scans' sums and writes; one
 * thread for the scans themselves and a decode's check.
 */
#include <cuda_runtime.h>

#include "daemon/transport/delta_kernels.h"

enum { K_E1, K_E3, K_E5, K_D1, K_D3, K_D4 };
enum { C_E2A, C_E2C, C_E4A, C_E4C, C_D1B, C_D2C };
enum { O_E2B, O_E4B, O_D2 };

__global__ void
refit_delta_tiles(dp_delta_op_t a, int step, uint64_t nt)
{
	for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < nt;
	     t += (uint64_t)gridDim.x * blockDim.x) {
		switch (step) {
		case K_E1: dpd_e1_count(&a, t); break;
		case K_E3: dpd_e3_runs(&a, t); break;
		case K_E5: dpd_e5_write(&a, t); break;
		case K_D1: dpd_d1_bits(&a, t); break;
		case K_D3: dpd_d3_copy(&a, t); break;
		default: dpd_d4_apply(&a, t); break;
		}
	}
}

__global__ void
refit_delta_chunks(dp_delta_op_t a, int step)
{
	uint32_t th = threadIdx.x, m = blockDim.x;

	switch (step) {
	case C_E2A: dpd_e2a_sum(&a, th, m); break;
	case C_E2C: dpd_e2c_context(&a, th, m); break;
	case C_E4A: dpd_e4a_sum(&a, th, m); break;
	case C_E4C: dpd_e4c_place(&a, th, m); break;
	case C_D1B: dpd_d1b_sum(&a, th, m); break;
	default: dpd_d2c_place(&a, th, m); break;
	}
}

__global__ void
refit_delta_one(dp_delta_op_t a, int step)
{
	if (blockIdx.x != 0 || threadIdx.x != 0)
		return;
	if (step == O_E2B)
		dpd_e2b_scan(&a, DPD_SCAN_MAX);
	else if (step == O_E4B)
		dpd_e4b_choose(&a, DPD_SCAN_MAX);
	else
		dpd_d2_result(&a, DPD_SCAN_MAX);
}

static void
tiles(const dp_delta_op_t *a, int step, uint64_t nt, cudaStream_t s)
{
	unsigned threads = 128;
	uint64_t blocks = (nt + threads - 1) / threads;

	if (nt == 0)
		return;
	refit_delta_tiles<<<(unsigned)(blocks < 65535 ? blocks : 65535), threads, 0, s>>>(
		*a, step, nt);
}

static void
chunks(const dp_delta_op_t *a, int step, cudaStream_t s)
{
	refit_delta_chunks<<<1, DPD_SCAN_MAX, 0, s>>>(*a, step);
}

extern "C" int
refit_cuda_delta(const dp_delta_op_t *a, void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	uint64_t nt;

	if (a == NULL || dpd_op_refused(a) != NULL)
		return (int)cudaErrorInvalidValue;
	nt = dp_delta_dev_tiles(a->nbytes, a->esize);
	if (a->dir == 0) {
		tiles(a, K_E1, nt, s);
		chunks(a, C_E2A, s);
		refit_delta_one<<<1, 1, 0, s>>>(*a, O_E2B);
		chunks(a, C_E2C, s);
		tiles(a, K_E3, nt, s);
		chunks(a, C_E4A, s);
		refit_delta_one<<<1, 1, 0, s>>>(*a, O_E4B);
		chunks(a, C_E4C, s);
		tiles(a, K_E5, nt, s);
	} else {
		tiles(a, K_D1, nt, s);
		chunks(a, C_D1B, s);
		refit_delta_one<<<1, 1, 0, s>>>(*a, O_D2);
		chunks(a, C_D2C, s);
		tiles(a, K_D3, nt, s);
		tiles(a, K_D4, nt, s);
	}
	return (int)cudaGetLastError();
}
