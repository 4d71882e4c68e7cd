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
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "plan/internal.h"

/*
 * A piece: one box of one source group's data, stored once however many
 * domains need it (they form its run).  Work items, one per (domain,
 * piece), are 16 bytes: a 2,048-rank plan has over ten million.
 */
typedef struct piece {
	plan_box_t box;
	uint64_t bytes;
	uint32_t tensor;
	uint32_t h0, nh;  /* holders in the arena */
} piece_t;

typedef struct work {
	uint32_t piece;
	int32_t domain;
	uint32_t n0;      /* ranks needing it, in the arena */
	uint32_t nn : 31;
	uint32_t local : 1; /* a holder is in the domain */
} work_t;

/* Pieces by (holders, box): open addressing, slot = piece index + 1. */
typedef struct pieceidx {
	uint32_t *slot;
	size_t cap;
} pieceidx_t;

typedef struct loads {
	uint64_t *net_send, *net_recv, *nvl_send, *nvl_recv; /* per rank id */
} loads_t;

/* Relay data a unit of work leaves on a rank that does not need it. */
typedef struct urelay {
	int32_t rank;
	uint64_t bytes;
} urelay_t;

/* Boxes of one tensor a rank received as relay data (relays_*). */
typedef struct relrec {
	uint32_t box;     /* in the box table */
	uint32_t next;    /* UINT32_MAX: end */
} relrec_t;

#define RELAY_SEEN_WORDS 16 /* a 1,024-bit filter per rank */

typedef struct relays {
	uint64_t *seen;   /* per rank: RELAY_SEEN_WORDS words, bit relay_bit(t)
			     set when the rank has records of tensor t */
	uint64_t *key;    /* (tensor << 32 | rank) + 1; 0: free slot */
	uint32_t *head;   /* first record */
	size_t cap, n;
	VEC(relrec_t) rec;
} relays_t;

/*
 * The relayed run being assigned (assign_relayed): for each served domain
 * in the pool, its load when no part-specific rank counts (v: the hop
 * load, or its least-loaded needing NIC's), kept current as NICs send;
 * and per part the served domains where one does (a receiver that does
 * not need the part, a helper), listed in spec.  The domain pick_sender
 * wants is then the least of v, or one of those.
 */
typedef struct specrec {
	uint32_t entry;
	int32_t next;     /* -1: end */
} specrec_t;

struct served;

typedef struct run {
	struct served *sv;  /* NULL: no run */
	size_t k;           /* its domains (entries of sv) */
	size_t n;           /* entries in the pool (with v) */
	double *v;
	size_t best;        /* the least of v (lowest domain on ties), */
	bool best_ok;       /* when true (run_best) */
	int32_t *spec_head; /* per part */
	VEC(specrec_t) spec;
	int32_t *dom_slot;  /* per domain: its entry in the run, -1 */
} run_t;

/*
 * Pair affinity: per (stage, sending NIC, destination domain or set of
 * ranks needing the part), the rank that last took a part in from that NIC
 * in that stage, and how full the last message of that (stage, from, to)
 * group is.  Open addressing; key 0 is a free slot.
 */
typedef struct pairent {
	int32_t rank;
	uint32_t fill;    /* bytes in the group's last message (saturating);
			     > chunk: full */
} pairent_t;

typedef struct pairslot {
	uint64_t key;
	pairent_t e;      /* beside its key: one cache line per lookup */
} pairslot_t;

typedef struct pairmap {
	pairslot_t *s;
	size_t cap, n;
	const int32_t *set_dom; /* per rank: its domain (pair_home); or NULL */
} pairmap_t;

/*
 * Updates of the pair map whose caller needs no answer (a part with one
 * rank that can take it in: pick_receiver), applied in order when the log
 * fills or before the map is read (pair_flush): looking the keys up a
 * batch at a time, each a little ahead, overlaps the cache misses that
 * one lookup at a time waits out in turn.
 */
#define PAIR_LOG 256

typedef struct pairlog {
	uint64_t key;
	int32_t rank;
	uint64_t bytes;
} pairlog_t;

/*
 * Per domain, its least-loaded rank by NIC (least_nic over its ranks) for
 * one direction of the NICs' load, valid while gen[d] is all + 1: loads
 * only grow, so only more load on that rank's NIC, or on a NIC several
 * domains share (all counts those), can change it (nic_add, dom_least).
 */
typedef struct domleast {
	int32_t *rank;
	uint64_t *gen;
	uint64_t all;
} domleast_t;

