/*
 * exec.c - the executor core (see exec.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "common/strbuf.h"
#include "common/wire.h"
#include "dataplane/exec.h"

typedef struct staged {
	int32_t rank;
	uint32_t tensor, round;
	plan_box_t box;
	uint8_t *data;   /* contiguous, exactly box; NULL once released */
} staged_t;

struct dp_exec {
	const plan_t *p;
	const plan_layout_set_t *src, *dst;
	size_t *map;     /* plan tensor -> src index */
	dp_mem_ops_t mem;
	dp_exec_opts_t o;
	VEC(staged_t) staged;
	uint64_t staged_bytes, staged_max;
	uint64_t *fwd;   /* sorted (rank << 32 | tensor): ranks that send a
			    tensor in a later stage (forwards, relays, chains) */
	size_t nfwd;
};

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Does rank send tensor t on after receiving it (then it must stage it)? */
static bool
forwards(const dp_exec_t *x, int32_t rank, uint32_t t)
{
	uint64_t k = (uint64_t)(uint32_t)rank << 32 | t;

	return xbsearch(&k, x->fwd, x->nfwd, sizeof(k), cmp_u64) != NULL;
}

refit_status_t
dp_exec_new(const plan_t *p, const plan_layout_set_t *src, const plan_layout_set_t *dst,
	    const dp_mem_ops_t *mem, const dp_exec_opts_t *o, dp_exec_t **out,
	    refit_err_t *err)
{
	dp_exec_t *x = xcalloc(1, sizeof(*x));

	*out = NULL;
	if (plan_match(src, dst, &x->map, err) != REFIT_OK) {
		free(x);
		return REFIT_ERR_INVALID_ARG;
	}
	if (p->ntensors != dst->n) {
		free(x->map);
		free(x);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "executor: the plan has %u "
				     "tensors, the layouts %zu", p->ntensors, dst->n);
	}
	x->p = p;
	x->src = src;
	x->dst = dst;
	x->fwd = xmalloc((p->nxfers ? p->nxfers : 1) * sizeof(*x->fwd));
	for (size_t i = 0; i < p->nxfers; i++)
		if (p->xfers[i].stage > 0)
			x->fwd[x->nfwd++] = (uint64_t)(uint32_t)p->xfers[i].from << 32 |
					    p->xfers[i].tensor;
	xqsort(x->fwd, x->nfwd, sizeof(*x->fwd), cmp_u64);
	x->mem = *mem;
	if (o)
		x->o = *o;
	else
		x->o.corrupt_msg = -1;
	*out = x;
	return REFIT_OK;
}

void
dp_exec_free(dp_exec_t *x)
{
	if (x == NULL)
		return;
	dp_exec_release(x, UINT32_MAX);
	VEC_FREE(&x->staged);
	free(x->fwd);
	free(x->map);
	free(x);
}

uint64_t
dp_exec_staged_max(const dp_exec_t *x)
{
	return x->staged_max;
}

void
dp_exec_release(dp_exec_t *x, uint32_t round)
{
	for (size_t i = 0; i < x->staged.n; i++) {
		staged_t *s = &x->staged.v[i];

		if (s->data == NULL || s->round > round)
			continue;
		if (x->mem.dev)
			x->mem.dev->free(x->mem.dev->ctx, s->rank, s->data);
		else if (x->o.pool)
			dp_pool_put(x->o.pool, s->data);
		else
			free(s->data);
		x->staged_bytes -= (uint64_t)plan_box_volume(&s->box, x->dst->v[s->tensor].ndim) *
				   x->p->tensors[s->tensor].elem;
		s->data = NULL;
	}
}

static void
copy_box(const dp_exec_t *x, int32_t rank, const dp_view_t *sv, const plan_shard_t *ss,
	 const dp_view_t *dv, const plan_shard_t *ds, const plan_box_t *box)
{
	if (x->mem.dev)
		x->mem.dev->copy_box(x->mem.dev->ctx, rank, sv, ss, dv, ds, box);
	else
		dp_copy_box(sv, ss, dv, ds, box);
}

/* CRC-32C of n bytes at buf (device memory: through a host copy). */
static uint32_t
crc_of(const dp_exec_t *x, int32_t rank, const uint8_t *buf, uint64_t n)
{
	uint8_t *h;
	uint32_t c;

	if (x->mem.dev == NULL)
		return crc32c(0, buf, n);
	h = xmalloc(n ? n : 1);
	x->mem.dev->to_host(x->mem.dev->ctx, rank, h, buf, n);
	c = crc32c(0, h, n);
	free(h);
	return c;
}

/* Copy from one holding into the part buffer what rem still lacks of it. */
static void
take(const dp_exec_t *x, int32_t rank, const dp_view_t *hv, const plan_shard_t *hs, const dp_view_t *bv,
     const plan_shard_t *bs, plan_boxvec_t *rem, plan_boxvec_t *tmp, int nd)
{
	for (size_t i = 0; i < rem->n; i++) {
		plan_box_t in;

		if (plan_box_intersect(&rem->v[i], &hs->box, nd, &in))
			copy_box(x, rank, hv, hs, bv, bs, &in);
	}
	plan_boxvec_subtract(rem, &hs->box, nd, tmp);
}

