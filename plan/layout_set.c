/*
 * layout_set.c - source coverage, tensor matching and layout sets.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strbuf.h"
#include "plan/layout.h"

/* bound on the pieces the coverage check may track at once */
#define COVER_MAX_PIECES (1 << 18)

typedef plan_boxvec_t boxvec_t;

/* Boxes keep unused dims zeroed, so comparing all dims orders them by ndim. */
static int
cmp_box_all(const void *a, const void *b)
{
	return plan_box_cmp(a, b, PLAN_MAX_DIMS);
}

/* Distinct non-empty boxes of l, sorted. */
static void
distinct_boxes(const plan_layout_t *l, boxvec_t *out)
{
	size_t k = 0;

	for (size_t i = 0; i < l->nshards; i++)
		if (!plan_box_is_empty(&l->shards[i].box, l->ndim))
			VEC_PUSH(out, l->shards[i].box);
	xqsort(out->v, out->n, sizeof(*out->v), cmp_box_all);
	for (size_t i = 0; i < out->n; i++)
		if (k == 0 || !plan_box_equal(&out->v[k - 1], &out->v[i], l->ndim))
			out->v[k++] = out->v[i];
	out->n = k;
}

/* boxes sorted by off[0]: only neighbours that start before one ends can
 * overlap it */
static bool
pairwise_disjoint(const boxvec_t *b, int ndim)
{
	for (size_t i = 0; i < b->n; i++) {
		int64_t end = ndim ? b->v[i].off[0] + b->v[i].size[0] : 1;

		for (size_t j = i + 1; j < b->n && (ndim == 0 || b->v[j].off[0] < end); j++)
			if (plan_box_overlaps(&b->v[i], &b->v[j], ndim))
				return false;
	}
	return true;
}

refit_status_t
plan_layout_check_coverage(const plan_layout_t *l, refit_err_t *err)
{
	boxvec_t boxes = {0}, rem = {0}, tmp = {0};
	int64_t total = 0, missing = 0, numel = plan_layout_numel(l);
	refit_status_t rc = REFIT_OK;
	plan_box_t full;
	strbuf_t sb;

	if (numel == 0)
		return REFIT_OK;
	distinct_boxes(l, &boxes);
	for (size_t i = 0; i < boxes.n; i++)
		total += plan_box_volume(&boxes.v[i], l->ndim);
	if (total == numel && pairwise_disjoint(&boxes, l->ndim))
		goto out;
	plan_box_full(&full, l->shape, l->ndim);
	VEC_PUSH(&rem, full);
	for (size_t i = 0; i < boxes.n && rem.n > 0; i++) {
		plan_boxvec_subtract(&rem, &boxes.v[i], l->ndim, &tmp);
		if (rem.n > COVER_MAX_PIECES) {
			rc = refit_err_set(err, REFIT_ERR_LIMIT,
					   "layout \"%s\": shards too fragmented to check "
					   "coverage", l->name);
			goto out;
		}
	}
	if (rem.n == 0)
		goto out;
	for (size_t j = 0; j < rem.n; j++)
		missing += plan_box_volume(&rem.v[j], l->ndim);
	strbuf_init(&sb);
	strbuf_i64_list(&sb, rem.v[0].off, l->ndim);
	rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
			   "layout \"%s\": the shards leave %" PRId64 " of %" PRId64
			   " elements uncovered, e.g. element %s",
			   l->name, missing, numel, sb.s);
	strbuf_fini(&sb);
out:
	VEC_FREE(&boxes);
	VEC_FREE(&rem);
	VEC_FREE(&tmp);
	return rc;
}

/* (rank, box) of a shard, sorted by rank then off[0] */
static int
cmp_rank_box(const void *x, const void *y)
{
	const plan_shard_t *a = x, *b = y;

	if (a->rank != b->rank)
		return a->rank < b->rank ? -1 : 1;
	return a->box.off[0] < b->box.off[0] ? -1 : a->box.off[0] > b->box.off[0];
}

