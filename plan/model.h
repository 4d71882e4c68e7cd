/*
 * model.h - whole models: an architecture (the shapes of every parameter)
 * and parallel specs (how training and inference place them) to layouts.
 *
 * Tensors are named and shaped as in the Hugging Face checkpoints both
 * sides convert to and from (q_proj, k_proj, v_proj, gate_proj, up_proj,
 * down_proj ...), with routed experts stacked per layer as [E, ...] like
 * vLLM's fused MoE.  Training follows Megatron-Core: ranks numbered TP
 * innermost, then DP, then PP; layers split evenly over PP stages with the
 * embedding on the first and the final norm and output head on the last;
 * column-parallel weights sharded on the output dim, row-parallel on the
 * input dim; experts split over EP ranks (carved from DP) and whole on each
 * (expert TP 1).  Inference follows vLLM: DP instances are replicas, TP
 * inside an instance, experts TP-sharded on their intermediate dim, or
 * split over the instance's ranks with ep = tp.  KV heads fewer than TP
 * ranks are replicated, as both frameworks do.  Pure: no I/O.
 */
#ifndef REFIT_PLAN_MODEL_H
#define REFIT_PLAN_MODEL_H

#include "plan/layout.h"

typedef struct plan_arch {
	char name[64];
	int64_t hidden, layers, vocab, heads, kv_heads, head_dim, intermediate;
	bool tie_embeddings, qk_norm;
	bool qkv_bias;       /* q/k/v projections have biases (Qwen2) */
	bool o_bias;         /* o_proj has a bias too (attention_bias: true) */
	bool qwen2_head_dim; /* a Qwen2 config.json: vLLM takes head_dim as hidden / heads */
	bool router_bias;    /* the MoE router has e_score_correction_bias (DeepSeek-V3) */
	/* MLA (DeepSeek-V3, Kimi-K2); q_lora_rank 0 = GQA */
	int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
	/* MoE; experts 0 = dense */
	int64_t experts, shared_experts, expert_intermediate, first_dense_layers;
	plan_dtype_t dtype;
} plan_arch_t;

typedef struct plan_par {
	int64_t tp, pp, dp, ep;   /* 0 = 1 (dp: derived from ep when 0) */
	int64_t etp;              /* expert TP (Megatron); 0: not given (Megatron: tp) */
} plan_par_t;

/*
 * Parse "tp4,pp8,ep16" (keys tp, pp, dp, ep, etp; any order).  Training carves
 * EP from DP (dp defaults to ep, ep must divide dp); inference instances
 * are DP replicas (dp defaults to 1) and EP lives inside an instance.
 */
refit_status_t plan_par_parse(const char *s, bool training, plan_par_t *out,
			      refit_err_t *err);
int64_t plan_par_world(const plan_par_t *p);
/* Layouts of every parameter of a in training (ranks from 0) and in
 * inference (ranks from the training world up). */
refit_status_t plan_model_layouts(const plan_arch_t *a, const plan_par_t *train,
				  const plan_par_t *infer, plan_layout_set_t *src,
				  plan_layout_set_t *dst, refit_err_t *err);
/* Parameters (elements) of the architecture. */
int64_t plan_arch_params(const plan_arch_t *a);

#endif
