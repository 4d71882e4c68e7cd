/*
 * planner.c - the reshard planner.
 *
 * Phase A walks every tensor's destination needs (needs.c) and records one
 * work item per (domain, region, source group) piece.  Phase B assigns the
 * items, largest first, to senders and receivers so that bytes per NIC and
 * per NVLink port stay balanced:
 *   - a piece with a holder in its destination domain is copied from the
 *     least-loaded such holder over NVLink (or locally, when the rank that
 *     needs it holds it as a source) in stage 0;
 *   - any other piece crosses the network once per domain, cut into up to
 *     one part per rank needing it.  Each part enters through the least-
 *     loaded NIC of the domain (pick_receiver: a needing rank, or any other
 *     rank, which then holds it as relay data) and is forwarded over NVLink
 *     to the ranks needing it in the next stage.  It leaves through the
 *     least-loaded NIC of a holder's domain (pick_sender: a holder, or a
 *     rank the holder copies it to over NVLink first);
 *   - a piece needed in several domains is sent by its holders' domains to
 *     at most half of them and relayed on by the served ones (waves, each
 *     served domain passing it to up to a quarter as many domains as it
 *     has NICs);
 *   - receivers and holders' senders keep their partners while a part fits
 *     the group's last message (pair affinity, pick_receiver), so NICs
 *     exchange fewer, fuller messages.
 * Wave w crosses the network in stage net0 + 2w (net_stage).  Relay data
 * lives in staging until its round ends, so each unit of work goes into
 * the first round where its relay ranks have room (unit_end).  Ties are
 * broken by rank id, so the plan is deterministic.
 *
 * This file holds phase A and the assignments; who sends and receives a
 * part is planner_pick.c's, the tables built before phase B are
 * planner_setup.c's, the lookup tables and the output planner_state.c's
 * (the state they share: planner_internal.h).
 */
#include <stdlib.h>
#include <string.h>

#include "plan/planner_internal.h"

/* Phase A: one work item for a piece a domain needs (needs_visitor_t). */
static void
on_item(void *ctx, const needs_item_t *it)
{
	reshard_t *rs = ctx;
	const plan_layout_t *t = &rs->dst->v[it->tensor];
	const srcgroup_t *g = &it->src->g[it->group];
	work_t w = {.domain = it->domain, .nn = it->nneed, .local = it->local};
	uint64_t bytes = (uint64_t)plan_box_volume(it->box, t->ndim) *
			 plan_dtype_size(t->dtype);

	if (!it->local) {
		rs->dom_in[it->domain] += bytes;
		for (uint32_t k = 0; k < it->nneed; k++)
			rs->own_in[plan_topo_nic(rs->topo, it->need[k])] += bytes / it->nneed;
	}
	if (rs->group_off[it->group] == UINT32_MAX) {
		rs->group_off[it->group] = (uint32_t)rs->arena.n;
		for (uint32_t k = 0; k < g->nh; k++)
			VEC_PUSH(&rs->arena, it->src->holders[g->h0 + k]);
	}
	w.piece = reshard_piece_of(rs, rs->group_off[it->group], g->nh, it->tensor, it->box, bytes);
	w.n0 = (uint32_t)rs->arena.n;
	for (uint32_t k = 0; k < it->nneed; k++)
		VEC_PUSH(&rs->arena, it->need[k]);
	VEC_PUSH(&rs->work, w);
}

/* How many domains hold a piece: each can send it out through all its NICs. */
static uint32_t
holder_domains(const reshard_t *rs, const work_t *w)
{
	const piece_t *pw = pc(rs, w);
	const int32_t *h = rs->arena.v + pw->h0;
	uint32_t n = 0;

	for (uint32_t k = 0; k < pw->nh; k++) {
		bool seen = false;

		for (uint32_t j = 0; j < k && !seen; j++)
			seen = rs->topo->rank_domain[h[j]] == rs->topo->rank_domain[h[k]];
		n += !seen;
	}
	return n;
}

/* Least-loaded rank of ranks[0..n) by load[], lowest rank on ties. */
static int32_t
least(const int32_t *ranks, uint32_t n, const uint64_t *load)
{
	int32_t best = ranks[0];
	uint64_t b = load[best];

	for (uint32_t i = 1; i < n; i++)
		if (load[ranks[i]] < b || (load[ranks[i]] == b && ranks[i] < best)) {
			best = ranks[i];
			b = load[best];
		}
	return best;
}

