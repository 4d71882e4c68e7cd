/*
 * layout.c - placements, DTensor resolution, explicit layouts, coverage,
 * layout sets and source/destination matching.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/layout.h"

/* ---- placements ------------------------------------------------------ */

static const char *
skip_ws(const char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	return p;
}

/* Parse "[key=]int" from p up to ',' or ')'; key copied into key[]. */
static int
parse_arg(const char **pp, char *key, size_t keyn, int64_t *val)
{
	const char *p = skip_ws(*pp), *eq;
	char *end;
	size_t klen;

	key[0] = '\0';
	eq = p;
	while (isalpha((unsigned char)*eq) || *eq == '_')
		eq++;
	if (eq != p && *skip_ws(eq) == '=') {
		klen = (size_t)(eq - p);
		if (klen >= keyn)
			return -1;
		memcpy(key, p, klen);
		key[klen] = '\0';
		p = skip_ws(skip_ws(eq) + 1);
	}
	errno = 0;
	*val = strtoll(p, &end, 10);
	if (end == p || errno != 0)
		return -1;
	*pp = skip_ws(end);
	return 0;
}

refit_status_t
plan_placement_parse(const char *s, plan_placement_t *out, const char *what,
		     refit_err_t *err)
{
	const char *p = skip_ws(s), *open = strchr(p, '(');
	char name[32], key[32];
	int64_t args[2] = {0, 0};
	int nargs = 0, have_dim = 0, have_sf = 0;
	size_t nlen;

	memset(out, 0, sizeof(*out));
	nlen = open ? (size_t)(open - p) : strlen(p);
	while (nlen > 0 && isspace((unsigned char)p[nlen - 1]))
		nlen--;
	if (nlen == 0 || nlen >= sizeof(name))
		goto bad;
	memcpy(name, p, nlen);
	name[nlen] = '\0';
	if (strcmp(name, "Partial") == 0 || strcmp(name, "P") == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s \"%s\": Partial placements hold unreduced values; "
				     "reduce them before a refit", what, s);
	if (open != NULL) {
		const char *q = skip_ws(open + 1);

		while (*q != ')') {
			int64_t v;

			if (nargs == 2 || parse_arg(&q, key, sizeof(key), &v) < 0)
				goto bad;
			if (key[0] == '\0' || strcmp(key, "dim") == 0) {
				if (key[0] == '\0' && nargs == 1 && !have_dim)
					goto bad;
				if (key[0] == '\0' && nargs == 1) {
					args[1] = v;
					have_sf = 1;
				} else {
					if (have_dim)
						goto bad;
					args[0] = v;
					have_dim = 1;
				}
			} else if (strcmp(key, "split_factor") == 0 ||
				   strcmp(key, "sf") == 0) {
				if (have_sf)
					goto bad;
				args[1] = v;
				have_sf = 1;
			} else {
				goto bad;
			}
			nargs++;
			if (*q == ',')
				q = skip_ws(q + 1);
			else if (*q != ')')
				goto bad;
		}
		if (*skip_ws(q + 1) != '\0')
			goto bad;
	}
	if (strcmp(name, "Replicate") == 0 || strcmp(name, "R") == 0) {
		if ((open == NULL) != (name[0] == 'R' && name[1] == '\0') || nargs)
			goto bad;
		out->kind = PLAN_PL_REPLICATE;
		return REFIT_OK;
	}
	if (strcmp(name, "Shard") == 0 || strcmp(name, "S") == 0) {
		if (open == NULL || !have_dim || have_sf)
			goto bad;
		out->kind = PLAN_PL_SHARD;
		out->dim = (int)args[0];
		if (args[0] != out->dim)
			goto bad;
		return REFIT_OK;
	}
	if (strcmp(name, "_StridedShard") == 0 || strcmp(name, "_S") == 0) {
		if (open == NULL || !have_dim || !have_sf)
			goto bad;
		if (args[1] < 1 || args[1] > PLAN_MAX_RANK_BOXES)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "%s \"%s\": split_factor must be from 1 to %d, "
					     "got %" PRId64, what, s, PLAN_MAX_RANK_BOXES, args[1]);
		out->kind = PLAN_PL_STRIDED_SHARD;
		out->dim = (int)args[0];
		out->split_factor = args[1];
		if (args[0] != out->dim)
			goto bad;
		return REFIT_OK;
	}
