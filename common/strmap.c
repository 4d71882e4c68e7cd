/*
 * strmap.c - see strmap.h.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"

uint64_t
refit_hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ull;
	}
	return h;
}

void
strmap_init(strmap_t *m)
{
	memset(m, 0, sizeof(*m));
}

void
strmap_fini(strmap_t *m)
{
	for (size_t i = 0; i < m->cap; i++)
		free(m->keys[i]);
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

/* The table's start slot: FNV-1a's low bits barely change between names
 * that differ in a middle digit (model.layers.12.mlp.experts.45...), so
 * the hash is mixed (a 64-bit finaliser) before it is masked; without it
 * linear probing ran long chains with tens of thousands of such names. */
static size_t
start(const strmap_t *m, const char *key)
{
	uint64_t h = refit_hash_str(key);

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return (size_t)h & (m->cap - 1);
}

static size_t
slot(const strmap_t *m, const char *key)
{
	size_t i = start(m, key);

	while (m->keys[i] != NULL && strcmp(m->keys[i], key) != 0)
		i = (i + 1) & (m->cap - 1);
	return i;
}

int32_t
strmap_get(const strmap_t *m, const char *key)
{
	size_t i;

	if (m->cap == 0)
		return -1;
	i = slot(m, key);
	return m->keys[i] ? m->vals[i] : -1;
}

static void
grow(strmap_t *m)
{
	strmap_t n = {0};

	n.cap = m->cap ? m->cap * 2 : 16;
	n.keys = xcalloc(n.cap, sizeof(*n.keys));
	n.vals = xcalloc(n.cap, sizeof(*n.vals));
	for (size_t i = 0; i < m->cap; i++) {
		if (m->keys[i] != NULL) {
			size_t j = slot(&n, m->keys[i]);

			n.keys[j] = m->keys[i];
			n.vals[j] = m->vals[i];
			n.n++;
		}
	}
	free(m->keys);
	free(m->vals);
	*m = n;
}

void
strmap_put(strmap_t *m, const char *key, int32_t val)
{
	size_t i;

	if ((m->n + 1) * 4 > m->cap * 3)
		grow(m);
	i = slot(m, key);
	if (m->keys[i] == NULL) {
		m->keys[i] = xstrdup(key);
		m->n++;
	}
	m->vals[i] = val;
}
