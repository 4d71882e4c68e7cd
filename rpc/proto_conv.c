/*
 * proto_conv.c - see proto_conv.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strbuf.h"
#include "common/utf8.h"
#include "common/wire.h"
#include "rpc/proto_conv.h"
#include "plan/convert.h"

static const char *const scale_names[] = {"none", "tensor", "block", "mx"};

/* The conversion of a destination tensor, checked (docs/conversion.md). */
static refit_status_t
conv_from_proto(const Refit__V1__Conversion *p, plan_layout_t *l, refit_err_t *err)
{
	plan_convert_t c;
	int k;

	memset(&c, 0, sizeof(c));
	if (plan_dtype_parse(p->from ? p->from : "", &c.from) != REFIT_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": convert: "
				     "unknown dtype \"%s\" in from", l->name, p->from ? p->from : "");
	for (k = 0; k < 4 && strcmp(p->scale ? p->scale : "", scale_names[k]) != 0; k++)
		;
	if (k == 4)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": convert: scale "
				     "\"%s\" (known: none, tensor, block, mx)", l->name,
				     p->scale ? p->scale : "");
	c.scale = (plan_scale_t)k;
	if (p->n_block > PLAN_MAX_DIMS ||
	    (c.scale == PLAN_SCALE_BLOCK || c.scale == PLAN_SCALE_MX) != (p->n_block > 0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": convert: %zu "
				     "block entries for scale \"%s\"", l->name, p->n_block,
				     scale_names[k]);
	c.nblock = (int)p->n_block;
	for (size_t i = 0; i < p->n_block; i++) {
		if (p->block[i] < 1 || p->block[i] > ((int64_t)1 << 31))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": convert: "
					     "block[%zu] = %" PRId64 " is out of range", l->name, i,
					     p->block[i]);
		c.block[i] = p->block[i];
	}
	if (c.scale != PLAN_SCALE_NONE)
		c.scale_tensor = p->scale_tensor && p->scale_tensor[0] ? p->scale_tensor : NULL;
	l->conv = plan_convert_dup(&c);
	return plan_convert_check_spec(l, err);
}

static refit_status_t one_layout_base(const Refit__V1__TensorLayout *t, size_t idx,
				      plan_layout_t *l, refit_err_t *err);

static refit_status_t
one_layout(const Refit__V1__TensorLayout *t, size_t idx, plan_layout_t *l,
	   refit_err_t *err)
{
	refit_status_t rc = one_layout_base(t, idx, l, err);

	if (rc == REFIT_OK && t->convert != NULL) {
		rc = conv_from_proto(t->convert, l, err);
		if (rc != REFIT_OK)
			plan_layout_fini(l);
	}
	return rc;
}

static refit_status_t
one_layout_base(const Refit__V1__TensorLayout *t, size_t idx, plan_layout_t *l,
		refit_err_t *err)
{
	plan_placement_t pl[PLAN_MAX_DIMS];
	plan_dtype_t dt;
	const char *name = t->name && t->name[0] ? t->name : NULL;
	char what[192];

	if (name == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "layout tensors[%zu]: \"name\" is empty", idx);
	if (t->n_shape > PLAN_MAX_DIMS)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "layout \"%s\": shape has %zu dims (at most %d)", name,
				     t->n_shape, PLAN_MAX_DIMS);
	if (plan_dtype_parse(t->dtype ? t->dtype : "", &dt) != REFIT_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "layout \"%s\": unknown dtype \"%s\"", name,
				     t->dtype ? t->dtype : "");
	if (t->n_mesh_shape > 0) {
		size_t nr = 1;

		if (t->n_mesh_shape > PLAN_MAX_DIMS)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": mesh has %zu dims (at most %d)",
					     name, t->n_mesh_shape, PLAN_MAX_DIMS);
		for (size_t i = 0; i < t->n_mesh_shape; i++) {
			if (t->mesh_shape[i] < 1 || t->mesh_shape[i] > PLAN_MAX_RANK_ID)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG,
						     "layout \"%s\": mesh_shape[%zu] = %" PRId64
						     " is out of range", name, i, t->mesh_shape[i]);
			nr *= (size_t)t->mesh_shape[i];
			if (nr > PLAN_MAX_RANK_ID)
				break;
		}
		if (nr != t->n_mesh_ranks)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": mesh_shape holds %zu ranks but "
					     "mesh_ranks lists %zu", name, nr, t->n_mesh_ranks);
		if (t->n_placements != t->n_mesh_shape)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "layout \"%s\": %zu placements for a %zu-D mesh",
					     name, t->n_placements, t->n_mesh_shape);
		for (size_t i = 0; i < t->n_placements; i++) {
			snprintf(what, sizeof(what), "layout \"%s\": placement %zu", name, i);
			CHECK(plan_placement_parse(t->placements[i], &pl[i], what, err));
		}
		return plan_layout_init_dtensor(l, name, dt, (int)t->n_shape, t->shape,
						(int)t->n_mesh_shape, t->mesh_shape,
						t->mesh_ranks, pl, err);
	}
	plan_shard_t *sh = xcalloc(t->n_shards ? t->n_shards : 1, sizeof(*sh));
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < t->n_shards && rc == REFIT_OK; i++) {
		const Refit__V1__Shard *s = t->shards[i];

		if (s->box == NULL || s->box->n_offset != t->n_shape ||
		    s->box->n_size != t->n_shape) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
					   "layout \"%s\": shards[%zu]: the box needs %zu offsets "
					   "and sizes", name, i, t->n_shape);
			break;
		}
		sh[i].rank = s->rank;
		for (size_t d = 0; d < t->n_shape; d++) { /* arrays are NULL when empty */
			sh[i].box.off[d] = s->box->offset[d];
			sh[i].box.size[d] = s->box->size[d];
		}
	}
	if (rc == REFIT_OK)
		rc = plan_layout_init_explicit(l, name, dt, (int)t->n_shape, t->shape, sh,
					       t->n_shards, err);
	free(sh);
	return rc;
}

