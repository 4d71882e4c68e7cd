/*
 * alloc.h - allocation helpers and a growable array.
 *
 * xmalloc/xcalloc/xrealloc/xstrdup abort the process with a message when the
 * allocator fails: refit treats running out of host memory as fatal (like
 * Redis' zmalloc), so callers never carry NULL checks for small allocations.
 * Sizes are overflow-checked.  VEC_* is a type-generic growable array:
 *
 *     VEC(int) v = {0};  VEC_PUSH(&v, 3);  ...  VEC_FREE(&v);
 */
#ifndef REFIT_COMMON_ALLOC_H
#define REFIT_COMMON_ALLOC_H

#include <stddef.h>
#include <stdlib.h>

void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
/* realloc to nmemb*size with overflow check. */
void *xreallocarray(void *p, size_t nmemb, size_t size);
char *xstrdup(const char *s);

#define VEC(type)                                                          \
	struct {                                                           \
		type *v;                                                   \
		size_t n, cap;                                             \
	}

/* Make room for at least `want` elements. */
#define VEC_RESERVE(vec, want)                                             \
	do {                                                               \
		if ((want) > (vec)->cap) {                                 \
			size_t nc_ = (vec)->cap ? (vec)->cap * 2 : 8;      \
			while (nc_ < (want))                               \
				nc_ *= 2;                                  \
			(vec)->v = xreallocarray((vec)->v, nc_,            \
						 sizeof(*(vec)->v));       \
			(vec)->cap = nc_;                                  \
		}                                                          \
	} while (0)

#define VEC_PUSH(vec, val)                                                 \
	do {                                                               \
		VEC_RESERVE((vec), (vec)->n + 1);                          \
		(vec)->v[(vec)->n++] = (val);                              \
	} while (0)

#define VEC_FREE(vec)                                                      \
	do {                                                               \
		free((vec)->v);                                            \
		(vec)->v = NULL;                                           \
		(vec)->n = (vec)->cap = 0;                                 \
	} while (0)

/*
 * qsort/bsearch that accept an empty array with a NULL base (the libc
 * functions declare the base nonnull even when n is 0).
 */
static inline void
xqsort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
	if (n > 1)
		qsort(base, n, size, cmp);
}

static inline void *
xbsearch(const void *key, const void *base, size_t n, size_t size,
	 int (*cmp)(const void *, const void *))
{
	return n ? bsearch(key, base, n, size, cmp) : NULL;
}

#endif