bad:
	return refit_err_set(err, REFIT_ERR_INVALID_ARG,
			     "%s \"%s\": unknown placement (expected Replicate(), "
			     "Shard(d) or _StridedShard(dim=d, split_factor=k))",
			     what, s);
}

void
plan_placement_format(const plan_placement_t *p, char *buf, size_t n)
{
	switch (p->kind) {
	case PLAN_PL_REPLICATE:
		snprintf(buf, n, "Replicate()");
		break;
	case PLAN_PL_SHARD:
		snprintf(buf, n, "Shard(%d)", p->dim);
		break;
	case PLAN_PL_STRIDED_SHARD:
		snprintf(buf, n, "_StridedShard(dim=%d, split_factor=%" PRId64 ")",
			 p->dim, p->split_factor);
		break;
	}
}

/* ---- DTensor resolution ---------------------------------------------- */

/* A run of global indices [start, start+len) of one tensor dim. */
typedef struct ival {
	int64_t start, len;
} ival_t;

typedef VEC(ival_t) ivals_t;
typedef VEC(plan_shard_t) shardvec_t;

static int64_t
ivals_len(const ivals_t *v)
{
	int64_t n = 0;

	for (size_t i = 0; i < v->n; i++)
		n += v->v[i].len;
	return n;
}

/*
 * Append to out the global runs of local positions [a, b) of the local
 * extent described by in.  Adjacent runs are merged.
 */
static void
ivals_slice(const ivals_t *in, int64_t a, int64_t b, ivals_t *out)
{
	int64_t pos = 0;

	for (size_t i = 0; i < in->n && pos < b; i++) {
		int64_t lo = a > pos ? a : pos;
		int64_t hi = b < pos + in->v[i].len ? b : pos + in->v[i].len;

		if (hi > lo) {
			int64_t g = in->v[i].start + (lo - pos);
			ival_t *last = out->n ? &out->v[out->n - 1] : NULL;

			if (last && last->len > 0 && last->start + last->len == g) {
				last->len += hi - lo;
			} else {
				if (last && last->len == 0)
					out->n--;
				VEC_PUSH(out, ((ival_t){g, hi - lo}));
			}
		}
		pos += in->v[i].len;
	}
}

/* Global position of local position a (for placing empty shards). */
static int64_t
ivals_pos(const ivals_t *in, int64_t a)
{
	int64_t pos = 0;

	for (size_t i = 0; i < in->n; i++) {
		if (a < pos + in->v[i].len)
			return in->v[i].start + (a - pos);
		pos += in->v[i].len;
	}
	return in->n ? in->v[in->n - 1].start + in->v[in->n - 1].len : 0;
}

static void
chunk_of(int64_t E, int64_t n, int64_t c, int64_t *a, int64_t *b)
{
	int64_t chunk = (E + n - 1) / n;

	*a = c * chunk < E ? c * chunk : E;
	*b = *a + chunk < E ? *a + chunk : E;
}

/* Apply one Shard / _StridedShard along a dim for mesh coordinate c of n.
 * Fails when the rank's runs along the dim would exceed the box bound. */
static bool
apply_split(const plan_placement_t *p, int64_t n, int64_t c, ivals_t *cur)
{
	ivals_t next = {0};
	int64_t E = ivals_len(cur), a, b, first_empty = -1;

	if (p->kind == PLAN_PL_SHARD) {
		chunk_of(E, n, c, &a, &b);
		ivals_slice(cur, a, b, &next);
		first_empty = a;
	} else {
		int64_t k = p->split_factor;

		for (int64_t j = 0; j < k; j++) {
			int64_t sa, sb, ta, tb;

			chunk_of(E, k, j, &sa, &sb);
			if (sa == E && j > 0)
				break; /* the rest are empty */
			if (next.n > PLAN_MAX_RANK_BOXES) {
				VEC_FREE(&next);
				return false;
			}
			chunk_of(sb - sa, n, c, &ta, &tb);
			ivals_slice(cur, sa + ta, sa + tb, &next);
			if (first_empty < 0)
				first_empty = sa + ta;
		}
	}
	if (next.n == 0)
		VEC_PUSH(&next, ((ival_t){ivals_pos(cur, first_empty), 0}));
	VEC_FREE(cur);
	*cur = next;
	return true;
}

