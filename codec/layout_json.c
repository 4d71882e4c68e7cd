/*
 * layout_json.c - layout documents (DTensor and explicit form) to
 * plan_layout_t, and shard boxes back to JSON.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json_util.h"
#include "common/alloc.h"
#include "common/strbuf.h"
#include "plan/convert.h"

#define MAX_INT ((int64_t)1 << 48)

typedef VEC(int32_t) ranks_t;

/* Shape of a nested mesh array, read along its first entries. */
static refit_status_t
mesh_shape(const cJSON *a, int64_t *shape, int *ndim, const char *what,
	   refit_err_t *err)
{
	int d = 0;

	for (; cJSON_IsArray(a); a = cJSON_GetArrayItem(a, 0)) {
		if (d == PLAN_MAX_DIMS)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "%s: mesh is nested deeper than %d", what,
					     PLAN_MAX_DIMS);
		shape[d] = cJSON_GetArraySize(a);
		if (shape[d] == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "%s: mesh has an empty array", what);
		d++;
	}
	*ndim = d;
	return REFIT_OK;
}

/* Check every array at depth d has shape[d] entries; collect ranks. */
static refit_status_t
mesh_walk(const cJSON *a, int depth, const int64_t *shape, int ndim, char *path,
	  size_t plen, ranks_t *out, const char *what, refit_err_t *err)
{
	const cJSON *it;
	int64_t r;
	int i = 0;
	char w[256];

	if (depth == ndim) {
		snprintf(w, sizeof(w), "%s: mesh%s", what, path);
		CHECK(json_int(a, 0, PLAN_MAX_RANK_ID - 1, &r, w, err));
		VEC_PUSH(out, (int32_t)r);
		return REFIT_OK;
	}
	if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != shape[depth])
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: mesh is not rectangular: mesh%s should be an "
				     "array of %" PRId64 " entries", what, path, shape[depth]);
	cJSON_ArrayForEach(it, a) {
		size_t n = strlen(path);

		snprintf(path + n, plen - n, "[%d]", i++);
		CHECK(mesh_walk(it, depth + 1, shape, ndim, path, plen, out, what, err));
		path[n] = '\0';
	}
	return REFIT_OK;
}

static refit_status_t
parse_dtensor(const cJSON *o, const char *name, plan_dtype_t dt, int ndim,
	      const int64_t *shape, plan_layout_t *l, const char *what,
	      refit_err_t *err)
{
	const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(o, "mesh");
	const cJSON *pl = cJSON_GetObjectItemCaseSensitive(o, "placements"), *it;
	int64_t mshape[PLAN_MAX_DIMS];
	plan_placement_t p[PLAN_MAX_DIMS];
	int mdim = 0, k = 0;
	ranks_t ranks = {0};
	refit_status_t rc;

	if (!cJSON_IsArray(mesh))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: \"mesh\" must be a (nested) array of ranks", what);
	if (!cJSON_IsArray(pl))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: \"placements\" must be an array of strings", what);
	char path[128] = "";

	rc = mesh_shape(mesh, mshape, &mdim, what, err);
	if (rc == REFIT_OK)
		rc = mesh_walk(mesh, 0, mshape, mdim, path, sizeof(path), &ranks,
			       what, err);
	if (rc == REFIT_OK && cJSON_GetArraySize(pl) != mdim)
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
				   "%s: %d placements for a %d-D mesh (one per mesh dim)",
				   what, cJSON_GetArraySize(pl), mdim);
	if (rc == REFIT_OK) {
		cJSON_ArrayForEach(it, pl) {
			const char *s;
			char w[160];

			snprintf(w, sizeof(w), "%s: placement %d", what, k);
			rc = json_str(it, &s, w, err);
			if (rc == REFIT_OK)
				rc = plan_placement_parse(s, &p[k], w, err);
			if (rc != REFIT_OK)
				break;
			k++;
		}
	}
	if (rc == REFIT_OK)
		rc = plan_layout_init_dtensor(l, name, dt, ndim, shape, mdim, mshape,
					      ranks.v, p, err);
	VEC_FREE(&ranks);
	return rc;
}

