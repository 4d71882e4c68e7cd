/*
 * conv_exec.c - the conversion memory wrapper (see conv_exec.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"
#include "dataplane/conv_dev.h"
#include "dataplane/conv_exec.h"
#include "dataplane/convert.h"

enum { BUF_PIECE, BUF_SCALE, BUF_RECV, BUF_TEMP };

typedef struct cbuf {
	int kind;
	uint32_t conv;     /* index in c->t */
	int32_t rank, piece;
	uint32_t shard;    /* BUF_SCALE, BUF_RECV: shard index in the rewritten layout */
	dp_view_t v;
} cbuf_t;

struct dp_conv {
	const plan_conv_t *c;
	const plan_layout_set_t *src, *dst;
	dp_mem_ops_t under, mem;
	VEC(cbuf_t *) bufs;  /* each on the heap: pointers stay valid as it grows */
	strmap_t index;    /* buffer key -> index in bufs */
	int64_t *scale_src;/* per conversion: its scale tensor's source in c->src, or -1 */
	bool **done;       /* per sender-side conversion: kept shard converted */
	uint64_t bytes;
	const dp_dev_ops_t *dev;  /* the session's device (NULL: host memory) */
	int32_t ntemp;     /* BUF_TEMP buffers made (their keys' piece) */
};

static void
quant_of(const plan_conv_tensor_t *t, dp_quant_t *q)
{
	memset(q, 0, sizeof(*q));
	q->from = t->from;
	q->to = t->to;
	q->ndim = t->ndim;
	q->mx = t->scale == PLAN_SCALE_MX;
	memcpy(q->shape, t->shape, sizeof(q->shape));
	memcpy(q->block, t->block, sizeof(q->block));
}

static void
key_of(char *k, size_t n, int kind, uint32_t conv, int32_t rank, int32_t piece, uint32_t shard)
{
	snprintf(k, n, "%d/%u/%d/%d/%u", kind, conv, rank, piece, shard);
}

static cbuf_t *
find(dp_conv_t *x, int kind, uint32_t k, int32_t rank, int32_t piece, uint32_t shard)
{
	char key[80];
	int32_t i;

	key_of(key, sizeof(key), kind, k, rank, piece, shard);
	i = strmap_get(&x->index, key);
	return i < 0 ? NULL : x->bufs.v[i];
}

/* Scratch of shape for one key: host memory (zeroed), or memory of rank's
 * device (NULL and err set when it cannot be had). */
static cbuf_t *
make(dp_conv_t *x, int kind, uint32_t k, int32_t rank, int32_t piece, uint32_t shard,
     int ndim, const int64_t *shape, uint32_t e, refit_err_t *err)
{
	uint64_t n = dp_view_bytes(ndim, shape, e);
	void *base = x->dev ? dp_dev_alloc_top(x->dev, rank, n ? n : 1) : xcalloc(1, n ? n : 1);
	cbuf_t *b;
	char key[80];

	if (base == NULL) {
		refit_err_set(err, REFIT_ERR_UNAVAILABLE, "conversion: cannot allocate %llu bytes "
			      "of GPU scratch for rank %d (the device's error follows at its sync)",
			      (unsigned long long)n, rank);
		return NULL;
	}
	b = xcalloc(1, sizeof(*b));
	*b = (cbuf_t){kind, k, rank, piece, shard, {0}};
	dp_view_contiguous(&b->v, base, ndim, shape, e);
	x->bytes += n;
	key_of(key, sizeof(key), kind, k, rank, piece, shard);
	strmap_put(&x->index, key, (int32_t)x->bufs.n);
	VEC_PUSH(&x->bufs, b);
	return b;
}

/* The fp8 (or cast) scratch of a sender's piece, made on first use. */
static refit_status_t
piece_buf(dp_conv_t *x, uint32_t k, int32_t rank, int32_t piece, cbuf_t **out,
	  refit_err_t *err)
{
	const plan_conv_tensor_t *t = &x->c->t[k];
	int64_t shape[PLAN_MAX_DIMS];

	*out = find(x, BUF_PIECE, k, rank, piece, 0);
	if (*out)
		return REFIT_OK;
	CHECK(dp_local_shape(&x->src->v[t->src], rank, piece, shape, err));
	*out = make(x, BUF_PIECE, k, rank, piece, 0, t->ndim, shape,
		    (uint32_t)plan_dtype_size(t->to), err);
	return *out ? REFIT_OK : err->status;
}

