/*
 * plan.c - plan_build (input checks, dispatch to a planner), chunking into
 * messages, canonical form and digest.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"
#include "plan/radix.h"

void
plan_opts_default(plan_opts_t *o)
{
	o->mode = PLAN_MODE_RESHARD;
	o->chunk_bytes = PLAN_DEFAULT_CHUNK_BYTES;
	o->staging_bytes = PLAN_DEFAULT_STAGING_BYTES;
}

const char *
plan_mode_name(plan_mode_t m)
{
	return m == PLAN_MODE_BROADCAST ? "broadcast" : "reshard";
}

refit_status_t
plan_mode_parse(const char *s, plan_mode_t *out)
{
	if (strcmp(s, "reshard") == 0)
		*out = PLAN_MODE_RESHARD;
	else if (strcmp(s, "broadcast") == 0)
		*out = PLAN_MODE_BROADCAST;
	else
		return REFIT_ERR_INVALID_ARG;
	return REFIT_OK;
}

void
plan_init_tensors(plan_t *p, const plan_layout_set_t *dst, const plan_opts_t *opts)
{
	p->opts = *opts;
	p->ntensors = (uint32_t)dst->n;
	p->tensors = xcalloc(dst->n ? dst->n : 1, sizeof(*p->tensors));
	for (size_t i = 0; i < dst->n; i++) {
		p->tensors[i].name = xstrdup(dst->v[i].name);
		p->tensors[i].dtype = dst->v[i].dtype;
		p->tensors[i].ndim = dst->v[i].ndim;
		p->tensors[i].elem = (uint32_t)plan_dtype_size(dst->v[i].dtype);
	}
}

/* ---- messages ---------------------------------------------------------- */

void
plan_msgs_init(plan_msgs_t *it, const plan_t *p, size_t first, size_t end)
{
	memset(it, 0, sizeof(*it));
	it->p = p;
	it->x = first;
	it->end = end;
}

void
plan_msgs_fini(plan_msgs_t *it)
{
	VEC_FREE(&it->chunks);
	VEC_FREE(&it->parts);
}

static bool
same_group(const plan_xfer_t *a, const plan_xfer_t *b)
{
	return a->stage == b->stage && a->from == b->from && a->to == b->to;
}

bool
plan_msgs_next(plan_msgs_t *it, plan_msg_t *m)
{
	const plan_t *p = it->p;
	uint64_t chunk = p->opts.chunk_bytes;

	it->parts.n = 0;
	if (it->chunk_i < it->chunks.n) {
		/* the next chunk of a large transfer */
		const plan_xfer_t *x = &p->xfers[it->x - 1];
		const plan_tensor_ref_t *t = &p->tensors[x->tensor];
		plan_part_t part = {(uint32_t)(it->x - 1), it->chunks.v[it->chunk_i++], 0, 0};

		part.bytes = (uint64_t)plan_box_volume(&part.box, t->ndim) * t->elem;
		VEC_PUSH(&it->parts, part);
		*m = (plan_msg_t){x->stage, x->from, x->to, part.bytes, it->parts.v, 1};
		return true;
	}
	if (it->x >= it->end)
		return false;
	const plan_xfer_t *first = &p->xfers[it->x];
	const plan_tensor_ref_t *t = &p->tensors[first->tensor];
	uint64_t b = plan_xfer_bytes(p, first);

	if (b > chunk) {
		it->chunks.n = 0;
		it->chunk_i = 0;
		plan_box_chunk(plan_xfer_box(p, first), t->ndim, t->elem, chunk, &it->chunks);
		it->x++;
		return plan_msgs_next(it, m);
	}
	*m = (plan_msg_t){first->stage, first->from, first->to, 0, NULL, 0};
	while (it->x < it->end && same_group(&p->xfers[it->x], first)) {
		const plan_xfer_t *x = &p->xfers[it->x];
		uint64_t xb = plan_xfer_bytes(p, x);
		uint64_t at = plan_part_align(m->bytes);

		if (xb > chunk || at + xb > chunk)
			break;
		VEC_PUSH(&it->parts, ((plan_part_t){(uint32_t)it->x, *plan_xfer_box(p, x), xb, at}));
		m->bytes = at + xb;
		it->x++;
	}
	m->parts = it->parts.v;
	m->nparts = (uint32_t)it->parts.n;
	return true;
}

/* ---- sorting, digest ---------------------------------------------------- */


#define KEY_U64(kc, x) (x)
RADIX_SORT_DEFINE(radix_u64, uint64_t, int, KEY_U64)

_Static_assert(sizeof(plan_xfer_t) >= 2 * sizeof(uint64_t), "sort_packed packs in place");

