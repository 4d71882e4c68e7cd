/*
 * coord_leader.c - leader election among coordinators over etcd
 * (state_store "etcd", docs/ha.md), the way etcd's concurrency package
 * campaigns: each coordinator holds a lease of etcd_lease_ttl_ms and, under
 * it, the key PREFIX/election/<lease id in hex> whose value is the address
 * it advertises; the key with the lowest create revision leads.  A
 * thread of its own (its own etcd client) keeps the lease alive (every
 * third of the TTL) and reads who leads (a Range sorted by create
 * revision, limit 1) when etcd says something under PREFIX/election/
 * changed: a Watch (rpc/etcd_watch.c, a gRPC stream on the same client's
 * channels) from the revision of the Range that read the leader, + 1, so
 * that no change between the read and the watch is missed.  The thread
 * waits on the stream between keep-alives, one answer at a time; every
 * third of the TTL it asks etcd for a progress answer, and a stream that
 * does not answer within WATCH_ANSWER_MS, ends (an etcd member stopped or
 * cut off from its cluster: "hasleader"), or is canceled (its revision
 * compacted away) is lost: who leads is read again and the watch opened
 * again (on the next endpoint after a failure).  While no watch stands,
 * the thread reads every 100 ms, as it did before the watch.
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
#include "rpc/etcd_watch.h"

#define POLL_MS 100            /* reading who leads while no watch stands */
#define ETCD_CALL_MS 1000
#define WATCH_ANSWER_MS 2000   /* a watch request unanswered this long: lost */
#define WATCH_RETRY_MS 1000    /* after a watch that never started */
#define WAIT_MAX_MS 250        /* the thread looks at stop this often */
#define COORD_EXIT_LOST 75

struct coord_leader {
	coord_t *c;
	etcd_t *e;                  /* the thread's client */
	etcd_watch_t *w;            /* the thread's watch of PREFIX/election/ */
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
	bool reread;                /* the watch said: read who leads again */
	bool watch_created;         /* the stream open now was taken by etcd */
	int64_t watch_from;         /* the revision the open watch starts at */
	unsigned watch_losses;      /* watches lost since one was taken */
	uint64_t watch_retry_ms;    /* open a watch again no earlier */
	uint64_t next_progress;     /* ask the watch for a progress answer then */
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

/* Who leads now: this key (won) or another's address.  The revision
 * etcd read it at (0: etcd did not answer). */
static int64_t
look(coord_leader_t *l)
{
	char prefix[300];
	etcd_kv_t kv;
	refit_err_t err;
	int64_t rev;

	refit_err_clear(&err);
	snprintf(prefix, sizeof(prefix), "%s/election/", l->prefix);
	if (etcd_first_created(l->e, prefix, &kv, &err) != REFIT_OK) {
		read_failed(l, &err);
		return 0;
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
	rev = kv.read_rev;
	etcd_kv_fini(&kv);
	return rev;
}

/* Read who leads; with no watch standing, open one from the revision read
 * + 1.  False: no watch stands (the caller reads again in POLL_MS). */
static bool
look_and_watch(coord_leader_t *l)
{
	char prefix[300];
	refit_err_t err;
	int64_t rev = look(l);
	uint64_t now = mono_ms();

	if (rev <= 0)
		return false;  /* not read: read again in POLL_MS, watch or not */
	l->reread = false;
	if (etcd_watch_up(l->w))
		return true;
	if (now < l->watch_retry_ms)
		return false;
	refit_err_clear(&err);
	snprintf(prefix, sizeof(prefix), "%s/election/", l->prefix);
	l->watch_created = false;
	if (etcd_watch_open(l->w, prefix, rev + 1, WATCH_ANSWER_MS, &err) != REFIT_OK) {
		log_warnx("coordinator: election: %s (reading every %d ms meanwhile)", err.msg,
			  POLL_MS);
		l->watch_retry_ms = now + WATCH_RETRY_MS;
		return false;
	}
	l->watch_from = rev + 1;
	l->next_progress = now + (uint64_t)l->ttl_s * 1000 / 3;
	return true;
}

/* The watch ended: read again now (once more at once if it had been
 * taken, else after WATCH_RETRY_MS), polling meanwhile. */
static void
watch_lost(coord_leader_t *l, const refit_err_t *err)
{
	if (l->watch_losses++ == 0)
		log_warnx("coordinator: election: watch lost: %s (reading who leads again; every "
			  "%d ms until a watch stands)", err->msg, POLL_MS);
	l->watch_retry_ms = l->watch_created ? 0 : mono_ms() + WATCH_RETRY_MS;
	l->reread = true;
}

/* Wait on the watch up to ms (one answer); a change: read again. */
static void
watch_wait(coord_leader_t *l, uint64_t ms)
{
	refit_err_t err;
	int64_t rev;
	uint64_t now;
	etcd_watch_what_t what;

	refit_err_clear(&err);
	what = etcd_watch_wait(l->w, (int64_t)ms, &rev, &err);
	now = mono_ms();
	if (what == ETCD_WATCH_LOST) {
		watch_lost(l, &err);
		return;
	}
	if (what != ETCD_WATCH_NOTHING)
		l->read_ms = now;  /* etcd answered (silence is not an answer) */
	if (what == ETCD_WATCH_CREATED) {
		if (l->watch_losses > 0 || !l->watch_created)
			log_info("coordinator: election: watching %s/election/ on %s from revision "
				 "%" PRId64 "%s", l->prefix, etcd_watch_endpoint(l->w), l->watch_from,
				 l->watch_losses > 0 ? " (a watch stands again)" : "");
		l->watch_created = true;
		l->watch_losses = 0;
	} else if (what == ETCD_WATCH_CHANGED) {
		l->reread = true;
	}
	if (now >= l->next_progress) {
		etcd_watch_progress(l->w);
		l->next_progress = now + (uint64_t)l->ttl_s * 1000 / 3;
	}
}

static void *
run(void *arg)
{
	coord_leader_t *l = arg;
	uint64_t next_ka = 0;

	while (!atomic_load(&l->stop)) {
		uint64_t now = mono_ms(), wait;

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
		if (!etcd_watch_up(l->w) || l->reread) {
			if (!look_and_watch(l)) {
				sleep_ms(POLL_MS);
				continue;
			}
		}
		now = mono_ms();
		wait = next_ka > now ? next_ka - now : 0;
		watch_wait(l, wait < WAIT_MAX_MS ? wait : WAIT_MAX_MS);
	}
	etcd_watch_close(l->w);
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
	etcd_watch_free(l->w);
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
	l->w = etcd_watch_new(l->e);
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