/* A piece held inside its destination domain: NVLink or local copies. */
static void
assign_local(reshard_t *rs, const work_t *w)
{
	const piece_t *pw = pc(rs, w);
	const int32_t *h = rs->arena.v + pw->h0, *need = rs->arena.v + w->n0;
	int32_t *in_dom;
	uint32_t nin = 0, bid = reshard_box_add(rs, &pw->box);

	VEC_RESERVE(&rs->scratch, pw->nh);
	in_dom = rs->scratch.v;

	for (uint32_t k = 0; k < pw->nh; k++)
		if (plan_topo_domain(rs->topo, h[k]) == w->domain)
			in_dom[nin++] = h[k];
	for (uint32_t k = 0; k < w->nn; k++) {
		int32_t n = need[k], s;

		if (xbsearch(&n, h, pw->nh, sizeof(*h), cmp_i32v) != NULL) {
			reshard_emit(rs, 0, n, n, pw->tensor, bid);
			continue;
		}
		s = least(in_dom, nin, rs->ld.nvl_send);
		rs->ld.nvl_send[s] += pw->bytes;
		rs->ld.nvl_recv[n] += pw->bytes;
		reshard_emit(rs, 0, s, n, pw->tensor, bid);
	}
}

/*
 * How many parts to cut a network piece into, and along which dim: one per
 * rank of the domain that needs it (each part enters through a different
 * NIC, then is forwarded over NVLink), but no part smaller than min_part.
 * Sender balance comes from assigning pieces largest first, not from cuts.
 */
static int64_t
part_count(const reshard_t *rs, const work_t *w, int ndim, int *dim)
{
	const piece_t *pw = pc(rs, w);
	uint64_t min_part = rs->opts->chunk_bytes / 16;
	int64_t want = w->nn, cap;

	if (min_part < (64u << 10))
		min_part = 64u << 10;
	cap = (int64_t)(pw->bytes / min_part);
	if (want > cap)
		want = cap;
	if (want < 2 || ndim == 0)
		return 1;
	for (int d = 0; d < ndim; d++) {
		if (pw->box.size[d] >= want) {
			/* in a small domain (a DGX node) a part a little over
			 * chunk_bytes (up to two) is cut to chunk_bytes: it would
			 * travel as two messages that nothing else can share, and
			 * the rest of each can carry small transfers.  On an NVL72
			 * rack the same cut costs many transfers (parts times ranks
			 * needing them) for no measured gain. */
			int64_t n = pw->box.size[d], k = (n + want - 1) / want;
			uint64_t row = pw->bytes / (uint64_t)n;
			int64_t m = row ? (int64_t)(rs->opts->chunk_bytes / row) : n;

			if (rs->dom_nics[w->domain] <= 16 && m >= 1 && k > m && k <= 2 * m)
				want = (n + m - 1) / m;
			*dim = d;
			return want;
		}
	}
	*dim = 0;
	for (int d = 1; d < ndim; d++)
		if (pw->box.size[d] > pw->box.size[*dim])
			*dim = d;
	return pw->box.size[*dim];
}

static void
served_fini(served_t *s)
{
	free(s->mem);
}

/*
 * out's parts: like's when given (the run's other domains: the same
 * boxes, and their spart_t in the first domain's block), else w's piece
 * cut (part_count), each added to the box table.
 */
static void
served_parts(reshard_t *rs, const work_t *w, const served_t *like, served_t *out)
{
	const piece_t *pw = pc(rs, w);
	const plan_layout_t *t = &rs->dst->v[pw->tensor];
	int dim = 0;
	size_t np;
	bool in_run = rs->run.sv != NULL;

	out->np = like ? like->np : part_count(rs, w, t->ndim, &dim);
	np = (size_t)out->np;
	if (like) {
		out->mem = NULL;
		out->pt = like->pt + (size_t)(out - like) * np;
		out->parts = like->parts;
		out->box0 = like->box0;
	} else {
		/* parts first (the block is aligned for them), then the
		 * spart_t of each domain of the run (one when none) */
		size_t nd = in_run ? rs->run.k : 1;

		out->mem = xmalloc(np * (sizeof(*out->parts) + nd * sizeof(*out->pt)));
		out->pt = (spart_t *)((char *)out->mem + np * sizeof(*out->parts));
		out->parts = out->mem;
		if (out->np == 1)
			out->parts[0] = pw->box;
		else
			plan_box_split(&pw->box, dim, out->np, out->parts);
		out->box0 = (uint32_t)rs->boxes->n;
		for (int64_t p = 0; p < out->np; p++)
			reshard_box_add(rs, &out->parts[p]);
		if (in_run) { /* the run's first domain: the parts of all */
			rs->run.spec_head = xmalloc(np * sizeof(*rs->run.spec_head));
			memset(rs->run.spec_head, 0xff, np * sizeof(*rs->run.spec_head));
		}
	}
	out->w = w;
	out->dom = w->domain;
	out->gen = 0;
}

