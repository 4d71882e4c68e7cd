/*
 * pool.h - a bounded pool of host buffers kept warm (the tcp data
 * plane's packed messages, receive buffers and relay staging).
 *
 * One pool per node.  A buffer taken is reused by the next refit or round
 * that asks for a size it fits (at most twice the size asked), so steady
 * refits touch no fresh pages.  Buffers are mapped, not pre-faulted: a
 * page becomes resident at its first use and stays while the buffer is
 * kept (with DP_POOL_HUGE, buffers of 2 MiB or more are madvised to huge
 * pages).  Callers ask for what they will write (a peer's largest message,
 * not the plan's bound), so a node holds about what its refits move.
 * The pool keeps at most cap bytes; a request beyond that evicts idle
 * buffers, and if busy ones alone fill the cap it gets a one-off buffer,
 * unmapped when given back.  A new epoch drops every idle buffer, and
 * buffers of older epochs are unmapped when given back.  Each buffer is
 * page-aligned, after a page that tags it (counted in cap).
 * Thread-safe (slices run on worker threads).
 */
#ifndef REFIT_DATAPLANE_POOL_H
#define REFIT_DATAPLANE_POOL_H

#include <stdint.h>

typedef struct dp_pool dp_pool_t;

enum { DP_POOL_HUGE = 1 };

typedef struct dp_pool_stats {
	uint64_t cap;        /* the bound, bytes */
	uint64_t held;       /* bytes kept (busy or idle), at most cap */
	uint64_t busy;       /* bytes handed out now (one-off buffers included) */
	uint64_t hits;       /* requests served by a kept buffer */
	uint64_t made;       /* buffers mapped (and faulted in) for the pool */
	uint64_t oneoff;     /* requests beyond the cap: a one-off buffer */
	uint64_t nbufs;      /* buffers kept */
} dp_pool_stats_t;

/* Requests under small bytes come from the heap (malloc keeps those warm
 * itself), untracked: cap bounds the mapped buffers. */
dp_pool_t *dp_pool_new(uint64_t cap, uint64_t small, unsigned flags);
/* Unmap every buffer; buffers still handed out must not be used after. */
void dp_pool_free(dp_pool_t *pl);
/*
 * Enter epoch (a no-op when it is the current one): idle buffers are
 * unmapped, busy ones are when given back.  cap, when nonzero, becomes
 * the bound at an epoch change and raises it within an epoch.
 */
void dp_pool_epoch(dp_pool_t *pl, uint64_t epoch, uint64_t cap);
/* A buffer of at least bytes (1 if 0); NULL only when mmap fails. */
void *dp_pool_get(dp_pool_t *pl, uint64_t bytes);
/* Give back a buffer of dp_pool_get (NULL: nothing). */
void dp_pool_put(dp_pool_t *pl, void *p);
void dp_pool_stats(dp_pool_t *pl, dp_pool_stats_t *out);

#endif
