/*
 * coord_backend_etcd.c - the etcd backend (coord_backend.h): the state
 * document is stored in content-defined chunks (coord_chunks.h), each
 * immutable under PREFIX/chunks/SHA256, named in order by a small manifest,
 * the value of PREFIX/state.  Written by the leader only, every write a Txn
 * whose guard is the leader's election key (create_revision(PREFIX/
 * election/LEASE) == the revision it was made at: the key exists, so its
 * lease is alive and this coordinator still leads; etcd's concurrency
 * package fences its leaders the same way).  A guard that fails means
 * another coordinator leads now: this one stops at once (exit status 75,
 * for its supervisor to start it again as a standby), before it tells
 * anyone anything more.  etcd unreachable: the write is refused
 * UNAVAILABLE, naming etcd, and the change with it.
 *
 * A save puts the chunks not stored yet, then the manifest (the commit
 * point), then deletes the chunks the old manifest named and the new one
 * does not: in this order, in as few Txns of at most chunk_max bytes as
 * fit (a small document: one Txn).  A crash anywhere
 * leaves the old manifest and every chunk it names in place; chunks a
 * crashed save left unnamed are deleted by the next leader once it loaded
 * the state.  A load verifies each chunk's digest and the whole's, and
 * refuses naming the key when anything is missing or wrong.  A plain
 * document in PREFIX/state (one starting with '{', as written before the
 * chunks) still loads; the next save stores it in chunks.  Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/strmap.h"
#include "daemon/coord/coord_backend.h"
#include "daemon/coord/coord_chunks.h"
#include "rpc/etcd.h"

/* the exit status of a deposed leader (EX_TEMPFAIL: start again) */
#define COORD_EXIT_DEPOSED 75
/* operations per Txn (etcd's --max-txn-ops is 128 by default) */
#define TXN_OPS 64

typedef struct etcd_store {
	etcd_t *e;
	char *key;          /* PREFIX/state */
	char *chunks;       /* PREFIX/chunks/ */
	size_t chunk_max;
	char *guard;        /* the election key; NULL: not the leader (yet) */
	int64_t guard_rev;
	strmap_t stored;    /* the chunks the current manifest names (stored) */
	bool gc;            /* look for unnamed chunks at the next chance */
	char where[512];
} etcd_store_t;

