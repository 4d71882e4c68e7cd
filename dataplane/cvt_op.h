/*
 * cvt_op.h - one conversion launch on a device: the descriptor that the
 * device conversion driver (dataplane/conv_dev.c) hands the transport and
 * the transport hands the kernels (daemon/transport/convert_kernels.cu),
 * or the emulator's host equivalents (tests/emu/emu_convert.c).
 *
 * A region is rows x cols elements; element (r, c) of an operand is at
 * base + (r * ld + c * inc) * its element size (strides >= 0, in
 * elements: strided client views need no copy first).  Bases are aligned
 * to their element size (a launcher refuses others with
 * cudaErrorInvalidValue: a misaligned access would be a sticky fault).
 *
 *  DP_CVT_CAST    dst(r, c) = cast(src(r, c)): from FP32 (or BF16, FP16)
 *                 to BF16 or FP16, round to nearest even (docs/conversion.md).
 *  DP_CVT_SCALES  the region starts a block: block (i, j) covers rows
 *                 [i*br, min((i+1)*br, rows)) and likewise columns;
 *                 scale(i, j) = scale_inv fp32 bits of its max |x|
 *                 (mx: the e8m0 byte, scale 1 byte), at
 *                 scale + (i * scale_ld + j * scale_inc) * (mx ? 1 : 4).
 *  DP_CVT_QUANT   dst(r, c) = e4m3(src(r, c) / s) with s the scale of block
 *                 ((r0 + r) / br, (c0 + c) / bc) (mx: the byte's divisor):
 *                 (r0, c0) is the region's place in the block grid that
 *                 scale describes.
 *
 * Plain C, no includes beyond stdint: nvcc compiles it too.
 */
#ifndef REFIT_DATAPLANE_CVT_OP_H
#define REFIT_DATAPLANE_CVT_OP_H

#include <stdint.h>

enum { DP_CVT_CAST = 1, DP_CVT_SCALES = 2, DP_CVT_QUANT = 3 };

typedef struct dp_cvt_op {
	int32_t op;          /* DP_CVT_* */
	int32_t from, to;    /* plan_dtype_t values (plan/box.h) */
	int32_t mx;          /* MXFP8: e8m0 byte scales */
	const void *src;
	int64_t src_ld, src_inc;
	void *dst;
	int64_t dst_ld, dst_inc;
	void *scale;
	int64_t scale_ld, scale_inc;
	int64_t rows, cols;
	int64_t r0, c0, br, bc;
} dp_cvt_op_t;

#endif
