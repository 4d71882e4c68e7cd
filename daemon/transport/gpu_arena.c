/*
 * gpu_arena.c - first-fit offsets of a staging arena (see gpu_arena.h).
 */
#include <string.h>

#include "common/alloc.h"
#include "daemon/transport/gpu_arena.h"

void
gpu_arena_init(gpu_arena_t *a, uint64_t size)
{
	memset(a, 0, sizeof(*a));
	a->size = size / GPU_ARENA_ALIGN * GPU_ARENA_ALIGN;
	if (a->size == 0)
		return;
	a->capfree = 8;
	a->free_v = xmalloc(a->capfree * sizeof(*a->free_v));
	a->free_v[0] = (gpu_extent_t){0, a->size};
	a->nfree = 1;
}

void
gpu_arena_fini(gpu_arena_t *a)
{
	free(a->free_v);
	free(a->used_v);
	memset(a, 0, sizeof(*a));
}

/* Take n bytes of free range i: its low end (or its high end, top). */
static void
take(gpu_arena_t *a, size_t i, uint64_t n, bool top, uint64_t *off)
{
	if (top) {
		*off = a->free_v[i].off + a->free_v[i].len - n;
	} else {
		*off = a->free_v[i].off;
		a->free_v[i].off += n;
	}
	a->free_v[i].len -= n;
	if (a->free_v[i].len == 0) {
		memmove(&a->free_v[i], &a->free_v[i + 1], (a->nfree - i - 1) * sizeof(*a->free_v));
		a->nfree--;
	}
	if (a->nused == a->capused) {
		a->capused = a->capused ? a->capused * 2 : 16;
		a->used_v = xrealloc(a->used_v, a->capused * sizeof(*a->used_v));
	}
	a->used_v[a->nused++] = (gpu_extent_t){*off, n};
	a->in_use += n;
	if (a->in_use > a->peak)
		a->peak = a->in_use;
}

static uint64_t
units(uint64_t bytes)
{
	uint64_t n = (bytes ? bytes : 1);

	return (n + GPU_ARENA_ALIGN - 1) / GPU_ARENA_ALIGN * GPU_ARENA_ALIGN;
}

bool
gpu_arena_get(gpu_arena_t *a, uint64_t bytes, uint64_t *off)
{
	uint64_t n = units(bytes);
	size_t i;

	for (i = 0; i < a->nfree && a->free_v[i].len < n; i++)
		;
	if (i == a->nfree)
		return false;
	take(a, i, n, false, off);
	return true;
}

bool
gpu_arena_get_top(gpu_arena_t *a, uint64_t bytes, uint64_t *off)
{
	uint64_t n = units(bytes);
	size_t i;

	for (i = a->nfree; i > 0 && a->free_v[i - 1].len < n; i--)
		;
	if (i == 0)
		return false;
	take(a, i - 1, n, true, off);
	return true;
}

bool
gpu_arena_put(gpu_arena_t *a, uint64_t off)
{
	gpu_extent_t e;
	size_t u, i;

	for (u = 0; u < a->nused && a->used_v[u].off != off; u++)
		;
	if (u == a->nused)
		return false;
	e = a->used_v[u];
	a->used_v[u] = a->used_v[--a->nused];
	a->in_use -= e.len;
	for (i = 0; i < a->nfree && a->free_v[i].off < e.off; i++)
		;
	/* merge with the previous and the next free ranges where they touch */
	if (i > 0 && a->free_v[i - 1].off + a->free_v[i - 1].len == e.off) {
		a->free_v[i - 1].len += e.len;
		if (i < a->nfree && e.off + e.len == a->free_v[i].off) {
			a->free_v[i - 1].len += a->free_v[i].len;
			memmove(&a->free_v[i], &a->free_v[i + 1],
				(a->nfree - i - 1) * sizeof(*a->free_v));
			a->nfree--;
		}
		return true;
	}
	if (i < a->nfree && e.off + e.len == a->free_v[i].off) {
		a->free_v[i].off = e.off;
		a->free_v[i].len += e.len;
		return true;
	}
	if (a->nfree == a->capfree) {
		a->capfree = a->capfree ? a->capfree * 2 : 8;
		a->free_v = xrealloc(a->free_v, a->capfree * sizeof(*a->free_v));
	}
	memmove(&a->free_v[i + 1], &a->free_v[i], (a->nfree - i) * sizeof(*a->free_v));
	a->free_v[i] = e;
	a->nfree++;
	return true;
}

uint64_t
gpu_arena_largest(const gpu_arena_t *a)
{
	uint64_t m = 0;

	for (size_t i = 0; i < a->nfree; i++)
		m = a->free_v[i].len > m ? a->free_v[i].len : m;
	return m;
}
