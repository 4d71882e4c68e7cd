/*
 * delta_base.c - a node's delta bases (see delta_base.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "daemon/node/delta_base.h"

struct delta_store {
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* a table was released */
	uint64_t limit, used;
	uint32_t wait_ms;         /* for a table another slice holds */
	uint64_t clock;           /* ticks at every take: a table's last use */
	uint64_t evictions;       /* tables evicted for another model's room */
	VEC(delta_tab_t *) tabs;
	VEC(char *) evicted;      /* models that lost received bases, unreported */
};

delta_store_t *
delta_store_new(uint64_t limit, uint32_t wait_ms)
{
	delta_store_t *st = xcalloc(1, sizeof(*st));

	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->cv, NULL);
	st->limit = limit;
	st->wait_ms = wait_ms;
	return st;
}

static uint64_t
ent_size(const delta_ent_t *e)
{
	return e->data ? e->bytes + e->nparts * sizeof(*e->tags) : 0;
}

static void
ent_free(delta_store_t *st, delta_ent_t *e)
{
	st->used -= ent_size(e);
	free(e->data);
	free(e->tags);
	memset(e, 0, sizeof(*e));
}

static void
tab_free(delta_store_t *st, delta_tab_t *t)
{
	for (size_t i = 0; i < t->nent; i++)
		ent_free(st, &t->ent[i]);
	free(t->ent);
	free(t->model);
	free(t->digest);
	free(t->peer);
	free(t);
}

void
delta_store_free(delta_store_t *st)
{
	if (st == NULL)
		return;
	for (size_t i = 0; i < st->tabs.n; i++)
		tab_free(st, st->tabs.v[i]);
	VEC_FREE(&st->tabs);
	for (size_t i = 0; i < st->evicted.n; i++)
		free(st->evicted.v[i]);
	VEC_FREE(&st->evicted);
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->cv);
	free(st);
}

uint64_t
delta_store_used(delta_store_t *st)
{
	uint64_t u;

	pthread_mutex_lock(&st->mu);
	u = st->used;
	pthread_mutex_unlock(&st->mu);
	return u;
}

uint64_t
delta_store_limit(delta_store_t *st)
{
	return st->limit;
}

/* (Re)size t's entries to nent, dropping what it held. */
static void
tab_reset(delta_store_t *st, delta_tab_t *t, size_t nent)
{
	for (size_t i = 0; i < t->nent; i++)
		ent_free(st, &t->ent[i]);
	free(t->ent);
	t->ent = xcalloc(nent ? nent : 1, sizeof(*t->ent));
	t->nent = nent;
}

/* The table of (model, digest, peer, out), if any; another plan's tables of
 * the model that no slice holds are dropped. */
static delta_tab_t *
tab_find(delta_store_t *st, const char *model, const char *digest, const char *peer, bool out)
{
	delta_tab_t *t = NULL;

	for (size_t i = 0; i < st->tabs.n;) {
		delta_tab_t *x = st->tabs.v[i];

		if (strcmp(x->model, model) == 0 && strcmp(x->digest, digest) != 0 &&
		    !x->busy) {
			/* another plan of the model: its bases are spent */
			tab_free(st, x);
			st->tabs.v[i] = st->tabs.v[--st->tabs.n];
			continue;
		}
		if (strcmp(x->model, model) == 0 && strcmp(x->digest, digest) == 0 &&
		    strcmp(x->peer, peer) == 0 && x->out == out)
			t = x;
		i++;
	}
	return t;
}

delta_tab_t *
delta_tab_take(delta_store_t *st, const char *model, const char *digest, const char *peer,
	       bool out, size_t nent)
{
	struct timespec until;
	delta_tab_t *t;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += st->wait_ms / 1000;
	until.tv_nsec += (long)(st->wait_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&st->mu);
	while ((t = tab_find(st, model, digest, peer, out)) != NULL && t->busy)
		if (pthread_cond_timedwait(&st->cv, &st->mu, &until) == ETIMEDOUT)
			break;
	if (t != NULL && t->busy) {
		t = NULL;  /* another slice holds it: this one runs without */
	} else if (t != NULL) {
		if (t->nent != nent)
			tab_reset(st, t, nent);
		t->busy = true;
	} else {
		t = xcalloc(1, sizeof(*t));
		t->model = xstrdup(model);
		t->digest = xstrdup(digest);
		t->peer = xstrdup(peer);
		t->out = out;
		tab_reset(st, t, nent);
		t->busy = true;
		VEC_PUSH(&st->tabs, t);
	}
	if (t != NULL)
		t->used_at = ++st->clock;
	pthread_mutex_unlock(&st->mu);
	return t;
}

