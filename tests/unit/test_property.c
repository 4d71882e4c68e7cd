/*
 * test_property.c - thousands of random layout pairs, each planned in both
 * modes and checked three ways: the validator, the cost model's lower
 * bound, and a dense element-by-element oracle written here from scratch
 * (holdings and arrivals as arrays of counters, no boxes at all).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/internal.h"
#include "tests/unit/gen.h"
#include "tests/unit/helpers.h"

#define MAXR GEN_MAXR
#define MAXE 512 /* elements per tensor in these tests */

/* Linear index of an element inside shape. */
static int
lin(const int64_t *idx, const int64_t *shape, int ndim)
{
	int64_t k = 0;

	for (int d = 0; d < ndim; d++)
		k = k * shape[d] + idx[d];
	return (int)k;
}

/* Mark every element of box b in row[] (shape-sized). */
static void
mark(uint8_t *row, const plan_box_t *b, const int64_t *shape, int ndim, int add)
{
	int64_t idx[PLAN_MAX_DIMS];
	int64_t n = plan_box_volume(b, ndim);

	for (int64_t k = 0; k < n; k++) {
		int64_t rem = k;

		for (int d = ndim - 1; d >= 0; d--) {
			idx[d] = b->off[d] + rem % b->size[d];
			rem /= b->size[d];
		}
		row[lin(idx, shape, ndim)] += (uint8_t)add;
	}
}

typedef struct dense {
	uint8_t hold[MAXR][MAXE], need[MAXR][MAXE], got[MAXR][MAXE];
	int32_t got_stage[MAXR][MAXE];
} dense_t;

/* Replay plan p for tensor t element by element; returns network bytes
 * the layouts force (sum over domains of needed-not-held elements). */
static uint64_t
dense_check(const plan_t *p, uint32_t t, const plan_layout_t *src,
	    const plan_layout_t *dst, const plan_topo_t *topo, int nranks,
	    bool reshard, dense_t *D)
{
	int ndim = dst->ndim, numel = (int)plan_layout_numel(dst);
	uint64_t forced = 0;

	memset(D, 0, sizeof(*D));
	for (size_t i = 0; i < src->nshards; i++)
		mark(D->hold[src->shards[i].rank], &src->shards[i].box, src->shape, ndim, 1);
	for (size_t i = 0; i < dst->nshards; i++)
		mark(D->need[dst->shards[i].rank], &dst->shards[i].box, dst->shape, ndim, 1);
	for (size_t i = 0; i < p->nxfers;) {
		size_t j = i;

		/* sends of a stage use what was held before it */
		for (; j < p->nxfers && p->xfers[j].stage == p->xfers[i].stage; j++) {
			const plan_xfer_t *x = &p->xfers[j];
			uint8_t tmp[MAXE] = {0};

			if (x->tensor != t)
				continue;
			mark(tmp, plan_xfer_box(p, x), dst->shape, ndim, 1);
			/* plain tests per element, an assertion at a fault only:
			 * ck_assert marks a point through a pipe on every call */
			for (int e = 0; e < numel; e++)
				if (tmp[e] && !D->hold[x->from][e] &&
				    !(D->got[x->from][e] &&
				      D->got_stage[x->from][e] < (int32_t)x->stage))
					ck_abort_msg("rank %d sends element %d it lacks", x->from, e);
		}
		for (size_t k = i; k < j; k++) {
			const plan_xfer_t *x = &p->xfers[k];
			uint8_t tmp[MAXE] = {0};

			if (x->tensor != t)
				continue;
			mark(tmp, plan_xfer_box(p, x), dst->shape, ndim, 1);
			for (int e = 0; e < numel; e++) {
				if (!tmp[e])
					continue;
				D->got[x->to][e]++;
				D->got_stage[x->to][e] = (int32_t)x->stage;
			}
		}
		i = j;
	}
	for (int r = 0; r < nranks; r++)
		for (int e = 0; e < numel; e++) {
			if (D->need[r][e] && D->got[r][e] != 1)
				ck_abort_msg("rank %d element %d arrived %d times", r, e,
					     D->got[r][e]);
			else if (!D->need[r][e] && reshard && D->got[r][e] > 1)
				/* relayed through its NIC at most once */
				ck_abort_msg("rank %d element %d relayed %d times", r, e,
					     D->got[r][e]);
		}
	for (int dom = 0; dom < topo->ndomains; dom++)
		for (int e = 0; e < numel; e++) {
			bool needed = false, held = false;

			for (int r = 0; r < nranks; r++) {
				if (plan_topo_domain(topo, r) != dom)
					continue;
				needed |= D->need[r][e] != 0;
				held |= D->hold[r][e] != 0;
			}
			if (needed && !held)
				forced += plan_dtype_size(dst->dtype);
		}
	return forced;
}

