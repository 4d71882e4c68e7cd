/*
 * alloc.c - aborting allocation wrappers (see alloc.h for the policy).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

static void
oom(size_t n)
{
	fprintf(stderr, "refit: out of memory allocating %zu bytes\n", n);
	abort();
}

void *
xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (p == NULL)
		oom(n);
	return p;
}

void *
xcalloc(size_t nmemb, size_t size)
{
	void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);

	if (p == NULL)
		oom(nmemb * size);
	return p;
}

void *
xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);

	if (q == NULL)
		oom(n);
	return q;
}

void *
xreallocarray(void *p, size_t nmemb, size_t size)
{
	if (size != 0 && nmemb > SIZE_MAX / size)
		oom(SIZE_MAX);
	return xrealloc(p, nmemb * size);
}

char *
xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = xmalloc(n);

	memcpy(d, s, n);
	return d;
}
