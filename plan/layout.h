/*
 * layout.h - where one tensor's elements live: DTensor or explicit form.
 *
 * A plan_layout_t is built either from a DTensor description (global shape,
 * N-D mesh of global rank ids, one placement per mesh dim) or from an
 * explicit list of {rank, offset, size} boxes.  Either way it is resolved
 * into `shards`: the boxes each rank holds, in global coordinates, with the
 * position of each box inside that rank's local tensor (`local_off`), which
 * matters for _StridedShard where one rank holds several boxes.
 *
 * DTensor semantics equal torch.distributed.tensor's: placements are applied
 * in mesh-dim order to the rank's current local tensor; Shard(d) splits the
 * current extent E of dim d into chunks of ceil(E/n) (trailing chunks short
 * or empty); _StridedShard(d, split_factor=k) first cuts the local extent
 * into k chunks, splits each of them into n, and concatenates piece c of
 * every chunk (the FSDP2 + TP right-to-left order).
 *
 * Pure: no I/O.  Errors name the tensor and the field.
 */
#ifndef REFIT_PLAN_LAYOUT_H
#define REFIT_PLAN_LAYOUT_H

#include <sys/types.h>

#include "plan/box.h"

/* bound on the boxes one rank may hold for one tensor (strided shards) */
#define PLAN_MAX_RANK_BOXES 4096
/* bound on a tensor's elements (bytes then fit 64 bits for any dtype) */
#define PLAN_MAX_NUMEL ((int64_t)1 << 56)
/* bound on mesh size and on rank ids */
#define PLAN_MAX_RANK_ID (1 << 24)

typedef enum plan_placement_kind {
	PLAN_PL_REPLICATE,
	PLAN_PL_SHARD,
	PLAN_PL_STRIDED_SHARD,
} plan_placement_kind_t;

typedef struct plan_placement {
	plan_placement_kind_t kind;
	int dim;              /* as written; may be negative */
	int64_t split_factor; /* _StridedShard only */
} plan_placement_t;

typedef struct plan_shard {
	int32_t rank;
	int32_t piece;        /* explicit form: index of the box among the
				 rank's boxes; DTensor form: 0 */
	plan_box_t box;       /* global coordinates; may be empty */
	int64_t local_off[PLAN_MAX_DIMS]; /* where box starts in the piece */
} plan_shard_t;

/*
 * A destination tensor stored in another dtype than its source
 * (docs/conversion.md): a cast (fp32 -> bf16/fp16), or fp8e4m3 with one
 * scale per tensor or per block, the scales going to their own destination
 * tensor.  plan/convert.h turns a layout pair with conversions into plain
 * ones.
 */
typedef enum plan_scale {
	PLAN_SCALE_NONE,
	PLAN_SCALE_TENSOR,
	PLAN_SCALE_BLOCK,
	PLAN_SCALE_MX,      /* MXFP8: power-of-two scales (e8m0 bytes) per block */
} plan_scale_t;

typedef struct plan_convert {
	plan_dtype_t from;               /* the source's dtype */
	plan_scale_t scale;
	int nblock;                      /* block entries given (trailing dims) */
	int64_t block[PLAN_MAX_DIMS];    /* BLOCK, MX: extents, as given */
	char *scale_tensor;              /* scaled: name of the scale tensor */
} plan_convert_t;

typedef struct plan_layout {
	char *name;
	plan_dtype_t dtype;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	bool is_dtensor;
	/* DTensor form only */
	int mesh_ndim;
	int64_t mesh_shape[PLAN_MAX_DIMS];
	int32_t *mesh;        /* row-major, product(mesh_shape) ranks */
	plan_placement_t placements[PLAN_MAX_DIMS];
	/* both forms */
	plan_shard_t *shards;
	size_t nshards;
	/* destination only: stored converted (NULL: as the source) */
	plan_convert_t *conv;
} plan_layout_t;

/*
 * Parse one placement as PyTorch prints it: "Replicate()", "Shard(1)",
 * "Shard(dim=-1)", "_StridedShard(dim=0, split_factor=2)" (also "sf=2"),
 * and the short forms "R", "S(1)", "_S(0, 2)".  `what` names the
 * placement in error messages.
 */