static int
cmp_xfer_box(const void *a, const void *b, void *ctx)
{
	const plan_box_t *boxes = ctx;

	return plan_box_cmp(&boxes[((const plan_xfer_t *)a)->box],
			    &boxes[((const plan_xfer_t *)b)->box], PLAN_MAX_DIMS);
}

static int
cmp_xfer_full(const void *a, const void *b, void *ctx)
{
	const plan_xfer_t *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	if (x->from != y->from)
		return x->from < y->from ? -1 : 1;
	if (x->to != y->to)
		return x->to < y->to ? -1 : 1;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return cmp_xfer_box(a, b, ctx);
}

/* Bits of the packed sort key: stage, from, to, tensor. */
typedef struct xbits {
	int s, f, t, x;
} xbits_t;

static inline uint64_t
xfer_key(const plan_xfer_t *x, const xbits_t *b)
{
	return ((((uint64_t)x->stage << b->f | (uint64_t)(uint32_t)x->from) << b->t |
		 (uint64_t)(uint32_t)x->to) << b->x) | x->tensor;
}

static inline uint64_t
low_mask(int bits)
{
	return bits >= 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
}

#define KEY_XFER(kc, x) xfer_key(&(x), &(kc))
RADIX_SORT_DEFINE(radix_xfer, plan_xfer_t, xbits_t, KEY_XFER)

/* The sort of the records themselves, through a second copy. */
static void
sort_records(plan_xfer_t *v, size_t n, const xbits_t *b, int bits)
{
	plan_xfer_t *tmp = xmalloc(n * sizeof(*tmp));

	radix_xfer(v, tmp, n, 0, bits, *b);
	free(tmp);
}

/*
 * The sort with each record packed into one 64-bit value (key << bb |
 * box) in place: value i in bytes [8i, 8i + 8) of the records' storage
 * (written after record i was read, before record j > i is), the next 8n
 * bytes the scratch, then unpacked from the last down (record i covers
 * values 2.5i .. 2.5i + 2, all unpacked by then).  No allocation, and
 * passes move 8 bytes a record instead of 20.
 */
static void
sort_packed(plan_xfer_t *v, size_t n, const xbits_t *b, int bits, int bb)
{
	uint64_t *pk = (uint64_t *)(void *)v;

	for (size_t i = 0; i < n; i++) {
		plan_xfer_t x = v[i];

		pk[i] = xfer_key(&x, b) << bb | x.box;
	}
	radix_u64(pk, pk + n, n, bb, bits, 0);
	for (size_t i = n; i-- > 0;) {
		uint64_t z = pk[i], k = z >> bb;
		plan_xfer_t x;

		x.box = (uint32_t)(z & low_mask(bb));
		x.tensor = (uint32_t)(k & low_mask(b->x));
		k >>= b->x;
		x.to = (int32_t)(uint32_t)(k & low_mask(b->t));
		k >>= b->t;
		x.from = (int32_t)(uint32_t)(k & low_mask(b->f));
		k >>= b->f;
		x.stage = (uint32_t)k;
		v[i] = x;
	}
}

/*
 * Order transfers by (stage, from, to, tensor, box), in place: a stable
 * radix sort on the packed key (each field takes the bits its largest
 * value needs, which fits 64 bits for any realistic plan; else qsort),
 * then runs of equal keys by box.  When the key and the box index fit 64
 * bits together (any realistic plan) the records are sorted packed, in
 * their own storage; else through a second copy.
 */
static void
sort_xfers(plan_xfer_t *v, size_t n, const plan_box_t *boxes)
{
	uint64_t ms = 0, mf = 0, mt = 0, mx = 0, mb = 0;
	xbits_t b;
	int bits, bb;

	for (size_t i = 0; i < n; i++) {
		ms = v[i].stage > ms ? v[i].stage : ms;
		mf = (uint64_t)(uint32_t)v[i].from > mf ? (uint64_t)(uint32_t)v[i].from : mf;
		mt = (uint64_t)(uint32_t)v[i].to > mt ? (uint64_t)(uint32_t)v[i].to : mt;
		mx = v[i].tensor > mx ? v[i].tensor : mx;
		mb = v[i].box > mb ? v[i].box : mb;
	}
	b = (xbits_t){plan_bits_for(ms), plan_bits_for(mf), plan_bits_for(mt),
		      plan_bits_for(mx)};
	bits = b.s + b.f + b.t + b.x;
	bb = plan_bits_for(mb);
	if (n < 2)
		return;
	if (bits > 64 || n > UINT32_MAX) { /* rare: huge ids */
		qsort_r(v, n, sizeof(*v), cmp_xfer_full, (void *)boxes);
		return;
	}
	if (bits + bb <= 64)
		sort_packed(v, n, &b, bits, bb);
	else
		sort_records(v, n, &b, bits);
	for (size_t i = 0; i < n;) {
		uint64_t key = xfer_key(&v[i], &b);
		size_t j = i + 1;

		while (j < n && xfer_key(&v[j], &b) == key)
			j++;
		if (j - i > 1)
			qsort_r(v + i, j - i, sizeof(*v), cmp_xfer_box, (void *)boxes);
		i = j;
	}
}

