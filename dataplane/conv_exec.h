/*
 * conv_exec.h - conversion in the executor: a memory wrapper that lets the
 * executor core (exec.h) run a plan built on a conversion rewrite
 * (plan/convert.h) over memory registered for the original tensors.
 *
 * Views of unconverted tensors pass through.  A sender-side converted
 * tensor is read from scratch that holds the sender's shards already
 * converted (quantized on first use, from the whole blocks the sender
 * holds), and its scale tensor from scratch filled at the same time.  A
 * receiver-side converted tensor is received into scratch in the source
 * dtype, widened to whole blocks; dp_conv_finish then quantizes the
 * rank's boxes and scales into its real memory.
 *
 * Host memory, or a device's once dp_conv_set_dev gave it one (the nccl
 * transport): scratch then comes from the device's alloc and conversion
 * runs as launches of the conversion kernels (dataplane/conv_dev.h), on
 * the streams that the copies use.  Thread: one executor's.
 */
#ifndef REFIT_DATAPLANE_CONV_EXEC_H
#define REFIT_DATAPLANE_CONV_EXEC_H

#include "dataplane/exec.h"
#include "plan/convert.h"

typedef struct dp_conv dp_conv_t;

/*
 * A wrapper over `under`, whose view() speaks the original sets' indices
 * (tensor = index in the original dst).  c, src, dst are borrowed and must
 * outlive it.  `under` speaks host memory here; a device comes later
 * (dp_conv_set_dev).
 */
refit_status_t dp_conv_new(const plan_conv_t *c, const plan_layout_set_t *src,
			   const plan_layout_set_t *dst, const dp_mem_ops_t *under,
			   dp_conv_t **out, refit_err_t *err);
/* The memory ops to give dp_exec_new (with c->src and c->dst). */
const dp_mem_ops_t *dp_conv_mem(dp_conv_t *x);
/* After rank's last unpack: quantize its receiver-side tensors and scales
 * into its memory.  Idempotent per rank is not promised: call once. */
refit_status_t dp_conv_finish(dp_conv_t *x, int32_t rank, refit_err_t *err);
/* The session's device (NULL: host memory), before the executor is made:
 * an error naming why when the device cannot convert this plan. */
refit_status_t dp_conv_set_dev(dp_conv_t *x, const dp_dev_ops_t *dev, refit_err_t *err);
/* Free the scratch (on its device: call while the session is open; the
 * device's free waits for what was queued on it). */
void dp_conv_release(dp_conv_t *x);
/* Scratch bytes held now (sender-side converted pieces, receiver blocks). */
uint64_t dp_conv_scratch_bytes(const dp_conv_t *x);
/* The most scratch rank's device can hold at once during a slice (each
 * allocation rounded to the GPU arena's 256 bytes): every buffer the
 * wrapper may make for rank, all held until dp_conv_release.  An upper
 * bound for the whole-slice staging check (plan/gpu_staging.h). */
uint64_t dp_conv_scratch_need(const dp_conv_t *x, int32_t rank);
void dp_conv_free(dp_conv_t *x);

#endif