void
delta_tab_release(delta_store_t *st, delta_tab_t *t)
{
	if (t == NULL)
		return;
	pthread_mutex_lock(&st->mu);
	t->busy = false;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
}

delta_ent_t *
delta_ent_find(delta_tab_t *t, size_t pos, uint64_t bytes, uint32_t nparts)
{
	delta_ent_t *e;

	if (t == NULL || pos >= t->nent)
		return NULL;
	e = &t->ent[pos];
	return e->data && e->bytes == bytes && e->nparts == nparts ? e : NULL;
}

/* Does t hold any base? */
static bool
tab_holds(const delta_tab_t *t)
{
	for (size_t i = 0; i < t->nent; i++)
		if (t->ent[i].data != NULL)
			return true;
	return false;
}

/* Note that model lost received bases (its senders must learn). */
static void
note_evicted(delta_store_t *st, const char *model)
{
	for (size_t i = 0; i < st->evicted.n; i++)
		if (strcmp(st->evicted.v[i], model) == 0)
			return;
	VEC_PUSH(&st->evicted, xstrdup(model));
}

size_t
delta_lru_victim(const delta_tab_t *const *tabs, size_t n, const char *model)
{
	size_t best = SIZE_MAX;

	for (size_t i = 0; i < n; i++) {
		const delta_tab_t *t = tabs[i];

		if (t->busy || strcmp(t->model, model) == 0 || !tab_holds(t))
			continue;
		if (best == SIZE_MAX || t->used_at < tabs[best]->used_at)
			best = i;
	}
	return best;
}

/* Free at least need bytes (st->mu held) by dropping the least recently
 * used tables of other models that no slice holds; fewer when none is
 * left.  A table no slice holds has no reader. */
static void
evict(delta_store_t *st, const char *model, uint64_t need)
{
	uint64_t freed = 0;
	size_t i;

	while (freed < need && (i = delta_lru_victim((const delta_tab_t *const *)st->tabs.v,
						     st->tabs.n, model)) != SIZE_MAX) {
		delta_tab_t *x = st->tabs.v[i];
		uint64_t before = st->used;

		if (!x->out)
			note_evicted(st, x->model);
		tab_free(st, x);
		st->tabs.v[i] = st->tabs.v[--st->tabs.n];
		freed += before - st->used;
		st->evictions++;
	}
}

uint64_t
delta_store_evictions(delta_store_t *st)
{
	uint64_t n;

	pthread_mutex_lock(&st->mu);
	n = st->evictions;
	pthread_mutex_unlock(&st->mu);
	return n;
}

char **
delta_store_take_evicted(delta_store_t *st, size_t *n)
{
	char **v;

	pthread_mutex_lock(&st->mu);
	*n = st->evicted.n;
	v = st->evicted.v;
	memset(&st->evicted, 0, sizeof(st->evicted));
	pthread_mutex_unlock(&st->mu);
	return v;
}

delta_ent_t *
delta_ent_get(delta_store_t *st, delta_tab_t *t, size_t pos, uint64_t bytes, uint32_t nparts)
{
	delta_ent_t *e = delta_ent_find(t, pos, bytes, nparts), want;

	if (e != NULL || t == NULL || pos >= t->nent)
		return e;
	e = &t->ent[pos];
	want = (delta_ent_t){(uint8_t *)1, bytes, NULL, nparts};
	pthread_mutex_lock(&st->mu);
	ent_free(st, e);
	if (st->used + ent_size(&want) > st->limit)
		evict(st, t->model, st->used + ent_size(&want) - st->limit);
	if (st->used + ent_size(&want) > st->limit) {
		pthread_mutex_unlock(&st->mu);
		return NULL;
	}
	st->used += ent_size(&want);
	pthread_mutex_unlock(&st->mu);
	e->data = xcalloc(bytes ? bytes : 1, 1);
	e->tags = xcalloc(nparts ? nparts : 1, sizeof(*e->tags));
	e->bytes = bytes;
	e->nparts = nparts;
	return e;
}
