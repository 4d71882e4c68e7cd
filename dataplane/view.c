/*
 * view.c - views and strided box copies (see view.h).
 */
#include <string.h>

#include "dataplane/view.h"

void
dp_view_contiguous(dp_view_t *v, void *base, int ndim, const int64_t *shape, uint32_t elem)
{
	int64_t s = 1;

	memset(v, 0, sizeof(*v));
	v->base = base;
	v->ndim = ndim;
	v->elem = elem;
	for (int d = ndim - 1; d >= 0; d--) {
		v->shape[d] = shape[d];
		v->stride[d] = s;
		s *= shape[d];
	}
}

uint64_t
dp_view_bytes(int ndim, const int64_t *shape, uint32_t elem)
{
	uint64_t n = elem;

	for (int d = 0; d < ndim; d++)
		n *= (uint64_t)shape[d];
	return n;
}

refit_status_t
dp_local_shape(const plan_layout_t *l, int32_t rank, int32_t piece, int64_t *shape,
	       refit_err_t *err)
{
	bool found = false;

	for (int d = 0; d < l->ndim; d++)
		shape[d] = 0;
	for (size_t i = 0; i < l->nshards; i++) {
		const plan_shard_t *s = &l->shards[i];

		if (s->rank != rank || s->piece != piece)
			continue;
		found = true;
		for (int d = 0; d < l->ndim; d++)
			if (s->local_off[d] + s->box.size[d] > shape[d])
				shape[d] = s->local_off[d] + s->box.size[d];
	}
	if (!found)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "tensor \"%s\": rank %d holds no "
				     "piece %d", l->name, rank, piece);
	return REFIT_OK;
}

void
dp_shard_of_box(plan_shard_t *sh, const plan_box_t *box)
{
	memset(sh, 0, sizeof(*sh));
	sh->box = *box;
}

uint8_t *
dp_view_at(const dp_view_t *v, const plan_shard_t *sh, const int64_t *g)
{
	int64_t off = 0;

	for (int d = 0; d < v->ndim; d++)
		off += (sh->local_off[d] + g[d] - sh->box.off[d]) * v->stride[d];
	return v->base + off * (int64_t)v->elem;
}

void
dp_copy_box(const dp_view_t *sv, const plan_shard_t *ss, const dp_view_t *dv,
	    const plan_shard_t *ds, const plan_box_t *box)
{
	int nd = sv->ndim, inner = nd - 1;
	int64_t g[PLAN_MAX_DIMS], run;
	size_t e = sv->elem;

	if (plan_box_is_empty(box, nd))
		return;
	if (nd == 0) {
		memcpy(dv->base, sv->base, e);
		return;
	}
	/* fold trailing dims while the box covers them whole in both views and
	 * both are contiguous there: one memcpy then moves several rows */
	run = box->size[inner];
	if (sv->stride[inner] == 1 && dv->stride[inner] == 1) {
		while (inner > 0 && box->size[inner] == sv->shape[inner] &&
		       box->size[inner] == dv->shape[inner] &&
		       sv->stride[inner - 1] == sv->stride[inner] * sv->shape[inner] &&
		       dv->stride[inner - 1] == dv->stride[inner] * dv->shape[inner]) {
			inner--;
			run *= box->size[inner];
		}
	}
	for (int d = 0; d < nd; d++)
		g[d] = box->off[d];
	for (;;) {
		uint8_t *s = dp_view_at(sv, ss, g), *t = dp_view_at(dv, ds, g);

		if (sv->stride[nd - 1] == 1 && dv->stride[nd - 1] == 1) {
			memcpy(t, s, (size_t)run * e);
		} else {
			for (int64_t k = 0; k < box->size[nd - 1]; k++)
				memcpy(t + k * dv->stride[nd - 1] * (int64_t)e,
				       s + k * sv->stride[nd - 1] * (int64_t)e, e);
		}
		/* next run: odometer over dims before `inner` */
		int d = inner - 1;

		while (d >= 0 && ++g[d] == box->off[d] + box->size[d]) {
			g[d] = box->off[d];
			d--;
		}
		if (d < 0)
			break;
	}
}
