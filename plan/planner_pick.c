/*
 * planner_pick.c - who sends each part over the network and who takes it
 * in (phase B of planner.c).
 *
 * Loads are bytes per NIC in each direction (ld.net_send, ld.net_recv),
 * with each domain's least-loaded NIC kept until one of its NICs takes
 * more (domleast_t, send generations).  A receiver is a rank needing the
 * part or, where the domain hops, another rank that stages it; a sender is
 * a holder (or a helper of its domain) or, in a relayed run, a rank of a
 * domain served in an earlier wave (the run's kept values, run_t).  Pair
 * and sender affinity keep partners while a part fits their last message.
 * Calls planner_state.c only.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/planner_internal.h"

/* Least-loaded rank of ranks[0..n) by its NIC's load, lowest rank on ties. */
static int32_t
least_nic(const plan_topo_t *t, const int32_t *ranks, uint32_t n, const uint64_t *load)
{
	int32_t best = ranks[0];
	uint64_t b = load[plan_topo_nic(t, best)];

	for (uint32_t i = 1; i < n; i++) {
		uint64_t a = load[plan_topo_nic(t, ranks[i])];

		if (a < b || (a == b && ranks[i] < best)) {
			best = ranks[i];
			b = a;
		}
	}
	return best;
}

/* Domain d's least-loaded rank by load (least_nic over its ranks), kept
 * in dl while valid. */
static int32_t
dom_least(reshard_t *rs, domleast_t *dl, int32_t d, const uint64_t *load)
{
	int32_t d0 = rs->dom_r0[d], nd = rs->dom_r0[d + 1] - d0;

	if (dl->gen[d] != dl->all + 1) {
		dl->rank[d] = least_nic(rs->topo, rs->dom_ranks + d0, (uint32_t)nd, load);
		dl->gen[d] = dl->all + 1;
	}
	return dl->rank[d];
}

/*
 * The rank of domain w->domain that takes part b in over the network: the
 * needing rank with the least-loaded NIC, unless another rank of the domain
 * (one that holds another instance, or nothing) has a NIC less loaded
 * still; then that rank takes it in and forwards it over NVLink, and the
 * part is relay data in its staging (hierarchical receive).
 */
static int32_t
pick_least(reshard_t *rs, const work_t *w, uint64_t b, bool hop)
{
	const plan_topo_t *t = rs->topo;
	const int32_t *need = rs->arena.v + w->n0;
	int32_t r = least_nic(t, need, w->nn, rs->ld.net_recv), q;

	if (!hop)
		return r;
	q = dom_least(rs, &rs->least_recv, w->domain, rs->ld.net_recv);
	if (rs->ld.net_recv[plan_topo_nic(t, q)] >= rs->ld.net_recv[plan_topo_nic(t, r)] ||
	    reshard_unit_relayed(rs, q) + b > rs->opts->staging_bytes / 2 ||
	    !reshard_relay_ok(rs, q, true))
		return r;
	return q;
}

/*
 * How far above the least-loaded choice an affinity may keep a NIC: n
 * chunks, but at most n / 32 of the NIC's share of what w's domain takes
 * in, so that small plans stay balanced.
 */
static uint64_t
slack(const reshard_t *rs, const work_t *w, uint64_t n)
{
	uint64_t c = n * rs->opts->chunk_bytes, nics = rs->dom_nics[w->domain];
	uint64_t s = nics ? n * (rs->dom_in[w->domain] / nics / 32) : 0;

	return c < s ? c : s;
}

/* May r take the part in: it needs it, or it may hop and stage it. */
static bool
recv_ok(reshard_t *rs, const work_t *w, int32_t r, uint64_t b, bool hop)
{
	return among_n(rs->arena.v + w->n0, w->nn, r) ||
	       (hop && reshard_unit_relayed(rs, r) + b <= rs->opts->staging_bytes / 2 &&
		reshard_relay_ok(rs, r, true));
}

/*
 * Pair affinity: the message rule packs the transfers of one (stage, from,
 * to) group into messages of up to chunk_bytes, so a part from a sending
 * NIC goes to the rank that took the last one in from it in that stage
 * (pairmap_t) while it fits in that group's last message: the message
 * fills up instead of a new one starting elsewhere.  When it does not fit
 * a new message starts anyway, and the part goes to the least-loaded
 * rank (the partner when within chunk_bytes of it, keeping groups few).
 */