static refit_status_t
scale_buf(dp_conv_t *x, uint32_t k, uint32_t i, cbuf_t **out, refit_err_t *err)
{
	const plan_layout_t *ss = &x->c->src.v[x->scale_src[k]];
	const plan_shard_t *sh = &ss->shards[i];

	*out = find(x, BUF_SCALE, k, sh->rank, sh->piece, i);
	if (*out == NULL)
		*out = make(x, BUF_SCALE, k, sh->rank, sh->piece, i, ss->ndim, sh->box.size,
			    (uint32_t)plan_dtype_size(ss->dtype), err);
	return *out ? REFIT_OK : err->status;
}

/* dp_quant_region, on the host or as launches on rank's device (with a
 * scratch for the scales of want's blocks, freed with the wrapper's). */
static refit_status_t
quant(dp_conv_t *x, uint32_t k, int32_t rank, const dp_quant_t *q, const dp_view_t *sv,
      const plan_shard_t *ss, const plan_box_t *want, const dp_view_t *qv,
      const plan_shard_t *qs, const dp_view_t *scv, const plan_shard_t *scs,
      refit_err_t *err)
{
	int64_t n;
	cbuf_t *tb;

	if (x->dev == NULL) {
		dp_quant_region(q, sv, ss, want, qv, qs, scv, scs);
		return REFIT_OK;
	}
	n = (int64_t)dp_dev_quant_scratch(q, want);
	if ((tb = make(x, BUF_TEMP, k, rank, x->ntemp++, 0, 1, &n, 1, err)) == NULL)
		return err->status;
	dp_dev_quant(x->dev, rank, q, sv, ss, want, qv, qs, scv, scs, tb->v.base);
	return REFIT_OK;
}

/* Convert kept source shard i of sender-side conversion k (once). */
static refit_status_t
convert_shard(dp_conv_t *x, uint32_t k, uint32_t i, refit_err_t *err)
{
	const plan_conv_tensor_t *t = &x->c->t[k];
	const plan_shard_t *s = &x->src->v[t->src].shards[t->src_shard[i]];
	cbuf_t *pb, *sb = NULL;
	plan_shard_t scs;
	dp_view_t sv;
	dp_quant_t q;

	if (x->done[k][i])
		return REFIT_OK;
	CHECK(x->under.view(x->under.ctx, s->rank, t->dst, false, s->piece, &sv, err));
	CHECK(piece_buf(x, k, s->rank, s->piece, &pb, err));
	if (t->scale == PLAN_SCALE_NONE && x->dev) {
		dp_dev_cvt_box(x->dev, s->rank, &sv, s, t->from, &pb->v, s, t->to, &s->box);
	} else if (t->scale == PLAN_SCALE_NONE) {
		dp_cvt_box(&sv, s, t->from, &pb->v, s, t->to, 0, &s->box);
	} else {
		CHECK(scale_buf(x, k, i, &sb, err));
		memset(&scs, 0, sizeof(scs));
		for (int d = 0; d < t->ndim; d++) {
			scs.box.off[d] = s->box.off[d] / t->block[d];
			scs.box.size[d] = sb->v.ndim ? sb->v.shape[d] : 1;
		}
		quant_of(t, &q);
		CHECK(quant(x, k, s->rank, &q, &sv, s, &s->box, &pb->v, s, &sb->v, &scs, err));
	}
	x->done[k][i] = true;
	return REFIT_OK;
}

