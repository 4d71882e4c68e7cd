/*
 * pool.c - the bounded buffer pool (see pool.h).
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "dataplane/pool.h"

#define HUGE_MIN (2u << 20)
#define HDR 16                      /* a tag before every buffer handed out */
static const uint64_t TAG_MAP = 0x72656669746d6170ull;   /* "refitmap" */
static const uint64_t TAG_HEAP = 0x7265666974686570ull;  /* "refithep" */

typedef struct pbuf {
	uint8_t *p;
	uint64_t size;       /* mapped, a multiple of the page size */
	uint64_t epoch;
	bool busy, kept;     /* kept: counted in held (not one-off) */
} pbuf_t;

struct dp_pool {
	pthread_mutex_t mu;
	uint64_t cap, epoch, held, busy, hits, made, oneoff, small;
	unsigned flags;
	VEC(pbuf_t) b;
};

dp_pool_t *
dp_pool_new(uint64_t cap, uint64_t small, unsigned flags)
{
	dp_pool_t *pl = xcalloc(1, sizeof(*pl));

	pthread_mutex_init(&pl->mu, NULL);
	pl->cap = cap;
	pl->small = small;
	pl->flags = flags;
	return pl;
}

static void
unmap(pbuf_t *b)
{
	munmap(b->p, b->size);
}

/* Remove entry i (order does not matter). */
static void
drop(dp_pool_t *pl, size_t i)
{
	if (pl->b.v[i].kept)
		pl->held -= pl->b.v[i].size;
	unmap(&pl->b.v[i]);
	pl->b.v[i] = pl->b.v[--pl->b.n];
}

void
dp_pool_free(dp_pool_t *pl)
{
	if (pl == NULL)
		return;
	for (size_t i = 0; i < pl->b.n; i++)
		unmap(&pl->b.v[i]);
	VEC_FREE(&pl->b);
	pthread_mutex_destroy(&pl->mu);
	free(pl);
}

void
dp_pool_epoch(dp_pool_t *pl, uint64_t epoch, uint64_t cap)
{
	pthread_mutex_lock(&pl->mu);
	if (epoch != pl->epoch) {
		pl->epoch = epoch;
		for (size_t i = pl->b.n; i-- > 0;)
			if (!pl->b.v[i].busy)
				drop(pl, i);
		if (cap)
			pl->cap = cap;
	} else if (cap > pl->cap) {
		pl->cap = cap;
	}
	pthread_mutex_unlock(&pl->mu);
}

/*
 * Map size bytes.  Nothing is faulted in here: a page costs memory from
 * its first use on, and stays resident while the buffer is kept, so the
 * refits after the first touch no fresh pages and a buffer never costs
 * more than what was written into it.
 */
static uint8_t *
map(const dp_pool_t *pl, uint64_t size)
{
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	if ((pl->flags & DP_POOL_HUGE) && size >= HUGE_MIN)
		(void)madvise(p, size, MADV_HUGEPAGE); /* a hint: THP may be off */
	return p;
}

void *
dp_pool_get(dp_pool_t *pl, uint64_t bytes)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t ps = pg > 0 ? (uint64_t)pg : 4096;
	uint64_t size = ((bytes ? bytes : 1) + ps - 1) / ps * ps + ps; /* + the tag page */
	size_t best = SIZE_MAX;
	pbuf_t nb = {0};

	if (bytes < pl->small) { /* the heap's own free lists serve these */
		uint8_t *h = xmalloc(bytes + HDR);

		memcpy(h, &TAG_HEAP, sizeof(TAG_HEAP));
		return h + HDR;
	}
	pthread_mutex_lock(&pl->mu);
	/* the smallest idle buffer that fits, wasting at most half of it */
	for (size_t i = 0; i < pl->b.n; i++) {
		const pbuf_t *b = &pl->b.v[i];

		if (!b->busy && b->kept && b->size >= size && b->size / 2 <= size &&
		    (best == SIZE_MAX || b->size < pl->b.v[best].size))
			best = i;
	}
	if (best != SIZE_MAX) {
		uint8_t *p = pl->b.v[best].p + ps;

		pl->b.v[best].busy = true;
		pl->busy += pl->b.v[best].size;
		pl->hits++;
		pthread_mutex_unlock(&pl->mu);
		return p;
	}
	/* room for it: evict idle buffers that do not fit this size */
	for (size_t i = pl->b.n; i-- > 0 && pl->held + size > pl->cap;)
		if (!pl->b.v[i].busy)
			drop(pl, i);
	nb.size = size;
	nb.epoch = pl->epoch;
	nb.busy = true;
	nb.kept = pl->held + size <= pl->cap;
	nb.p = map(pl, size);
	if (nb.p == NULL) {
		pthread_mutex_unlock(&pl->mu);
		return NULL;
	}
	memcpy(nb.p + ps - HDR, &TAG_MAP, sizeof(TAG_MAP));
	if (nb.kept) {
		pl->held += size;
		pl->made++;
	} else {
		pl->oneoff++;
	}
	pl->busy += size;
	VEC_PUSH(&pl->b, nb);
	pthread_mutex_unlock(&pl->mu);
	return nb.p + ps;
}

void
dp_pool_put(dp_pool_t *pl, void *p)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t ps = pg > 0 ? (uint64_t)pg : 4096, tag;

	if (p == NULL)
		return;
	memcpy(&tag, (uint8_t *)p - HDR, sizeof(tag));
	if (tag == TAG_HEAP) {
		free((uint8_t *)p - HDR);
		return;
	}
	pthread_mutex_lock(&pl->mu);
	for (size_t i = 0; i < pl->b.n; i++) {
		pbuf_t *b = &pl->b.v[i];

		if (b->p + ps != p)
			continue;
		pl->busy -= b->size;
		b->busy = false;
		if (!b->kept || b->epoch != pl->epoch)
			drop(pl, i);
		break;
	}
	pthread_mutex_unlock(&pl->mu);
}

void
dp_pool_stats(dp_pool_t *pl, dp_pool_stats_t *out)
{
	pthread_mutex_lock(&pl->mu);
	out->cap = pl->cap;
	out->held = pl->held;
	out->busy = pl->busy;
	out->hits = pl->hits;
	out->made = pl->made;
	out->oneoff = pl->oneoff;
	out->nbufs = 0;
	for (size_t i = 0; i < pl->b.n; i++)
		out->nbufs += pl->b.v[i].kept;
	pthread_mutex_unlock(&pl->mu);
}
