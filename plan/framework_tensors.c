/*
 * framework_tensors.c - the logical (Hugging Face checkpoint) tensors of a
 * framework map and the parameters being emitted (fw_internal.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/fw_internal.h"

/* Shape of a Hugging Face tensor from its suffix after the layer prefix
 * (or its whole name for globals); 0 dims when the name is unknown. */
static int
hf_shape(const plan_arch_t *a, const char *s, int64_t *sh, plan_dtype_t *dt)
{
	int64_t H = a->hidden, hd = a->head_dim, nq = a->heads, nkv = a->kv_heads;
	int64_t qk = a->qk_nope_dim + a->qk_rope_dim, Ie = a->expert_intermediate;
	int64_t Is = a->shared_experts * Ie;
	int e;

	*dt = a->dtype;
#define IS(x) (strcmp(s, x) == 0)
#define SET1(x) (sh[0] = (x), 1)
#define SET2(x, y) (sh[0] = (x), sh[1] = (y), 2)
	if (IS("model.embed_tokens.weight") || IS("lm_head.weight"))
		return SET2(a->vocab, H);
	if (IS("model.norm.weight") || IS("input_layernorm.weight") ||
	    IS("post_attention_layernorm.weight"))
		return SET1(H);
	if (IS("self_attn.q_proj.weight"))
		return SET2(nq * hd, H);
	if (IS("self_attn.k_proj.weight") || IS("self_attn.v_proj.weight"))
		return SET2(nkv * hd, H);
	if (IS("self_attn.q_proj.bias"))
		return SET1(nq * hd);
	if (IS("self_attn.k_proj.bias") || IS("self_attn.v_proj.bias"))
		return SET1(nkv * hd);
	if (IS("self_attn.o_proj.bias"))
		return SET1(H);
	if (IS("self_attn.q_norm.weight") || IS("self_attn.k_norm.weight"))
		return SET1(hd);
	if (IS("self_attn.o_proj.weight"))
		return SET2(H, nq * (a->q_lora_rank > 0 ? a->v_head_dim : hd));
	if (IS("self_attn.q_a_proj.weight"))
		return SET2(a->q_lora_rank, H);
	if (IS("self_attn.q_a_layernorm.weight"))
		return SET1(a->q_lora_rank);
	if (IS("self_attn.q_b_proj.weight"))
		return SET2(nq * qk, a->q_lora_rank);
	if (IS("self_attn.kv_a_proj_with_mqa.weight"))
		return SET2(a->kv_lora_rank + a->qk_rope_dim, H);
	if (IS("self_attn.kv_a_layernorm.weight"))
		return SET1(a->kv_lora_rank);
	if (IS("self_attn.kv_b_proj.weight"))
		return SET2(nq * (a->qk_nope_dim + a->v_head_dim), a->kv_lora_rank);
	if (IS("mlp.gate_proj.weight") || IS("mlp.up_proj.weight"))
		return SET2(a->intermediate, H);
	if (IS("mlp.down_proj.weight"))
		return SET2(H, a->intermediate);
	if (IS("mlp.gate.weight"))
		return SET2(a->experts, H);
	if (IS("mlp.gate.e_score_correction_bias")) {
		*dt = PLAN_DT_FP32;
		return SET1(a->experts);
	}
	if (IS("mlp.shared_experts.gate_proj.weight") || IS("mlp.shared_experts.up_proj.weight"))
		return SET2(Is, H);
	if (IS("mlp.shared_experts.down_proj.weight"))
		return SET2(H, Is);
	if (sscanf(s, "mlp.experts.%d.", &e) == 1) {
		if (strstr(s, ".down_proj.weight"))
			return SET2(H, Ie);
		return SET2(Ie, H);
	}
#undef IS
#undef SET1
#undef SET2
	return 0;
}

/* A linear projection's weight: what an fp8 engine quantizes. */
static bool
is_projection(const char *s)
{
	static const char *const ends[] = {"_proj.weight", "_proj_with_mqa.weight", NULL};
	size_t n = strlen(s);

	for (int i = 0; ends[i]; i++) {
		size_t k = strlen(ends[i]);

		if (n >= k && strcmp(s + n - k, ends[i]) == 0)
			return true;
	}
	return false;
}

static int32_t
tensor_add(fwgen_t *g, const char *name, const plan_fw_tensor_t *t)
{
	int32_t id = (int32_t)g->m->tensors.n;
	plan_fw_tensor_t c = *t;

	c.name = xstrdup(name);
	VEC_PUSH(&g->m->tensors, c);
	strmap_put(&g->ids, name, id);
	return id;
}

int32_t
fw_tensor_id(fwgen_t *g, const char *name, const char *suffix)
{
	int32_t id = strmap_get(&g->ids, name), sid;
	int64_t B = g->m->fp8_block;
	plan_fw_tensor_t t = {0}, sc = {0};
	char sname[300];

	if (id >= 0)
		return id;
	t.ndim = hf_shape(g->a, suffix, t.shape, &t.dtype);
	if (t.ndim == 0) /* a rule names a part hf_shape does not know: our bug */
		abort();
	t.from = t.dtype;
	t.scale = -1;
	if (B == 0 || !is_projection(suffix))
		return tensor_add(g, name, &t);
	t.dtype = PLAN_DT_FP8E4M3;
	id = tensor_add(g, name, &t);
	sc.ndim = t.ndim;
	sc.dtype = sc.from = PLAN_DT_FP32;
	sc.scale = -1;
	for (int d = 0; d < t.ndim; d++)
		sc.shape[d] = (t.shape[d] + B - 1) / B;
	snprintf(sname, sizeof(sname), "%s_scale_inv", name);
	sid = tensor_add(g, sname, &sc); /* may move the vector: index after */
	g->m->tensors.v[id].scale = sid;
	return id;
}

int32_t
fw_part(fwgen_t *g, const rule_t *r, int k, int64_t e)
{
	char suffix[160], name[256];

	if (e >= 0)
		snprintf(suffix, sizeof(suffix), r->parts[k], (int)e);
	else
		snprintf(suffix, sizeof(suffix), "%s", r->parts[k]);
	snprintf(name, sizeof(name), "%s%s", r->scope == S_LAYER ? g->hf_prefix : "", suffix);
	return fw_tensor_id(g, name, suffix);
}

void
fw_param_begin(fwgen_t *g, const char *name, plan_dtype_t dt, int ndim, const int64_t *shape)
{
	plan_fw_param_t p = {0};

	p.name = xstrdup(name);
	p.rank = g->rank;
	p.dtype = dt;
	p.ndim = ndim;
	memcpy(p.shape, shape, (size_t)ndim * sizeof(*shape));
	p.piece0 = g->m->pieces.n;
	p.pad0 = g->m->pads.n;
	VEC_PUSH(&g->m->params, p);
}
