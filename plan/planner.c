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
 *   - any other piece crosses the network once: it is split into up to
 *     max(#ranks needing it, #holders) parts; each part goes from the
 *     least-loaded holder NIC to the least-loaded needing rank's NIC in
 *     stage 0, and that rank forwards it over NVLink to the other needing
 *     ranks of the domain in stage 1.
 * Ties are broken by rank id, so the plan is deterministic.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"

typedef struct work {
	plan_box_t box;
	uint64_t bytes;
	uint32_t tensor, seq;
	int32_t domain;
	uint32_t h0, nh;  /* holders in the arena */
	uint32_t n0, nn;  /* ranks needing it, in the arena */
	bool local;
} work_t;

typedef struct loads {
	uint64_t *net_send, *net_recv, *nvl_send, *nvl_recv; /* per rank id */
} loads_t;

typedef struct reshard {
	const plan_layout_set_t *dst;
	const plan_topo_t *topo;
	const plan_opts_t *opts;
	VEC(work_t) work;
	i32vec_t arena;
	uint32_t *group_off;  /* per source group of the current tensor */
	loads_t ld;
	xfervec_t *out;
	size_t rotate;        /* spreads relay roots over domains */
} reshard_t;

static void
on_item(void *ctx, const needs_item_t *it)
{
	reshard_t *rs = ctx;
	const plan_layout_t *t = &rs->dst->v[it->tensor];
	const srcgroup_t *g = &it->src->g[it->group];
	work_t w = {
		.box = *it->box, .tensor = it->tensor, .domain = it->domain,
		.seq = (uint32_t)rs->work.n, .nh = g->nh, .nn = it->nneed,
		.local = it->local,
	};

	w.bytes = (uint64_t)plan_box_volume(it->box, t->ndim) *
		  plan_dtype_size(t->dtype);
	if (rs->group_off[it->group] == UINT32_MAX) {
		rs->group_off[it->group] = (uint32_t)rs->arena.n;
		for (uint32_t k = 0; k < g->nh; k++)
			VEC_PUSH(&rs->arena, it->src->holders[g->h0 + k]);
	}
	w.h0 = rs->group_off[it->group];
	w.n0 = (uint32_t)rs->arena.n;
	for (uint32_t k = 0; k < it->nneed; k++)
		VEC_PUSH(&rs->arena, it->need[k]);
	VEC_PUSH(&rs->work, w);
}

/* Least-loaded rank of ranks[0..n) by its NIC's load, lowest rank on ties. */
static int32_t
least_nic(const plan_topo_t *t, const int32_t *ranks, uint32_t n, const uint64_t *load)
{
	int32_t best = ranks[0];

	for (uint32_t i = 1; i < n; i++) {
		uint64_t a = load[plan_topo_nic(t, ranks[i])], b = load[plan_topo_nic(t, best)];

		if (a < b || (a == b && ranks[i] < best))
			best = ranks[i];
	}
	return best;
}

/* How many NICs hold a piece: its holders, or their nodes when NICs are shared. */
static uint32_t
holder_nics(const reshard_t *rs, const work_t *w)
{
	const int32_t *h = rs->arena.v + w->h0;
	uint32_t n = 0;

	if (!rs->topo->nic_per_node)
		return w->nh;
	for (uint32_t k = 0; k < w->nh; k++) {
		bool seen = false;

		for (uint32_t j = 0; j < k && !seen; j++)
			seen = rs->topo->rank_node[h[j]] == rs->topo->rank_node[h[k]];
		n += !seen;
	}
	return n;
}

/* Least-loaded rank of ranks[0..n) by load[], lowest rank on ties. */
static int32_t
least(const int32_t *ranks, uint32_t n, const uint64_t *load)
{
	int32_t best = ranks[0];

	for (uint32_t i = 1; i < n; i++)
		if (load[ranks[i]] < load[best] ||
		    (load[ranks[i]] == load[best] && ranks[i] < best))
			best = ranks[i];
	return best;
}

static void
emit(reshard_t *rs, uint32_t stage, int32_t from, int32_t to, uint32_t tensor,
     const plan_box_t *box)
{
	plan_xfer_t x = {.stage = stage, .from = from, .to = to,
			 .tensor = tensor, .box = *box};

	VEC_PUSH(rs->out, x);
}

/* A piece held inside its destination domain: NVLink or local copies. */
static void
assign_local(reshard_t *rs, const work_t *w)
{
	const int32_t *h = rs->arena.v + w->h0, *need = rs->arena.v + w->n0;
	int32_t *in_dom = xmalloc(w->nh * sizeof(*in_dom));
	uint32_t nin = 0;

	for (uint32_t k = 0; k < w->nh; k++)
		if (plan_topo_domain(rs->topo, h[k]) == w->domain)
			in_dom[nin++] = h[k];
	for (uint32_t k = 0; k < w->nn; k++) {
		int32_t n = need[k], s;

		if (xbsearch(&n, h, w->nh, sizeof(*h), cmp_i32v) != NULL) {
			emit(rs, 0, n, n, w->tensor, &w->box);
			continue;
		}
		s = least(in_dom, nin, rs->ld.nvl_send);
		rs->ld.nvl_send[s] += w->bytes;
		rs->ld.nvl_recv[n] += w->bytes;
		emit(rs, 0, s, n, w->tensor, &w->box);
	}
	free(in_dom);
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
	uint64_t min_part = rs->opts->chunk_bytes / 16;
	int64_t want = w->nn, cap;

	if (min_part < (64u << 10))
		min_part = 64u << 10;
	cap = (int64_t)(w->bytes / min_part);
	if (want > cap)
		want = cap;
	if (want < 2 || ndim == 0)
		return 1;
	for (int d = 0; d < ndim; d++) {
		if (w->box.size[d] >= want) {
			*dim = d;
			return want;
		}
	}
	*dim = 0;
	for (int d = 1; d < ndim; d++)
		if (w->box.size[d] > w->box.size[*dim])
			*dim = d;
	return w->box.size[*dim];
}

/* How a piece reached a domain: its parts and who received each. */
typedef struct served {
	plan_box_t *parts;
	int32_t *recv;
	int64_t np;
	uint32_t stage;  /* the stage its parts crossed the network */
} served_t;

static void
served_fini(served_t *s)
{
	free(s->parts);
	free(s->recv);
}

/* The least-loaded sender of part p among the domains in pool[0..n). */
static int32_t
least_relay(const reshard_t *rs, const served_t *pool, size_t n, int64_t p)
{
	int32_t best = pool[0].recv[p];

	for (size_t i = 1; i < n; i++) {
		int32_t r = pool[i].recv[p];
		uint64_t a = rs->ld.net_send[plan_topo_nic(rs->topo, r)];
		uint64_t c = rs->ld.net_send[plan_topo_nic(rs->topo, best)];

		if (a < c || (a == c && r < best))
			best = r;
	}
	return best;
}

/*
 * A piece that must cross the network into its domain: from the holders in
 * stage 0, or, relayed in stage `stage`, from whichever domain of pool
 * (served in earlier stages) has the least-loaded NIC for each part.
 * Inside the domain the receiver of each part forwards it over NVLink in
 * the next stage.
 */
static void
assign_network(reshard_t *rs, const work_t *w, const served_t *pool, size_t npool,
	       uint32_t stage, served_t *out)
{
	const plan_layout_t *t = &rs->dst->v[w->tensor];
	const int32_t *h = rs->arena.v + w->h0, *need = rs->arena.v + w->n0;
	const served_t *from = npool ? pool : NULL;
	int dim = 0;

	if (from != NULL) {
		out->np = from->np;
		out->parts = xmalloc((size_t)out->np * sizeof(*out->parts));
		memcpy(out->parts, from->parts, (size_t)out->np * sizeof(*out->parts));
	} else {
		out->np = part_count(rs, w, t->ndim, &dim);
		out->parts = xmalloc((size_t)out->np * sizeof(*out->parts));
		if (out->np == 1)
			out->parts[0] = w->box;
		else
			plan_box_split(&w->box, dim, out->np, out->parts);
	}
	out->recv = xmalloc((size_t)out->np * sizeof(*out->recv));
	out->stage = stage;
	for (int64_t p = 0; p < out->np; p++) {
		uint64_t b = (uint64_t)plan_box_volume(&out->parts[p], t->ndim) *
			     plan_dtype_size(t->dtype);
		int32_t r = least_nic(rs->topo, need, w->nn, rs->ld.net_recv);
		int32_t s = from ? least_relay(rs, pool, npool, p)
				 : least_nic(rs->topo, h, w->nh, rs->ld.net_send);

		rs->ld.net_send[plan_topo_nic(rs->topo, s)] += b;
		rs->ld.net_recv[plan_topo_nic(rs->topo, r)] += b;
		out->recv[p] = r;
		emit(rs, stage, s, r, w->tensor, &out->parts[p]);
		for (uint32_t k = 0; k < w->nn; k++) {
			if (need[k] == r)
				continue;
			rs->ld.nvl_send[r] += b;
			rs->ld.nvl_recv[need[k]] += b;
			emit(rs, stage + 1, r, need[k], w->tensor, &out->parts[p]);
		}
	}
}

/*
 * The same piece needed by K domains while only H < K ranks hold it: the
 * holders serve H domains in stage 0; in each later stage every domain
 * served so far can pass it on, so the served set doubles, each holder
 * sends the piece once instead of K / H times, and the destination NICs,
 * otherwise idle in that direction, carry the rest.  Which domains come
 * first rotates from run to run so no domain relays everything.
 */
static void
assign_relayed(reshard_t *rs, const size_t *run, size_t k)
{
	served_t *sv = xcalloc(k, sizeof(*sv));
	size_t nh = holder_nics(rs, &rs->work.v[run[0]]), done = 0, off = rs->rotate++ % k;
	uint32_t stage = 0;

	/* shared NICs: the sources serve at most half the domains and the served
	 * ones relay the rest, so a source NIC sends each piece about once */
	if (rs->topo->nic_per_node && nh > (k + 1) / 2)
		nh = (k + 1) / 2;
	while (done < k) {
		size_t take = stage == 0 ? (nh < k ? nh : k) : (done < k - done ? done : k - done);

		for (size_t i = done; i < done + take; i++)
			assign_network(rs, &rs->work.v[run[(i + off) % k]], sv,
				       stage ? done : 0, stage, &sv[i]);
		done += take;
		stage++;
	}
	for (size_t i = 0; i < k; i++)
		served_fini(&sv[i]);
	free(sv);
}

/* Order of network pieces by source group and box, to find runs. */
static int
cmp_piece(const void *a, const void *b, void *ctx)
{
	const work_t *v = ctx, *x = &v[*(const size_t *)a], *y = &v[*(const size_t *)b];
	int c;

	if (x->h0 != y->h0)
		return x->h0 < y->h0 ? -1 : 1;
	c = plan_box_cmp(&x->box, &y->box, PLAN_MAX_DIMS);
	if (c)
		return c;
	return (x->seq > y->seq) - (x->seq < y->seq);
}

/*
 * For every network piece, the first index of its run (same source group,
 * same box, other domains) in *run_of, and runs laid out in *runs; a run
 * is relayed when it has more domains than holders.
 */
static void
find_runs(reshard_t *rs, size_t **runs_out, size_t **start_out, size_t **len_out)
{
	size_t n = rs->work.n, m = 0;
	size_t *idx = xmalloc((n ? n : 1) * sizeof(*idx));
	size_t *start = xmalloc((n ? n : 1) * sizeof(*start));
	size_t *len = xcalloc(n ? n : 1, sizeof(*len));

	for (size_t i = 0; i < n; i++)
		if (!rs->work.v[i].local)
			idx[m++] = i;
	if (m > 1)
		qsort_r(idx, m, sizeof(*idx), cmp_piece, rs->work.v);
	for (size_t i = 0; i < n; i++)
		start[i] = SIZE_MAX;
	for (size_t i = 0; i < m;) {
		size_t j = i;
		const work_t *w = &rs->work.v[idx[i]];

		while (j < m && rs->work.v[idx[j]].h0 == w->h0 &&
		       plan_box_equal(&rs->work.v[idx[j]].box, &w->box, PLAN_MAX_DIMS))
			j++;
		for (size_t k = i; k < j; k++)
			start[idx[k]] = i;
		len[i] = j - i;
		i = j;
	}
	*runs_out = idx;
	*start_out = start;
	*len_out = len;
}

refit_status_t
plan_reshard(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	     const size_t *map, const plan_topo_t *topo, const plan_opts_t *opts,
	     xfervec_t *out, refit_err_t *err)
{
	reshard_t rs = {.dst = dst, .topo = topo, .opts = opts, .out = out};
	needs_visitor_t v = {.item = on_item, .ctx = &rs};
	size_t ns = (size_t)topo->nslots;
	refit_status_t rc = REFIT_OK;

	rs.ld.net_send = xcalloc(ns, sizeof(uint64_t));
	rs.ld.net_recv = xcalloc(ns, sizeof(uint64_t));
	rs.ld.nvl_send = xcalloc(ns, sizeof(uint64_t));
	rs.ld.nvl_recv = xcalloc(ns, sizeof(uint64_t));
	for (size_t i = 0; i < dst->n && rc == REFIT_OK; i++) {
		srcidx_t ix;

		srcidx_build(&ix, &src->v[map[i]]);
		rs.group_off = xmalloc((ix.ng ? ix.ng : 1) * sizeof(uint32_t));
		memset(rs.group_off, 0xff, (ix.ng ? ix.ng : 1) * sizeof(uint32_t));
		rc = needs_walk(&ix, &dst->v[i], (uint32_t)i, topo, &v, err);
		free(rs.group_off);
		srcidx_fini(&ix);
	}
	if (rc == REFIT_OK) {
		/* largest first, creation order on ties: a stable radix sort on
		 * (max - bytes) */
		xkey_t *k = xmalloc((rs.work.n ? rs.work.n : 1) * sizeof(*k));
		uint64_t max = 0;

		for (size_t i = 0; i < rs.work.n; i++)
			max = rs.work.v[i].bytes > max ? rs.work.v[i].bytes : max;
		for (size_t i = 0; i < rs.work.n; i++)
			k[i] = (xkey_t){max - rs.work.v[i].bytes, (uint32_t)i};
		plan_radix_sort(k, rs.work.n, plan_bits_for(max));
		size_t *runs, *start, *len;

		find_runs(&rs, &runs, &start, &len);
		for (size_t i = 0; i < rs.work.n; i++) {
			size_t wi = k[i].idx, st = start[wi];
			const work_t *w = &rs.work.v[wi];
			served_t one;

			if (w->local) {
				assign_local(&rs, w);
			} else if (len[st] > holder_nics(&rs, w) ||
				   (topo->nic_per_node && len[st] > 1)) {
				assign_relayed(&rs, runs + st, len[st]); /* the whole run */
				len[st] = 0;
			} else if (len[st] != 0) {
				assign_network(&rs, w, NULL, 0, 0, &one);
				served_fini(&one);
			}
		}
		free(runs);
		free(start);
		free(len);
		free(k);
	}
	VEC_FREE(&rs.work);
	VEC_FREE(&rs.arena);
	free(rs.ld.net_send);
	free(rs.ld.net_recv);
	free(rs.ld.nvl_send);
	free(rs.ld.nvl_recv);
	return rc;
}