static int
norm_dim(int dim, int ndim)
{
	return dim < 0 ? dim + ndim : dim;
}

/* Cartesian product of the per-dim runs of one rank into shards. */
static refit_status_t
emit_rank_boxes(plan_layout_t *l, int32_t rank, ivals_t *runs,
		shardvec_t *out, refit_err_t *err)
{
	size_t count = 1, idx[PLAN_MAX_DIMS] = {0};

	for (int d = 0; d < l->ndim; d++)
		count *= runs[d].n;
	if (count > PLAN_MAX_RANK_BOXES)
		return refit_err_set(err, REFIT_ERR_LIMIT,
				     "layout \"%s\": rank %d would hold %zu separate boxes "
				     "(limit %d); the placements fragment the tensor too much",
				     l->name, rank, count, PLAN_MAX_RANK_BOXES);
	for (size_t k = 0; k < count; k++) {
		plan_shard_t sh;

		memset(&sh, 0, sizeof(sh));
		sh.rank = rank;
		for (int d = 0; d < l->ndim; d++) {
			int64_t loc = 0;

			for (size_t i = 0; i < idx[d]; i++)
				loc += runs[d].v[i].len;
			sh.box.off[d] = runs[d].v[idx[d]].start;
			sh.box.size[d] = runs[d].v[idx[d]].len;
			sh.local_off[d] = loc;
		}
		VEC_PUSH(out, sh);
		for (int d = l->ndim - 1; d >= 0; d--) {
			if (++idx[d] < runs[d].n)
				break;
			idx[d] = 0;
		}
	}
	return REFIT_OK;
}

static refit_status_t
resolve_dtensor(plan_layout_t *l, refit_err_t *err)
{
	shardvec_t out = {0};
	size_t nranks = 1;
	refit_status_t rc = REFIT_OK;

	for (int i = 0; i < l->mesh_ndim; i++)
		nranks *= (size_t)l->mesh_shape[i];
	for (size_t r = 0; r < nranks && rc == REFIT_OK; r++) {
		ivals_t runs[PLAN_MAX_DIMS];
		int64_t coord[PLAN_MAX_DIMS];
		size_t rem = r;

		for (int i = l->mesh_ndim - 1; i >= 0; i--) {
			coord[i] = (int64_t)(rem % (size_t)l->mesh_shape[i]);
			rem /= (size_t)l->mesh_shape[i];
		}
		for (int d = 0; d < l->ndim; d++) {
			memset(&runs[d], 0, sizeof(runs[d]));
			VEC_PUSH(&runs[d], ((ival_t){0, l->shape[d]}));
		}
		for (int i = 0; i < l->mesh_ndim && rc == REFIT_OK; i++) {
			const plan_placement_t *p = &l->placements[i];

			if (p->kind != PLAN_PL_REPLICATE &&
			    !apply_split(p, l->mesh_shape[i], coord[i],
					 &runs[norm_dim(p->dim, l->ndim)]))
				rc = refit_err_set(err, REFIT_ERR_LIMIT,
						   "layout \"%s\": rank %d would hold more than "
						   "%d separate runs of dim %d; the placements "
						   "fragment the tensor too much", l->name,
						   l->mesh[r], PLAN_MAX_RANK_BOXES,
						   norm_dim(p->dim, l->ndim));
		}
		if (rc == REFIT_OK)
			rc = emit_rank_boxes(l, l->mesh[r], runs, &out, err);
		for (int d = 0; d < l->ndim; d++)
			VEC_FREE(&runs[d]);
	}
	if (rc != REFIT_OK) {
		VEC_FREE(&out);
		return rc;
	}
	l->shards = out.v;
	l->nshards = out.n;
	return REFIT_OK;
}

/* Name, dtype and shape of a layout being built (checked already). */
static void
set_head(plan_layout_t *l, const char *name, plan_dtype_t dtype, int ndim,
	 const int64_t *shape)
{
	l->name = xstrdup(name);
	l->dtype = dtype;
	l->ndim = ndim;
	for (int d = 0; d < ndim; d++) /* shape may be NULL for a scalar */
		l->shape[d] = shape[d];
}

