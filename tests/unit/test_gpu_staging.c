/*
 * test_gpu_staging.c - the whole-slice GPU staging estimate (plan/gpu_staging.h)
 * against what a slice really takes from its ranks' arenas: slices run in
 * the grouped form over a fake device of host memory whose allocations come
 * from one daemon/transport/gpu_arena.c arena per rank (the nccl transport's
 * bookkeeping), the budget the arena's size; the fake's open refuses a
 * slice whose estimate (xport_session_cfg_t.staging_need) passes the budget,
 * as nccl_open does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "daemon/node/slice.h"
#include "daemon/transport/gpu_arena.h"
#include "dataplane/view.h"
#include "plan/gpu_staging.h"
#include "tests/unit/gen.h"
#include "tests/unit/helpers.h"
#include "tests/unit/hostmem.h"

struct xport {
	uint64_t budget;
	gpu_arena_t a[GEN_MAXR];
	uint8_t *base[GEN_MAXR];
	uint64_t need, peak;       /* the slice's estimate (at open); the arenas' peak */
	int32_t need_rank;
	bool failed;               /* an allocation did not fit */
	refit_err_t err;
	dp_dev_ops_t dev;
};

struct xport_session {
	xport_t *x;
};

static void *
alloc_at(xport_t *x, int32_t rank, uint64_t bytes, bool top)
{
	uint64_t off;

	ck_assert(rank >= 0 && rank < GEN_MAXR);
	if (x->base[rank] == NULL) {
		gpu_arena_init(&x->a[rank], x->budget);
		x->base[rank] = xmalloc(x->budget);
	}
	if (!(top ? gpu_arena_get_top : gpu_arena_get)(&x->a[rank], bytes, &off)) {
		if (!x->failed)
			refit_err_set(&x->err, REFIT_ERR_NOMEM, "rank %d: %llu more bytes do not "
				      "fit (%llu in use)", rank, (unsigned long long)bytes,
				      (unsigned long long)x->a[rank].in_use);
		x->failed = true;
		return NULL;
	}
	if (x->a[rank].peak > x->peak)
		x->peak = x->a[rank].peak;
	return x->base[rank] + off;
}

static void *
fd_alloc(void *ctx, int32_t rank, uint64_t bytes)
{
	return alloc_at(ctx, rank, bytes, false);
}

static void *
fd_alloc_top(void *ctx, int32_t rank, uint64_t bytes)
{
	return alloc_at(ctx, rank, bytes, true);
}

static void
fd_free(void *ctx, int32_t rank, void *p)
{
	xport_t *x = ctx;

	if (p != NULL)
		ck_assert(gpu_arena_put(&x->a[rank], (uint64_t)((uint8_t *)p - x->base[rank])));
}

static void
fd_copy_box(void *ctx, int32_t rank, const dp_view_t *sv, const plan_shard_t *ss,
	    const dp_view_t *dv, const plan_shard_t *ds, const plan_box_t *box)
{
	(void)ctx;
	(void)rank;
	dp_copy_box(sv, ss, dv, ds, box);
}

static void
fd_copy(void *ctx, int32_t rank, void *dst, const void *src, uint64_t n)
{
	(void)ctx;
	(void)rank;
	memmove(dst, src, n);
}

static refit_status_t
fd_sync(void *ctx, refit_err_t *err)
{
	xport_t *x = ctx;

	if (x->failed) {
		*err = x->err;
		return x->err.status;
	}
	return REFIT_OK;
}

static refit_status_t
fk_open(xport_t *x, const xport_session_cfg_t *cfg, xport_session_t **out, refit_err_t *err)
{
	x->need = cfg->staging_need;
	x->need_rank = cfg->staging_rank;
	if (cfg->staging_need > x->budget)
		return refit_err_set(err, REFIT_ERR_LIMIT, "rank %d needs %llu bytes, budget %llu",
				     cfg->staging_rank, (unsigned long long)cfg->staging_need,
				     (unsigned long long)x->budget);
	*out = xcalloc(1, sizeof(**out));
	(*out)->x = x;
	return REFIT_OK;
}

static const dp_dev_ops_t *
fk_dev(xport_session_t *s)
{
	return &s->x->dev;
}

/* Every group: each send's bytes into its receive (both ends are here). */
static refit_status_t
fk_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err)
{
	for (;;) {
		const xport_op_t *ops;
		size_t n;
		bool end, *used;

		CHECK(io->next_group(io->arg, &ops, &n, &end, err));
		if (end)
			return REFIT_OK;
		CHECK(fd_sync(s->x, err));
		used = xcalloc(n + 1, sizeof(*used));
		for (size_t i = 0; i < n; i++) {
			size_t j;

			if (!ops[i].send)
				continue;
			for (j = 0; j < n; j++)   /* the first receive of this pair not used */
				if (!ops[j].send && !used[j] && ops[j].rank == ops[i].peer &&
				    ops[j].peer == ops[i].rank)
					break;
			ck_assert_uint_lt(j, n);
			ck_assert_uint_eq(ops[j].bytes, ops[i].bytes);
			memcpy(ops[j].buf, ops[i].buf, ops[i].bytes);
			used[j] = true;
		}
		free(used);
		CHECK(io->group_done(io->arg, err));
	}
}

