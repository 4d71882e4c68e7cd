/*
 * radix.h - the planner's radix sorts, one macro: each file that sorts
 * instantiates what it needs (plan.c: transfer records; sort.c: keys).
 */
#ifndef REFIT_PLAN_RADIX_H
#define REFIT_PLAN_RADIX_H

#include <stdint.h>
#include <stdlib.h>

#include "common/alloc.h"

/*
 * RADIX_SORT_DEFINE(name, type, ctx_t, KEY) defines
 *   static void name(type *a, type *t, size_t n, int lo, int bits, ctx_t kc)
 * a stable LSD radix sort of a[0..n) on bits [lo, lo + bits) of each
 * element's key KEY(kc, a[i]) (a uint64_t), t scratch of n elements:
 * digits of at most 11 bits (2,048 buckets, so the scatter's write streams
 * stay in cache), an even number of passes (the result ends in a), every
 * pass's histogram from one read.  The planner's sorts are its instances:
 * radix_u64 (packed values, the normal path), radix_xkey and radix_xfer
 * (the fallbacks when key and index, or key and box index, do not fit 64
 * bits together).
 */
#define RADIX_SORT_DEFINE(name, type, ctx_t, KEY)			\
static void								\
name(type *a, type *t, size_t n, int lo, int bits, ctx_t kc)		\
{									\
	int npass = (bits + 10) / 11, w;				\
	size_t nb, *cnt;						\
	uint64_t mask;							\
									\
	(void)kc;							\
	if (n < 2 || bits == 0)						\
		return;							\
	npass += npass & 1;						\
	w = (bits + npass - 1) / npass;					\
	nb = (size_t)1 << w;						\
	mask = nb - 1;							\
	cnt = xcalloc(nb * (size_t)npass, sizeof(*cnt));		\
	for (size_t i = 0; i < n; i++) {				\
		uint64_t v = KEY(kc, a[i]) >> lo;			\
									\
		for (int q = 0; q < npass; q++, v >>= w)		\
			cnt[(size_t)q * nb + (v & mask)]++;		\
	}								\
	for (int q = 0; q < npass; q++) {				\
		size_t *c = cnt + (size_t)q * nb, sum = 0;		\
		int shift = lo + q * w;					\
		type *sw = a;						\
									\
		for (size_t i = 0; i < nb; i++) {			\
			size_t x = c[i];				\
									\
			c[i] = sum;					\
			sum += x;					\
		}							\
		for (size_t i = 0; i < n; i++)				\
			t[c[(KEY(kc, a[i]) >> shift) & mask]++] = a[i];	\
		a = t;							\
		t = sw;							\
	}								\
	free(cnt);							\
}

#endif