static refit_status_t
parse_explicit(const cJSON *o, const char *name, plan_dtype_t dt, int ndim,
	       const int64_t *shape, plan_layout_t *l, const char *what,
	       refit_err_t *err)
{
	static const char *const keys[] = {"rank", "offset", "size", NULL};
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shards"), *it;
	VEC(plan_shard_t) shards = {0};
	refit_status_t rc = REFIT_OK;
	size_t i = 0;

	if (!cJSON_IsArray(sh))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: \"shards\" must be an array", what);
	cJSON_ArrayForEach(it, sh) {
		plan_shard_t s;
		char w[192];
		int64_t r;
		int n1 = 0, n2 = 0;

		memset(&s, 0, sizeof(s));
		snprintf(w, sizeof(w), "%s: shards[%zu]", what, i++);
		if (!cJSON_IsObject(it)) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: expected an object", w);
			break;
		}
		rc = json_check_keys(it, keys, w, err);
		if (rc == REFIT_OK)
			rc = json_int(cJSON_GetObjectItemCaseSensitive(it, "rank"), 0,
				      PLAN_MAX_RANK_ID - 1, &r, w, err);
		if (rc == REFIT_OK)
			rc = json_int_array(cJSON_GetObjectItemCaseSensitive(it, "offset"),
					    0, MAX_INT, s.box.off, PLAN_MAX_DIMS, &n1, w, err);
		if (rc == REFIT_OK)
			rc = json_int_array(cJSON_GetObjectItemCaseSensitive(it, "size"),
					    0, MAX_INT, s.box.size, PLAN_MAX_DIMS, &n2, w, err);
		if (rc == REFIT_OK && (n1 != ndim || n2 != ndim))
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
					   "%s: offset has %d and size %d entries but the tensor "
					   "has %d dims", w, n1, n2, ndim);
		if (rc != REFIT_OK)
			break;
		s.rank = (int32_t)r;
		VEC_PUSH(&shards, s);
	}
	if (rc == REFIT_OK)
		rc = plan_layout_init_explicit(l, name, dt, ndim, shape, shards.v,
					       shards.n, err);
	VEC_FREE(&shards);
	return rc;
}

/* The "convert" object of a destination tensor (docs/conversion.md). */
static refit_status_t
parse_convert(const cJSON *o, plan_layout_t *l, const char *what, refit_err_t *err)
{
	static const char *const keys[] = {"from", "scale", "block", "scale_tensor", NULL};
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "convert");
	const cJSON *sc = cJSON_GetObjectItemCaseSensitive(c, "scale");
	const cJSON *bl = cJSON_GetObjectItemCaseSensitive(c, "block");
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(c, "scale_tensor");
	plan_convert_t cv;
	const char *s;
	char w[256];

	memset(&cv, 0, sizeof(cv));
	snprintf(w, sizeof(w), "%s: \"convert\"", what);
	if (!cJSON_IsObject(c))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s must be an object", w);
	CHECK(json_check_keys(c, keys, w, err));
	CHECK(json_str(cJSON_GetObjectItemCaseSensitive(c, "from"), &s, w, err));
	if (plan_dtype_parse(s, &cv.from) != REFIT_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: unknown dtype \"%s\" "
				     "in \"from\"", w, s);
	cv.scale = l->dtype == PLAN_DT_FP8E4M3 ? PLAN_SCALE_BLOCK : PLAN_SCALE_NONE;
	if (sc != NULL) {
		CHECK(json_str(sc, &s, w, err));
		if (strcmp(s, "none") == 0)
			cv.scale = PLAN_SCALE_NONE;
		else if (strcmp(s, "tensor") == 0)
			cv.scale = PLAN_SCALE_TENSOR;
		else if (strcmp(s, "block") == 0)
			cv.scale = PLAN_SCALE_BLOCK;
		else if (strcmp(s, "mx") == 0)
			cv.scale = PLAN_SCALE_MX;
		else
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"scale\" is \"%s\" "
					     "(known: none, tensor, block, mx)", w, s);
	}
	if (bl != NULL) {
		if (cv.scale != PLAN_SCALE_BLOCK && cv.scale != PLAN_SCALE_MX)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"block\" needs "
					     "\"scale\": \"block\" or \"mx\"", w);
		CHECK(json_int_array(bl, 1, (int64_t)1 << 31, cv.block, PLAN_MAX_DIMS,
				     &cv.nblock, w, err));
	} else if (cv.scale == PLAN_SCALE_BLOCK) {
		cv.nblock = 2;
		cv.block[0] = cv.block[1] = 128;
	} else if (cv.scale == PLAN_SCALE_MX) {
		cv.nblock = 1;    /* 1 x 32 along the last dim */
		cv.block[0] = 32;
	}
	if (st != NULL && cv.scale == PLAN_SCALE_NONE)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"scale_tensor\" needs "
				     "a scaled conversion", w);
	if (st != NULL)
		CHECK(json_str(st, &s, w, err));
	if (cv.scale != PLAN_SCALE_NONE) {
		strbuf_t sb;

		strbuf_init(&sb);
		if (st != NULL)
			strbuf_puts(&sb, s);
		else
			strbuf_printf(&sb, "%s_scale_inv", l->name);
		cv.scale_tensor = xstrdup(sb.s);
		strbuf_fini(&sb);
	}
	l->conv = plan_convert_dup(&cv);
	free(cv.scale_tensor);
	return plan_convert_check_spec(l, err);
}