static void
fk_close(xport_session_t *s)
{
	free(s);
}

static const xport_ops_t fake = {
	.name = "fake-gpu", .memory = XPORT_MEM_DEVICE, .open = fk_open, .dev = fk_dev,
	.exchange = fk_exchange, .close = fk_close,
};

typedef struct mem {
	const plan_layout_set_t *src, *dst;
	size_t *map;
	th_bufs_t bufs;
} mem_t;

static refit_status_t
mem_view(void *ctx, int32_t rank, uint32_t t, bool dst, int32_t piece, dp_view_t *out,
	 refit_err_t *err)
{
	mem_t *m = ctx;
	const plan_layout_t *l = dst ? &m->dst->v[t] : &m->src->v[m->map[t]];
	const dp_view_t *had = th_bufs_find(&m->bufs, rank, t, dst, piece);
	dp_view_t *v;

	if (had == NULL) {
		CHECK(th_bufs_make(&m->bufs, l, rank, t, dst, piece, &v, err));
		had = v;
	}
	*out = *had;
	return REFIT_OK;
}

/* Run p's slice with every rank on one node over arenas of budget bytes:
 * its status, *x the fake's figures. */
static refit_status_t
run(const plan_t *p, const plan_layout_set_t *src, const plan_layout_set_t *dst, int nranks,
    bool verify, uint64_t budget, xport_t *x, refit_err_t *e)
{
	int32_t ranks[GEN_MAXR];
	slice_node_t node = {"n0", "-", ranks, (size_t)nranks};
	mem_t mm = {src, dst, NULL, {0}};
	dp_mem_ops_t ops = {mem_view, &mm, NULL};
	atomic_int no_abort = 0;
	slice_cfg_t c = {
		.plan = p, .src = src, .dst = dst, .mem = &ops, .verify = verify, .corrupt = -1,
		.nodes = &node, .nnodes = 1, .self = 0, .xo = &fake, .x = x, .refit_id = 1,
		.epoch = 1, .deadline_ms = INT64_MAX, .abort = &no_abort,
	};
	slice_stats_t st;
	refit_status_t rc;

	for (int r = 0; r < nranks; r++)
		ranks[r] = r;
	memset(x, 0, sizeof(*x));
	x->budget = budget;
	x->dev = (dp_dev_ops_t){.copy_box = fd_copy_box, .alloc = fd_alloc, .free = fd_free,
				.copy = fd_copy, .to_host = fd_copy, .from_host = fd_copy,
				.sync = fd_sync, .ctx = x, .alloc_top = fd_alloc_top};
	ck_assert_int_eq(plan_match(src, dst, &mm.map, NULL), REFIT_OK);
	refit_err_clear(e);
	rc = slice_run(&c, &st, e);
	for (int r = 0; r < GEN_MAXR; r++) {
		if (x->base[r] != NULL)   /* everything given back */
			ck_assert_uint_eq(x->a[r].in_use, 0);
		gpu_arena_fini(&x->a[r]);
		free(x->base[r]);
	}
	th_bufs_free(&mm.bufs);
	free(mm.map);
	return rc;
}

/* A random plan with small chunks and staging (relays over several rounds). */
static bool
gen_plan(unsigned *seed, plan_layout_set_t *src, plan_layout_set_t *dst, plan_t *p,
	 int *nranks, bool *verify)
{
	plan_topo_t topo;
	plan_opts_t o;
	refit_err_t e;
	bool ok;

	gen_case(seed, src, dst, &topo, nranks);
	plan_opts_default(&o);
	o.mode = gen_rnd(seed, 4) == 0 ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
	o.chunk_bytes = (uint64_t)64 << gen_rnd(seed, 4);
	o.staging_bytes = o.chunk_bytes << gen_rnd(seed, 3);
	*verify = gen_rnd(seed, 2);
	refit_err_clear(&e);
	ok = plan_build(src, dst, &topo, &o, p, &e) == REFIT_OK;
	ck_assert_msg(ok, "%s", e.msg);
	plan_topo_fini(&topo);
	return ok;
}

/* The group buffers' peak alone (the estimate before relays were counted). */
static uint64_t
groups_only(const plan_t *p, int nranks, bool verify)
{
	int32_t ranks[GEN_MAXR];
	plan_gpu_staging_t gs;

	for (int r = 0; r < nranks; r++)
		ranks[r] = r;
	plan_gpu_staging_ranks(p, verify ? 4 : 0, NULL, ranks, (size_t)nranks, &gs);
	return gs.peak;
}

