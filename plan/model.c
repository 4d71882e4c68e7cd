/*
 * model.c - architectures and parallel specs to layouts (see model.h).
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/model.h"

refit_status_t
plan_par_parse(const char *s, bool training, plan_par_t *out, refit_err_t *err)
{
	const char *p = s;

	memset(out, 0, sizeof(*out));
	while (*p) {
		char key[4] = {0};
		char *end;
		long v;
		int k = 0;

		while (k < 3 && isalpha((unsigned char)p[k])) {
			key[k] = p[k];
			k++;
		}
		if (k < 2)
			goto bad;
		v = strtol(p + k, &end, 10);
		if (end == p + k || v < 1 || v > 65536)
			goto bad;
		if (strcmp(key, "tp") == 0)
			out->tp = v;
		else if (strcmp(key, "pp") == 0)
			out->pp = v;
		else if (strcmp(key, "dp") == 0)
			out->dp = v;
		else if (strcmp(key, "ep") == 0)
			out->ep = v;
		else if (strcmp(key, "etp") == 0)
			out->etp = v;
		else
			goto bad;
		p = end;
		if (*p == ',')
			p++;
		else if (*p)
			goto bad;
	}
	if (out->tp == 0)
		out->tp = 1;
	if (out->pp == 0)
		out->pp = 1;
	if (out->ep == 0)
		out->ep = 1;
	if (out->dp == 0)
		out->dp = training ? out->ep : 1; /* training carves EP from DP */
	if (training && out->dp % out->ep != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "parallel spec \"%s\": ep%"
				     PRId64 " must divide dp%" PRId64, s, out->ep, out->dp);
	return REFIT_OK;
bad:
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "parallel spec \"%s\": expected "
			     "comma-separated tpN, ppN, dpN, epN, etpN (e.g. tp4,pp8,ep16)", s);
}

int64_t
plan_par_world(const plan_par_t *p)
{
	return p->tp * p->pp * p->dp;
}

/* How a tensor is split inside a TP group. */
typedef enum { SPLIT_REPL, SPLIT_COL, SPLIT_ROW, SPLIT_KV, SPLIT_EXPERT } split_t;

typedef struct gen {
	const plan_arch_t *a;
	const plan_par_t *tr, *in;
	int64_t base;  /* first inference rank */
	plan_layout_set_t *src, *dst;
	refit_err_t *err;
} gen_t;

/* Add a dtensor layout on the n consecutive ranks from `first`. */
static refit_status_t
add(gen_t *g, plan_layout_set_t *set, const char *name, int ndim, const int64_t *shape,
    int mdim, const int64_t *msh, int64_t first, int64_t n, const char *const *pl)
{
	plan_placement_t p[4];
	plan_layout_t l;
	int32_t *mesh;
	refit_status_t rc;

	for (int i = 0; i < mdim; i++)
		CHECK(plan_placement_parse(pl[i], &p[i], name, g->err));
	mesh = xmalloc((size_t)n * sizeof(*mesh));
	for (int64_t i = 0; i < n; i++)
		mesh[i] = (int32_t)(first + i);
	rc = plan_layout_init_dtensor(&l, name, g->a->dtype, ndim, shape, mdim, msh, mesh, p,
				      g->err);
	free(mesh);
	if (rc == REFIT_OK)
		plan_layout_set_add(set, &l);
	return rc;
}

static const char *
shard_of(split_t s, int ndim)
{
	static const char *const d[] = {"Shard(0)", "Shard(1)", "Shard(2)"};

	switch (s) {
	case SPLIT_COL: return d[ndim == 3 ? 1 : 0];
	case SPLIT_ROW: return d[ndim == 3 ? 2 : 1];
	default: return "Replicate()";
	}
}

/*
 * A TP group's mesh dims and placements for split s: the TP dim, or for
 * KV projections with fewer heads than TP ranks, [kv][tp/kv] with each
 * head replicated over tp/kv ranks (what Megatron and vLLM do).
 */