static refit_status_t
parse_tensor(const cJSON *o, size_t index, plan_layout_t *l, refit_err_t *err)
{
	static const char *const keys[] = {"name", "dtype", "shape", "mesh",
					   "placements", "shards", "convert", NULL};
	refit_status_t rc;
	const char *name, *dts;
	char what[192];
	int64_t shape[PLAN_MAX_DIMS];
	int ndim = 0;
	plan_dtype_t dt;
	bool has_mesh, has_shards;

	snprintf(what, sizeof(what), "layout tensors[%zu]", index);
	if (!cJSON_IsObject(o))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: expected an object", what);
	CHECK(json_str(cJSON_GetObjectItemCaseSensitive(o, "name"), &name,
		       strcat(what, ": \"name\""), err));
	snprintf(what, sizeof(what), "layout \"%.120s\"", name);
	CHECK(json_check_keys(o, keys, what, err));
	CHECK(json_str(cJSON_GetObjectItemCaseSensitive(o, "dtype"), &dts, what, err));
	if (plan_dtype_parse(dts, &dt) != REFIT_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: unknown dtype \"%s\" (known: bool, uint8, int8, "
				     "int16, int32, int64, fp8e4m3, fp8e5m2, fp16, bf16, "
				     "fp32, fp64)", what, dts);
	{
		char w[224];

		snprintf(w, sizeof(w), "%s: shape", what);
		CHECK(json_int_array(cJSON_GetObjectItemCaseSensitive(o, "shape"), 0,
				     MAX_INT, shape, PLAN_MAX_DIMS, &ndim, w, err));
	}
	has_mesh = cJSON_HasObjectItem(o, "mesh") || cJSON_HasObjectItem(o, "placements");
	has_shards = cJSON_HasObjectItem(o, "shards");
	if (has_mesh && has_shards)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: give either \"mesh\" + \"placements\" or "
				     "\"shards\", not both", what);
	if (!has_mesh && !has_shards)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: missing \"mesh\" + \"placements\" (DTensor form) "
				     "or \"shards\" (explicit form)", what);
	if (has_mesh)
		rc = parse_dtensor(o, name, dt, ndim, shape, l, what, err);
	else
		rc = parse_explicit(o, name, dt, ndim, shape, l, what, err);
	if (rc == REFIT_OK && cJSON_HasObjectItem(o, "convert")) {
		rc = parse_convert(o, l, what, err);
		if (rc != REFIT_OK)
			plan_layout_fini(l);
	}
	return rc;
}

/* The tensors of the array list (or of the one tensor object) into *out. */
static refit_status_t
layouts_of_tree(const cJSON *list, bool one, plan_layout_set_t *out, refit_err_t *err)
{
	const cJSON *it;
	plan_layout_set_t tmp;
	refit_status_t rc = REFIT_OK;
	size_t i = 0;

	plan_layout_set_init(&tmp);
	if (one) {
		plan_layout_t l;

		rc = parse_tensor(list, 0, &l, err);
		if (rc == REFIT_OK)
			plan_layout_set_add(&tmp, &l);
	} else if (!cJSON_IsArray(list)) {
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
				   "layout: \"tensors\" must be an array");
	} else {
		cJSON_ArrayForEach(it, list) {
			plan_layout_t l;

			if (rc != REFIT_OK)
				break;
			rc = parse_tensor(it, i++, &l, err);
			if (rc == REFIT_OK)
				plan_layout_set_add(&tmp, &l);
		}
	}
	if ((rc = plan_layout_set_finish(&tmp, rc, err)) != REFIT_OK)
		return rc;
	for (size_t k = 0; k < tmp.n; k++)
		plan_layout_set_add(out, &tmp.v[k]);
	free(tmp.v);
	return REFIT_OK;
}

