/*
 * etcd_watch.h - an etcd v3 Watch of one key prefix, for one thread
 * (daemon/coord/coord_leader.c: who leads): a bidirectional gRPC stream
 * (/etcdserverpb.Watch/Watch, proto/etcd/watch.proto) on the channels of
 * an etcd_t (rpc/etcd.h: its endpoints, its TLS), one stream at a time.
 *
 * The caller reads first (a Range, which says the store's revision R),
 * then watches from R + 1: no change between the read and the watch is
 * missed.  etcd_watch_wait answers one response at a time (nothing is
 * kept between calls: memory is bounded by one answer) and says what it
 * means: a change under the prefix, a progress answer, or the watch lost
 * (canceled, its start revision compacted away, the stream broken or
 * silent past its deadline) -- then the caller reads again and watches
 * again; the next etcd_watch_open tries the next endpoint after a failed
 * one.  The stream asks etcd for a member with a leader (metadata
 * "hasleader"): a member cut off from its cluster ends it rather than
 * keeping it silent.
 */
#ifndef REFIT_RPC_ETCD_WATCH_H
#define REFIT_RPC_ETCD_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rpc/etcd.h"

typedef struct etcd_watch etcd_watch_t;

typedef enum etcd_watch_what {
	ETCD_WATCH_NOTHING,    /* no answer within the wait */
	ETCD_WATCH_CREATED,    /* etcd took the watch */
	ETCD_WATCH_PROGRESS,   /* an answer without events: nothing changed */
	ETCD_WATCH_CHANGED,    /* a key under the prefix was put or deleted */
	ETCD_WATCH_LOST,       /* the watch ended: read again, watch again */
} etcd_watch_what_t;

/* One answer's fields, as decoded (etcd_watch_classify's input). */
typedef struct etcd_watch_resp {
	int64_t revision;          /* the header's: the store's revision */
	int64_t watch_id;          /* -1: a progress answer for every watch */
	bool created, canceled;
	int64_t compact_revision;  /* set: the start revision was compacted */
	const char *cancel_reason; /* NULL or "" when none */
	size_t n_events;
	int64_t last_mod_rev;      /* the last event's revision */
} etcd_watch_resp_t;

/*
 * What an answer means to a watch of id watch_id started at start_rev
 * (pure: rpc/etcd_watch_resp.c).  *rev: the revision it brings the
 * watcher to (0: none); why (LOST): the reason, for the log.
 */
etcd_watch_what_t etcd_watch_classify(const etcd_watch_resp_t *r, int64_t watch_id,
				      int64_t start_rev, int64_t *rev, char *why, size_t n);
const char *etcd_watch_what_name(etcd_watch_what_t w);

/* A watcher over e's endpoints (e outlives it; the same thread uses both). */
etcd_watch_t *etcd_watch_new(etcd_t *e);
void etcd_watch_free(etcd_watch_t *w);   /* NULL: no-op */
/*
 * Start a watch of every key under prefix from start_rev (> 0) on a stream
 * of its own (closing one still open); answer_ms: how long etcd may take
 * to answer it (and each progress request).  Fails only when the call
 * cannot be started; etcd's refusal comes as ETCD_WATCH_LOST.
 */
refit_status_t etcd_watch_open(etcd_watch_t *w, const char *prefix, int64_t start_rev,
			       int64_t answer_ms, refit_err_t *err);
bool etcd_watch_up(const etcd_watch_t *w);
/* The endpoint of the stream (open or last). */
const char *etcd_watch_endpoint(const etcd_watch_t *w);
/*
 * Wait up to timeout_ms for one answer.  LOST closes the stream (err
 * names etcd, the endpoint and why); the next open goes to the next
 * endpoint.  *rev as in etcd_watch_classify.
 */
etcd_watch_what_t etcd_watch_wait(etcd_watch_t *w, int64_t timeout_ms, int64_t *rev,
				  refit_err_t *err);
/* Ask etcd for a progress answer (not answered within answer_ms: the
 * watch is lost).  No-op while a request is still being sent. */
void etcd_watch_progress(etcd_watch_t *w);
/* End the stream (cancelled; its pending operations drained). */
void etcd_watch_close(etcd_watch_t *w);

#endif
