/*
 * slice_delta.h - a slice's delta refit over a stream transport (tcp):
 * each unit (a message, or the run of its parts that went together) is
 * sent encoded against the base the node last sent that peer for the same
 * message of the same plan (dataplane/delta.c), when the coordinator named
 * that base (RunSliceRequest.delta_base), both nodes hold it for every
 * part of the unit, and the encoding is smaller; the receiver decodes it
 * against the base it last received.  On the wire a delta unit's seq has
 * SEQ_DELTA set and its bytes are:
 *
 *   u64 base tag, u64 the unit's dense bytes, u32 CRC-32C of the base's
 *   bytes, u32 zero, the codec's encoding, then (verify) the 4 CRC bytes
 *   of the dense unit, checked after decoding as for a dense unit.
 *
 * A receiver that does not hold the named base (tag, every part, CRC)
 * fails the slice naming it: it never writes a byte from a wrong base.
 * Every unit sent or received, dense or delta, becomes the base for the
 * next refit (tagged with this refit) when the store has room.
 */
#ifndef REFIT_DAEMON_NODE_SLICE_DELTA_H
#define REFIT_DAEMON_NODE_SLICE_DELTA_H

#include "common/err.h"
#include "daemon/node/delta_base.h"
#include "daemon/node/slice.h"
#include "plan/plan.h"

#define SEQ_DELTA (UINT64_C(1) << 63)
#define SDELTA_HDR 24u

typedef struct sdelta {
	delta_store_t *store;   /* NULL: no delta, no bases kept */
	delta_tab_t **out, **in;/* per node */
	size_t nnodes;
	uint64_t tag, base;     /* this refit's tag; the base named (0: none) */
	const bool *ok;         /* per node: it holds the base too (NULL: none does) */
	uint8_t **enc;          /* per node: the encoded unit on the wire */
	uint8_t *dec;           /* a decoded unit */
	uint64_t cap;           /* a unit's most bytes, trailer included */
	bool kept;              /* every table held (a unit without room: lack) */
	uint32_t *const *skip;  /* per node: messages it holds no base of (sorted) */
	const size_t *nskip;
	uint8_t **lack;         /* per node: bitmap of messages received, no base kept */
	size_t *nin;
	uint64_t delta_units, delta_wire, delta_dense, dense_units, dense_wire;
} sdelta_t;

/* Per node: messages out and in (nout, nin), the largest unit (cap). */
void sdelta_init(sdelta_t *d, delta_store_t *store, const char *model, const char *digest,
		 const char *const *peers, const size_t *nout, const size_t *nin, size_t nnodes,
		 size_t self, uint64_t tag, uint64_t base, const bool *ok, uint64_t cap);
void sdelta_fini(sdelta_t *d);
/* sdelta_init for slice c (stream transports only: nccl runs dense), its
 * messages out and in per node; sdelta_end puts the figures into st
 * (bases_kept: ok and every table held; lacks: the messages received
 * without room for their base, at most SDELTA_LACKS_MAX, else none kept)
 * and ends it. */
#define SDELTA_LACKS_MAX 4096
void sdelta_begin(sdelta_t *d, const slice_cfg_t *c, const size_t *nout, const size_t *nin,
		  uint64_t cap);
void sdelta_end(sdelta_t *d, slice_stats_t *st, bool ok);

/*
 * Unit [k0, k0 + n) of message pm (position pos in peer's list) was packed
 * in dense (len bytes, trail of them the CRC): *wire, *wlen are what to send
 * (the encoding when smaller, *delta true) and the unit becomes the base.
 */
void sdelta_out(sdelta_t *d, size_t peer, size_t pos, const plan_msg_t *pm, uint32_t k0,
		uint32_t n, unsigned esize, const uint8_t *dense, uint64_t len, uint64_t trail,
		const uint8_t **wire, uint64_t *wlen, bool *delta);

/* A delta frame's dense unit bytes (its trailer not counted), or an error. */
refit_status_t sdelta_frame_len(const uint8_t *f, uint64_t flen, uint64_t trail,
				uint64_t *dense, refit_err_t *err);

/* Decode a delta frame of unit [k0, k0 + n) from peer: *dense (its
 * trailer after it) valid until the next call. */
refit_status_t sdelta_in(sdelta_t *d, size_t peer, const char *peer_id, size_t pos,
			 const plan_msg_t *pm, uint32_t k0, uint32_t n, unsigned esize,
			 const uint8_t *f, uint64_t flen, uint64_t trail, const uint8_t **dense,
			 refit_err_t *err);

/* A unit received (dense bytes, trailer not counted) becomes the base
 * (without room: the message is a lack, reported). */
void sdelta_keep_in(sdelta_t *d, size_t peer, size_t pos, const plan_msg_t *pm, uint32_t k0,
		    uint32_t n, const uint8_t *dense, uint64_t bytes);

#endif
