/*
 * framework.h - the frameworks' own memory: every rank's real parameters
 * (Megatron-Core, vLLM, SGLang) as pieces of the Hugging Face tensors.
 *
 * A trainer or an engine keeps fused, padded, interleaved, per-rank
 * parameters (Megatron's linear_qkv interleaved per query group, vLLM's
 * qkv_proj [q_r; k_r; v_r] with replicated KV heads, padded vocabularies,
 * fused MoE w13/w2 ...).  A map lists, for every rank of a parallel world,
 * its parameters (named as the framework names them, contiguous row-major)
 * and for each parameter the pieces it is made of: a box of a logical
 * ("Hugging Face checkpoint") tensor and where the box starts in the
 * parameter; elements no logical tensor feeds are declared padding.  The
 * maps are generated from one table of rules per framework in framework.c
 * and are checked against the frameworks' own loaders and converters by
 * tests/frameworks/.  The planner never sees a framework: a map becomes
 * plain explicit layouts (plan_fw_map_layouts).
 *
 * A piece of a tensor with fewer dims than its parameter (one expert of a
 * stacked [E, ...] parameter) occupies the parameter's trailing dims at one
 * index of each leading dim.  Pure: no I/O.
 */
#ifndef REFIT_PLAN_FRAMEWORK_H
#define REFIT_PLAN_FRAMEWORK_H

#include "plan/layout.h"
#include "plan/model.h"

typedef enum plan_fw {
	PLAN_FW_MEGATRON,
	PLAN_FW_VLLM,
	PLAN_FW_SGLANG,
	PLAN_FW_FSDP2,      /* torch FSDP2 + TP: Hugging Face names, DTensor shards */
	PLAN_FW_COUNT
} plan_fw_t;

/* "megatron", "vllm", "sglang", "fsdp2" (also "megatron-core", "mcore"). */
refit_status_t plan_fw_parse(const char *s, plan_fw_t *out, refit_err_t *err);
const char *plan_fw_name(plan_fw_t fw);
/* true for frameworks that train (their parallel specs read as training). */
bool plan_fw_trains(plan_fw_t fw);

typedef struct plan_fw_tensor {
	char *name;
	plan_dtype_t dtype;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	/* an engine storing it in fp8 with block scales: dtype fp8e4m3, `from`
	 * the trained dtype, `scale` its scale tensor ("<name>_scale_inv",
	 * fp32, ceil(shape / block)); otherwise scale is -1 */
	plan_dtype_t from;
	int32_t scale;
} plan_fw_tensor_t;

typedef struct plan_fw_piece {
	int32_t tensor;                 /* index into map.tensors */
	plan_box_t box;                 /* in the tensor's coordinates */
	int64_t at[PLAN_MAX_DIMS];      /* where it starts in the parameter */
} plan_fw_piece_t;

typedef struct plan_fw_param {
	char *name;
	int32_t rank;                   /* in the framework's world, from 0 */
	plan_dtype_t dtype;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	size_t piece0, npieces;         /* map.pieces[piece0 ..] */
	size_t pad0, npads;             /* map.pads[pad0 ..]: off = at */
} plan_fw_param_t;

typedef struct plan_fw_map {
	plan_fw_t fw;
	int64_t world;
	int64_t fp8_block;              /* engines in fp8: the square block; 0: none */
	VEC(plan_fw_tensor_t) tensors;  /* the logical tensors, in model order */
	VEC(plan_fw_param_t) params;    /* by rank, then model order */
	VEC(plan_fw_piece_t) pieces;
	VEC(plan_box_t) pads;
	size_t *rank0;                  /* params of rank r: [rank0[r], rank0[r+1]) */
} plan_fw_map_t;

/*
 * Build the map of architecture a under framework fw and parallel spec par
 * (plan_par_parse'd as training for Megatron, as inference otherwise) into
 * caller storage *m.  fp8_block > 0 (engines only): every linear
 * projection weight stored in fp8e4m3 with fp8_block x fp8_block scales,
 * each such parameter followed by its "<name>_scale_inv" parameter.  Fails, naming the rule and the numbers, when the
 * framework cannot place the model that way (heads not divisible by tp, a
 * padded vocabulary not divisible, pp on an engine ...).  On error *m is
 * left empty (plan_fw_map_fini is still safe).
 */
refit_status_t plan_fw_map_build(plan_fw_map_t *m, const plan_arch_t *a, plan_fw_t fw,
				 const plan_par_t *par, int64_t fp8_block, refit_err_t *err);
void plan_fw_map_fini(plan_fw_map_t *m);

/* Bytes of the parameters, of their pieces, and of padding. */
typedef struct plan_fw_bytes {
	uint64_t params, pieces, padding;
	size_t nparams, npieces;
} plan_fw_bytes_t;
void plan_fw_map_bytes(const plan_fw_map_t *m, plan_fw_bytes_t *out);

/*
 * Check the map: pieces and padding of a parameter inside it, disjoint,
 * covering every element; each piece inside its tensor and of its dtype;
 * every element of every logical tensor held by some rank.  The error names
 * the parameter, rank and box (or the tensor and an element missing).
 */
refit_status_t plan_fw_map_check(const plan_fw_map_t *m, refit_err_t *err);
/* The same with the map's layouts at hand (plan_fw_map_layouts, any base). */
refit_status_t plan_fw_map_check_with(const plan_fw_map_t *m, const plan_layout_set_t *s,
				      refit_err_t *err);

/*
 * The logical tensors as explicit layouts (ranks shifted by `base`), one
 * shard per piece in map order, so a rank's piece numbers follow its
 * parameters' order; fp8 tensors carry their conversion (plan/convert.h).
 * *out is initialised here.
 */
refit_status_t plan_fw_map_layouts(const plan_fw_map_t *m, int32_t base,
				   plan_layout_set_t *out, refit_err_t *err);

#endif
