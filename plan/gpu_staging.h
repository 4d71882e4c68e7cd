/*
 * gpu_staging.h - how the nccl transport groups a plan's messages, and the
 * GPU staging that takes on one rank at once (docs/gpu.md, "Staging
 * arena").  The grouping (plan_buckets_t) is the one rule every node
 * computes: per stage, each rank fills buckets of at most the plan's
 * staging_bytes (one larger message alone), a message in the later of its
 * two ranks' buckets; a node runs (stage, bucket) in order, one NCCL group
 * each (daemon/node/slice_group.c).  The estimate replays that order for a
 * node's ranks and counts everything the slice takes from a rank's arena,
 * each allocation rounded up to the arena's 256 bytes:
 *   - group buffers: each message staged whole in its sender's and its
 *     receiver's arena (one buffer when they are the same rank), freed when
 *     the group ends;
 *   - relay data: a received part the rank passes on but does not wholly
 *     keep (dataplane/exec.c, stage_part), held until the node's first
 *     group of a later round;
 *   - what a group takes beyond the messages' buffers (delta refits'
 *     encodings and the codec's work), given by the caller per message;
 *   - a fixed share per rank held for the whole slice (conversion scratch,
 *     the delta bases' share), given by the caller.
 */
#ifndef REFIT_PLAN_GPU_STAGING_H
#define REFIT_PLAN_GPU_STAGING_H

#include "plan/plan.h"

#define PLAN_GPU_ALIGN 256u   /* the arena's unit (gpu_arena.h's GPU_ARENA_ALIGN) */

/* The grouping: every message of the plan in plan order with its bucket
 * (numbered per stage). */
typedef struct plan_buckets {
	plan_msgs_t it;
	uint64_t W;           /* staging_bytes */
	size_t nr;
	uint64_t *cur, *fill; /* per rank: its current bucket and its fill */
	uint32_t stage;
} plan_buckets_t;

void plan_buckets_init(plan_buckets_t *b, const plan_t *p);
/* The next message into *m (valid as plan_msgs_next's) and its bucket;
 * false at the end. */
bool plan_buckets_next(plan_buckets_t *b, plan_msg_t *m, uint64_t *bucket);
void plan_buckets_fini(plan_buckets_t *b);
/* The highest rank any transfer of p names (0 for none). */
int32_t plan_max_rank(const plan_t *p);

typedef struct plan_gpu_staging {
	uint64_t peak;        /* the most one rank's arena holds at once */
	int32_t rank;         /* that rank */
	uint64_t groups;      /* (stage, bucket, rank) groups seen */
	uint64_t group_peak;  /* of peak: group buffers */
	uint64_t relay_peak;  /* of peak: relay data */
	uint64_t fixed;       /* of peak: the caller's fixed share */
} plan_gpu_staging_t;

/* What the estimate counts beyond the groups (all optional). */
typedef struct plan_gpu_extra {
	const plan_layout_set_t *dst;  /* the receivers' layouts: relays counted
					  (NULL: not counted) */
	const uint64_t *fixed;         /* per rank 0..nfixed: bytes held all slice */
	size_t nfixed;
	/* what a group takes beyond a message's buffer at its sending (send)
	 * or receiving end, for a message between two ranks (NULL: nothing;
	 * delta refits: encodings, size messages, the codec's work) */
	uint64_t (*msg_extra)(void *ctx, uint64_t bytes, bool send);
	void *ctx;
} plan_gpu_extra_t;

/* trail: bytes each message carries beyond its payload (4 in verify mode). */
void plan_gpu_staging(const plan_t *p, uint64_t trail, plan_gpu_staging_t *out);
/* The peak over ranks[0..n) only (a node's own ranks, whose groups it runs
 * in the node's order: what its arenas must hold; the node checks it
 * against its budget before a slice allocates anything).  ex may be NULL.
 * groups counts every rank's. */
void plan_gpu_staging_ranks(const plan_t *p, uint64_t trail, const plan_gpu_extra_t *ex,
			    const int32_t *ranks, size_t n, plan_gpu_staging_t *out);

#endif