int32_t
reshard_pick_receiver(reshard_t *rs, const work_t *w, uint64_t b, int32_t s, uint32_t stage)
{
	const plan_topo_t *t = rs->topo;
	const int32_t *need = rs->arena.v + w->n0;
	int32_t d0 = rs->dom_r0[w->domain], nd = rs->dom_r0[w->domain + 1] - d0;
	bool hop = rs->hop_in[w->domain] && nd > (int32_t)w->nn && b >= rs->min_hop;
	int32_t nic = plan_topo_nic(t, s), r = pick_least(rs, w, b, hop), q = -1;
	/* partners per domain, and per set of ranks needing the part (the
	 * domain's regions give disjoint or equal sets, named by their first
	 * rank) for parts that must enter through one of them */
	pairent_t *pd, *ps;
	pairent_t cand[2];
	uint64_t chunk = rs->opts->chunk_bytes, lr = rs->ld.net_recv[plan_topo_nic(t, r)];
	uint64_t fill = 0;
	bool fits = false;

	if (!hop && w->nn == 1) { /* no choice: the domain's partner follows */
		if (rs->nplog == PAIR_LOG)
			reshard_pair_flush(rs);
		rs->plog[rs->nplog++] = (pairlog_t){reshard_pair_key(stage, nic, w->domain), r, b};
		return r;
	}
	reshard_pair_flush(rs);
	reshard_pair_reserve(&rs->pair, 2);
	pd = reshard_pair_at(&rs->pair, reshard_pair_key(stage, nic, w->domain));
	ps = reshard_pair_at(&rs->pair, reshard_pair_key(stage, nic, need[0] | 1 << 23));
	cand[0] = *pd;
	cand[1] = *ps;
	for (int i = 0; i < 2; i++) {
		int32_t c = cand[i].rank;
		bool f;

		if (c < 0 || (i == 1 && c == cand[0].rank))
			continue;
		f = b <= chunk && cand[i].fill + b <= chunk;
		if (rs->ld.net_recv[plan_topo_nic(t, c)] > lr + slack(rs, w, f ? 2 : hop) ||
		    (q >= 0 && (fits || !f)) || !recv_ok(rs, w, c, b, hop))
			continue;
		q = c;
		fits = f;
		fill = cand[i].fill;
	}
	if (q >= 0)
		r = q;
	/* the group's last message after this part (a new one unless it fits) */
	fill = b > chunk ? chunk + 1 : fits ? fill + b : b;
	*pd = (pairent_t){r, reshard_fill32(fill)};
	if (among_n(need, w->nn, r)) {
		*ps = (pairent_t){r, reshard_fill32(fill)};
	} else {
		reshard_unit_relay(rs, r, b);
		reshard_relay_note(rs, r);
	}
	return r;
}

static uint64_t
nic_send(const reshard_t *rs, int32_t r)
{
	return rs->ld.net_send[plan_topo_nic(rs->topo, r)];
}

/*
 * Send generations: a count that changes whenever a NIC of domain d sends
 * more (NICs shared across domains bump every domain's), so a minimum
 * over a domain's NICs can be kept until then.  Never 0.
 */
static uint64_t
send_gen(const reshard_t *rs, int32_t d)
{
	return rs->dom_gen[d] + rs->all_gen + 1;
}

/* rank's NIC takes b more load in one direction (load, with dl). */
int32_t
reshard_nic_add(reshard_t *rs, uint64_t *load, domleast_t *dl, int32_t rank, uint64_t b)
{
	int32_t nic = plan_topo_nic(rs->topo, rank), d = rs->nic_dom[nic];

	load[nic] += b;
	if (d < 0)
		dl->all++;
	else if (dl->gen[d] != 0 && plan_topo_nic(rs->topo, dl->rank[d]) == nic)
		dl->gen[d] = 0;
	return d;
}

void
reshard_send_add(reshard_t *rs, int32_t rank, uint64_t b)
{
	int32_t d = reshard_nic_add(rs, rs->ld.net_send, &rs->least_send, rank, b);

	if (d >= 0)
		rs->dom_gen[d]++;
	else
		rs->all_gen++;
}

/*
 * Hierarchical send: the least-loaded NIC of domain d, when it is less
 * loaded than `best`'s and its rank may stage b more bytes; else best.
 */
