/*
 * model_json.c - architecture files (config/models/NAME.json) to plan_arch_t.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec/json_util.h"

static const struct {
	const char *key;
	size_t off;
	bool required;
} nums[] = {
#define K(k, f, r) {k, offsetof(plan_arch_t, f), r}
	K("hidden", hidden, true), K("layers", layers, true), K("vocab", vocab, true),
	K("heads", heads, true), K("kv_heads", kv_heads, false), K("head_dim", head_dim, false),
	K("intermediate", intermediate, false), K("q_lora_rank", q_lora_rank, false),
	K("kv_lora_rank", kv_lora_rank, false), K("qk_nope_head_dim", qk_nope_dim, false),
	K("qk_rope_head_dim", qk_rope_dim, false), K("v_head_dim", v_head_dim, false),
	K("experts", experts, false), K("shared_experts", shared_experts, false),
	K("expert_intermediate", expert_intermediate, false),
	K("first_dense_layers", first_dense_layers, false),
#undef K
};

static refit_status_t
parse_arch(const cJSON *o, plan_arch_t *a, refit_err_t *err)
{
	static const char *const keys[] = {
		"name", "source", "dtype", "tie_embeddings", "qk_norm", "hidden", "layers",
		"vocab", "heads", "kv_heads", "head_dim", "intermediate", "q_lora_rank",
		"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "experts",
		"shared_experts", "expert_intermediate", "first_dense_layers", NULL};
	const char *name, *dt = "bf16";
	const cJSON *v;

	memset(a, 0, sizeof(*a));
	if (!cJSON_IsObject(o))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model: expected an object");
	CHECK(json_check_keys(o, keys, "model", err));
	CHECK(json_str(cJSON_GetObjectItemCaseSensitive(o, "name"), &name, "model: name", err));
	snprintf(a->name, sizeof(a->name), "%s", name);
	if ((v = cJSON_GetObjectItemCaseSensitive(o, "dtype")) != NULL)
		CHECK(json_str(v, &dt, "model: dtype", err));
	if (plan_dtype_parse(dt, &a->dtype) != REFIT_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\": unknown dtype "
				     "\"%s\"", a->name, dt);
	a->tie_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "tie_embeddings"));
	a->qk_norm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "qk_norm"));
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		char what[128];

		v = cJSON_GetObjectItemCaseSensitive(o, nums[i].key);
		snprintf(what, sizeof(what), "model \"%s\": %s", a->name, nums[i].key);
		if (v == NULL) {
			if (nums[i].required)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s is missing", what);
			continue;
		}
		CHECK(json_int(v, 0, (int64_t)1 << 24, (int64_t *)((char *)a + nums[i].off),
			       what, err));
	}
	if (a->q_lora_rank == 0 && (a->kv_heads == 0 || a->head_dim == 0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\": GQA attention "
				     "needs kv_heads and head_dim (or MLA's q_lora_rank...)", a->name);
	if (a->experts > 0 && a->expert_intermediate == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\": experts need "
				     "expert_intermediate", a->name);
	if ((a->experts == 0 || a->first_dense_layers > 0) && a->intermediate == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\": dense layers "
				     "need intermediate", a->name);
	return REFIT_OK;
}

refit_status_t
codec_arch_parse(const char *text, size_t len, plan_arch_t *a, refit_err_t *err)
{
	cJSON *root;
	refit_status_t rc;

	CHECK(json_parse(text, len, &root, "model", err));
	rc = parse_arch(root, a, err);
	cJSON_Delete(root);
	return rc;
}

refit_status_t
codec_arch_load(const char *spec, const char *const *dirs, plan_arch_t *a, refit_err_t *err)
{
	char path[4096], *buf;
	size_t len;
	refit_status_t rc;

	snprintf(path, sizeof(path), "%s", spec);
	if (strchr(spec, '/') == NULL && access(spec, F_OK) != 0) {
		for (size_t i = 0; dirs && dirs[i]; i++) {
			snprintf(path, sizeof(path), "%s/%s.json", dirs[i], spec);
			if (access(path, F_OK) == 0)
				break;
		}
		if (access(path, F_OK) != 0)
			return refit_err_set(err, REFIT_ERR_NOT_FOUND, "model \"%s\": no such file, "
					     "and not in the catalogue (config/models)", spec);
	}
	CHECK(codec_read_file(path, &buf, &len, err));
	rc = codec_arch_parse(buf, len, a, err);
	free(buf);
	if (rc != REFIT_OK)
		refit_err_prefix(err, "%s", path);
	return rc;
}