/* Source-side views of a sender-side conversion. */
static refit_status_t
sender_view(dp_conv_t *x, uint32_t k, uint32_t t2, int32_t rank, int32_t piece,
	    dp_view_t *out, refit_err_t *err)
{
	const plan_conv_tensor_t *t = &x->c->t[k];
	const plan_layout_set_t *o = x->src;
	bool any = false;

	for (size_t i = 0; i < t->nshards; i++) {
		const plan_shard_t *s = &o->v[t->src].shards[t->src_shard[i]];
		bool mine = s->rank == rank && (t2 == t->dst2 ? s->piece == piece : true);

		if (t2 != t->dst2 && mine) { /* the scale source: shard i, its piece */
			cbuf_t *sb;

			CHECK(scale_buf(x, k, (uint32_t)i, &sb, err));
			if (sb->piece != piece)
				continue;
			CHECK(convert_shard(x, k, (uint32_t)i, err));
			*out = sb->v;
			return REFIT_OK;
		}
		if (mine) {
			CHECK(convert_shard(x, k, (uint32_t)i, err));
			any = true;
		}
	}
	if (any) {
		cbuf_t *pb;

		CHECK(piece_buf(x, k, rank, piece, &pb, err));
		*out = pb->v;
		return REFIT_OK;
	}
	return refit_err_set(err, REFIT_ERR_INTERNAL, "conversion: rank %d converts no piece %d "
			     "of \"%s\"", rank, piece, x->c->dst.v[t2].name);
}

/* The receive scratch of a receiver-side conversion's shard. */
static refit_status_t
recv_view(dp_conv_t *x, uint32_t k, int32_t rank, int32_t piece, dp_view_t *out,
	  refit_err_t *err)
{
	const plan_conv_tensor_t *t = &x->c->t[k];
	const plan_layout_t *w = &x->c->dst.v[t->dst2];

	for (size_t i = 0; i < w->nshards; i++) {
		const plan_shard_t *s = &w->shards[i];
		cbuf_t *b;

		if (s->rank != rank || s->piece != piece)
			continue;
		b = find(x, BUF_RECV, k, rank, piece, (uint32_t)i);
		if (b == NULL)
			b = make(x, BUF_RECV, k, rank, piece, (uint32_t)i, w->ndim, s->box.size,
				 (uint32_t)plan_dtype_size(w->dtype), err);
		if (b == NULL)
			return err->status;
		*out = b->v;
		return REFIT_OK;
	}
	return refit_err_set(err, REFIT_ERR_INTERNAL, "conversion: rank %d receives no piece "
			     "%d of \"%s\"", rank, piece, w->name);
}

static refit_status_t
conv_view(void *ctx, int32_t rank, uint32_t t2, bool dst, int32_t piece, dp_view_t *out,
	  refit_err_t *err)
{
	dp_conv_t *x = ctx;
	int64_t k = x->c->dst_conv[t2];
	const plan_conv_tensor_t *t = k >= 0 ? &x->c->t[k] : NULL;

	if (t && t->site == PLAN_CONV_RECEIVER && dst)
		return recv_view(x, (uint32_t)k, rank, piece, out, err);
	if (t && t->site == PLAN_CONV_SENDER && !dst)
		return sender_view(x, (uint32_t)k, t2, rank, piece, out, err);
	return x->under.view(x->under.ctx, rank, x->c->dst_orig[t2], dst, piece, out, err);
}

refit_status_t
dp_conv_new(const plan_conv_t *c, const plan_layout_set_t *src, const plan_layout_set_t *dst,
	    const dp_mem_ops_t *under, dp_conv_t **out, refit_err_t *err)
{
	dp_conv_t *x;

	*out = NULL;
	if (under->dev != NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "conversion: device memory is "
				     "not supported by the host executor");
	x = xcalloc(1, sizeof(*x));
	x->c = c;
	x->src = src;
	x->dst = dst;
	x->under = *under;
	x->mem.view = conv_view;
	x->mem.ctx = x;
	strmap_init(&x->index);
	x->scale_src = xmalloc((c->n ? c->n : 1) * sizeof(*x->scale_src));
	{
		strmap_t names;

		strmap_init(&names);
		for (size_t j = 0; j < c->src.n; j++)
			strmap_put(&names, c->src.v[j].name, (int32_t)j);
		for (size_t k = 0; k < c->n; k++)
			x->scale_src[k] = c->t[k].scale_dst2 < 0 ? -1 :
					  strmap_get(&names, c->dst.v[c->t[k].scale_dst2].name);
		strmap_fini(&names);
	}
	x->done = xcalloc(c->n ? c->n : 1, sizeof(*x->done));
	for (size_t k = 0; k < c->n; k++)
		x->done[k] = xcalloc(c->t[k].nshards ? c->t[k].nshards : 1, sizeof(bool));
	*out = x;
	return REFIT_OK;
}

