/*
 * sort.c - key sorts and bit widths the planners share (internal.h):
 * below plan.c, planner.c and bcast.c, so none of them calls up.
 */
#include <stdlib.h>

#include "plan/internal.h"
#include "plan/radix.h"

#define KEY_U64(kc, x) (x)
#define KEY_XKEY(kc, x) ((x).key)
RADIX_SORT_DEFINE(radix_u64, uint64_t, int, KEY_U64)
RADIX_SORT_DEFINE(radix_xkey, xkey_t, int, KEY_XKEY)

_Static_assert(sizeof(xkey_t) >= 2 * sizeof(uint64_t), "plan_radix_sort packs in place");

/*
 * Keys of at most 32 bits (the planner's) are packed with their index into
 * one 64-bit value, in place: value i lives in bytes [8i, 8i + 8) of k's
 * storage (written after k[i] was read, before k[j > i] is), and the upper
 * half of k's storage is the scratch.  No allocation.
 */
void
plan_radix_sort(xkey_t *k, size_t n, int bits)
{
	uint64_t *pk = (uint64_t *)(void *)k;

	if (n < 2 || bits == 0)
		return;
	if (bits > 32) { /* key and index over 64 bits: through a second array */
		xkey_t *tmp = xmalloc(n * sizeof(*tmp));

		radix_xkey(k, tmp, n, 0, bits, 0);
		free(tmp);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		xkey_t x = k[i];

		pk[i] = x.key << 32 | x.idx;
	}
	radix_u64(pk, pk + n, n, 32, bits, 0);
	for (size_t i = n; i-- > 0;) { /* k[i] covers values 2i, 2i + 1: done */
		uint64_t v = pk[i];

		k[i] = (xkey_t){v >> 32, (uint32_t)v};
	}
}

int
plan_bits_for(uint64_t n)
{
	int b = 0;

	while (b < 64 && (n >> b) != 0)
		b++;
	return b;
}
