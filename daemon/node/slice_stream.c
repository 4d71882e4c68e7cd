/*
 * slice_stream.c - a slice's stream form (see slice_internal.h): the
 * transport pulls what is ready and pushes what arrived; parts are the unit
 * of readiness, so a relay goes piece by piece as its pieces land
 * (cut-through); counting parts, messages and stages done.  Calls no other
 * slice file.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/node/slice_internal.h"

int64_t
slice_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void
slice_stage_done(slice_t *s, uint32_t stage)
{
	uint32_t k = stage < SLICE_MAX_STAGES ? stage : SLICE_MAX_STAGES - 1;

	s->st->stage_us[k] = (uint64_t)(slice_now_us() - s->t0);
	if (k + 1 > s->st->nstages)
		s->st->nstages = k + 1;
}

const plan_msg_t *
slice_msg_at(slice_t *s, size_t i)
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
	slice_stage_done(s, stage);
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
uint64_t
slice_payload(const plan_msg_t *m)
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
	const plan_msg_t *pm = slice_msg_at(s, i);
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
refit_status_t
slice_finished(slice_t *s, refit_err_t *err)
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
			parts_done(s, i, (uint32_t)(p - s->msgs.v[i].part0), 1, slice_payload(&m));
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
refit_status_t
slice_pull(void *arg, size_t peer, const uint8_t **buf, uint64_t *len, uint64_t *seq,
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
	sdelta_out(&s->d, peer, sm->pos, slice_msg_at(s, i), k0, n, unit_esize(s, &m), s->buf[peer],
		   m.bytes + s->trail, s->trail, buf, len, &dl);
	*seq = sm->pos | (uint64_t)k0 << SEQ_PART_SHIFT | (dl ? SEQ_DELTA : 0);
	parts_done(s, i, k0, n, slice_payload(&m));
	for (uint32_t k = k0; k < k0 + n; k++)
		VEC_PUSH(&s->work, sm->part0 + k);
	return slice_finished(s, err);
}

refit_status_t
slice_push(void *arg, size_t peer, uint64_t seq, const uint8_t *buf, uint64_t len,
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
	pm = slice_msg_at(s, i);
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
	parts_done(s, i, (uint32_t)k0, n, slice_payload(&m));
	for (uint32_t k = (uint32_t)k0; k < k0 + n; k++)
		VEC_PUSH(&s->work, sm->part0 + k);
	return slice_finished(s, err);
}

bool
slice_done(void *arg)
{
	slice_t *s = arg;

	return s->out_left == 0 && s->in_left == 0 && s->local_left == 0;
}

bool
slice_peer_done(void *arg, size_t peer)
{
	slice_t *s = arg;

	return s->in_got[peer] >= s->in[peer].n;
}
