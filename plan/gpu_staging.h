/*
 * gpu_staging.h - the GPU staging a plan's messages take on one rank at
 * once over the nccl transport (docs/gpu.md, "Staging arena"): the node
 * runs a plan's messages in groups (daemon/node/slice.c, bucket_all: per
 * stage, each rank fills buckets of at most the plan's staging_bytes, a
 * message in the later of its two ranks' buckets), and stages each message
 * whole in its sender's and its receiver's arena (one buffer when they are
 * the same rank), each buffer rounded up to the arena's 256 bytes.
 * Relay data (plan_check_t.max_staging) and conversion scratch come on top.
 */
#ifndef REFIT_PLAN_GPU_STAGING_H
#define REFIT_PLAN_GPU_STAGING_H

#include "plan/plan.h"

typedef struct plan_gpu_staging {
	uint64_t peak;        /* the most one rank's group buffers hold at once */
	int32_t rank;         /* that rank */
	uint64_t groups;      /* (stage, bucket, rank) groups seen */
} plan_gpu_staging_t;

/* trail: bytes each message carries beyond its payload (4 in verify mode). */
void plan_gpu_staging(const plan_t *p, uint64_t trail, plan_gpu_staging_t *out);
/* The same, the peak over ranks[0..n) only (a node's own ranks: what its
 * arenas must hold; the node checks it against its budget before a slice
 * allocates anything).  groups counts every rank's. */
void plan_gpu_staging_ranks(const plan_t *p, uint64_t trail, const int32_t *ranks, size_t n,
			    plan_gpu_staging_t *out);

#endif
