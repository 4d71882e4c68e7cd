/*
 * validate.c - the plan validator.
 *
 * Written apart from the planners on purpose: it knows nothing of regions,
 * domains or balancing.  It replays a plan tensor by tensor, stage by
 * stage, tracking what every rank holds (its source boxes, plus what it has
 * received in earlier stages of the same round, plus received data it keeps
 * because it needs it), and proves the properties listed in plan.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "plan/internal.h"

typedef struct held {
	plan_box_t box;
	int64_t stage;     /* -1: a source box */
	uint32_t round;
} held_t;

typedef VEC(held_t) heldvec_t;

typedef struct rstate {
	int32_t rank;
	heldvec_t held;    /* source boxes and everything received */
	boxvec_t need;     /* destination boxes */
} rstate_t;

typedef struct relay {
	int32_t rank;
	uint32_t round;
	uint64_t bytes;
} relay_t;

typedef struct vctx {
	const plan_t *p;
	const plan_layout_t *src, *dst;
	uint32_t tensor;
	int ndim;
	uint64_t elem;
	rstate_t *rs;
	size_t nrs;
	VEC(relay_t) relays;
	plan_check_t *out;
	refit_err_t *err;
} vctx_t;

static refit_status_t
fail(vctx_t *v, const char *what, const plan_xfer_t *x, const int64_t *elem)
{
	strbuf_t sb;
	refit_status_t rc;

	strbuf_init(&sb);
	if (x != NULL) {
		strbuf_printf(&sb, "stage %u, rank %d -> rank %d, ", x->stage, x->from, x->to);
	}
	strbuf_printf(&sb, "tensor \"%s\"", v->dst->name);
	if (x != NULL) {
		strbuf_puts(&sb, " box ");
		plan_box_str(&sb, plan_xfer_box(v->p, x), v->ndim);
	}
	if (elem != NULL) {
		strbuf_puts(&sb, ", element ");
		strbuf_i64_list(&sb, elem, v->ndim);
	}
	rc = refit_err_set(v->err, REFIT_ERR_INTERNAL, "plan invalid: %s: %s", sb.s, what);
	strbuf_fini(&sb);
	return rc;
}

static int
cmp_rs(const void *a, const void *b)
{
	int32_t x = ((const rstate_t *)a)->rank, y = ((const rstate_t *)b)->rank;

	return (x > y) - (x < y);
}

static rstate_t *
find_rs(vctx_t *v, int32_t rank)
{
	rstate_t key = {.rank = rank};

	return xbsearch(&key, v->rs, v->nrs, sizeof(*v->rs), cmp_rs);
}

/* One state per rank that appears in the layouts or the transfers. */
static void
build_states(vctx_t *v, const size_t *xi, size_t nx)
{
	i32vec_t ranks = {0};
	size_t k = 0;

	for (size_t i = 0; i < v->src->nshards; i++)
		VEC_PUSH(&ranks, v->src->shards[i].rank);
	for (size_t i = 0; i < v->dst->nshards; i++)
		VEC_PUSH(&ranks, v->dst->shards[i].rank);
	for (size_t i = 0; i < nx; i++) {
		VEC_PUSH(&ranks, v->p->xfers[xi[i]].from);
		VEC_PUSH(&ranks, v->p->xfers[xi[i]].to);
	}
	xqsort(ranks.v, ranks.n, sizeof(int32_t), cmp_i32v);
	v->rs = xcalloc(ranks.n ? ranks.n : 1, sizeof(*v->rs));
	for (size_t i = 0; i < ranks.n; i++)
		if (k == 0 || v->rs[k - 1].rank != ranks.v[i])
			v->rs[k++].rank = ranks.v[i];
	v->nrs = k;
	VEC_FREE(&ranks);
	for (size_t i = 0; i < v->src->nshards; i++) {
		held_t h = {v->src->shards[i].box, -1, 0};

		if (!plan_box_is_empty(&h.box, v->ndim))
			VEC_PUSH(&find_rs(v, v->src->shards[i].rank)->held, h);
	}
	for (size_t i = 0; i < v->dst->nshards; i++)
		if (!plan_box_is_empty(&v->dst->shards[i].box, v->ndim))
			VEC_PUSH(&find_rs(v, v->dst->shards[i].rank)->need,
				 v->dst->shards[i].box);
}

