/*
 * planner_internal.h - the reshard planner's state, shared by its files
 * (not installed, not public; plan/internal.h is plan/'s).
 *
 *   planner.c         phase A (the needs walk into pieces and work items)
 *                     and phase B's assignment: local copies, network
 *                     pieces, relayed runs, plan_reshard;
 *   planner_pick.c    who sends a part and who takes it in (NIC loads,
 *                     hops, pair and sender affinity, the relayed run's
 *                     kept values);
 *   planner_setup.c   the tables built before assignment (domains' and
 *                     tensors' ranks, NICs' domains, hops, runs) and the
 *                     state's life cycle;
 *   planner_state.c   the lookup tables (pieces, relay records, pair maps)
 *                     and the output (transfers, boxes, units and rounds).
 * Each file calls only those listed after it (tests/check-layers.py).
 */
#ifndef REFIT_PLAN_PLANNER_INTERNAL_H
#define REFIT_PLAN_PLANNER_INTERNAL_H

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

/* a transfer's stage: round << ROUND_SHIFT | stage inside it (unit_end) */
#define ROUND_SHIFT 16

static inline const piece_t *
pc(const reshard_t *rs, const work_t *w)
{
	return &rs->pieces.v[w->piece];
}

/* true when rank is one of ranks[0..n) */
static inline bool
among_n(const int32_t *ranks, uint32_t n, int32_t rank)
{
	for (uint32_t i = 0; i < n; i++)
		if (ranks[i] == rank)
			return true;
	return false;
}

/* Is entry i of the run before entry j: less value, or equal value and a
 * lower domain (pick_sender's order)? */
static inline bool
run_before(const run_t *r, size_t i, size_t j)
{
	return r->v[i] < r->v[j] || (r->v[i] == r->v[j] && r->sv[i].dom < r->sv[j].dom);
}

/* planner_state.c: lookup tables.  All take the planner's state (one
 * thread) and allocate with x*alloc (no failure to return). */

/* The piece (holders at h0 in the arena, box b), added when new; its index. */
uint32_t reshard_piece_of(reshard_t *rs, uint32_t h0, uint32_t nh, uint32_t tensor,
			  const plan_box_t *b, uint64_t bytes);
/* May rank take the part being assigned (rs->cur_part) in as relay data
 * (dst_ok: even when it is a destination rank of the tensor)? */
bool reshard_relay_ok(const reshard_t *rs, int32_t rank, bool dst_ok);
/* rank took the part being assigned in as relay data. */
void reshard_relay_note(reshard_t *rs, int32_t rank);
void reshard_relays_fini(relays_t *m);
/* The pair maps' key of (stage, sending NIC, domain or set of ranks). */
uint64_t reshard_pair_key(uint32_t stage, int32_t nic, int32_t dom);
/* Room for n more keys (rehashes only here). */
void reshard_pair_reserve(pairmap_t *m, size_t n);
/* key's entry, added as none (rank -1) when new; valid until the next
 * reshard_pair_reserve. */
pairent_t *reshard_pair_at(pairmap_t *m, uint64_t key);
/* A message's fill, saturated to 32 bits. */
uint32_t reshard_fill32(uint64_t fill);
/* Apply the logged pair updates (pairlog_t), in order. */
void reshard_pair_flush(reshard_t *rs);

/* planner_state.c: the output. */

/* Append a transfer (stage inside its round) to rs->out. */
void reshard_emit(reshard_t *rs, uint32_t stage, int32_t from, int32_t to, uint32_t tensor,
		  uint32_t box);
/* Store box in the box table; its index. */
uint32_t reshard_box_add(reshard_t *rs, const plan_box_t *box);
/* A unit of work (what one assignment emits) begins, takes relay data in
 * on a rank, ends (its transfers go to the first round with room). */
void reshard_unit_begin(reshard_t *rs);
uint64_t reshard_unit_relayed(const reshard_t *rs, int32_t rank);
void reshard_unit_relay(reshard_t *rs, int32_t rank, uint64_t b);
void reshard_unit_end(reshard_t *rs);
/* Number the transfers' stages; the stages per round. */
uint32_t reshard_number_stages(reshard_t *rs);

/* planner_setup.c */

/* The state's tables for src -> dst on topo (before phase A). */
void reshard_init(reshard_t *rs, const plan_layout_set_t *dst, const plan_topo_t *topo,
		  const plan_opts_t *opts, cxvec_t *out, boxvec_t *boxes);
/* Frees what the state holds (not out, not boxes). */
void reshard_fini(reshard_t *rs);
/* Which domains hop (after phase A: it reads dom_in and own_in). */
void reshard_choose_hops(reshard_t *rs, const plan_layout_set_t *src);
/* Each piece's network work items (its run): three arrays the caller frees. */
void reshard_find_runs(reshard_t *rs, uint32_t **runs_out, uint32_t **off_out,
		       uint32_t **len_out);

/* planner_pick.c */

/* Who sends part p (b bytes) of w over the network, from the holders
 * (npool 0) or the served domains of pool, and in which stage (*stage). */
int32_t reshard_pick_sender(reshard_t *rs, const work_t *w, const served_t *pool,
			    size_t npool, int64_t p, uint64_t b, uint32_t *stage);
/* The rank of w's domain that takes part b in from sender s in stage. */
int32_t reshard_pick_receiver(reshard_t *rs, const work_t *w, uint64_t b, int32_t s,
			      uint32_t stage);
/* rank's NIC takes b more load in one direction (load, with dl); the
 * NIC's domain, -1 when several share it. */
int32_t reshard_nic_add(reshard_t *rs, uint64_t *load, domleast_t *dl, int32_t rank,
			uint64_t b);
/* rank's NIC sends b more bytes. */
void reshard_send_add(reshard_t *rs, int32_t rank, uint64_t b);
/* The value the relayed run keeps for served domain sv (run_t.v). */
double reshard_run_key(const reshard_t *rs, const served_t *sv);
/* After rank s sent more: the run's values that may have changed. */
void reshard_run_touch(reshard_t *rs, int32_t s);
/* Part p of the run's entry sv counts a rank of its own (run_t). */
void reshard_run_spec(reshard_t *rs, const served_t *sv, int64_t p);

#endif
