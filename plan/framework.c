/*
 * framework.c - the frameworks' memory maps from one table of rules per
 * framework (see framework.h).
 *
 * A rule names a parameter (as the framework names it, after the layer
 * prefix for per-layer rules), the Hugging Face tensors it is made of
 * ("parts", after the Hugging Face layer prefix) and how the framework fuses
 * and splits them (rule_kind_t).  Every kind of Megatron and the engines
 * reduces to one operation: a window of a concatenation of tensor slices
 * along one dim (seg_t, window()); FSDP2's are DTensor shards
 * (framework_fsdp2.c).  The tables below are the only place that knows a
 * framework; each line is checked against the framework's own code by
 * tests/frameworks/.  The logical tensors and the parameter being emitted:
 * framework_tensors.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/fw_internal.h"

#define Q "self_attn.q_proj."
#define K "self_attn.k_proj."
#define V "self_attn.v_proj."
#define GATE_E "mlp.experts.%d.gate_proj.weight"
#define UP_E "mlp.experts.%d.up_proj.weight"
#define DOWN_E "mlp.experts.%d.down_proj.weight"

/* Megatron-Core, Transformer Engine layer specs (GPT, MLA, MoE grouped GEMM). */
static const rule_t megatron_rules[] = {
	{S_FIRST, 0, "embedding.word_embeddings.weight", R_VOCAB, {"model.embed_tokens.weight"}},
	{S_LAYER, W_GQA, "self_attention.linear_qkv.layer_norm_weight", R_REPL,
	 {"input_layernorm.weight"}},
	{S_LAYER, W_MLA, "input_layernorm.weight", R_REPL, {"input_layernorm.weight"}},
	{S_LAYER, W_GQA, "self_attention.linear_qkv.weight", R_QKV_GROUPS,
	 {Q "weight", K "weight", V "weight"}},
	{S_LAYER, W_GQA | W_BIAS, "self_attention.linear_qkv.bias", R_QKV_GROUPS,
	 {Q "bias", K "bias", V "bias"}},
	{S_LAYER, W_GQA | W_QKNORM, "self_attention.q_layernorm.weight", R_REPL,
	 {"self_attn.q_norm.weight"}},
	{S_LAYER, W_GQA | W_QKNORM, "self_attention.k_layernorm.weight", R_REPL,
	 {"self_attn.k_norm.weight"}},
	{S_LAYER, W_MLA, "self_attention.linear_q_down_proj.weight", R_REPL,
	 {"self_attn.q_a_proj.weight"}},
	{S_LAYER, W_MLA, "self_attention.linear_q_up_proj.layer_norm_weight", R_REPL,
	 {"self_attn.q_a_layernorm.weight"}},
	{S_LAYER, W_MLA, "self_attention.linear_q_up_proj.weight", R_COL,
	 {"self_attn.q_b_proj.weight"}},
	{S_LAYER, W_MLA, "self_attention.linear_kv_down_proj.weight", R_REPL,
	 {"self_attn.kv_a_proj_with_mqa.weight"}},
	{S_LAYER, W_MLA, "self_attention.linear_kv_up_proj.layer_norm_weight", R_REPL,
	 {"self_attn.kv_a_layernorm.weight"}},
	{S_LAYER, W_MLA, "self_attention.linear_kv_up_proj.weight", R_COL,
	 {"self_attn.kv_b_proj.weight"}},
	{S_LAYER, 0, "self_attention.linear_proj.weight", R_ROW, {"self_attn.o_proj.weight"}},
	{S_LAYER, W_OBIAS, "self_attention.linear_proj.bias", R_REPL, {"self_attn.o_proj.bias"}},
	{S_LAYER, W_DENSE, "mlp.linear_fc1.layer_norm_weight", R_REPL,
	 {"post_attention_layernorm.weight"}},
	{S_LAYER, W_DENSE, "mlp.linear_fc1.weight", R_CAT_TP,
	 {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
	{S_LAYER, W_DENSE, "mlp.linear_fc2.weight", R_ROW, {"mlp.down_proj.weight"}},
	{S_LAYER, W_MOE, "pre_mlp_layernorm.weight", R_REPL, {"post_attention_layernorm.weight"}},
	{S_LAYER, W_MOE, "mlp.router.weight", R_REPL, {"mlp.gate.weight"}},
	{S_LAYER, W_MOE | W_ROUTER_BIAS, "mlp.router.expert_bias", R_REPL,
	 {"mlp.gate.e_score_correction_bias"}},
	{S_LAYER, W_MOE, "mlp.experts.linear_fc1.weight%d", R_EXPERT13, {GATE_E, UP_E}},
	{S_LAYER, W_MOE, "mlp.experts.linear_fc2.weight%d", R_EXPERT2, {DOWN_E}},
	{S_LAYER, W_SHARED, "mlp.shared_experts.linear_fc1.weight", R_CAT_TP,
	 {"mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"}},
	{S_LAYER, W_SHARED, "mlp.shared_experts.linear_fc2.weight", R_ROW,
	 {"mlp.shared_experts.down_proj.weight"}},
	{S_LAST, 0, "decoder.final_layernorm.weight", R_REPL, {"model.norm.weight"}},
	{S_LAST, W_UNTIED, "output_layer.weight", R_VOCAB, {"lm_head.weight"}},
	{S_LAST, W_TIED_SPLIT, "output_layer.weight", R_VOCAB, {"model.embed_tokens.weight"}},
};

/*
 * vLLM and SGLang (whose layers follow vLLM's): model.layers.N. ...; they
 * differ in where the fused experts live (EXPERTS: the module path).
 */
#define ENGINE_RULES(EXPERTS) \
	{S_FIRST, 0, "model.embed_tokens.weight", R_VOCAB, {"model.embed_tokens.weight"}}, \
	{S_LAYER, 0, "input_layernorm.weight", R_REPL, {"input_layernorm.weight"}}, \
	{S_LAYER, W_GQA, "self_attn.qkv_proj.weight", R_QKV_RANK, \
	 {Q "weight", K "weight", V "weight"}}, \
	{S_LAYER, W_GQA | W_BIAS, "self_attn.qkv_proj.bias", R_QKV_RANK, \
	 {Q "bias", K "bias", V "bias"}}, \
	{S_LAYER, W_GQA | W_QKNORM, "self_attn.q_norm.weight", R_REPL, {"self_attn.q_norm.weight"}}, \
	{S_LAYER, W_GQA | W_QKNORM, "self_attn.k_norm.weight", R_REPL, {"self_attn.k_norm.weight"}}, \
	{S_LAYER, W_MLA, "self_attn.fused_qkv_a_proj.weight", R_CAT, \
	 {"self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"}}, \
	{S_LAYER, W_MLA, "self_attn.q_a_layernorm.weight", R_REPL, {"self_attn.q_a_layernorm.weight"}}, \
	{S_LAYER, W_MLA, "self_attn.q_b_proj.weight", R_COL, {"self_attn.q_b_proj.weight"}}, \
	{S_LAYER, W_MLA, "self_attn.kv_a_layernorm.weight", R_REPL, \
	 {"self_attn.kv_a_layernorm.weight"}}, \
	{S_LAYER, W_MLA, "self_attn.kv_b_proj.weight", R_COL, {"self_attn.kv_b_proj.weight"}}, \
	{S_LAYER, 0, "self_attn.o_proj.weight", R_ROW, {"self_attn.o_proj.weight"}}, \
	{S_LAYER, W_OBIAS, "self_attn.o_proj.bias", R_REPL, {"self_attn.o_proj.bias"}}, \
	{S_LAYER, 0, "post_attention_layernorm.weight", R_REPL, {"post_attention_layernorm.weight"}}, \
	{S_LAYER, W_DENSE, "mlp.gate_up_proj.weight", R_CAT_TP, \
	 {"mlp.gate_proj.weight", "mlp.up_proj.weight"}}, \
	{S_LAYER, W_DENSE, "mlp.down_proj.weight", R_ROW, {"mlp.down_proj.weight"}}, \
	{S_LAYER, W_MOE, "mlp.gate.weight", R_REPL, {"mlp.gate.weight"}}, \
	{S_LAYER, W_MOE | W_ROUTER_BIAS, "mlp.gate.e_score_correction_bias", R_REPL, \
	 {"mlp.gate.e_score_correction_bias"}}, \
	{S_LAYER, W_MOE, EXPERTS "w13_weight", R_EXPERTS13, {GATE_E, UP_E}}, \
	{S_LAYER, W_MOE, EXPERTS "w2_weight", R_EXPERTS2, {DOWN_E}}, \
	{S_LAYER, W_SHARED, "mlp.shared_experts.gate_up_proj.weight", R_CAT_TP, \
	 {"mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"}}, \
	{S_LAYER, W_SHARED, "mlp.shared_experts.down_proj.weight", R_ROW, \
	 {"mlp.shared_experts.down_proj.weight"}}, \
	{S_LAST, 0, "model.norm.weight", R_REPL, {"model.norm.weight"}}, \
	{S_LAST, W_UNTIED, "lm_head.weight", R_VOCAB, {"lm_head.weight"}},

/* vLLM 0.33: the MoE runner holds the experts (routed_experts) */
static const rule_t vllm_rules[] = {ENGINE_RULES("mlp.experts.routed_experts.")};
static const rule_t sglang_rules[] = {ENGINE_RULES("mlp.experts.")};

/*
 * torch FSDP2 + TP (torchtitan's plan on a Hugging Face module, verl's FSDP
 * backend): every parameter a Hugging Face tensor, a DTensor over the mesh
 * [dp][tp]: ColwiseParallel Shard(0) (FSDP on the same dim: _StridedShard
 * over dp), RowwiseParallel Shard(1), the rest replicated over TP; FSDP2
 * shards dim 0 over dp (uneven chunks, as torch).  R_VOCAB here is Shard(0)
 * without padding (torch's embedding and output plans).
 */
static const rule_t fsdp2_rules[] = {
	{S_FIRST, 0, "model.embed_tokens.weight", R_VOCAB, {"model.embed_tokens.weight"}},
	{S_LAYER, 0, "input_layernorm.weight", R_REPL, {"input_layernorm.weight"}},
	{S_LAYER, W_GQA, Q "weight", R_COL, {Q "weight"}},
	{S_LAYER, W_GQA, K "weight", R_COL, {K "weight"}},
	{S_LAYER, W_GQA, V "weight", R_COL, {V "weight"}},
	{S_LAYER, W_GQA | W_BIAS, Q "bias", R_COL, {Q "bias"}},
	{S_LAYER, W_GQA | W_BIAS, K "bias", R_COL, {K "bias"}},
	{S_LAYER, W_GQA | W_BIAS, V "bias", R_COL, {V "bias"}},
	{S_LAYER, W_GQA | W_QKNORM, "self_attn.q_norm.weight", R_REPL, {"self_attn.q_norm.weight"}},
	{S_LAYER, W_GQA | W_QKNORM, "self_attn.k_norm.weight", R_REPL, {"self_attn.k_norm.weight"}},
	{S_LAYER, W_MLA, "self_attn.q_a_proj.weight", R_REPL, {"self_attn.q_a_proj.weight"}},
	{S_LAYER, W_MLA, "self_attn.q_a_layernorm.weight", R_REPL, {"self_attn.q_a_layernorm.weight"}},
	{S_LAYER, W_MLA, "self_attn.q_b_proj.weight", R_COL, {"self_attn.q_b_proj.weight"}},
	{S_LAYER, W_MLA, "self_attn.kv_a_proj_with_mqa.weight", R_REPL,
	 {"self_attn.kv_a_proj_with_mqa.weight"}},
	{S_LAYER, W_MLA, "self_attn.kv_a_layernorm.weight", R_REPL,
	 {"self_attn.kv_a_layernorm.weight"}},
	{S_LAYER, W_MLA, "self_attn.kv_b_proj.weight", R_COL, {"self_attn.kv_b_proj.weight"}},
	{S_LAYER, 0, "self_attn.o_proj.weight", R_ROW, {"self_attn.o_proj.weight"}},
	{S_LAYER, W_OBIAS, "self_attn.o_proj.bias", R_REPL, {"self_attn.o_proj.bias"}},
	{S_LAYER, 0, "post_attention_layernorm.weight", R_REPL, {"post_attention_layernorm.weight"}},
	{S_LAYER, W_DENSE, "mlp.gate_proj.weight", R_COL, {"mlp.gate_proj.weight"}},
	{S_LAYER, W_DENSE, "mlp.up_proj.weight", R_COL, {"mlp.up_proj.weight"}},
	{S_LAYER, W_DENSE, "mlp.down_proj.weight", R_ROW, {"mlp.down_proj.weight"}},
	{S_LAYER, W_MOE, "mlp.gate.weight", R_REPL, {"mlp.gate.weight"}},
	{S_LAYER, W_MOE | W_ROUTER_BIAS, "mlp.gate.e_score_correction_bias", R_REPL,
	 {"mlp.gate.e_score_correction_bias"}},
	{S_LAYER, W_MOE, GATE_E, R_EACH, {GATE_E}},
	{S_LAYER, W_MOE, UP_E, R_EACH, {UP_E}},
	{S_LAYER, W_MOE, DOWN_E, R_EACH, {DOWN_E}},
	{S_LAYER, W_SHARED, "mlp.shared_experts.gate_proj.weight", R_COL,
	 {"mlp.shared_experts.gate_proj.weight"}},
	{S_LAYER, W_SHARED, "mlp.shared_experts.up_proj.weight", R_COL,
	 {"mlp.shared_experts.up_proj.weight"}},
	{S_LAYER, W_SHARED, "mlp.shared_experts.down_proj.weight", R_ROW,
	 {"mlp.shared_experts.down_proj.weight"}},
	{S_LAST, 0, "model.norm.weight", R_REPL, {"model.norm.weight"}},
	{S_LAST, W_UNTIED, "lm_head.weight", R_VOCAB, {"lm_head.weight"}},
};

#undef Q
#undef K
#undef V

static const struct fw_desc {
	const char *name;
	const rule_t *rules;
	size_t nrules;
	const char *layer_prefix;  /* printf format, the layer number */
	bool local_layers;         /* layer numbers restart on every PP stage */
	int64_t vocab_multiple;    /* padded vocabulary: a multiple of this ... */
	bool vocab_times_tp;       /* ... times tp (Megatron) */
} fw_descs[PLAN_FW_COUNT] = {
	[PLAN_FW_MEGATRON] = {"megatron", megatron_rules,
			      sizeof(megatron_rules) / sizeof(megatron_rules[0]),
			      "decoder.layers.%" PRId64 ".", true, 128, true},
	[PLAN_FW_VLLM] = {"vllm", vllm_rules, sizeof(vllm_rules) / sizeof(vllm_rules[0]),
			  "model.layers.%" PRId64 ".", false, 64, false},
	[PLAN_FW_SGLANG] = {"sglang", sglang_rules, sizeof(sglang_rules) / sizeof(sglang_rules[0]),
			    "model.layers.%" PRId64 ".", false, 64, false},
	[PLAN_FW_FSDP2] = {"fsdp2", fsdp2_rules, sizeof(fsdp2_rules) / sizeof(fsdp2_rules[0]),
			   "model.layers.%" PRId64 ".", false, 1, false},
};

refit_status_t
plan_fw_parse(const char *s, plan_fw_t *out, refit_err_t *err)
{
	for (int f = 0; f < PLAN_FW_COUNT; f++) {
		if (strcmp(s, fw_descs[f].name) == 0) {
			*out = (plan_fw_t)f;
			return REFIT_OK;
		}
	}
	if (strcmp(s, "megatron-core") == 0 || strcmp(s, "mcore") == 0) {
		*out = PLAN_FW_MEGATRON;
		return REFIT_OK;
	}
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "framework \"%s\": expected megatron, "
			     "fsdp2, vllm or sglang", s);
}

const char *
plan_fw_name(plan_fw_t fw)
{
	return fw >= 0 && fw < PLAN_FW_COUNT ? fw_descs[fw].name : "?";
}

bool
plan_fw_trains(plan_fw_t fw)
{
	return fw == PLAN_FW_MEGATRON || fw == PLAN_FW_FSDP2;
}

/*
 * Emit the window [w0, w0 + shape[pd]) of the concatenation of segs along
 * the current parameter's dim pd; each segment slices its tensor's dim td,
 * whose other dims map onto the parameter's trailing dims; leading
 * parameter dims sit at index `lead`.
 */
static void
window(fwgen_t *g, int td, const seg_t *s, size_t n, int64_t w0, int64_t lead)
{
	plan_fw_param_t *p = &g->m->params.v[g->m->params.n - 1];
	int64_t pos = 0, w1;
	int tnd = p->ndim, shift, pd;

	for (size_t i = 0; i < n; i++)
		if (s[i].t >= 0)
			tnd = fw_T(g, s[i].t)->ndim;
	shift = p->ndim - tnd;
	pd = td + shift;
	w1 = w0 + p->shape[pd];
	for (size_t i = 0; i < n; pos += s[i].len, i++) {
		int64_t a = pos > w0 ? pos : w0, b = pos + s[i].len < w1 ? pos + s[i].len : w1;

		if (a >= b)
			continue;
		if (s[i].t < 0) {
			plan_box_t pad = {0};

			for (int d = 0; d < p->ndim; d++) {
				pad.off[d] = d < shift ? lead : 0;
				pad.size[d] = d < shift ? 1 : p->shape[d];
			}
			pad.off[pd] = a - w0;
			pad.size[pd] = b - a;
			VEC_PUSH(&g->m->pads, pad);
			p->npads++;
		} else {
			plan_fw_piece_t pc = {0};

			pc.tensor = s[i].t;
			plan_box_full(&pc.box, fw_T(g, s[i].t)->shape, tnd);
			pc.box.off[td] = s[i].lo + (a - pos);
			pc.box.size[td] = b - a;
			for (int d = 0; d < shift; d++)
				pc.at[d] = lead;
			pc.at[pd] = a - w0;
			VEC_PUSH(&g->m->pieces, pc);
			p->npieces++;
		}
	}
}

static refit_status_t
indivisible(fwgen_t *g, const char *what, int64_t n, const char *by, int64_t k)
{
	return refit_err_set(g->err, REFIT_ERR_INVALID_ARG, "%s cannot place \"%s\": %s (%" PRId64
			     ") is not divisible by %s (%" PRId64 ")", g->d->name, g->a->name,
			     what, n, by, k);
}

/* The current parameter's name for rule r (local expert k, or -1). */
static void
param_name(const fwgen_t *g, const rule_t *r, int64_t k, char *buf, size_t n)
{
	char suffix[160];

	if (k >= 0)
		snprintf(suffix, sizeof(suffix), r->param, (int)k);
	else
		snprintf(suffix, sizeof(suffix), "%s", r->param);
	snprintf(buf, n, "%s%s", r->scope == S_LAYER ? g->fw_prefix : "", suffix);
}

/*
 * The engine's block scales of an fp8 parameter (weight_scale_inv) made of
 * segs along tensor dim td: each part's blocks follow the previous part's
 * (ceil-divided per part, as vLLM's adjust_block_scale_shard), the other
 * dims ceil-divided.  A window that is a TP split of one part must start
 * and end on block boundaries (the engines refuse other splits).
 */
static refit_status_t
emit_scale(fwgen_t *g, const char *wname, int td, const seg_t *s, size_t n, int64_t w0,
	   int64_t rows, int64_t lead, int64_t nlead)
{
	int64_t B = g->m->fp8_block, total = 0, rows2 = 0, w2 = 0;
	int64_t shape[PLAN_MAX_DIMS] = {0};
	seg_t s2[MAX_SEGS];
	char name[300];
	const plan_fw_tensor_t *st = NULL;
	int shift;

	for (size_t i = 0; i < n; i++) {
		const plan_fw_tensor_t *t;

		if (s[i].t < 0) /* no rule pads a projection: our bug */
			abort();
		t = fw_T(g, s[i].t);
		total += s[i].len;
		if (s[i].lo % B != 0)
			return refit_err_set(g->err, REFIT_ERR_INVALID_ARG, "%s cannot place \"%s\" "
					     "in fp8 blocks of %" PRId64 ": %s's share starts at row %"
					     PRId64 ", inside a block", g->d->name, g->a->name, B,
					     t->name, s[i].lo);
		s2[i] = (seg_t){t->scale, s[i].lo / B, (s[i].len + B - 1) / B};
		rows2 += s2[i].len;
		st = fw_T(g, t->scale);
	}
	if (w0 != 0 || rows != total) { /* a TP split of one part */
		if (n != 1 || w0 % B != 0 || rows % B != 0)
			return refit_err_set(g->err, REFIT_ERR_INVALID_ARG, "%s cannot place \"%s\" "
					     "in fp8 blocks of %" PRId64 ": %s splits into %" PRId64
					     " rows a rank, not whole blocks", g->d->name, g->a->name, B,
					     wname, rows);
		w2 = w0 / B;
		rows2 = rows / B;
	}
	shift = (int)nlead;
	for (int d = 0; d < st->ndim; d++)
		shape[d + shift] = st->shape[d];
	for (int d = 0; d < shift; d++)
		shape[d] = g->m->params.v[g->m->params.n - 1].shape[d];
	shape[td + shift] = rows2;
	snprintf(name, sizeof(name), "%s_scale_inv", wname);
	if (lead <= 0)
		fw_param_begin(g, name, st->dtype, st->ndim + shift, shape);
	window(g, td, s2, n, w2, lead < 0 ? 0 : lead);
	return REFIT_OK;
}

/* A parameter made of one window over segs, shaped like tensor t with dim
 * td set to `rows` (and its block scales when t is stored in fp8). */
static refit_status_t
emit(fwgen_t *g, const rule_t *r, int32_t t, int td, int64_t rows, const seg_t *s, size_t n,
     int64_t w0)
{
	int64_t shape[PLAN_MAX_DIMS];
	char name[256];

	memcpy(shape, fw_T(g, t)->shape, sizeof(shape));
	shape[td] = rows;
	param_name(g, r, -1, name, sizeof(name));
	fw_param_begin(g, name, fw_T(g, t)->dtype, fw_T(g, t)->ndim, shape);
	window(g, td, s, n, w0, 0);
	if (fw_T(g, t)->scale < 0)
		return REFIT_OK;
	return emit_scale(g, name, td, s, n, w0, rows, -1, 0);
}

static refit_status_t
rule_split(fwgen_t *g, const rule_t *r, int td)
{
	int32_t t = fw_part(g, r, 0, -1);
	int64_t n = fw_T(g, t)->shape[td], tp = g->par->tp;
	seg_t s = {t, 0, n};

	if (n % tp != 0)
		return indivisible(g, fw_T(g, t)->name, n, "tp", tp);
	return emit(g, r, t, td, n / tp, &s, 1, g->tpr * (n / tp));
}

static refit_status_t
rule_vocab(fwgen_t *g, const rule_t *r)
{
	int32_t t = fw_part(g, r, 0, -1);
	int64_t v = fw_T(g, t)->shape[0], tp = g->par->tp;
	int64_t mult = g->d->vocab_multiple * (g->d->vocab_times_tp ? tp : 1);
	int64_t vp = (v + mult - 1) / mult * mult;
	seg_t s[2] = {{t, 0, v}, {-1, 0, vp - v}};

	if (vp % tp != 0)
		return indivisible(g, "the padded vocabulary", vp, "tp", tp);
	return emit(g, r, t, 0, vp / tp, s, 2, g->tpr * (vp / tp));
}

/* R_CAT (whole parts) and R_CAT_TP (each part's TP slice) on dim 0. */
static refit_status_t
rule_cat(fwgen_t *g, const rule_t *r, bool split)
{
	seg_t s[3];
	size_t n = 0;
	int64_t rows = 0, tp = split ? g->par->tp : 1, tpr = split ? g->tpr : 0;

	for (; n < 3 && r->parts[n]; n++) {
		int32_t t = fw_part(g, r, (int)n, -1);
		int64_t len = fw_T(g, t)->shape[0];

		if (len % tp != 0)
			return indivisible(g, fw_T(g, t)->name, len, "tp", tp);
		s[n] = (seg_t){t, tpr * (len / tp), len / tp};
		rows += len / tp;
	}
	return emit(g, r, s[0].t, 0, rows, s, n, 0);
}

/* Megatron: the query groups' [q_g; k_g; v_g] blocks, split evenly. */
static refit_status_t
rule_qkv_groups(fwgen_t *g, const rule_t *r)
{
	const plan_arch_t *a = g->a;
	int32_t q = fw_part(g, r, 0, -1), k = fw_part(g, r, 1, -1), v = fw_part(g, r, 2, -1);
	int64_t hd = a->head_dim, hpg, total = (a->heads + 2 * a->kv_heads) * hd, tp = g->par->tp;
	seg_t s[MAX_SEGS];
	size_t n = 0;

	if (a->heads % a->kv_heads != 0)
		return indivisible(g, "heads", a->heads, "kv_heads", a->kv_heads);
	if (3 * a->kv_heads > MAX_SEGS)
		return refit_err_set(g->err, REFIT_ERR_INVALID_ARG, "%s: %" PRId64 " query groups "
				     "is more than refit handles (%d)", a->name, a->kv_heads,
				     MAX_SEGS / 3);
	/* Megatron: groups divisible by tp, or tp by groups (one group's
	 * [q; k; v] split over tp / groups ranks, nothing replicated) */
	if (a->kv_heads % tp != 0 && tp % a->kv_heads != 0)
		return indivisible(g, "query groups (kv_heads)", a->kv_heads, "tp", tp);
	if (a->heads % tp != 0)
		return indivisible(g, "heads", a->heads, "tp", tp);
	if (total % tp != 0)
		return indivisible(g, "linear_qkv rows", total, "tp", tp);
	hpg = a->heads / a->kv_heads;
	for (int64_t grp = 0; grp < a->kv_heads; grp++) {
		s[n++] = (seg_t){q, grp * hpg * hd, hpg * hd};
		s[n++] = (seg_t){k, grp * hd, hd};
		s[n++] = (seg_t){v, grp * hd, hd};
	}
	return emit(g, r, q, 0, total / tp, s, n, g->tpr * (total / tp));
}

/* vLLM: [q_r; k_r; v_r], each KV head on tp / kv_heads ranks when fewer. */
static refit_status_t
rule_qkv_rank(fwgen_t *g, const rule_t *r)
{
	const plan_arch_t *a = g->a;
	int32_t q = fw_part(g, r, 0, -1), k = fw_part(g, r, 1, -1), v = fw_part(g, r, 2, -1);
	int64_t hd = a->head_dim, tp = g->par->tp, kvh, kv0;
	seg_t s[3];

	if (a->heads % tp != 0)
		return indivisible(g, "heads", a->heads, "tp", tp);
	if (a->kv_heads >= tp) {
		if (a->kv_heads % tp != 0)
			return indivisible(g, "kv_heads", a->kv_heads, "tp", tp);
		kvh = a->kv_heads / tp;
		kv0 = g->tpr * kvh;
	} else {
		if (tp % a->kv_heads != 0)
			return indivisible(g, "tp", tp, "kv_heads", a->kv_heads);
		kvh = 1;
		kv0 = g->tpr / (tp / a->kv_heads);
	}
	s[0] = (seg_t){q, g->tpr * (a->heads / tp) * hd, a->heads / tp * hd};
	s[1] = (seg_t){k, kv0 * hd, kvh * hd};
	s[2] = (seg_t){v, kv0 * hd, kvh * hd};
	return emit(g, r, q, 0, s[0].len + 2 * s[1].len, s, 3, 0);
}

/* Megatron's expert TP: given, or tp (its default) */
static int64_t
etp_of(const plan_par_t *p)
{
	return p->etp ? p->etp : p->tp;
}

/* The experts a rank holds and the expert-TP split of I: vLLM and SGLang
 * split experts over the instance's ranks when ep > 1 (whole experts),
 * else split I over tp; Megatron over its expert ranks (etp splits I). */
static refit_status_t
expert_range(fwgen_t *g, int64_t *e0, int64_t *ne, int64_t *itp, int64_t *itr)
{
	const plan_arch_t *a = g->a;
	const plan_par_t *p = g->par;
	bool engine = g->m->fw != PLAN_FW_MEGATRON;
	int64_t ep = p->ep, split = engine ? p->tp / ep : etp_of(p);

	if (a->experts % ep != 0)
		return indivisible(g, "experts", a->experts, "ep", ep);
	if (a->expert_intermediate % split != 0)
		return indivisible(g, "expert_intermediate", a->expert_intermediate,
				   engine ? "tp" : "etp", split);
	*ne = a->experts / ep;
	*e0 = g->epr * *ne;
	*itp = a->expert_intermediate / split;
	*itr = engine ? g->tpr % split : g->etpr;
	return REFIT_OK;
}

/* The segments of local expert k's parameter (gate and up, or down). */
static size_t
expert_segs(fwgen_t *g, const rule_t *r, int64_t e, int64_t itp, int64_t itr, seg_t *s)
{
	s[0] = (seg_t){fw_part(g, r, 0, e), itr * itp, itp};
	if (r->kind != R_EXPERTS13 && r->kind != R_EXPERT13)
		return 1;
	s[1] = (seg_t){fw_part(g, r, 1, e), itr * itp, itp};
	return 2;
}

static refit_status_t
rule_experts(fwgen_t *g, const rule_t *r)
{
	int64_t e0 = 0, ne = 0, itp = 0, itr = 0, H = g->a->hidden;
	bool up = r->kind == R_EXPERTS13 || r->kind == R_EXPERT13;
	bool stacked = r->kind == R_EXPERTS13 || r->kind == R_EXPERTS2;
	int td = up ? 0 : 1;
	char name[256];
	seg_t s[2];
	size_t n;

	CHECK(expert_range(g, &e0, &ne, &itp, &itr));
	for (int64_t k = 0; k < ne; k++) {
		n = expert_segs(g, r, e0 + k, itp, itr, s);
		if (!stacked || k == 0) {
			int64_t sh[3] = {ne, up ? 2 * itp : H, up ? H : itp};

			param_name(g, r, stacked ? -1 : k, name, sizeof(name));
			fw_param_begin(g, name, fw_T(g, s[0].t)->dtype, stacked ? 3 : 2,
				    stacked ? sh : sh + 1);
		}
		window(g, td, s, n, 0, stacked ? k : 0);
	}
	if (!stacked || ne == 0 || fw_T(g, s[0].t)->scale < 0)
		return REFIT_OK;
	for (int64_t k = 0; k < ne; k++) { /* the stacked block scales */
		n = expert_segs(g, r, e0 + k, itp, itr, s);
		CHECK(emit_scale(g, name, td, s, n, 0, (int64_t)n * itp, k, 1));
	}
	return REFIT_OK;
}

static refit_status_t
rule_apply(fwgen_t *g, const rule_t *r)
{
	if (g->m->fw == PLAN_FW_FSDP2)
		return fw_rule_fsdp2(g, r);
	switch (r->kind) {
	case R_REPL: {
		int32_t t = fw_part(g, r, 0, -1);
		seg_t s = {t, 0, fw_T(g, t)->shape[0]};

		return emit(g, r, t, 0, s.len, &s, 1, 0);
	}
	case R_COL: return rule_split(g, r, 0);
	case R_ROW: return rule_split(g, r, 1);
	case R_VOCAB: return rule_vocab(g, r);
	case R_CAT: return rule_cat(g, r, false);
	case R_CAT_TP: return rule_cat(g, r, true);
	case R_QKV_GROUPS: return rule_qkv_groups(g, r);
	case R_QKV_RANK: return rule_qkv_rank(g, r);
	default: return rule_experts(g, r);
	}
}

/* The conditions that hold for layer l (or a global rule when l < 0). */
static unsigned
conditions(const fwgen_t *g, int64_t l, bool first, bool last)
{
	const plan_arch_t *a = g->a;
	bool moe = a->experts > 0 && l >= a->first_dense_layers;
	unsigned w = a->q_lora_rank > 0 ? W_MLA : W_GQA;

	w |= a->qk_norm ? W_QKNORM : 0;
	w |= a->qkv_bias ? W_BIAS : 0;
	w |= a->o_bias ? W_OBIAS : 0;
	w |= moe ? W_MOE : W_DENSE;
	w |= moe && a->shared_experts > 0 ? W_SHARED : 0;
	w |= moe && a->router_bias ? W_ROUTER_BIAS : 0;
	w |= a->tie_embeddings ? 0 : W_UNTIED;
	w |= a->tie_embeddings && !(first && last) ? W_TIED_SPLIT : 0;
	return w;
}

static refit_status_t
rules_scope(fwgen_t *g, scope_t sc, bool first, bool last)
{
	for (size_t i = 0; i < g->d->nrules; i++) {
		const rule_t *r = &g->d->rules[i];

		if (r->scope != sc || (r->when & ~conditions(g, g->layer, first, last)) != 0)
			continue;
		CHECK(rule_apply(g, r));
	}
	return REFIT_OK;
}

/* Every parameter of one rank. */
static refit_status_t
gen_rank(fwgen_t *g, int32_t rank)
{
	const plan_par_t *p = g->par;
	int64_t per_stage = p->tp * p->dp, stage = rank / per_stage, s = rank % per_stage;
	int64_t per = (g->a->layers + p->pp - 1) / p->pp;
	int64_t l1 = (stage + 1) * per < g->a->layers ? (stage + 1) * per : g->a->layers;
	bool first = stage == 0, last = stage == p->pp - 1;

	g->rank = rank;
	g->tpr = rank % p->tp;
	if (g->m->fw == PLAN_FW_MEGATRON) {
		g->etpr = s % etp_of(p);
		g->epr = (s / etp_of(p)) % p->ep;
	} else { /* SGLang: moe_ep_rank = tp_rank / (tp / ep) */
		g->etpr = 0;
		g->epr = g->tpr / (p->tp / p->ep);
	}
	g->layer = -1;
	if (first)
		CHECK(rules_scope(g, S_FIRST, first, last));
	for (int64_t l = stage * per; l < l1; l++) {
		g->layer = l;
		snprintf(g->hf_prefix, sizeof(g->hf_prefix), "model.layers.%" PRId64 ".", l);
		snprintf(g->fw_prefix, sizeof(g->fw_prefix), g->d->layer_prefix,
			 g->d->local_layers ? l - stage * per : l);
		CHECK(rules_scope(g, S_LAYER, first, last));
	}
	g->layer = -1;
	if (last)
		CHECK(rules_scope(g, S_LAST, first, last));
	return REFIT_OK;
}

static refit_status_t
check_par(const plan_arch_t *a, plan_fw_t fw, const plan_par_t *p, refit_err_t *err)
{
	const char *n = plan_fw_name(fw);

	if (fw == PLAN_FW_FSDP2) {
		if (p->pp != 1 || p->ep != 1 || p->etp > 1)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: dpN,tpN (a [dp][tp] "
					     "mesh): pp and ep are not mapped", n);
		return REFIT_OK;
	}
	if (fw == PLAN_FW_MEGATRON) {
		int64_t per = (a->layers + p->pp - 1) / p->pp;

		/* uneven: the first stages full, the last one the rest (Megatron's
		 * decoder_last_pipeline_num_layers) */
		if ((p->pp - 1) * per >= a->layers)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: %" PRId64 " layers "
					     "leave the last of pp%" PRId64 " stages empty (%"
					     PRId64 " a stage)", n, a->layers, p->pp, per);
		if ((p->tp * p->dp) % (p->ep * etp_of(p)) != 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: ep%" PRId64 " x etp%"
					     PRId64 " does not divide tp%" PRId64 " x dp%" PRId64,
					     n, p->ep, etp_of(p), p->tp, p->dp);
		return REFIT_OK;
	}
	if (p->pp != 1)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: pp is not supported (DP "
				     "instances of TP, optionally ep = tp)", n);
	if (fw == PLAN_FW_VLLM && p->ep > 1 && p->ep != p->tp)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: ep%" PRId64 " must equal tp%"
				     PRId64 " (experts split over the instance's ranks)", n, p->ep,
				     p->tp);
	if (p->tp % p->ep != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: ep%" PRId64 " must divide tp%"
				     PRId64 " (experts split over the instance's ranks, the rest "
				     "of tp splitting each expert)", n, p->ep, p->tp);
	if (fw == PLAN_FW_VLLM && a->qwen2_head_dim && a->head_dim != a->hidden / a->heads)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: head_dim %" PRId64 " is not "
				     "hidden / heads (%" PRId64 "): vLLM's Qwen2 assumes it is and "
				     "would load the checkpoint wrong", n, a->head_dim,
				     a->hidden / a->heads);
	if (p->etp > 1)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: etp is Megatron's; an "
				     "engine splits experts over tp (or ep = tp)", n);
	if (a->q_lora_rank == 0 && a->kv_heads == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: no kv_heads", n);
	return REFIT_OK;
}

