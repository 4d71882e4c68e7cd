/*
 * etcd_watch.c - the Watch stream of etcd_watch.h over gRPC core: one call
 * per stream on a completion queue of the watcher's own, waited on by its
 * thread with a deadline.  Three operations may be in flight: the status
 * (asked for when the call starts, completed when the stream ends), one
 * receive (armed again after each answer) and one send (the create
 * request, then progress requests).  Closing cancels the call and drains
 * them before the call is released.  The messages are proto/etcd/
 * watch.proto's, generated into build/gen and compiled here, their only
 * user (the KeyValue and header types they use are etcd.c's).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>

#include "common/alloc.h"
#include "rpc/etcd_watch.h"
#include "rpc/rpc_internal.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include "etcd/watch.pb-c.c"
#pragma GCC diagnostic pop

#define WATCH_PATH "/etcdserverpb.Watch/Watch"

enum { TAG_SEND = 1, TAG_RECV, TAG_STATUS };

struct etcd_watch {
	etcd_t *e;
	size_t ep;                  /* the stream's endpoint index */
	const char *addr;           /* its address (e's) */
	bool failed;                /* the last stream failed: open on the next */
	grpc_completion_queue *cq;
	grpc_call *call;            /* NULL: no stream */
	bool send_busy, recv_busy, status_busy, md_asked;
	grpc_byte_buffer *sbuf, *rbuf;
	grpc_metadata_array init_md, trail_md;
	grpc_metadata hasleader;
	grpc_status_code code;
	grpc_slice details;
	bool created;
	int64_t watch_id, start_rev, answer_ms;
	uint64_t due_ms;            /* an answer is owed by then (0: none) */
};

static uint64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static gpr_timespec
in_ms(int64_t ms)
{
	return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
			    gpr_time_from_millis(ms > 0 ? ms : 0, GPR_TIMESPAN));
}

etcd_watch_t *
etcd_watch_new(etcd_t *e)
{
	etcd_watch_t *w = xcalloc(1, sizeof(*w));

	grpc_init();
	w->e = e;
	w->ep = 0;
	(void)etcd_endpoint_client(e, 0, &w->addr);
	w->cq = grpc_completion_queue_create_for_next(NULL);
	return w;
}

void
etcd_watch_free(etcd_watch_t *w)
{
	grpc_event ev;

	if (w == NULL)
		return;
	etcd_watch_close(w);
	grpc_completion_queue_shutdown(w->cq);
	while (rpc_cq_next(w->cq, &ev))
		;
	grpc_completion_queue_destroy(w->cq);
	free(w);
	grpc_shutdown();
}

bool
etcd_watch_up(const etcd_watch_t *w)
{
	return w->call != NULL;
}

const char *
etcd_watch_endpoint(const etcd_watch_t *w)
{
	return w->addr;
}

/* An operation of the stream completed (tag): no longer in flight. */
static void
done(etcd_watch_t *w, intptr_t tag)
{
	if (tag == TAG_SEND) {
		w->send_busy = false;
		grpc_byte_buffer_destroy(w->sbuf);
		w->sbuf = NULL;
	} else if (tag == TAG_RECV) {
		w->recv_busy = false;
	} else if (tag == TAG_STATUS) {
		w->status_busy = false;
	}
}

void
etcd_watch_close(etcd_watch_t *w)
{
	grpc_event ev;

	if (w->call == NULL)
		return;
	grpc_call_cancel(w->call, NULL);
	while ((w->send_busy || w->recv_busy || w->status_busy) && rpc_cq_next(w->cq, &ev))
		done(w, (intptr_t)ev.tag);
	if (w->rbuf)
		grpc_byte_buffer_destroy(w->rbuf);
	w->rbuf = NULL;
	grpc_call_unref(w->call);
	w->call = NULL;
	grpc_metadata_array_destroy(&w->init_md);
	grpc_metadata_array_destroy(&w->trail_md);
	grpc_slice_unref(w->details);
	w->due_ms = 0;
}

/* Send req on the stream (the first send carries the initial metadata). */
static bool
send_req(etcd_watch_t *w, const Etcdserverpb__WatchRequest *req)
{
	grpc_op ops[2];
	size_t n = 0;
	grpc_slice sl = grpc_slice_malloc(protobuf_c_message_get_packed_size(&req->base));

	protobuf_c_message_pack(&req->base, GRPC_SLICE_START_PTR(sl));
	w->sbuf = grpc_raw_byte_buffer_create(&sl, 1);
	grpc_slice_unref(sl);
	memset(ops, 0, sizeof(ops));
	if (!w->md_asked) {
		ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
		ops[n].data.send_initial_metadata.count = 1;
		ops[n++].data.send_initial_metadata.metadata = &w->hasleader;
	}
	ops[n].op = GRPC_OP_SEND_MESSAGE;
	ops[n++].data.send_message.send_message = w->sbuf;
	if (grpc_call_start_batch(w->call, ops, n, (void *)TAG_SEND, NULL) != GRPC_CALL_OK) {
		grpc_byte_buffer_destroy(w->sbuf);
		w->sbuf = NULL;
		return false;
	}
	w->send_busy = true;
	return true;
}

