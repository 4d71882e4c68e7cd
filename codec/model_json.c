/*
 * model_json.c - architecture files (config/models/NAME.json) to plan_arch_t.
 */
#include <inttypes.h>
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

static refit_status_t check_arch(const plan_arch_t *a, refit_err_t *err);

static refit_status_t
parse_arch(const cJSON *o, plan_arch_t *a, refit_err_t *err)
{
	static const char *const keys[] = {
		"name", "source", "dtype", "tie_embeddings", "qk_norm", "hidden", "layers",
		"vocab", "heads", "kv_heads", "head_dim", "intermediate", "q_lora_rank",
		"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "experts",
		"shared_experts", "expert_intermediate", "first_dense_layers", "qkv_bias",
		"router_bias", NULL};
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
	a->qkv_bias = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "qkv_bias"));
	a->router_bias = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "router_bias"));
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
	return check_arch(a, err);
}

/* What every architecture needs, however it was written. */
static refit_status_t
check_arch(const plan_arch_t *a, refit_err_t *err)
{
	if (a->hidden <= 0 || a->layers <= 0 || a->vocab <= 0 || a->heads <= 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\": hidden, layers, "
				     "vocab and heads must be positive", a->name);
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

/* ---- Hugging Face config.json ---------------------------------------- */

static const char *const hf_types[] = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe",
				       "deepseek_v3", "kimi_k2", NULL};

/* An integer key of a config.json (absent or null: `def`). */
static refit_status_t
hf_int(const cJSON *o, const char *key, int64_t def, int64_t *out, const char *model,
       refit_err_t *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	char what[160];

	*out = def;
	if (v == NULL || cJSON_IsNull(v))
		return REFIT_OK;
	snprintf(what, sizeof(what), "config.json (%s): %s", model, key);
	return json_int(v, 0, (int64_t)1 << 24, out, what, err);
}

static bool
hf_true(const cJSON *o, const char *key, bool def)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/*
 * A Hugging Face config.json of a family refit knows (hf_types).  Absent
 * keys take transformers' defaults: num_key_value_heads = heads, head_dim
 * = hidden / heads, tie_word_embeddings false (the families' own defaults).
 * Features that change the weights refit does not model are refused.
 */
static refit_status_t
parse_hf(const cJSON *o, plan_arch_t *a, refit_err_t *err)
{
	const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "model_type"));
	const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "torch_dtype"));
	const char *topk = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "topk_method"));
	bool moe, mla;
	int64_t step = 1, freq = 1;
	const cJSON *only;
	size_t i;

	memset(a, 0, sizeof(*a));
	for (i = 0; hf_types[i] && (type == NULL || strcmp(type, hf_types[i]) != 0); i++)
		;
	if (type == NULL || hf_types[i] == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json: model_type \"%s\" "
				     "is not one refit maps (llama, mistral, qwen2, qwen3, "
				     "qwen3_moe, deepseek_v3, kimi_k2)", type ? type : "");
	snprintf(a->name, sizeof(a->name), "%s", type);
	if (dt == NULL)
		dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "dtype"));
	if (plan_dtype_parse(dt ? dt : "bf16", &a->dtype) != REFIT_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json (%s): unknown dtype "
				     "\"%s\"", type, dt);
	moe = strcmp(type, "qwen3_moe") == 0;
	mla = strcmp(type, "deepseek_v3") == 0 || strcmp(type, "kimi_k2") == 0;
	CHECK(hf_int(o, "hidden_size", 0, &a->hidden, type, err));
	CHECK(hf_int(o, "num_hidden_layers", 0, &a->layers, type, err));
	CHECK(hf_int(o, "vocab_size", 0, &a->vocab, type, err));
	CHECK(hf_int(o, "num_attention_heads", 0, &a->heads, type, err));
	CHECK(hf_int(o, "num_key_value_heads", a->heads, &a->kv_heads, type, err));
	CHECK(hf_int(o, "head_dim", a->heads ? a->hidden / a->heads : 0, &a->head_dim, type, err));
	CHECK(hf_int(o, "intermediate_size", 0, &a->intermediate, type, err));
	/* vLLM's Qwen2 takes head_dim as hidden / heads whatever the config
	 * says (transformers and SGLang honour it): the vLLM map refuses such */
	a->qwen2_head_dim = strcmp(type, "qwen2") == 0;
	/* transformers' classes for these families default to untied */
	a->tie_embeddings = hf_true(o, "tie_word_embeddings", false);
	a->qkv_bias = strcmp(type, "qwen2") == 0 || hf_true(o, "attention_bias", false);
	a->o_bias = strcmp(type, "qwen2") != 0 && hf_true(o, "attention_bias", false);
	a->qk_norm = strcmp(type, "qwen3") == 0 || moe;
	if (hf_true(o, "mlp_bias", false))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json (%s): mlp_bias is not "
				     "mapped", type);
	if (moe) {
		/* transformers 5 writes num_local_experts, the Hub's files num_experts */
		CHECK(hf_int(o, "num_experts", 0, &a->experts, type, err));
		if (a->experts == 0)
			CHECK(hf_int(o, "num_local_experts", 0, &a->experts, type, err));
		CHECK(hf_int(o, "moe_intermediate_size", 0, &a->expert_intermediate, type, err));
		CHECK(hf_int(o, "decoder_sparse_step", 1, &step, type, err));
		only = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
		if (a->experts == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json (%s): no "
					     "num_experts (or num_local_experts)", type);
		if (step != 1 || cJSON_GetArraySize(only) > 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json (%s): dense "
					     "layers between MoE layers (decoder_sparse_step, "
					     "mlp_only_layers) are not mapped", type);
	}
	if (mla) {
		CHECK(hf_int(o, "n_routed_experts", 0, &a->experts, type, err));
		CHECK(hf_int(o, "n_shared_experts", 0, &a->shared_experts, type, err));
		CHECK(hf_int(o, "moe_intermediate_size", 0, &a->expert_intermediate, type, err));
		CHECK(hf_int(o, "first_k_dense_replace", 0, &a->first_dense_layers, type, err));
		CHECK(hf_int(o, "moe_layer_freq", 1, &freq, type, err));
		CHECK(hf_int(o, "q_lora_rank", 0, &a->q_lora_rank, type, err));
		CHECK(hf_int(o, "kv_lora_rank", 0, &a->kv_lora_rank, type, err));
		CHECK(hf_int(o, "qk_nope_head_dim", 0, &a->qk_nope_dim, type, err));
		CHECK(hf_int(o, "qk_rope_head_dim", 0, &a->qk_rope_dim, type, err));
		CHECK(hf_int(o, "v_head_dim", 0, &a->v_head_dim, type, err));
		/* noaux_tc routing has e_score_correction_bias (DeepSeek-V3, Kimi-K2) */
		a->router_bias = topk != NULL && strcmp(topk, "noaux_tc") == 0;
		a->qkv_bias = a->o_bias = false;
		if (a->experts == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json (%s): no "
					     "n_routed_experts", type);
		if (freq != 1 || a->q_lora_rank == 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "config.json (%s): "
					     "moe_layer_freq != 1 or q_lora_rank null (no q_a_proj) "
					     "is not mapped", type);
	}
	return check_arch(a, err);
}

refit_status_t
codec_arch_parse(const char *text, size_t len, plan_arch_t *a, refit_err_t *err)
{
	cJSON *root;
	refit_status_t rc;

	CHECK(json_parse(text, len, &root, "model", err));
	if (cJSON_GetObjectItemCaseSensitive(root, "model_type") != NULL)
		rc = parse_hf(root, a, err);
	else
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
