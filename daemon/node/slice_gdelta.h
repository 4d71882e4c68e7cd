/*
 * slice_gdelta.h - a slice's delta refit in the grouped form (nccl; issue
 * 26 item 3, docs/delta.md "nccl").  Per bucket, a message between this
 * node and a peer that both hold the named base (RunSliceRequest.
 * delta_base and delta_nodes, the same on every node, so both ends agree)
 * crosses in two groups: first its size message (dataplane/delta_gpu.h:
 * the wire bytes and the base's tag), then the wire bytes -- the encoding
 * against the base the sender keeps on its device for (peer, message),
 * when it holds that base and the encoding is smaller, else the dense
 * message.  The receiver decodes against its own base in place, which
 * becomes the message.  Every message sent or received becomes the base
 * for the next refit (daemon/node/gdelta_base.h; dense when its rank's
 * share has no room, reported as bases not kept).
 */
#ifndef REFIT_DAEMON_NODE_SLICE_GDELTA_H
#define REFIT_DAEMON_NODE_SLICE_GDELTA_H

#include "daemon/node/slice_internal.h"

/* At the session's open (dev known): bases of another epoch or plan go. */
void sgd_begin(slice_t *s);
/* The bucket's messages are packed and their ops queued: *ops the size
 * messages' group when the bucket has any, else the data ops. */
refit_status_t sgd_group(slice_t *s, const xport_op_t **ops, size_t *n, refit_err_t *err);
/* The size group ran: the data group's receive counts set, *again true
 * (the next call of slice_next_group returns it). */
refit_status_t sgd_sizes_done(slice_t *s, refit_err_t *err);
/* The data group ran: arrivals decoded into their bases, the bases of
 * what was sent and received kept; receive ops then point at the dense
 * message. */
refit_status_t sgd_arrived(slice_t *s, refit_err_t *err);
/* The slice failed, its session open or not (before it closes): every
 * base of the node goes (gdelta_drop_all), whether this model's delta is
 * on or not: the transport may have dropped the arenas. */
void sgd_fail(slice_t *s);
/* The slice's figures into st (bases_kept: ok and every message kept). */
void sgd_end(slice_t *s, slice_stats_t *st, bool ok);

#endif