/* Receive the next answer (the first receive takes the initial metadata). */
static bool
arm_recv(etcd_watch_t *w)
{
	grpc_op ops[2];
	size_t n = 0;

	memset(ops, 0, sizeof(ops));
	if (!w->md_asked) {
		ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
		ops[n++].data.recv_initial_metadata.recv_initial_metadata = &w->init_md;
	}
	ops[n].op = GRPC_OP_RECV_MESSAGE;
	ops[n++].data.recv_message.recv_message = &w->rbuf;
	if (grpc_call_start_batch(w->call, ops, n, (void *)TAG_RECV, NULL) != GRPC_CALL_OK)
		return false;
	w->recv_busy = true;
	return true;
}

/* The status op, in flight until the stream ends. */
static bool
arm_status(etcd_watch_t *w)
{
	grpc_op op;

	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	op.data.recv_status_on_client.trailing_metadata = &w->trail_md;
	op.data.recv_status_on_client.status = &w->code;
	op.data.recv_status_on_client.status_details = &w->details;
	if (grpc_call_start_batch(w->call, &op, 1, (void *)TAG_STATUS, NULL) != GRPC_CALL_OK)
		return false;
	w->status_busy = true;
	return true;
}

static refit_status_t
start_call(etcd_watch_t *w, const char *prefix, refit_err_t *err)
{
	Etcdserverpb__WatchRequest rq = ETCDSERVERPB__WATCH_REQUEST__INIT;
	Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
	char *end = etcd_prefix_end(prefix);
	grpc_slice path = grpc_slice_from_static_string(WATCH_PATH);
	bool ok;

	w->call = grpc_channel_create_call(rpc_client_channel(etcd_endpoint_client(
							   w->e, w->ep, &w->addr)),
					   NULL, GRPC_PROPAGATE_DEFAULTS, w->cq, path, NULL,
					   gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	grpc_metadata_array_init(&w->init_md);
	grpc_metadata_array_init(&w->trail_md);
	w->details = grpc_empty_slice();
	w->md_asked = false;
	cr.key.data = (uint8_t *)prefix;
	cr.key.len = strlen(prefix);
	cr.range_end.data = (uint8_t *)end;
	cr.range_end.len = strlen(end);
	cr.start_revision = w->start_rev;
	rq.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
	rq.create_request = &cr;
	ok = w->call != NULL && arm_status(w) && send_req(w, &rq) && arm_recv(w);
	w->md_asked = true;
	free(end);
	if (!ok) {
		w->failed = true;
		return refit_err_set(err, REFIT_ERR_INTERNAL, "%s: %s Watch: cannot start the "
				     "call", etcd_tls(w->e) ? "etcd (TLS)" : "etcd", w->addr);
	}
	return REFIT_OK;
}

refit_status_t
etcd_watch_open(etcd_watch_t *w, const char *prefix, int64_t start_rev, int64_t answer_ms,
		refit_err_t *err)
{
	refit_status_t rc;

	etcd_watch_close(w);
	if (w->failed)
		w->ep = (w->ep + 1) % etcd_endpoint_count(w->e);
	w->failed = false;
	w->created = false;
	w->watch_id = 0;
	w->start_rev = start_rev;
	w->answer_ms = answer_ms;
	w->hasleader.key = grpc_slice_from_static_string("hasleader");
	w->hasleader.value = grpc_slice_from_static_string("true");
	if ((rc = start_call(w, prefix, err)) != REFIT_OK) {
		etcd_watch_close(w);
		return rc;
	}
	w->due_ms = now_ms() + (uint64_t)answer_ms;
	return REFIT_OK;
}

void
etcd_watch_progress(etcd_watch_t *w)
{
	Etcdserverpb__WatchRequest rq = ETCDSERVERPB__WATCH_REQUEST__INIT;
	Etcdserverpb__WatchProgressRequest pr = ETCDSERVERPB__WATCH_PROGRESS_REQUEST__INIT;

	if (w->call == NULL || w->send_busy)
		return;
	rq.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST;
	rq.progress_request = &pr;
	if (send_req(w, &rq) && w->due_ms == 0)
		w->due_ms = now_ms() + (uint64_t)w->answer_ms;
}

/* The watch is over: closed, err says why; failed: try the next endpoint. */
static etcd_watch_what_t
lost(etcd_watch_t *w, bool failed, refit_err_t *err, const char *why)
{
	refit_err_set(err, REFIT_ERR_UNAVAILABLE, "%s: %s Watch: %s",
		      etcd_tls(w->e) ? "etcd (TLS)" : "etcd", w->addr, why);
	etcd_watch_close(w);
	w->failed = failed;
	return ETCD_WATCH_LOST;
}

/* One answer received: decoded, classified, freed. */
static etcd_watch_what_t
answer(etcd_watch_t *w, int64_t *rev, refit_err_t *err)
{
	grpc_byte_buffer_reader rd;
	grpc_slice all;
	Etcdserverpb__WatchResponse *m = NULL;
	etcd_watch_resp_t r = {0};
	etcd_watch_what_t what;
	char why[REFIT_ERR_MSG_MAX / 2];

	if (grpc_byte_buffer_reader_init(&rd, w->rbuf)) {
		all = grpc_byte_buffer_reader_readall(&rd);
		grpc_byte_buffer_reader_destroy(&rd);
		m = etcdserverpb__watch_response__unpack(NULL, GRPC_SLICE_LENGTH(all),
							 GRPC_SLICE_START_PTR(all));
		grpc_slice_unref(all);
	}
	grpc_byte_buffer_destroy(w->rbuf);
	w->rbuf = NULL;
	if (m == NULL)
		return lost(w, true, err, "an answer that does not decode as a WatchResponse");
	r.revision = m->header ? m->header->revision : 0;
	r.watch_id = m->watch_id;
	r.created = m->created;
	r.canceled = m->canceled;
	r.compact_revision = m->compact_revision;
	r.cancel_reason = m->cancel_reason;
	r.n_events = m->n_events;
	if (m->n_events > 0 && m->events[m->n_events - 1]->kv)
		r.last_mod_rev = m->events[m->n_events - 1]->kv->mod_revision;
	what = etcd_watch_classify(&r, w->created ? w->watch_id : r.watch_id, w->start_rev, rev,
				   why, sizeof(why));
	if (what == ETCD_WATCH_CREATED) {
		w->created = true;
		w->watch_id = r.watch_id;
	}
	etcdserverpb__watch_response__free_unpacked(m, NULL);
	if (what == ETCD_WATCH_LOST)
		return lost(w, false, err, why);
	w->due_ms = 0;
	if (!arm_recv(w))
		return lost(w, true, err, "cannot receive on the stream");
	return what;
}

/* The stream ended (the status came): why, in gRPC's words. */
static etcd_watch_what_t
ended(etcd_watch_t *w, refit_err_t *err)
{
	char *d = grpc_slice_to_c_string(w->details);
	char why[REFIT_ERR_MSG_MAX / 2];

	snprintf(why, sizeof(why), "the stream ended: %s: %s", rpc_grpc_code_name(w->code), d);
	gpr_free(d);
	return lost(w, true, err, why);
}

etcd_watch_what_t
etcd_watch_wait(etcd_watch_t *w, int64_t timeout_ms, int64_t *rev, refit_err_t *err)
{
	uint64_t end = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
	grpc_event ev;

	*rev = 0;
	if (w->call == NULL)
		return lost(w, true, err, "no watch open");
	for (;;) {
		uint64_t now = now_ms(), until = end;
		/* past the answer's due time: take what already came before
		 * calling it lost (this thread may have been busy elsewhere) */
		bool overdue = w->due_ms != 0 && w->due_ms <= now;

		if (w->due_ms != 0 && w->due_ms < until)
			until = w->due_ms;
		ev = grpc_completion_queue_next(w->cq, overdue ? gpr_inf_past(GPR_CLOCK_MONOTONIC) :
						in_ms((int64_t)(until - now)), NULL);
		if (ev.type == GRPC_QUEUE_TIMEOUT && overdue) {
			char why[96];

			snprintf(why, sizeof(why), "no answer within %" PRId64 " ms", w->answer_ms);
			return lost(w, true, err, why);
		}
		if (ev.type == GRPC_QUEUE_TIMEOUT) {
			if (now_ms() >= end && (w->due_ms == 0 || now_ms() < w->due_ms))
				return ETCD_WATCH_NOTHING;
			continue;
		}
		if (ev.type != GRPC_OP_COMPLETE)
			return lost(w, true, err, "the completion queue is shut down");
		done(w, (intptr_t)ev.tag);
		if ((intptr_t)ev.tag == TAG_STATUS)
			return ended(w, err);
		if ((intptr_t)ev.tag == TAG_RECV && ev.success && w->rbuf != NULL)
			return answer(w, rev, err);
		/* a send done, or the stream ending: its status follows */
	}
}
