/*
 * hostmem.h - host buffers standing for the memory of every (rank, tensor,
 * side, piece) in data-plane tests (the memory behind a dp_mem_ops_t).
 */
#ifndef REFIT_TESTS_HOSTMEM_H
#define REFIT_TESTS_HOSTMEM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/alloc.h"
#include "dataplane/view.h"

typedef struct th_buf {
	int32_t rank, piece;
	uint32_t tensor;
	bool dst;
	dp_view_t v;
} th_buf_t;

typedef VEC(th_buf_t) th_bufs_t;

/* The view of (rank, tensor, dst, piece) in b, or NULL when it has none. */
const dp_view_t *th_bufs_find(const th_bufs_t *b, int32_t rank, uint32_t tensor, bool dst,
			      int32_t piece);
/* A new zeroed, contiguous buffer of rank's piece of l, kept in b as
 * (rank, tensor, dst, piece); *out its view (valid until the next make). */
refit_status_t th_bufs_make(th_bufs_t *b, const plan_layout_t *l, int32_t rank,
			    uint32_t tensor, bool dst, int32_t piece, dp_view_t **out,
			    refit_err_t *err);
/* Free every buffer of b and b itself. */
void th_bufs_free(th_bufs_t *b);

#endif
