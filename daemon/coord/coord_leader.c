/*
 * coord_leader.c - leader election among coordinators over etcd
 * (state_store "etcd", docs/ha.md), the way etcd's concurrency package
 * campaigns: each coordinator holds a lease of etcd_lease_ttl_ms and, under
 * it, the key PREFIX/election/<lease id in hex> whose value is the address
 * it advertises; the key with the lowest create revision leads.  A
 * thread of its own (its own etcd client) keeps the lease alive (every
 * third of the TTL) and looks every 100 ms who leads (a Range sorted by
 * create revision, limit 1; polled, not watched).
 *
 * Becoming the leader: the state store is fenced by this key (every write
 * a Txn guarded by its create revision, coord_backend_etcd.c), then the
 * loop loads the state from etcd (a new epoch generation) and opens the
 * Coordinator service.  Until then every Coordinator call is answered
 * UNAVAILABLE "not the leader: ADDR" (ADDR: the leader's advertised
 * address, or "none elected yet"), which nodes and refitctl follow.
 *
 * Losing it (etcd says the lease is gone, or another key leads while this
 * one thought it led): the process stops at once with status 75 -- as
 * Kubernetes' controllers do on a lost lease -- for its supervisor to start
 * it again as a standby; nothing it held in memory is trusted.  etcd
 * unreachable is not a loss: the lease is etcd's to expire, and every
 * write is fenced anyway (it fails UNAVAILABLE meanwhile).  A graceful
 * stop revokes the lease: a standby takes over at once.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/coord/coord_backend.h"
#include "daemon/coord/coord_internal.h"
#include "rpc/etcd.h"

#define POLL_MS 100
#define ETCD_CALL_MS 1000
#define COORD_EXIT_LOST 75

struct coord_leader {
	coord_t *c;
	etcd_t *e;                  /* the thread's client */
	char *prefix, *addr;
	char key[256];              /* PREFIX/election/<lease> */
	int64_t ttl_s, lease, rev;
	void *store;                /* the etcd backend to fence */
	pthread_t th;
	bool started;               /* th runs */
	atomic_bool stop;
	atomic_bool won;            /* the thread saw this key lead */
	pthread_mutex_t mu;
	char leader[256];           /* under mu: who leads ("": none) */
	char seen_key[256];         /* the thread's: the leading key look() saw last */
	uint64_t seen_ms;           /* when that key was first seen leading */
	uint64_t read_ms;           /* the last look() etcd answered */
	unsigned read_fails;        /* look()s failed since */
	uv_async_t async;
	uv_timer_t retry;           /* loading the state again after a failure */
	int open_handles;           /* closing: async and retry not closed yet */
};

static uint64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

static void
set_leader(coord_leader_t *l, const char *addr)
{
	pthread_mutex_lock(&l->mu);
	snprintf(l->leader, sizeof(l->leader), "%s", addr);
	pthread_mutex_unlock(&l->mu);
}

static void __attribute__((noreturn))
lost(const char *why)
{
	log_errorx("coordinator: leadership lost (%s): stopping now with status %d, for the "
		   "supervisor to start this coordinator again as a standby", why,
		   COORD_EXIT_LOST);
	_exit(COORD_EXIT_LOST);
}

/* A lease and the election key under it; false (logged) when etcd failed. */
static bool
campaign(coord_leader_t *l)
{
	refit_err_t err;

	refit_err_clear(&err);
	if (etcd_lease_grant(l->e, l->ttl_s, &l->lease, &err) != REFIT_OK) {
		log_warnx("coordinator: election: %s", err.msg);
		return false;
	}
	snprintf(l->key, sizeof(l->key), "%s/election/%016" PRIx64, l->prefix,
		 (uint64_t)l->lease);
	if (etcd_create(l->e, l->key, l->addr, l->lease, &l->rev, &err) != REFIT_OK) {
		log_warnx("coordinator: election: %s", err.msg);
		l->lease = 0;
		return false;
	}
	log_info("coordinator: campaigning as %s (etcd key %s, revision %" PRId64 ", lease "
		 "TTL %" PRId64 " s)", l->addr, l->key, l->rev, l->ttl_s);
	return true;
}

