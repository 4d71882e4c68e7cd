/*
 * box.c - N-D box algebra and the dtype table.
 */
#include <string.h>

#include "common/strbuf.h"
#include "plan/box.h"

static const struct {
	const char *name;
	size_t size;
	const char *alias[3];
} dtypes[PLAN_DT_COUNT] = {
	[PLAN_DT_BOOL] = {"bool", 1, {"torch.bool"}},
	[PLAN_DT_UINT8] = {"uint8", 1, {"u8", "torch.uint8"}},
	[PLAN_DT_INT8] = {"int8", 1, {"i8", "torch.int8"}},
	[PLAN_DT_INT16] = {"int16", 2, {"i16", "torch.int16", "short"}},
	[PLAN_DT_INT32] = {"int32", 4, {"i32", "torch.int32", "int"}},
	[PLAN_DT_INT64] = {"int64", 8, {"i64", "torch.int64", "long"}},
	[PLAN_DT_FP8E4M3] = {"fp8e4m3", 1, {"float8_e4m3fn", "torch.float8_e4m3fn"}},
	[PLAN_DT_FP8E5M2] = {"fp8e5m2", 1, {"float8_e5m2", "torch.float8_e5m2"}},
	[PLAN_DT_FP16] = {"fp16", 2, {"float16", "half", "torch.float16"}},
	[PLAN_DT_BF16] = {"bf16", 2, {"bfloat16", "torch.bfloat16"}},
	[PLAN_DT_FP32] = {"fp32", 4, {"float32", "float", "torch.float32"}},
	[PLAN_DT_FP64] = {"fp64", 8, {"float64", "double", "torch.float64"}},
};

refit_status_t
plan_dtype_parse(const char *s, plan_dtype_t *out)
{
	for (int i = 0; i < PLAN_DT_COUNT; i++) {
		if (strcmp(s, dtypes[i].name) == 0) {
			*out = (plan_dtype_t)i;
			return REFIT_OK;
		}
		for (int j = 0; j < 3 && dtypes[i].alias[j]; j++) {
			if (strcmp(s, dtypes[i].alias[j]) == 0) {
				*out = (plan_dtype_t)i;
				return REFIT_OK;
			}
		}
	}
	return REFIT_ERR_INVALID_ARG;
}

const char *
plan_dtype_name(plan_dtype_t dt)
{
	return (unsigned)dt < PLAN_DT_COUNT ? dtypes[dt].name : "?";
}

size_t
plan_dtype_size(plan_dtype_t dt)
{
	return (unsigned)dt < PLAN_DT_COUNT ? dtypes[dt].size : 0;
}

void
plan_box_full(plan_box_t *b, const int64_t *shape, int ndim)
{
	memset(b, 0, sizeof(*b));
	for (int d = 0; d < ndim; d++)
		b->size[d] = shape[d];
}

bool
plan_box_intersect(const plan_box_t *a, const plan_box_t *b, int ndim,
		   plan_box_t *out)
{
	for (int d = 0; d < ndim; d++) {
		int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
		int64_t ah = a->off[d] + a->size[d], bh = b->off[d] + b->size[d];
		int64_t hi = ah < bh ? ah : bh;

		if (hi <= lo)
			return false;
		out->off[d] = lo;
		out->size[d] = hi - lo;
	}
	for (int d = ndim; d < PLAN_MAX_DIMS; d++)
		out->off[d] = out->size[d] = 0;
	return true;
}

bool
plan_box_contains(const plan_box_t *outer, const plan_box_t *inner, int ndim)
{
	if (plan_box_is_empty(inner, ndim))
		return true;
	for (int d = 0; d < ndim; d++) {
		if (inner->off[d] < outer->off[d] ||
		    inner->off[d] + inner->size[d] > outer->off[d] + outer->size[d])
			return false;
	}
	return true;
}

int
plan_box_subtract(const plan_box_t *a, const plan_box_t *b, int ndim,
		  plan_box_t *out)
{
	plan_box_t rest = *a, in;
	int n = 0;

	if (plan_box_is_empty(a, ndim))
		return 0;
	if (!plan_box_intersect(a, b, ndim, &in)) {
		out[0] = *a;
		return 1;
	}
	/* Peel slabs below and above the intersection, one dim at a time. */
	for (int d = 0; d < ndim; d++) {
		int64_t lo = in.off[d], hi = in.off[d] + in.size[d];
		int64_t rlo = rest.off[d], rhi = rest.off[d] + rest.size[d];

		if (lo > rlo) {
			out[n] = rest;
			out[n].size[d] = lo - rlo;
			n++;
		}
		if (hi < rhi) {
			out[n] = rest;
			out[n].off[d] = hi;
			out[n].size[d] = rhi - hi;
			n++;
		}
		rest.off[d] = lo;
		rest.size[d] = hi - lo;
	}
	return n;
}

void
plan_boxvec_subtract(plan_boxvec_t *rem, const plan_box_t *cut, int ndim,
		     plan_boxvec_t *tmp)
{
	plan_boxvec_t t;

	tmp->n = 0;
	for (size_t j = 0; j < rem->n; j++) {
		plan_box_t sub[PLAN_BOX_SUB_MAX];
		int ns = plan_box_subtract(&rem->v[j], cut, ndim, sub);

		for (int k = 0; k < ns; k++)
			VEC_PUSH(tmp, sub[k]);
	}
	t = *rem;
	*rem = *tmp;
	*tmp = t;
}

int
plan_box_cmp(const plan_box_t *a, const plan_box_t *b, int ndim)
{
	for (int d = 0; d < ndim; d++)
		if (a->off[d] != b->off[d])
			return a->off[d] < b->off[d] ? -1 : 1;
	for (int d = 0; d < ndim; d++)
		if (a->size[d] != b->size[d])
			return a->size[d] < b->size[d] ? -1 : 1;
	return 0;
}

bool
plan_box_in_bounds(const plan_box_t *b, const int64_t *shape, int ndim)
{
	for (int d = 0; d < ndim; d++) {
		if (b->off[d] < 0 || b->size[d] < 0 || b->off[d] > shape[d] ||
		    b->size[d] > shape[d] - b->off[d])
			return false;
	}
	return true;
}

void
plan_box_split(const plan_box_t *b, int dim, int64_t k, plan_box_t *out)
{
	int64_t n = b->size[dim], base = n / k, extra = n % k, pos = b->off[dim];

	for (int64_t i = 0; i < k; i++) {
		int64_t len = base + (i < extra ? 1 : 0);

		out[i] = *b;
		out[i].off[dim] = pos;
		out[i].size[dim] = len;
		pos += len;
	}
}

void
plan_box_str(strbuf_t *sb, const plan_box_t *b, int ndim)
{
	strbuf_puts(sb, "offset ");
	strbuf_i64_list(sb, b->off, ndim);
	strbuf_puts(sb, " size ");
	strbuf_i64_list(sb, b->size, ndim);
}
