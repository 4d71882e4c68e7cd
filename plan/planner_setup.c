/*
 * planner_setup.c - the reshard planner's state: its life cycle and the
 * tables built before assignment.
 *
 * Per domain its ranks, per tensor its destination ranks (both CSR,
 * ascending), per NIC the domain of its ranks (send generations), which
 * domains hop (choose_hops, after the needs walk), and each piece's run
 * of network work items (find_runs).  Calls planner_state.c only.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/planner_internal.h"

/* Every domain's ranks, ascending (CSR in dom_r0 / dom_ranks). */
static void
domain_ranks(reshard_t *rs)
{
	const plan_topo_t *t = rs->topo;
	int32_t *fill;

	rs->dom_r0 = xcalloc((size_t)t->ndomains + 1, sizeof(int32_t));
	rs->dom_ranks = xmalloc(((size_t)t->nranks + 1) * sizeof(int32_t));
	for (int32_t r = 0; r < t->nslots; r++)
		if (t->rank_domain[r] >= 0)
			rs->dom_r0[t->rank_domain[r] + 1]++;
	for (int32_t d = 0; d < t->ndomains; d++)
		rs->dom_r0[d + 1] += rs->dom_r0[d];
	fill = xmalloc(((size_t)t->ndomains + 1) * sizeof(int32_t));
	memcpy(fill, rs->dom_r0, ((size_t)t->ndomains + 1) * sizeof(int32_t));
	for (int32_t r = 0; r < t->nslots; r++)
		if (t->rank_domain[r] >= 0)
			rs->dom_ranks[fill[t->rank_domain[r]]++] = r;
	free(fill);
}

/* Which domain each NIC's ranks are in, for send generations. */
static void
nic_domains(reshard_t *rs)
{
	const plan_topo_t *t = rs->topo;

	rs->dom_gen = xcalloc((size_t)t->ndomains + 1, sizeof(uint64_t));
	for (int k = 0; k < 2; k++) {
		domleast_t *dl = k ? &rs->least_recv : &rs->least_send;

		dl->rank = xcalloc((size_t)t->ndomains + 1, sizeof(int32_t));
		dl->gen = xcalloc((size_t)t->ndomains + 1, sizeof(uint64_t));
	}
	rs->run.dom_slot = xmalloc(((size_t)t->ndomains + 1) * sizeof(int32_t));
	for (int32_t d = 0; d <= t->ndomains; d++)
		rs->run.dom_slot[d] = -1;
	rs->nic_dom = xmalloc(((size_t)t->nslots + 1) * sizeof(int32_t));
	for (int32_t n = 0; n <= t->nslots; n++)
		rs->nic_dom[n] = -2; /* no rank yet */
	for (int32_t r = 0; r < t->nslots; r++) {
		int32_t d = t->rank_domain[r], *nd;

		if (d < 0)
			continue;
		nd = &rs->nic_dom[plan_topo_nic(t, r)];
		*nd = *nd == -2 || *nd == d ? d : -1;
	}
}

/* Every tensor's destination ranks, ascending (CSR in dst_r0 / dst_ranks). */
static void
dst_ranks(reshard_t *rs)
{
	i32vec_t v = {0};

	rs->dst_r0 = xcalloc(rs->dst->n + 1, sizeof(int32_t));
	for (size_t i = 0; i < rs->dst->n; i++) {
		const plan_layout_t *t = &rs->dst->v[i];
		size_t first = v.n, k = first;

		for (size_t j = 0; j < t->nshards; j++)
			VEC_PUSH(&v, t->shards[j].rank);
		xqsort(v.v + first, v.n - first, sizeof(int32_t), cmp_i32v);
		for (size_t j = first; j < v.n; j++)
			if (j == first || v.v[j] != v.v[j - 1])
				v.v[k++] = v.v[j];
		v.n = k;
		rs->dst_r0[i + 1] = (int32_t)v.n;
	}
	rs->dst_ranks = v.v ? v.v : xmalloc(sizeof(int32_t));
}

/*
 * Which domains take hops (hop_in, hop_out): a domain whose needing ranks
 * would each bring in no more than the domain's share (every NIC busy, as
 * on a DGX node) gains nothing from taking parts in through another NIC,
 * and a source domain whose every rank holds or needs data has no free NIC
 * to send through; hops there would only add NVLink copies and transfers.
 * (Relays between destination domains may always hop: which rank of a
 * served domain holds a part is an accident of the receive side.)
 */