/* Fill bv (a buffer holding exactly part box b) from rank's holdings. */
static refit_status_t
gather_part(dp_exec_t *x, int32_t rank, uint32_t t, const plan_box_t *b,
	    const dp_view_t *bv, const plan_shard_t *bs, refit_err_t *err)
{
	const plan_layout_t *ls[2] = {&x->src->v[x->map[t]], &x->dst->v[t]};
	plan_boxvec_t rem = {0}, tmp = {0};
	int nd = x->dst->v[t].ndim;
	refit_status_t rc = REFIT_OK;

	VEC_PUSH(&rem, *b);
	for (int side = 0; side < 2 && rem.n && rc == REFIT_OK; side++) {
		for (size_t i = 0; i < ls[side]->nshards && rem.n && rc == REFIT_OK; i++) {
			const plan_shard_t *s = &ls[side]->shards[i];
			dp_view_t v;

			if (s->rank != rank || !plan_box_overlaps(&s->box, b, nd))
				continue;
			rc = x->mem.view(x->mem.ctx, rank, t, side == 1, s->piece, &v, err);
			if (rc == REFIT_OK)
				take(x, rank, &v, s, bv, bs, &rem, &tmp, nd);
		}
	}
	for (size_t i = 0; i < x->staged.n && rem.n && rc == REFIT_OK; i++) {
		const staged_t *st = &x->staged.v[i];
		plan_shard_t ss;
		dp_view_t v;

		if (st->rank != rank || st->tensor != t || st->data == NULL)
			continue;
		dp_shard_of_box(&ss, &st->box);
		dp_view_contiguous(&v, st->data, nd, st->box.size, bv->elem);
		take(x, rank, &v, &ss, bv, bs, &rem, &tmp, nd);
	}
	if (rc == REFIT_OK && rem.n) {
		strbuf_t sb;

		strbuf_init(&sb);
		plan_box_str(&sb, b, nd);
		rc = refit_err_set(err, REFIT_ERR_INTERNAL, "executor: rank %d does not hold "
				   "tensor \"%s\" %s", rank, x->dst->v[t].name, sb.s);
		strbuf_fini(&sb);
	}
	VEC_FREE(&rem);
	VEC_FREE(&tmp);
	return rc;
}

refit_status_t
dp_pack_msg(dp_exec_t *x, const plan_msg_t *m, uint8_t *buf, refit_err_t *err)
{
	uint64_t end = 0;

	for (uint32_t k = 0; k < m->nparts; k++) {
		const plan_part_t *pt = &m->parts[k];
		const plan_xfer_t *xf = &x->p->xfers[pt->xfer];
		const plan_tensor_ref_t *t = &x->p->tensors[xf->tensor];
		uint64_t off = plan_msg_part_at(m, k);
		plan_shard_t bs;
		dp_view_t bv;

		/* the padding before an aligned part: zeros on the host (a device
		 * buffer's padding travels as it is; no part reads it) */
		if (x->mem.dev == NULL && off > end)
			memset(buf + end, 0, off - end);
		dp_shard_of_box(&bs, &pt->box);
		dp_view_contiguous(&bv, buf + off, t->ndim, pt->box.size, t->elem);
		CHECK(gather_part(x, m->from, xf->tensor, &pt->box, &bv, &bs, err));
		end = off + pt->bytes;
	}
	if (x->o.verify) {
		uint8_t t[4];
		uint32_t c;

		if (x->mem.dev)
			CHECK(x->mem.dev->sync(x->mem.dev->ctx, err));
		c = crc_of(x, m->from, buf, m->bytes);
		wire_put_le(t, c, 4);
		if (x->mem.dev)
			x->mem.dev->from_host(x->mem.dev->ctx, m->from, buf + m->bytes, t, 4);
		else
			memcpy(buf + m->bytes, t, 4);
	}
	return REFIT_OK;
}

static refit_status_t
crc_mismatch(dp_exec_t *x, const plan_msg_t *m, uint32_t want, uint32_t got,
	     refit_err_t *err)
{
	const plan_xfer_t *xf = &x->p->xfers[m->parts[0].xfer];
	const plan_tensor_ref_t *t = &x->p->tensors[xf->tensor];
	strbuf_t sb;
	refit_status_t rc;

	strbuf_init(&sb);
	plan_box_str(&sb, &m->parts[0].box, t->ndim);
	rc = refit_err_set(err, REFIT_ERR_REMOTE, "verify: message from rank %d to rank %d "
			   "(stage %u, %" PRIu64 " bytes, %u parts) fails its CRC-32C "
			   "(sent %08x, received %08x); it carries tensor \"%s\" %s%s",
			   m->from, m->to, m->stage, m->bytes, m->nparts, want, got, t->name,
			   sb.s, m->nparts > 1 ? " and more" : "");
	strbuf_fini(&sb);
	return rc;
}

