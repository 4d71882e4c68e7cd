/*
 * planner_state.c - the reshard planner's lookup tables and its output.
 *
 * Tables: pieces by (holders, box) (the piece index), the boxes of each
 * tensor a rank received as relay data (so no rank receives an element
 * twice), and the pair maps of pick_receiver and sender_affinity (open
 * addressing, on huge pages when large, updates batched through a log).
 * Output: transfers appended to the plan's compact list, the box table,
 * and units of work placed in staging rounds, then the stages numbered.
 * Calls nothing else of the planner (planner_internal.h).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "plan/planner_internal.h"

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
uint32_t
reshard_piece_of(reshard_t *rs, uint32_t h0, uint32_t nh, uint32_t tensor,
		 const plan_box_t *b, uint64_t bytes)
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

void
reshard_relays_fini(relays_t *m)
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
bool
reshard_relay_ok(const reshard_t *rs, int32_t rank, bool dst_ok)
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

void
reshard_relay_note(reshard_t *rs, int32_t rank)
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

uint64_t
reshard_pair_key(uint32_t stage, int32_t nic, int32_t dom)
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
void
reshard_pair_reserve(pairmap_t *m, size_t n)
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
pairent_t *
reshard_pair_at(pairmap_t *m, uint64_t key)
{
	size_t i = pair_slot(m, key);

	if (m->s[i].key == 0) {
		m->s[i] = (pairslot_t){key, {-1, 0}};
		m->n++;
	}
	return &m->s[i].e;
}

uint32_t
reshard_fill32(uint64_t fill)
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

	*e = (pairent_t){rank, reshard_fill32(b > chunk ? chunk + 1 : fits ? e->fill + b : b)};
}

/* Apply the logged updates (pairlog_t), in order. */
void
reshard_pair_flush(reshard_t *rs)
{
	pairmap_t *m = &rs->pair;
	const size_t ahead = 8;

	if (rs->nplog == 0)
		return;
	reshard_pair_reserve(m, rs->nplog);
	for (size_t i = 0; i < rs->nplog && i < ahead; i++)
		__builtin_prefetch(&m->s[pair_home(m, rs->plog[i].key)], 1);
	for (size_t i = 0; i < rs->nplog; i++) {
		const pairlog_t *l = &rs->plog[i];

		if (i + ahead < rs->nplog)
			__builtin_prefetch(&m->s[pair_home(m, rs->plog[i + ahead].key)], 1);
		pair_take(reshard_pair_at(m, l->key), l->rank, l->bytes, rs->opts->chunk_bytes);
	}
	rs->nplog = 0;
}

void
reshard_emit(reshard_t *rs, uint32_t stage, int32_t from, int32_t to, uint32_t tensor,
	     uint32_t box)
{
	plan_cx_t x = {.stage = stage, .from = from, .to = to,
		       .tensor = tensor, .box = box};

	VEC_PUSH(rs->out, x);
	rs->max_local = stage > rs->max_local ? stage : rs->max_local;
	rs->stage_used[stage & ((1u << ROUND_SHIFT) - 1)] = 1;
}

/* Store box in the table; its index. */
uint32_t
reshard_box_add(reshard_t *rs, const plan_box_t *box)
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
void
reshard_unit_begin(reshard_t *rs)
{
	rs->unit.n = 0;
	rs->unit0 = rs->out->n;
}

uint64_t
reshard_unit_relayed(const reshard_t *rs, int32_t rank)
{
	for (size_t i = 0; i < rs->unit.n; i++)
		if (rs->unit.v[i].rank == rank)
			return rs->unit.v[i].bytes;
	return 0;
}

void
reshard_unit_relay(reshard_t *rs, int32_t rank, uint64_t b)
{
	for (size_t i = 0; i < rs->unit.n; i++)
		if (rs->unit.v[i].rank == rank) {
			rs->unit.v[i].bytes += b;
			return;
		}
	VEC_PUSH(&rs->unit, ((urelay_t){rank, b}));
}

void
reshard_unit_end(reshard_t *rs)
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
uint32_t
reshard_number_stages(reshard_t *rs)
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