static int
tp_dims(const gen_t *g, int64_t tp, split_t s, int ndim, int64_t *msh, const char **pl)
{
	if (s == SPLIT_KV && g->a->kv_heads < tp && tp % g->a->kv_heads == 0) {
		msh[0] = g->a->kv_heads;
		msh[1] = tp / g->a->kv_heads;
		pl[0] = "Shard(0)";
		pl[1] = "Replicate()";
		return 2;
	}
	msh[0] = tp;
	pl[0] = s == SPLIT_KV ? "Shard(0)" : shard_of(s, ndim);
	return 1;
}

/* Training: the stage's ranks as [dp/ep][ep][tp...], TP innermost. */
static refit_status_t
add_train(gen_t *g, const char *name, int ndim, const int64_t *shape, split_t s, int64_t stage)
{
	const plan_par_t *t = g->tr;
	int64_t msh[4] = {t->dp / t->ep, t->ep}, n = t->dp * t->tp;
	const char *pl[4] = {"Replicate()", "Replicate()", "Replicate()", "Replicate()"};
	int md = 2;

	if (s == SPLIT_EXPERT) {
		pl[1] = "Shard(0)";         /* experts over EP, whole per rank */
		msh[md++] = t->tp;
	} else {
		md += tp_dims(g, t->tp, s, ndim, msh + 2, pl + 2);
	}
	return add(g, g->src, name, ndim, shape, md, msh, stage * n, n, pl);
}

/* Inference: [dp][tp...] from the first inference rank. */
static refit_status_t
add_infer(gen_t *g, const char *name, int ndim, const int64_t *shape, split_t s)
{
	const plan_par_t *p = g->in;
	int64_t msh[3] = {p->dp}, n = p->dp * p->tp;
	const char *pl[3] = {"Replicate()", "Replicate()", "Replicate()"};
	int md = 1;

	if (s == SPLIT_EXPERT) {
		msh[md] = p->tp;
		pl[md++] = p->ep > 1 ? "Shard(0)" : "Replicate()";
	} else {
		md += tp_dims(g, p->tp, s, ndim, msh + 1, pl + 1);
	}
	return add(g, g->dst, name, ndim, shape, md, msh, g->base, n, pl);
}

/* One parameter on both sides. */
static refit_status_t
param(gen_t *g, int64_t stage, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
      split_t train_split, split_t infer_split)
{
	int64_t shape[3] = {d0, d1, d2};

	CHECK(add_train(g, name, ndim, shape, train_split, stage));
	return add_infer(g, name, ndim, shape, infer_split);
}

static int64_t
stage_of(const gen_t *g, int64_t layer)
{
	int64_t per = (g->a->layers + g->tr->pp - 1) / g->tr->pp;

	return layer / per;
}

static refit_status_t
attention(gen_t *g, int64_t l, int64_t st, const char *p)
{
	const plan_arch_t *a = g->a;
	char n[160];

#define NAME(s) (snprintf(n, sizeof(n), "%s%s", p, s), n)
	if (a->q_lora_rank > 0) { /* MLA */
		int64_t qk = a->qk_nope_dim + a->qk_rope_dim;

		CHECK(param(g, st, NAME("self_attn.q_a_proj.weight"), 2, a->q_lora_rank, a->hidden, 0,
			    SPLIT_REPL, SPLIT_REPL));
		CHECK(param(g, st, NAME("self_attn.q_a_layernorm.weight"), 1, a->q_lora_rank, 0, 0,
			    SPLIT_REPL, SPLIT_REPL));
		CHECK(param(g, st, NAME("self_attn.q_b_proj.weight"), 2, a->heads * qk,
			    a->q_lora_rank, 0, SPLIT_COL, SPLIT_COL));
		CHECK(param(g, st, NAME("self_attn.kv_a_proj_with_mqa.weight"), 2,
			    a->kv_lora_rank + a->qk_rope_dim, a->hidden, 0, SPLIT_REPL, SPLIT_REPL));
		CHECK(param(g, st, NAME("self_attn.kv_a_layernorm.weight"), 1, a->kv_lora_rank, 0, 0,
			    SPLIT_REPL, SPLIT_REPL));
		CHECK(param(g, st, NAME("self_attn.kv_b_proj.weight"), 2,
			    a->heads * (a->qk_nope_dim + a->v_head_dim), a->kv_lora_rank, 0,
			    SPLIT_COL, SPLIT_COL));
		return param(g, st, NAME("self_attn.o_proj.weight"), 2, a->hidden,
			     a->heads * a->v_head_dim, 0, SPLIT_ROW, SPLIT_ROW);
	}
	CHECK(param(g, st, NAME("self_attn.q_proj.weight"), 2, a->heads * a->head_dim, a->hidden,
		    0, SPLIT_COL, SPLIT_COL));
	CHECK(param(g, st, NAME("self_attn.k_proj.weight"), 2, a->kv_heads * a->head_dim,
		    a->hidden, 0, SPLIT_KV, SPLIT_KV));
	CHECK(param(g, st, NAME("self_attn.v_proj.weight"), 2, a->kv_heads * a->head_dim,
		    a->hidden, 0, SPLIT_KV, SPLIT_KV));
	CHECK(param(g, st, NAME("self_attn.o_proj.weight"), 2, a->hidden, a->heads * a->head_dim,
		    0, SPLIT_ROW, SPLIT_ROW));
	if (a->qk_norm) {
		CHECK(param(g, st, NAME("self_attn.q_norm.weight"), 1, a->head_dim, 0, 0,
			    SPLIT_REPL, SPLIT_REPL));
		CHECK(param(g, st, NAME("self_attn.k_norm.weight"), 1, a->head_dim, 0, 0,
			    SPLIT_REPL, SPLIT_REPL));
	}
	(void)l;
	return REFIT_OK;
}