refit_status_t
conv_layouts_from_proto(Refit__V1__TensorLayout *const *t, size_t n,
			plan_layout_set_t *out, refit_err_t *err)
{
	plan_layout_set_t tmp;
	refit_status_t rc = REFIT_OK;

	plan_layout_set_init(&tmp);
	if (n == 0)
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout: no tensors");
	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		plan_layout_t l;

		rc = one_layout(t[i], i, &l, err);
		if (rc == REFIT_OK)
			plan_layout_set_add(&tmp, &l);
	}
	if ((rc = plan_layout_set_finish(&tmp, rc, err)) != REFIT_OK)
		return rc;
	*out = tmp;
	return REFIT_OK;
}

void
conv_layouts_digest(const plan_layout_set_t *s, char hex[SHA256_HEX_LEN])
{
	strbuf_t sb;

	strbuf_init(&sb);
	for (size_t i = 0; i < s->n; i++) {
		const plan_layout_t *l = &s->v[i];

		strbuf_json_str(&sb, l->name);
		strbuf_printf(&sb, " %s ", plan_dtype_name(l->dtype));
		strbuf_i64_list(&sb, l->shape, l->ndim);
		if (l->conv) {
			strbuf_printf(&sb, " convert %s %s ", plan_dtype_name(l->conv->from),
				      scale_names[l->conv->scale]);
			strbuf_i64_list(&sb, l->conv->block, l->conv->nblock);
			if (l->conv->scale_tensor)
				strbuf_json_str(&sb, l->conv->scale_tensor);
		}
		strbuf_puts(&sb, "\n");
		for (size_t k = 0; k < l->nshards; k++) {
			strbuf_printf(&sb, "%d ", l->shards[k].rank);
			strbuf_i64_list(&sb, l->shards[k].box.off, l->ndim);
			strbuf_i64_list(&sb, l->shards[k].box.size, l->ndim);
			strbuf_puts(&sb, "\n");
		}
	}
	sha256_hex(sb.s, sb.len, hex);
	strbuf_fini(&sb);
}