refit_status_t plan_placement_parse(const char *s, plan_placement_t *out,
				    const char *what, refit_err_t *err);
/* Canonical text of a placement into buf. */
void plan_placement_format(const plan_placement_t *p, char *buf, size_t n);

/*
 * Build a DTensor-form layout into caller storage *l.  Copies name, shape,
 * mesh and placements; validates (dims, mesh, ranks, placements) and
 * resolves shards.  On error *l is left zeroed (nothing to fini).
 */
refit_status_t plan_layout_init_dtensor(plan_layout_t *l, const char *name,
					plan_dtype_t dtype, int ndim,
					const int64_t *shape, int mesh_ndim,
					const int64_t *mesh_shape,
					const int32_t *mesh,
					const plan_placement_t *placements,
					refit_err_t *err);
/*
 * Build an explicit-form layout; shards[i].rank and .box are read, the rest
 * computed.  Boxes must lie inside the shape.
 */
refit_status_t plan_layout_init_explicit(plan_layout_t *l, const char *name,
					 plan_dtype_t dtype, int ndim,
					 const int64_t *shape,
					 const plan_shard_t *shards,
					 size_t nshards, refit_err_t *err);
void plan_layout_fini(plan_layout_t *l);
/* A heap copy of c (NULL for NULL); freed by plan_layout_fini. */
plan_convert_t *plan_convert_dup(const plan_convert_t *c);

int64_t plan_layout_numel(const plan_layout_t *l);
uint64_t plan_layout_bytes(const plan_layout_t *l);
/*
 * Check that the shards cover every element (a source layout must).  The
 * error names one missing element.
 */
refit_status_t plan_layout_check_coverage(const plan_layout_t *l,
					  refit_err_t *err);
/*
 * Check that no rank holds an element twice (explicit form: two boxes of
 * one rank overlap).  Replicas on different ranks are fine.  The error
 * names the tensor, the rank and both boxes.
 */
refit_status_t plan_layout_check_rank_disjoint(const plan_layout_t *l, refit_err_t *err);
/* Check that two layouts describe the same tensor (name, dtype, shape). */
refit_status_t plan_layout_check_same_tensor(const plan_layout_t *src,
					     const plan_layout_t *dst,
					     refit_err_t *err);

/* An ordered set of layouts (a layout file, or a model's tensors). */
typedef struct plan_layout_set {
	plan_layout_t *v;
	size_t n, cap;
} plan_layout_set_t;

void plan_layout_set_init(plan_layout_set_t *s);
void plan_layout_set_fini(plan_layout_set_t *s);
/* Move *l into the set (the set now owns its memory, *l is zeroed). */
void plan_layout_set_add(plan_layout_set_t *s, plan_layout_t *l);
/* Deep copy of a set into *dst (initialised here). */
void plan_layout_set_copy(plan_layout_set_t *dst, const plan_layout_set_t *src);
/* Fail naming a tensor that appears twice. */
refit_status_t plan_layout_set_check_unique(const plan_layout_set_t *s,
					    refit_err_t *err);
/* The end of building a set from parts: when rc is REFIT_OK, the names are
 * checked unique; on any failure the set is freed (nothing half-built is
 * kept).  Returns the outcome. */
refit_status_t plan_layout_set_finish(plan_layout_set_t *s, refit_status_t rc,
				      refit_err_t *err);
/*
 * Compose replicas (inference instances, each a set with the same tensors
 * on ranks of its own) into one explicit destination set; every shard keeps
 * its instance's piece number and local offset, so memory registered per
 * instance is found from the composed set.
 */
refit_status_t plan_layout_compose(const plan_layout_set_t *const *sets, size_t nsets,
				   plan_layout_set_t *out, refit_err_t *err);

/*
 * Pair every tensor of dst with the src tensor of the same name (map[i] =
 * index in src).  Fails on duplicate names, and naming every tensor that is missing on either side
 * or differs in dtype or shape.  *map is heap memory the caller frees.
 */
refit_status_t plan_match(const plan_layout_set_t *src,
			  const plan_layout_set_t *dst, size_t **map,
			  refit_err_t *err);

#endif
