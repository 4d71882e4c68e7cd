/*
 * hostmem.c - see hostmem.h.
 */
#include <stdlib.h>

#include "common/err.h"
#include "tests/unit/hostmem.h"

const dp_view_t *
th_bufs_find(const th_bufs_t *b, int32_t rank, uint32_t tensor, bool dst, int32_t piece)
{
	for (size_t i = 0; i < b->n; i++) {
		const th_buf_t *x = &b->v[i];

		if (x->rank == rank && x->tensor == tensor && x->dst == dst && x->piece == piece)
			return &x->v;
	}
	return NULL;
}

refit_status_t
th_bufs_make(th_bufs_t *b, const plan_layout_t *l, int32_t rank, uint32_t tensor, bool dst,
	     int32_t piece, dp_view_t **out, refit_err_t *err)
{
	th_buf_t x = {rank, piece, tensor, dst, {0}};
	uint32_t e = (uint32_t)plan_dtype_size(l->dtype);
	int64_t shape[PLAN_MAX_DIMS];

	CHECK(dp_local_shape(l, rank, piece, shape, err));
	dp_view_contiguous(&x.v, xcalloc(1, dp_view_bytes(l->ndim, shape, e) + 1), l->ndim,
			   shape, e);
	VEC_PUSH(b, x);
	*out = &b->v[b->n - 1].v;
	return REFIT_OK;
}

void
th_bufs_free(th_bufs_t *b)
{
	for (size_t i = 0; i < b->n; i++)
		free(b->v[i].v.base);
	VEC_FREE(b);
}