/* Little-endian framing into a SHA-256 context through a small buffer. */
typedef struct hw {
	sha256_ctx_t c;
	uint8_t buf[4096];
	size_t n;
} hw_t;

static void
hw_bytes(hw_t *w, const void *p, size_t n)
{
	if (w->n + n > sizeof(w->buf)) {
		sha256_update(&w->c, w->buf, w->n);
		w->n = 0;
	}
	if (n > sizeof(w->buf)) {
		sha256_update(&w->c, p, n);
		return;
	}
	memcpy(w->buf + w->n, p, n);
	w->n += n;
}

static void
hw_u64(hw_t *w, uint64_t v)
{
	uint8_t b[8];

	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	hw_bytes(w, b, 8);
}

static void
hw_u32(hw_t *w, uint32_t v)
{
	uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};

	hw_bytes(w, b, 4);
}

/* Room for `n` more bytes in the buffer. */
static inline void
hw_room(hw_t *w, size_t n)
{
	if (w->n + n > sizeof(w->buf)) {
		sha256_update(&w->c, w->buf, w->n);
		w->n = 0;
	}
}

/* LEB128 of a zigzag-coded signed value at o (small deltas cost one
 * byte); returns the end. */
static inline uint8_t *
put_var(uint8_t *o, int64_t v)
{
	uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);

	while (z > 0x7f) {
		*o++ = (uint8_t)(z | 0x80);
		z >>= 7;
	}
	*o++ = (uint8_t)z;
	return o;
}

/* The canonical form's header (see plan.h). */
static void
digest_header(hw_t *w, const plan_t *p)
{
	hw_bytes(w, "refit-plan/1", 12);
	hw_u32(w, (uint32_t)p->opts.mode);
	hw_u64(w, p->opts.chunk_bytes);
	hw_u64(w, p->opts.staging_bytes);
	hw_u32(w, p->nstages);
	hw_u32(w, p->stages_per_round);
	hw_u32(w, p->ntensors);
	for (uint32_t i = 0; i < p->ntensors; i++) {
		size_t n = strlen(p->tensors[i].name);

		hw_u32(w, (uint32_t)n);
		hw_bytes(w, p->tensors[i].name, n);
		hw_u32(w, (uint32_t)p->tensors[i].dtype);
		hw_u32(w, (uint32_t)p->tensors[i].ndim);
	}
	hw_u64(w, p->nxfers);
}

/*
 * The canonical form (see plan.h), hashed as it is written, and the
 * messages the rule makes (p->nmsgs), counted without building them: one
 * pass over the transfers, each box looked up once.
 */
static void
digest_and_count(plan_t *p)
{
	static const plan_box_t zero;
	uint64_t chunk = p->opts.chunk_bytes, fill = 0;
	const plan_box_t *pb = &zero;
	plan_xfer_t prev;
	size_t nmsgs = 0;
	hw_t w;

	sha256_init(&w.c);
	w.n = 0;
	digest_header(&w, p);
	/* transfers: every field as the zigzag-varint delta from the previous
	 * transfer's (a bijective encoding, so the digest still covers all) */
	memset(&prev, 0, sizeof(prev));
	for (size_t i = 0; i < p->nxfers; i++) {
		const plan_xfer_t *x = &p->xfers[i];
		const plan_box_t *xb = plan_xfer_box(p, x);
		const plan_tensor_ref_t *t = &p->tensors[x->tensor];
		uint64_t b = (uint64_t)plan_box_volume(xb, t->ndim) * t->elem;
		uint8_t *o;

		if (i + 16 < p->nxfers) /* boxes are random reads: ask early */
			__builtin_prefetch(plan_xfer_box(p, &p->xfers[i + 16]));
		if (b > chunk) {
			nmsgs += plan_box_chunk_count(xb, t->ndim, t->elem, chunk);
			fill = chunk + 1; /* nothing packs after a chunked transfer */
		} else {
			if (i == 0 || !same_group(&prev, x) || plan_part_align(fill) + b > chunk) {
				nmsgs++;
				fill = 0;
			}
			fill = plan_part_align(fill) + b;
		}
		hw_room(&w, 10 * (4 + 2 * PLAN_MAX_DIMS));
		o = w.buf + w.n;
		o = put_var(o, (int64_t)x->stage - (int64_t)prev.stage);
		o = put_var(o, (int64_t)x->from - prev.from);
		o = put_var(o, (int64_t)x->to - prev.to);
		o = put_var(o, (int64_t)x->tensor - (int64_t)prev.tensor);
		for (int d = 0; d < t->ndim; d++) {
			o = put_var(o, xb->off[d] - pb->off[d]);
			o = put_var(o, xb->size[d] - pb->size[d]);
		}
		w.n = (size_t)(o - w.buf);
		prev = *x;
		pb = xb;
	}
	sha256_update(&w.c, w.buf, w.n);
	sha256_final(&w.c, p->digest);
	sha256_to_hex(p->digest, p->digest_hex);
	p->nmsgs = nmsgs;
}

