/*
 * plan.h - refit plans: the planner, the validator and the cost model.
 *
 * A plan is a deterministic list of transfers grouped into stages.  A
 * transfer moves one box of one tensor from rank `from` to rank `to`; a
 * stage-s transfer may only send what its sender holds at the start of stage
 * s (its source shards plus whatever it received in earlier stages of the
 * same round).  Transfers become messages of at most chunk_bytes by the
 * rule described at plan_msgs_t.  from == to is a local copy (colocated
 * training and inference on one GPU).
 *
 * Two planners share this format:
 *   reshard   - exact box intersections; each element needed in a domain
 *               enters it over the network once, through any NIC of the
 *               domain (balanced; idle GPUs included), and is forwarded over
 *               NVLink to the ranks of the domain that need it; a source
 *               domain may send through any of its NICs after an NVLink
 *               copy, and pieces needed in several domains are relayed
 *               between them.  Data a rank passes on without needing it is
 *               staging, kept per round within staging_bytes.
 *   broadcast - the gather-and-broadcast baseline: gather each tensor on one
 *               training rank, pass the full tensor along a chain through one
 *               receiver per destination domain, and copy it to every
 *               destination rank of the domain, in rounds that fit the
 *               staging bound.
 *
 * The validator (validate.c) is written independently of both planners and
 * proves a plan correct by simulation.  The cost model (cost.c) gives bytes
 * per link class and rank, a modelled time and the bandwidth lower bound.
 *
 * Pure: no I/O, no clocks, no globals.  Thread: any, one plan per thread.
 */
#ifndef REFIT_PLAN_PLAN_H
#define REFIT_PLAN_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/alloc.h"
#include "common/sha256.h"
#include "plan/box.h"
#include "plan/layout.h"
#include "plan/topo.h"

#define PLAN_DEFAULT_CHUNK_BYTES (4ull << 20)
#define PLAN_DEFAULT_STAGING_BYTES (256ull << 20)

typedef enum plan_mode {
	PLAN_MODE_RESHARD,
	PLAN_MODE_BROADCAST,
} plan_mode_t;

typedef struct plan_opts {
	plan_mode_t mode;
	uint64_t chunk_bytes;   /* largest message */
	uint64_t staging_bytes; /* per-rank bound on relayed data held */
} plan_opts_t;

typedef enum plan_link {
	PLAN_LINK_LOCAL,   /* from == to */
	PLAN_LINK_NVLINK,  /* same domain */
	PLAN_LINK_NETWORK, /* different domains */
	PLAN_LINK_COUNT
} plan_link_t;

/*
 * One transfer: 20 bytes.  Its box is an index into the plan's box table,
 * where each box a planner cuts is stored once however many transfers move
 * it (a part forwarded to 31 ranks of its domain: one box, 32 transfers);
 * plan_xfer_box gives the box.
 */
typedef struct plan_xfer {
	uint32_t stage;
	int32_t from, to;
	uint32_t tensor; /* index into plan->tensors */
	uint32_t box;    /* index into plan->boxes */
} plan_xfer_t;

typedef struct plan_tensor_ref {
	char *name;
	plan_dtype_t dtype;
	int ndim;
	uint32_t elem;   /* bytes per element */
} plan_tensor_ref_t;

typedef struct plan {
	plan_opts_t opts;
	plan_tensor_ref_t *tensors; /* destination order */
	uint32_t ntensors;
	plan_xfer_t *xfers;         /* sorted by (stage, from, to, tensor, box) */
	size_t nxfers;
	plan_box_t *boxes;          /* the transfers' boxes (plan_xfer_box) */
	size_t nboxes;
	size_t nmsgs;               /* messages the message rule makes */
	uint32_t nstages;
	uint32_t stages_per_round;  /* stage s belongs to round s / this */
	uint8_t digest[SHA256_DIGEST_LEN];
	char digest_hex[SHA256_HEX_LEN];
} plan_t;