refit_status_t
plan_layout_check_rank_disjoint(const plan_layout_t *l, refit_err_t *err)
{
	plan_shard_t *s;
	refit_status_t rc = REFIT_OK;

	if (l->is_dtensor || l->nshards < 2 || l->ndim == 0)
		return REFIT_OK;
	s = xmalloc(l->nshards * sizeof(*s));
	memcpy(s, l->shards, l->nshards * sizeof(*s));
	xqsort(s, l->nshards, sizeof(*s), cmp_rank_box);
	for (size_t i = 0; i < l->nshards && rc == REFIT_OK; i++) {
		int64_t end = s[i].box.off[0] + s[i].box.size[0];

		for (size_t j = i + 1; j < l->nshards && s[j].rank == s[i].rank &&
		     s[j].box.off[0] < end; j++) {
			strbuf_t a, b;

			if (!plan_box_overlaps(&s[i].box, &s[j].box, l->ndim))
				continue;
			strbuf_init(&a);
			strbuf_init(&b);
			strbuf_i64_list(&a, s[i].box.off, l->ndim);
			strbuf_i64_list(&b, s[j].box.off, l->ndim);
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": rank %d holds "
					   "the box at %s and the box at %s, which overlap (a rank "
					   "holds each element once)", l->name, s[i].rank, a.s, b.s);
			strbuf_fini(&a);
			strbuf_fini(&b);
			break;
		}
	}
	free(s);
	return rc;
}

static void
shape_str(strbuf_t *sb, const plan_layout_t *l)
{
	strbuf_i64_list(sb, l->shape, l->ndim);
}

refit_status_t
plan_layout_check_same_tensor(const plan_layout_t *src, const plan_layout_t *dst,
			      refit_err_t *err)
{
	bool same_shape = src->ndim == dst->ndim;
	strbuf_t a, b;
	refit_status_t rc = REFIT_OK;

	if (strcmp(src->name, dst->name) != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "tensor names differ: source \"%s\", destination \"%s\"",
				     src->name, dst->name);
	if (src->dtype != dst->dtype)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "tensor \"%s\": dtype differs: source %s, destination %s",
				     src->name, plan_dtype_name(src->dtype),
				     plan_dtype_name(dst->dtype));
	for (int d = 0; same_shape && d < src->ndim; d++)
		same_shape = src->shape[d] == dst->shape[d];
	if (same_shape)
		return REFIT_OK;
	strbuf_init(&a);
	strbuf_init(&b);
	shape_str(&a, src);
	shape_str(&b, dst);
	rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
			   "tensor \"%s\": shape differs: source %s, destination %s",
			   src->name, a.s, b.s);
	strbuf_fini(&a);
	strbuf_fini(&b);
	return rc;
}

void
plan_layout_set_init(plan_layout_set_t *s)
{
	memset(s, 0, sizeof(*s));
}

void
plan_layout_set_fini(plan_layout_set_t *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->n; i++)
		plan_layout_fini(&s->v[i]);
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* name-sorted index of a set, for O(log n) lookups */
typedef struct name_idx {
	const char *name;
	size_t i;
} name_idx_t;

static int
cmp_name(const void *a, const void *b)
{
	return strcmp(((const name_idx_t *)a)->name, ((const name_idx_t *)b)->name);
}

static name_idx_t *
index_names(const plan_layout_set_t *s)
{
	name_idx_t *ix = xmalloc((s->n ? s->n : 1) * sizeof(*ix));

	for (size_t i = 0; i < s->n; i++)
		ix[i] = (name_idx_t){s->v[i].name, i};
	xqsort(ix, s->n, sizeof(*ix), cmp_name);
	return ix;
}

void
plan_layout_set_add(plan_layout_set_t *s, plan_layout_t *l)
{
	VEC_PUSH(s, *l);
	memset(l, 0, sizeof(*l));
}