refit_status_t
plan_fw_map_build(plan_fw_map_t *m, const plan_arch_t *a, plan_fw_t fw, const plan_par_t *par,
		  int64_t fp8_block, refit_err_t *err)
{
	fwgen_t g = {m, &fw_descs[fw], a, par, {0}, err, 0, 0, 0, 0, -1, "", "", {0}};
	refit_status_t rc = REFIT_OK;

	memset(m, 0, sizeof(*m));
	m->fw = fw;
	if (fw < 0 || fw >= PLAN_FW_COUNT)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "framework %d: unknown", (int)fw);
	CHECK(check_par(a, fw, par, err));
	if (fp8_block < 0 || fp8_block > (1 << 16) || (fp8_block > 0 && plan_fw_trains(fw)))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: fp8 block %" PRId64 ": an "
				     "engine stores fp8 with a positive block; a trainer keeps "
				     "its dtype", plan_fw_name(fw), fp8_block);
	m->fp8_block = fp8_block;
	m->world = plan_par_world(par);
	if (m->world > PLAN_MAX_RANK_ID)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: %" PRId64 " ranks is too "
				     "many", plan_fw_name(fw), m->world);
	m->rank0 = xcalloc((size_t)m->world + 1, sizeof(*m->rank0));
	strmap_init(&g.ids);
	for (int32_t r = 0; r < m->world && rc == REFIT_OK; r++) {
		m->rank0[r] = m->params.n;
		rc = gen_rank(&g, r);
	}
	m->rank0[m->world] = m->params.n;
	strmap_fini(&g.ids);
	fw_fsdp2_fini(&g);
	if (rc != REFIT_OK) {
		plan_fw_map_fini(m);
		m->fw = fw;
	}
	return rc;
}