static void
free_states(vctx_t *v)
{
	for (size_t i = 0; i < v->nrs; i++) {
		VEC_FREE(&v->rs[i].held);
		VEC_FREE(&v->rs[i].need);
	}
	free(v->rs);
	v->rs = NULL;
	v->nrs = 0;
}

static bool
inside_need(const rstate_t *r, const plan_box_t *b, int ndim)
{
	for (size_t i = 0; i < r->need.n; i++)
		if (plan_box_contains(&r->need.v[i], b, ndim))
			return true;
	return false;
}

/* May r send from h at stage s of round `round`? */
static bool
usable(const rstate_t *r, const held_t *h, uint32_t s, uint32_t round, int ndim)
{
	if (h->stage < 0)
		return true;
	if ((uint32_t)h->stage >= s)
		return false;
	return h->round == round || inside_need(r, &h->box, ndim);
}

/*
 * true when boxes[0..n) cover b; otherwise one uncovered element is written
 * to missing[].
 */
static bool
covers(const plan_box_t *b, const plan_box_t *boxes, size_t n, int ndim,
       int64_t *missing)
{
	boxvec_t rem = {0}, tmp = {0};
	bool ok;

	for (size_t i = 0; i < n; i++)
		if (plan_box_contains(&boxes[i], b, ndim))
			return true;
	VEC_PUSH(&rem, *b);
	for (size_t i = 0; i < n && rem.n; i++)
		plan_boxvec_subtract(&rem, &boxes[i], ndim, &tmp);
	ok = rem.n == 0;
	if (!ok)
		memcpy(missing, rem.v[0].off, sizeof(rem.v[0].off));
	VEC_FREE(&rem);
	VEC_FREE(&tmp);
	return ok;
}

/* Does r hold box b at the start of stage s?  *missing set otherwise. */
static bool
holds(const vctx_t *v, const rstate_t *r, const plan_box_t *b, uint32_t s,
      int64_t *missing)
{
	uint32_t round = s / v->p->stages_per_round;
	boxvec_t ok = {0};
	bool res;

	for (size_t i = 0; i < r->held.n; i++)
		if (usable(r, &r->held.v[i], s, round, v->ndim))
			VEC_PUSH(&ok, r->held.v[i].box);
	res = covers(b, ok.v, ok.n, v->ndim, missing);
	VEC_FREE(&ok);
	return res;
}

static int
cmp_held(const void *a, const void *b)
{
	return plan_box_cmp(&((const held_t *)a)->box, &((const held_t *)b)->box,
			    PLAN_MAX_DIMS);
}

/* The union of r's needs as disjoint boxes. */
static void
disjoint_needs(const rstate_t *r, int ndim, boxvec_t *out)
{
	boxvec_t tmp = {0};

	for (size_t i = 0; i < r->need.n; i++) {
		boxvec_t add = {0};

		VEC_PUSH(&add, r->need.v[i]);
		for (size_t k = 0; k < out->n && add.n; k++)
			plan_boxvec_subtract(&add, &out->v[k], ndim, &tmp);
		for (size_t j = 0; j < add.n; j++)
			VEC_PUSH(out, add.v[j]);
		VEC_FREE(&add);
	}
	VEC_FREE(&tmp);
}

static int64_t
overlap(const plan_box_t *a, const plan_box_t *b, int ndim)
{
	plan_box_t in;

	if (ndim == 0)
		return 1;
	return plan_box_intersect(a, b, ndim, &in) ? plan_box_volume(&in, ndim) : 0;
}

/* Received boxes of r must be pairwise disjoint. */
static refit_status_t
check_no_duplicates(vctx_t *v, const rstate_t *r, const heldvec_t *got)
{
	for (size_t i = 0; i < got->n; i++) {
		int64_t end = v->ndim ? got->v[i].box.off[0] + got->v[i].box.size[0] : 1;

		for (size_t j = i + 1; j < got->n; j++) {
			plan_box_t in;
			char what[96];

			if (v->ndim && got->v[j].box.off[0] >= end)
				break;
			if (v->ndim && !plan_box_intersect(&got->v[i].box, &got->v[j].box,
							   v->ndim, &in))
				continue;
			snprintf(what, sizeof(what), "rank %d receives it twice "
				 "(stages %" PRId64 " and %" PRId64 ")", r->rank,
				 got->v[i].stage, got->v[j].stage);
			return fail(v, what, NULL, v->ndim ? in.off : NULL);
		}
	}
	return REFIT_OK;
}