void *
coord_backend_etcd_new(struct etcd *e, const char *prefix, size_t chunk_max)
{
	etcd_store_t *s = xcalloc(1, sizeof(*s));
	size_t n = strlen(prefix) + 16;

	s->e = e;
	s->key = xmalloc(n);
	snprintf(s->key, n, "%s/state", prefix);
	s->chunks = xmalloc(n);
	snprintf(s->chunks, n, "%s/chunks/", prefix);
	s->chunk_max = chunk_max ? chunk_max : COORD_CHUNK_MAX_DEFAULT;
	strmap_init(&s->stored);
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

static void __attribute__((noreturn))
deposed(etcd_store_t *s, const char *what)
{
	log_errorx("coordinator: deposed: etcd refused the write of %s (election key %s "
		   "created at revision %lld is gone: another coordinator leads); stopping now "
		   "with status %d, for the supervisor to start this one again as a standby",
		   what, s->guard, (long long)s->guard_rev, COORD_EXIT_DEPOSED);
	_exit(COORD_EXIT_DEPOSED);
}

static char *
chunk_key(const etcd_store_t *s, const char *hex)
{
	size_t n = strlen(s->chunks) + SHA256_HEX_LEN;
	char *k = xmalloc(n);

	snprintf(k, n, "%s%s", s->chunks, hex);
	return k;
}

/* Run ops[0..n) in order, in guarded Txns of at most TXN_OPS operations
 * and about chunk_max bytes each (a value alone may reach chunk_max);
 * *done: how many are done (the Txns that succeeded). */
static refit_status_t
txns(etcd_store_t *s, const etcd_op_t *ops, size_t n, size_t *done, refit_err_t *err)
{
	size_t i = 0;

	*done = 0;
	while (i < n) {
		size_t j = i, bytes = 0;
		bool ok = false;

		while (j < n && j - i < TXN_OPS && (j == i || bytes + ops[j].len <= s->chunk_max))
			bytes += ops[j++].len;
		CHECK(etcd_txn_if(s->e, s->guard, s->guard_rev, ops + i, j - i, &ok, err));
		if (!ok)
			deposed(s, ops[i].key);
		*done = i = j;
	}
	return REFIT_OK;
}

/* Delete the keys of chunks (keys[0..n), full keys) the manifest m does not name. */
static refit_status_t
delete_unnamed(etcd_store_t *s, const strmap_t *named, char **keys, size_t n, size_t *gone,
	       refit_err_t *err)
{
	etcd_op_t *ops = xcalloc(n ? n : 1, sizeof(*ops));
	size_t k = 0, plen = strlen(s->chunks);
	refit_status_t rc;

	for (size_t i = 0; i < n; i++)
		if (strncmp(keys[i], s->chunks, plen) == 0 &&
		    strmap_get(named, keys[i] + plen) < 0) {
			ops[k].key = keys[i];
			ops[k++].del = true;
		}
	rc = txns(s, ops, k, gone, err);
	free(ops);
	return rc;
}

/* Every key under PREFIX/chunks/ that named does not name: deleted. */
static refit_status_t
collect(etcd_store_t *s, const strmap_t *named, size_t *gone, refit_err_t *err)
{
	char **keys = NULL;
	size_t n = 0;
	refit_status_t rc;

	*gone = 0;
	CHECK(etcd_keys(s->e, s->chunks, &keys, &n, err));
	rc = delete_unnamed(s, named, keys, n, gone, err);
	for (size_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	if (rc == REFIT_OK)
		s->gc = false;
	return rc;
}

static void
collect_logged(etcd_store_t *s, const strmap_t *named)
{
	refit_err_t err = {0};
	size_t gone = 0;

	if (collect(s, named, &gone, &err) != REFIT_OK)
		log_warnx("coordinator: %s: unnamed chunks not deleted (again later): %s",
			  s->where, err.msg);
	else if (gone > 0)
		log_info("coordinator: %s: %zu chunk(s) no manifest names deleted (left by a "
			 "save cut short)", s->where, gone);
}

static void
named_set(strmap_t *set, const coord_manifest_t *m)
{
	strmap_fini(set);
	strmap_init(set);
	for (size_t i = 0; i < m->n; i++)
		strmap_put(set, m->chunks[i].hex, 1);
}

/* One chunk of the manifest, read and checked, appended at doc + *off. */
static refit_status_t
load_chunk(etcd_store_t *s, const coord_manifest_t *m, size_t i, char *doc, size_t *off,
	   refit_err_t *err)
{
	char *k = chunk_key(s, m->chunks[i].hex), hex[SHA256_HEX_LEN];
	etcd_kv_t kv;
	refit_status_t rc = REFIT_OK;

	if (etcd_get(s->e, k, &kv, err) != REFIT_OK) {
		free(k);
		return err->status;
	}
	if (kv.key == NULL)
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "etcd key %s (chunk %zu of %zu "
				   "that %s names) is missing: the state is not loaded", k, i + 1,
				   m->n, s->key);
	else if (kv.value_len != m->chunks[i].len ||
		 (sha256_hex(kv.value, kv.value_len, hex), strcmp(hex, m->chunks[i].hex) != 0))
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "etcd key %s (chunk %zu of %zu "
				   "that %s names) is corrupt: %zu bytes with sha256 %s, not %zu "
				   "bytes with the digest its name says: the state is not loaded",
				   k, i + 1, m->n, s->key, kv.value_len,
				   kv.value_len != m->chunks[i].len ? "(not computed)" : hex,
				   m->chunks[i].len);
	else {
		memcpy(doc + *off, kv.value, kv.value_len);
		*off += kv.value_len;
	}
	etcd_kv_fini(&kv);
	free(k);
	return rc;
}

static refit_status_t
load_chunks(etcd_store_t *s, const char *mtext, size_t mlen, char **text, size_t *len,
	    refit_err_t *err)
{
	coord_manifest_t m;
	char *doc;
	size_t off = 0;

	CHECK(coord_manifest_parse(mtext, mlen, s->where, &m, err));
	doc = xmalloc(m.length + 1);
	for (size_t i = 0; i < m.n; i++)
		if (load_chunk(s, &m, i, doc, &off, err) != REFIT_OK) {
			free(doc);
			coord_manifest_fini(&m);
			return err->status;
		}
	doc[off] = '\0';
	if (coord_manifest_verify(&m, doc, off, s->where, err) != REFIT_OK) {
		free(doc);
		coord_manifest_fini(&m);
		return err->status;
	}
	named_set(&s->stored, &m);
	log_info("coordinator: %s: %zu bytes loaded from %zu chunk(s)", s->where, off, m.n);
	coord_manifest_fini(&m);
	*text = doc;
	*len = off;
	return REFIT_OK;
}

