/*
 * exec.h - the executor core: a plan's messages packed from the senders'
 * memory, checked, and unpacked into the receivers' memory.
 *
 * Messages are made by the plan's one rule (plan_msgs_next).  A part is
 * packed from what its sender holds: its training memory, the inference
 * memory it has already received into, or relay data in staging.  On
 * arrival a part is written into every inference box of the receiver it
 * meets, and kept in staging when the receiver must pass on more than it
 * keeps (gather-and-broadcast relays).  Verify mode appends a CRC-32C to
 * every message and checks it on arrival; a mismatch fails the run naming
 * the peers, the stage, the tensor and the box.
 *
 * Memory is reached through callbacks, so the same core serves host
 * memory in tests and, later, client memory registered through librefit.
 * dp_exec_local runs every rank of a plan in this process (in-process
 * refits and tests); transports reuse dp_pack_msg/dp_unpack_msg.
 */
#ifndef REFIT_DATAPLANE_EXEC_H
#define REFIT_DATAPLANE_EXEC_H

#include "dataplane/cvt_op.h"
#include "dataplane/delta_dev.h"
#include "dataplane/pool.h"
#include "dataplane/view.h"
#include "plan/plan.h"

/*
 * Device memory (the nccl transport): views and message buffers are device
 * pointers the host never dereferences; these operations move bytes.
 * Every operation names the rank whose device it runs on (the memory
 * touched is that rank's: its views, its staging).  Copies may be queued;
 * errors (of any operation, to_host and from_host included) surface at
 * sync, which waits for every queued copy.
 */
typedef struct dp_dev_ops {
	void (*copy_box)(void *ctx, int32_t rank, const dp_view_t *sv, const plan_shard_t *ss,
			 const dp_view_t *dv, const plan_shard_t *ds, const plan_box_t *box);
	void *(*alloc)(void *ctx, int32_t rank, uint64_t bytes);   /* NULL on failure */
	void (*free)(void *ctx, int32_t rank, void *p);
	void (*copy)(void *ctx, int32_t rank, void *dst, const void *src, uint64_t n);
	void (*to_host)(void *ctx, int32_t rank, void *host, const void *dev, uint64_t n);
	void (*from_host)(void *ctx, int32_t rank, void *dev, const void *host, uint64_t n);
	refit_status_t (*sync)(void *ctx, refit_err_t *err);
	/* one conversion launch (dataplane/cvt_op.h) on rank's device; NULL:
	 * the device cannot convert (dataplane/conv_dev.c drives it) */
	void (*convert)(void *ctx, int32_t rank, const dp_cvt_op_t *op);
	/* one delta encode or decode (dataplane/delta_dev.h) on rank's device;
	 * NULL: the device has no delta kernels (dataplane/delta_gpu.c drives it) */
	void (*delta)(void *ctx, int32_t rank, const dp_delta_op_t *op);
	void *ctx;
	/* as alloc, for staging held past its group (relays, conversion
	 * scratch, delta bases): from the other end of the rank's staging
	 * (nccl: its arena's top), so it leaves no holes between a group's
	 * buffers; NULL: alloc (dp_dev_alloc_top) */
	void *(*alloc_top)(void *ctx, int32_t rank, uint64_t bytes);
} dp_dev_ops_t;

/* dev's alloc_top, or its alloc when it has none. */
static inline void *
dp_dev_alloc_top(const dp_dev_ops_t *dev, int32_t rank, uint64_t bytes)
{
	return dev->alloc_top ? dev->alloc_top(dev->ctx, rank, bytes)
			      : dev->alloc(dev->ctx, rank, bytes);
}

typedef struct dp_mem_ops {
	/* The view of rank's piece of tensor (plan index): its training memory
	 * (dst false) or its inference memory (dst true). */
	refit_status_t (*view)(void *ctx, int32_t rank, uint32_t tensor, bool dst,
			       int32_t piece, dp_view_t *out, refit_err_t *err);
	void *ctx;
	const dp_dev_ops_t *dev;  /* NULL: host memory */
} dp_mem_ops_t;

typedef struct dp_exec_opts {
	bool verify;          /* CRC-32C per message */
	int64_t corrupt_msg;  /* tests: flip a byte of this message (-1: none) */
	dp_pool_t *pool;      /* host relay staging from this pool (NULL: malloc) */
} dp_exec_opts_t;

typedef struct dp_exec_stats {
	uint64_t msgs, bytes, local_bytes, staged_bytes_max;
} dp_exec_stats_t;

typedef struct dp_exec dp_exec_t;

/*
 * An executor for plan p over (src, dst) — the layout sets p was built
 * from.  Borrowed, must outlive it.
 */
refit_status_t dp_exec_new(const plan_t *p, const plan_layout_set_t *src,
			   const plan_layout_set_t *dst, const dp_mem_ops_t *mem,
			   const dp_exec_opts_t *o, dp_exec_t **out, refit_err_t *err);
void dp_exec_free(dp_exec_t *x);

/* The most relay staging it held at once, in bytes. */
uint64_t dp_exec_staged_max(const dp_exec_t *x);

/* Pack message m into buf (m->bytes, plus 4 CRC bytes in verify mode). */
refit_status_t dp_pack_msg(dp_exec_t *x, const plan_msg_t *m, uint8_t *buf,
			   refit_err_t *err);
/* Check and unpack a received message into the receiver's memory. */
refit_status_t dp_unpack_msg(dp_exec_t *x, const plan_msg_t *m, const uint8_t *buf,
			     refit_err_t *err);
/*
 * Free the relay data kept for rounds <= round (the broadcast planner's
 * staging rounds: a round's relays are used inside that round only).
 */
void dp_exec_release(dp_exec_t *x, uint32_t round);
/* Run every message of the plan in this process, in plan order. */
refit_status_t dp_exec_local(dp_exec_t *x, dp_exec_stats_t *st, refit_err_t *err);

#endif
