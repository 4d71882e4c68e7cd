/*
 * slice.c - one node's slice of a plan over a transport (see slice.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/node/slice.h"
#include "daemon/node/slice_delta.h"

enum { M_OUT, M_IN, M_LOCAL };

typedef struct smsg {
	plan_msg_t m;        /* parts point into the slice's part table */
	size_t part0;
	uint8_t kind;        /* M_OUT, M_IN, M_LOCAL */
	bool done;
	uint32_t peer;       /* the other node (M_OUT, M_IN) */
	uint32_t pos;        /* index in its (sender, receiver) list: the wire's seq */
	uint32_t nleft;      /* its parts not yet sent, arrived or copied */
} smsg_t;

/*
 * A part of a message (the slice's part table, parallel to parts): the
 * unit of readiness.  A part that packs data this node received waits for
 * exactly the arrived parts it overlaps, so a relay goes piece by piece as
 * its pieces land (cut-through), not when every piece of its message has.
 */
typedef struct spart {
	uint32_t msg;        /* its message */
	uint32_t ndeps;      /* parts it still waits for (M_OUT, M_LOCAL) */
	uint32_t dep0, ndep; /* its dependents in the slice's dependents table */
	bool done;           /* sent, arrived or copied */
} spart_t;

/* On the wire a unit of message pos that starts at part k0 carries
 * seq = pos | k0 << 32 (a whole message: seq = pos); its length says
 * where it ends. */
#define SEQ_PART_SHIFT 32

typedef VEC(size_t) idxvec_t;

/* A message of this node in the grouped form: its (stage, bucket). */
typedef struct gmsg {
	size_t idx;          /* into msgs */
	uint32_t stage;
	uint64_t bucket;
	size_t order;        /* in the plan's message order */
} gmsg_t;

typedef struct gbuf {
	void *p;
	int32_t rank;        /* whose device holds it */
} gbuf_t;

typedef struct slice {
	const slice_cfg_t *c;
	dp_exec_t *x;
	VEC(smsg_t) msgs;
	VEC(plan_part_t) parts;
	VEC(spart_t) sp;     /* per part: its message, dependencies, state */
	VEC(uint32_t) deps;  /* dependents (part indices), grouped per part */
	idxvec_t *out, *in;  /* per node: message indices, plan order */
	idxvec_t *ready;     /* per node: outgoing parts whose data is here */
	size_t *ready_i, *in_got;
	idxvec_t work;       /* parts done whose dependents are to be told */
	uint8_t **buf;       /* per node: packed outgoing message */
	uint64_t *out_max;   /* per node: its largest message from here (self: local) */
	uint64_t *in_max;    /* per node: its largest message to here */
	uint64_t out_left, in_left, local_left, sent;
	uint64_t *stage_left;/* per stage: this node's messages not done */
	uint32_t round;      /* rounds before it are done here: relay data freed */
	bool *held;          /* per node: its packed buffer may still be on the wire */
	size_t nheld, cap;   /* buffers held; at most cap (staging_bytes) */
	slice_stats_t *st;
	int64_t t0;
	bool opened;         /* the transport session opened: messages were due */
	uint64_t trail;      /* verify: 4 CRC bytes after each message */
	/* the grouped form: this node's messages by (stage, bucket), the group
	 * [ga, gb) being run, its ops and their messages, its device staging */
	const dp_dev_ops_t *dev;  /* the session's device memory (NULL: host) */
	VEC(gmsg_t) gm;
	bool bucketed;
	size_t ga, gb;
	VEC(xport_op_t) gops;
	VEC(size_t) gopmsg;
	VEC(gbuf_t) gbufs;
	sdelta_t d;          /* delta refits (stream form) */
} slice_t;

static int64_t
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void
stage_done(slice_t *s, uint32_t stage)
{
	uint32_t k = stage < SLICE_MAX_STAGES ? stage : SLICE_MAX_STAGES - 1;

	s->st->stage_us[k] = (uint64_t)(now_us() - s->t0);
	if (k + 1 > s->st->nstages)
		s->st->nstages = k + 1;
}

/* Node of rank r (SIZE_MAX: none). */
static size_t
node_of(const slice_cfg_t *c, int32_t r)
{
	for (size_t i = 0; i < c->nnodes; i++)
		for (size_t k = 0; k < c->nodes[i].nranks; k++)
			if (c->nodes[i].ranks[k] == r)
				return i;
	return SIZE_MAX;
}

static const plan_msg_t *
msg_at(slice_t *s, size_t i)
{
	smsg_t *m = &s->msgs.v[i];

	m->m.parts = &s->parts.v[m->part0];
	return &m->m;
}

