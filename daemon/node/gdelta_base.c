/*
 * gdelta_base.c - a node's delta bases on its devices (see gdelta_base.h).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "daemon/node/gdelta_base.h"

typedef struct rank_use {
	int32_t rank;
	uint64_t used;
} rank_use_t;

struct gdelta_store {
	pthread_mutex_t mu;       /* the figures (/metrics reads them) */
	uint64_t limit;           /* per rank */
	uint64_t used;            /* every rank's */
	uint64_t epoch;
	bool have_epoch;
	uint64_t clock;           /* ticks at every find and get: last use */
	uint64_t evictions;       /* bases evicted for another model's room */
	VEC(gdelta_ent_t *) ents;
	VEC(char *) evicted;      /* models that lost received bases, unreported */
	VEC(rank_use_t) ranks;
};

gdelta_store_t *
gdelta_store_new(uint64_t limit)
{
	gdelta_store_t *st = xcalloc(1, sizeof(*st));

	pthread_mutex_init(&st->mu, NULL);
	st->limit = limit;
	return st;
}

static void
ent_free(gdelta_ent_t *e)
{
	free(e->model);
	free(e->digest);
	free(e->peer);
	free(e);
}

void
gdelta_store_free(gdelta_store_t *st)
{
	if (st == NULL)
		return;
	for (size_t i = 0; i < st->ents.n; i++)
		ent_free(st->ents.v[i]);
	VEC_FREE(&st->ents);
	VEC_FREE(&st->ranks);
	for (size_t i = 0; i < st->evicted.n; i++)
		free(st->evicted.v[i]);
	VEC_FREE(&st->evicted);
	pthread_mutex_destroy(&st->mu);
	free(st);
}

uint64_t
gdelta_store_used(gdelta_store_t *st)
{
	uint64_t u;

	pthread_mutex_lock(&st->mu);
	u = st->used;
	pthread_mutex_unlock(&st->mu);
	return u;
}

uint64_t
gdelta_store_limit(gdelta_store_t *st)
{
	return st->limit;
}

size_t
gdelta_store_count(gdelta_store_t *st)
{
	size_t n;

	pthread_mutex_lock(&st->mu);
	n = st->ents.n;
	pthread_mutex_unlock(&st->mu);
	return n;
}

static rank_use_t *
use_of(gdelta_store_t *st, int32_t rank)
{
	for (size_t i = 0; i < st->ranks.n; i++)
		if (st->ranks.v[i].rank == rank)
			return &st->ranks.v[i];
	VEC_PUSH(&st->ranks, ((rank_use_t){rank, 0}));
	return &st->ranks.v[st->ranks.n - 1];
}

/* Entry i given back to dev (NULL: its arena is gone) and forgotten. */
static void
remove_at(gdelta_store_t *st, const dp_dev_ops_t *dev, size_t i)
{
	gdelta_ent_t *e = st->ents.v[i];

	if (dev != NULL)
		dev->free(dev->ctx, e->rank, e->data);
	pthread_mutex_lock(&st->mu);
	use_of(st, e->rank)->used -= e->bytes;
	st->used -= e->bytes;
	st->ents.v[i] = st->ents.v[--st->ents.n];
	pthread_mutex_unlock(&st->mu);
	ent_free(e);
}

void
gdelta_begin(gdelta_store_t *st, const dp_dev_ops_t *dev, uint64_t epoch, const char *model,
	     const char *digest)
{
	bool stale = st->have_epoch && st->epoch != epoch;

	for (size_t i = st->ents.n; i-- > 0;) {
		const gdelta_ent_t *e = st->ents.v[i];

		if (stale || (strcmp(e->model, model) == 0 && strcmp(e->digest, digest) != 0))
			remove_at(st, dev, i);
	}
	st->epoch = epoch;
	st->have_epoch = true;
}

void
gdelta_drop_all(gdelta_store_t *st, const dp_dev_ops_t *dev)
{
	while (st->ents.n > 0)
		remove_at(st, dev, st->ents.n - 1);
}

static size_t
index_of(gdelta_store_t *st, const char *model, const char *digest, const char *peer, bool out,
	 size_t pos)
{
	for (size_t i = 0; i < st->ents.n; i++) {
		const gdelta_ent_t *e = st->ents.v[i];

		if (e->out == out && e->pos == pos && strcmp(e->peer, peer) == 0 &&
		    strcmp(e->model, model) == 0 && strcmp(e->digest, digest) == 0)
			return i;
	}
	return SIZE_MAX;
}