/*
 * A piece that must cross the network into its domain: from the holders,
 * or relayed from domains of pool (served before).  Each part enters
 * through the receiver pick_receiver chooses, which forwards it over
 * NVLink in the next stage to the ranks of the domain needing it.
 */
static void
assign_network(reshard_t *rs, const work_t *w, const served_t *pool, size_t npool,
	       const served_t *like, served_t *out)
{
	const piece_t *pw = pc(rs, w);
	const plan_layout_t *t = &rs->dst->v[pw->tensor];
	const int32_t *need = rs->arena.v + w->n0;
	bool in_run = rs->run.sv != NULL;

	served_parts(rs, w, like, out);
	for (int64_t p = 0; p < out->np; p++) {
		uint64_t b = (uint64_t)plan_box_volume(&out->parts[p], t->ndim) *
			     plan_dtype_size(t->dtype);
		uint32_t stage;
		int32_t s, r;

		rs->cur_part = &out->parts[p];
		rs->cur_box = out->box0 + (uint32_t)p;
		rs->cur_w = w;
		s = reshard_pick_sender(rs, w, pool, npool, p, b, &stage);
		r = reshard_pick_receiver(rs, w, b, s, stage);
		reshard_send_add(rs, s, b);
		reshard_nic_add(rs, rs->ld.net_recv, &rs->least_recv, r, b);
		rs->dom_send[plan_topo_domain(rs->topo, s)] += b;
		reshard_run_touch(rs, s);
		out->pt[p] = (spart_t){.recv = r, .at = stage, .help = -1};
		if (in_run && !among_n(need, w->nn, r))
			reshard_run_spec(rs, out, p);
		reshard_emit(rs, stage, s, r, pw->tensor, rs->cur_box);
		for (uint32_t k = 0; k < w->nn; k++) {
			if (need[k] == r)
				continue;
			rs->ld.nvl_send[r] += b;
			rs->ld.nvl_recv[need[k]] += b;
			reshard_emit(rs, stage + 1, r, need[k], pw->tensor, rs->cur_box);
		}
	}
}

/*
 * The same piece needed by K domains while only H < K ranks hold it: the
 * holders serve H domains first; in each later wave every domain served
 * so far can pass it on (pick_sender), so the served set doubles, each holder
 * sends the piece once instead of K / H times, and the destination NICs,
 * otherwise idle in that direction, carry the rest.  Which domains come
 * first rotates from run to run so no domain relays everything.
 */
static void
assign_relayed(reshard_t *rs, const uint32_t *run, size_t k)
{
	served_t *sv = xcalloc(k, sizeof(*sv));
	size_t nh = holder_domains(rs, &rs->work.v[run[0]]), done = 0, off = rs->rotate++ % k;
	size_t fan = SIZE_MAX;
	uint32_t wave = 0;

	/* the sources serve at most half the domains and the served ones relay
	 * the rest (their NICs' send direction is otherwise idle), so the
	 * sources' domains send each piece about once, not K times */
	if (nh > (k + 1) / 2)
		nh = (k + 1) / 2;
	rs->run.sv = sv;
	rs->run.k = k;
	rs->run.n = 0;
	rs->run.best = 0;
	rs->run.best_ok = false;
	rs->run.v = xmalloc(k * sizeof(*rs->run.v));
	rs->run.spec.n = 0;
	for (size_t i = 0; i < k; i++) {
		int32_t d = rs->work.v[run[i + off < k ? i + off : i + off - k]].domain;

		rs->run.dom_slot[d] = (int32_t)i;
		fan = rs->dom_nics[d] / 4 < fan ? rs->dom_nics[d] / 4 : fan;
	}
	fan = fan ? fan : 1;
	while (done < k) {
		size_t take = wave == 0 ? (nh < k ? nh : k)
					: (done * fan < k - done ? done * fan : k - done);

		for (; rs->run.n < done; rs->run.n++) { /* they join the pool */
			rs->run.v[rs->run.n] = reshard_run_key(rs, &sv[rs->run.n]);
			if (rs->run.best_ok && run_before(&rs->run, rs->run.n, rs->run.best))
				rs->run.best = rs->run.n;
		}
		rs->wave = wave;
		for (size_t i = done; i < done + take; i++)
			assign_network(rs, &rs->work.v[run[i + off < k ? i + off : i + off - k]], sv,
				       wave ? done : 0, i ? &sv[0] : NULL, &sv[i]);
		done += take;
		wave++;
	}
	rs->wave = 0;
	for (size_t i = 0; i < k; i++) {
		rs->run.dom_slot[sv[i].dom] = -1;
		served_fini(&sv[i]);
	}
	free(sv);
	free(rs->run.v);
	free(rs->run.spec_head);
	rs->run.sv = NULL;
	rs->run.v = NULL;
	rs->run.spec_head = NULL;
}