static refit_status_t
etcd_load(void *impl, char **text, size_t *len, refit_err_t *err)
{
	etcd_store_t *s = impl;
	etcd_kv_t kv;
	refit_status_t rc;

	*text = NULL;
	*len = 0;
	CHECK(etcd_get(s->e, s->key, &kv, err));
	if (kv.key == NULL)
		return REFIT_ERR_NOT_FOUND;
	if (kv.value_len > 0 && kv.value[0] == '{') {
		/* a plain document, as written before the chunks */
		*text = kv.value;
		*len = kv.value_len;
		kv.value = NULL;
		etcd_kv_fini(&kv);
		strmap_fini(&s->stored);
		strmap_init(&s->stored);
		s->gc = true;
		log_info("coordinator: %s holds a plain document (%zu bytes): the next save "
			 "stores it in chunks", s->where, *len);
		return REFIT_OK;
	}
	rc = load_chunks(s, kv.value, kv.value_len, text, len, err);
	etcd_kv_fini(&kv);
	if (rc != REFIT_OK)
		return rc;
	/* chunks a save cut short left behind: deleted now by the leader */
	s->gc = true;
	if (s->guard != NULL)
		collect_logged(s, &s->stored);
	return REFIT_OK;
}

/* The puts of the chunks of m not stored yet (each once). */
static size_t
new_chunks(etcd_store_t *s, const coord_manifest_t *m, const char *text, etcd_op_t *ops,
	   char **keys)
{
	strmap_t queued;
	size_t n = 0, off = 0;

	strmap_init(&queued);
	for (size_t i = 0; i < m->n; off += m->chunks[i++].len) {
		if (strmap_get(&s->stored, m->chunks[i].hex) >= 0 ||
		    strmap_get(&queued, m->chunks[i].hex) >= 0)
			continue;
		strmap_put(&queued, m->chunks[i].hex, 1);
		keys[n] = chunk_key(s, m->chunks[i].hex);
		ops[n].key = keys[n];
		ops[n].value = text + off;
		ops[n++].len = m->chunks[i].len;
	}
	strmap_fini(&queued);
	return n;
}

/* The deletes of the chunks stored now that named does not name, from ops[n]
 * (keys: heap, from keys[n]); returns the new n. */
static size_t
old_chunks(const etcd_store_t *s, const strmap_t *named, etcd_op_t *ops, char **keys, size_t n)
{
	for (size_t i = 0; i < s->stored.cap; i++)
		if (s->stored.keys[i] != NULL && strmap_get(named, s->stored.keys[i]) < 0) {
			keys[n] = chunk_key(s, s->stored.keys[i]);
			ops[n].key = keys[n];
			ops[n++].del = true;
		}
	return n;
}

/*
 * One save, its operations in this order: the chunks not stored yet, the
 * manifest (the commit point), the deletes of the chunks it no longer
 * names; as few Txns as the bounds allow (a small document: one), run in
 * order, so a chunk is never named before it is stored nor deleted before
 * a manifest that does not name it is committed.
 */
static refit_status_t
etcd_save(void *impl, const char *text, size_t len, refit_err_t *err)
{
	etcd_store_t *s = impl;
	coord_manifest_t m;
	strmap_t named;
	etcd_op_t *ops;
	char **keys, *mtext;
	size_t n, man, mlen, done = 0;
	refit_status_t rc;

	if (s->guard == NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "%s: this coordinator is not "
				     "the leader", s->where);
	coord_manifest_make(text, len, s->chunk_max, &m);
	strmap_init(&named);
	named_set(&named, &m);
	ops = xcalloc(m.n + s->stored.n + 1, sizeof(*ops));
	keys = xcalloc(m.n + s->stored.n + 1, sizeof(*keys));
	man = new_chunks(s, &m, text, ops, keys);
	mtext = coord_manifest_text(&m, &mlen);
	ops[man].key = s->key;
	ops[man].value = mtext;
	ops[man].len = mlen;
	n = s->gc ? man + 1 : old_chunks(s, &named, ops, keys, man + 1);
	rc = txns(s, ops, n, &done, err);
	if (done > man) {
		/* committed: the new document is the state */
		if (rc != REFIT_OK) {
			log_warnx("coordinator: %s: saved, but old chunks not deleted (again "
				  "later): %s", s->where, err->msg);
			refit_err_clear(err);
			rc = REFIT_OK;
			s->gc = true;
		}
		if (s->gc)
			collect_logged(s, &named);
		strmap_fini(&s->stored);
		s->stored = named;
	} else {
		s->gc = true; /* chunks may be stored that no manifest names */
		strmap_fini(&named);
	}
	for (size_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(ops);
	free(mtext);
	coord_manifest_fini(&m);
	return rc;
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
	free(s->chunks);
	strmap_fini(&s->stored);
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