static refit_status_t
mlp(gen_t *g, int64_t l, int64_t st, const char *p)
{
	const plan_arch_t *a = g->a;
	bool moe = a->experts > 0 && l >= a->first_dense_layers;
	int64_t e = a->experts, I = a->expert_intermediate;
	char n[160];

	if (!moe) {
		CHECK(param(g, st, NAME("mlp.gate_proj.weight"), 2, a->intermediate, a->hidden, 0,
			    SPLIT_COL, SPLIT_COL));
		CHECK(param(g, st, NAME("mlp.up_proj.weight"), 2, a->intermediate, a->hidden, 0,
			    SPLIT_COL, SPLIT_COL));
		return param(g, st, NAME("mlp.down_proj.weight"), 2, a->hidden, a->intermediate, 0,
			     SPLIT_ROW, SPLIT_ROW);
	}
	CHECK(param(g, st, NAME("mlp.gate.weight"), 2, e, a->hidden, 0, SPLIT_REPL, SPLIT_REPL));
	{
		split_t ie = g->in->ep > 1 ? SPLIT_EXPERT : SPLIT_COL;
		split_t ie_row = g->in->ep > 1 ? SPLIT_EXPERT : SPLIT_ROW;
		int64_t shape13[3] = {e, I, a->hidden}, shape2[3] = {e, a->hidden, I};

		CHECK(add_train(g, NAME("mlp.experts.gate_proj.weight"), 3, shape13, SPLIT_EXPERT, st));
		CHECK(add_infer(g, n, 3, shape13, ie));
		CHECK(add_train(g, NAME("mlp.experts.up_proj.weight"), 3, shape13, SPLIT_EXPERT, st));
		CHECK(add_infer(g, n, 3, shape13, ie));
		CHECK(add_train(g, NAME("mlp.experts.down_proj.weight"), 3, shape2, SPLIT_EXPERT, st));
		CHECK(add_infer(g, n, 3, shape2, ie_row));
	}
	if (a->shared_experts > 0) {
		int64_t si = a->shared_experts * I;

		CHECK(param(g, st, NAME("mlp.shared_experts.gate_proj.weight"), 2, si, a->hidden, 0,
			    SPLIT_COL, SPLIT_COL));
		CHECK(param(g, st, NAME("mlp.shared_experts.up_proj.weight"), 2, si, a->hidden, 0,
			    SPLIT_COL, SPLIT_COL));
		CHECK(param(g, st, NAME("mlp.shared_experts.down_proj.weight"), 2, a->hidden, si, 0,
			    SPLIT_ROW, SPLIT_ROW));
	}
	return REFIT_OK;
#undef NAME
}