static refit_status_t
check_common(const char *name, int ndim, const int64_t *shape, refit_err_t *err)
{
	if (name == NULL || name[0] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "layout: tensor name is empty");
	if (ndim < 0 || ndim > PLAN_MAX_DIMS)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "layout \"%s\": shape has %d dims (at most %d supported)",
				     name, ndim, PLAN_MAX_DIMS);
	int64_t n = 1;

	for (int d = 0; d < ndim; d++) {
		if (shape[d] < 0 || shape[d] > ((int64_t)1 << 48))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": shape[%d] = %" PRId64 " is out of range",
					     name, d, shape[d]);
		/* bound the element count so sizes in bytes never overflow */
		if (shape[d] != 0 && n > PLAN_MAX_NUMEL / shape[d])
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": shape has more than 2^56 elements",
					     name);
		n *= shape[d];
	}
	return REFIT_OK;
}

static int
cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

static refit_status_t
check_mesh(const char *name, int ndim, int mesh_ndim, const int64_t *mesh_shape,
	   const int32_t *mesh, const plan_placement_t *pl, refit_err_t *err)
{
	size_t n = 1;
	int32_t *sorted;
	refit_status_t rc = REFIT_OK;

	if (mesh_ndim < 1 || mesh_ndim > PLAN_MAX_DIMS)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "layout \"%s\": mesh has %d dims (1 to %d supported)",
				     name, mesh_ndim, PLAN_MAX_DIMS);
	for (int i = 0; i < mesh_ndim; i++) {
		if (mesh_shape[i] < 1 || n * (size_t)mesh_shape[i] > PLAN_MAX_RANK_ID)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": mesh dim %d has size %" PRId64,
					     name, i, mesh_shape[i]);
		n *= (size_t)mesh_shape[i];
	}
	for (int i = 0; i < mesh_ndim; i++) {
		int d = norm_dim(pl[i].dim, ndim);

		if (pl[i].kind == PLAN_PL_STRIDED_SHARD &&
		    (pl[i].split_factor < 1 || pl[i].split_factor > PLAN_MAX_RANK_BOXES))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": placement %d: split_factor %" PRId64
					     " is not from 1 to %d", name, i,
					     pl[i].split_factor, PLAN_MAX_RANK_BOXES);

		if (pl[i].kind != PLAN_PL_REPLICATE && (d < 0 || d >= ndim)) {
			char buf[64];

			plan_placement_format(&pl[i], buf, sizeof(buf));
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": placement %d \"%s\" names dim %d "
					     "but the tensor has %d dims",
					     name, i, buf, pl[i].dim, ndim);
		}
	}
	for (size_t r = 0; r < n; r++)
		if (mesh[r] < 0 || mesh[r] >= PLAN_MAX_RANK_ID)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": mesh rank %d is out of range "
					     "(0 to %d)", name, mesh[r], PLAN_MAX_RANK_ID - 1);
	sorted = xmalloc(n * sizeof(*sorted));
	memcpy(sorted, mesh, n * sizeof(*sorted));
	xqsort(sorted, n, sizeof(*sorted), cmp_i32);
	for (size_t r = 1; r < n; r++) {
		if (sorted[r] == sorted[r - 1]) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
					   "layout \"%s\": mesh: duplicate rank %d",
					   name, sorted[r]);
			break;
		}
	}
	free(sorted);
	return rc;
}

refit_status_t
plan_layout_init_dtensor(plan_layout_t *l, const char *name, plan_dtype_t dtype,
			 int ndim, const int64_t *shape, int mesh_ndim,
			 const int64_t *mesh_shape, const int32_t *mesh,
			 const plan_placement_t *placements, refit_err_t *err)
{
	size_t n = 1;
	refit_status_t rc;

	memset(l, 0, sizeof(*l));
	CHECK(check_common(name, ndim, shape, err));
	CHECK(check_mesh(name, ndim, mesh_ndim, mesh_shape, mesh, placements, err));
	for (int i = 0; i < mesh_ndim; i++)
		n *= (size_t)mesh_shape[i];
	set_head(l, name, dtype, ndim, shape);
	l->is_dtensor = true;
	l->mesh_ndim = mesh_ndim;
	memcpy(l->mesh_shape, mesh_shape, (size_t)mesh_ndim * sizeof(*mesh_shape));
	memcpy(l->placements, placements, (size_t)mesh_ndim * sizeof(*placements));
	l->mesh = xmalloc(n * sizeof(*mesh));
	memcpy(l->mesh, mesh, n * sizeof(*mesh));
	rc = resolve_dtensor(l, err);
	if (rc != REFIT_OK) {
		plan_layout_fini(l);
		return rc;
	}
	return REFIT_OK;
}

