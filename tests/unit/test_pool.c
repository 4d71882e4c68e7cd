/*
 * test_pool.c - the data plane's bounded buffer pool: reuse, the bound,
 * epochs, and that nothing is left behind.
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "daemon/transport/gpu_arena.h"
#include "dataplane/pool.h"
#include "tests/unit/helpers.h"

#define KiB(n) ((uint64_t)(n) << 10)
#define MiB(n) ((uint64_t)(n) << 20)

/* The pool puts a tag page before each buffer: b bytes asked cost b + PG. */
#define PG ((uint64_t)sysconf(_SC_PAGESIZE))

START_TEST(pool_reuses_buffers)
{
	dp_pool_t *pl = dp_pool_new(MiB(64), 0, 0);
	dp_pool_stats_t st;
	uint8_t *a, *b, *c, *a2, *b2, *c2;

	dp_pool_epoch(pl, 1, 0);
	a = dp_pool_get(pl, MiB(4));
	b = dp_pool_get(pl, MiB(4) + 4);   /* a packed message plus its CRC */
	c = dp_pool_get(pl, 1000);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(c);
	ck_assert(a != b && b != c && a != c);
	memset(a, 1, MiB(4));          /* writable, whole */
	memset(b, 2, MiB(4) + 4);
	memset(c, 3, 1000);
	dp_pool_put(pl, a);
	dp_pool_put(pl, b);
	dp_pool_put(pl, c);
	/* the next refit (or round) asks again: the same buffers, none made */
	a2 = dp_pool_get(pl, MiB(4));
	b2 = dp_pool_get(pl, MiB(4) + 4);
	c2 = dp_pool_get(pl, 1000);
	ck_assert(a2 == a && b2 == b && c2 == c);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.made, 3);
	ck_assert_uint_eq(st.hits, 3);
	ck_assert_uint_eq(st.oneoff, 0);
	ck_assert_uint_eq(st.nbufs, 3);
	/* a small request does not take a big buffer (at most twice its size) */
	dp_pool_put(pl, a2);
	c = dp_pool_get(pl, KiB(8));
	ck_assert(c != a2);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.made, 4);
	/* but half a buffer does */
	a = dp_pool_get(pl, MiB(2) + 1);
	ck_assert(a == a2);
	dp_pool_put(pl, a);
	dp_pool_put(pl, b2);
	dp_pool_put(pl, c2);
	dp_pool_put(pl, c);
	dp_pool_put(pl, NULL);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.busy, 0);
	ck_assert_uint_eq(st.nbufs, 4);
	ck_assert_uint_eq(st.held, MiB(4) + PG + (MiB(4) + PG + PG) + (PG + PG) +
				   (KiB(8) + PG));
	dp_pool_free(pl);
	/* under the small threshold: the heap's, outside the pool's count */
	pl = dp_pool_new(MiB(1), KiB(64), 0);
	a = dp_pool_get(pl, 1000);
	b = dp_pool_get(pl, KiB(64));
	memset(a, 4, 1000);
	memset(b, 5, KiB(64));
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.nbufs, 1);
	ck_assert_uint_eq(st.held, KiB(64) + PG);
	dp_pool_put(pl, a);   /* freed (ASan: a leak otherwise) */
	dp_pool_put(pl, b);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.busy, 0);
	dp_pool_free(pl);
}
END_TEST

START_TEST(pool_keeps_its_bound)
{
	uint64_t cap = MiB(1);
	dp_pool_t *pl = dp_pool_new(cap, 0, 0);
	dp_pool_stats_t st;
	uint8_t *b[8];

	dp_pool_epoch(pl, 7, 0);
	for (int i = 0; i < 8; i++) {   /* 2 MiB asked of a 1 MiB pool */
		b[i] = dp_pool_get(pl, KiB(256) - PG);
		ck_assert_ptr_nonnull(b[i]);
		memset(b[i], i, KiB(256) - PG);
		dp_pool_stats(pl, &st);
		ck_assert_uint_le(st.held, cap);
	}
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.held, cap);
	ck_assert_uint_eq(st.made, 4);
	ck_assert_uint_eq(st.oneoff, 4);
	ck_assert_uint_eq(st.busy, MiB(2));   /* tag pages included */
	for (int i = 0; i < 8; i++) {   /* nothing was shared */
		for (int k = 0; k < 8; k++)
			ck_assert(i == k || b[i] != b[k]);
		ck_assert_uint_eq(b[i][KiB(256) - PG - 1], (uint8_t)i);
	}
	for (int i = 0; i < 8; i++)
		dp_pool_put(pl, b[i]);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.busy, 0);
	ck_assert_uint_eq(st.held, cap);     /* the one-offs are gone */
	ck_assert_uint_eq(st.nbufs, 4);
	/* a bigger size evicts idle buffers to stay within the bound */
	b[0] = dp_pool_get(pl, KiB(768) - PG);
	dp_pool_stats(pl, &st);
	ck_assert_uint_le(st.held, cap);
	ck_assert_uint_eq(st.nbufs, 2);
	ck_assert_uint_eq(st.oneoff, 4);
	/* a request larger than the whole cap: one-off, unmapped when back */
	b[1] = dp_pool_get(pl, MiB(3));
	ck_assert_ptr_nonnull(b[1]);
	memset(b[1], 9, MiB(3));
	dp_pool_put(pl, b[1]);
	dp_pool_put(pl, b[0]);
	dp_pool_stats(pl, &st);
	ck_assert_uint_le(st.held, cap);
	ck_assert_uint_eq(st.busy, 0);
	ck_assert_uint_eq(st.oneoff, 5);
	dp_pool_free(pl);
}
END_TEST

