/*
 * gen.c - random layouts, topologies and layout pairs for property tests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/internal.h"
#include "tests/unit/gen.h"
#include "tests/unit/helpers.h"

int
gen_rnd(unsigned *s, int n)
{
	return n > 0 ? rand_r(s) % n : 0;
}

static void
gen_topo(unsigned *s, int nranks, plan_topo_t *t)
{
	static const int sizes[] = {1, 2, 3, 4, 8};
	int ds = sizes[gen_rnd(s, 5)], split = gen_rnd(s, 3) == 0 && ds % 2 == 0;

	plan_topo_init(t);
	for (int r = 0; r < nranks; r++) {
		char node[16], dom[16];

		snprintf(dom, sizeof(dom), "d%d", r / ds);
		snprintf(node, sizeof(node), "n%d", split ? r / (ds / 2) : r / ds);
		ck_assert_int_eq(plan_topo_add_rank(t, r, node, dom, NULL), REFIT_OK);
	}
}

/* Random distinct ranks, in random order. */
static void
pick_ranks(unsigned *s, int nranks, int n, int32_t *out)
{
	int32_t pool[GEN_MAXR];

	for (int i = 0; i < nranks; i++)
		pool[i] = i;
	for (int i = 0; i < n; i++) {
		int j = i + gen_rnd(s, nranks - i);
		int32_t t = pool[i];

		pool[i] = pool[j];
		pool[j] = t;
		out[i] = pool[i];
	}
}

static void
gen_dtensor(unsigned *s, const char *name, plan_dtype_t dt, int ndim,
	    const int64_t *shape, int nranks, plan_layout_t *l)
{
	int64_t msh[3];
	int mdim, total;
	plan_placement_t pl[3];
	int32_t mesh[GEN_MAXR];

	do {
		mdim = 1 + gen_rnd(s, 3);
		total = 1;
		for (int i = 0; i < mdim; i++) {
			msh[i] = 1 + gen_rnd(s, 3);
			total *= (int)msh[i];
		}
	} while (total > nranks);
	for (int i = 0; i < mdim; i++) {
		int k = ndim == 0 ? 0 : gen_rnd(s, 5);

		pl[i].kind = k == 0 ? PLAN_PL_REPLICATE :
			     k == 4 ? PLAN_PL_STRIDED_SHARD : PLAN_PL_SHARD;
		pl[i].dim = ndim ? gen_rnd(s, ndim) - (gen_rnd(s, 2) ? ndim : 0) : 0;
		pl[i].split_factor = 1 + gen_rnd(s, 3);
	}
	pick_ranks(s, nranks, total, mesh);
	ck_assert_int_eq(plan_layout_init_dtensor(l, name, dt, ndim, shape, mdim, msh,
						  mesh, pl, NULL), REFIT_OK);
}

/* Cut b into random boxes (depth-limited); keep each with prob keep/4. */
static void
cut(unsigned *s, const plan_box_t *b, int ndim, int depth, boxvec_t *out)
{
	int d = ndim ? gen_rnd(s, ndim) : 0;

	if (depth == 0 || ndim == 0 || b->size[d] < 2 || gen_rnd(s, 4) == 0) {
		VEC_PUSH(out, *b);
		return;
	}
	plan_box_t lo = *b, hi = *b;
	int64_t at = 1 + gen_rnd(s, (int)b->size[d] - 1);

	lo.size[d] = at;
	hi.off[d] += at;
	hi.size[d] -= at;
	cut(s, &lo, ndim, depth - 1, out);
	cut(s, &hi, ndim, depth - 1, out);
}

static void
gen_explicit(unsigned *s, const char *name, plan_dtype_t dt, int ndim,
	     const int64_t *shape, int nranks, bool cover, plan_layout_t *l)
{
	boxvec_t boxes = {0};
	VEC(plan_shard_t) sh = {0};
	plan_box_t full;

	plan_box_full(&full, shape, ndim);
	cut(s, &full, ndim, 4, &boxes);
	for (size_t i = 0; i < boxes.n; i++) {
		int copies = 1 + (gen_rnd(s, 3) == 0);

		if (!cover && gen_rnd(s, 5) == 0)
			continue;
		for (int c = 0; c < copies; c++) {
			plan_shard_t x;

			memset(&x, 0, sizeof(x));
			x.rank = gen_rnd(s, nranks);
			x.box = boxes.v[i];
			VEC_PUSH(&sh, x);
		}
	}
	ck_assert_int_eq(plan_layout_init_explicit(l, name, dt, ndim, shape, sh.v, sh.n,
						   NULL), REFIT_OK);
	VEC_FREE(&boxes);
	VEC_FREE(&sh);
}


void
gen_case(unsigned *s, plan_layout_set_t *src, plan_layout_set_t *dst, plan_topo_t *topo,
	 int *nranks_out)
{
	static const plan_dtype_t dts[] = {PLAN_DT_BF16, PLAN_DT_FP32, PLAN_DT_INT8,
					   PLAN_DT_FP64};
	int nranks = 2 + gen_rnd(s, GEN_MAXR - 1), nt = 1 + gen_rnd(s, 3);

	gen_topo(s, nranks, topo);
	plan_layout_set_init(src);
	plan_layout_set_init(dst);
	for (int t = 0; t < nt; t++) {
		int ndim = gen_rnd(s, 5) == 0 ? 0 : 1 + gen_rnd(s, 3);
		int64_t shape[3];
		plan_dtype_t dt = dts[gen_rnd(s, 4)];
		plan_layout_t a, b;
		char name[16];

		for (int d = 0; d < ndim; d++)
			shape[d] = gen_rnd(s, 8);
		snprintf(name, sizeof(name), "t%d", t);
		if (gen_rnd(s, 3))
			gen_dtensor(s, name, dt, ndim, shape, nranks, &a);
		else
			gen_explicit(s, name, dt, ndim, shape, nranks, true, &a);
		if (gen_rnd(s, 3))
			gen_dtensor(s, name, dt, ndim, shape, nranks, &b);
		else
			gen_explicit(s, name, dt, ndim, shape, nranks, false, &b);
		plan_layout_set_add(src, &a);
		plan_layout_set_add(dst, &b);
	}
	*nranks_out = nranks;
}