refit_status_t
plan_model_layouts(const plan_arch_t *a, const plan_par_t *train, const plan_par_t *infer,
		   plan_layout_set_t *src, plan_layout_set_t *dst, refit_err_t *err)
{
	gen_t g = {a, train, infer, plan_par_world(train), src, dst, err};
	int64_t last = train->pp - 1;
	refit_status_t rc = REFIT_OK;

	if (infer->pp != 1)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "inference spec: pp is not "
				     "supported (DP instances of TP, optionally ep = tp)");
	if (infer->ep > 1 && infer->ep != infer->tp)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "inference spec: ep%" PRId64
				     " must equal tp%" PRId64 " (experts split over the "
				     "instance's ranks)", infer->ep, infer->tp);
	if (train->pp > a->layers)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "training spec: pp%" PRId64
				     " is more than the %" PRId64 " layers", train->pp, a->layers);
	if (a->experts > 0 && a->experts % train->ep != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "training spec: ep%" PRId64
				     " does not divide %" PRId64 " experts", train->ep, a->experts);
	rc = param(&g, 0, "model.embed_tokens.weight", 2, a->vocab, a->hidden, 0, SPLIT_COL,
		   SPLIT_COL);
	for (int64_t l = 0; l < a->layers && rc == REFIT_OK; l++) {
		char p[64], n[160];
		int64_t st = stage_of(&g, l);

		snprintf(p, sizeof(p), "model.layers.%" PRId64 ".", l);
		snprintf(n, sizeof(n), "%sinput_layernorm.weight", p);
		rc = param(&g, st, n, 1, a->hidden, 0, 0, SPLIT_REPL, SPLIT_REPL);
		if (rc == REFIT_OK) {
			snprintf(n, sizeof(n), "%spost_attention_layernorm.weight", p);
			rc = param(&g, st, n, 1, a->hidden, 0, 0, SPLIT_REPL, SPLIT_REPL);
		}
		if (rc == REFIT_OK)
			rc = attention(&g, l, st, p);
		if (rc == REFIT_OK)
			rc = mlp(&g, l, st, p);
	}
	if (rc == REFIT_OK)
		rc = param(&g, last, "model.norm.weight", 1, a->hidden, 0, 0, SPLIT_REPL, SPLIT_REPL);
	if (rc == REFIT_OK && !a->tie_embeddings)
		rc = param(&g, last, "lm_head.weight", 2, a->vocab, a->hidden, 0, SPLIT_COL,
			   SPLIT_COL);
	return rc;
}

int64_t
plan_arch_params(const plan_arch_t *a)
{
	/* 128-bit arithmetic: an architecture file may hold absurd sizes */
	__int128 n = (__int128)a->vocab * a->hidden * (a->tie_embeddings ? 1 : 2) + a->hidden;
	__int128 attn, mlp_dense, mlp_moe;

	if (a->q_lora_rank > 0)
		attn = (__int128)a->q_lora_rank * a->hidden + a->q_lora_rank +
		       (__int128)a->heads * (a->qk_nope_dim + a->qk_rope_dim) * a->q_lora_rank +
		       (__int128)(a->kv_lora_rank + a->qk_rope_dim) * a->hidden + a->kv_lora_rank +
		       (__int128)a->heads * (a->qk_nope_dim + a->v_head_dim) * a->kv_lora_rank +
		       (__int128)a->hidden * a->heads * a->v_head_dim;
	else
		attn = (__int128)(a->heads + 2 * a->kv_heads) * a->head_dim * a->hidden +
		       (__int128)a->hidden * a->heads * a->head_dim +
		       (a->qk_norm ? 2 * a->head_dim : 0);
	mlp_dense = (__int128)3 * a->intermediate * a->hidden;
	mlp_moe = (__int128)a->experts * a->hidden +
		  (__int128)3 * a->experts * a->expert_intermediate * a->hidden +
		  (__int128)3 * a->shared_experts * a->expert_intermediate * a->hidden;
	for (int64_t l = 0; l < a->layers && n < INT64_MAX; l++)
		n += 2 * (__int128)a->hidden + attn +
		     (a->experts > 0 && l >= a->first_dense_layers ? mlp_moe : mlp_dense);
	return n > INT64_MAX ? INT64_MAX : (int64_t)n;
}
