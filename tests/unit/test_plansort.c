/*
 * test_plansort.c - the planner's sorts (plan.c): plan_radix_sort on keys
 * that take the packed path (up to 32 bits) and the wide one, and
 * plan_finalize's transfer order when key and box index fit 64 bits
 * together (packed in place) and when they do not (records copied), both
 * against a comparison sort.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"
#include "tests/unit/helpers.h"

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* n keys of `bits` bits, few distinct ones (ties) when `dup`, sorted; the
 * result must be the stable order: keys ascending, indices ascending among
 * equal keys, and each index still carrying its key. */
static void
check_radix(size_t n, int bits, bool dup, uint64_t seed)
{
	xkey_t *k = xmalloc((n ? n : 1) * sizeof(*k));
	uint64_t *orig = xmalloc((n ? n : 1) * sizeof(*orig));
	uint64_t mask = bits >= 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
	bool *seen = xcalloc(n ? n : 1, sizeof(*seen));

	for (size_t i = 0; i < n; i++) {
		orig[i] = rnd(&seed) & mask;
		if (dup)
			orig[i] &= mask & 0x707; /* a handful of values */
		k[i] = (xkey_t){orig[i], (uint32_t)i};
	}
	plan_radix_sort(k, n, bits);
	/* plain tests in the loop, one assertion at the first fault: Check's
	 * ck_assert marks a point through a pipe on every call (slow, ASan) */
	for (size_t i = 0; i < n; i++) {
		const char *bad = NULL;

		if (k[i].idx >= n)
			bad = "an index out of range";
		else if (seen[k[i].idx])
			bad = "an index twice";
		else if (k[i].key != orig[k[i].idx])
			bad = "a key not its index's";
		else if (i > 0 && k[i - 1].key > k[i].key)
			bad = "out of order";
		else if (i > 0 && k[i - 1].key == k[i].key && k[i - 1].idx >= k[i].idx)
			bad = "not stable";
		if (bad != NULL)
			ck_abort_msg("n %zu bits %d: %s at %zu (index %u)", n, bits, bad, i, k[i].idx);
		seen[k[i].idx] = true;
	}
	free(k);
	free(orig);
	free(seen);
}

START_TEST(radix_sort_paths)
{
	static const size_t ns[] = {0, 1, 2, 3, 17, 1000, 70001};
	static const int bits[] = {1, 7, 11, 12, 23, 32, 33, 48, 64};

	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
		for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
			check_radix(ns[a], bits[b], false, 0x9e37 + a * 31 + b);
			check_radix(ns[a], bits[b], true, 0x1234 + a * 31 + b);
		}
}
END_TEST

static const plan_box_t *sort_boxes;

/* The plan order (plan.h), box contents last. */
static int
cmp_ref(const void *a, const void *b)
{
	const plan_xfer_t *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	if (x->from != y->from)
		return x->from < y->from ? -1 : 1;
	if (x->to != y->to)
		return x->to < y->to ? -1 : 1;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return plan_box_cmp(&sort_boxes[x->box], &sort_boxes[y->box], PLAN_MAX_DIMS);
}

/*
 * n random transfers over nboxes distinct one-dim boxes, ids below the
 * given bounds, finalized; the order must equal a comparison sort's and
 * the digest must not depend on the input order.
 */
static void
check_finalize(size_t n, uint32_t nboxes, uint32_t max_stage, int32_t max_rank,
	       uint64_t seed)
{
	plan_xfer_t *x = xmalloc(n * sizeof(*x)), *ref = xmalloc(n * sizeof(*ref));
	plan_box_t *boxes = xcalloc(nboxes, sizeof(*boxes));
	uint8_t digest[2][SHA256_DIGEST_LEN];

	for (uint32_t i = 0; i < nboxes; i++) { /* distinct contents, shuffled */
		boxes[i].off[0] = (int64_t)(((uint64_t)i * 7919u) % nboxes);
		boxes[i].size[0] = 1;
	}
	for (size_t i = 0; i < n; i++)
		x[i] = (plan_xfer_t){(uint32_t)(rnd(&seed) % (max_stage + 1u)),
				     (int32_t)(rnd(&seed) % ((uint64_t)max_rank + 1)),
				     (int32_t)(rnd(&seed) % ((uint64_t)max_rank + 1)),
				     (uint32_t)(rnd(&seed) % 3), (uint32_t)(rnd(&seed) % nboxes)};
	x[0].box = nboxes - 1; /* the widest box index is there */
	memcpy(ref, x, n * sizeof(*x));
	sort_boxes = boxes;
	qsort(ref, n, sizeof(*ref), cmp_ref);
	for (int round = 0; round < 2; round++) {
		plan_t p;
		plan_opts_t o;
		plan_xfer_t *raw = xmalloc(n * sizeof(*raw));
		plan_box_t *b = xmalloc(nboxes * sizeof(*b));

		memset(&p, 0, sizeof(p));
		plan_opts_default(&o);
		p.opts = o;
		p.ntensors = 3;
		p.tensors = xcalloc(3, sizeof(*p.tensors));
		for (int t = 0; t < 3; t++)
			p.tensors[t] = (plan_tensor_ref_t){xstrdup("t"), PLAN_DT_BF16, 1, 2};
		memcpy(b, boxes, nboxes * sizeof(*b));
		memcpy(raw, x, n * sizeof(*x));
		if (round == 1) /* reversed input: the same plan */
			for (size_t i = 0; i < n / 2; i++) {
				plan_xfer_t t = raw[i];

				raw[i] = raw[n - 1 - i];
				raw[n - 1 - i] = t;
			}
		plan_finalize(&p, raw, n, b, nboxes);
		ck_assert_uint_eq(p.nxfers, n);
		for (size_t i = 0; i < n; i++)
			if (cmp_ref(&p.xfers[i], &ref[i]) != 0 || p.xfers[i].box != ref[i].box)
				ck_abort_msg("n %zu boxes %u: transfer %zu differs", n, nboxes, i);
		memcpy(digest[round], p.digest, sizeof(p.digest));
		plan_fini(&p);
	}
	ck_assert(memcmp(digest[0], digest[1], SHA256_DIGEST_LEN) == 0);
	free(x);
	free(ref);
	free(boxes);
}

START_TEST(finalize_sort_paths)
{
	/* small ids: key and box index packed in 64 bits */
	check_finalize(5000, 700, 40, 300, 11);
	check_finalize(2, 2, 0, 0, 12);
	/* 16 + 15 + 15 + 2 key bits and a 17-bit box index: the copying path */
	check_finalize(20000, 100000, 65535, 32767, 13);
	/* up to 16 + 23 + 23 + 2 = 64 key bits, 10-bit box index: copying too */
	check_finalize(20000, 1000, 65535, (1 << 23) - 1, 15);
	/* key alone over 64 bits: qsort */
	check_finalize(3000, 50, UINT32_MAX - 1, INT32_MAX - 1, 14);
}
END_TEST

Suite *
suite_plansort(void)
{
	return th_suite("plansort", th_tcase("core", 60, TH_TESTS(radix_sort_paths,
			finalize_sort_paths)), NULL);
}