static int32_t
helper_of(reshard_t *rs, int32_t d, int32_t best, uint64_t b, bool dst_ok)
{
	int32_t g;

	if ((!dst_ok && !rs->hop_out[d]) || b < rs->min_hop)
		return best;
	g = dom_least(rs, &rs->least_send, d, rs->ld.net_send);
	if (nic_send(rs, g) + (dst_ok && !rs->hop_out[d] ? 8 * rs->opts->chunk_bytes : 0) >= nic_send(rs, best) ||
	    reshard_unit_relayed(rs, g) + b > rs->opts->staging_bytes / 2 ||
	    !reshard_relay_ok(rs, g, dst_ok))
		return best;
	return g;
}

/* Refresh sv's least-loaded needing rank when a NIC of its domain has
 * sent more since: the first of the ranks needing it with the least load. */
static void
served_min_slow(const reshard_t *rs, const served_t *sv, uint64_t gen)
{
	const int32_t *need = rs->arena.v + sv->w->n0;
	served_t *c = (served_t *)sv;

	c->min_rank = -1;
	c->min_load = UINT64_MAX;
	for (uint32_t k = 0; k < sv->w->nn; k++)
		if (nic_send(rs, need[k]) < c->min_load) {
			c->min_rank = need[k];
			c->min_load = nic_send(rs, need[k]);
		}
	c->gen = gen;
}

static inline void
served_min(const reshard_t *rs, const served_t *sv)
{
	uint64_t gen = send_gen(rs, sv->dom);

	if (sv->gen != gen)
		served_min_slow(rs, sv, gen);
}

/*
 * The least-loaded rank of served domain sv holding part p, and from which
 * stage (*stage): the rank that took it in (one stage after it arrived), a
 * helper it was copied to for an earlier wave, or a rank needing it (two
 * stages after: it was forwarded).  Of the ranks needing it, the first with
 * the least load, when below the others' (what taking each strictly less
 * loaded one in turn gives).
 */
static int32_t
least_holding(const reshard_t *rs, const served_t *sv, int64_t p, uint32_t *stage)
{
	int32_t best = sv->pt[p].recv;

	*stage = sv->pt[p].at + 1;
	if (sv->pt[p].help >= 0 && nic_send(rs, sv->pt[p].help) < nic_send(rs, best)) {
		best = sv->pt[p].help;
		*stage = sv->pt[p].help_at;
	}
	served_min(rs, sv);
	if (sv->min_load < nic_send(rs, best)) {
		best = sv->min_rank;
		*stage = sv->pt[p].at + 2;
	}
	return best;
}

/* How loaded the NICs are that could pass part p on from served domain sv:
 * all of the domain's when it may hop, else the least loaded of the ranks
 * holding the part (least_holding's choice). */
static inline double
relay_load(const reshard_t *rs, const served_t *sv, int64_t p)
{
	int32_t d = sv->dom;
	uint64_t l;

	if (rs->hop_out[d])
		return (double)rs->dom_send[d] / rs->topo->domain_size[d];
	served_min(rs, sv);
	l = sv->min_load;
	if (nic_send(rs, sv->pt[p].recv) < l)
		l = nic_send(rs, sv->pt[p].recv);
	if (sv->pt[p].help >= 0 && nic_send(rs, sv->pt[p].help) < l)
		l = nic_send(rs, sv->pt[p].help);
	return (double)l;
}

/* A served domain's load when no part-specific rank counts: relay_load
 * of a part it took in through a rank needing it and has no helper for. */
static double
run_value(const reshard_t *rs, const served_t *sv)
{
	if (rs->hop_out[sv->dom])
		return (double)rs->dom_send[sv->dom] / rs->topo->domain_size[sv->dom];
	served_min(rs, sv);
	return (double)sv->min_load;
}

/*
 * The value a run keeps for served domain sv (run_t.v).  A piece of one
 * part (most of them at scale) has no other part: its relay_load is
 * kept, so pick_sender needs no per-part list (run_spec) at all.
 */
double
reshard_run_key(const reshard_t *rs, const served_t *sv)
{
	return sv->np == 1 ? relay_load(rs, sv, 0) : run_value(rs, sv);
}

/* The least of the run's first n values, lowest domain on ties; kept
 * between calls (values change only in run_set and run_touch). */
static size_t
run_best(run_t *r, size_t n)
{
	size_t b = 0;

	if (r->best_ok && n == r->n)
		return r->best;
	for (size_t i = 1; i < n; i++)
		if (run_before(r, i, b))
			b = i;
	if (n == r->n) {
		r->best = b;
		r->best_ok = true;
	}
	return b;
}