/*
 * Phase A for tensor i: its needs against its source layout (a work item
 * per piece, on_item).
 */
static refit_status_t
walk_tensor(reshard_t *rs, const plan_layout_t *src, size_t i, const needs_visitor_t *v,
	    refit_err_t *err)
{
	srcidx_t ix;
	refit_status_t rc;

	srcidx_build(&ix, src);
	rs->group_off = xmalloc((ix.ng ? ix.ng : 1) * sizeof(uint32_t));
	memset(rs->group_off, 0xff, (ix.ng ? ix.ng : 1) * sizeof(uint32_t));
	rc = needs_walk(&ix, &rs->dst->v[i], (uint32_t)i, rs->topo, v, err);
	free(rs->group_off);
	srcidx_fini(&ix);
	return rc;
}

/*
 * What is assigned, largest first, creation order on ties (a stable radix
 * sort on max - bytes): each local item, and each piece's network items
 * as one unit (its run) where the first of them is.  A piece's items all
 * have its bytes, so this is the order of the items sorted alone, with
 * the run's later items left out; sorting a few keys per piece, not one
 * per item, spares the sort and a copy of every item.  *n keys, freed by
 * the caller.
 */
static xkey_t *
assign_order(const reshard_t *rs, const uint32_t *runs, const uint32_t *run_off, size_t *n)
{
	uint64_t max = 0;
	size_t nk = 0;
	xkey_t *k;

	for (size_t i = 0; i < rs->work.n; i++) {
		const work_t *w = &rs->work.v[i];

		if (w->local || runs[run_off[w->piece]] == i)
			nk++;
		max = pc(rs, w)->bytes > max ? pc(rs, w)->bytes : max;
	}
	k = xmalloc((nk ? nk : 1) * sizeof(*k));
	nk = 0;
	for (size_t i = 0; i < rs->work.n; i++) {
		const work_t *w = &rs->work.v[i];

		if (w->local || runs[run_off[w->piece]] == i)
			k[nk++] = (xkey_t){max - pc(rs, w)->bytes, (uint32_t)i};
	}
	plan_radix_sort(k, nk, plan_bits_for(max));
	*n = nk;
	return k;
}

/* Phase B: every work item assigned, one unit of work at a time. */
static void
assign_all(reshard_t *rs)
{
	uint32_t *runs, *run_off, *run_len;
	size_t nk;
	xkey_t *k;

	reshard_find_runs(rs, &runs, &run_off, &run_len);
	k = assign_order(rs, runs, run_off, &nk);
	for (size_t e = 0; e < nk; e++) {
		const work_t *w = &rs->work.v[k[e].idx];
		uint32_t len = run_len[w->piece];
		served_t one;

		reshard_unit_begin(rs);
		if (w->local) {
			assign_local(rs, w);
		} else if (len > 1) {
			assign_relayed(rs, runs + run_off[w->piece], len);
		} else {
			assign_network(rs, w, NULL, 0, NULL, &one);
			served_fini(&one);
		}
		reshard_unit_end(rs);
	}
	free(k);
	free(runs);
	free(run_off);
	free(run_len);
}

refit_status_t
plan_reshard(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	     const size_t *map, const plan_topo_t *topo, const plan_opts_t *opts,
	     cxvec_t *out, boxvec_t *boxes, uint32_t *stages_per_round, refit_err_t *err)
{
	reshard_t rs;
	needs_visitor_t v = {.item = on_item, .ctx = &rs};
	refit_status_t rc = REFIT_OK;

	reshard_init(&rs, dst, topo, opts, out, boxes);
	for (size_t i = 0; i < dst->n && rc == REFIT_OK; i++)
		rc = walk_tensor(&rs, &src->v[map[i]], i, &v, err);
	if (rc == REFIT_OK) {
		reshard_choose_hops(&rs, src);
		assign_all(&rs);
		*stages_per_round = reshard_number_stages(&rs);
	}
	reshard_fini(&rs);
	return rc;
}