static void
count_stage(slice_t *s, uint32_t stage)
{
	const plan_t *p = s->c->plan;

	if (--s->stage_left[stage] != 0)
		return;
	stage_done(s, stage);
	/* every stage of the oldest open round done here: its relays are spent */
	for (;;) {
		uint32_t first = s->round * p->stages_per_round, end = first + p->stages_per_round;
		bool open = false;

		if (first >= p->nstages)
			return;
		for (uint32_t k = first; k < end && k < p->nstages && !open; k++)
			open = s->stage_left[k] != 0;
		if (open)
			return;
		dp_exec_release(s->x, s->round);
		s->round++;
	}
}

/*
 * Parts [k0, k0 + n) of message i, bytes in all, were sent, arrived or
 * copied: counted, and the message is done with its last part.
 */
static void
parts_done(slice_t *s, size_t i, uint32_t k0, uint32_t n, uint64_t bytes)
{
	smsg_t *m = &s->msgs.v[i];
	uint32_t stage = m->m.stage;

	for (uint32_t k = k0; k < k0 + n; k++)
		s->sp.v[m->part0 + k].done = true;
	if (m->kind != M_IN) /* stage bytes: sent + copied locally */
		s->st->stage_bytes[stage < SLICE_MAX_STAGES ? stage : SLICE_MAX_STAGES - 1] +=
			bytes;
	if (m->kind == M_OUT)
		s->st->bytes_out += bytes;
	else if (m->kind == M_IN)
		s->st->bytes_in += bytes;
	else
		s->st->bytes_local += bytes;
	m->nleft -= n;
	if (m->nleft != 0)
		return;
	m->done = true;
	if (m->kind == M_OUT) {
		s->out_left--;
		s->st->msgs_out++;
	} else if (m->kind == M_IN) {
		s->in_got[m->peer]++;
		s->in_left--;
		s->st->msgs_in++;
	} else {
		s->local_left--;
		s->st->msgs_local++;
	}
	count_stage(s, stage);
}

/* What m carries, its padding not counted (the statistics' bytes: the
 * plan's). */
static uint64_t
payload(const plan_msg_t *m)
{
	uint64_t b = 0;

	for (uint32_t k = 0; k < m->nparts; k++)
		b += m->parts[k].bytes;
	return b;
}

/* The sub-message of message i made of parts [k0, k0 + n). */
static plan_msg_t
sub_msg(slice_t *s, size_t i, uint32_t k0, uint32_t n)
{
	const plan_msg_t *pm = msg_at(s, i);
	plan_msg_t m = {pm->stage, pm->from, pm->to, 0, (plan_part_t *)pm->parts + k0, n};

	/* the run's bytes: from its first part to the end of its last (the
	 * padding between them included, as plan_msgs_next laid them out) */
	if (n > 0)
		m.bytes = plan_msg_part_at(&m, n - 1) + m.parts[n - 1].bytes;
	return m;
}

/*
 * Parts were done (arrived, sent, or copied; each pushed on s->work): their
 * dependents may be ready now.  Local parts that become ready are copied
 * here, which may make more ready.
 */
static refit_status_t
finished(slice_t *s, refit_err_t *err)
{
	while (s->work.n) {
		size_t p = s->work.v[--s->work.n];
		spart_t *q = &s->sp.v[p];

		if (!q->done) { /* a local part whose data is here: copy it */
			size_t i = q->msg;
			plan_msg_t m = sub_msg(s, i, (uint32_t)(p - s->msgs.v[i].part0), 1);
			uint8_t *b = s->buf[s->c->self];

			CHECK(dp_pack_msg(s->x, &m, b, err));
			CHECK(dp_unpack_msg(s->x, &m, b, err));
			parts_done(s, i, (uint32_t)(p - s->msgs.v[i].part0), 1, payload(&m));
		}
		for (uint32_t d = q->dep0; d < q->dep0 + q->ndep; d++) {
			uint32_t t = s->deps.v[d];
			const smsg_t *tm = &s->msgs.v[s->sp.v[t].msg];

			if (--s->sp.v[t].ndeps != 0)
				continue;
			if (tm->kind == M_OUT)
				VEC_PUSH(&s->ready[tm->peer], t);
			else
				VEC_PUSH(&s->work, t);
		}
	}
	return REFIT_OK;
}

/* The element size a unit is delta-encoded in: its first part's, when the
 * unit is a whole number of them (else bytes). */
