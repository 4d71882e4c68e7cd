/*
 * slice.h - one node's slice of a plan, run over a transport.
 *
 * The node enumerates the plan's messages with the plan's one rule and
 * keeps those its ranks send or receive.  Messages between its own ranks
 * are copied in place; the others travel over one transport session, in
 * plan order per (sender node, receiver node).  Readiness is per part of
 * a message: a part that packs data this node received (forwards, relays)
 * goes once the arrived parts it overlaps are here, together with the ready
 * parts after it in its message (a frame whose seq names the message and
 * its first part: pos | k << 32; a message ready at once goes whole, seq =
 * pos); arrivals are unpacked the moment they land, whatever their stage.
 * Staging: one packed message per peer each way, plus relay data the plan
 * keeps (exec.h).
 */
#ifndef REFIT_DAEMON_NODE_SLICE_H
#define REFIT_DAEMON_NODE_SLICE_H

#include "daemon/transport/transport.h"
#include "dataplane/exec.h"

typedef struct slice_node {
	const char *node_id, *endpoint;
	const int32_t *ranks;
	size_t nranks;
} slice_node_t;

typedef struct slice_cfg {
	const plan_t *plan;
	const plan_layout_set_t *src, *dst;
	const dp_mem_ops_t *mem;
	bool verify;
	int64_t corrupt;          /* tests: flip a byte of this outgoing message (-1: none) */
	const slice_node_t *nodes;/* every node of the epoch */
	size_t nnodes, self;      /* nodes[self] is this node */
	const xport_ops_t *xo;
	xport_t *x;
	uint64_t refit_id, epoch;
	uint32_t attempt;
	int64_t deadline_ms;
	atomic_int *abort;
	uint32_t test_delay_ms;   /* tests: sleep before each message sent */
	dp_pool_t *pool;          /* the node's buffer pool (NULL: malloc per refit):
				     packed messages, receive buffers, relay staging */
	uint64_t connect_ms;      /* each connection to a peer (tcp): its deadline */
	/* the trainers' ready events (device memory: the session waits for
	 * them before reading; transport.h) */
	const xport_event_t *events;
	size_t nevents;
	struct slice_peer *peers; /* per node of nodes: filled when the slice fails
				     (NULL: not wanted; the caller zeroes it) */
	/* optional, with hook_ctx: once the session is open, its device (NULL:
	 * host memory) before the executor is made; and before it closes, after
	 * the exchange (ok: it succeeded) -- the conversion wrapper's finish and
	 * its device scratch (dataplane/conv_exec.h) */
	refit_status_t (*on_open)(void *ctx, const dp_dev_ops_t *dev, refit_err_t *err);
	refit_status_t (*on_close)(void *ctx, bool ok, refit_err_t *err);
	void *hook_ctx;
	/* delta refits (slice_delta.h; stream transports only): the node's
	 * bases (NULL: delta off, nothing kept), the model and plan digest
	 * they are kept under, this refit's tag, the base the coordinator
	 * named (0: none) and per node of nodes whether it holds it too;
	 * per node, the positions of the messages to it that it keeps no
	 * base of (sorted; those go dense) */
	struct delta_store *delta;
	const char *model, *digest;
	uint64_t delta_tag, delta_base;
	const bool *delta_ok;
	uint32_t *const *delta_skip;
	const size_t *delta_nskip;
	/* the grouped form's bases on the devices (gdelta_base.h; NULL: none;
	 * used when delta_tag is set, dropped when a slice fails) */
	struct gdelta_store *gdelta;
	/* device memory: per rank (0..nstaging_fixed), the staging held for the
	 * whole slice beyond the groups and relays (the conversion scratch,
	 * dp_conv_scratch_need): the whole-slice estimate at open counts it */
	const uint64_t *staging_fixed;
	size_t nstaging_fixed;
} slice_cfg_t;

/*
 * What the slice saw of one peer when it failed, for the coordinator to
 * name the broken link (docs/faults.md, "Failure attribution"): what the
 * transport saw of its link, and the messages still owed each way once
 * the exchange had started (opened: false when it never got that far).
 */
typedef struct slice_peer {
	xport_link_t link;
	bool opened;
	uint64_t owes_us;   /* its messages to this node not yet arrived */
	uint64_t we_owe;    /* this node's messages to it not yet sent */
} slice_peer_t;

#define SLICE_MAX_STAGES 64

typedef struct slice_stats {
	uint64_t msgs_out, msgs_in, msgs_local;
	uint64_t bytes_out, bytes_in, bytes_local;
	uint32_t nstages;
	uint64_t stage_us[SLICE_MAX_STAGES];   /* from the start to the stage's end */
	uint64_t stage_bytes[SLICE_MAX_STAGES];/* sent + copied locally */
	uint64_t total_us;
	uint64_t comm_us;       /* opening the session: connections or communicators */
	uint64_t staged_max;    /* the most relay staging held at once, bytes */
	/* delta refits: units sent encoded, their bytes on the wire and their
	 * dense bytes; units sent dense and their bytes (trailers included);
	 * whether the bases were kept (every table held; the messages received
	 * without room for a base: lacks, pairs of the peer's index and the
	 * message's position, owned by the caller, NULL when none) */
	uint64_t delta_units, delta_wire, delta_dense, dense_units, dense_wire;
	bool bases_kept;
	uint32_t *lacks;
	size_t nlacks;
} slice_stats_t;

refit_status_t slice_run(const slice_cfg_t *c, slice_stats_t *st, refit_err_t *err);

#endif