/* Keep a part the receiver must pass on but does not wholly keep. */
static refit_status_t
stage_part(dp_exec_t *x, int32_t rank, uint32_t t, uint32_t round, const plan_box_t *b,
	   const uint8_t *data, uint64_t bytes, refit_err_t *err)
{
	staged_t s = {rank, t, round, *b, NULL};

	if (x->mem.dev) {
		s.data = dp_dev_alloc_top(x->mem.dev, rank, bytes ? bytes : 1);
		if (s.data == NULL)
			return refit_err_set(err, REFIT_ERR_NOMEM, "executor: cannot allocate "
					     "%" PRIu64 " bytes of device staging", bytes);
		x->mem.dev->copy(x->mem.dev->ctx, rank, s.data, data, bytes);
	} else if (x->o.pool) {
		s.data = dp_pool_get(x->o.pool, bytes);
		if (s.data == NULL)
			return refit_err_set(err, REFIT_ERR_NOMEM, "executor: cannot map "
					     "%" PRIu64 " bytes of relay staging", bytes);
		memcpy(s.data, data, bytes);
	} else {
		s.data = xmalloc(bytes ? bytes : 1);
		memcpy(s.data, data, bytes);
	}
	VEC_PUSH(&x->staged, s);
	x->staged_bytes += bytes;
	if (x->staged_bytes > x->staged_max)
		x->staged_max = x->staged_bytes;
	return REFIT_OK;
}

refit_status_t
dp_unpack_msg(dp_exec_t *x, const plan_msg_t *m, const uint8_t *buf, refit_err_t *err)
{
	if (x->o.verify) {
		uint32_t want = 0, got = crc_of(x, m->to, buf, m->bytes);
		uint8_t t[4];

		if (x->mem.dev) {
			x->mem.dev->to_host(x->mem.dev->ctx, m->to, t, buf + m->bytes, 4);
			/* a failed device read is the failure, not a CRC mismatch */
			CHECK(x->mem.dev->sync(x->mem.dev->ctx, err));
		} else {
			memcpy(t, buf + m->bytes, 4);
		}
		want = (uint32_t)wire_get_le(t, 4);
		if (want != got)
			return crc_mismatch(x, m, want, got, err);
	}
	for (uint32_t k = 0; k < m->nparts; k++) {
		const plan_part_t *pt = &m->parts[k];
		const plan_xfer_t *xf = &x->p->xfers[pt->xfer];
		const plan_layout_t *d = &x->dst->v[xf->tensor];
		const plan_tensor_ref_t *t = &x->p->tensors[xf->tensor];
		plan_boxvec_t rem = {0}, tmp = {0};
		uint64_t off = plan_msg_part_at(m, k);
		refit_status_t rc = REFIT_OK;
		plan_shard_t ps;
		dp_view_t pv;

		VEC_PUSH(&rem, pt->box);
		dp_shard_of_box(&ps, &pt->box);
		dp_view_contiguous(&pv, (uint8_t *)buf + off, t->ndim, pt->box.size, t->elem);
		for (size_t i = 0; i < d->nshards; i++) {
			const plan_shard_t *s = &d->shards[i];
			plan_box_t in;
			dp_view_t v;

			if (s->rank != m->to ||
			    !plan_box_intersect(&s->box, &pt->box, t->ndim, &in))
				continue;
			rc = x->mem.view(x->mem.ctx, m->to, xf->tensor, true, s->piece, &v, err);
			if (rc != REFIT_OK)
				break;
			copy_box(x, m->to, &pv, &ps, &v, s, &in);
			plan_boxvec_subtract(&rem, &s->box, t->ndim, &tmp);
		}
		/* kept when the receiver passes on more than it keeps (its boxes
		 * may overlap: what is left uncovered decides) */
		if (rc == REFIT_OK && rem.n && forwards(x, m->to, xf->tensor))
			rc = stage_part(x, m->to, xf->tensor, m->stage / x->p->stages_per_round,
					&pt->box, buf + off, pt->bytes, err);
		VEC_FREE(&rem);
		VEC_FREE(&tmp);
		CHECK(rc);
	}
	return REFIT_OK;
}

refit_status_t
dp_exec_local(dp_exec_t *x, dp_exec_stats_t *st, refit_err_t *err)
{
	plan_msgs_t it;
	plan_msg_t m;
	uint8_t *buf = xmalloc(x->p->opts.chunk_bytes + 4);
	refit_status_t rc = REFIT_OK;
	int64_t idx = 0;

	memset(st, 0, sizeof(*st));
	plan_msgs_init(&it, x->p, 0, x->p->nxfers);
	while (rc == REFIT_OK && plan_msgs_next(&it, &m)) {
		rc = dp_pack_msg(x, &m, buf, err);
		if (rc == REFIT_OK && idx == x->o.corrupt_msg && m.bytes > 0)
			buf[m.bytes / 2] ^= 0x5a;
		if (rc == REFIT_OK)
			rc = dp_unpack_msg(x, &m, buf, err);
		st->msgs++;
		if (m.from == m.to)
			st->local_bytes += m.bytes;
		else
			st->bytes += m.bytes;
		idx++;
	}
	st->staged_bytes_max = x->staged_max;
	plan_msgs_fini(&it);
	free(buf);
	return rc;
}