void
plan_layout_set_copy(plan_layout_set_t *dst, const plan_layout_set_t *src)
{
	plan_layout_set_init(dst);
	for (size_t i = 0; i < src->n; i++) {
		const plan_layout_t *s = &src->v[i];
		plan_layout_t l = *s;
		size_t nmesh = 1;

		l.name = xstrdup(s->name);
		if (s->mesh != NULL) {
			for (int k = 0; k < s->mesh_ndim; k++)
				nmesh *= (size_t)s->mesh_shape[k];
			l.mesh = xmalloc(nmesh * sizeof(*l.mesh));
			memcpy(l.mesh, s->mesh, nmesh * sizeof(*l.mesh));
		}
		l.shards = xmalloc((s->nshards ? s->nshards : 1) * sizeof(*l.shards));
		memcpy(l.shards, s->shards, s->nshards * sizeof(*l.shards));
		l.conv = plan_convert_dup(s->conv);
		plan_layout_set_add(dst, &l);
	}
}

refit_status_t
plan_layout_set_finish(plan_layout_set_t *s, refit_status_t rc, refit_err_t *err)
{
	if (rc == REFIT_OK)
		rc = plan_layout_set_check_unique(s, err);
	if (rc != REFIT_OK)
		plan_layout_set_fini(s);
	return rc;
}

refit_status_t
plan_layout_set_check_unique(const plan_layout_set_t *s, refit_err_t *err)
{
	name_idx_t *ix = index_names(s);
	refit_status_t rc = REFIT_OK;

	for (size_t i = 1; i < s->n; i++) {
		if (strcmp(ix[i].name, ix[i - 1].name) == 0) {
			/* bad input, not "already registered" (clients read
			 * ALREADY_EXISTS that way) */
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
					   "layout \"%s\": tensor listed twice", ix[i].name);
			break;
		}
	}
	free(ix);
	return rc;
}

/* Append one mismatch to the list, keeping the message bounded. */
static void
note_problem(strbuf_t *sb, int *count, const char *what)
{
	if (*count < 4)
		strbuf_printf(sb, "%s%s", *count ? "; " : "", what);
	(*count)++;
}

/* Note a tensor that one side has and the other lacks. */
static void
note_missing(strbuf_t *sb, int *count, const char *name, const char *in, const char *not_in)
{
	strbuf_t t;

	strbuf_init(&t);
	strbuf_printf(&t, "tensor \"%s\" is in the %s but not in the %s", name, in, not_in);
	note_problem(sb, count, t.s);
	strbuf_fini(&t);
}

refit_status_t
plan_match(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	   size_t **map, refit_err_t *err)
{
	name_idx_t *ix = index_names(src);
	bool *used = xcalloc(src->n ? src->n : 1, sizeof(*used));
	size_t *m = xmalloc((dst->n ? dst->n : 1) * sizeof(*m));
	strbuf_t sb;
	int problems = 0;
	refit_status_t rc = REFIT_OK;

	*map = NULL;
	if (plan_layout_set_check_unique(src, err) != REFIT_OK ||
	    plan_layout_set_check_unique(dst, err) != REFIT_OK) {
		free(ix);
		free(used);
		free(m);
		return REFIT_ERR_INVALID_ARG;
	}
	strbuf_init(&sb);
	for (size_t i = 0; i < dst->n; i++) {
		name_idx_t key = {dst->v[i].name, 0}, *hit;
		refit_err_t e;

		hit = xbsearch(&key, ix, src->n, sizeof(*ix), cmp_name);
		if (hit == NULL) {
			note_missing(&sb, &problems, dst->v[i].name, "destination", "source");
			continue;
		}
		used[hit->i] = true;
		m[i] = hit->i;
		refit_err_clear(&e);
		if (plan_layout_check_same_tensor(&src->v[hit->i], &dst->v[i], &e) != REFIT_OK)
			note_problem(&sb, &problems, e.msg);
	}
	for (size_t i = 0; i < src->n; i++) {
		if (!used[i])
			note_missing(&sb, &problems, src->v[i].name, "source", "destination");
	}
	if (problems > 0) {
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
				   "source and destination differ in %d tensor%s: %s%s",
				   problems, problems == 1 ? "" : "s", sb.s,
				   problems > 4 ? "; ..." : "");
		free(m);
		m = NULL;
	}
	strbuf_fini(&sb);
	free(ix);
	free(used);
	*map = m;
	return rc;
}