/* Entry i's value is now x: the kept least stays exact (values of other
 * entries did not change). */
static void
run_set(run_t *r, size_t i, double x)
{
	double old = r->v[i];

	r->v[i] = x;
	if (!r->best_ok || i >= r->n)
		return;
	if (i == r->best)
		r->best_ok = x <= old; /* it may no longer be the least */
	else if (run_before(r, i, r->best))
		r->best = i;
}

/* After rank s sent more: the run's values that may have changed. */
void
reshard_run_touch(reshard_t *rs, int32_t s)
{
	run_t *r = &rs->run;
	int32_t d = plan_topo_domain(rs->topo, s), slot;

	if (r->sv == NULL)
		return;
	if (rs->nic_dom[plan_topo_nic(rs->topo, s)] != d) { /* a NIC shared by domains */
		for (size_t i = 0; i < r->n; i++)
			r->v[i] = reshard_run_key(rs, &r->sv[i]);
		r->best_ok = false;
		return;
	}
	slot = r->dom_slot[d];
	if (slot >= 0 && (size_t)slot < r->n)
		run_set(r, (size_t)slot, reshard_run_key(rs, &r->sv[slot]));
}

/* Part p of the run's entry sv counts a rank of its own (see run_t);
 * with one part, v has it already (run_key). */
void
reshard_run_spec(reshard_t *rs, const served_t *sv, int64_t p)
{
	run_t *r = &rs->run;

	if (sv->np == 1)
		return;
	VEC_PUSH(&r->spec, ((specrec_t){(uint32_t)(sv - r->sv), r->spec_head[p]}));
	r->spec_head[p] = (int32_t)(r->spec.n - 1);
}

/*
 * The stage in which the part being assigned crosses the network, when
 * its sender has it from stage `ready` on: net0 + 2 * wave.  Every wave of
 * every piece sends in one stage (the one before holds the NVLink copies
 * to helpers, the one after the forwards to the ranks needing the part),
 * so a round's pipeline fills through one network message per wave, not
 * one per stage some part happens to send in, and parts between the same
 * pair of NICs share stages, hence messages.  A sender of wave w has its
 * part by then: it was served in an earlier wave (stage net0 + 2(w-1) or
 * before) and forwarded or copied in the stage after.
 */
static uint32_t
net_stage(const reshard_t *rs, uint32_t ready)
{
	uint32_t s = rs->net0 + 2 * rs->wave;

	return ready > s ? ready : s;
}

/*
 * Sender affinity, for parts sent from their holders: the rank that sent
 * the last part of this destination domain and set of ranks needing it
 * (a holder, or a helper of the same domain) sends this one too while its
 * NIC is within two chunks of the least-loaded choice g, so a sending NIC
 * serves few receivers (pick_receiver pairs it with one per set) in few
 * (stage, from, to) groups.  best: the least-loaded holder.
 */
static int32_t
sender_affinity(reshard_t *rs, const work_t *w, const int32_t *h, uint32_t nh, int32_t best,
		int32_t g, uint64_t b)
{
	const plan_topo_t *t = rs->topo;
	const int32_t *need = rs->arena.v + w->n0;
	pairent_t *pe;
	int32_t p, d = plan_topo_domain(t, best);

	reshard_pair_reserve(&rs->sendpair, 1);
	pe = reshard_pair_at(&rs->sendpair,
			     reshard_pair_key(rs->wave, w->domain, need[0] | 1 << 23));
	p = pe->rank;

	if (p >= 0 && p != g &&
	    nic_send(rs, p) <= nic_send(rs, g) + slack(rs, w, 2) &&
	    (xbsearch(&p, h, nh, sizeof(*h), cmp_i32v) != NULL ||
	     (plan_topo_domain(t, p) == d && rs->hop_out[d] && b >= rs->min_hop &&
	      reshard_unit_relayed(rs, p) + b <= rs->opts->staging_bytes / 2 &&
	      reshard_relay_ok(rs, p, false))))
		g = p;
	pe->rank = g;
	return g;
}

/* best copies the part being assigned (b bytes) over NVLink to helper g
 * in the stage before `stage`, in which g sends it on; g. */