/* (rank, position) of a shard, to number a rank's pieces in order */
typedef struct rank_pos {
	int32_t rank;
	size_t pos;
} rank_pos_t;

static int
rank_pos_cmp(const void *x, const void *y)
{
	const rank_pos_t *a = x, *b = y;

	if (a->rank != b->rank)
		return a->rank < b->rank ? -1 : 1;
	return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* piece = the shard's index among the shards of its rank, in order */
static void
number_pieces(plan_shard_t *s, size_t n)
{
	rank_pos_t *rp = xcalloc(n ? n : 1, sizeof(*rp));

	for (size_t i = 0; i < n; i++)
		rp[i] = (rank_pos_t){s[i].rank, i};
	xqsort(rp, n, sizeof(*rp), rank_pos_cmp);
	for (size_t i = 0; i < n; i++)
		s[rp[i].pos].piece = i > 0 && rp[i - 1].rank == rp[i].rank ?
				     s[rp[i - 1].pos].piece + 1 : 0;
	free(rp);
}

refit_status_t
plan_layout_init_explicit(plan_layout_t *l, const char *name, plan_dtype_t dtype,
			  int ndim, const int64_t *shape,
			  const plan_shard_t *shards, size_t nshards,
			  refit_err_t *err)
{
	memset(l, 0, sizeof(*l));
	CHECK(check_common(name, ndim, shape, err));
	for (size_t i = 0; i < nshards; i++) {
		const plan_shard_t *s = &shards[i];

		if (s->rank < 0 || s->rank >= PLAN_MAX_RANK_ID)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": shards[%zu]: rank %d is out of range",
					     name, i, s->rank);
		if (!plan_box_in_bounds(&s->box, shape, ndim)) {
			int d = 0;

			/* no off + size: both may be near INT64_MAX */
			while (d < ndim - 1 && s->box.off[d] >= 0 && s->box.size[d] >= 0 &&
			       s->box.off[d] <= shape[d] &&
			       s->box.size[d] <= shape[d] - s->box.off[d])
				d++;
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": shards[%zu] (rank %d): box is out of "
					     "bounds in dim %d: offset %" PRId64 " size %" PRId64
					     " but the dim has %" PRId64 " elements",
					     name, i, s->rank, d, s->box.off[d], s->box.size[d],
					     shape[d]);
		}
	}
	set_head(l, name, dtype, ndim, shape);
	l->nshards = nshards;
	l->shards = xcalloc(nshards ? nshards : 1, sizeof(*l->shards));
	for (size_t i = 0; i < nshards; i++) {
		l->shards[i].rank = shards[i].rank;
		l->shards[i].box = shards[i].box;
	}
	number_pieces(l->shards, nshards);
	return REFIT_OK;
}

void
plan_layout_fini(plan_layout_t *l)
{
	if (l == NULL)
		return;
	free(l->name);
	free(l->mesh);
	free(l->shards);
	if (l->conv)
		free(l->conv->scale_tensor);
	free(l->conv);
	memset(l, 0, sizeof(*l));
}

plan_convert_t *
plan_convert_dup(const plan_convert_t *c)
{
	plan_convert_t *d;

	if (c == NULL)
		return NULL;
	d = xmalloc(sizeof(*d));
	*d = *c;
	d->scale_tensor = c->scale_tensor ? xstrdup(c->scale_tensor) : NULL;
	return d;
}

int64_t
plan_layout_numel(const plan_layout_t *l)
{
	int64_t n = 1;

	for (int d = 0; d < l->ndim; d++)
		n *= l->shape[d];
	return n;
}

uint64_t
plan_layout_bytes(const plan_layout_t *l)
{
	return (uint64_t)plan_layout_numel(l) * plan_dtype_size(l->dtype);
}