typedef struct reshard {
	const plan_layout_set_t *dst;
	const plan_topo_t *topo;
	const plan_opts_t *opts;
	VEC(work_t) work;
	i32vec_t scratch;     /* assign_local's */
	VEC(piece_t) pieces;
	pieceidx_t pidx;
	i32vec_t arena;
	uint32_t *group_off;  /* per source group of the current tensor */
	loads_t ld;
	cxvec_t *out;         /* compact transfers */
	boxvec_t *boxes;      /* their boxes, each stored once */
	size_t rotate;        /* spreads relay roots over domains */
	/* hierarchical receive: every rank of a domain may take a part in */
	int32_t *dom_r0;      /* per domain + 1: offsets into dom_ranks */
	int32_t *dom_ranks;   /* ranks of each domain, ascending */
	/* staging rounds: relay data per rank and round within staging_bytes */
	VEC(urelay_t) unit;   /* relays of the unit being assigned */
	size_t unit0;         /* its first transfer */
	uint32_t *round_of;   /* per rank: the last round it relays in */
	uint64_t *round_fill; /* per rank: relay bytes in that round */
	uint32_t max_local;   /* largest stage inside a round */
	uint8_t *stage_used;  /* per stage inside a round: some transfer has it */
	uint64_t *dom_send;   /* per domain: bytes its NICs send */
	const plan_box_t *cur_part; /* the part being assigned */
	uint32_t cur_box;     /* its index in the box table */
	const work_t *cur_w;  /* and its work item */
	uint64_t min_hop;     /* smallest part worth an extra NVLink hop */
	/* which domains hop: hop_in where some NIC would take in more than
	 * the domain's share from the ranks needing the data alone; hop_out
	 * (holders' domains) where some rank holds and needs nothing */
	uint64_t *dom_in;     /* per domain: network bytes it must take in */
	uint64_t *own_in;     /* per NIC: what its ranks' own needs bring in */
	uint8_t *busy;        /* per rank: holds or needs something */
	uint8_t *hop_in, *hop_out; /* per domain */
	uint64_t *dom_nics;   /* per domain: its NICs */
	relays_t relayed;     /* what each rank received as relay data */
	run_t run;            /* the relayed run being assigned */
	int32_t *nic_dom;     /* per NIC: the domain of its ranks (-1: several) */
	uint64_t *dom_gen, all_gen; /* send generations (send_gen) */
	domleast_t least_send, least_recv; /* by net_send, net_recv */
	int32_t *dst_r0;      /* per tensor + 1: offsets into dst_ranks */
	int32_t *dst_ranks;   /* destination ranks of each tensor, ascending */
	/* aligned stages (net_stage): wave w of every piece crosses the
	 * network in stage net0 + 2w, NVLink copies in the stages between */
	uint32_t net0;        /* 1 when holders may send through helpers */
	uint32_t wave;        /* of the part being assigned */
	pairmap_t pair;       /* pair affinity (pick_receiver): partners */
	pairlog_t plog[PAIR_LOG]; /* updates of pair not yet applied */
	size_t nplog;
	pairmap_t sendpair;   /* per (wave, domain, set): the last sender */
} reshard_t;

static inline const piece_t *
pc(const reshard_t *rs, const work_t *w)
{
	return &rs->pieces.v[w->piece];
}

/* A hash of the piece's key; its dims beyond the tensor's (nd) do not
 * count here, but piece_slot compares whole boxes. */
static uint64_t
piece_hash(uint32_t h0, const plan_box_t *b, int nd)
{
	uint64_t h = h0 * 0x9e3779b97f4a7c15ull;

	for (int d = 0; d < nd; d++) {
		h = (h ^ (uint64_t)b->off[d]) * 0xff51afd7ed558ccdull;
		h = (h ^ (uint64_t)b->size[d]) * 0xc4ceb9fe1a85ec53ull;
	}
	h ^= h >> 33; /* the high bits into the slot bits too */
	h *= 0xff51afd7ed558ccdull;
	return h ^ (h >> 33);
}

static size_t
piece_slot(const reshard_t *rs, uint32_t h0, const plan_box_t *b, int nd)
{
	const pieceidx_t *ix = &rs->pidx;
	size_t i = (size_t)piece_hash(h0, b, nd) & (ix->cap - 1);

	for (;; i = (i + 1) & (ix->cap - 1)) {
		const piece_t *p;

		if (ix->slot[i] == 0)
			return i;
		p = &rs->pieces.v[ix->slot[i] - 1];
		if (p->h0 == h0 && memcmp(&p->box, b, sizeof(*b)) == 0)
			return i;
	}
}

/* The piece (holders h0, box b), added when new. */
static uint32_t
piece_of(reshard_t *rs, uint32_t h0, uint32_t nh, uint32_t tensor, const plan_box_t *b,
	 uint64_t bytes)
{
	pieceidx_t *ix = &rs->pidx;
	size_t i;

	if (2 * (rs->pieces.n + 1) > ix->cap) {
		pieceidx_t old = *ix;

		ix->cap = ix->cap ? ix->cap * 2 : 4096;
		ix->slot = xcalloc(ix->cap, sizeof(*ix->slot));
		for (size_t k = 0; k < old.cap; k++)
			if (old.slot[k] != 0) {
				const piece_t *p = &rs->pieces.v[old.slot[k] - 1];

				ix->slot[piece_slot(rs, p->h0, &p->box,
						    rs->dst->v[p->tensor].ndim)] = old.slot[k];
			}
		free(old.slot);
	}
	i = piece_slot(rs, h0, b, rs->dst->v[tensor].ndim);
	if (ix->slot[i] == 0) {
		piece_t p = {.box = *b, .bytes = bytes, .tensor = tensor, .h0 = h0, .nh = nh};

		VEC_PUSH(&rs->pieces, p);
		ix->slot[i] = (uint32_t)rs->pieces.n;
	}
	return ix->slot[i] - 1;
}

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
	w.piece = piece_of(rs, rs->group_off[it->group], g->nh, it->tensor, it->box, bytes);
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

