/*
 * gdelta_base.h - a node's delta bases on its devices, for the nccl slices
 * (issue 26 item 3, docs/delta.md "nccl"): per (model, plan digest, peer
 * node, direction, message position in that peer's list) the bytes of the
 * message this node last sent to or received from that peer, on the rank
 * that sent or received it, tagged with the refit that carried them.  The
 * codec's kernels read a base at device speed (dataplane/delta_gpu.h).
 *
 * A base is an allocation of its rank's staging arena (dev->alloc), which
 * lives for an epoch: a slice of another epoch than the store's first
 * gives every base back (gdelta_begin; nccl_dev_free ignores what is not
 * in the current arena) and the next refit of every message is dense.
 * That is the fallback for an epoch's change, as the coordinator forgets
 * its bases then too.  Another plan of a model drops that model's bases.
 *
 * Bases have their own share of each rank's budget (limit bytes per rank,
 * checked before the arena is asked): a base without room is not kept, so
 * the next refit sends that message dense and the slice reports its bases
 * incomplete; it never fails the refit.  Before that, the least recently
 * used bases of other models on the rank are given back to make room
 * (the running slice's model is never evicted): a model that lost
 * received bases is noted until the node reports it (see delta_base.h).
 *
 * Threads: only a slice holding the node's nccl session calls these (one
 * at a time); the lock guards the figures read by /metrics.
 */
#ifndef REFIT_DAEMON_NODE_GDELTA_BASE_H
#define REFIT_DAEMON_NODE_GDELTA_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/exec.h"

typedef struct gdelta_store gdelta_store_t;

/* One message's base: bytes of device memory on rank, the refit's tag. */
typedef struct gdelta_ent {
	char *model, *digest, *peer;
	bool out;
	size_t pos;
	int32_t rank;
	uint64_t bytes;
	uint8_t *data;
	uint64_t tag;             /* 0: allocated, its bytes not a base yet */
	uint64_t used_at;         /* the store's clock when last found or got */
} gdelta_ent_t;

/* limit: bytes of bases per rank at most (their share of the budget). */
gdelta_store_t *gdelta_store_new(uint64_t limit);
/* The node's end: the arenas go with the transport, nothing is freed on
 * the devices. */
void gdelta_store_free(gdelta_store_t *st);
uint64_t gdelta_store_used(gdelta_store_t *st);
uint64_t gdelta_store_limit(gdelta_store_t *st);
size_t gdelta_store_count(gdelta_store_t *st);

/*
 * A slice of model under plan digest starts on dev in epoch, before it
 * allocates anything: bases of another epoch (every model's) and the
 * model's bases of another digest are given back to dev and forgotten.
 */
void gdelta_begin(gdelta_store_t *st, const dp_dev_ops_t *dev, uint64_t epoch,
		  const char *model, const char *digest);

/*
 * A nccl slice failed: every base is given back to dev and forgotten (dev
 * NULL: forgotten only -- the session never opened, its memory unknown).
 * A failed group drops the communicators with their arenas, and the next
 * session of the same epoch makes new ones: no base may outlive its arena.
 */
void gdelta_drop_all(gdelta_store_t *st, const dp_dev_ops_t *dev);

/* The base of (model, digest, peer, out, pos) on rank with bytes, when
 * one is held tagged tag (tag 0: whatever its tag); NULL otherwise. */
gdelta_ent_t *gdelta_find(gdelta_store_t *st, const char *model, const char *digest,
			  const char *peer, bool out, size_t pos, int32_t rank, uint64_t bytes,
			  uint64_t tag);

/*
 * The entry to keep the message's next base in: the one held (another
 * rank or size: given back and made again), else a new allocation of
 * bytes on rank when the rank's share has room.  NULL: no room (the
 * message's old base, if any, is given back: it is no longer the base the
 * peer holds after this refit).
 */
gdelta_ent_t *gdelta_get(gdelta_store_t *st, const dp_dev_ops_t *dev, const char *model,
			 const char *digest, const char *peer, bool out, size_t pos, int32_t rank,
			 uint64_t bytes);

/* Give an entry back (a failed refit's half-written base). */
void gdelta_drop(gdelta_store_t *st, const dp_dev_ops_t *dev, gdelta_ent_t *e);

/* Bases evicted since the store was made. */
uint64_t gdelta_store_evictions(gdelta_store_t *st);
/* The models that lost received bases since the last call (as
 * delta_store_take_evicted). */
char **gdelta_store_take_evicted(gdelta_store_t *st, size_t *n);
/* The entry to evict first among ents for a base of model on rank: the
 * least recently used of another model on that rank; SIZE_MAX if none. */
size_t gdelta_lru_victim(const gdelta_ent_t *const *ents, size_t n, const char *model,
			 int32_t rank);

#endif
