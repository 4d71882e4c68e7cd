/*
 * fw_internal.h - what the files generating framework maps share
 * (framework.c: the rule tables and the engines' and Megatron's kinds;
 * framework_tensors.c: the logical tensors and the parameters being
 * emitted; framework_fsdp2.c: FSDP2's DTensor shards).  Not installed,
 * not for other folders.
 */
#ifndef REFIT_PLAN_FW_INTERNAL_H
#define REFIT_PLAN_FW_INTERNAL_H

#include "common/strmap.h"
#include "plan/framework.h"

/* How a rule fuses its parts and splits them over ranks. */
typedef enum rule_kind {
	R_REPL,       /* one tensor, whole on every rank */
	R_COL,        /* one tensor, dim 0 split evenly over TP */
	R_ROW,        /* one tensor, dim 1 split evenly over TP */
	R_VOCAB,      /* dim 0 padded to the framework's multiple, split evenly */
	R_CAT,        /* parts concatenated on dim 0, whole on every rank */
	R_CAT_TP,     /* per rank [part0_r; part1_r]: each part split evenly */
	R_QKV_GROUPS, /* Megatron: [q_g; k_g; v_g] per query group, split evenly */
	R_QKV_RANK,   /* vLLM: per rank [q_r; k_r; v_r], KV heads replicated if tp > kv */
	R_EXPERTS13,  /* stacked [E_local, 2 I_tp, H]: per expert [gate_r; up_r] */
	R_EXPERTS2,   /* stacked [E_local, H, I_tp] */
	R_EXPERT13,   /* one parameter per local expert (name has %d): [gate; up] */
	R_EXPERT2,    /* one parameter per local expert: down, split on dim 1 */
	R_EACH,       /* FSDP2: one Hugging Face tensor per expert (name has %d) */
} rule_kind_t;

/* When a rule applies: every bit set must hold. */
enum {
	W_GQA = 1 << 0, W_MLA = 1 << 1, W_QKNORM = 1 << 2, W_BIAS = 1 << 3,
	W_DENSE = 1 << 4, W_MOE = 1 << 5, W_SHARED = 1 << 6, W_UNTIED = 1 << 7,
	W_TIED_SPLIT = 1 << 8,   /* tied embeddings, first and last stage differ */
	W_ROUTER_BIAS = 1 << 9,
	W_OBIAS = 1 << 10,       /* o_proj has a bias (attention_bias) */
};

typedef enum { S_FIRST, S_LAYER, S_LAST } scope_t;

typedef struct rule {
	scope_t scope;
	unsigned when;
	const char *param;
	rule_kind_t kind;
	const char *parts[3];
} rule_t;

struct fw_desc;
struct dt_cache;

typedef struct fwgen {
	plan_fw_map_t *m;
	const struct fw_desc *d;
	const plan_arch_t *a;
	const plan_par_t *par;
	strmap_t ids;          /* logical tensor name -> index */
	refit_err_t *err;
	/* the rank being generated */
	int32_t rank;
	int64_t tpr, epr, etpr;
	int64_t layer;         /* global layer of a per-layer rule */
	char hf_prefix[64], fw_prefix[64];
	VEC(struct dt_cache) dt; /* FSDP2: DTensor shards by shape and kind */
} fwgen_t;

/* FSDP2: the shards of one (kind, shape) over the [dp][tp] mesh, by rank. */
typedef struct dt_cache {
	rule_kind_t kind;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	plan_layout_t l;
	size_t *first;          /* shards of rank r: l.shards[first[r] .. first[r + 1]) */
} dt_cache_t;

/* One slice of a tensor along its dim `td` ([lo, lo + len)), or padding. */
typedef struct seg {
	int32_t t;             /* tensor index; -1: padding */
	int64_t lo, len;
} seg_t;

#define MAX_SEGS 3072

/* The index of a logical tensor (full name, suffix after the Hugging Face
 * layer prefix), registering it on first use (an fp8 weight with its scale
 * tensor right after it). */
int32_t fw_tensor_id(fwgen_t *g, const char *name, const char *suffix);
/* Part k of rule r (expert e, or -1) as a tensor index. */
int32_t fw_part(fwgen_t *g, const rule_t *r, int k, int64_t e);
/* Start a parameter of the rank being generated; pieces and padding follow. */
void fw_param_begin(fwgen_t *g, const char *name, plan_dtype_t dt, int ndim,
		    const int64_t *shape);

static inline const plan_fw_tensor_t *
fw_T(const fwgen_t *g, int32_t t)
{
	return &g->m->tensors.v[t];
}

/* FSDP2: rule r's Hugging Face tensor(s) as the rank's DTensor locals. */
refit_status_t fw_rule_fsdp2(fwgen_t *g, const rule_t *r);
/* Free what fw_rule_fsdp2 cached in g. */
void fw_fsdp2_fini(fwgen_t *g);

#endif