static int32_t
copy_to_helper(reshard_t *rs, const piece_t *pw, int32_t best, int32_t g, uint64_t b,
	       uint32_t stage)
{
	reshard_unit_relay(rs, g, b);
	reshard_relay_note(rs, g);
	rs->ld.nvl_send[best] += b;
	rs->ld.nvl_recv[g] += b;
	reshard_emit(rs, stage - 1, best, g, pw->tensor, rs->cur_box);
	return g;
}

/*
 * The sender of a part from its holders: the least-loaded holder's NIC in
 * stage 0, or a less loaded NIC of its domain that the holder copies the
 * part to over NVLink in stage 0 and that sends it in stage 1.
 */
static int32_t
send_from_holders(reshard_t *rs, const work_t *w, uint64_t b, uint32_t *stage)
{
	const piece_t *pw = pc(rs, w);
	const int32_t *h = rs->arena.v + pw->h0;
	int32_t best = least_nic(rs->topo, h, pw->nh, rs->ld.net_send), g;

	/* a piece other domains need too would reach the helper twice */
	g = helper_of(rs, plan_topo_domain(rs->topo, best), best, b, false);
	g = sender_affinity(rs, w, h, pw->nh, best, g, b);
	if (xbsearch(&g, h, pw->nh, sizeof(*h), cmp_i32v) != NULL)
		best = g; /* a holder: no copy */
	*stage = net_stage(rs, g != best);
	if (g != best)
		return copy_to_helper(rs, pw, best, g, b, *stage);
	return best;
}

/*
 * The served domain of pool whose NICs have sent least (relay_load: all
 * of them when it may hop, else the one that took part p in), lowest
 * domain on ties.  In the relayed run: the least of the kept values, or a
 * domain where a rank of this part counts, the same choice (with one
 * part, the kept values are relay_load: no list).
 */
static const served_t *
least_served(reshard_t *rs, const served_t *pool, size_t npool, int64_t p)
{
	const served_t *sv = &pool[0];
	double lc;

	if (pool == rs->run.sv && npool <= rs->run.n) {
		size_t i0 = run_best(&rs->run, npool);

		sv = &pool[i0];
		lc = rs->run.v[i0];
		for (int32_t k = rs->run.spec_head[p]; k >= 0; k = rs->run.spec.v[k].next) {
			size_t i = rs->run.spec.v[k].entry;
			double la;

			if (i >= npool)
				continue;
			la = relay_load(rs, &pool[i], p);
			if (la < lc || (la == lc && pool[i].dom < sv->dom)) {
				sv = &pool[i];
				lc = la;
			}
		}
		return sv;
	}
	lc = relay_load(rs, sv, p);
	for (size_t i = 1; i < npool; i++) {
		double la = relay_load(rs, &pool[i], p);

		if (la < lc || (la == lc && pool[i].dom < sv->dom)) {
			sv = &pool[i];
			lc = la;
		}
	}
	return sv;
}

/*
 * Who sends part p of w over the network and in which stage (*stage).
 * From the holders (pool empty): send_from_holders.  From domains served
 * earlier: the least-loaded of them (least_served), and in it the rank
 * that took the part in (stage after it arrived), a rank that needs it (it
 * has it one stage later, forwarded), or any other rank of the domain
 * that the receiver copies it to.
 */
int32_t
reshard_pick_sender(reshard_t *rs, const work_t *w, const served_t *pool, size_t npool,
		    int64_t p, uint64_t b, uint32_t *stage)
{
	const served_t *sv;
	int32_t best, g;

	if (npool == 0)
		return send_from_holders(rs, w, b, stage);
	sv = least_served(rs, pool, npool, p);
	best = least_holding(rs, sv, p, stage);
	/* a rank of the served domain not needing the part needs nothing of
	 * it: the domain's regions are disjoint */
	g = helper_of(rs, sv->dom, best, b, true);
	if (g == best || sv->pt[p].help >= 0) { /* one helper per part and domain */
		*stage = net_stage(rs, *stage);
		return best;
	}
	/* g is less loaded than every rank holding the part: a new helper */
	*stage = net_stage(rs, sv->pt[p].at + 2);
	best = sv->pt[p].recv;
	((served_t *)sv)->pt[p].help = g;
	((served_t *)sv)->pt[p].help_at = *stage;
	if (pool == rs->run.sv)
		reshard_run_spec(rs, sv, p);
	return copy_to_helper(rs, pc(rs, w), best, g, b, *stage);
}