/* Renew the lease; false when etcd says it is gone. */
static bool
keep_alive(coord_leader_t *l)
{
	refit_err_t err;
	int64_t ttl = 0;

	refit_err_clear(&err);
	if (etcd_lease_keepalive(l->e, l->lease, &ttl, &err) != REFIT_OK) {
		log_warnx("coordinator: election: keeping the lease alive: %s", err.msg);
		return true;  /* unreachable: etcd decides, and writes are fenced */
	}
	return ttl > 0;
}

/* The leading key changed (key NULL: none): logged with how long the
 * previous one led as this coordinator saw it -- a dead leader's key kept
 * past its lease TTL shows here. */
static void
seen(coord_leader_t *l, const etcd_kv_t *kv)
{
	const char *key = kv->key ? kv->key : "";
	uint64_t now = mono_ms();
	char before[320] = "";

	if (strcmp(key, l->seen_key) == 0)
		return;
	if (l->seen_ms != 0)
		snprintf(before, sizeof(before), " (before: %s for %" PRIu64 " ms)",
			 l->seen_key[0] ? l->seen_key : "no key", now - l->seen_ms);
	if (kv->key)
		log_info("coordinator: election: %s leads (etcd key %s, revision %" PRId64
			 ", lease %016" PRIx64 ")%s", kv->value, kv->key, kv->create_rev,
			 (uint64_t)kv->lease, before);
	else
		log_info("coordinator: election: no election key in etcd%s", before);
	snprintf(l->seen_key, sizeof(l->seen_key), "%s", key);
	l->seen_ms = now;
}

/* look() got no answer: logged once a streak; past the lease TTL a
 * standby stops naming the leader it saw last (it may be long dead: its
 * callers try the other coordinators instead of a stale address). */
static void
read_failed(coord_leader_t *l, const refit_err_t *err)
{
	uint64_t now = mono_ms();

	if (l->read_fails++ == 0)
		log_warnx("coordinator: election: reading who leads: %s", err->msg);
	if (atomic_load(&l->won) || l->seen_key[0] == '\0' ||
	    now - l->read_ms < (uint64_t)l->ttl_s * 1000)
		return;
	log_warnx("coordinator: election: etcd unread for %" PRIu64 " ms (%u tries): no longer "
		  "naming the leader seen last (etcd key %s)", now - l->read_ms, l->read_fails,
		  l->seen_key);
	l->seen_key[0] = '\0';
	l->seen_ms = now;
	set_leader(l, "");
}

/* Who leads now: this key (won) or another's address. */
static void
look(coord_leader_t *l)
{
	char prefix[300];
	etcd_kv_t kv;
	refit_err_t err;

	refit_err_clear(&err);
	snprintf(prefix, sizeof(prefix), "%s/election/", l->prefix);
	if (etcd_first_created(l->e, prefix, &kv, &err) != REFIT_OK) {
		read_failed(l, &err);
		return;
	}
	if (l->read_fails > 0)
		log_info("coordinator: election: etcd answers again (after %u failed reads)",
			 l->read_fails);
	l->read_fails = 0;
	l->read_ms = mono_ms();
	seen(l, &kv);
	if (kv.key != NULL && strcmp(kv.key, l->key) == 0) {
		if (!atomic_load(&l->won)) {
			coord_backend_etcd_fence(l->store, l->key, l->rev);
			atomic_store(&l->won, true);
			set_leader(l, l->addr);
			uv_async_send(&l->async);
		}
	} else {
		if (atomic_load(&l->won))
			lost(kv.key ? "another coordinator's election key leads" :
			     "this coordinator's election key is gone");
		set_leader(l, kv.key ? kv.value : "");
	}
	etcd_kv_fini(&kv);
}