static void
one_case(unsigned *s, dense_t *D)
{
	plan_layout_set_t src, dst;
	plan_topo_t topo;
	plan_opts_t o;
	int nranks;

	gen_case(s, &src, &dst, &topo, &nranks);
	plan_opts_default(&o);
	o.chunk_bytes = (uint64_t)64 << gen_rnd(s, 5);
	o.staging_bytes = o.chunk_bytes << gen_rnd(s, 4);
	for (int mode = 0; mode < 2; mode++) {
		plan_t p;
		plan_cost_t c;
		plan_check_t chk;
		refit_err_t e;
		uint64_t forced = 0;

		o.mode = mode ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
		refit_err_clear(&e);
		ck_assert_msg(plan_build(&src, &dst, &topo, &o, &p, &e) == REFIT_OK, "%s", e.msg);
		ck_assert_msg(plan_validate(&p, &src, &dst, &chk, &e) == REFIT_OK, "%s: %s",
			      plan_mode_name(o.mode), e.msg);
		ck_assert_int_eq(plan_cost(&p, &src, &dst, &topo, &c, &e), REFIT_OK);
		ck_assert_uint_eq(chk.delivered_bytes, chk.needed_bytes);
		ck_assert_uint_eq(chk.needed_bytes, c.payload_bytes);
		ck_assert_uint_le(chk.max_staging, o.staging_bytes);
		for (uint32_t t = 0; t < p.ntensors; t++)
			forced += dense_check(&p, t, &src.v[t], &dst.v[t], &topo, nranks,
					      mode == 0, D);
		ck_assert_uint_eq(c.lb_network_bytes, forced);
		if (mode == 0) {
			/* reshard: minimum network bytes; relays (parts taken in or
			 * sent out by a rank that does not need them) within staging */
			ck_assert_uint_eq(c.bytes[PLAN_LINK_NETWORK], forced);
			ck_assert(c.time_s >= c.lb_time_s * 0.999);
		} else {
			ck_assert_uint_ge(c.bytes[PLAN_LINK_NETWORK], forced);
		}
		if (gen_rnd(s, 8) == 0) {
			plan_t q;

			ck_assert_int_eq(plan_build(&src, &dst, &topo, &o, &q, NULL), REFIT_OK);
			ck_assert_str_eq(p.digest_hex, q.digest_hex);
			plan_fini(&q);
		}
		plan_fini(&p);
	}
	plan_layout_set_fini(&src);
	plan_layout_set_fini(&dst);
	plan_topo_fini(&topo);
}

START_TEST(random_pairs)
{
	unsigned seed = 0x5eed0000u + (unsigned)_i;
	dense_t *D = xmalloc(sizeof(*D));

	for (int k = 0; k < 500; k++)
		one_case(&seed, D);
	free(D);
}
END_TEST

Suite *
suite_property(void)
{
	TCase *tc = th_tcase("random", 300, NULL, 0);

	/* 4 x 500 = 2000 random layout pairs, each in both modes */
	tcase_add_loop_test(tc, random_pairs, 0, 4);
	return th_suite("property", tc, NULL);
}