/*
 * Every element r needs arrives exactly once: received boxes are pairwise
 * disjoint and cover the union of its needs.  What it receives beyond its
 * needs is relayed data, counted per round for the staging check.
 */
static refit_status_t
check_arrivals(vctx_t *v, rstate_t *r)
{
	heldvec_t got = {0};
	boxvec_t need = {0}, gotb = {0};
	refit_status_t rc;

	for (size_t i = 0; i < r->held.n; i++)
		if (r->held.v[i].stage >= 0)
			VEC_PUSH(&got, r->held.v[i]);
	xqsort(got.v, got.n, sizeof(*got.v), cmp_held);
	rc = check_no_duplicates(v, r, &got);
	disjoint_needs(r, v->ndim, &need);
	for (size_t i = 0; i < got.n; i++)
		VEC_PUSH(&gotb, got.v[i].box);
	for (size_t n = 0; n < need.n && rc == REFIT_OK; n++) {
		int64_t missing[PLAN_MAX_DIMS] = {0};
		int64_t want = plan_box_volume(&need.v[n], v->ndim), covered = 0;
		char what[64];

		for (size_t i = 0; i < got.n; i++)
			covered += overlap(&got.v[i].box, &need.v[n], v->ndim);
		v->out->needed_bytes += (uint64_t)want * v->elem;
		v->out->delivered_bytes += (uint64_t)covered * v->elem;
		if (covered == want)
			continue;
		covers(&need.v[n], gotb.v, gotb.n, v->ndim, missing);
		snprintf(what, sizeof(what), "rank %d never receives it", r->rank);
		rc = fail(v, what, NULL, missing);
	}
	for (size_t i = 0; i < got.n && rc == REFIT_OK; i++) {
		int64_t vol = plan_box_volume(&got.v[i].box, v->ndim), inn = 0;

		for (size_t n = 0; n < need.n; n++)
			inn += overlap(&got.v[i].box, &need.v[n], v->ndim);
		if (vol > inn) {
			relay_t rl = {r->rank, got.v[i].round, (uint64_t)(vol - inn) * v->elem};

			VEC_PUSH(&v->relays, rl);
			v->out->relay_bytes += rl.bytes;
		}
	}
	VEC_FREE(&got);
	VEC_FREE(&need);
	VEC_FREE(&gotb);
	return rc;
}

/*
 * Messages, made by the rule: each within chunk_bytes and of one (stage,
 * from, to); together they carry every transfer exactly (volume of the
 * parts of each transfer, each part inside its transfer's box).
 */