void
plan_fw_map_fini(plan_fw_map_t *m)
{
	if (m == NULL)
		return;
	for (size_t i = 0; i < m->tensors.n; i++)
		free(m->tensors.v[i].name);
	for (size_t i = 0; i < m->params.n; i++)
		free(m->params.v[i].name);
	VEC_FREE(&m->tensors);
	VEC_FREE(&m->params);
	VEC_FREE(&m->pieces);
	VEC_FREE(&m->pads);
	free(m->rank0);
	memset(m, 0, sizeof(*m));
}

void
plan_fw_map_bytes(const plan_fw_map_t *m, plan_fw_bytes_t *out)
{
	memset(out, 0, sizeof(*out));
	out->nparams = m->params.n;
	out->npieces = m->pieces.n;
	for (size_t i = 0; i < m->params.n; i++) {
		const plan_fw_param_t *p = &m->params.v[i];
		uint64_t es = plan_dtype_size(p->dtype);
		int64_t vol = 1;

		for (int d = 0; d < p->ndim; d++)
			vol *= p->shape[d];
		out->params += (uint64_t)vol * es;
		for (size_t k = 0; k < p->npieces; k++) {
			const plan_fw_piece_t *pc = &m->pieces.v[p->piece0 + k];

			out->pieces += (uint64_t)plan_box_volume(&pc->box,
								 m->tensors.v[pc->tensor].ndim) * es;
		}
		for (size_t k = 0; k < p->npads; k++)
			out->padding += (uint64_t)plan_box_volume(&m->pads.v[p->pad0 + k], p->ndim) *
					es;
	}
}