/*
 * Messages.  Transfers are logical box moves; what travels is messages,
 * made from the transfers by one fixed rule that the executor, the
 * validator and the cost model all use:
 *   - a transfer larger than chunk_bytes is cut into chunks of at most
 *     chunk_bytes (plan_box_chunk: outer dims first, near-equal runs), and
 *     each chunk is a message of its own;
 *   - consecutive smaller transfers of the same (stage, from, to) are
 *     packed, in plan order, into messages of at most chunk_bytes, each
 *     part at an offset that is a multiple of PLAN_PART_ALIGN (zero
 *     padding before it): a GPU kernel loads and stores the elements of a
 *     part as T*, which must be aligned to sizeof(T).
 * A message's bytes run to the end of its last part (padding included).
 * Any run of consecutive parts [k0, k1] travels as bytes [parts[k0].off,
 * parts[k1].off + parts[k1].bytes) of the message (plan_msg_part_at).
 */
#define PLAN_PART_ALIGN 16

/* The first offset at or after off where a part may start. */
static inline uint64_t
plan_part_align(uint64_t off)
{
	return (off + PLAN_PART_ALIGN - 1) & ~(uint64_t)(PLAN_PART_ALIGN - 1);
}

typedef struct plan_part {
	uint32_t xfer;   /* index into plan->xfers */
	plan_box_t box;  /* the whole transfer's box, or one chunk of it */
	uint64_t bytes;
	uint64_t off;    /* where it starts in its message: a multiple of PLAN_PART_ALIGN */
} plan_part_t;

typedef struct plan_msg {
	uint32_t stage;
	int32_t from, to;
	uint64_t bytes;
	const plan_part_t *parts; /* valid until the next plan_msgs_next */
	uint32_t nparts;
} plan_msg_t;

typedef struct plan_msgs {
	const plan_t *p;
	size_t x, end;            /* next transfer, end of the range */
	plan_boxvec_t chunks;     /* chunks of the large transfer under way */
	size_t chunk_i;
	VEC(plan_part_t) parts;
} plan_msgs_t;

/* Iterate the messages of transfers [first, end) (one or more groups). */
void plan_msgs_init(plan_msgs_t *it, const plan_t *p, size_t first, size_t end);
/* Next message into *m; false at the end. */
bool plan_msgs_next(plan_msgs_t *it, plan_msg_t *m);
void plan_msgs_fini(plan_msgs_t *it);
/* Where part k of m (or of a run of parts starting at m->parts[0]) starts in
 * m's buffer: its offset from the first part's. */
static inline uint64_t
plan_msg_part_at(const plan_msg_t *m, uint32_t k)
{
	return m->parts[k].off - m->parts[0].off;
}
/* Number of chunks plan_box_chunk cuts box into (1 when it fits). */
uint64_t plan_box_chunk_count(const plan_box_t *box, int ndim, uint64_t elem,
			      uint64_t max);

void plan_opts_default(plan_opts_t *o);
const char *plan_mode_name(plan_mode_t m);
refit_status_t plan_mode_parse(const char *s, plan_mode_t *out);

/*
 * Build the plan moving every tensor of src into the layout of dst on topo.
 * Checks the inputs first: the two sets describe the same tensors, every
 * source covers its tensor, every rank is in the topology, options sane.
 * On success *p is caller-owned (plan_fini); on error *p is zeroed.
 */
refit_status_t plan_build(const plan_layout_set_t *src,
			  const plan_layout_set_t *dst, const plan_topo_t *topo,
			  const plan_opts_t *opts, plan_t *p, refit_err_t *err);
void plan_fini(plan_t *p);

/* The box transfer x moves (x one of p's transfers, or a record whose box
 * index is below p->nboxes). */
static inline const plan_box_t *
plan_xfer_box(const plan_t *p, const plan_xfer_t *x)
{
	return &p->boxes[x->box];
}

static inline uint64_t
plan_xfer_bytes(const plan_t *p, const plan_xfer_t *x)
{
	const plan_tensor_ref_t *t = &p->tensors[x->tensor];

	return (uint64_t)plan_box_volume(plan_xfer_box(p, x), t->ndim) * t->elem;
}

plan_link_t plan_link_of(const plan_topo_t *topo, int32_t from, int32_t to);
const char *plan_link_name(plan_link_t l);

/*
 * The digest covers the plan's canonical form: a fixed little-endian
 * binary encoding of the options, the tensor table (name, dtype, ndim) and
 * every transfer in plan order (stage, from, to, tensor, then offset and
 * size per dim of its box), framed by lengths.  Box indices are not part
 * of it: how the box table is laid out does not change the digest.  See
 * plan.c.
 */