/* a transfer's stage: round << ROUND_SHIFT | stage inside it (unit_end) */
#define ROUND_SHIFT 16

static void
emit(reshard_t *rs, uint32_t stage, int32_t from, int32_t to, uint32_t tensor,
     uint32_t box)
{
	plan_cx_t x = {.stage = stage, .from = from, .to = to,
		       .tensor = tensor, .box = box};

	VEC_PUSH(rs->out, x);
	rs->max_local = stage > rs->max_local ? stage : rs->max_local;
	rs->stage_used[stage & ((1u << ROUND_SHIFT) - 1)] = 1;
}

/* Store box in the table; its index. */
static uint32_t
box_add(reshard_t *rs, const plan_box_t *box)
{
	VEC_PUSH(rs->boxes, *box);
	return (uint32_t)(rs->boxes->n - 1);
}

/*
 * Units and rounds.  A unit is what one assignment emits (a piece, or a
 * relayed run): its transfers depend on each other and share a round.
 * Relay data (a part taken in by a rank that does not need it) stays in
 * staging until its round is done, so a unit goes to the first round in
 * which every rank it relays through still has room, and its stages are
 * numbered inside that round.  Units without relays stay in round 0.
 */
static void
unit_begin(reshard_t *rs)
{
	rs->unit.n = 0;
	rs->unit0 = rs->out->n;
}

static uint64_t
unit_relayed(const reshard_t *rs, int32_t rank)
{
	for (size_t i = 0; i < rs->unit.n; i++)
		if (rs->unit.v[i].rank == rank)
			return rs->unit.v[i].bytes;
	return 0;
}

static void
unit_relay(reshard_t *rs, int32_t rank, uint64_t b)
{
	for (size_t i = 0; i < rs->unit.n; i++)
		if (rs->unit.v[i].rank == rank) {
			rs->unit.v[i].bytes += b;
			return;
		}
	VEC_PUSH(&rs->unit, ((urelay_t){rank, b}));
}

static void
unit_end(reshard_t *rs)
{
	uint64_t cap = rs->opts->staging_bytes;
	uint32_t round = 0;

	for (size_t i = 0; i < rs->unit.n; i++) {
		const urelay_t *u = &rs->unit.v[i];
		uint32_t r = rs->round_of[u->rank] +
			     (rs->round_fill[u->rank] + u->bytes > cap);

		round = r > round ? r : round;
	}
	for (size_t i = 0; i < rs->unit.n; i++) {
		const urelay_t *u = &rs->unit.v[i];

		if (round > rs->round_of[u->rank]) {
			rs->round_of[u->rank] = round;
			rs->round_fill[u->rank] = u->bytes;
		} else {
			rs->round_fill[u->rank] += u->bytes;
		}
	}
	for (size_t i = rs->unit0; i < rs->out->n && round != 0; i++)
		rs->out->v[i].stage |= round << ROUND_SHIFT;
}

/* Stages from (round, stage inside it) to round * per_round + stage, the
 * stages inside a round that no round uses left out (aligned stages,
 * net_stage, may leave stage 0 empty). */
static uint32_t
number_stages(reshard_t *rs)
{
	uint32_t n = rs->max_local + 1, per = 0;
	uint32_t *to = xcalloc(n, sizeof(*to));

	/* the stages used, as emit saw them */
	for (uint32_t k = 0; k < n; k++)
		to[k] = k < (1u << ROUND_SHIFT) && rs->stage_used[k] ? per++ : per;
	per = per ? per : 1;
	for (size_t i = 0; i < rs->out->n; i++) {
		plan_cx_t *x = &rs->out->v[i];

		x->stage = (x->stage >> ROUND_SHIFT) * per +
			   to[x->stage & ((1u << ROUND_SHIFT) - 1)];
	}
	free(to);
	return per;
}

/* true when rank is one of ranks[0..n) */
static bool
among_n(const int32_t *ranks, uint32_t n, int32_t rank)
{
	for (uint32_t i = 0; i < n; i++)
		if (ranks[i] == rank)
			return true;
	return false;
}

/* true when rank is one of the n sorted ranks */
static bool
among(const int32_t *ranks, uint32_t n, int32_t rank)
{
	return xbsearch(&rank, ranks, n, sizeof(*ranks), cmp_i32v) != NULL;
}

