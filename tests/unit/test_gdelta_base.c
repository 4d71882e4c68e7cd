/*
 * test_gdelta_base.c - a node's delta bases on its devices
 * (daemon/node/gdelta_base.c), over a counting host "device": each rank's
 * share bounds its bases (a base without room is none, never a failure);
 * a tag names a base; a new epoch gives every base back, another plan the
 * model's; a message of another size or rank is made again.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/node/gdelta_base.h"
#include "tests/unit/helpers.h"

typedef struct fake_dev {
	int allocs, frees;
	bool fail;                /* the arena refuses */
} fake_dev_t;

static void *
fd_alloc(void *ctx, int32_t rank, uint64_t bytes)
{
	fake_dev_t *f = ctx;

	(void)rank;
	if (f->fail)
		return NULL;
	f->allocs++;
	return malloc(bytes);
}

static void
fd_free(void *ctx, int32_t rank, void *p)
{
	fake_dev_t *f = ctx;

	(void)rank;
	f->frees++;
	free(p);
}

static dp_dev_ops_t
fake_ops(fake_dev_t *f)
{
	dp_dev_ops_t d;

	memset(&d, 0, sizeof(d));
	d.alloc = fd_alloc;
	d.free = fd_free;
	d.ctx = f;
	return d;
}

static gdelta_ent_t *
get(gdelta_store_t *st, const dp_dev_ops_t *d, const char *model, const char *digest,
    size_t pos, int32_t rank, uint64_t bytes)
{
	return gdelta_get(st, d, model, digest, "peer", true, pos, rank, bytes);
}

START_TEST(share_bounds_each_rank)
{
	fake_dev_t f = {0};
	dp_dev_ops_t d = fake_ops(&f);
	gdelta_store_t *st = gdelta_store_new(1000);
	gdelta_ent_t *e;

	gdelta_begin(st, &d, 7, "m", "d1");
	ck_assert_ptr_nonnull(e = get(st, &d, "m", "d1", 0, 0, 600));
	/* rank 0's share is spent: none, and nothing asked of the arena */
	ck_assert_ptr_null(get(st, &d, "m", "d1", 1, 0, 600));
	ck_assert_ptr_null(get(st, &d, "m", "d1", 2, 0, 1001));
	ck_assert_int_eq(f.allocs, 1);
	/* another rank has its own share */
	ck_assert_ptr_nonnull(get(st, &d, "m", "d1", 1, 1, 600));
	ck_assert_ptr_nonnull(get(st, &d, "m", "d1", 2, 0, 400));
	ck_assert_uint_eq(gdelta_store_used(st), 1600);
	/* the arena refusing is no room either, nothing counted */
	f.fail = true;
	ck_assert_ptr_null(get(st, &d, "m", "d1", 3, 2, 10));
	ck_assert_uint_eq(gdelta_store_used(st), 1600);
	ck_assert_uint_eq(gdelta_store_count(st), 3);
	/* the same message again: the same allocation */
	ck_assert_ptr_eq(get(st, &d, "m", "d1", 0, 0, 600), e);
	gdelta_begin(st, &d, 8, "m", "d1");
	gdelta_store_free(st);
}
END_TEST

START_TEST(tag_names_the_base)
{
	fake_dev_t f = {0};
	dp_dev_ops_t d = fake_ops(&f);
	gdelta_store_t *st = gdelta_store_new(1000);
	gdelta_ent_t *e;

	gdelta_begin(st, &d, 7, "m", "d1");
	e = get(st, &d, "m", "d1", 0, 0, 100);
	/* allocated but not written: no base yet */
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "peer", true, 0, 0, 100, 0));
	e->tag = 5;
	ck_assert_ptr_eq(gdelta_find(st, "m", "d1", "peer", true, 0, 0, 100, 5), e);
	ck_assert_ptr_eq(gdelta_find(st, "m", "d1", "peer", true, 0, 0, 100, 0), e);
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "peer", true, 0, 0, 100, 6));
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "peer", false, 0, 0, 100, 5));
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "other", true, 0, 0, 100, 5));
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "peer", true, 0, 1, 100, 5));
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "peer", true, 0, 0, 101, 5));
	/* another size: the old allocation given back, a new one made */
	ck_assert_ptr_nonnull(get(st, &d, "m", "d1", 0, 0, 200));
	ck_assert_int_eq(f.frees, 1);
	ck_assert_uint_eq(gdelta_store_used(st), 200);
	ck_assert_ptr_null(gdelta_find(st, "m", "d1", "peer", true, 0, 0, 200, 0));
	/* no room for the new size: the old base goes too (the peer's is new) */
	ck_assert_ptr_null(get(st, &d, "m", "d1", 0, 0, 2000));
	ck_assert_uint_eq(gdelta_store_count(st), 0);
	ck_assert_int_eq(f.frees, 2);
	gdelta_store_free(st);
}
END_TEST