static void
to_proto_one(const plan_layout_t *l, Refit__V1__TensorLayout *t)
{
	refit__v1__tensor_layout__init(t);
	t->name = l->name;
	t->dtype = (char *)plan_dtype_name(l->dtype);
	t->n_shape = (size_t)l->ndim;
	t->shape = xcalloc(l->ndim ? (size_t)l->ndim : 1, sizeof(*t->shape));
	memcpy(t->shape, l->shape, (size_t)l->ndim * sizeof(*t->shape));
	if (l->conv) {
		Refit__V1__Conversion *c = xmalloc(sizeof(*c));

		refit__v1__conversion__init(c);
		c->from = (char *)plan_dtype_name(l->conv->from);
		c->scale = (char *)scale_names[l->conv->scale];
		c->n_block = (size_t)l->conv->nblock;
		c->block = xcalloc(c->n_block ? c->n_block : 1, sizeof(int64_t));
		memcpy(c->block, l->conv->block, c->n_block * sizeof(int64_t));
		c->scale_tensor = l->conv->scale_tensor ? l->conv->scale_tensor : (char *)"";
		t->convert = c;
	}
	if (l->is_dtensor) {
		size_t nr = 1;

		for (int i = 0; i < l->mesh_ndim; i++)
			nr *= (size_t)l->mesh_shape[i];
		t->n_mesh_shape = (size_t)l->mesh_ndim;
		t->mesh_shape = xcalloc((size_t)l->mesh_ndim, sizeof(*t->mesh_shape));
		memcpy(t->mesh_shape, l->mesh_shape, (size_t)l->mesh_ndim * sizeof(int64_t));
		t->n_mesh_ranks = nr;
		t->mesh_ranks = xcalloc(nr, sizeof(*t->mesh_ranks));
		memcpy(t->mesh_ranks, l->mesh, nr * sizeof(int32_t));
		t->n_placements = (size_t)l->mesh_ndim;
		t->placements = xcalloc((size_t)l->mesh_ndim, sizeof(char *));
		for (int i = 0; i < l->mesh_ndim; i++) {
			char buf[96];

			plan_placement_format(&l->placements[i], buf, sizeof(buf));
			t->placements[i] = xstrdup(buf);
		}
		return;
	}
	t->n_shards = l->nshards;
	t->shards = xcalloc(l->nshards ? l->nshards : 1, sizeof(*t->shards));
	for (size_t k = 0; k < l->nshards; k++) {
		Refit__V1__Shard *s = xcalloc(1, sizeof(*s));
		Refit__V1__Box *b = xcalloc(1, sizeof(*b));

		refit__v1__shard__init(s);
		refit__v1__box__init(b);
		s->rank = l->shards[k].rank;
		s->box = b;
		b->n_offset = b->n_size = (size_t)l->ndim;
		b->offset = xcalloc(l->ndim ? (size_t)l->ndim : 1, sizeof(int64_t));
		b->size = xcalloc(l->ndim ? (size_t)l->ndim : 1, sizeof(int64_t));
		memcpy(b->offset, l->shards[k].box.off, (size_t)l->ndim * sizeof(int64_t));
		memcpy(b->size, l->shards[k].box.size, (size_t)l->ndim * sizeof(int64_t));
		t->shards[k] = s;
	}
}

Refit__V1__TensorLayout **
conv_layouts_to_proto(const plan_layout_set_t *s)
{
	Refit__V1__TensorLayout **v = xcalloc(s->n ? s->n : 1, sizeof(*v));

	for (size_t i = 0; i < s->n; i++) {
		v[i] = xmalloc(sizeof(*v[i]));
		to_proto_one(&s->v[i], v[i]);
	}
	return v;
}

void
conv_layouts_proto_free(Refit__V1__TensorLayout **v, size_t n)
{
	if (v == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		Refit__V1__TensorLayout *t = v[i];

		free(t->shape);
		if (t->convert)
			free(t->convert->block);
		free(t->convert);
		free(t->mesh_shape);
		free(t->mesh_ranks);
		for (size_t k = 0; k < t->n_placements; k++)
			free(t->placements[k]);
		free(t->placements);
		for (size_t k = 0; k < t->n_shards; k++) {
			free(t->shards[k]->box->offset);
			free(t->shards[k]->box->size);
			free(t->shards[k]->box);
			free(t->shards[k]);
		}
		free(t->shards);
		free(t);
	}
	free(v);
}

/* ---- strings at the edge -------------------------------------------------------- */