static size_t
relays_slot(const relays_t *m, uint64_t key)
{
	/* mixed so the tensor bits reach the slot bits (low bits of the
	 * product alone see only the rank: one cluster per rank) */
	uint64_t h = (key ^ (key >> 33)) * 0xff51afd7ed558ccdull;
	size_t i = (size_t)(h ^ (h >> 33)) & (m->cap - 1);

	while (m->key[i] != 0 && m->key[i] != key)
		i = (i + 1) & (m->cap - 1);
	return i;
}

static void
relays_grow(relays_t *m)
{
	relays_t n = {.cap = m->cap ? m->cap * 2 : 1024};

	n.key = xcalloc(n.cap, sizeof(*n.key));
	n.head = xmalloc(n.cap * sizeof(*n.head));
	for (size_t i = 0; i < m->cap; i++)
		if (m->key[i] != 0) {
			size_t j = relays_slot(&n, m->key[i]);

			n.key[j] = m->key[i];
			n.head[j] = m->head[i];
		}
	free(m->key);
	free(m->head);
	m->key = n.key;
	m->head = n.head;
	m->cap = n.cap;
}

/* The bit of tensor t in a rank's filter (relays_t.seen). */
static inline uint32_t
relay_bit(uint32_t t)
{
	return (uint32_t)((t * 0x9e3779b97f4a7c15ull) >> 54);
}

static void
relays_fini(relays_t *m)
{
	free(m->seen);
	free(m->key);
	free(m->head);
	VEC_FREE(&m->rec);
}

/*
 * May `rank` take the part being assigned (rs->cur_part) in as relay data?
 * Not when it already received part of it as relay data, nor (dst_ok
 * false) when it is a destination rank of the tensor: every rank receives
 * each element at most once.
 */
static bool
relay_ok(const reshard_t *rs, int32_t rank, bool dst_ok)
{
	const relays_t *m = &rs->relayed;
	uint32_t t = pc(rs, rs->cur_w)->tensor;
	int nd = rs->dst->v[t].ndim;
	uint64_t key = ((uint64_t)t << 32 | (uint32_t)rank) + 1;
	size_t i;

	if (!dst_ok && among(rs->dst_ranks + rs->dst_r0[t],
			     (uint32_t)(rs->dst_r0[t + 1] - rs->dst_r0[t]), rank))
		return false;
	uint32_t bit = relay_bit(t);

	/* most ranks hold no relay data of t: the filter, in cache, says so
	 * without a miss in the table */
	if (m->cap == 0 ||
	    !(m->seen[(size_t)rank * RELAY_SEEN_WORDS + bit / 64] >> (bit % 64) & 1))
		return true;
	i = relays_slot(m, key);
	if (m->key[i] == 0)
		return true;
	for (uint32_t k = m->head[i]; k != UINT32_MAX; k = m->rec.v[k].next)
		if (nd == 0 || plan_box_overlaps(&rs->boxes->v[m->rec.v[k].box],
						 rs->cur_part, nd))
			return false;
	return true;
}

static void
relay_note(reshard_t *rs, int32_t rank)
{
	relays_t *m = &rs->relayed;
	uint64_t key = ((uint64_t)pc(rs, rs->cur_w)->tensor << 32 | (uint32_t)rank) + 1;
	relrec_t r = {rs->cur_box, UINT32_MAX};
	uint32_t bit = relay_bit(pc(rs, rs->cur_w)->tensor);
	size_t i;

	m->seen[(size_t)rank * RELAY_SEEN_WORDS + bit / 64] |= 1ull << (bit % 64);
	if (2 * (m->n + 1) > m->cap)
		relays_grow(m);
	i = relays_slot(m, key);
	if (m->key[i] == 0) {
		m->key[i] = key;
		m->n++;
	} else {
		r.next = m->head[i];
	}
	m->head[i] = (uint32_t)m->rec.n;
	VEC_PUSH(&m->rec, r);
}

static uint64_t
pair_key(uint32_t stage, int32_t nic, int32_t dom)
{
	return ((uint64_t)stage << 48 | (uint64_t)(uint32_t)nic << 24 | (uint32_t)dom) + 1;
}

/*
 * key's home slot, where its probe starts.  With set_dom, a key naming a
 * set of ranks starts where the key naming their domain does (same stage
 * and NIC): pick_receiver looks both up, and they then share a cache line
 * or two instead of costing two misses in a table the caches cannot hold.
 */
static size_t
pair_home(const pairmap_t *m, uint64_t key)
{
	uint64_t h, k = key - 1, to = k & 0xffffff;

	if (m->set_dom != NULL && (to & 1u << 23))
		key = (k & ~(uint64_t)0xffffff) + (uint32_t)m->set_dom[to & ((1u << 23) - 1)] + 1;
	h = (key ^ (key >> 31)) * 0x9e3779b97f4a7c15ull;

	return (size_t)(h ^ (h >> 29)) & (m->cap - 1);
}

