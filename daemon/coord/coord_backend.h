/*
 * coord_backend.h - where the coordinator's durable state lives: a state
 * store backend is a struct of functions (one file per backend, one
 * instance each, chosen by name by the state_store config key):
 *
 *   "file" (coord_backend_file.c): the state file, written atomically on
 *          every change; the default, one coordinator.
 *   "etcd" (coord_backend_etcd.c): under etcd_prefix, the document cut
 *          into content-defined chunks (PREFIX/chunks/SHA256, immutable,
 *          each well under etcd's request limit) named by a manifest
 *          (PREFIX/state, the commit point); only the chunks a change made
 *          are written, every write a Txn guarded by the leader's election
 *          key (coord_leader.c): a deposed leader's write fails and it
 *          steps down.  docs/ha.md.
 *
 * The state is one JSON document (coord_state.c makes and reads it); a
 * backend only stores and returns its bytes, whole.  Loop thread only.
 */
#ifndef REFIT_DAEMON_COORD_COORD_BACKEND_H
#define REFIT_DAEMON_COORD_COORD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct coord_backend {
	const char *name;
	/* The stored state in *text (heap, the caller frees), *len bytes;
	 * REFIT_ERR_NOT_FOUND: nothing stored yet. */
	refit_status_t (*load)(void *impl, char **text, size_t *len, refit_err_t *err);
	/* Store text durably before returning REFIT_OK; anything else: not
	 * stored (REFIT_ERR_UNAVAILABLE: the store cannot be reached). */
	refit_status_t (*save)(void *impl, const char *text, size_t len, refit_err_t *err);
	/* What it is, for messages: "state file /var/lib/refit/state". */
	const char *(*where)(void *impl);
	void (*free)(void *impl);
} coord_backend_t;

extern const coord_backend_t coord_backend_file;
extern const coord_backend_t coord_backend_etcd;

/* The file backend's state (for coord_backend_file.load and the others). */
void *coord_backend_file_new(const char *path);

/* The etcd backend's: the state under prefix + "/state" (the manifest) and
 * prefix + "/chunks/" through e (owned), chunks of at most chunk_max bytes
 * (0: COORD_CHUNK_MAX_DEFAULT); every save is refused until
 * coord_backend_etcd_fence names the guard. */
struct etcd;
void *coord_backend_etcd_new(struct etcd *e, const char *prefix, size_t chunk_max);
/* Guard every later save by key's create revision being rev (this
 * coordinator's election key): called when it becomes the leader. */
void coord_backend_etcd_fence(void *impl, const char *key, int64_t rev);

#endif
