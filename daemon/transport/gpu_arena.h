/*
 * gpu_arena.h - the bookkeeping of one rank's GPU staging arena (the nccl
 * transport, docs/gpu.md "Staging arena"): first fit over [0, size) in
 * 256-byte units from either end, freed ranges merged with their neighbours.  Offsets
 * only: the memory itself is the transport's (ncclMemAlloc, registered
 * with the rank's communicator).  Thread: one owner.
 */
#ifndef REFIT_DAEMON_TRANSPORT_GPU_ARENA_H
#define REFIT_DAEMON_TRANSPORT_GPU_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPU_ARENA_ALIGN 256u

typedef struct gpu_extent {
	uint64_t off, len;
} gpu_extent_t;

typedef struct gpu_arena {
	uint64_t size;
	gpu_extent_t *free_v;   /* sorted by offset, never adjacent */
	size_t nfree, capfree;
	gpu_extent_t *used_v;   /* live allocations (any order) */
	size_t nused, capused;
	uint64_t in_use, peak;  /* bytes (rounded to the alignment) */
} gpu_arena_t;

void gpu_arena_init(gpu_arena_t *a, uint64_t size);
void gpu_arena_fini(gpu_arena_t *a);
/* The offset of bytes (rounded up to GPU_ARENA_ALIGN) or false when no
 * free range holds them. */
bool gpu_arena_get(gpu_arena_t *a, uint64_t bytes, uint64_t *off);
/* The same from the top: the highest free range that holds them, its high
 * end.  Staging held past its group (relays, conversion scratch, delta
 * bases) comes from here, a group's buffers from the bottom, so the groups'
 * buffers, all freed at the group's end, never leave holes between what
 * lives on, and relays, all freed together at a round's end, none between
 * the groups' (docs/gpu.md, "Staging arena"). */
bool gpu_arena_get_top(gpu_arena_t *a, uint64_t bytes, uint64_t *off);
/* Give back the allocation at off: false when none starts there. */
bool gpu_arena_put(gpu_arena_t *a, uint64_t off);
/* The largest free range, bytes. */
uint64_t gpu_arena_largest(const gpu_arena_t *a);

#endif
