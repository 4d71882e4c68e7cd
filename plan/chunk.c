/*
 * chunk.c - cutting a box into pieces of at most max bytes (plan.h,
 * internal.h): below plan.c, bcast.c and cost.c.
 */
#include "plan/internal.h"

/*
 * The outermost dim that must be cut for pieces of at most max bytes (-1
 * when the box fits), and the bytes of one index step along it (*slab).
 */
static int
chunk_dim(const plan_box_t *box, int ndim, uint64_t elem, uint64_t max,
	  uint64_t *slab)
{
	int d;

	*slab = elem;
	for (d = ndim - 1; d >= 0; d--) {
		if (*slab * (uint64_t)box->size[d] > max)
			break;
		*slab *= (uint64_t)box->size[d];
	}
	return d;
}

void
plan_box_chunk(const plan_box_t *box, int ndim, uint64_t elem, uint64_t max,
	       boxvec_t *out)
{
	int64_t count[PLAN_MAX_DIMS], idx[PLAN_MAX_DIMS] = {0};
	uint64_t slab;
	int d = chunk_dim(box, ndim, elem, max, &slab);

	if (d < 0) {
		VEC_PUSH(out, *box);
		return;
	}
	/* dims > d fit whole; dim d is cut into near-equal runs; dims < d are
	 * taken one index at a time */
	int64_t rows = (int64_t)(max / slab);
	int64_t pieces = (box->size[d] + rows - 1) / rows;
	int64_t n = box->size[d], base = n / pieces, extra = n % pieces;

	for (int i = 0; i < d; i++)
		count[i] = box->size[i];
	count[d] = pieces;
	for (;;) {
		plan_box_t c = *box;
		int i;

		for (i = 0; i < d; i++) {
			c.off[i] = box->off[i] + idx[i];
			c.size[i] = 1;
		}
		c.off[d] = box->off[d] + idx[d] * base + (idx[d] < extra ? idx[d] : extra);
		c.size[d] = base + (idx[d] < extra ? 1 : 0);
		VEC_PUSH(out, c);
		for (i = d; i >= 0 && ++idx[i] == count[i]; i--)
			idx[i] = 0;
		if (i < 0)
			break;
	}
}

uint64_t
plan_box_chunk_count(const plan_box_t *box, int ndim, uint64_t elem, uint64_t max)
{
	uint64_t slab, count = 1;
	int d = chunk_dim(box, ndim, elem, max, &slab);

	if (d < 0)
		return 1;
	for (int i = 0; i < d; i++)
		count *= (uint64_t)box->size[i];
	return count * (((uint64_t)box->size[d] + max / slab - 1) / (max / slab));
}