START_TEST(epoch_and_plan_drop_bases)
{
	fake_dev_t f = {0};
	dp_dev_ops_t d = fake_ops(&f);
	gdelta_store_t *st = gdelta_store_new(1000);
	gdelta_ent_t *e;
	void *kept;

	gdelta_begin(st, &d, 7, "m", "d1");
	get(st, &d, "m", "d1", 0, 0, 100)->tag = 1;
	get(st, &d, "n", "e1", 0, 0, 100)->tag = 1;
	/* the same epoch and plan: kept */
	gdelta_begin(st, &d, 7, "m", "d1");
	ck_assert_uint_eq(gdelta_store_count(st), 2);
	/* another plan of m: m's bases go, n's stay */
	gdelta_begin(st, &d, 7, "m", "d2");
	ck_assert_uint_eq(gdelta_store_count(st), 1);
	ck_assert_ptr_nonnull(gdelta_find(st, "n", "e1", "peer", true, 0, 0, 100, 1));
	ck_assert_int_eq(f.frees, 1);
	gdelta_drop(st, &d, gdelta_find(st, "n", "e1", "peer", true, 0, 0, 100, 1));
	ck_assert_uint_eq(gdelta_store_count(st), 0);
	get(st, &d, "m", "d2", 0, 0, 100)->tag = 2;
	get(st, &d, "n", "e1", 0, 1, 100)->tag = 2;
	/* a new epoch: every model's bases given back to the device */
	gdelta_begin(st, &d, 8, "n", "e1");
	ck_assert_uint_eq(gdelta_store_count(st), 0);
	ck_assert_uint_eq(gdelta_store_used(st), 0);
	ck_assert_int_eq(f.frees, f.allocs);
	/* a failed slice: every base goes, given back or only forgotten */
	get(st, &d, "m", "d2", 0, 0, 100)->tag = 3;
	get(st, &d, "n", "e1", 0, 1, 100)->tag = 3;
	gdelta_drop_all(st, &d);
	ck_assert_uint_eq(gdelta_store_count(st), 0);
	ck_assert_int_eq(f.frees, f.allocs);
	e = get(st, &d, "m", "d2", 0, 0, 100);
	e->tag = 4;
	kept = e->data;
	gdelta_drop_all(st, NULL);
	ck_assert_uint_eq(gdelta_store_count(st), 0);
	ck_assert_uint_eq(gdelta_store_used(st), 0);
	ck_assert_int_eq(f.frees + 1, f.allocs);
	free(kept);  /* the "arena" went with the transport */
	gdelta_store_free(st);
}
END_TEST

/* A base without room on its rank gives back the least recently used
 * bases of other models there, never the asking model's; received bases
 * lost are noted for the coordinator. */
START_TEST(evicts_other_models_lru)
{
	fake_dev_t f = {0};
	dp_dev_ops_t d = fake_ops(&f);
	gdelta_store_t *st = gdelta_store_new(1000);
	char **ev;
	size_t n;

	gdelta_begin(st, &d, 7, "m", "d1");
	gdelta_get(st, &d, "m", "d1", "p", false, 0, 0, 400)->tag = 1;
	gdelta_get(st, &d, "n", "e1", "p", false, 0, 0, 400)->tag = 1;
	gdelta_get(st, &d, "n", "e1", "p", false, 1, 1, 400)->tag = 1;
	ck_assert_ptr_nonnull(gdelta_find(st, "m", "d1", "p", false, 0, 0, 400, 1));
	/* k on rank 0: n's base there is the oldest (m was just used) */
	gdelta_begin(st, &d, 7, "k", "f1");
	ck_assert_ptr_nonnull(gdelta_get(st, &d, "k", "f1", "p", true, 0, 0, 400));
	ck_assert_uint_eq(gdelta_store_evictions(st), 1);
	ck_assert_ptr_nonnull(gdelta_find(st, "m", "d1", "p", false, 0, 0, 400, 1));
	ck_assert_ptr_nonnull(gdelta_find(st, "n", "e1", "p", false, 1, 1, 400, 1));
	ck_assert_ptr_null(gdelta_find(st, "n", "e1", "p", false, 0, 0, 400, 1));
	ev = gdelta_store_take_evicted(st, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(ev[0], "n");
	free(ev[0]);
	free(ev);
	/* room only without k's own: m goes, then none; bounded */
	ck_assert_ptr_null(gdelta_get(st, &d, "k", "f1", "p", true, 1, 0, 900));
	ck_assert_uint_eq(gdelta_store_evictions(st), 2);
	ck_assert_uint_eq(gdelta_store_used(st), 800);
	ck_assert_int_eq(f.frees + (int)gdelta_store_count(st), f.allocs);
	/* the pure order: another model's, on the rank, oldest */
	{
		gdelta_ent_t a = {.model = "x", .rank = 0, .used_at = 9},
			     b = {.model = "y", .rank = 1, .used_at = 1},
			     c = {.model = "y", .rank = 0, .used_at = 5};
		const gdelta_ent_t *v[3] = {&a, &b, &c};

		ck_assert_uint_eq(gdelta_lru_victim(v, 3, "z", 0), 2);
		ck_assert_uint_eq(gdelta_lru_victim(v, 3, "y", 0), 0);
		ck_assert_uint_eq(gdelta_lru_victim(v, 3, "y", 1), SIZE_MAX);
	}
	gdelta_drop_all(st, &d);
	gdelta_store_free(st);
}
END_TEST

Suite *
suite_gdelta_base(void)
{
	return th_suite("gdelta_base",
			th_tcase("gdelta_base", 10,
				 TH_TESTS(share_bounds_each_rank, tag_names_the_base,
					  epoch_and_plan_drop_bases, evicts_other_models_lru)),
			NULL);
}
