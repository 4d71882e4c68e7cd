/*
 * slice_group.c - a slice's grouped form for the nccl transport (see
 * slice_internal.h): every message bucketed by (stage, bucket), each bucket
 * one NCCL group of sends and receives staged on the devices.  Calls
 * slice_stream.c.
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
#include "plan/gpu_staging.h"

/* ---- the grouped form (nccl) ----------------------------------------------------

 * Every message gets a bucket, computed identically on every node from the
 * global message order (plan/gpu_staging.h, plan_buckets_t): per stage, each
 * rank fills buckets of at most staging_bytes (one larger message alone); a
 * message goes to the later of its two ranks' current buckets.  Nodes run (stage, bucket) in order, all
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

/* Bucket every message of the plan (plan_buckets_t, the rule the
 * whole-slice estimate replays); keep this node's, sorted by (stage,
 * bucket, plan order). */
static void
bucket_all(slice_t *s)
{
	const slice_cfg_t *c = s->c;
	size_t order = 0, mi = 0;
	plan_buckets_t b;
	plan_msg_t m;
	uint64_t k;

	plan_buckets_init(&b, c->plan);
	while (plan_buckets_next(&b, &m, &k)) {
		/* gm[].idx counts this node's messages in plan order, as slice_collect() kept them */
		if (is_local(c, m.from) || is_local(c, m.to))
			VEC_PUSH(&s->gm, ((gmsg_t){mi++, m.stage, k, order}));
		order++;
	}
	plan_buckets_fini(&b);
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
	const plan_msg_t *pm = slice_msg_at(s, idx);
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
		s->st->bytes_local += slice_payload(pm);
		return dp_unpack_msg(s->x, pm, buf, err);
	}
	if (from) {
		VEC_PUSH(&s->gops, ((xport_op_t){true, pm->from, pm->to, buf, len}));
		VEC_PUSH(&s->gopmsg, idx);
		if (to) { /* between two ranks of this node: local, as on tcp */
			s->st->msgs_local++;
			s->st->bytes_local += slice_payload(pm);
		} else {
			s->st->msgs_out++;
			s->st->bytes_out += slice_payload(pm);
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
		slice_payload(pm);
	return REFIT_OK;
}

/* The next group: the messages of the next (stage, bucket), packed and synced. */
refit_status_t
slice_next_group(void *arg, const xport_op_t **ops, size_t *n, bool *end, refit_err_t *err)
{
	slice_t *s = arg;
	const slice_cfg_t *c = s->c;
	const gmsg_t *g0;
	uint32_t round;

	if (s->gd.phase == 2) {   /* the bucket's data, its sizes exchanged */
		s->gd.phase = 3;
		*end = false;
		*ops = s->gops.v;
		*n = s->gops.n;
		return REFIT_OK;
	}
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
	/* delta (slice_gdelta.h): the size messages first, when any */
	return sgd_group(s, ops, n, err);
}

/* Free the group's device staging (also what a failure left). */
void
slice_group_free(slice_t *s)
{
	for (size_t i = 0; i < s->gbufs.n; i++)
		s->dev->free(s->dev->ctx, s->gbufs.v[i].rank, s->gbufs.v[i].p);
	s->gbufs.n = 0;
	s->gops.n = 0;
	s->gopmsg.n = 0;
}

/* The group ran: unpack its arrivals, free its staging, count its messages. */
refit_status_t
slice_group_done(void *arg, refit_err_t *err)
{
	slice_t *s = arg;
	const dp_dev_ops_t *dev = s->dev;
	refit_status_t rc;

	if (s->gd.phase == 1) /* sizes exchanged: the data group comes next */
		return sgd_sizes_done(s, err);
	rc = sgd_arrived(s, err);
	for (size_t i = 0; i < s->gops.n && rc == REFIT_OK; i++) {
		const plan_msg_t *pm;

		if (s->gops.v[i].send)
			continue;
		pm = slice_msg_at(s, s->gopmsg.v[i]);
		rc = dp_unpack_msg(s->x, pm, s->gops.v[i].buf, err);
		if (!is_local(s->c, pm->from)) {
			s->st->msgs_in++;
			s->st->bytes_in += slice_payload(pm);
		}
	}
	if (rc == REFIT_OK)
		rc = dev->sync(dev->ctx, err);
	slice_group_free(s);
	if (rc == REFIT_OK) /* a failed cudaFree fails the slice too */
		rc = dev->sync(dev->ctx, err);
	if (rc != REFIT_OK)
		return rc;
	slice_stage_done(s, s->gm.v[s->ga].stage);
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