static unsigned
unit_esize(const slice_t *s, const plan_msg_t *m)
{
	const plan_t *p = s->c->plan;
	unsigned e = m->nparts ? p->tensors[p->xfers[m->parts[0].xfer].tensor].elem : 1;

	return e && (e == 1 || e == 2 || e == 4 || e == 8) && m->bytes % e == 0 ? e : 1;
}

/*
 * The next unit for peer: the oldest ready part not sent yet and the ready
 * parts that follow it in its message, packed as one frame.  A message
 * whose parts are all here goes whole, as one frame.
 */
static refit_status_t
pull(void *arg, size_t peer, const uint8_t **buf, uint64_t *len, uint64_t *seq,
     refit_err_t *err)
{
	slice_t *s = arg;
	smsg_t *sm;
	plan_msg_t m;
	size_t p, i;
	uint32_t k0, n;
	bool dl;

	*len = UINT64_MAX;
	if (s->held[peer]) { /* the transport asks again: the last one is written */
		s->held[peer] = false;
		s->nheld--;
	}
	while (s->ready_i[peer] < s->ready[peer].n &&
	       s->sp.v[s->ready[peer].v[s->ready_i[peer]]].done)
		s->ready_i[peer]++; /* went with an earlier unit */
	if (s->ready_i[peer] >= s->ready[peer].n || s->nheld >= s->cap)
		return REFIT_OK;
	p = s->ready[peer].v[s->ready_i[peer]++];
	i = s->sp.v[p].msg;
	sm = &s->msgs.v[i];
	k0 = (uint32_t)(p - sm->part0);
	for (n = 1; k0 + n < sm->m.nparts; n++) {
		const spart_t *q = &s->sp.v[sm->part0 + k0 + n];

		if (q->done || q->ndeps != 0)
			break;
	}
	m = sub_msg(s, i, k0, n);
	s->held[peer] = true;
	s->nheld++;
	if (s->c->test_delay_ms)
		usleep(s->c->test_delay_ms * 1000u);
	CHECK(dp_pack_msg(s->x, &m, s->buf[peer], err));
	if (s->c->corrupt >= 0 && s->sent == (uint64_t)s->c->corrupt && m.bytes > 0)
		s->buf[peer][m.bytes / 2] ^= 0x5a;
	s->sent++;
	sdelta_out(&s->d, peer, sm->pos, msg_at(s, i), k0, n, unit_esize(s, &m), s->buf[peer],
		   m.bytes + s->trail, s->trail, buf, len, &dl);
	*seq = sm->pos | (uint64_t)k0 << SEQ_PART_SHIFT | (dl ? SEQ_DELTA : 0);
	parts_done(s, i, k0, n, payload(&m));
	for (uint32_t k = k0; k < k0 + n; k++)
		VEC_PUSH(&s->work, sm->part0 + k);
	return finished(s, err);
}

static refit_status_t
push(void *arg, size_t peer, uint64_t seq, const uint8_t *buf, uint64_t len,
     refit_err_t *err)
{
	slice_t *s = arg;
	const slice_cfg_t *c = s->c;
	bool dl = (seq & SEQ_DELTA) != 0;
	uint64_t pos = seq & 0xffffffffu, k0 = (seq & ~SEQ_DELTA) >> SEQ_PART_SHIFT, want, got = 0;
	const plan_msg_t *pm;
	smsg_t *sm;
	plan_msg_t m;
	uint32_t n = 0;
	size_t i;

	if (pos >= s->in[peer].n || s->msgs.v[s->in[peer].v[pos]].done)
		return refit_err_set(err, REFIT_ERR_REMOTE, "node \"%s\" sent message %" PRIu64
				     ", which this node does not expect (it expects %zu, %zu "
				     "arrived)", c->nodes[peer].node_id, pos, s->in[peer].n,
				     s->in_got[peer]);
	i = s->in[peer].v[pos];
	sm = &s->msgs.v[i];
	pm = msg_at(s, i);
	if (k0 >= pm->nparts || s->sp.v[sm->part0 + k0].done)
		return refit_err_set(err, REFIT_ERR_REMOTE, "node \"%s\" sent part %" PRIu64
				     " of message %" PRIu64 " (from rank %d to rank %d, stage "
				     "%u), which has %u parts%s", c->nodes[peer].node_id, k0, pos,
				     pm->from, pm->to, pm->stage, pm->nparts,
				     k0 < pm->nparts ? ", and that one arrived already" : "");
	/* the unit runs from part k0 until its bytes are used up (and over the
	 * empty parts right after that need no padding, which its sender packed
	 * with it); parts lie at their offsets from part k0's */
	want = len >= s->trail ? len - s->trail : UINT64_MAX;
	if (dl)
		CHECK(sdelta_frame_len(buf, len, s->trail, &want, err));
	while (k0 + n < pm->nparts && !s->sp.v[sm->part0 + k0 + n].done && want != UINT64_MAX) {
		const plan_part_t *q = &pm->parts[k0 + n];
		uint64_t end = q->off + q->bytes - pm->parts[k0].off;

		if (got >= want && (q->bytes != 0 || end > want))
			break;
		got = end;
		n++;
	}
	if (got != want)
		return refit_err_set(err, REFIT_ERR_REMOTE, "node \"%s\" sent %" PRIu64 " bytes "
				     "from part %" PRIu64 " of the message from rank %d to rank "
				     "%d (stage %u), which do not end at a part of it (%" PRIu64
				     " bytes in all): do both nodes run the same plan?",
				     c->nodes[peer].node_id, len, k0, pm->from, pm->to, pm->stage,
				     pm->bytes + s->trail);
	m = sub_msg(s, i, (uint32_t)k0, n);
	if (dl)
		CHECK(sdelta_in(&s->d, peer, c->nodes[peer].node_id, pos, pm, (uint32_t)k0, n,
				unit_esize(s, &m), buf, len, s->trail, &buf, err));
	CHECK(dp_unpack_msg(s->x, &m, buf, err));
	sdelta_keep_in(&s->d, peer, pos, pm, (uint32_t)k0, n, buf, m.bytes);
	parts_done(s, i, (uint32_t)k0, n, payload(&m));
	for (uint32_t k = (uint32_t)k0; k < k0 + n; k++)
		VEC_PUSH(&s->work, sm->part0 + k);
	return finished(s, err);
}

