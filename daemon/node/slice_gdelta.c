/*
 * slice_gdelta.c - a slice's delta refit in the grouped form (see
 * slice_gdelta.h).  Called by slice_group.c.
 */
#include <inttypes.h>
#include <string.h>

#include "daemon/node/gdelta_base.h"
#include "daemon/node/slice_gdelta.h"
#include "dataplane/delta_gpu.h"

void
sgd_begin(slice_t *s)
{
	const slice_cfg_t *c = s->c;

	memset(&s->gd, 0, sizeof(s->gd));
	if (c->gdelta == NULL || s->dev == NULL || c->delta_tag == 0)
		return;
	s->gd.store = c->gdelta;
	s->gd.kept = true;
	gdelta_begin(c->gdelta, s->dev, c->epoch, c->model, c->digest);
}

void
sgd_fail(slice_t *s)
{
	if (s->c->gdelta != NULL && s->c->xo->memory != XPORT_MEM_HOST)
		gdelta_drop_all(s->c->gdelta, s->dev);
}

void
sgd_end(slice_t *s, slice_stats_t *st, bool ok)
{
	sgd_t *g = &s->gd;

	if (g->store == NULL)
		return;
	st->delta_units = g->delta_units;
	st->delta_wire = g->delta_wire;
	st->delta_dense = g->delta_dense;
	st->dense_units = g->dense_units;
	st->dense_wire = g->dense_wire;
	st->bases_kept = ok && g->kept;
	VEC_FREE(&g->sops);
	VEC_FREE(&g->op);
	g->store = NULL;
}

/* Device staging freed with the group (as slice_group.c's). */
static refit_status_t
gbuf(slice_t *s, int32_t rank, uint64_t bytes, uint8_t **out, refit_err_t *err)
{
	*out = s->dev->alloc(s->dev->ctx, rank, bytes ? bytes : 1);
	if (*out == NULL) {
		CHECK(s->dev->sync(s->dev->ctx, err));
		return refit_err_set(err, REFIT_ERR_NOMEM, "slice: cannot allocate %" PRIu64
				     " bytes of device staging for a delta unit on rank %d",
				     bytes, rank);
	}
	VEC_PUSH(&s->gbufs, ((gbuf_t){*out, rank}));
	return REFIT_OK;
}

static const smsg_t *
msg_of(slice_t *s, size_t i)
{
	return &s->msgs.v[s->gopmsg.v[i]];
}

/* Does op i cross to a peer holding the named base too?  Both ends decide
 * alike: a size message goes first. */
static bool
paired(slice_t *s, size_t i)
{
	const slice_cfg_t *c = s->c;
	const smsg_t *m = msg_of(s, i);

	return c->delta_base && c->delta_ok && m->kind != M_LOCAL && c->delta_ok[c->self] &&
	       c->delta_ok[m->peer];
}

/* A base holds a message's payload and room for its trailer: the same
 * entry whether this refit verifies or not. */
#define TRAIL_ROOM 4u

static unsigned
esize_of(uint64_t bytes)
{
	return bytes % 2 == 0 ? 2 : 1;
}

/* The base entry of op i's message (out: what we send). */
static gdelta_ent_t *
base_find(slice_t *s, size_t i, uint64_t tag)
{
	const xport_op_t *op = &s->gops.v[i];
	const smsg_t *m = msg_of(s, i);

	return gdelta_find(s->gd.store, s->c->model, s->c->digest, s->c->nodes[m->peer].node_id,
			   op->send, s->gopmsg.v[i], op->rank, s->gd.op.v[i].dense + TRAIL_ROOM,
			   tag);
}

/* Op i's dense bytes (payload and trailer) become its message's base,
 * tagged with this refit. */
static void
keep(slice_t *s, size_t i)
{
	const xport_op_t *op = &s->gops.v[i];
	const smsg_t *m = msg_of(s, i);
	sgd_op_t *o = &s->gd.op.v[i];
	gdelta_ent_t *e = gdelta_get(s->gd.store, s->dev, s->c->model, s->c->digest,
				     s->c->nodes[m->peer].node_id, op->send, s->gopmsg.v[i],
				     op->rank, o->dense + TRAIL_ROOM);

	if (e == NULL) {
		s->gd.kept = false;
		return;
	}
	if (e->data != o->dbuf)
		s->dev->copy(s->dev->ctx, op->rank, e->data, o->dbuf, o->dense + s->trail);
	e->tag = s->c->delta_tag;
}