refit_status_t
codec_layouts_parse(const char *text, size_t len, plan_layout_set_t *out,
		    int *was_list, refit_err_t *err)
{
	static const char *const top_keys[] = {"tensors", "model", NULL};
	cJSON *root;
	const cJSON *list;
	refit_status_t rc;

	CHECK(json_parse(text, len, &root, "layout", err));
	list = cJSON_GetObjectItemCaseSensitive(root, "tensors");
	if (was_list)
		*was_list = list != NULL;
	if (!cJSON_IsObject(root))
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
				   "layout: expected a tensor object or {\"tensors\": [...]}");
	else if (list == NULL)
		rc = layouts_of_tree(root, true, out, err);
	else if ((rc = json_check_keys(root, top_keys, "layout", err)) == REFIT_OK)
		rc = layouts_of_tree(list, false, out, err);
	cJSON_Delete(root);
	return rc;
}

refit_status_t
codec_layouts_from_tree(const cJSON *list, plan_layout_set_t *out, refit_err_t *err)
{
	return layouts_of_tree(list, false, out, err);
}

static cJSON *
i64_array(const int64_t *v, int n)
{
	cJSON *a = cJSON_CreateArray();

	for (int i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
	return a;
}

/*
 * Key for key and in the order the text form had (the state file stays
 * byte for byte what it was when it was printed from text).
 */
cJSON *
codec_layouts_tree(const plan_layout_set_t *s)
{
	static const char *const scales[] = {"none", "tensor", "block", "mx"};
	cJSON *arr = cJSON_CreateArray();

	for (size_t i = 0; i < s->n; i++) {
		const plan_layout_t *l = &s->v[i];
		const plan_convert_t *c = l->conv;
		cJSON *o = cJSON_CreateObject(), *shards;

		cJSON_AddStringToObject(o, "name", l->name);
		cJSON_AddStringToObject(o, "dtype", plan_dtype_name(l->dtype));
		cJSON_AddItemToObject(o, "shape", i64_array(l->shape, l->ndim));
		if (c != NULL) {
			cJSON *co = cJSON_AddObjectToObject(o, "convert");

			cJSON_AddStringToObject(co, "from", plan_dtype_name(c->from));
			cJSON_AddStringToObject(co, "scale", scales[c->scale]);
			if (c->scale == PLAN_SCALE_BLOCK || c->scale == PLAN_SCALE_MX)
				cJSON_AddItemToObject(co, "block", i64_array(c->block, c->nblock));
			if (c->scale != PLAN_SCALE_NONE)
				cJSON_AddStringToObject(co, "scale_tensor", c->scale_tensor);
		}
		shards = cJSON_AddArrayToObject(o, "shards");
		for (size_t k = 0; k < l->nshards; k++) {
			cJSON *so = cJSON_CreateObject();

			cJSON_AddNumberToObject(so, "rank", l->shards[k].rank);
			cJSON_AddItemToObject(so, "offset", i64_array(l->shards[k].box.off, l->ndim));
			cJSON_AddItemToObject(so, "size", i64_array(l->shards[k].box.size, l->ndim));
			cJSON_AddItemToArray(shards, so);
		}
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

refit_status_t
codec_layouts_load(const char *path, plan_layout_set_t *out, int *was_list,
		   refit_err_t *err)
{
	char *buf;
	size_t len;
	refit_status_t rc;

	CHECK(codec_read_file(path, &buf, &len, err));
	rc = codec_layouts_parse(buf, len, out, was_list, err);
	free(buf);
	if (rc != REFIT_OK)
		refit_err_prefix(err, "%s", path);
	return rc;
}

void
codec_boxes_json(const plan_layout_t *l, strbuf_t *out)
{
	strbuf_puts(out, "{\"name\": ");
	strbuf_json_str(out, l->name);
	strbuf_puts(out, ", \"shards\": [");
	for (size_t i = 0; i < l->nshards; i++) {
		const plan_shard_t *s = &l->shards[i];
		bool multi = (i > 0 && l->shards[i - 1].rank == s->rank) ||
			     (i + 1 < l->nshards && l->shards[i + 1].rank == s->rank);

		strbuf_printf(out, "%s\n  {\"rank\": %d, \"offset\": ", i ? "," : "", s->rank);
		strbuf_i64_list(out, s->box.off, l->ndim);
		strbuf_puts(out, ", \"size\": ");
		strbuf_i64_list(out, s->box.size, l->ndim);
		if (multi && l->is_dtensor) {
			strbuf_puts(out, ", \"local_offset\": ");
			strbuf_i64_list(out, s->local_off, l->ndim);
		}
		strbuf_puts(out, "}");
	}
	strbuf_puts(out, "\n]}");
}