static bool
done(void *arg)
{
	slice_t *s = arg;

	return s->out_left == 0 && s->in_left == 0 && s->local_left == 0;
}

static bool
peer_done(void *arg, size_t peer)
{
	slice_t *s = arg;

	return s->in_got[peer] >= s->in[peer].n;
}

/* A received part: which rank holds which box after which part. */
typedef struct held {
	int32_t rank;
	uint32_t tensor, stage;
	uint32_t part;
	plan_box_t box;
} held_t;

static int
cmp_held(const void *a, const void *b)
{
	const held_t *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/*
 * Dependencies: a part sent (or copied) by rank r in stage s > 0 packs
 * data r received earlier (forwards, relays); it waits for exactly the
 * arrived parts at r, of earlier stages, whose boxes overlap it.  Data
 * from r's own training or inference memory needs nothing.  So a relay
 * goes as soon as its piece is here, not when its whole message or the
 * whole stage is: the stages pipeline, part by part.  Edges follow stages
 * upwards: no cycle, no deadlock.
 */
static void
link_deps(slice_t *s)
{
	VEC(held_t) h = {0};
	VEC(uint32_t) *adj = xcalloc(s->parts.n + 1, sizeof(*adj));
	uint32_t *stamp = xcalloc(s->parts.n + 1, sizeof(*stamp));

	for (size_t i = 0; i < s->msgs.n; i++) {
		smsg_t *m = &s->msgs.v[i];
		const plan_msg_t *pm = msg_at(s, i);

		if (m->kind == M_OUT)
			continue;
		for (uint32_t k = 0; k < pm->nparts; k++) {
			held_t e = {pm->to, s->c->plan->xfers[pm->parts[k].xfer].tensor,
				    pm->stage, (uint32_t)(m->part0 + k), pm->parts[k].box};

			VEC_PUSH(&h, e);
		}
	}
	xqsort(h.v, h.n, sizeof(*h.v), cmp_held);
	for (size_t i = 0; i < s->msgs.n; i++) {
		smsg_t *m = &s->msgs.v[i];
		const plan_msg_t *pm = msg_at(s, i);

		if (m->kind == M_IN || pm->stage == 0)
			continue;
		for (uint32_t k = 0; k < pm->nparts; k++) {
			uint32_t t = s->c->plan->xfers[pm->parts[k].xfer].tensor;
			uint32_t me = (uint32_t)(m->part0 + k);
			held_t key = {.rank = pm->from, .tensor = t};
			int nd = s->c->plan->tensors[t].ndim;
			size_t lo = 0, hi = h.n;

			while (lo < hi) { /* first entry of (rank, tensor) */
				size_t mid = (lo + hi) / 2;

				if (cmp_held(&h.v[mid], &key) < 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			for (size_t e = lo; e < h.n && cmp_held(&h.v[e], &key) == 0; e++) {
				uint32_t src = h.v[e].part;

				if (h.v[e].stage >= pm->stage || stamp[src] == me + 1 ||
				    !plan_box_overlaps(&h.v[e].box, &pm->parts[k].box, nd))
					continue;
				stamp[src] = me + 1;
				VEC_PUSH(&adj[src], me);
				s->sp.v[me].ndeps++;
			}
		}
	}
	for (size_t p = 0; p < s->parts.n; p++) {
		s->sp.v[p].dep0 = (uint32_t)s->deps.n;
		s->sp.v[p].ndep = (uint32_t)adj[p].n;
		for (size_t k = 0; k < adj[p].n; k++)
			VEC_PUSH(&s->deps, adj[p].v[k]);
		VEC_FREE(&adj[p]);
	}
	free(adj);
	free(stamp);
	VEC_FREE(&h);
}

/* Keep the messages this node sends or receives. */
static refit_status_t
collect(slice_t *s, refit_err_t *err)
{
	const slice_cfg_t *c = s->c;
	int32_t maxr = -1;
	size_t *where;
	plan_msgs_t it;
	plan_msg_t m;

	for (size_t i = 0; i < c->nnodes; i++)
		for (size_t k = 0; k < c->nodes[i].nranks; k++)
			if (c->nodes[i].ranks[k] > maxr)
				maxr = c->nodes[i].ranks[k];
	where = xmalloc(((size_t)maxr + 1) * sizeof(*where));
	for (int32_t r = 0; r <= maxr; r++)
		where[r] = node_of(c, r);
	plan_msgs_init(&it, c->plan, 0, c->plan->nxfers);
	while (plan_msgs_next(&it, &m)) {
		size_t f = m.from <= maxr ? where[m.from] : SIZE_MAX;
		size_t t = m.to <= maxr ? where[m.to] : SIZE_MAX;
		smsg_t sm = {.m = m, .part0 = s->parts.n};

		if (f == SIZE_MAX || t == SIZE_MAX) {
			plan_msgs_fini(&it);
			free(where);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "the plan moves data from "
					     "rank %d to rank %d, and one of them belongs to no "
					     "node of the epoch", m.from, m.to);
		}
		if (f != c->self && t != c->self)
			continue;
		for (uint32_t k = 0; k < m.nparts; k++) {
			VEC_PUSH(&s->parts, m.parts[k]);
			VEC_PUSH(&s->sp, ((spart_t){.msg = (uint32_t)s->msgs.n}));
		}
		sm.m.parts = NULL;
		sm.nleft = m.nparts;
		if (f == c->self && t == c->self) {
			sm.kind = M_LOCAL;
			s->local_left++;
		} else if (f == c->self) {
			sm.kind = M_OUT;
			sm.peer = (uint32_t)t;
			sm.pos = (uint32_t)s->out[t].n;
			VEC_PUSH(&s->out[t], s->msgs.n);
			s->out_left++;
		} else {
			sm.kind = M_IN;
			sm.peer = (uint32_t)f;
			sm.pos = (uint32_t)s->in[f].n;
			VEC_PUSH(&s->in[f], s->msgs.n);
			s->in_left++;
		}
		/* buffers are sized by what each peer really exchanges, not the bound */
		if (f == c->self && m.bytes > s->out_max[t])
			s->out_max[t] = m.bytes;
		if (t == c->self && f != c->self && m.bytes > s->in_max[f])
			s->in_max[f] = m.bytes;
		s->stage_left[m.stage]++;
		VEC_PUSH(&s->msgs, sm);
	}
	plan_msgs_fini(&it);
	free(where);
	link_deps(s);
	return REFIT_OK;
}

/* Start: every part whose data is here already (a snapshot: what becomes
 * ready while local copies run is queued by finished()). */
static refit_status_t
start_ready(slice_t *s, refit_err_t *err)
{
	size_t nlocal = 0;

	for (size_t p = 0; p < s->parts.n; p++) {
		const smsg_t *m = &s->msgs.v[s->sp.v[p].msg];

		if (s->sp.v[p].ndeps != 0 || m->kind == M_IN)
			continue;
		if (m->kind == M_OUT)
			VEC_PUSH(&s->ready[m->peer], p);
		else {
			VEC_PUSH(&s->work, p);
			nlocal++;
		}
	}
	/* the stack runs the last first: local parts in plan order */
	for (size_t k = 0; k < nlocal / 2; k++) {
		size_t t = s->work.v[k];

		s->work.v[k] = s->work.v[nlocal - 1 - k];
		s->work.v[nlocal - 1 - k] = t;
	}
	return finished(s, err);
}

/* ---- the stream form (tcp) ----------------------------------------------------- */

/* Before the first pull: one packed buffer per peer (and one for local
 * copies), sized by the largest message it carries; then what needs no
 * transfer runs. */
static refit_status_t
begin(void *arg, refit_err_t *err)
{
	slice_t *s = arg;
	const slice_cfg_t *c = s->c;

	for (size_t i = 0; i < c->nnodes; i++) {
		uint64_t bytes = s->out_max[i] + s->trail;

		if (s->out[i].n == 0 && !(i == c->self && s->local_left))
			continue;
		s->buf[i] = c->pool ? dp_pool_get(c->pool, bytes) : xmalloc(bytes + 1);
		if (s->buf[i] == NULL)
			return refit_err_set(err, REFIT_ERR_NOMEM, "slice: cannot map a %" PRIu64
					     "-byte message buffer", bytes);
	}
	return start_ready(s, err);
}

/* ---- the grouped form (nccl) ----------------------------------------------------

 * Every message gets a bucket, computed identically on every node from the
 * global message order: per stage, each rank fills buckets of at most
 * staging_bytes (one larger message alone); a message goes to the later of
 * its two ranks' current buckets.  Nodes run (stage, bucket) in order, all
 * their ranks' sends and receives of one bucket in one NCCL group, so both
 * ends of every message sit in the same group and no cycle of waits can form.
 */

static int
cmp_gmsg(const void *a, const void *b)
{
	const gmsg_t *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	if (x->bucket != y->bucket)
		return x->bucket < y->bucket ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

static bool
is_local(const slice_cfg_t *c, int32_t r)
{
	const slice_node_t *me = &c->nodes[c->self];

	for (size_t k = 0; k < me->nranks; k++)
		if (me->ranks[k] == r)
			return true;
	return false;
}

/* The highest rank any transfer of the plan names. */
static int32_t
max_rank(const plan_t *p)
{
	int32_t maxr = 0;

	for (size_t i = 0; i < p->nxfers; i++) {
		if (p->xfers[i].from > maxr)
			maxr = p->xfers[i].from;
		if (p->xfers[i].to > maxr)
			maxr = p->xfers[i].to;
	}
	return maxr;
}

/* Bucket every message of the plan; keep this node's, sorted by (stage,
 * bucket, plan order). */
static void
bucket_all(slice_t *s)
{
	const slice_cfg_t *c = s->c;
	uint64_t W = c->plan->opts.staging_bytes;
	size_t nr = (size_t)max_rank(c->plan) + 1, order = 0, mi = 0;
	uint64_t *cur = xcalloc(nr, sizeof(*cur)), *fill = xcalloc(nr, sizeof(*fill));
	uint32_t stage = UINT32_MAX;
	plan_msgs_t it;
	plan_msg_t m;

	plan_msgs_init(&it, c->plan, 0, c->plan->nxfers);
	while (plan_msgs_next(&it, &m)) {
		uint64_t k;

		if (m.stage != stage) {
			memset(cur, 0, nr * sizeof(*cur));
			memset(fill, 0, nr * sizeof(*fill));
			stage = m.stage;
		}
		k = cur[m.from] > cur[m.to] ? cur[m.from] : cur[m.to];
		if (cur[m.from] < k)
			cur[m.from] = k, fill[m.from] = 0;
		if (cur[m.to] < k)
			cur[m.to] = k, fill[m.to] = 0;
		if ((fill[m.from] || fill[m.to]) &&
		    (fill[m.from] + m.bytes > W || fill[m.to] + m.bytes > W)) {
			k++;
			cur[m.from] = cur[m.to] = k;
			fill[m.from] = fill[m.to] = 0;
		}
		fill[m.from] += m.bytes;
		if (m.to != m.from)
			fill[m.to] += m.bytes;
		/* gm[].idx counts this node's messages in plan order, as collect() kept them */
		if (is_local(c, m.from) || is_local(c, m.to))
			VEC_PUSH(&s->gm, ((gmsg_t){mi++, m.stage, k, order}));
		order++;
	}
	plan_msgs_fini(&it);
	free(cur);
	free(fill);
	xqsort(s->gm.v, s->gm.n, sizeof(*s->gm.v), cmp_gmsg);
	s->bucketed = true;
}

/* Device staging of bytes on rank's device, freed with the group. */
static refit_status_t
group_buf(slice_t *s, int32_t rank, uint64_t bytes, uint8_t **out, refit_err_t *err)
{
	const dp_dev_ops_t *dev = s->dev;

	*out = dev->alloc(dev->ctx, rank, bytes);
	if (*out == NULL) {
		CHECK(dev->sync(dev->ctx, err)); /* the device's own error first */
		return refit_err_set(err, REFIT_ERR_NOMEM, "slice: cannot allocate %" PRIu64
				     " bytes of device staging for rank %d", bytes, rank);
	}
	VEC_PUSH(&s->gbufs, ((gbuf_t){*out, rank}));
	return REFIT_OK;
}

/* Tests: flip a byte of the chosen outgoing message, on its device. */
static void
group_corrupt(slice_t *s, const plan_msg_t *pm, uint8_t *buf)
{
	const dp_dev_ops_t *dev = s->dev;
	uint8_t b1;

	if (s->c->corrupt < 0 || pm->from == pm->to || s->sent++ != (uint64_t)s->c->corrupt ||
	    pm->bytes == 0)
		return;
	dev->to_host(dev->ctx, pm->from, &b1, buf + pm->bytes / 2, 1);
	b1 ^= 0x5a;
	dev->from_host(dev->ctx, pm->from, buf + pm->bytes / 2, &b1, 1);
}

/*
 * Message idx in the group being made: packed on its sender's device when
 * the sender is here, its send and receive queued; a message from a rank to
 * itself is copied now.
 */
static refit_status_t
group_msg(slice_t *s, size_t idx, refit_err_t *err)
{
	const slice_cfg_t *c = s->c;
	const plan_msg_t *pm = msg_at(s, idx);
	bool from = is_local(c, pm->from), to = is_local(c, pm->to);
	uint64_t len = pm->bytes + s->trail;
	uint8_t *buf, *rbuf;

	CHECK(group_buf(s, from ? pm->from : pm->to, len, &buf, err));
	if (from) {
		CHECK(dp_pack_msg(s->x, pm, buf, err));
		group_corrupt(s, pm, buf);
	}
	if (pm->from == pm->to) {   /* the same rank: a copy */
		CHECK(s->dev->sync(s->dev->ctx, err));
		s->st->msgs_local++;
		s->st->bytes_local += payload(pm);
		return dp_unpack_msg(s->x, pm, buf, err);
	}
	if (from) {
		VEC_PUSH(&s->gops, ((xport_op_t){true, pm->from, pm->to, buf, len}));
		VEC_PUSH(&s->gopmsg, idx);
		if (to) { /* between two ranks of this node: local, as on tcp */
			s->st->msgs_local++;
			s->st->bytes_local += payload(pm);
		} else {
			s->st->msgs_out++;
			s->st->bytes_out += payload(pm);
		}
	}
	if (to) { /* both ranks here: receive on the receiver's device */
		rbuf = buf;
		if (from)
			CHECK(group_buf(s, pm->to, len, &rbuf, err));
		VEC_PUSH(&s->gops, ((xport_op_t){false, pm->to, pm->from, rbuf, len}));
		VEC_PUSH(&s->gopmsg, idx);
	}
	s->st->stage_bytes[pm->stage < SLICE_MAX_STAGES ? pm->stage : SLICE_MAX_STAGES - 1] +=
		payload(pm);
	return REFIT_OK;
}

/* The next group: the messages of the next (stage, bucket), packed and synced. */
static refit_status_t
next_group(void *arg, const xport_op_t **ops, size_t *n, bool *end, refit_err_t *err)
{
	slice_t *s = arg;
	const slice_cfg_t *c = s->c;
	const gmsg_t *g0;
	uint32_t round;

	if (!s->bucketed)
		bucket_all(s);
	*end = s->ga >= s->gm.n;
	if (*end)
		return REFIT_OK;
	g0 = &s->gm.v[s->ga];
	/* rounds before this one are done on every rank here: their relay
	 * staging is spent (everything queued on it finished at the last sync) */
	round = g0->stage / c->plan->stages_per_round;
	if (round > s->round) {
		dp_exec_release(s->x, round - 1);
		s->round = round;
	}
	for (s->gb = s->ga; s->gb < s->gm.n && s->gm.v[s->gb].stage == g0->stage &&
			    s->gm.v[s->gb].bucket == g0->bucket; s->gb++)
		;
	for (size_t i = s->ga; i < s->gb; i++)
		CHECK(group_msg(s, s->gm.v[i].idx, err));
	CHECK(s->dev->sync(s->dev->ctx, err));
	if (c->test_delay_ms) /* tests: slow refits, as tcp's */
		for (size_t i = 0; i < s->gops.n && !atomic_load(c->abort); i++)
			if (s->gops.v[i].send)
				usleep(c->test_delay_ms * 1000u);
	*ops = s->gops.v;
	*n = s->gops.n;
	return REFIT_OK;
}

/* Free the group's device staging (also what a failure left). */
static void
group_free(slice_t *s)
{
	for (size_t i = 0; i < s->gbufs.n; i++)
		s->dev->free(s->dev->ctx, s->gbufs.v[i].rank, s->gbufs.v[i].p);
	s->gbufs.n = 0;
	s->gops.n = 0;
	s->gopmsg.n = 0;
}

/* The group ran: unpack its arrivals, free its staging, count its messages. */
static refit_status_t
group_done(void *arg, refit_err_t *err)
{
	slice_t *s = arg;
	const dp_dev_ops_t *dev = s->dev;
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < s->gops.n && rc == REFIT_OK; i++) {
		const plan_msg_t *pm;

		if (s->gops.v[i].send)
			continue;
		pm = msg_at(s, s->gopmsg.v[i]);
		rc = dp_unpack_msg(s->x, pm, s->gops.v[i].buf, err);
		if (!is_local(s->c, pm->from)) {
			s->st->msgs_in++;
			s->st->bytes_in += payload(pm);
		}
	}
	if (rc == REFIT_OK)
		rc = dev->sync(dev->ctx, err);
	group_free(s);
	if (rc == REFIT_OK) /* a failed cudaFree fails the slice too */
		rc = dev->sync(dev->ctx, err);
	if (rc != REFIT_OK)
		return rc;
	stage_done(s, s->gm.v[s->ga].stage);
	for (; s->ga < s->gb; s->ga++) {
		smsg_t *m = &s->msgs.v[s->gm.v[s->ga].idx];

		m->done = true;
		if (m->kind == M_OUT)
			s->out_left--;
		else if (m->kind == M_IN)
			s->in_left--;
		else
			s->local_left--;
	}
	return REFIT_OK;
}

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

/* Open the session, make the executor on its memory, exchange, close. */
static refit_status_t
run_session(slice_t *s, refit_err_t *err)
{
	const slice_cfg_t *c = s->c;
	xport_peer_t *peers = xcalloc(c->nnodes, sizeof(*peers));
	xport_session_cfg_t sc = {
		.refit_id = c->refit_id, .epoch = c->epoch, .peers = peers, .npeers = c->nnodes,
		.max_msg_bytes = c->plan->opts.chunk_bytes + s->trail,
		.deadline_ms = c->deadline_ms, .abort = c->abort, .pool = c->pool,
		.connect_ms = c->connect_ms,
	};
	xport_link_t *links = xcalloc(c->nnodes, sizeof(*links));
	xport_io_t io = {s, begin, pull, push, done, peer_done, next_group, group_done};
	dp_exec_opts_t eo = {.verify = c->verify, .corrupt_msg = -1, .pool = c->pool};
	dp_mem_ops_t dm = *c->mem;
	xport_session_t *sess = NULL;
	int64_t t0 = now_us();
	refit_status_t rc;

	for (size_t i = 0; i < c->nnodes; i++) {
		peers[i].node_id = c->nodes[i].node_id;
		peers[i].endpoint = c->nodes[i].endpoint;
		peers[i].send_to = i != c->self && s->out[i].n > 0;
		peers[i].recv_from = i != c->self && s->in[i].n > 0;
		peers[i].max_in_bytes = peers[i].recv_from ? s->in_max[i] + s->trail : 0;
	}
	sc.links = links;
	delta_begin(s);
	rc = c->xo->open(c->x, &sc, &sess, err);
	s->st->comm_us = (uint64_t)(now_us() - t0);
	if (rc == REFIT_OK) {
		s->opened = true;
		dm.dev = s->dev = c->xo->dev(sess);
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
		group_free(s);
	c->xo->close(sess);
	sdelta_end(&s->d, s->st, rc == REFIT_OK);
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
	slice_t s = {.c = c, .st = st, .t0 = now_us()};
	refit_status_t rc;

	slice_init(&s);
	rc = collect(&s, err);
	if (rc == REFIT_OK)
		rc = run_session(&s, err);
	if (rc == REFIT_OK && !done(&s))
		rc = refit_err_set(err, REFIT_ERR_INTERNAL, "slice: %" PRIu64 " messages never "
				   "became ready (a dependency that never arrives)",
				   s.out_left + s.local_left);
	if (rc != REFIT_OK)
		note_peers(&s);
	st->total_us = (uint64_t)(now_us() - s.t0);
	slice_fini(&s);
	return rc;
}