void
reshard_choose_hops(reshard_t *rs, const plan_layout_set_t *src)
{
	const plan_topo_t *t = rs->topo;
	size_t nd = (size_t)t->ndomains;
	uint64_t *dom_nics = rs->dom_nics = xcalloc(nd + 1, sizeof(uint64_t));
	uint64_t *max_own = xcalloc(nd + 1, sizeof(uint64_t));
	uint8_t *nic_seen = xcalloc((size_t)t->nslots + 1, 1);

	rs->busy = xcalloc((size_t)t->nslots + 1, 1);
	rs->hop_in = xcalloc(nd + 1, 1);
	rs->hop_out = xcalloc(nd + 1, 1);
	for (size_t i = 0; i < src->n; i++)
		for (size_t k = 0; k < src->v[i].nshards; k++)
			rs->busy[src->v[i].shards[k].rank] = 1;
	for (size_t i = 0; i < rs->dst->n; i++)
		for (size_t k = 0; k < rs->dst->v[i].nshards; k++)
			rs->busy[rs->dst->v[i].shards[k].rank] = 1;
	for (int32_t r = 0; r < t->nslots; r++) {
		int32_t d = t->rank_domain[r], nic;

		if (d < 0)
			continue;
		nic = plan_topo_nic(t, r);
		if (!nic_seen[nic]) {
			nic_seen[nic] = 1;
			dom_nics[d]++;
			max_own[d] = rs->own_in[nic] > max_own[d] ? rs->own_in[nic] : max_own[d];
		}
		rs->hop_out[d] |= !rs->busy[r];
	}
	for (size_t d = 0; d < nd; d++)
		rs->hop_in[d] = dom_nics[d] > 0 &&
				max_own[d] > rs->dom_in[d] / dom_nics[d] + rs->opts->chunk_bytes;
	for (size_t d = 0; d < nd; d++)
		rs->net0 |= rs->hop_out[d];
	free(max_own);
	free(nic_seen);
}

/*
 * Runs: the network work items of each piece (same source group, same
 * box, other domains), in creation order, laid out piece by piece in
 * *runs_out; run_off / run_len per piece.  A run is relayed when it has
 * more domains than holders.
 */
void
reshard_find_runs(reshard_t *rs, uint32_t **runs_out, uint32_t **off_out, uint32_t **len_out)
{
	size_t n = rs->work.n, np = rs->pieces.n;
	uint32_t *len = xcalloc(np ? np : 1, sizeof(*len));
	uint32_t *off = xmalloc((np ? np : 1) * sizeof(*off));
	uint32_t *fill = xmalloc((np ? np : 1) * sizeof(*fill));
	uint32_t *runs, m = 0;

	for (size_t i = 0; i < n; i++)
		if (!rs->work.v[i].local)
			len[rs->work.v[i].piece]++;
	for (size_t p = 0; p < np; p++) {
		off[p] = fill[p] = m;
		m += len[p];
	}
	runs = xmalloc((m ? m : 1) * sizeof(*runs));
	for (size_t i = 0; i < n; i++)
		if (!rs->work.v[i].local)
			runs[fill[rs->work.v[i].piece]++] = (uint32_t)i;
	free(fill);
	*runs_out = runs;
	*off_out = off;
	*len_out = len;
}

void
reshard_init(reshard_t *rs, const plan_layout_set_t *dst, const plan_topo_t *topo,
	     const plan_opts_t *opts, cxvec_t *out, boxvec_t *boxes)
{
	size_t ns = (size_t)topo->nslots;

	*rs = (reshard_t){.dst = dst, .topo = topo, .opts = opts, .out = out,
			  .boxes = boxes};
	rs->pair.set_dom = topo->rank_domain;
	rs->relayed.seen = xcalloc(ns * RELAY_SEEN_WORDS, sizeof(uint64_t));
	rs->min_hop = opts->chunk_bytes / 16 ? opts->chunk_bytes / 16 : 1;
	rs->dom_in = xcalloc((size_t)topo->ndomains + 1, sizeof(uint64_t));
	rs->own_in = xcalloc(ns, sizeof(uint64_t));
	rs->round_of = xcalloc(ns, sizeof(uint32_t));
	rs->dom_send = xcalloc((size_t)topo->ndomains + 1, sizeof(uint64_t));
	rs->round_fill = xcalloc(ns, sizeof(uint64_t));
	rs->stage_used = xcalloc(1u << ROUND_SHIFT, 1);
	domain_ranks(rs);
	dst_ranks(rs);
	nic_domains(rs);
	rs->ld.net_send = xcalloc(ns, sizeof(uint64_t));
	rs->ld.net_recv = xcalloc(ns, sizeof(uint64_t));
	rs->ld.nvl_send = xcalloc(ns, sizeof(uint64_t));
	rs->ld.nvl_recv = xcalloc(ns, sizeof(uint64_t));
}

void
reshard_fini(reshard_t *rs)
{
	VEC_FREE(&rs->work);
	VEC_FREE(&rs->scratch);
	VEC_FREE(&rs->pieces);
	free(rs->pidx.slot);
	VEC_FREE(&rs->arena);
	VEC_FREE(&rs->unit);
	free(rs->round_of);
	free(rs->dom_send);
	free(rs->dom_in);
	free(rs->own_in);
	free(rs->busy);
	free(rs->hop_in);
	free(rs->hop_out);
	free(rs->dom_nics);
	reshard_relays_fini(&rs->relayed);
	free(rs->pair.s);
	free(rs->sendpair.s);
	free(rs->dst_r0);
	free(rs->dst_ranks);
	free(rs->round_fill);
	free(rs->stage_used);
	free(rs->dom_r0);
	free(rs->dom_ranks);
	free(rs->nic_dom);
	free(rs->dom_gen);
	free(rs->least_send.rank);
	free(rs->least_send.gen);
	free(rs->least_recv.rank);
	free(rs->least_recv.gen);
	free(rs->run.dom_slot);
	VEC_FREE(&rs->run.spec);
	free(rs->ld.net_send);
	free(rs->ld.net_recv);
	free(rs->ld.nvl_send);
	free(rs->ld.nvl_recv);
}