const dp_mem_ops_t *
dp_conv_mem(dp_conv_t *x)
{
	return &x->mem;
}

uint64_t
dp_conv_scratch_bytes(const dp_conv_t *x)
{
	return x->bytes;
}

/* The elements whose scales a receiver's scale shard gs holds (the tensor
 * scale of a 0-dim layout o: the one block, gs made so). */
static void
scale_want(const plan_conv_tensor_t *t, const plan_layout_t *o, plan_shard_t *gs,
	   plan_box_t *want)
{
	if (o->ndim == 0)
		for (int d = 0; d < t->ndim; d++) {
			gs->box.off[d] = 0;
			gs->box.size[d] = 1;
		}
	for (int d = 0; d < t->ndim; d++) {
		int64_t a = gs->box.off[d] * t->block[d];
		int64_t b = (gs->box.off[d] + gs->box.size[d]) * t->block[d];

		want->off[d] = a;
		want->size[d] = (b < t->shape[d] ? b : t->shape[d]) - a;
	}
}

refit_status_t
dp_conv_finish(dp_conv_t *x, int32_t rank, refit_err_t *err)
{
	for (size_t k = 0; k < x->c->n; k++) {
		const plan_conv_tensor_t *t = &x->c->t[k];
		const plan_layout_t *w = &x->c->dst.v[t->dst2];
		dp_quant_t q;

		if (t->site != PLAN_CONV_RECEIVER)
			continue;
		quant_of(t, &q);
		for (size_t i = 0; i < w->nshards; i++) {
			const plan_shard_t *s = &w->shards[i];
			const plan_conv_shard_t *e = &t->dst_shard[i];
			const plan_layout_t *o = &x->dst->v[e->is_scale ? t->scale_dst : t->dst];
			const plan_shard_t *os = &o->shards[e->orig];
			plan_shard_t gs = *os;
			dp_view_t sv, rv;
			plan_box_t want;

			if (s->rank != rank)
				continue;
			CHECK(recv_view(x, (uint32_t)k, rank, s->piece, &sv, err));
			CHECK(x->under.view(x->under.ctx, rank, e->is_scale ? (uint32_t)t->scale_dst
					    : t->dst, true, os->piece, &rv, err));
			if (!e->is_scale) {
				CHECK(quant(x, (uint32_t)k, rank, &q, &sv, s, &os->box, &rv, os,
					    NULL, NULL, err));
				continue;
			}
			scale_want(t, o, &gs, &want);
			CHECK(quant(x, (uint32_t)k, rank, &q, &sv, s, &want, NULL, NULL, &rv, &gs,
				    err));
		}
	}
	return REFIT_OK;
}

#define RND256(n) ((((n) ? (n) : 1) + 255) / 256 * 256)

/* A sender-side conversion's scratch on rank: converted pieces, scale
 * shards, and the quantizer's scratch per converted shard. */
static uint64_t
need_sender(const dp_conv_t *x, uint32_t k, int32_t rank)
{
	const plan_conv_tensor_t *t = &x->c->t[k];
	const plan_layout_t *sl = &x->src->v[t->src];
	const plan_layout_t *ss = x->scale_src[k] >= 0 ? &x->c->src.v[x->scale_src[k]] : NULL;
	uint64_t sum = 0;
	dp_quant_t q;

	quant_of(t, &q);
	for (size_t i = 0; i < t->nshards; i++) {
		const plan_shard_t *s = &sl->shards[t->src_shard[i]];
		int64_t shape[PLAN_MAX_DIMS];
		bool first = true;
		refit_err_t e;

		for (size_t j = 0; j < i; j++)
			first = first && !(sl->shards[t->src_shard[j]].rank == s->rank &&
					   sl->shards[t->src_shard[j]].piece == s->piece);
		if (s->rank == rank && first &&
		    dp_local_shape(sl, rank, s->piece, shape, &e) == REFIT_OK)
			sum += RND256(dp_view_bytes(t->ndim, shape, (uint32_t)plan_dtype_size(t->to)));
		if (t->scale == PLAN_SCALE_NONE)
			continue;
		if (ss && i < ss->nshards && ss->shards[i].rank == rank)
			sum += RND256(dp_view_bytes(ss->ndim, ss->shards[i].box.size,
						    (uint32_t)plan_dtype_size(ss->dtype)));
		if (s->rank == rank)
			sum += RND256(dp_dev_quant_scratch(&q, &s->box));
	}
	return sum;
}

