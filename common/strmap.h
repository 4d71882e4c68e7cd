/*
 * strmap.h - a string -> int32 hash map (open addressing, FNV-1a), used to
 * intern names (nodes, domains, tensors).  Keys are copied; caller-owned
 * struct (strmap_init / strmap_fini).  Not thread-safe.
 */
#ifndef REFIT_COMMON_STRMAP_H
#define REFIT_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct strmap {
	char **keys;
	int32_t *vals;
	size_t cap, n;
} strmap_t;

void strmap_init(strmap_t *m);
void strmap_fini(strmap_t *m);
/* Value of key, or -1 when absent. */
int32_t strmap_get(const strmap_t *m, const char *key);
/* Insert or replace. */
void strmap_put(strmap_t *m, const char *key, int32_t val);
uint64_t refit_hash_str(const char *s);

#endif