/* Stages, messages and digest of the sorted transfers. */
static void
finish(plan_t *p, size_t nraw)
{
	p->nxfers = nraw;
	p->nstages = nraw ? p->xfers[nraw - 1].stage + 1 : 0;
	if (p->stages_per_round == 0)
		p->stages_per_round = p->nstages ? p->nstages : 1;
	digest_and_count(p);
}

void
plan_finalize(plan_t *p, plan_xfer_t *raw, size_t nraw, plan_box_t *boxes, size_t nboxes)
{
	sort_xfers(raw, nraw, boxes);
	p->xfers = raw;
	p->boxes = boxes;
	p->nboxes = nboxes;
	finish(p, nraw);
}

void
plan_fini(plan_t *p)
{
	if (p == NULL)
		return;
	for (uint32_t i = 0; i < p->ntensors; i++)
		free(p->tensors[i].name);
	free(p->tensors);
	free(p->xfers);
	free(p->boxes);
	memset(p, 0, sizeof(*p));
}

static refit_status_t
check_opts(const plan_opts_t *o, refit_err_t *err)
{
	if (o->chunk_bytes < 64 || o->chunk_bytes > (1ull << 40))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "chunk bytes %" PRIu64 " out of range (64 B to 1 TiB)",
				     o->chunk_bytes);
	if (o->staging_bytes < o->chunk_bytes)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "staging bytes %" PRIu64 " is smaller than chunk bytes %"
				     PRIu64 ": a message must fit in staging",
				     o->staging_bytes, o->chunk_bytes);
	if (o->mode != PLAN_MODE_RESHARD && o->mode != PLAN_MODE_BROADCAST)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "unknown plan mode %d",
				     (int)o->mode);
	return REFIT_OK;
}

/* Every rank of every layout must be in the topology. */
static refit_status_t
check_ranks(const plan_layout_set_t *s, const char *side, const plan_topo_t *topo,
	    refit_err_t *err)
{
	for (size_t i = 0; i < s->n; i++)
		for (size_t k = 0; k < s->v[i].nshards; k++)
			if (plan_topo_domain(topo, s->v[i].shards[k].rank) < 0)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG,
						     "%s layout \"%s\": rank %d is not in the "
						     "topology (%d ranks)", side, s->v[i].name,
						     s->v[i].shards[k].rank, topo->nranks);
	return REFIT_OK;
}

refit_status_t
plan_build(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	   const plan_topo_t *topo, const plan_opts_t *opts, plan_t *p,
	   refit_err_t *err)
{
	size_t *map = NULL;
	cxvec_t craw = {0};
	boxvec_t boxes = {0};
	uint32_t per_round = 0;
	refit_status_t rc;

	memset(p, 0, sizeof(*p));
	CHECK(check_opts(opts, err));
	CHECK(plan_topo_check(topo, err));
	CHECK(check_ranks(src, "source", topo, err));
	CHECK(check_ranks(dst, "destination", topo, err));
	CHECK(plan_match(src, dst, &map, err));
	for (size_t i = 0; i < src->n; i++) {
		rc = plan_layout_check_coverage(&src->v[i], err);
		if (rc != REFIT_OK) {
			refit_err_prefix(err, "source");
			goto out;
		}
	}
	if (opts->mode == PLAN_MODE_RESHARD)
		rc = plan_reshard(src, dst, map, topo, opts, &craw, &boxes, &per_round, err);
	else
		rc = plan_broadcast(src, dst, map, topo, opts, &craw, &boxes, &per_round, err);
	if (rc != REFIT_OK)
		goto out;
	plan_init_tensors(p, dst, opts);
	p->stages_per_round = per_round;
	plan_finalize(p, craw.v, craw.n, boxes.v, boxes.n);
	craw = (cxvec_t){0}; /* the plan's now */
	boxes = (boxvec_t){0};
out:
	VEC_FREE(&craw);
	VEC_FREE(&boxes);
	free(map);
	return rc;
}
