/*
 * convert_kernels.h - precision conversion on the GPU (docs/conversion.md):
 * the C ABI of daemon/transport/convert_kernels.cu.
 *
 * Built with nvcc, where it exists, into build/lib/librefit-convert-cuda.so
 * (cudart linked statically; the primary context is shared with the
 * daemon's own CUDA).  The nccl transport loads it with dlopen and looks
 * the launchers up by these names (typedefs below).  Element rules are
 * dataplane/convert_elem.h, the host code's own, so GPU and host results
 * are bit-identical.
 *
 * Every launcher queues work on `stream` (a cudaStream_t; NULL: the
 * default stream) and returns a cudaError_t (0: queued).  Pointers are
 * device memory.  Dtypes are plan_dtype_t values (plan/box.h): from is
 * PLAN_DT_FP32, PLAN_DT_BF16 or PLAN_DT_FP16; to is PLAN_DT_BF16,
 * PLAN_DT_FP16 (casts, from fp32) or PLAN_DT_FP8E4M3.  Regions are 2-D,
 * rows x cols with a leading dimension (elements between rows); a 3-D
 * expert tensor is one launch per expert (block [1, br, bc]), a 1-D tensor
 * one row.
 */
#ifndef REFIT_DAEMON_TRANSPORT_CONVERT_KERNELS_H
#define REFIT_DAEMON_TRANSPORT_CONVERT_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* n contiguous elements of `from` at src cast to `to` at dst (no scale). */
int refit_cuda_cast(const void *src, int from, void *dst, int to, uint64_t n, void *stream);

/*
 * Scales of a block-aligned region: src holds rows x cols elements whose
 * first element starts block (0, 0); block (i, j) covers rows
 * [i*br, min((i+1)*br, rows)) and likewise columns (edge blocks are
 * partial).  scale_inv[i*scale_ld + j] gets the block's scale_inv bits:
 * max(amax, 1e-4) / 448, or 0x7fc00000 for a block holding a NaN.  For a
 * tensor scale pass br = rows, bc = cols.
 */
int refit_cuda_block_scales(const void *src, int from, int64_t src_ld, int64_t rows,
			    int64_t cols, int64_t br, int64_t bc, uint32_t *scale_inv,
			    int64_t scale_ld, void *stream);

/*
 * Quantize rows x cols elements of src into e4m3 codes at dst.  (r0, c0)
 * is the region's position relative to the origin of the blocks that
 * scale_inv describes (the layout of refit_cuda_block_scales), so a
 * receiver quantizes its own box out of a widened, block-aligned buffer:
 * element (r, c) uses scale_inv[((r0 + r) / br) * scale_ld + (c0 + c) / bc].
 */
int refit_cuda_quant_e4m3(const void *src, int from, int64_t src_ld, uint8_t *dst,
			  int64_t dst_ld, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
			  int64_t br, int64_t bc, const uint32_t *scale_inv, int64_t scale_ld,
			  void *stream);

/* Test helpers (tests/conversion/cvt_gpu_test.c): device count, memory,
 * synchronous copies (to_device 1: host -> device), device sync. */
int refit_cuda_devices(void);
void *refit_cuda_alloc(uint64_t bytes);
void refit_cuda_free(void *p);
int refit_cuda_copy(void *dst, const void *src, uint64_t n, int to_device);
int refit_cuda_sync(void);

typedef int (*refit_cuda_cast_fn)(const void *, int, void *, int, uint64_t, void *);
typedef int (*refit_cuda_block_scales_fn)(const void *, int, int64_t, int64_t, int64_t,
					  int64_t, int64_t, uint32_t *, int64_t, void *);
typedef int (*refit_cuda_quant_e4m3_fn)(const void *, int, int64_t, uint8_t *, int64_t,
					int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
					const uint32_t *, int64_t, void *);

#ifdef __cplusplus
}
#endif

#endif
