/*
 * delta_base.h - a node's delta bases (issue 26, docs/delta.md): per
 * (model, plan digest, peer node, direction) the bytes of every tcp
 * message this node last sent to or received from that peer, each part
 * tagged with the refit (id and attempt) that carried it.  A sender
 * encodes a message against what it last sent; the receiver decodes it
 * against what it last received: both hold the same bytes when both
 * carry the tag the coordinator names as the base (RunSliceRequest.
 * delta_base), whatever the receiver's install mode, conversion or relay
 * staging.  The store is bounded by delta_base_bytes: a message without
 * room keeps no base (it goes dense, and the node reports its bases
 * incomplete, so the coordinator offers no base for it next time).
 *
 * Eviction: a base without room first takes the room of the least
 * recently used tables of other models that no slice holds (whole
 * tables, oldest first: an idle or gone model yields, the active one
 * keeps delta).  A model that lost received bases is noted until the node
 * reports it (delta_store_take_evicted): its senders' coordinator then
 * drops this node from the model's delta nodes, and that model's next
 * refit with this node is dense.  Sent bases need no report: a sender
 * without its base sends dense.
 *
 * Threads: slices run on libuv's pool; every function takes the store's
 * lock.  A table is held by one slice at a time: another slice asking for
 * it waits up to DELTA_TAB_WAIT_MS (an aborted slice of the refit before, still ending),
 * then gets none and runs dense.
 */
#ifndef REFIT_DAEMON_NODE_DELTA_BASE_H
#define REFIT_DAEMON_NODE_DELTA_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct delta_store delta_store_t;

/* One message's base: its bytes (the plan's message size, padding zero)
 * and the tag of each part (0: none held). */
typedef struct delta_ent {
	uint8_t *data;
	uint64_t bytes;
	uint64_t *tags;
	uint32_t nparts;
} delta_ent_t;

/* The bases of one (model, digest, peer, direction): entries by the
 * message's position in that peer's list. */
typedef struct delta_tab {
	char *model, *digest, *peer;
	bool out;
	bool busy;            /* held by a slice */
	uint64_t used_at;     /* the store's clock when last taken */
	delta_ent_t *ent;
	size_t nent;
} delta_tab_t;

/* limit: bytes of bases at most; wait_ms: how long a slice waits for a
 * table another slice holds (DELTA_TAB_WAIT_MS for a node). */
#define DELTA_TAB_WAIT_MS 2000
delta_store_t *delta_store_new(uint64_t limit, uint32_t wait_ms);
void delta_store_free(delta_store_t *st);
uint64_t delta_store_used(delta_store_t *st);
uint64_t delta_store_limit(delta_store_t *st);

/*
 * The table of (model, digest, peer, out) with nent messages, held until
 * delta_tab_release; tables of the model under another digest are dropped
 * (a new plan).  NULL when another slice holds it past the store's wait.
 */
delta_tab_t *delta_tab_take(delta_store_t *st, const char *model, const char *digest,
			    const char *peer, bool out, size_t nent);
void delta_tab_release(delta_store_t *st, delta_tab_t *t);

/*
 * Entry pos of t, made with bytes and nparts when missing and the store
 * has room (zeroed, no tags); NULL without room.
 */
delta_ent_t *delta_ent_get(delta_store_t *st, delta_tab_t *t, size_t pos, uint64_t bytes,
			   uint32_t nparts);
/* Entry pos if it holds one (no allocation). */
delta_ent_t *delta_ent_find(delta_tab_t *t, size_t pos, uint64_t bytes, uint32_t nparts);

/* Tables evicted since the store was made. */
uint64_t delta_store_evictions(delta_store_t *st);
/* The models that lost received bases since the last call (n of them;
 * the caller frees each and the vector), now forgotten by the store. */
char **delta_store_take_evicted(delta_store_t *st, size_t *n);
/* The table to evict first among tabs for a base of model: the least
 * recently used of another model, held by no slice, holding a base;
 * SIZE_MAX when none (pure: the LRU order, for the unit tests). */
size_t delta_lru_victim(const delta_tab_t *const *tabs, size_t n, const char *model);

#endif