/* A receiver-side conversion's scratch on rank: the receive blocks and
 * the quantizer's scratch per shard dp_conv_finish quantizes. */
static uint64_t
need_receiver(const dp_conv_t *x, uint32_t k, int32_t rank)
{
	const plan_conv_tensor_t *t = &x->c->t[k];
	const plan_layout_t *w = &x->c->dst.v[t->dst2];
	uint64_t sum = 0;
	dp_quant_t q;

	quant_of(t, &q);
	for (size_t i = 0; i < w->nshards; i++) {
		const plan_shard_t *s = &w->shards[i];
		const plan_conv_shard_t *e = &t->dst_shard[i];
		const plan_layout_t *o = &x->dst->v[e->is_scale ? t->scale_dst : t->dst];
		plan_shard_t gs = o->shards[e->orig];
		plan_box_t want = gs.box;

		if (s->rank != rank)
			continue;
		sum += RND256(dp_view_bytes(w->ndim, s->box.size, (uint32_t)plan_dtype_size(w->dtype)));
		if (e->is_scale)
			scale_want(t, o, &gs, &want);
		sum += RND256(dp_dev_quant_scratch(&q, &want));
	}
	return sum;
}

uint64_t
dp_conv_scratch_need(const dp_conv_t *x, int32_t rank)
{
	uint64_t sum = 0;

	for (size_t k = 0; x && k < x->c->n; k++)
		if (x->c->t[k].site == PLAN_CONV_SENDER)
			sum += need_sender(x, (uint32_t)k, rank);
		else if (x->c->t[k].site == PLAN_CONV_RECEIVER)
			sum += need_receiver(x, (uint32_t)k, rank);
	return sum;
}

refit_status_t
dp_conv_set_dev(dp_conv_t *x, const dp_dev_ops_t *dev, refit_err_t *err)
{
	if (dev == NULL)
		return REFIT_OK;
	if (dev->convert == NULL)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "conversion: the transport's GPU "
				     "kernel library has no conversion kernels (refit_cuda_convert; "
				     "docs/conversion.md): a model that converts dtypes cannot "
				     "refit over it");
	for (size_t k = 0; k < x->c->n; k++) {
		const plan_conv_tensor_t *t = &x->c->t[k];
		dp_quant_t q;

		quant_of(t, &q);
		CHECK(dp_dev_quant_ok(&q, x->c->dst.v[t->dst2].name, err));
	}
	x->dev = dev;
	return REFIT_OK;
}

void
dp_conv_release(dp_conv_t *x)
{
	for (size_t i = 0; x && i < x->bufs.n; i++) {
		if (x->dev)
			x->dev->free(x->dev->ctx, x->bufs.v[i]->rank, x->bufs.v[i]->v.base);
		else
			free(x->bufs.v[i]->v.base);
		free(x->bufs.v[i]);
	}
	if (x == NULL)
		return;
	x->bufs.n = 0;
	strmap_fini(&x->index);
	strmap_init(&x->index);
	x->bytes = 0;
}

void
dp_conv_free(dp_conv_t *x)
{
	if (x == NULL)
		return;
	dp_conv_release(x);
	VEC_FREE(&x->bufs);
	strmap_fini(&x->index);
	free(x->scale_src);
	for (size_t k = 0; k < x->c->n; k++)
		free(x->done[k]);
	free(x->done);
	free(x);
}
