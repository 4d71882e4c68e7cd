/*
 * gpu_staging.c - the nccl grouping of a plan's messages and the GPU
 * staging it takes per rank (see gpu_staging.h).  The grouping is the one
 * daemon/node/slice_group.c runs; the estimate replays the allocations of
 * slice_group.c (group buffers) and dataplane/exec.c (relay staging).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/gpu_staging.h"

#define ROUND(n) (((n) ? (n) : 1) + PLAN_GPU_ALIGN - 1) / PLAN_GPU_ALIGN * PLAN_GPU_ALIGN

int32_t
plan_max_rank(const plan_t *p)
{
	int32_t m = 0;

	for (size_t i = 0; i < p->nxfers; i++) {
		m = p->xfers[i].from > m ? p->xfers[i].from : m;
		m = p->xfers[i].to > m ? p->xfers[i].to : m;
	}
	return m;
}

void
plan_buckets_init(plan_buckets_t *b, const plan_t *p)
{
	memset(b, 0, sizeof(*b));
	b->W = p->opts.staging_bytes;
	b->nr = (size_t)plan_max_rank(p) + 1;
	b->cur = xcalloc(b->nr, sizeof(*b->cur));
	b->fill = xcalloc(b->nr, sizeof(*b->fill));
	b->stage = UINT32_MAX;
	plan_msgs_init(&b->it, p, 0, p->nxfers);
}

bool
plan_buckets_next(plan_buckets_t *b, plan_msg_t *m, uint64_t *bucket)
{
	uint64_t *cur = b->cur, *fill = b->fill, k;

	if (!plan_msgs_next(&b->it, m))
		return false;
	if (m->stage != b->stage) {   /* buckets restart per stage */
		memset(cur, 0, b->nr * sizeof(*cur));
		memset(fill, 0, b->nr * sizeof(*fill));
		b->stage = m->stage;
	}
	k = cur[m->from] > cur[m->to] ? cur[m->from] : cur[m->to];
	if (cur[m->from] < k)
		cur[m->from] = k, fill[m->from] = 0;
	if (cur[m->to] < k)
		cur[m->to] = k, fill[m->to] = 0;
	if ((fill[m->from] || fill[m->to]) &&
	    (fill[m->from] + m->bytes > b->W || fill[m->to] + m->bytes > b->W)) {
		k++;
		cur[m->from] = cur[m->to] = k;
		fill[m->from] = fill[m->to] = 0;
	}
	fill[m->from] += m->bytes;
	if (m->to != m->from)
		fill[m->to] += m->bytes;
	*bucket = k;
	return true;
}

void
plan_buckets_fini(plan_buckets_t *b)
{
	plan_msgs_fini(&b->it);
	free(b->cur);
	free(b->fill);
	memset(b, 0, sizeof(*b));
}

/* One message of the node's groups: its group buffers' and relays' bytes. */
typedef struct emsg {
	uint32_t stage;
	uint64_t bucket, order;
	int32_t from, to;
	uint64_t len, relay;   /* rounded: each side's buffer; the receiver's relays */
	uint64_t xs, xr;       /* the caller's extra at the sender and the receiver */
} emsg_t;