static int
cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

/* Replicas live on ranks of their own: memory is found by rank. */
static refit_status_t
check_disjoint(const plan_layout_set_t *const *sets, size_t nsets, refit_err_t *err)
{
	VEC(int32_t) *rk = xcalloc(nsets, sizeof(*rk));
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < nsets; i++) {
		size_t w = 0;

		for (size_t t = 0; t < sets[i]->n; t++)
			for (size_t k = 0; k < sets[i]->v[t].nshards; k++)
				VEC_PUSH(&rk[i], sets[i]->v[t].shards[k].rank);
		xqsort(rk[i].v, rk[i].n, sizeof(int32_t), cmp_i32);
		for (size_t k = 0; k < rk[i].n; k++)
			if (w == 0 || rk[i].v[w - 1] != rk[i].v[k])
				rk[i].v[w++] = rk[i].v[k];
		rk[i].n = w;
	}
	for (size_t i = 0; i < nsets && rc == REFIT_OK; i++)
		for (size_t j = 0; j < i && rc == REFIT_OK; j++) {
			size_t a = 0, b = 0;

			while (a < rk[i].n && b < rk[j].n && rc == REFIT_OK) {
				if (rk[i].v[a] == rk[j].v[b])
					rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
							   "instances %zu and %zu both use rank "
							   "%d: replicas need ranks of their own",
							   j, i, rk[i].v[a]);
				else if (rk[i].v[a] < rk[j].v[b])
					a++;
				else
					b++;
			}
		}
	for (size_t i = 0; i < nsets; i++)
		VEC_FREE(&rk[i]);
	free(rk);
	return rc;
}

refit_status_t
plan_layout_compose(const plan_layout_set_t *const *sets, size_t nsets,
		    plan_layout_set_t *out, refit_err_t *err)
{
	plan_layout_set_init(out);
	if (nsets == 0)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "no inference instance");
	for (size_t i = 1; i < nsets; i++) {
		if (sets[i]->n != sets[0]->n)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "instances %zu and 0 "
					     "have %zu and %zu tensors", i, sets[i]->n,
					     sets[0]->n);
		for (size_t t = 0; t < sets[0]->n; t++)
			CHECK(plan_layout_check_same_tensor(&sets[0]->v[t], &sets[i]->v[t],
							    err));
	}
	CHECK(check_disjoint(sets, nsets, err));
	for (size_t t = 0; t < sets[0]->n; t++) {
		const plan_layout_t *l0 = &sets[0]->v[t];
		VEC(plan_shard_t) sh = {0};
		plan_layout_t l;
		refit_status_t rc;

		for (size_t i = 0; i < nsets; i++)
			for (size_t k = 0; k < sets[i]->v[t].nshards; k++)
				VEC_PUSH(&sh, sets[i]->v[t].shards[k]);
		rc = plan_layout_init_explicit(&l, l0->name, l0->dtype, l0->ndim, l0->shape,
					       sh.v, sh.n, err);
		if (rc == REFIT_OK) { /* keep each instance's pieces and local offsets */
			memcpy(l.shards, sh.v, sh.n * sizeof(*sh.v));
			l.conv = plan_convert_dup(l0->conv);
		}
		VEC_FREE(&sh);
		if (rc != REFIT_OK) {
			plan_layout_set_fini(out);
			return rc;
		}
		plan_layout_set_add(out, &l);
	}
	return REFIT_OK;
}