static size_t
pair_slot(const pairmap_t *m, uint64_t key)
{
	size_t i = pair_home(m, key);

	while (m->s[i].key != 0 && m->s[i].key != key)
		i = (i + 1) & (m->cap - 1);
	return i;
}

/*
 * n zeroed bytes for a table looked up at random: from 2 MiB on, on huge
 * pages where the system lends them on request, as one TLB entry then
 * covers what would take 512.
 */
static void *
big_calloc(size_t n)
{
	const size_t huge = 2u << 20;
	void *p;

	if (n < huge)
		return xcalloc(n, 1);
	if (posix_memalign(&p, huge, n) != 0)
		return xcalloc(n, 1);
	(void)madvise(p, n, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
	memset(p, 0, n);
	return p;
}

/* Room for n more keys: the map grows (rehashes) only here, at 3/4 full
 * (linear probing stays short there, and a smaller table takes fewer
 * cache and TLB misses). */
static void
pair_reserve(pairmap_t *m, size_t n)
{
	pairmap_t g;

	if (4 * (m->n + n) <= 3 * m->cap)
		return;
	g = (pairmap_t){.cap = m->cap ? m->cap * 2 : 1024, .n = m->n, .set_dom = m->set_dom};
	while (4 * (m->n + n) > 3 * g.cap)
		g.cap *= 2;
	g.s = big_calloc(g.cap * sizeof(*g.s));
	for (size_t k = 0; k < m->cap; k++)
		if (m->s[k].key != 0)
			g.s[pair_slot(&g, m->s[k].key)] = m->s[k];
	free(m->s);
	*m = g;
}

/* key's entry, added as none (rank -1) when new; valid until the next
 * pair_reserve. */
static pairent_t *
pair_at(pairmap_t *m, uint64_t key)
{
	size_t i = pair_slot(m, key);

	if (m->s[i].key == 0) {
		m->s[i] = (pairslot_t){key, {-1, 0}};
		m->n++;
	}
	return &m->s[i].e;
}

static uint32_t
fill32(uint64_t fill)
{
	return fill < UINT32_MAX ? (uint32_t)fill : UINT32_MAX;
}

/* The partner of a group is rank, which takes a part of b bytes in: the
 * group's last message fills up when it was rank's and the part fits,
 * else a new message starts. */
static void
pair_take(pairent_t *e, int32_t rank, uint64_t b, uint64_t chunk)
{
	bool fits = e->rank == rank && b <= chunk && e->fill + b <= chunk;

	*e = (pairent_t){rank, fill32(b > chunk ? chunk + 1 : fits ? e->fill + b : b)};
}

/* Apply the logged updates (pairlog_t), in order. */
static void
pair_flush(reshard_t *rs)
{
	pairmap_t *m = &rs->pair;
	const size_t ahead = 8;

	if (rs->nplog == 0)
		return;
	pair_reserve(m, rs->nplog);
	for (size_t i = 0; i < rs->nplog && i < ahead; i++)
		__builtin_prefetch(&m->s[pair_home(m, rs->plog[i].key)], 1);
	for (size_t i = 0; i < rs->nplog; i++) {
		const pairlog_t *l = &rs->plog[i];

		if (i + ahead < rs->nplog)
			__builtin_prefetch(&m->s[pair_home(m, rs->plog[i + ahead].key)], 1);
		pair_take(pair_at(m, l->key), l->rank, l->bytes, rs->opts->chunk_bytes);
	}
	rs->nplog = 0;
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
	    unit_relayed(rs, q) + b > rs->opts->staging_bytes / 2 || !relay_ok(rs, q, true))
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
	       (hop && unit_relayed(rs, r) + b <= rs->opts->staging_bytes / 2 &&
		relay_ok(rs, r, true));
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
static int32_t
pick_receiver(reshard_t *rs, const work_t *w, uint64_t b, int32_t s, uint32_t stage)
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
			pair_flush(rs);
		rs->plog[rs->nplog++] = (pairlog_t){pair_key(stage, nic, w->domain), r, b};
		return r;
	}
	pair_flush(rs);
	pair_reserve(&rs->pair, 2);
	pd = pair_at(&rs->pair, pair_key(stage, nic, w->domain));
	ps = pair_at(&rs->pair, pair_key(stage, nic, need[0] | 1 << 23));
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
	*pd = (pairent_t){r, fill32(fill)};
	if (among_n(need, w->nn, r)) {
		*ps = (pairent_t){r, fill32(fill)};
	} else {
		unit_relay(rs, r, b);
		relay_note(rs, r);
	}
	return r;
}