static refit_status_t
check_msgs(const plan_t *p, refit_err_t *err)
{
	plan_msgs_t it;
	plan_msg_t m;
	int64_t *carried = xcalloc(p->nxfers ? p->nxfers : 1, sizeof(*carried));
	refit_status_t rc = REFIT_OK;
	size_t n = 0;

	plan_msgs_init(&it, p, 0, p->nxfers);
	while (rc == REFIT_OK && plan_msgs_next(&it, &m)) {
		uint64_t end = 0;

		n++;
		if (m.bytes > p->opts.chunk_bytes)
			rc = refit_err_set(err, REFIT_ERR_INTERNAL,
					   "plan invalid: a message (stage %u, rank %d -> %d) "
					   "carries %" PRIu64 " bytes, over the chunk size %" PRIu64,
					   m.stage, m.from, m.to, m.bytes, p->opts.chunk_bytes);
		for (uint32_t k = 0; k < m.nparts && rc == REFIT_OK; k++) {
			const plan_part_t *pt = &m.parts[k];
			const plan_xfer_t *x = &p->xfers[pt->xfer];
			int nd = p->tensors[x->tensor].ndim;

			if (x->stage != m.stage || x->from != m.from || x->to != m.to ||
			    !plan_box_contains(plan_xfer_box(p, x), &pt->box, nd))
				rc = refit_err_set(err, REFIT_ERR_INTERNAL,
						   "plan invalid: a message part does not match "
						   "transfer %u", pt->xfer);
			else if (pt->off % PLAN_PART_ALIGN || pt->off < end ||
				 pt->off - end >= PLAN_PART_ALIGN)
				rc = refit_err_set(err, REFIT_ERR_INTERNAL,
						   "plan invalid: part %u of a message (transfer "
						   "%u) starts at byte %" PRIu64 " after %" PRIu64
						   " bytes: not the next multiple of %d", k, pt->xfer,
						   pt->off, end, PLAN_PART_ALIGN);
			carried[pt->xfer] += plan_box_volume(&pt->box, nd);
			end = pt->off + pt->bytes;
		}
		if (rc == REFIT_OK && end != m.bytes)
			rc = refit_err_set(err, REFIT_ERR_INTERNAL,
					   "plan invalid: a message says %" PRIu64 " bytes, its "
					   "parts end at %" PRIu64, m.bytes, end);
	}
	for (size_t i = 0; i < p->nxfers && rc == REFIT_OK; i++)
		if (carried[i] != plan_box_volume(plan_xfer_box(p, &p->xfers[i]),
						  p->tensors[p->xfers[i].tensor].ndim))
			rc = refit_err_set(err, REFIT_ERR_INTERNAL,
					   "plan invalid: transfer %zu is not carried exactly "
					   "once by its messages", i);
	if (rc == REFIT_OK && n != p->nmsgs)
		rc = refit_err_set(err, REFIT_ERR_INTERNAL,
				   "plan invalid: it counts %zu messages, the rule makes %zu",
				   p->nmsgs, n);
	plan_msgs_fini(&it);
	free(carried);
	return rc;
}

static int
cmp_stage_idx(const void *a, const void *b, void *ctx)
{
	const plan_t *p = ctx;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	if (p->xfers[x].stage != p->xfers[y].stage)
		return p->xfers[x].stage < p->xfers[y].stage ? -1 : 1;
	return (x > y) - (x < y);
}

/* Replay the transfers of one tensor (xi, in stage order). */
static refit_status_t
replay_tensor(vctx_t *v, const size_t *xi, size_t nx)
{
	refit_status_t rc = REFIT_OK;
	int64_t missing[PLAN_MAX_DIMS];

	build_states(v, xi, nx);
	for (size_t i = 0; i < nx && rc == REFIT_OK;) {
		uint32_t stage = v->p->xfers[xi[i]].stage;
		size_t j = i;

		/* all sends of the stage are checked before any receive lands */
		for (; j < nx && v->p->xfers[xi[j]].stage == stage; j++) {
			const plan_xfer_t *x = &v->p->xfers[xi[j]];
			const plan_box_t *xb = plan_xfer_box(v->p, x);

			if (!plan_box_in_bounds(xb, v->dst->shape, v->ndim) ||
			    plan_box_is_empty(xb, v->ndim)) {
				rc = fail(v, "box is empty or out of bounds", x, NULL);
				break;
			}
			if (!holds(v, find_rs(v, x->from), xb, stage, missing)) {
				rc = fail(v, "the sender does not hold it at the start of "
					  "the stage", x, missing);
				break;
			}
		}
		for (size_t k = i; k < j && rc == REFIT_OK; k++) {
			const plan_xfer_t *x = &v->p->xfers[xi[k]];
			held_t h = {*plan_xfer_box(v->p, x), x->stage,
				    x->stage / v->p->stages_per_round};

			VEC_PUSH(&find_rs(v, x->to)->held, h);
		}
		i = j;
	}
	for (size_t r = 0; r < v->nrs && rc == REFIT_OK; r++)
		rc = check_arrivals(v, &v->rs[r]);
	free_states(v);
	return rc;
}

static int
cmp_relay(const void *a, const void *b)
{
	const relay_t *x = a, *y = b;

	if (x->rank != y->rank)
		return (x->rank > y->rank) - (x->rank < y->rank);
	return (x->round > y->round) - (x->round < y->round);
}