/* Encode every paired send against its base; the smaller wire goes. */
static refit_status_t
encode_all(slice_t *s, refit_err_t *err)
{
	const dp_dev_ops_t *dev = s->dev;
	uint8_t **enc = xcalloc(s->gops.n + 1, sizeof(*enc)), **work = xcalloc(s->gops.n + 1,
									     sizeof(*work));
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < s->gops.n && rc == REFIT_OK; i++) {
		sgd_op_t *o = &s->gd.op.v[i];
		gdelta_ent_t *b;

		if (!s->gops.v[i].send || !paired(s, i) || dev->delta == NULL ||
		    (b = base_find(s, i, s->c->delta_base)) == NULL)
			continue;
		rc = gbuf(s, s->gops.v[i].rank, DP_DELTA_HDR + o->dense + s->trail, &enc[i], err);
		if (rc == REFIT_OK)
			rc = gbuf(s, s->gops.v[i].rank, dp_gdelta_work(o->dense, esize_of(o->dense)),
				  &work[i], err);
		if (rc == REFIT_OK)
			dp_gdelta_encode(dev, s->gops.v[i].rank, b->data, o->dbuf, o->dense,
					 esize_of(o->dense), enc[i], work[i]);
	}
	for (size_t i = 0; i < s->gops.n && rc == REFIT_OK; i++) {
		uint64_t len;
		dp_delta_fmt_t fmt;

		if (work[i] == NULL)
			continue;
		rc = dp_gdelta_encode_result(dev, s->gops.v[i].rank, work[i], &len, &fmt, err);
		if (rc == REFIT_OK && len < s->gd.op.v[i].dense) {
			/* the trailer (verify) after the encoding, as after the payload */
			if (s->trail)
				dev->copy(dev->ctx, s->gops.v[i].rank, enc[i] + len,
					  (uint8_t *)s->gd.op.v[i].dbuf + s->gd.op.v[i].dense,
					  s->trail);
			s->gops.v[i].buf = enc[i];
			s->gops.v[i].bytes = len + s->trail;
			s->gd.op.v[i].delta = true;
		}
	}
	free(enc);
	free(work);
	return rc;
}

/* The size messages: one per paired op, written by senders. */
static refit_status_t
sizes(slice_t *s, refit_err_t *err)
{
	for (size_t i = 0; i < s->gops.n; i++) {
		xport_op_t *op = &s->gops.v[i];
		sgd_op_t *o = &s->gd.op.v[i];
		uint8_t msg[DP_GDELTA_SIZE_MSG];

		if (!paired(s, i))
			continue;
		CHECK(gbuf(s, op->rank, DP_GDELTA_SIZE_MSG, &o->size, err));
		if (op->send) {
			dp_gdelta_size_put(msg, op->bytes, o->delta ? s->c->delta_base : 0);
			s->dev->from_host(s->dev->ctx, op->rank, o->size, msg, sizeof(msg));
		}
		VEC_PUSH(&s->gd.sops, ((xport_op_t){op->send, op->rank, op->peer, o->size,
						    DP_GDELTA_SIZE_MSG}));
	}
	return REFIT_OK;
}

/* Figures and bases of what this bucket sends (after its encodings). */
static void
sent(slice_t *s)
{
	for (size_t i = 0; i < s->gops.n; i++) {
		const sgd_op_t *o = &s->gd.op.v[i];

		if (!s->gops.v[i].send || msg_of(s, i)->kind == M_LOCAL)
			continue;
		if (o->delta) {
			s->gd.delta_units++;
			s->gd.delta_wire += s->gops.v[i].bytes;
			s->gd.delta_dense += o->dense + s->trail;
		} else {
			s->gd.dense_units++;
			s->gd.dense_wire += o->dense + s->trail;
		}
		keep(s, i);
	}
}

refit_status_t
sgd_group(slice_t *s, const xport_op_t **ops, size_t *n, refit_err_t *err)
{
	sgd_t *g = &s->gd;

	*ops = s->gops.v;
	*n = s->gops.n;
	if (g->store == NULL)
		return REFIT_OK;
	g->sops.n = 0;
	g->op.n = 0;
	for (size_t i = 0; i < s->gops.n; i++)
		VEC_PUSH(&g->op, ((sgd_op_t){NULL, NULL, s->gops.v[i].buf,
					     s->gops.v[i].bytes - s->trail, false}));
	CHECK(encode_all(s, err));
	CHECK(sizes(s, err));
	sent(s);
	CHECK(s->dev->sync(s->dev->ctx, err));
	g->phase = 3;
	if (g->sops.n > 0) {
		g->phase = 1;
		*ops = g->sops.v;
		*n = g->sops.n;
	}
	return REFIT_OK;
}

