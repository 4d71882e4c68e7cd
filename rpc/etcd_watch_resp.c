/*
 * etcd_watch_resp.c - what one answer on an etcd Watch stream means
 * (etcd_watch.h), apart from gRPC so that the unit tests read it
 * (tests/unit/test_etcd_watch.c).
 *
 * etcd (v3.4, rpc.proto and its watch server): the first answer to a
 * create request has created set (its header: the revision the watch
 * starts after); a start revision compacted away is answered with
 * compact_revision set and canceled (the watch is gone: creating it again
 * from that revision fails again, so the caller reads anew); a watch etcd
 * ends has canceled set with cancel_reason; a progress request is
 * answered without events, watch_id -1 (every watch of the stream); a
 * progress_notify answer has none either.
 */
#include <inttypes.h>
#include <stdio.h>

#include "rpc/etcd_watch.h"

const char *
etcd_watch_what_name(etcd_watch_what_t w)
{
	switch (w) {
	case ETCD_WATCH_NOTHING: return "nothing";
	case ETCD_WATCH_CREATED: return "created";
	case ETCD_WATCH_PROGRESS: return "progress";
	case ETCD_WATCH_CHANGED: return "changed";
	case ETCD_WATCH_LOST: return "lost";
	}
	return "?";
}

etcd_watch_what_t
etcd_watch_classify(const etcd_watch_resp_t *r, int64_t watch_id, int64_t start_rev,
		    int64_t *rev, char *why, size_t n)
{
	*rev = 0;
	if (n > 0)
		why[0] = '\0';
	if (r->compact_revision != 0) {
		snprintf(why, n, "revision %" PRId64 " compacted away (etcd keeps from %" PRId64
			 ")", start_rev, r->compact_revision);
		return ETCD_WATCH_LOST;
	}
	if (r->canceled) {
		snprintf(why, n, "etcd canceled the watch%s%s",
			 r->cancel_reason && r->cancel_reason[0] ? ": " : "",
			 r->cancel_reason ? r->cancel_reason : "");
		return ETCD_WATCH_LOST;
	}
	if (r->watch_id != watch_id && r->watch_id != -1) {
		/* not the one watch of this stream: no news of its keys */
		snprintf(why, n, "an answer for watch %" PRId64 ", not %" PRId64, r->watch_id,
			 watch_id);
		return ETCD_WATCH_PROGRESS;
	}
	if (r->created) {
		*rev = r->revision;
		return ETCD_WATCH_CREATED;
	}
	if (r->n_events > 0) {
		*rev = r->last_mod_rev > 0 ? r->last_mod_rev : r->revision;
		return ETCD_WATCH_CHANGED;
	}
	*rev = r->revision;
	return ETCD_WATCH_PROGRESS;
}
