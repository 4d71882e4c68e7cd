/*
 * slice.c - one node's slice of a plan over a transport (see slice.h):
 * the slice set up and freed, the session run (stream or grouped form, the
 * delta form's start), the peers noted, slice_run.  The stream form's
 * pull and push are in slice_stream.c, the slice's tables in
 * slice_build.c, the grouped form in slice_group.c (slice_internal.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/node/slice_gdelta.h"
#include "daemon/node/slice_internal.h"
#include "dataplane/delta.h"
#include "dataplane/delta_gpu.h"
#include "daemon/node/gdelta_base.h"
#include "plan/gpu_staging.h"

#define GROUND(n) ((((n) ? (n) : 1) + PLAN_GPU_ALIGN - 1) / PLAN_GPU_ALIGN * PLAN_GPU_ALIGN)

/* ---- one slice ------------------------------------------------------------------ */

static void
slice_init(slice_t *s)
{
	const slice_cfg_t *c = s->c;
	size_t n = c->nnodes;

	memset(s->st, 0, sizeof(*s->st));
	s->trail = c->verify ? 4 : 0;
	s->out = xcalloc(n, sizeof(*s->out));
	s->in = xcalloc(n, sizeof(*s->in));
	s->ready = xcalloc(n, sizeof(*s->ready));
	s->ready_i = xcalloc(n, sizeof(*s->ready_i));
	s->in_got = xcalloc(n, sizeof(*s->in_got));
	s->buf = xcalloc(n, sizeof(*s->buf));
	s->out_max = xcalloc(n, sizeof(*s->out_max));
	s->in_max = xcalloc(n, sizeof(*s->in_max));
	s->held = xcalloc(n, sizeof(*s->held));
	s->stage_left = xcalloc(c->plan->nstages + 1, sizeof(*s->stage_left));
	/* the node's pool keeps at most staging_bytes per local rank; a new
	 * epoch empties it */
	if (c->pool)
		dp_pool_epoch(c->pool, c->epoch, c->plan->opts.staging_bytes *
			      (c->nodes[c->self].nranks ? c->nodes[c->self].nranks : 1));
	/* half the staging bytes for packed outgoing messages, the rest for
	 * arrivals (one buffer per sending peer) and relays */
	s->cap = c->plan->opts.staging_bytes / 2 / (c->plan->opts.chunk_bytes + s->trail);
	if (s->cap < 1)
		s->cap = 1;
}

static void
slice_fini(slice_t *s)
{
	const slice_cfg_t *c = s->c;

	for (size_t i = 0; i < c->nnodes; i++) {
		VEC_FREE(&s->out[i]);
		VEC_FREE(&s->in[i]);
		VEC_FREE(&s->ready[i]);
		if (c->pool)
			dp_pool_put(c->pool, s->buf[i]);
		else
			free(s->buf[i]);
	}
	free(s->out);
	free(s->in);
	free(s->ready);
	free(s->ready_i);
	free(s->in_got);
	free(s->buf);
	free(s->out_max);
	free(s->in_max);
	free(s->held);
	free(s->stage_left);
	VEC_FREE(&s->deps);
	VEC_FREE(&s->work);
	VEC_FREE(&s->msgs);
	VEC_FREE(&s->parts);
	VEC_FREE(&s->sp);
	VEC_FREE(&s->gm);
	VEC_FREE(&s->gops);
	VEC_FREE(&s->gopmsg);
	VEC_FREE(&s->gbufs);
	if (s->x)
		s->st->staged_max = dp_exec_staged_max(s->x);
	dp_exec_free(s->x);
}

/* Delta refits (slice_delta.h): the bases of every peer this slice sends
 * to or receives from. */
static void
delta_begin(slice_t *s)
{
	size_t nn = s->c->nnodes, *n = xcalloc(2 * nn + 1, sizeof(*n));

	for (size_t i = 0; i < nn; i++) {
		n[i] = s->out[i].n;
		n[nn + i] = s->in[i].n;
	}
	sdelta_begin(&s->d, s->c, n, n + nn, s->c->plan->opts.chunk_bytes + s->trail);
	free(n);
}

/* Delta refits on the devices (slice_gdelta.c): a message's end holds its
 * size message, and the sender its encoding, the receiver the wire, each
 * the codec's work, beyond the message's buffer. */
static uint64_t
delta_extra(void *ctx, uint64_t bytes, bool send)
{
	const slice_t *s = ctx;
	uint64_t n = bytes + s->trail + (send ? DP_DELTA_HDR : 0);

	return GROUND(DP_GDELTA_SIZE_MSG) + GROUND(n) +
	       GROUND(dp_gdelta_work(bytes, bytes % 2 == 0 ? 2 : 1));
}

/*
 * The most one of this node's ranks holds of its staging arena at once in
 * this slice (plan/gpu_staging.h): its groups' buffers, relay data, delta's
 * encodings, the conversion scratch and the delta bases' share.  The
 * transport refuses more than a rank's budget at open.
 */
