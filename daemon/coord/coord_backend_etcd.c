/*
 * coord_backend_etcd.c - the etcd backend (coord_backend.h): the state
 * document is the value of PREFIX/state, written by the leader only, each
 * write one Txn whose guard is the leader's election key
 * (create_revision(PREFIX/election/LEASE) == the revision it was made at:
 * the key exists, so its lease is alive and this coordinator still leads;
 * etcd's concurrency package fences its leaders the same way).  A guard
 * that fails means another coordinator leads now: this one stops at once
 * (exit status 75, for its supervisor to start it again as a standby),
 * before it tells anyone anything more.  etcd unreachable: the write is
 * refused UNAVAILABLE, naming etcd, and the change with it.  Loop thread
 * only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/coord/coord_backend.h"
#include "rpc/etcd.h"

/* the exit status of a deposed leader (EX_TEMPFAIL: start again) */
#define COORD_EXIT_DEPOSED 75

typedef struct etcd_store {
	etcd_t *e;
	char *key;          /* PREFIX/state */
	char *guard;        /* the election key; NULL: not the leader (yet) */
	int64_t guard_rev;
	char where[512];
} etcd_store_t;

void *
coord_backend_etcd_new(struct etcd *e, const char *prefix)
{
	etcd_store_t *s = xcalloc(1, sizeof(*s));
	size_t n = strlen(prefix) + 8;

	s->e = e;
	s->key = xmalloc(n);
	snprintf(s->key, n, "%s/state", prefix);
	snprintf(s->where, sizeof(s->where), "etcd key %s", s->key);
	return s;
}

void
coord_backend_etcd_fence(void *impl, const char *key, int64_t rev)
{
	etcd_store_t *s = impl;

	free(s->guard);
	s->guard = xstrdup(key);
	s->guard_rev = rev;
}

static refit_status_t
etcd_load(void *impl, char **text, size_t *len, refit_err_t *err)
{
	etcd_store_t *s = impl;
	etcd_kv_t kv;

	*text = NULL;
	*len = 0;
	CHECK(etcd_get(s->e, s->key, &kv, err));
	if (kv.key == NULL)
		return REFIT_ERR_NOT_FOUND;
	*text = kv.value;
	*len = kv.value_len;
	kv.value = NULL;
	etcd_kv_fini(&kv);
	return REFIT_OK;
}

static refit_status_t
etcd_save(void *impl, const char *text, size_t len, refit_err_t *err)
{
	etcd_store_t *s = impl;
	bool ok = false;

	if (s->guard == NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "%s: this coordinator is not "
				     "the leader", s->where);
	CHECK(etcd_put_if(s->e, s->guard, s->guard_rev, s->key, text, len, &ok, err));
	if (!ok) {
		log_errorx("coordinator: deposed: etcd refused the write of %s (election key "
			   "%s created at revision %lld is gone: another coordinator leads); "
			   "stopping now with status %d, for the supervisor to start this one "
			   "again as a standby", s->key, s->guard, (long long)s->guard_rev,
			   COORD_EXIT_DEPOSED);
		_exit(COORD_EXIT_DEPOSED);
	}
	return REFIT_OK;
}

static const char *
etcd_where(void *impl)
{
	return ((etcd_store_t *)impl)->where;
}

static void
etcd_store_free(void *impl)
{
	etcd_store_t *s = impl;

	if (s == NULL)
		return;
	etcd_free(s->e);
	free(s->key);
	free(s->guard);
	free(s);
}

const coord_backend_t coord_backend_etcd = {
	.name = "etcd",
	.load = etcd_load,
	.save = etcd_save,
	.where = etcd_where,
	.free = etcd_store_free,
};