START_TEST(pool_epoch_change_empties_it)
{
	dp_pool_t *pl = dp_pool_new(MiB(8), 0, DP_POOL_HUGE);
	dp_pool_stats_t st;
	uint8_t *idle, *busy, *again;

	dp_pool_epoch(pl, 1, 0);
	idle = dp_pool_get(pl, MiB(2));     /* huge-page path: madvised */
	busy = dp_pool_get(pl, MiB(1));
	ck_assert_ptr_nonnull(idle);
	ck_assert_ptr_nonnull(busy);
	ck_assert_uint_eq(idle[MiB(2) - 1], 0);
	dp_pool_put(pl, idle);
	dp_pool_epoch(pl, 1, MiB(4));       /* the same epoch: kept, cap not lowered */
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.nbufs, 2);
	ck_assert_uint_eq(st.cap, MiB(8));
	dp_pool_epoch(pl, 2, MiB(4));       /* a new epoch: idle ones go, new cap */
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.nbufs, 1);
	ck_assert_uint_eq(st.held, MiB(1) + PG);
	ck_assert_uint_eq(st.cap, MiB(4));
	/* a buffer of the old epoch given back is not kept */
	dp_pool_put(pl, busy);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.nbufs, 0);
	ck_assert_uint_eq(st.held, 0);
	ck_assert_uint_eq(st.busy, 0);
	again = dp_pool_get(pl, MiB(1));
	ck_assert_ptr_nonnull(again);
	dp_pool_stats(pl, &st);
	ck_assert_uint_eq(st.made, 3);
	dp_pool_put(pl, again);
	/* freed with a buffer still out: unmapped with the pool (ASan: no leak) */
	again = dp_pool_get(pl, KiB(4));
	ck_assert_ptr_nonnull(again);
	dp_pool_free(pl);
	dp_pool_free(NULL);
}
END_TEST

/* The GPU staging arena (daemon/transport/gpu_arena.c): random gets and
 * puts never overlap, stay inside, count their bytes, and every range
 * merges back into one when all are given back. */
START_TEST(gpu_arena_first_fit)
{
	gpu_arena_t a;
	uint64_t off[64] = {0}, len[64] = {0}, peak = 0, used = 0;
	unsigned seed = 7;

	gpu_arena_init(&a, 1 << 20);
	for (int step = 0; step < 5000; step++) {
		int k;

		seed = seed * 1103515245u + 12345u;
		k = (int)((seed >> 8) % 64);
		if (len[k]) {
			ck_assert(gpu_arena_put(&a, off[k]));
			ck_assert(!gpu_arena_put(&a, off[k] + 1));
			used -= len[k];
			len[k] = 0;
			continue;
		}
		uint64_t want = 1 + (seed >> 12) % 70000, n = (want + 255) / 256 * 256;

		if (!gpu_arena_get(&a, want, &off[k])) {
			ck_assert_uint_lt(gpu_arena_largest(&a), n);
			continue;
		}
		ck_assert_uint_eq(off[k] % GPU_ARENA_ALIGN, 0);
		ck_assert_uint_le(off[k] + n, 1 << 20);
		for (int j = 0; j < 64; j++)
			ck_assert(j == k || !len[j] || off[j] + len[j] <= off[k] ||
				  off[k] + n <= off[j]);
		len[k] = n;
		used += n;
		peak = used > peak ? used : peak;
		ck_assert_uint_eq(a.in_use, used);
	}
	for (int k = 0; k < 64; k++)
		if (len[k])
			ck_assert(gpu_arena_put(&a, off[k]));
	ck_assert_uint_eq(a.in_use, 0);
	ck_assert_uint_eq(a.peak, peak);
	ck_assert_uint_eq(a.nfree, 1);
	ck_assert_uint_eq(gpu_arena_largest(&a), 1 << 20);
	gpu_arena_fini(&a);
}
END_TEST

Suite *
suite_pool(void)
{
	return th_suite("pool",
			th_tcase("pool", 0,
				 TH_TESTS(pool_reuses_buffers, pool_keeps_its_bound,
					  pool_epoch_change_empties_it, gpu_arena_first_fit)),
			NULL);
}