/* ---- validator ----------------------------------------------------- */

typedef struct plan_check {
	uint64_t needed_bytes;   /* bytes destination ranks must end up with */
	uint64_t delivered_bytes;/* of those, delivered (== needed when valid) */
	uint64_t relay_bytes;    /* received by ranks that do not need them */
	uint64_t max_staging;    /* largest relay bytes held by one rank */
	int32_t max_staging_rank;
} plan_check_t;

/*
 * Simulate p on (src, dst) and prove: every transfer's sender holds its box
 * at the start of its stage; every element each destination rank needs
 * arrives exactly once; messages respect chunk_bytes; relayed data held by
 * a rank in a round stays within staging_bytes.  The first violation is
 * returned as REFIT_ERR_INTERNAL naming stage, ranks, tensor and box.
 */
refit_status_t plan_validate(const plan_t *p, const plan_layout_set_t *src,
			     const plan_layout_set_t *dst, plan_check_t *out,
			     refit_err_t *err);

/* ---- cost model ---------------------------------------------------- */

/* Resources of the cost model (plan_cost_t.busiest.kind). */
enum { PLAN_RES_NET_TX, PLAN_RES_NET_RX, PLAN_RES_NVL_TX, PLAN_RES_NVL_RX, PLAN_RES_HOST,
       PLAN_RES_CODEC };

/*
 * A delta refit (docs/delta.md): every box crossing a link travels encoded
 * against the version its receiver holds, ratio[elem] wire bytes per dense
 * byte (from the codec's size model at the density modelled) plus
 * hdr_bytes per message, or dense where that is not smaller; a large
 * transfer's messages carry chunk_bytes of encoded data each.  Each
 * rank is a codec resource of its own, working while the links do: it
 * encodes what it sends in the first stage of a round (what it sends later
 * may be a forward of an encoding it received, charged nowhere) at
 * encode_Bps and decodes every encoded box it receives at decode_Bps (dense
 * bytes per second; 0: free).
 */
typedef struct plan_delta {
	double ratio[9];             /* by element size 1, 2, 4, 8 (others: 1) */
	uint32_t hdr_bytes;
	double encode_Bps, decode_Bps;
} plan_delta_t;

typedef struct plan_cost {
	uint64_t payload_bytes;              /* sum of destination needs */
	uint64_t bytes[PLAN_LINK_COUNT];     /* by link class */
	uint64_t msgs[PLAN_LINK_COUNT];
	uint64_t max_nic_bytes;              /* busiest NIC, one direction */
	int32_t max_nic_rank;
	uint64_t max_nvl_bytes;              /* busiest NVLink port */
	int32_t max_nvl_rank;
	uint32_t stages_used;
	double time_s;                       /* modelled */
	/* what time_s is made of: the busiest resource and the pipeline fill */
	struct {
		int kind;        /* PLAN_RES_*: which resource */
		int32_t rank;    /* its rank (NIC: a rank behind it) */
		uint64_t bytes, msgs;
		double bytes_s, latency_s, other_s; /* other: connection setup */
	} busiest;
	double fill_s;
	/* lower bound for these inputs and topology, independent of the plan */
	uint64_t lb_network_bytes;           /* minimum bytes over the network */
	double lb_time_s;
	double ratio;                        /* time_s / lb_time_s */
} plan_cost_t;

/*
 * Cost of p on topo, and the lower bound for (src, dst, topo).  Links run
 * in parallel; each message costs the link latency; consecutive stages are
 * pipelined so each extra stage adds one chunk's fill time.
 */
refit_status_t plan_cost(const plan_t *p, const plan_layout_set_t *src,
			 const plan_layout_set_t *dst, const plan_topo_t *topo,
			 plan_cost_t *out, refit_err_t *err);
/* The same for a delta refit: bytes per link class, NICs and ports are the
 * encoded bytes (payload_bytes and the lower bound stay dense). */
refit_status_t plan_cost_delta(const plan_t *p, const plan_layout_set_t *src,
			       const plan_layout_set_t *dst, const plan_topo_t *topo,
			       const plan_delta_t *dl, plan_cost_t *out, refit_err_t *err);

#endif