/*
 * Property: for random plans, the estimate the slice gives its transport
 * at open is at least the most any rank's arena held, and a budget of
 * exactly the estimate runs the slice (first fit, relays and group
 * buffers interleaved: no allocation fails).  Some plans must relay (else
 * the property says nothing about relays).
 */
START_TEST(estimate_covers_arena_peak)
{
	unsigned seed = 0x57a60000u + (unsigned)_i;
	int relaying = 0;

	for (int iter = 0; iter < 40; iter++) {
		plan_layout_set_t src, dst;
		plan_t p;
		int nranks;
		bool verify;
		xport_t x;
		refit_err_t e;
		uint64_t need;

		gen_plan(&seed, &src, &dst, &p, &nranks, &verify);
		ck_assert_msg(run(&p, &src, &dst, nranks, verify, 64u << 20, &x, &e) == REFIT_OK,
			      "plan %d: %s", iter, e.msg);
		ck_assert_msg(x.peak <= x.need, "plan %d: an arena held %llu bytes, the estimate "
			      "said %llu", iter, (unsigned long long)x.peak,
			      (unsigned long long)x.need);
		relaying += x.peak > groups_only(&p, nranks, verify);
		need = x.need;
		ck_assert_msg(run(&p, &src, &dst, nranks, verify, need, &x, &e) == REFIT_OK,
			      "plan %d on a budget of its estimate %llu: %s", iter,
			      (unsigned long long)need, e.msg);
		plan_fini(&p);
		plan_layout_set_fini(&src);
		plan_layout_set_fini(&dst);
	}
	ck_assert_int_gt(relaying, 0);
}
END_TEST

/*
 * A plan whose relays take more than its group buffers' peak leaves on a
 * budget of that peak (the old estimate): refused at open, naming the rank,
 * the need and the budget, nothing allocated -- not failed at an
 * allocation in the middle of the slice.
 */
START_TEST(refused_at_open_not_mid_slice)
{
	unsigned seed = 0x57a60000u;
	int found = 0;

	for (int iter = 0; iter < 400 && !found; iter++) {
		plan_layout_set_t src, dst;
		plan_t p;
		int nranks;
		bool verify;
		xport_t x;
		refit_err_t e;
		uint64_t old;
		char want[128];

		gen_plan(&seed, &src, &dst, &p, &nranks, &verify);
		old = groups_only(&p, nranks, verify);
		ck_assert_int_eq(run(&p, &src, &dst, nranks, verify, 64u << 20, &x, &e), REFIT_OK);
		if (x.peak > old) {
			found = 1;
			ck_assert_msg(run(&p, &src, &dst, nranks, verify, old, &x, &e) ==
				      REFIT_ERR_LIMIT && x.peak == 0, "plan %d on a budget of its "
				      "groups' %llu: %s (%s, %llu held)", iter,
				      (unsigned long long)old, refit_status_str(e.status), e.msg,
				      (unsigned long long)x.peak);
			snprintf(want, sizeof(want), "rank %d needs %llu bytes, budget %llu",
				 x.need_rank, (unsigned long long)x.need, (unsigned long long)old);
			ck_assert_msg(strstr(e.msg, want) != NULL, "%s", e.msg);
		}
		plan_fini(&p);
		plan_layout_set_fini(&src);
		plan_layout_set_fini(&dst);
	}
	ck_assert_int_eq(found, 1);
}
END_TEST

/* The arena's two ends: a group's buffers from the bottom, what lives on
 * from the top (the highest free range that holds it, its high end). */
START_TEST(arena_two_ends)
{
	gpu_arena_t a;
	uint64_t lo, t1, t2, t3;

	gpu_arena_init(&a, 4096);
	ck_assert(gpu_arena_get(&a, 100, &lo) && lo == 0);
	ck_assert(gpu_arena_get_top(&a, 300, &t1) && t1 == 3584);
	ck_assert(gpu_arena_get_top(&a, 256, &t2) && t2 == 3328);
	ck_assert(gpu_arena_put(&a, t1));
	/* free: [256, 3328) and [3584, 4096): 1 KiB only fits the first */
	ck_assert(gpu_arena_get_top(&a, 1024, &t3) && t3 == 2304);
	ck_assert(!gpu_arena_get_top(&a, 3000, &t1));
	ck_assert_uint_eq(a.in_use, 256 + 256 + 1024);
	ck_assert(gpu_arena_put(&a, lo) && gpu_arena_put(&a, t2) && gpu_arena_put(&a, t3));
	ck_assert_uint_eq(gpu_arena_largest(&a), 4096);
	ck_assert_uint_eq(a.peak, 256 + 256 + 1024);
	gpu_arena_fini(&a);
}
END_TEST

Suite *
suite_gpu_staging(void)
{
	TCase *tc = th_tcase("estimate", 60, TH_TESTS(refused_at_open_not_mid_slice, arena_two_ends));

	tcase_add_loop_test(tc, estimate_covers_arena_peak, 0, 3);
	return th_suite("gpu_staging", tc, NULL);
}
