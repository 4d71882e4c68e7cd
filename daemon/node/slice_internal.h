/*
 * slice_internal.h - what the files of a node's slice executor share: the
 * slice's state (its messages, their parts and dependencies, per-peer
 * buffers, the grouped form's buckets) and each file's functions for the
 * others.  The files call one another in one direction only (no cycle:
 * tests/check-layers.py):
 *
 *   slice.c         one slice: init, the session (stream or grouped) and
 *                   its message loop, slice_run
 *   slice_group.c   the grouped form (nccl): buckets, one NCCL group each
 *   slice_gdelta.c  the grouped form's delta: size messages, encodings,
 *                   bases on the devices (called by slice_group.c)
 *   slice_build.c   the slice's messages and parts collected from the
 *                   plan, relay dependencies linked, buffers at begin
 *   slice_stream.c  the stream form's pull and push: parts done, relays
 *                   cut through as their pieces land, stage timing
 */
#ifndef REFIT_DAEMON_NODE_SLICE_INTERNAL_H
#define REFIT_DAEMON_NODE_SLICE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/alloc.h"
#include "daemon/node/slice.h"
#include "daemon/node/slice_delta.h"

enum { M_OUT, M_IN, M_LOCAL };

typedef struct smsg {
	plan_msg_t m;        /* parts point into the slice's part table */
	size_t part0;
	uint8_t kind;        /* M_OUT, M_IN, M_LOCAL */
	bool done;
	uint32_t peer;       /* the other node (M_OUT, M_IN) */
	uint32_t pos;        /* index in its (sender, receiver) list: the wire's seq */
	uint32_t nleft;      /* its parts not yet sent, arrived or copied */
} smsg_t;

/*
 * A part of a message (the slice's part table, parallel to parts): the
 * unit of readiness.  A part that packs data this node received waits for
 * exactly the arrived parts it overlaps, so a relay goes piece by piece as
 * its pieces land (cut-through), not when every piece of its message has.
 */
typedef struct spart {
	uint32_t msg;        /* its message */
	uint32_t ndeps;      /* parts it still waits for (M_OUT, M_LOCAL) */
	uint32_t dep0, ndep; /* its dependents in the slice's dependents table */
	bool done;           /* sent, arrived or copied */
} spart_t;

/* On the wire a unit of message pos that starts at part k0 carries
 * seq = pos | k0 << 32 (a whole message: seq = pos); its length says
 * where it ends. */
#define SEQ_PART_SHIFT 32

typedef VEC(size_t) idxvec_t;

/* A message of this node in the grouped form: its (stage, bucket). */
typedef struct gmsg {
	size_t idx;          /* into msgs */
	uint32_t stage;
	uint64_t bucket;
	size_t order;        /* in the plan's message order */
} gmsg_t;

typedef struct gbuf {
	void *p;
	int32_t rank;        /* whose device holds it */
} gbuf_t;

/* A data op of the grouped form's delta (slice_gdelta.c), parallel to gops. */
typedef struct sgd_op {
	struct gdelta_ent *base;  /* receive: the base it decodes against */
	uint8_t *size;            /* its size message's device buffer (NULL: none) */
	void *dbuf;               /* its dense buffer */
	uint64_t dense;           /* its dense bytes (trailer included) */
	bool delta;               /* the wire bytes are an encoding */
} sgd_op_t;

/* The grouped form's delta (slice_gdelta.h). */
typedef struct sgd {
	struct gdelta_store *store; /* NULL: no delta, no bases kept */
	uint8_t phase;            /* 1: the size group is out; 2: the data group next; 3: out */
	VEC(xport_op_t) sops;     /* the size group */
	VEC(sgd_op_t) op;
	bool kept;
	uint64_t delta_units, delta_wire, delta_dense, dense_units, dense_wire;
} sgd_t;

typedef struct slice {
	const slice_cfg_t *c;
	dp_exec_t *x;
	VEC(smsg_t) msgs;
	VEC(plan_part_t) parts;
	VEC(spart_t) sp;     /* per part: its message, dependencies, state */
	VEC(uint32_t) deps;  /* dependents (part indices), grouped per part */
	idxvec_t *out, *in;  /* per node: message indices, plan order */
	idxvec_t *ready;     /* per node: outgoing parts whose data is here */
	size_t *ready_i, *in_got;
	idxvec_t work;       /* parts done whose dependents are to be told */
	uint8_t **buf;       /* per node: packed outgoing message */
	uint64_t *out_max;   /* per node: its largest message from here (self: local) */
	uint64_t *in_max;    /* per node: its largest message to here */
	uint64_t out_left, in_left, local_left, sent;
	uint64_t *stage_left;/* per stage: this node's messages not done */
	uint32_t round;      /* rounds before it are done here: relay data freed */
	bool *held;          /* per node: its packed buffer may still be on the wire */
	size_t nheld, cap;   /* buffers held; at most cap (staging_bytes) */
	slice_stats_t *st;
	int64_t t0;
	bool opened;         /* the transport session opened: messages were due */
	uint64_t trail;      /* verify: 4 CRC bytes after each message */
	/* the grouped form: this node's messages by (stage, bucket), the group
	 * [ga, gb) being run, its ops and their messages, its device staging */
	const dp_dev_ops_t *dev;  /* the session's device memory (NULL: host) */
	VEC(gmsg_t) gm;
	bool bucketed;
	size_t ga, gb;
	VEC(xport_op_t) gops;
	VEC(size_t) gopmsg;
	VEC(gbuf_t) gbufs;
	sdelta_t d;          /* delta refits (stream form) */
	sgd_t gd;            /* delta refits (grouped form) */
} slice_t;

/* slice_stream.c */
int64_t slice_now_us(void);
void slice_stage_done(slice_t *s, uint32_t stage);
const plan_msg_t *slice_msg_at(slice_t *s, size_t i);
uint64_t slice_payload(const plan_msg_t *m);
refit_status_t slice_finished(slice_t *s, refit_err_t *err);
refit_status_t slice_pull(void *arg, size_t peer, const uint8_t **buf, uint64_t *len,
			  uint64_t *seq, refit_err_t *err);
refit_status_t slice_push(void *arg, size_t peer, uint64_t seq, const uint8_t *buf,
			  uint64_t len, refit_err_t *err);
bool slice_done(void *arg);
bool slice_peer_done(void *arg, size_t peer);

/* slice_build.c */
refit_status_t slice_collect(slice_t *s, refit_err_t *err);
refit_status_t slice_begin(void *arg, refit_err_t *err);

/* slice_group.c */
refit_status_t slice_next_group(void *arg, const xport_op_t **ops, size_t *n, bool *end,
				refit_err_t *err);
void slice_group_free(slice_t *s);
refit_status_t slice_group_done(void *arg, refit_err_t *err);

#endif
