/*
 * coord_chunks.h - the coordinator's state document cut into content-defined
 * chunks, and the manifest that names them (the etcd backend's format,
 * coord_backend_etcd.c; docs/ha.md).  Pure: no etcd, no I/O.
 *
 * Cutting: a gear hash rolls over the bytes; a chunk ends where its low bits
 * are zero (after min bytes) or at max bytes.  Boundaries depend only on the
 * bytes near them, so an edit in one place changes only the chunk(s) around
 * it.  Sizes from max: min = max / 16, average about max / 4.
 *
 * The manifest (text, never starting with '{', which marks a plain document):
 *
 *   refit-state-chunks 1
 *   length BYTES
 *   sha256 HEX-OF-THE-WHOLE
 *   chunk HEX LEN          (one line per chunk, in order)
 */
#ifndef REFIT_DAEMON_COORD_COORD_CHUNKS_H
#define REFIT_DAEMON_COORD_COORD_CHUNKS_H

#include <stddef.h>

#include "common/err.h"
#include "common/sha256.h"

#define COORD_CHUNK_MAX_DEFAULT (256 * 1024)
#define COORD_CHUNK_MAX_MIN 1024 /* the smallest max accepted */
#define COORD_MANIFEST_TAG "refit-state-chunks 1"

/* The end offsets of the chunks of data[0..len) (*ends: heap, the caller
 * frees; ascending, the last is len); returns how many (0 for len 0). */
size_t coord_chunks_cut(const char *data, size_t len, size_t max, size_t **ends);

typedef struct coord_chunk_ref {
	char hex[SHA256_HEX_LEN];
	size_t len;
} coord_chunk_ref_t;

typedef struct coord_manifest {
	size_t length;
	char hex[SHA256_HEX_LEN];  /* of the whole document */
	coord_chunk_ref_t *chunks; /* heap */
	size_t n;
} coord_manifest_t;

/* Cut text and describe it (chunks' digests and the whole's). */
void coord_manifest_make(const char *text, size_t len, size_t max, coord_manifest_t *m);
/* The manifest's text (heap, NUL-terminated; *len its length). */
char *coord_manifest_text(const coord_manifest_t *m, size_t *len);
/* Parse a manifest; REFIT_ERR_INVALID_ARG naming what is wrong (where: the
 * key, for the message). */
refit_status_t coord_manifest_parse(const char *text, size_t len, const char *where,
				    coord_manifest_t *m, refit_err_t *err);
/* Check the assembled document against the manifest: its length and digest. */
refit_status_t coord_manifest_verify(const coord_manifest_t *m, const char *doc, size_t len,
				     const char *where, refit_err_t *err);
void coord_manifest_fini(coord_manifest_t *m);

#endif