static bool
varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v)
{
	*v = 0;
	for (int sh = 0; sh < 64 && *i < n; sh += 7) {
		uint8_t b = p[(*i)++];

		*v |= (uint64_t)(b & 0x7f) << sh;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

static refit_status_t
check_msg(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth,
	  refit_err_t *err)
{
	size_t i = 0;

	if (depth > 32)
		return REFIT_OK; /* the unpacker bounds nesting */
	while (i < n) {
		uint64_t key, len;
		const ProtobufCFieldDescriptor *f;

		if (!varint(p, n, &i, &key))
			return REFIT_OK;
		switch (key & 7) {
		case 0:
			if (!varint(p, n, &i, &len))
				return REFIT_OK;
			continue;
		case 1:
			i += 8;
			continue;
		case 5:
			i += 4;
			continue;
		case 2:
			break;
		default:
			return REFIT_OK;
		}
		if (!varint(p, n, &i, &len) || len > n - i)
			return REFIT_OK;
		f = key >> 3 <= UINT32_MAX ?
		    protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
		if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING) {
			const char *s = (const char *)p + i;
			size_t bad;

			if (len > CONV_MAX_STRING)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s.%s: a string of "
						     "%" PRIu64 " bytes (at most %d)", d->short_name,
						     f->name, len, CONV_MAX_STRING);
			if (memchr(s, 0, len) != NULL)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s.%s: a string "
						     "with a NUL byte at offset %zu", d->short_name,
						     f->name, (size_t)((const char *)memchr(s, 0, len) - s));
			if (!utf8_valid(s, len, &bad))
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s.%s: not valid "
						     "UTF-8 (byte 0x%02x at offset %zu)", d->short_name,
						     f->name, (unsigned)(uint8_t)s[bad], bad);
		} else if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE) {
			CHECK(check_msg(f->descriptor, p + i, len, depth + 1, err));
		}
		i += len;
	}
	return REFIT_OK;
}

refit_status_t
conv_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
		   refit_err_t *err)
{
	return check_msg(d, p, n, 0, err);
}

/* ---- slices -------------------------------------------------------------------- */

/* The box of transfer x (one place to change if plan_xfer_t stops holding it). */
void
conv_slice_put(const plan_t *p, const plan_xfer_t *x, strbuf_t *out)
{
	const plan_box_t *b = plan_xfer_box(p, x);
	int nd = p->tensors[x->tensor].ndim;
	uint8_t rec[CONV_SLICE_HEAD + 16 * PLAN_MAX_DIMS];

	wire_put_le(rec, x->stage, 4);
	wire_put_le(rec + 4, (uint32_t)x->from, 4);
	wire_put_le(rec + 8, (uint32_t)x->to, 4);
	wire_put_le(rec + 12, x->tensor, 4);
	for (int d = 0; d < nd; d++) {
		wire_put_le(rec + CONV_SLICE_HEAD + 16 * d, (uint64_t)b->off[d], 8);
		wire_put_le(rec + CONV_SLICE_HEAD + 16 * d + 8, (uint64_t)b->size[d], 8);
	}
	strbuf_add(out, rec, CONV_SLICE_HEAD + 16 * (size_t)nd);
}

refit_status_t
conv_slice_get(const uint8_t *b, size_t len, size_t n, const int *ndim, uint32_t ntensors,
	       plan_xfer_t *xfers, plan_box_t *boxes, refit_err_t *err)
{
	size_t at = 0;

	for (size_t i = 0; i < n; i++) {
		plan_xfer_t *x = &xfers[i];
		plan_box_t *bx = &boxes[i];
		int nd;

		if (len - at < CONV_SLICE_HEAD)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "slice record %zu of %zu: "
					     "cut short at byte %zu of %zu", i, n, at, len);
		memset(x, 0, sizeof(*x));
		memset(bx, 0, sizeof(*bx));
		x->box = (uint32_t)i;
		x->stage = (uint32_t)wire_get_le(b + at, 4);
		x->from = (int32_t)(uint32_t)wire_get_le(b + at + 4, 4);
		x->to = (int32_t)(uint32_t)wire_get_le(b + at + 8, 4);
		x->tensor = (uint32_t)wire_get_le(b + at + 12, 4);
		if (x->tensor >= ntensors)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "slice record %zu (stage %u, "
					     "rank %d -> %d): tensor %u, the plan has %u", i,
					     x->stage, x->from, x->to, x->tensor, ntensors);
		nd = ndim[x->tensor];
		at += CONV_SLICE_HEAD;
		if (len - at < 16 * (size_t)nd)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "slice record %zu of %zu: "
					     "its box is cut short at byte %zu of %zu", i, n, at,
					     len);
		for (int d = 0; d < nd; d++) {
			bx->off[d] = (int64_t)wire_get_le(b + at + 16 * d, 8);
			bx->size[d] = (int64_t)wire_get_le(b + at + 16 * d + 8, 8);
		}
		at += 16 * (size_t)nd;
	}
	if (at != len)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "slice: %zu bytes after its %zu "
				     "records", len - at, n);
	return REFIT_OK;
}
