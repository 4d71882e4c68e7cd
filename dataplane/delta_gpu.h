/*
 * delta_gpu.h - a delta unit on a device (issue 26 item 3, docs/delta.md):
 * the codec's kernels (dataplane/delta_dev.h) driven through
 * dp_dev_ops_t.delta, and the size message that tells a receiver how many
 * bytes of encoding to receive.
 *
 * On nccl a receive names its byte count before the bytes come, and an
 * encoding's size is known only once the sender's kernels ran, so a unit
 * crosses in two groups: first its size message (DP_GDELTA_SIZE_MSG
 * bytes: the wire bytes, the base's tag), then the wire bytes themselves
 * (the encoding, or the dense unit when the encoding is not smaller).
 *
 * work is device memory of dp_gdelta_work(nbytes, esize) bytes on the
 * rank's device, 8-aligned: the launch's result words and its scratch.
 * Launches are queued on the rank's stream; the *_result calls copy the
 * result words to the host and sync.  Thread: the executor's.
 */
#ifndef REFIT_DATAPLANE_DELTA_GPU_H
#define REFIT_DATAPLANE_DELTA_GPU_H

#include "dataplane/delta.h"
#include "dataplane/exec.h"

#define DP_GDELTA_SIZE_MSG 16u

/* Device bytes of work for a unit of nbytes in esize-byte elements. */
uint64_t dp_gdelta_work(uint64_t nbytes, unsigned esize);

/* Queue: cur against base (nbytes each, aligned to esize) into enc
 * (DP_DELTA_HDR + nbytes bytes), the host codec's best encoding. */
void dp_gdelta_encode(const dp_dev_ops_t *dev, int32_t rank, const void *base, const void *cur,
		      uint64_t nbytes, unsigned esize, void *enc, void *work);
/* After dp_gdelta_encode: its length and format (copies and syncs). */
refit_status_t dp_gdelta_encode_result(const dp_dev_ops_t *dev, int32_t rank, const void *work,
				       uint64_t *len, dp_delta_fmt_t *fmt, refit_err_t *err);

/* Queue: enc (len bytes, untrusted) decoded against base into out (out may
 * be base: the receiver's base becomes the unit). */
void dp_gdelta_decode(const dp_dev_ops_t *dev, int32_t rank, const void *base, void *out,
		      uint64_t nbytes, unsigned esize, const void *enc, uint64_t len, void *work);
/* After dp_gdelta_decode: REFIT_ERR_INVALID_ARG naming what the decoder
 * refused (out untouched then), as dp_delta_decode would. */
refit_status_t dp_gdelta_decode_result(const dp_dev_ops_t *dev, int32_t rank, const void *work,
				       refit_err_t *err);

/* The size message: wire bytes and the base's tag, little-endian. */
void dp_gdelta_size_put(uint8_t *msg, uint64_t wire, uint64_t tag);
void dp_gdelta_size_get(const uint8_t *msg, uint64_t *wire, uint64_t *tag);

#endif