static int
cmp_emsg(const void *a, const void *b)
{
	const emsg_t *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	if (x->bucket != y->bucket)
		return x->bucket < y->bucket ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* (rank, tensor) keys of the ranks that pass a tensor on (a transfer of a
 * stage after the first from them), sorted: dataplane/exec.c's forwards(). */
typedef struct fwd {
	uint64_t *k;
	size_t n;
} fwd_t;

static void
fwd_init(fwd_t *f, const plan_t *p)
{
	f->k = xmalloc((p->nxfers ? p->nxfers : 1) * sizeof(*f->k));
	f->n = 0;
	for (size_t i = 0; i < p->nxfers; i++)
		if (p->xfers[i].stage > 0)
			f->k[f->n++] = (uint64_t)(uint32_t)p->xfers[i].from << 32 |
				       p->xfers[i].tensor;
	xqsort(f->k, f->n, sizeof(*f->k), cmp_u64);
}

static bool
forwards(const fwd_t *f, int32_t rank, uint32_t t)
{
	uint64_t k = (uint64_t)(uint32_t)rank << 32 | t;

	return xbsearch(&k, f->k, f->n, sizeof(k), cmp_u64) != NULL;
}

/* The relay staging m's receiver keeps (dp_unpack_msg's stage_part): each
 * part it passes on whose box its own shards do not cover. */
static uint64_t
relay_of(const plan_t *p, const fwd_t *f, const plan_layout_set_t *dst, const plan_msg_t *m)
{
	uint64_t sum = 0;

	for (uint32_t k = 0; dst && k < m->nparts; k++) {
		const plan_part_t *pt = &m->parts[k];
		uint32_t t = p->xfers[pt->xfer].tensor;
		const plan_layout_t *d = &dst->v[t];
		plan_boxvec_t rem = {0}, tmp = {0};

		if (!forwards(f, m->to, t))
			continue;
		VEC_PUSH(&rem, pt->box);
		for (size_t i = 0; i < d->nshards && rem.n; i++)
			if (d->shards[i].rank == m->to)
				plan_boxvec_subtract(&rem, &d->shards[i].box, d->ndim, &tmp);
		if (rem.n)
			sum += ROUND(pt->bytes);
		VEC_FREE(&rem);
		VEC_FREE(&tmp);
	}
	return sum;
}

/* The node's messages (those touching a wanted rank; all when want is
 * NULL) in the order the node runs them; *groups counts every rank's. */
static emsg_t *
collect(const plan_t *p, uint64_t trail, const plan_gpu_extra_t *ex, const bool *want,
	size_t *n, uint64_t *groups)
{
	plan_buckets_t b;
	plan_msg_t m;
	uint64_t k, order = 0, *last = NULL;
	VEC(emsg_t) v = {0};
	fwd_t f;

	fwd_init(&f, p);
	plan_buckets_init(&b, p);
	last = xcalloc(b.nr * 2, sizeof(*last));   /* per rank: the last (stage+1, bucket) */
	while (plan_buckets_next(&b, &m, &k)) {
		int32_t ends[2] = {m.from, m.to};

		for (int e = 0; e < (m.from == m.to ? 1 : 2); e++) {
			if (last[2 * ends[e]] != m.stage + 1u || last[2 * ends[e] + 1] != k)
				(*groups)++;
			last[2 * ends[e]] = m.stage + 1u;
			last[2 * ends[e] + 1] = k;
		}
		if (want == NULL || want[m.from] || want[m.to]) {
			bool x = ex->msg_extra && m.from != m.to;

			VEC_PUSH(&v, ((emsg_t){m.stage, k, order, m.from, m.to,
					       ROUND(m.bytes + trail),
					       want == NULL || want[m.to] ?
					       relay_of(p, &f, ex->dst, &m) : 0,
					       x ? ex->msg_extra(ex->ctx, m.bytes, true) : 0,
					       x ? ex->msg_extra(ex->ctx, m.bytes, false) : 0}));
		}
		order++;
	}
	plan_buckets_fini(&b);
	free(last);
	free(f.k);
	xqsort(v.v, v.n, sizeof(*v.v), cmp_emsg);
	*n = v.n;
	return v.v;
}

/* A group's end on rank r: what it holds now is a candidate peak. */
static void
peak_at(plan_gpu_staging_t *out, const uint64_t *fixed, size_t nfixed, int32_t r,
	uint64_t grp, uint64_t rel)
{
	uint64_t f = (size_t)r < nfixed ? fixed[r] : 0;

	if (grp + rel + f > out->peak || (out->rank < 0 && grp + rel + f > 0)) {
		out->peak = grp + rel + f;
		out->rank = r;
		out->group_peak = grp;
		out->relay_peak = rel;
		out->fixed = f;
	}
}

static void
staging(const plan_t *p, uint64_t trail, const plan_gpu_extra_t *ex, const bool *want,
	plan_gpu_staging_t *out)
{
	plan_gpu_extra_t none = {0};
	size_t nr = (size_t)plan_max_rank(p) + 1, n = 0;
	uint64_t *grp = xcalloc(nr, sizeof(*grp)), *rel = xcalloc(nr, sizeof(*rel)), groups = 0;
	uint32_t round = 0, spr = p->stages_per_round ? p->stages_per_round : 1;
	emsg_t *v;

	ex = ex ? ex : &none;
	memset(out, 0, sizeof(*out));
	out->rank = -1;
	v = collect(p, trail, ex, want, &n, &groups);
	for (size_t i = 0; i < n;) {
		size_t j = i;

		if (v[i].stage / spr > round) {   /* relays of earlier rounds freed */
			memset(rel, 0, nr * sizeof(*rel));
			round = v[i].stage / spr;
		}
		for (; j < n && v[j].stage == v[i].stage && v[j].bucket == v[i].bucket; j++) {
			grp[v[j].from] += v[j].len + v[j].xs;
			if (v[j].to != v[j].from)
				grp[v[j].to] += v[j].len + v[j].xr;
			rel[v[j].to] += v[j].relay;
		}
		for (; i < j; i++) {   /* each rank of the group, at its end */
			int32_t ends[2] = {v[i].from, v[i].to};

			for (int e = 0; e < 2; e++) {
				int32_t r = ends[e];

				if (grp[r] == 0 && rel[r] == 0)
					continue;
				if (want == NULL || want[r])
					peak_at(out, ex->fixed, ex->nfixed, r, grp[r], rel[r]);
				grp[r] = 0;
			}
		}
	}
	for (size_t r = 0; r < nr && r < ex->nfixed; r++)   /* a rank with no group */
		if ((want == NULL || want[r]) && ex->fixed[r] > out->peak)
			peak_at(out, ex->fixed, ex->nfixed, (int32_t)r, 0, 0);
	if (out->rank < 0)
		out->rank = 0;
	out->groups = groups;
	free(v);
	free(grp);
	free(rel);
}

void
plan_gpu_staging(const plan_t *p, uint64_t trail, plan_gpu_staging_t *out)
{
	staging(p, trail, NULL, NULL, out);
}

void
plan_gpu_staging_ranks(const plan_t *p, uint64_t trail, const plan_gpu_extra_t *ex,
		       const int32_t *ranks, size_t n, plan_gpu_staging_t *out)
{
	size_t nr = (size_t)plan_max_rank(p) + 1;
	bool *want = xcalloc(nr, sizeof(*want));

	for (size_t i = 0; i < n; i++)
		if (ranks[i] >= 0 && (size_t)ranks[i] < nr)
			want[ranks[i]] = true;
	staging(p, trail, ex, want, out);
	free(want);
}