static void *
run(void *arg)
{
	coord_leader_t *l = arg;
	uint64_t next_ka = 0;

	while (!atomic_load(&l->stop)) {
		uint64_t now = mono_ms();

		if (l->lease == 0) {
			if (!campaign(l)) {
				sleep_ms(200);
				continue;
			}
			next_ka = now + (uint64_t)l->ttl_s * 1000 / 3;
		} else if (now >= next_ka) {
			if (!keep_alive(l)) {
				if (atomic_load(&l->won))
					lost("etcd says its lease expired");
				log_warnx("coordinator: election: lease expired: campaigning again");
				l->lease = 0;
				continue;
			}
			next_ka = now + (uint64_t)l->ttl_s * 1000 / 3;
		}
		look(l);
		sleep_ms(POLL_MS);
	}
	return NULL;
}

/* ---- loop side ---- */

static void on_retry(uv_timer_t *t);

/* The thread saw this coordinator lead: load the state, then serve. */
static void
on_won(uv_async_t *a)
{
	coord_leader_t *l = a->data;
	coord_t *c = l->c;
	refit_err_t err;

	if (!atomic_load(&l->won) || c->leading || c->closing)
		return;
	refit_err_clear(&err);
	if (coord_state_load(c, &err) != REFIT_OK) {
		log_warnx("coordinator: elected, but the state cannot be loaded: %s (again in "
			  "500 ms)", err.msg);
		uv_timer_start(&l->retry, on_retry, 500, 0);
		return;
	}
	c->leading = true;
	coord_leader_changed(c);
	log_info("coordinator: leading as %s (etcd key %s): %zu models loaded, epoch %" PRIu64,
		 l->addr, l->key, c->models.n, c->epoch);
}

static void
on_retry(uv_timer_t *t)
{
	coord_leader_t *l = t->data;

	on_won(&l->async);
}

static void
leader_free(coord_leader_t *l)
{
	etcd_free(l->e);
	pthread_mutex_destroy(&l->mu);
	free(l->prefix);
	free(l->addr);
	free(l);
}

coord_leader_t *
coord_leader_start(coord_t *c, const coord_opts_t *o, void *store, refit_err_t *err)
{
	coord_leader_t *l = xcalloc(1, sizeof(*l));

	l->c = c;
	l->store = store;
	l->prefix = xstrdup(o->etcd_prefix ? o->etcd_prefix : "/refit");
	l->addr = xstrdup(o->advertise ? o->advertise : "");
	l->ttl_s = ((int64_t)o->etcd_lease_ttl_ms + 999) / 1000;
	if (l->ttl_s < 1)
		l->ttl_s = 1;
	pthread_mutex_init(&l->mu, NULL);
	if ((l->e = etcd_new(o->etcd_endpoints, ETCD_CALL_MS, &o->etcd_tls, err)) == NULL) {
		leader_free(l);
		return NULL;
	}
	uv_async_init(c->loop, &l->async, on_won);
	l->async.data = l;
	uv_timer_init(c->loop, &l->retry);
	l->retry.data = l;
	l->started = pthread_create(&l->th, NULL, run, l) == 0;
	if (!l->started)
		log_errorx("coordinator: cannot start the election thread: a standby forever");
	return l;
}

void
coord_leader_addr(coord_leader_t *l, char *buf, size_t n)
{
	pthread_mutex_lock(&l->mu);
	snprintf(buf, n, "%s", l->leader[0] ? l->leader : "none elected yet");
	pthread_mutex_unlock(&l->mu);
}

/* Both handles closed: free l, then c may go (coord_maybe_free). */
static void
on_closed(uv_handle_t *h)
{
	coord_leader_t *l = h->data;
	coord_t *c = l->c;

	if (--l->open_handles > 0)
		return;
	leader_free(l);
	c->leader = NULL;
	coord_maybe_free(c);
}

void
coord_leader_stop(coord_leader_t *l)
{
	refit_err_t err;

	atomic_store(&l->stop, true);
	if (l->started)
		pthread_join(l->th, NULL);
	refit_err_clear(&err);
	if (l->lease != 0 && etcd_lease_revoke(l->e, l->lease, &err) == REFIT_OK)
		log_info("coordinator: lease revoked: %s", atomic_load(&l->won) ?
			 "a standby takes over now" : "no longer a candidate");
	l->open_handles = 2;
	uv_close((uv_handle_t *)&l->async, on_closed);
	uv_close((uv_handle_t *)&l->retry, on_closed);
}