/* A piece held inside its destination domain: NVLink or local copies. */
static void
assign_local(reshard_t *rs, const work_t *w)
{
	const piece_t *pw = pc(rs, w);
	const int32_t *h = rs->arena.v + pw->h0, *need = rs->arena.v + w->n0;
	int32_t *in_dom;
	uint32_t nin = 0, bid = box_add(rs, &pw->box);

	VEC_RESERVE(&rs->scratch, pw->nh);
	in_dom = rs->scratch.v;

	for (uint32_t k = 0; k < pw->nh; k++)
		if (plan_topo_domain(rs->topo, h[k]) == w->domain)
			in_dom[nin++] = h[k];
	for (uint32_t k = 0; k < w->nn; k++) {
		int32_t n = need[k], s;

		if (xbsearch(&n, h, pw->nh, sizeof(*h), cmp_i32v) != NULL) {
			emit(rs, 0, n, n, pw->tensor, bid);
			continue;
		}
		s = least(in_dom, nin, rs->ld.nvl_send);
		rs->ld.nvl_send[s] += pw->bytes;
		rs->ld.nvl_recv[n] += pw->bytes;
		emit(rs, 0, s, n, pw->tensor, bid);
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

/* How a piece reached a domain: its parts, who took each in and when. */
typedef struct spart {
	int32_t recv;     /* the rank that took it in */
	uint32_t at;      /* the stage it crossed into the domain */
	int32_t help;     /* the rank it was copied to for sending on (-1:
			     none yet), which holds it from help_at */
	uint32_t help_at;
} spart_t;

typedef struct served {
	plan_box_t *parts;
	spart_t *pt;      /* per part */
	void *mem;        /* one block holding the arrays above (parts may
			     be another domain's: the same boxes) */
	int64_t np;
	uint32_t box0;    /* the parts' first index in the box table */
	const work_t *w;  /* the domain's work item (domain, ranks needing it) */
	int32_t dom;      /* w->domain */
	/* the first rank needing it whose NIC has sent least, and that load,
	 * as of send generation gen (see send_gen) */
	uint64_t gen, min_load;
	int32_t min_rank;
} served_t;

static void
served_fini(served_t *s)
{
	free(s->mem);
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
static int32_t
nic_add(reshard_t *rs, uint64_t *load, domleast_t *dl, int32_t rank, uint64_t b)
{
	int32_t nic = plan_topo_nic(rs->topo, rank), d = rs->nic_dom[nic];

	load[nic] += b;
	if (d < 0)
		dl->all++;
	else if (dl->gen[d] != 0 && plan_topo_nic(rs->topo, dl->rank[d]) == nic)
		dl->gen[d] = 0;
	return d;
}

static void
send_add(reshard_t *rs, int32_t rank, uint64_t b)
{
	int32_t d = nic_add(rs, rs->ld.net_send, &rs->least_send, rank, b);

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
	    unit_relayed(rs, g) + b > rs->opts->staging_bytes / 2 ||
	    !relay_ok(rs, g, dst_ok))
		return best;
	return g;
}

/*
 * The least-loaded rank of served domain sv holding part p, and from which
 * stage (*stage): the rank that took it in (one stage after it arrived), a
 * helper it was copied to for an earlier wave, or a rank needing it (two
 * stages after: it was forwarded).
 */
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
static double
run_key(const reshard_t *rs, const served_t *sv)
{
	return sv->np == 1 ? relay_load(rs, sv, 0) : run_value(rs, sv);
}

/* Is entry i of the run before entry j: less value, or equal value and a
 * lower domain (pick_sender's order)? */
static inline bool
run_before(const run_t *r, size_t i, size_t j)
{
	return r->v[i] < r->v[j] || (r->v[i] == r->v[j] && r->sv[i].dom < r->sv[j].dom);
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
static void
run_touch(reshard_t *rs, int32_t s)
{
	run_t *r = &rs->run;
	int32_t d = plan_topo_domain(rs->topo, s), slot;

	if (r->sv == NULL)
		return;
	if (rs->nic_dom[plan_topo_nic(rs->topo, s)] != d) { /* a NIC shared by domains */
		for (size_t i = 0; i < r->n; i++)
			r->v[i] = run_key(rs, &r->sv[i]);
		r->best_ok = false;
		return;
	}
	slot = r->dom_slot[d];
	if (slot >= 0 && (size_t)slot < r->n)
		run_set(r, (size_t)slot, run_key(rs, &r->sv[slot]));
}

/* Part p of the run's entry sv counts a rank of its own (see run_t);
 * with one part, v has it already (run_key). */
static void
run_spec(reshard_t *rs, const served_t *sv, int64_t p)
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

	pair_reserve(&rs->sendpair, 1);
	pe = pair_at(&rs->sendpair, pair_key(rs->wave, w->domain, need[0] | 1 << 23));
	p = pe->rank;

	if (p >= 0 && p != g &&
	    nic_send(rs, p) <= nic_send(rs, g) + slack(rs, w, 2) &&
	    (xbsearch(&p, h, nh, sizeof(*h), cmp_i32v) != NULL ||
	     (plan_topo_domain(t, p) == d && rs->hop_out[d] && b >= rs->min_hop &&
	      unit_relayed(rs, p) + b <= rs->opts->staging_bytes / 2 && relay_ok(rs, p, false))))
		g = p;
	pe->rank = g;
	return g;
}

/*
 * Who sends part p of w over the network and in which stage (*stage).
 * From the holders (pool empty): the least-loaded holder's NIC in stage 0,
 * or a less loaded NIC of its domain that the holder copies the part to
 * over NVLink in stage 0 and that sends it in stage 1.  From domains
 * served earlier: the least-loaded of them (bytes sent per NIC), and in it
 * the rank that took the part in (stage after it arrived), a rank that
 * needs it (it has it one stage later, forwarded), or any other rank of
 * the domain that the receiver copies it to.
 */
static int32_t
pick_sender(reshard_t *rs, const work_t *w, const served_t *pool, size_t npool,
	    int64_t p, uint64_t b, uint32_t *stage)
{
	const piece_t *pw = pc(rs, w);
	const plan_topo_t *t = rs->topo;
	const served_t *sv;
	int32_t best, g;

	if (npool == 0) {
		const int32_t *h = rs->arena.v + pw->h0;

		best = least_nic(t, h, pw->nh, rs->ld.net_send);
		/* a piece other domains need too would reach the helper twice */
		g = helper_of(rs, plan_topo_domain(t, best), best, b, false);
		g = sender_affinity(rs, w, h, pw->nh, best, g, b);
		if (xbsearch(&g, h, pw->nh, sizeof(*h), cmp_i32v) != NULL)
			best = g; /* a holder: no copy */
		*stage = net_stage(rs, g != best);
		if (g != best)
			goto copy;
		return best;
	}
	/* the served domain whose NICs have sent least: all of them when it
	 * may hop, else the one that took the part in */
	sv = &pool[0];
	double lc;

	if (pool == rs->run.sv && npool <= rs->run.n) {
		/* the least of the kept values, or a domain where a rank of
		 * this part counts: the same choice as the loop below (with
		 * one part, the kept values are relay_load: no list) */
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
	} else {
		lc = relay_load(rs, sv, p);
		for (size_t i = 1; i < npool; i++) {
			double la = relay_load(rs, &pool[i], p);

			if (la < lc || (la == lc && pool[i].dom < sv->dom)) {
				sv = &pool[i];
				lc = la;
			}
		}
	}
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
		run_spec(rs, sv, p);
copy:
	unit_relay(rs, g, b);
	relay_note(rs, g);
	rs->ld.nvl_send[best] += b;
	rs->ld.nvl_recv[g] += b;
	emit(rs, *stage - 1, best, g, pw->tensor, rs->cur_box);
	return g;
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
	int dim = 0;
	size_t np;
	bool in_run = rs->run.sv != NULL;

	out->np = like ? like->np : part_count(rs, w, t->ndim, &dim);
	np = (size_t)out->np;
	if (like) { /* the parts of the run's other domains: the same boxes,
		     * and their spart_t in the first domain's block */
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
			box_add(rs, &out->parts[p]);
		if (in_run) { /* the run's first domain: the parts of all */
			rs->run.spec_head = xmalloc(np * sizeof(*rs->run.spec_head));
			memset(rs->run.spec_head, 0xff, np * sizeof(*rs->run.spec_head));
		}
	}
	out->w = w;
	out->dom = w->domain;
	out->gen = 0;
	for (int64_t p = 0; p < out->np; p++) {
		uint64_t b = (uint64_t)plan_box_volume(&out->parts[p], t->ndim) *
			     plan_dtype_size(t->dtype);
		uint32_t stage;
		int32_t s, r;

		rs->cur_part = &out->parts[p];
		rs->cur_box = out->box0 + (uint32_t)p;
		rs->cur_w = w;
		s = pick_sender(rs, w, pool, npool, p, b, &stage);
		r = pick_receiver(rs, w, b, s, stage);
		send_add(rs, s, b);
		nic_add(rs, rs->ld.net_recv, &rs->least_recv, r, b);
		rs->dom_send[plan_topo_domain(rs->topo, s)] += b;
		run_touch(rs, s);
		out->pt[p] = (spart_t){.recv = r, .at = stage, .help = -1};
		if (in_run && !among_n(need, w->nn, r))
			run_spec(rs, out, p);
		emit(rs, stage, s, r, pw->tensor, rs->cur_box);
		for (uint32_t k = 0; k < w->nn; k++) {
			if (need[k] == r)
				continue;
			rs->ld.nvl_send[r] += b;
			rs->ld.nvl_recv[need[k]] += b;
			emit(rs, stage + 1, r, need[k], pw->tensor, rs->cur_box);
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
			rs->run.v[rs->run.n] = run_key(rs, &sv[rs->run.n]);
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
 * Runs: the network work items of each piece (same source group, same
 * box, other domains), in creation order, laid out piece by piece in
 * *runs_out; run_off / run_len per piece.  A run is relayed when it has
 * more domains than holders.
 */
static void
find_runs(reshard_t *rs, uint32_t **runs_out, uint32_t **off_out, uint32_t **len_out)
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
static void
choose_hops(reshard_t *rs, const plan_layout_set_t *src)
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

refit_status_t
plan_reshard(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	     const size_t *map, const plan_topo_t *topo, const plan_opts_t *opts,
	     cxvec_t *out, boxvec_t *boxes, uint32_t *stages_per_round, refit_err_t *err)
{
	reshard_t rs = {.dst = dst, .topo = topo, .opts = opts, .out = out,
			.boxes = boxes};
	needs_visitor_t v = {.item = on_item, .ctx = &rs};
	size_t ns = (size_t)topo->nslots;
	refit_status_t rc = REFIT_OK;

	rs.pair.set_dom = topo->rank_domain;
	rs.relayed.seen = xcalloc(ns * RELAY_SEEN_WORDS, sizeof(uint64_t));
	rs.min_hop = opts->chunk_bytes / 16 ? opts->chunk_bytes / 16 : 1;
	rs.dom_in = xcalloc((size_t)topo->ndomains + 1, sizeof(uint64_t));
	rs.own_in = xcalloc(ns, sizeof(uint64_t));
	rs.round_of = xcalloc(ns, sizeof(uint32_t));
	rs.dom_send = xcalloc((size_t)topo->ndomains + 1, sizeof(uint64_t));
	rs.round_fill = xcalloc(ns, sizeof(uint64_t));
	rs.stage_used = xcalloc(1u << ROUND_SHIFT, 1);
	domain_ranks(&rs);
	dst_ranks(&rs);
	nic_domains(&rs);
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
		uint32_t *runs, *run_off, *run_len;
		uint64_t max = 0;
		size_t nk = 0;
		xkey_t *k;

		choose_hops(&rs, src);
		find_runs(&rs, &runs, &run_off, &run_len);
		/*
		 * What is assigned, largest first, creation order on ties (a
		 * stable radix sort on max - bytes): each local item, and each
		 * piece's network items as one unit (its run) where the first
		 * of them is.  A piece's items all have its bytes, so this is
		 * the order of the items sorted alone, with the run's later
		 * items left out; sorting a few keys per piece, not one per
		 * item, spares the sort and a copy of every item.
		 */
		for (size_t i = 0; i < rs.work.n; i++) {
			const work_t *w = &rs.work.v[i];

			if (w->local || runs[run_off[w->piece]] == i)
				nk++;
			max = pc(&rs, w)->bytes > max ? pc(&rs, w)->bytes : max;
		}
		k = xmalloc((nk ? nk : 1) * sizeof(*k));
		nk = 0;
		for (size_t i = 0; i < rs.work.n; i++) {
			const work_t *w = &rs.work.v[i];

			if (w->local || runs[run_off[w->piece]] == i)
				k[nk++] = (xkey_t){max - pc(&rs, w)->bytes, (uint32_t)i};
		}
		plan_radix_sort(k, nk, plan_bits_for(max));
		for (size_t e = 0; e < nk; e++) {
			const work_t *w = &rs.work.v[k[e].idx];
			uint32_t len = run_len[w->piece];
			served_t one;

			unit_begin(&rs);
			if (w->local) {
				assign_local(&rs, w);
			} else if (len > 1) {
				assign_relayed(&rs, runs + run_off[w->piece], len);
			} else {
				assign_network(&rs, w, NULL, 0, NULL, &one);
				served_fini(&one);
			}
			unit_end(&rs);
		}
		free(k);
		*stages_per_round = number_stages(&rs);
		free(runs);
		free(run_off);
		free(run_len);
	}
	VEC_FREE(&rs.work);
	VEC_FREE(&rs.scratch);
	VEC_FREE(&rs.pieces);
	free(rs.pidx.slot);
	VEC_FREE(&rs.arena);
	VEC_FREE(&rs.unit);
	free(rs.round_of);
	free(rs.dom_send);
	free(rs.dom_in);
	free(rs.own_in);
	free(rs.busy);
	free(rs.hop_in);
	free(rs.hop_out);
	free(rs.dom_nics);
	relays_fini(&rs.relayed);
	free(rs.pair.s);
	free(rs.sendpair.s);
	free(rs.dst_r0);
	free(rs.dst_ranks);
	free(rs.round_fill);
	free(rs.stage_used);
	free(rs.dom_r0);
	free(rs.dom_ranks);
	free(rs.nic_dom);
	free(rs.dom_gen);
	free(rs.least_send.rank);
	free(rs.least_send.gen);
	free(rs.least_recv.rank);
	free(rs.least_recv.gen);
	free(rs.run.dom_slot);
	VEC_FREE(&rs.run.spec);
	free(rs.ld.net_send);
	free(rs.ld.net_recv);
	free(rs.ld.nvl_send);
	free(rs.ld.nvl_recv);
	return rc;
}