static refit_status_t
check_staging(vctx_t *v)
{
	xqsort(v->relays.v, v->relays.n, sizeof(relay_t), cmp_relay);
	for (size_t i = 0; i < v->relays.n;) {
		size_t j = i;
		uint64_t sum = 0;

		for (; j < v->relays.n && v->relays.v[j].rank == v->relays.v[i].rank &&
		       v->relays.v[j].round == v->relays.v[i].round; j++)
			sum += v->relays.v[j].bytes;
		if (sum > v->out->max_staging) {
			v->out->max_staging = sum;
			v->out->max_staging_rank = v->relays.v[i].rank;
		}
		if (sum > v->p->opts.staging_bytes)
			return refit_err_set(v->err, REFIT_ERR_INTERNAL,
					     "plan invalid: rank %d holds %" PRIu64 " relayed "
					     "bytes in round %u, over the staging bound %" PRIu64,
					     v->relays.v[i].rank, sum, v->relays.v[i].round,
					     v->p->opts.staging_bytes);
		i = j;
	}
	return REFIT_OK;
}

refit_status_t
plan_validate(const plan_t *p, const plan_layout_set_t *src,
	      const plan_layout_set_t *dst, plan_check_t *out, refit_err_t *err)
{
	vctx_t v = {.p = p, .out = out, .err = err};
	size_t *map = NULL, *order = NULL, *start = NULL;
	refit_status_t rc;

	memset(out, 0, sizeof(*out));
	out->max_staging_rank = -1;
	CHECK(plan_match(src, dst, &map, err));
	if (p->ntensors != dst->n) {
		free(map);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "plan has %u tensors, the destination %zu",
				     p->ntensors, dst->n);
	}
	for (uint32_t t = 0; t < p->ntensors; t++) {
		if (strcmp(p->tensors[t].name, dst->v[t].name) != 0) {
			free(map);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "plan tensor %u is \"%s\", the destination's "
					     "\"%s\"", t, p->tensors[t].name, dst->v[t].name);
		}
	}
	/* every index in range before anything follows one */
	for (size_t i = 0; i < p->nxfers; i++)
		if (p->xfers[i].tensor >= p->ntensors || p->xfers[i].box >= p->nboxes) {
			free(map);
			return refit_err_set(err, REFIT_ERR_INTERNAL, "plan invalid: transfer "
					     "%zu names tensor %u and box %u (%u tensors, %zu "
					     "boxes)", i, p->xfers[i].tensor, p->xfers[i].box,
					     p->ntensors, p->nboxes);
		}
	rc = check_msgs(p, err);
	if (rc != REFIT_OK || p->stages_per_round == 0) {
		free(map);
		return rc != REFIT_OK ? rc :
		       refit_err_set(err, REFIT_ERR_INTERNAL, "plan invalid: zero "
				     "stages per round");
	}
	/* bucket transfer indices by tensor, each bucket in stage order */
	start = xcalloc((size_t)p->ntensors + 1, sizeof(*start));
	order = xmalloc((p->nxfers ? p->nxfers : 1) * sizeof(*order));
	for (size_t i = 0; i < p->nxfers; i++) {
		start[p->xfers[i].tensor + 1]++;
	}
	for (uint32_t t = 0; t < p->ntensors; t++)
		start[t + 1] += start[t];
	{
		size_t *fill = xmalloc(((size_t)p->ntensors + 1) * sizeof(*fill));

		memcpy(fill, start, ((size_t)p->ntensors + 1) * sizeof(*fill));
		for (size_t i = 0; i < p->nxfers; i++)
			order[fill[p->xfers[i].tensor]++] = i;
		free(fill);
	}
	for (uint32_t t = 0; t < p->ntensors && rc == REFIT_OK; t++) {
		size_t *xi = order + start[t], nx = start[t + 1] - start[t];

		if (nx > 1)
			qsort_r(xi, nx, sizeof(*xi), cmp_stage_idx, (void *)p);
		v.tensor = t;
		v.dst = &dst->v[t];
		v.src = &src->v[map[t]];
		v.ndim = v.dst->ndim;
		v.elem = plan_dtype_size(v.dst->dtype);
		rc = replay_tensor(&v, xi, nx);
	}
	if (rc == REFIT_OK)
		rc = check_staging(&v);
	VEC_FREE(&v.relays);
	free(order);
	free(start);
	free(map);
	return rc;
}