/* A paired receive's size message: its wire bytes and base checked. */
static refit_status_t
size_in(slice_t *s, size_t i, refit_err_t *err)
{
	xport_op_t *op = &s->gops.v[i];
	sgd_op_t *o = &s->gd.op.v[i];
	const char *peer = s->c->nodes[msg_of(s, i)->peer].node_id;
	uint8_t msg[DP_GDELTA_SIZE_MSG];
	uint64_t wire, tag;

	s->dev->to_host(s->dev->ctx, op->rank, msg, o->size, sizeof(msg));
	CHECK(s->dev->sync(s->dev->ctx, err));
	dp_gdelta_size_get(msg, &wire, &tag);
	if (tag == 0 && wire == o->dense + s->trail)
		return REFIT_OK;
	if (tag == 0 || tag != s->c->delta_base || wire < DP_DELTA_HDR + s->trail ||
	    wire >= o->dense + s->trail)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "delta: node %s's size message "
				     "for message %zu names %" PRIu64 " wire bytes against base %"
				     PRIu64 " (the message has %" PRIu64 " bytes, the base named "
				     "%" PRIu64 ")", peer, s->gopmsg.v[i], wire, tag, o->dense + s->trail,
				     s->c->delta_base);
	if ((o->base = base_find(s, i, tag)) == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "delta: node %s sent message %zu "
				     "against base %" PRIu64 ", which rank %d does not hold",
				     peer, s->gopmsg.v[i], tag, op->rank);
	o->delta = true;
	op->bytes = wire;
	return gbuf(s, op->rank, wire, (uint8_t **)&op->buf, err);
}

refit_status_t
sgd_sizes_done(slice_t *s, refit_err_t *err)
{
	for (size_t i = 0; i < s->gops.n; i++)
		if (!s->gops.v[i].send && s->gd.op.v[i].size != NULL)
			CHECK(size_in(s, i, err));
	s->gd.phase = 2;
	return REFIT_OK;
}

/* Decode every encoded arrival into its base, in place. */
static refit_status_t
decode_all(slice_t *s, refit_err_t *err)
{
	uint8_t **work = xcalloc(s->gops.n + 1, sizeof(*work));
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < s->gops.n && rc == REFIT_OK; i++) {
		xport_op_t *op = &s->gops.v[i];
		sgd_op_t *o = &s->gd.op.v[i];

		if (op->send || !o->delta)
			continue;
		if (s->dev->delta == NULL) {
			rc = refit_err_set(err, REFIT_ERR_UNAVAILABLE, "delta: rank %d's device has "
					   "no delta kernels to decode message %zu", op->rank,
					   s->gopmsg.v[i]);
			break;
		}
		rc = gbuf(s, op->rank, dp_gdelta_work(o->dense, esize_of(o->dense)), &work[i], err);
		if (rc == REFIT_OK)
			dp_gdelta_decode(s->dev, op->rank, o->base->data, o->base->data, o->dense,
					 esize_of(o->dense), op->buf, op->bytes - s->trail, work[i]);
	}
	for (size_t i = 0; i < s->gops.n && rc == REFIT_OK; i++)
		if (work[i] != NULL) {
			xport_op_t *op = &s->gops.v[i];
			sgd_op_t *o = &s->gd.op.v[i];

			rc = dp_gdelta_decode_result(s->dev, op->rank, work[i], err);
			if (s->trail) /* the trailer after the payload, for unpack to check */
				s->dev->copy(s->dev->ctx, op->rank, o->base->data + o->dense,
					     (uint8_t *)op->buf + op->bytes - s->trail, s->trail);
			op->buf = o->base->data;
			op->bytes = o->dense + s->trail;
			o->dbuf = op->buf;
		}
	free(work);
	return rc;
}

refit_status_t
sgd_arrived(slice_t *s, refit_err_t *err)
{
	if (s->gd.store == NULL)
		return REFIT_OK;
	s->gd.phase = 0;
	CHECK(decode_all(s, err));
	for (size_t i = 0; i < s->gops.n; i++)
		if (!s->gops.v[i].send && msg_of(s, i)->kind == M_IN)
			keep(s, i);
	return REFIT_OK;
}