gdelta_ent_t *
gdelta_find(gdelta_store_t *st, const char *model, const char *digest, const char *peer,
	    bool out, size_t pos, int32_t rank, uint64_t bytes, uint64_t tag)
{
	size_t i = index_of(st, model, digest, peer, out, pos);
	gdelta_ent_t *e;

	if (i == SIZE_MAX)
		return NULL;
	e = st->ents.v[i];
	if (e->rank != rank || e->bytes != bytes || e->tag == 0 || (tag && e->tag != tag))
		return NULL;
	e->used_at = ++st->clock;
	return e;
}

size_t
gdelta_lru_victim(const gdelta_ent_t *const *ents, size_t n, const char *model, int32_t rank)
{
	size_t best = SIZE_MAX;

	for (size_t i = 0; i < n; i++) {
		const gdelta_ent_t *e = ents[i];

		if (e->rank != rank || strcmp(e->model, model) == 0)
			continue;
		if (best == SIZE_MAX || e->used_at < ents[best]->used_at)
			best = i;
	}
	return best;
}

/* Room for bytes on rank by giving back the least recently used bases of
 * other models there (the running slice's model is never touched). */
static void
evict(gdelta_store_t *st, const dp_dev_ops_t *dev, const char *model, int32_t rank,
      uint64_t bytes)
{
	size_t i;

	while (use_of(st, rank)->used > st->limit - bytes &&
	       (i = gdelta_lru_victim((const gdelta_ent_t *const *)st->ents.v, st->ents.n,
				      model, rank)) != SIZE_MAX) {
		const gdelta_ent_t *e = st->ents.v[i];
		bool seen = false;

		for (size_t k = 0; k < st->evicted.n && !e->out; k++)
			seen |= strcmp(st->evicted.v[k], e->model) == 0;
		if (!e->out && !seen)
			VEC_PUSH(&st->evicted, xstrdup(e->model));
		remove_at(st, dev, i);
		pthread_mutex_lock(&st->mu);
		st->evictions++;
		pthread_mutex_unlock(&st->mu);
	}
}

uint64_t
gdelta_store_evictions(gdelta_store_t *st)
{
	uint64_t n;

	pthread_mutex_lock(&st->mu);
	n = st->evictions;
	pthread_mutex_unlock(&st->mu);
	return n;
}

char **
gdelta_store_take_evicted(gdelta_store_t *st, size_t *n)
{
	char **v;

	pthread_mutex_lock(&st->mu);
	*n = st->evicted.n;
	v = st->evicted.v;
	memset(&st->evicted, 0, sizeof(st->evicted));
	pthread_mutex_unlock(&st->mu);
	return v;
}

gdelta_ent_t *
gdelta_get(gdelta_store_t *st, const dp_dev_ops_t *dev, const char *model, const char *digest,
	   const char *peer, bool out, size_t pos, int32_t rank, uint64_t bytes)
{
	size_t i = index_of(st, model, digest, peer, out, pos);
	gdelta_ent_t *e;
	uint8_t *p;

	if (i != SIZE_MAX) {
		if (st->ents.v[i]->rank == rank && st->ents.v[i]->bytes == bytes) {
			st->ents.v[i]->used_at = ++st->clock;
			return st->ents.v[i];
		}
		remove_at(st, dev, i);
	}
	if (bytes != 0 && bytes <= st->limit)
		evict(st, dev, model, rank, bytes);
	if (bytes == 0 || bytes > st->limit || use_of(st, rank)->used > st->limit - bytes)
		return NULL;
	if ((p = dp_dev_alloc_top(dev, rank, bytes)) == NULL)
		return NULL;
	e = xcalloc(1, sizeof(*e));
	e->model = xstrdup(model);
	e->digest = xstrdup(digest);
	e->peer = xstrdup(peer);
	e->out = out;
	e->pos = pos;
	e->rank = rank;
	e->bytes = bytes;
	e->data = p;
	e->used_at = ++st->clock;
	pthread_mutex_lock(&st->mu);
	VEC_PUSH(&st->ents, e);
	use_of(st, rank)->used += bytes;
	st->used += bytes;
	pthread_mutex_unlock(&st->mu);
	return e;
}

void
gdelta_drop(gdelta_store_t *st, const dp_dev_ops_t *dev, gdelta_ent_t *e)
{
	for (size_t i = 0; i < st->ents.n; i++)
		if (st->ents.v[i] == e) {
			remove_at(st, dev, i);
			return;
		}
}
