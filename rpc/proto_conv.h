/*
 * proto_conv.h - protobuf messages <-> plan/ structs, at the RPC edge.
 *
 * Requests are validated here with the planner's own checks, so an RPC
 * carrying a bad layout is answered with the same precise message a layout
 * file would get.  Nothing protobuf passes this file.
 */
#ifndef REFIT_RPC_PROTO_CONV_H
#define REFIT_RPC_PROTO_CONV_H

#include "common/strbuf.h"
#include "plan/plan.h"
#include "refit/v1/refit.pb-c.h"

/* Convert and validate tensors into *out (initialised by the caller). */
refit_status_t conv_layouts_from_proto(Refit__V1__TensorLayout *const *t, size_t n,
				       plan_layout_set_t *out, refit_err_t *err);
/*
 * SHA-256 over the canonical form of a layout set (tensor name, dtype,
 * shape, conversion, then every shard's rank and box, in order), as hex.
 */
void conv_layouts_digest(const plan_layout_set_t *s, char hex[SHA256_HEX_LEN]);

/*
 * Layouts as protobuf messages (DTensor form kept); the strings of the
 * names point into s, which must outlive the result.  Free with
 * conv_layouts_proto_free.
 */
Refit__V1__TensorLayout **conv_layouts_to_proto(const plan_layout_set_t *s);
void conv_layouts_proto_free(Refit__V1__TensorLayout **v, size_t n);

/*
 * A slice of a plan on the wire (RunSliceRequest.slice_xfers): one record
 * per transfer, little-endian: u32 stage, i32 from, i32 to, u32 tensor,
 * then for each of the tensor's ndim dims i64 offset and i64 size (the
 * box itself, not an index into the plan's box table: a slice carries no
 * table).  conv_slice_put appends transfer x of p to out.
 */
#define CONV_SLICE_HEAD 16
void conv_slice_put(const plan_t *p, const plan_xfer_t *x, strbuf_t *out);
/*
 * Decode the n records of b (len bytes) into xfers[n] and their box table
 * boxes[n] (caller storage; record i's box is boxes[i], xfers[i].box = i);
 * ndim[t] gives tensor t's dims (t < ntensors).  Framing only: every
 * record complete and nothing left over, tensor indices in the table.
 * The error names the record.  The node checks the rest (node_slice.c).
 */
refit_status_t conv_slice_get(const uint8_t *b, size_t len, size_t n, const int *ndim,
			      uint32_t ntensors, plan_xfer_t *xfers, plan_box_t *boxes,
			      refit_err_t *err);

/*
 * Check every string field of an encoded message of type d (nested
 * messages too), from the wire bytes, before it is unpacked: well-formed
 * UTF-8 (proto3 requires it and standard clients fail on anything else),
 * no NUL byte (it would cut the C string: distinct names would collide),
 * at most CONV_MAX_STRING bytes.  Malformed wire data is left to the
 * unpacker.  The error names the message and field.
 */
#define CONV_MAX_STRING 1024
refit_status_t conv_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p,
				  size_t n, refit_err_t *err);

#endif