static void
staging_need(slice_t *s, xport_session_cfg_t *sc)
{
	const slice_cfg_t *c = s->c;
	size_t nr = (size_t)plan_max_rank(c->plan) + 1;
	uint64_t *fixed = xcalloc(nr, sizeof(*fixed));
	uint64_t bases = c->gdelta && c->delta_tag ? gdelta_store_limit(c->gdelta) : 0;
	plan_gpu_extra_t ex = {.dst = c->dst, .fixed = fixed, .nfixed = nr};
	plan_gpu_staging_t gs;

	for (size_t r = 0; r < nr; r++)
		fixed[r] = (r < c->nstaging_fixed ? c->staging_fixed[r] : 0) + bases;
	if (bases) {
		ex.msg_extra = delta_extra;
		ex.ctx = s;
	}
	plan_gpu_staging_ranks(c->plan, s->trail, &ex, c->nodes[c->self].ranks,
			       c->nodes[c->self].nranks, &gs);
	sc->staging_need = gs.peak;
	sc->staging_rank = gs.rank;
	log_debug(LOG_SUB_NODE, "slice: GPU staging of rank %d at most %" PRIu64 " bytes at "
		  "once (groups %" PRIu64 ", relays %" PRIu64 ", held all slice %" PRIu64 ")",
		  gs.rank, gs.peak, gs.group_peak, gs.relay_peak, gs.fixed);
	free(fixed);
}

/* Open the session, make the executor on its memory, exchange, close. */
static refit_status_t
run_session(slice_t *s, refit_err_t *err)
{
	const slice_cfg_t *c = s->c;
	xport_peer_t *peers = xcalloc(c->nnodes, sizeof(*peers));
	xport_session_cfg_t sc = {
		.refit_id = c->refit_id, .epoch = c->epoch, .attempt = c->attempt,
		.peers = peers, .npeers = c->nnodes,
		.max_msg_bytes = c->plan->opts.chunk_bytes + s->trail,
		.deadline_ms = c->deadline_ms, .abort = c->abort, .pool = c->pool,
		.connect_ms = c->connect_ms, .events = c->events, .nevents = c->nevents,
	};
	xport_link_t *links = xcalloc(c->nnodes, sizeof(*links));
	xport_io_t io = {s, slice_begin, slice_pull, slice_push, slice_done, slice_peer_done,
			 slice_next_group, slice_group_done};
	dp_exec_opts_t eo = {.verify = c->verify, .corrupt_msg = -1, .pool = c->pool};
	dp_mem_ops_t dm = *c->mem;
	xport_session_t *sess = NULL;
	int64_t t0 = slice_now_us();
	refit_status_t rc;

	for (size_t i = 0; i < c->nnodes; i++) {
		peers[i].node_id = c->nodes[i].node_id;
		peers[i].endpoint = c->nodes[i].endpoint;
		peers[i].send_to = i != c->self && s->out[i].n > 0;
		peers[i].recv_from = i != c->self && s->in[i].n > 0;
		peers[i].max_in_bytes = peers[i].recv_from ? s->in_max[i] + s->trail : 0;
	}
	sc.links = links;
	if (c->xo->memory == XPORT_MEM_DEVICE)   /* the whole slice's staging, checked at open */
		staging_need(s, &sc);
	delta_begin(s);
	rc = c->xo->open(c->x, &sc, &sess, err);
	s->st->comm_us = (uint64_t)(slice_now_us() - t0);
	if (rc == REFIT_OK) {
		s->opened = true;
		dm.dev = s->dev = c->xo->dev(sess);
		sgd_begin(s);
		if (c->on_open)
			rc = c->on_open(c->hook_ctx, s->dev, err);
		if (rc == REFIT_OK)
			rc = dp_exec_new(c->plan, c->src, c->dst, &dm, &eo, &s->x, err);
	}
	if (rc == REFIT_OK)
		rc = c->xo->exchange(sess, &io, err);
	if (s->opened && c->on_close) {
		refit_err_t e2;
		refit_status_t r2 = c->on_close(c->hook_ctx, rc == REFIT_OK,
						rc == REFIT_OK ? err : &e2);

		rc = rc == REFIT_OK ? r2 : rc;
	}
	if (s->dev)
		slice_group_free(s);
	if (rc != REFIT_OK)
		sgd_fail(s);
	c->xo->close(sess);
	sdelta_end(&s->d, s->st, rc == REFIT_OK);
	sgd_end(s, s->st, rc == REFIT_OK);
	for (size_t i = 0; rc != REFIT_OK && c->peers && i < c->nnodes; i++)
		c->peers[i].link = links[i];
	free(links);
	free(peers);
	return rc;
}

/* The messages of list v not done yet. */
static uint64_t
not_done(const slice_t *s, const idxvec_t *v)
{
	uint64_t n = 0;

	for (size_t k = 0; k < v->n; k++)
		n += !s->msgs.v[v->v[k]].done;
	return n;
}

/* The slice failed: what each peer still owed this node and it them. */
static void
note_peers(const slice_t *s)
{
	const slice_cfg_t *c = s->c;

	for (size_t i = 0; c->peers && i < c->nnodes; i++) {
		if (i == c->self)
			continue;
		c->peers[i].opened = s->opened;
		if (!s->opened)
			continue;
		c->peers[i].owes_us = not_done(s, &s->in[i]);
		c->peers[i].we_owe = not_done(s, &s->out[i]);
	}
}

refit_status_t
slice_run(const slice_cfg_t *c, slice_stats_t *st, refit_err_t *err)
{
	slice_t s = {.c = c, .st = st, .t0 = slice_now_us()};
	refit_status_t rc;

	slice_init(&s);
	rc = slice_collect(&s, err);
	if (rc == REFIT_OK)
		rc = run_session(&s, err);
	if (rc == REFIT_OK && !slice_done(&s))
		rc = refit_err_set(err, REFIT_ERR_INTERNAL, "slice: %" PRIu64 " messages never "
				   "became ready (a dependency that never arrives)",
				   s.out_left + s.local_left);
	if (rc != REFIT_OK)
		note_peers(&s);
	st->total_us = (uint64_t)(slice_now_us() - s.t0);
	slice_fini(&s);
	return rc;
}
