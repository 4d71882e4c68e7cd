/*
 * test_framework.c - the frameworks' memory maps (plan/framework.h): the
 * rules on small models checked element by element against what the
 * frameworks do (the frameworks' own code checks them again in
 * tests/frameworks/), the map checker, and framework layouts planned.
 */
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "tests/unit/helpers.h"

/* heads 8, kv 2 (4 per group), head_dim 4, hidden 8, intermediate 16, vocab 250 */
static void
tiny(plan_arch_t *a, int64_t experts)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->name, sizeof(a->name), "tiny");
	a->hidden = 8;
	a->layers = 2;
	a->vocab = 250;
	a->heads = 8;
	a->kv_heads = 2;
	a->head_dim = 4;
	a->intermediate = 16;
	a->experts = experts;
	a->expert_intermediate = experts ? 8 : 0;
	a->dtype = PLAN_DT_BF16;
}

static void
build(plan_fw_map_t *m, const plan_arch_t *a, plan_fw_t fw, const char *par)
{
	plan_par_t p;
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_int_eq(plan_par_parse(par, fw == PLAN_FW_MEGATRON, &p, &e), REFIT_OK);
	ck_assert_msg(plan_fw_map_build(m, a, fw, &p, 0, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_msg(plan_fw_map_check(m, &e) == REFIT_OK, "%s", e.msg);
}

static const plan_fw_param_t *
param(const plan_fw_map_t *m, int32_t rank, const char *name)
{
	for (size_t i = m->rank0[rank]; i < m->rank0[rank + 1]; i++)
		if (strcmp(m->params.v[i].name, name) == 0)
			return &m->params.v[i];
	ck_abort_msg("rank %d has no parameter %s", rank, name);
	return NULL;
}

/* piece k of p: tensor name, rows [lo, lo + n) of it, at row `at` */
static void
piece_is(const plan_fw_map_t *m, const plan_fw_param_t *p, size_t k, const char *tensor,
	 int64_t lo, int64_t n, int64_t at)
{
	const plan_fw_piece_t *pc;

	ck_assert_uint_gt(p->npieces, k);
	pc = &m->pieces.v[p->piece0 + k];
	ck_assert_str_eq(m->tensors.v[pc->tensor].name, tensor);
	ck_assert_int_eq(pc->box.off[0], lo);
	ck_assert_int_eq(pc->box.size[0], n);
	ck_assert_int_eq(pc->at[0], at);
}

/* vLLM, tp 8 > 2 KV heads: rank r holds query head r and KV head r / 4. */
START_TEST(vllm_qkv_replicated)
{
	plan_arch_t a;
	plan_fw_map_t m;
	const plan_fw_param_t *p;

	tiny(&a, 0);
	build(&m, &a, PLAN_FW_VLLM, "tp8");
	for (int32_t r = 0; r < 8; r++) {
		p = param(&m, r, "model.layers.1.self_attn.qkv_proj.weight");
		ck_assert_int_eq(p->shape[0], 12);
		ck_assert_int_eq(p->shape[1], 8);
		ck_assert_uint_eq(p->npieces, 3);
		piece_is(&m, p, 0, "model.layers.1.self_attn.q_proj.weight", 4 * r, 4, 0);
		piece_is(&m, p, 1, "model.layers.1.self_attn.k_proj.weight", 4 * (r / 4), 4, 4);
		piece_is(&m, p, 2, "model.layers.1.self_attn.v_proj.weight", 4 * (r / 4), 4, 8);
	}
	/* gate_up_proj is [gate_r; up_r] */
	p = param(&m, 3, "model.layers.0.mlp.gate_up_proj.weight");
	piece_is(&m, p, 0, "model.layers.0.mlp.gate_proj.weight", 6, 2, 0);
	piece_is(&m, p, 1, "model.layers.0.mlp.up_proj.weight", 6, 2, 2);
	plan_fw_map_fini(&m);
}
END_TEST

/* Megatron, tp 2: rank r holds query group r as [q_g; k_g; v_g]. */
START_TEST(megatron_qkv_interleaved)
{
	plan_arch_t a;
	plan_fw_map_t m;
	plan_par_t p;
	refit_err_t e;
	const plan_fw_param_t *qkv;

	tiny(&a, 0);
	build(&m, &a, PLAN_FW_MEGATRON, "tp2,pp2");
	ck_assert_int_eq(m.world, 4);
	/* rank 3: stage 1, tp rank 1; layer 1 is the stage's layer 0 */
	qkv = param(&m, 3, "decoder.layers.0.self_attention.linear_qkv.weight");
	ck_assert_uint_eq(qkv->npieces, 3);
	piece_is(&m, qkv, 0, "model.layers.1.self_attn.q_proj.weight", 16, 16, 0);
	piece_is(&m, qkv, 1, "model.layers.1.self_attn.k_proj.weight", 4, 4, 16);
	piece_is(&m, qkv, 2, "model.layers.1.self_attn.v_proj.weight", 4, 4, 20);
	/* the last stage holds the output layer, the first the embedding */
	param(&m, 3, "output_layer.weight");
	param(&m, 1, "embedding.word_embeddings.weight");
	plan_fw_map_fini(&m);
	/* fewer query groups than tp: a group's [q; k; v] split over ranks */
	build(&m, &a, PLAN_FW_MEGATRON, "tp4");
	qkv = param(&m, 1, "decoder.layers.0.self_attention.linear_qkv.weight");
	ck_assert_int_eq(qkv->shape[0], 12);
	piece_is(&m, qkv, 0, "model.layers.0.self_attn.q_proj.weight", 12, 4, 0);
	piece_is(&m, qkv, 1, "model.layers.0.self_attn.k_proj.weight", 0, 4, 4);
	piece_is(&m, qkv, 2, "model.layers.0.self_attn.v_proj.weight", 0, 4, 8);
	plan_fw_map_fini(&m);
	ck_assert_int_eq(plan_par_parse("tp3", true, &p, NULL), REFIT_OK);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_fw_map_build(&m, &a, PLAN_FW_MEGATRON, &p, 0, &e),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "megatron cannot place \"tiny\": query groups (kv_heads) (2) is "
			 "not divisible by tp (3)");
	plan_fw_map_fini(&m);
}
END_TEST

/* Padded vocabularies: vLLM to 64 then split, Megatron to 128 * tp. */
START_TEST(vocab_padding)
{
	plan_arch_t a;
	plan_fw_map_t m;
	const plan_fw_param_t *p;

	tiny(&a, 0);
	build(&m, &a, PLAN_FW_VLLM, "tp4");
	p = param(&m, 3, "lm_head.weight");
	ck_assert_int_eq(p->shape[0], 64);
	piece_is(&m, p, 0, "lm_head.weight", 192, 58, 0);
	ck_assert_uint_eq(p->npads, 1);
	ck_assert_int_eq(m.pads.v[p->pad0].off[0], 58);
	ck_assert_int_eq(m.pads.v[p->pad0].size[0], 6);
	plan_fw_map_fini(&m);
	build(&m, &a, PLAN_FW_MEGATRON, "tp2");
	p = param(&m, 1, "embedding.word_embeddings.weight");
	ck_assert_int_eq(p->shape[0], 128);
	piece_is(&m, p, 0, "model.embed_tokens.weight", 128, 122, 0);
	ck_assert_int_eq(m.pads.v[p->pad0].size[0], 6);
	plan_fw_map_fini(&m);
	/* tied embeddings: no lm_head on an engine; Megatron's last stage
	 * keeps its copy of the embedding as output_layer */
	a.tie_embeddings = true;
	build(&m, &a, PLAN_FW_MEGATRON, "tp1,pp2");
	p = param(&m, 1, "output_layer.weight");
	piece_is(&m, p, 0, "model.embed_tokens.weight", 0, 250, 0);
	plan_fw_map_fini(&m);
}
END_TEST

/* Fused MoE: w13 [E_local, 2 I_tp, H], gate first; EP splits experts. */
START_TEST(moe_experts)
{
	plan_arch_t a;
	plan_fw_map_t m;
	const plan_fw_param_t *p;
	const plan_fw_piece_t *pc;

	tiny(&a, 4);
	build(&m, &a, PLAN_FW_VLLM, "tp2");
	p = param(&m, 1, "model.layers.0.mlp.experts.routed_experts.w13_weight");
	ck_assert_int_eq(p->ndim, 3);
	ck_assert(p->shape[0] == 4 && p->shape[1] == 8 && p->shape[2] == 8);
	ck_assert_uint_eq(p->npieces, 8);
	pc = &m.pieces.v[p->piece0 + 3];  /* expert 1's up half of rank 1 */
	ck_assert_str_eq(m.tensors.v[pc->tensor].name, "model.layers.0.mlp.experts.1.up_proj.weight");
	ck_assert(pc->at[0] == 1 && pc->at[1] == 4 && pc->box.off[0] == 4 && pc->box.size[0] == 4);
	plan_fw_map_fini(&m);
	build(&m, &a, PLAN_FW_VLLM, "tp2,ep2");
	p = param(&m, 1, "model.layers.1.mlp.experts.routed_experts.w2_weight");
	ck_assert(p->shape[0] == 2 && p->shape[1] == 8 && p->shape[2] == 8);
	pc = &m.pieces.v[p->piece0];
	ck_assert_str_eq(m.tensors.v[pc->tensor].name,
			 "model.layers.1.mlp.experts.2.down_proj.weight");
	plan_fw_map_fini(&m);
	/* Megatron: one parameter per local expert, experts over EP ranks */
	build(&m, &a, PLAN_FW_MEGATRON, "tp1,dp2,ep2");
	p = param(&m, 1, "decoder.layers.0.mlp.experts.linear_fc1.weight1");
	piece_is(&m, p, 0, "model.layers.0.mlp.experts.3.gate_proj.weight", 0, 8, 0);
	piece_is(&m, p, 1, "model.layers.0.mlp.experts.3.up_proj.weight", 0, 8, 8);
	plan_fw_map_fini(&m);
}
END_TEST

/* The checker refuses overlapping or missing pieces, naming the parameter. */
START_TEST(check_refuses)
{
	plan_arch_t a;
	plan_fw_map_t m;
	plan_fw_param_t *p;
	refit_err_t e;

	tiny(&a, 0);
	build(&m, &a, PLAN_FW_VLLM, "tp2");
	p = &m.params.v[m.rank0[1] + 2]; /* rank 1's qkv_proj */
	ck_assert_str_eq(p->name, "model.layers.0.self_attn.qkv_proj.weight");
	m.pieces.v[p->piece0 + 1].at[0] -= 1; /* k over the end of q */
	refit_err_clear(&e);
	ck_assert_int_eq(plan_fw_map_check(&m, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_msg(strstr(e.msg, "\"model.layers.0.self_attn.qkv_proj.weight\" (rank 1)") &&
		      strstr(e.msg, "overlaps"), "%s", e.msg);
	m.pieces.v[p->piece0 + 1].at[0] += 1;
	p->npieces--; /* v missing */
	refit_err_clear(&e);
	ck_assert_int_eq(plan_fw_map_check(&m, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_msg(strstr(e.msg, "cover 160 of its 192 elements"), "%s", e.msg);
	p->npieces++;
	ck_assert_int_eq(plan_fw_map_check(&m, &e), REFIT_OK);
	plan_fw_map_fini(&m);
}
END_TEST

/* Megatron -> two vLLM instances: layouts match by name, the plan validates,
 * and every byte both sides hold moves. */
START_TEST(layouts_plan)
{
	plan_arch_t a;
	plan_fw_map_t tm, im;
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_opts_t o;
	plan_t p;
	plan_check_t chk;
	refit_err_t e;

	tiny(&a, 4);
	a.qkv_bias = a.qk_norm = true;
	build(&tm, &a, PLAN_FW_MEGATRON, "tp2,pp2,dp2,ep2");
	build(&im, &a, PLAN_FW_VLLM, "tp8,dp2");
	refit_err_clear(&e);
	ck_assert_int_eq(plan_fw_map_layouts(&tm, 0, &s, &e), REFIT_OK);
	ck_assert_int_eq(plan_fw_map_layouts(&im, 8, &d, &e), REFIT_OK);
	ck_assert_uint_eq(s.n, d.n);
	th_topo("dgx-h100:24", &t);
	plan_opts_default(&o);
	ck_assert_msg(plan_build(&s, &d, &t, &o, &p, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_msg(plan_validate(&p, &s, &d, &chk, &e) == REFIT_OK, "%s", e.msg);
	plan_fini(&p);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	plan_fw_map_fini(&tm);
	plan_fw_map_fini(&im);
}
END_TEST

/* Hugging Face config.json files. */
START_TEST(hf_config)
{
	plan_arch_t a;
	refit_err_t e;
	const char *q2 = "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":2,"
			 "\"vocab_size\":100,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
			 "\"intermediate_size\":96,\"torch_dtype\":\"bfloat16\"}";
	const char *bad = "{\"model_type\":\"gpt2\",\"n_embd\":8}";

	refit_err_clear(&e);
	ck_assert_msg(codec_arch_parse(q2, strlen(q2), &a, &e) == REFIT_OK, "%s", e.msg);
	ck_assert(a.qkv_bias && !a.o_bias && !a.qk_norm && !a.tie_embeddings && a.head_dim == 16);
	ck_assert(a.kv_heads == 2 && a.dtype == PLAN_DT_BF16);
	ck_assert_int_eq(codec_arch_parse(bad, strlen(bad), &a, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "model_type \"gpt2\" is not one refit maps"));
}
END_TEST

/* A rank holding an element twice is refused; replicas on two ranks are not. */
START_TEST(rank_disjoint)
{
	int64_t shape[2] = {8, 4};
	plan_shard_t sh[3] = {{.rank = 0, .box = {{0, 0}, {4, 4}}},
			      {.rank = 1, .box = {{0, 0}, {8, 4}}},
			      {.rank = 0, .box = {{3, 0}, {5, 4}}}};
	plan_layout_t l;
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_int_eq(plan_layout_init_explicit(&l, "w", PLAN_DT_FP32, 2, shape, sh, 3, &e),
			 REFIT_OK);
	ck_assert_int_eq(plan_layout_check_rank_disjoint(&l, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "layout \"w\": rank 0 holds the box at [0, 0] and the box at "
			 "[3, 0], which overlap (a rank holds each element once)");
	plan_layout_fini(&l);
	sh[2].box.off[0] = 4;
	sh[2].box.size[0] = 4;
	ck_assert_int_eq(plan_layout_init_explicit(&l, "w", PLAN_DT_FP32, 2, shape, sh, 3, &e),
			 REFIT_OK);
	ck_assert_int_eq(plan_layout_check_rank_disjoint(&l, &e), REFIT_OK);
	plan_layout_fini(&l);
}
END_TEST

/* fp8 engines: projections in fp8e4m3, block scales in weight_scale_inv,
 * each fused part's blocks after the previous part's. */
START_TEST(fp8_scales)
{
	plan_arch_t a;
	plan_fw_map_t m;
	plan_par_t p;
	refit_err_t e;
	const plan_fw_param_t *w, *sc;
	const plan_fw_piece_t *pc;

	tiny(&a, 4);
	a.hidden = 256;
	a.heads = 4;
	a.kv_heads = 2;
	a.head_dim = 128;
	a.intermediate = 512;
	a.expert_intermediate = 256;
	ck_assert_int_eq(plan_par_parse("tp2", false, &p, NULL), REFIT_OK);
	refit_err_clear(&e);
	ck_assert_msg(plan_fw_map_build(&m, &a, PLAN_FW_VLLM, &p, 128, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_msg(plan_fw_map_check(&m, &e) == REFIT_OK, "%s", e.msg);
	w = param(&m, 1, "model.layers.0.self_attn.qkv_proj.weight");
	ck_assert_int_eq(w->dtype, PLAN_DT_FP8E4M3);
	sc = param(&m, 1, "model.layers.0.self_attn.qkv_proj.weight_scale_inv");
	ck_assert_int_eq(sc->dtype, PLAN_DT_FP32);
	ck_assert(sc->shape[0] == 4 && sc->shape[1] == 2); /* q 2 blocks, k 1, v 1 */
	piece_is(&m, sc, 0, "model.layers.0.self_attn.q_proj.weight_scale_inv", 2, 2, 0);
	piece_is(&m, sc, 1, "model.layers.0.self_attn.k_proj.weight_scale_inv", 1, 1, 2);
	piece_is(&m, sc, 2, "model.layers.0.self_attn.v_proj.weight_scale_inv", 1, 1, 3);
	/* stacked experts: [E, 2 ceil(I_tp / 128), ceil(H / 128)] */
	sc = param(&m, 0, "model.layers.1.mlp.experts.routed_experts.w13_weight_scale_inv");
	ck_assert(sc->ndim == 3 && sc->shape[0] == 4 && sc->shape[1] == 2 && sc->shape[2] == 2);
	pc = &m.pieces.v[sc->piece0 + 3]; /* expert 1, up */
	ck_assert_str_eq(m.tensors.v[pc->tensor].name,
			 "model.layers.1.mlp.experts.1.up_proj.weight_scale_inv");
	ck_assert(pc->at[0] == 1 && pc->at[1] == 1);
	plan_fw_map_fini(&m);
	/* a TP share inside a block: refused, as the engines refuse it */
	ck_assert_int_eq(plan_par_parse("tp4", false, &p, NULL), REFIT_OK);
	a.intermediate = 256; /* 64 rows a rank */
	ck_assert_int_eq(plan_fw_map_build(&m, &a, PLAN_FW_VLLM, &p, 128, &e),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "in fp8 blocks of 128"));
	plan_fw_map_fini(&m);
	/* a trainer keeps its dtype */
	ck_assert_int_eq(plan_fw_map_build(&m, &a, PLAN_FW_MEGATRON, &p, 128, &e),
			 REFIT_ERR_INVALID_ARG);
	plan_fw_map_fini(&m);
}
END_TEST

/* FSDP2 + TP: Hugging Face names, ColwiseParallel under FSDP is a
 * _StridedShard: rank (d, t) holds FSDP chunk d of TP chunk t. */
START_TEST(fsdp2_strided)
{
	plan_arch_t a;
	plan_fw_map_t m;
	const plan_fw_param_t *p;

	tiny(&a, 0);
	build(&m, &a, PLAN_FW_FSDP2, "dp2,tp2");
	ck_assert_int_eq(m.world, 4);
	p = param(&m, 1, "model.layers.0.self_attn.q_proj.weight"); /* d 0, t 1 */
	piece_is(&m, p, 0, "model.layers.0.self_attn.q_proj.weight", 16, 8, 0);
	p = param(&m, 2, "model.layers.0.self_attn.q_proj.weight"); /* d 1, t 0 */
	piece_is(&m, p, 0, "model.layers.0.self_attn.q_proj.weight", 8, 8, 0);
	/* RowwiseParallel: Shard(1) over tp, FSDP on dim 0 */
	p = param(&m, 3, "model.layers.0.self_attn.o_proj.weight");
	ck_assert(p->shape[0] == 4 && p->shape[1] == 16);
	ck_assert_int_eq(m.pieces.v[p->piece0].box.off[1], 16);
	/* uneven: 250 vocabulary rows over tp 2 then dp 2 */
	p = param(&m, 3, "lm_head.weight");
	ck_assert_int_eq(p->shape[0], 62);
	plan_fw_map_fini(&m);
}
END_TEST

Suite *
suite_framework(void)
{
	return th_suite("framework", th_tcase("maps", 60, TH_TESTS(vllm_qkv_replicated,
			megatron_qkv_interleaved, vocab_padding, moe_experts, check_refuses,
			layouts_plan, hf_config, rank_disjoint, fp8_scales, fsdp2_strided)), NULL);
}
