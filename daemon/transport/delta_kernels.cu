/*
 * delta_kernels.cu - the delta codec's phases (dataplane/delta_dev.h) as
 * kernels: one thread per tile for the parallel phases, one thread for the
 * scans, all queued on the caller's stream in order (delta_kernels.h).
 */
#include <cuda_runtime.h>

#include "daemon/transport/delta_kernels.h"

enum { K_E1, K_E3, K_E5, K_D1, K_D3, K_D4 };

__global__ void
refit_delta_tiles(dp_delta_op_t a, int phase, uint64_t nt)
{
	for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < nt;
	     t += (uint64_t)gridDim.x * blockDim.x) {
		switch (phase) {
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
refit_delta_one(dp_delta_op_t a, int phase)
{
	if (blockIdx.x != 0 || threadIdx.x != 0)
		return;
	if (phase == 2)
		dpd_e2_context(&a);
	else if (phase == 4)
		dpd_e4_choose(&a);
	else
		dpd_d2_result(&a);
}

static void
tiles(const dp_delta_op_t *a, int phase, uint64_t nt, cudaStream_t s)
{
	unsigned threads = 128;
	uint64_t blocks = (nt + threads - 1) / threads;

	if (nt == 0)
		return;
	refit_delta_tiles<<<(unsigned)(blocks < 65535 ? blocks : 65535), threads, 0, s>>>(
		*a, phase, nt);
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
		refit_delta_one<<<1, 1, 0, s>>>(*a, 2);
		tiles(a, K_E3, nt, s);
		refit_delta_one<<<1, 1, 0, s>>>(*a, 4);
		tiles(a, K_E5, nt, s);
	} else {
		tiles(a, K_D1, nt, s);
		refit_delta_one<<<1, 1, 0, s>>>(*a, 0);
		tiles(a, K_D3, nt, s);
		tiles(a, K_D4, nt, s);
	}
	return (int)cudaGetLastError();
}
