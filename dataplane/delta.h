/*
 * delta.h - the delta codec: a box's new bytes encoded against the base
 * bytes the receiver already holds (issue 26).  libc only; no allocation,
 * no threads, no state: every function is safe on any thread.
 *
 * Elements are compared by their bits (esize 1, 2, 4 or 8 bytes), never as
 * numbers, so -0.0 against 0.0 and NaNs with other payloads are changes, and
 * decoding reproduces the new bytes exactly.  One encoding, little-endian:
 *
 *   header (DP_DELTA_HDR bytes): u8 format, u8 esize, 6 zero bytes,
 *                                u64 elements, u64 changed elements
 *   DP_DELTA_DENSE   the elements' new bytes
 *   DP_DELTA_BITMAP  ceil(elements / 8) bytes, bit i (LSB first) set when
 *                    element i changed, then the changed elements' new bytes
 *   DP_DELTA_RUNS    per maximal run of changed elements: LEB128 of
 *                    2 * gap + (length > 1), gap the unchanged elements
 *                    before it (since the previous run; 0 only for a first
 *                    run at element 0); when length > 1, LEB128 of
 *                    length - 2; its new bytes.  (Changes are mostly
 *                    alone: a run of one costs one byte while gap < 64.)
 *
 * The formats are strict: one encoding per (base, new, format).  A decoder
 * refuses anything else (sizes, bits past the end, counts, overlong or
 * truncated numbers, runs past the end) with REFIT_ERR_INVALID_ARG before
 * it writes a byte.
 */
#ifndef REFIT_DATAPLANE_DELTA_H
#define REFIT_DATAPLANE_DELTA_H

#include <stdint.h>

#include "common/err.h"

#define DP_DELTA_HDR 24u

typedef enum dp_delta_fmt {
	DP_DELTA_DENSE = 0,
	DP_DELTA_BITMAP = 1,
	DP_DELTA_RUNS = 2,
	DP_DELTA_NFMT
} dp_delta_fmt_t;

typedef struct dp_delta_scan {
	uint64_t nelem;              /* elements of the box */
	uint64_t changed;            /* elements whose bits differ */
	uint64_t runs;               /* maximal runs of changed elements */
	uint64_t size[DP_DELTA_NFMT]; /* each format's encoded bytes, header included */
} dp_delta_scan_t;

/* Static name of a format ("dense", "bitmap", "runs", "?"). */
const char *dp_delta_fmt_str(dp_delta_fmt_t f);

/*
 * Compare cur with base (nbytes each, a multiple of esize, under 2^62)
 * and fill *sc
 * with the counts and every format's size.  REFIT_ERR_INVALID_ARG for an
 * esize other than 1, 2, 4, 8 or a size that is not a multiple of it.
 */
refit_status_t dp_delta_scan(const void *base, const void *cur, uint64_t nbytes,
			     unsigned esize, dp_delta_scan_t *sc, refit_err_t *err);

/* The smallest format of a scan (dense on a tie). */
dp_delta_fmt_t dp_delta_best(const dp_delta_scan_t *sc);

/*
 * Encode cur against base in format fmt into out (cap bytes; the scan's
 * size[fmt] is enough, and DP_DELTA_HDR + nbytes is for the scan's best
 * format); *len gets the bytes written.  REFIT_ERR_INVALID_ARG for a bad esize, size or format,
 * REFIT_ERR_LIMIT when cap is too small (out then holds nothing useful).
 */
refit_status_t dp_delta_encode(const void *base, const void *cur, uint64_t nbytes,
			       unsigned esize, dp_delta_fmt_t fmt, uint8_t *out,
			       uint64_t cap, uint64_t *len, refit_err_t *err);

/*
 * Encode cur against base in its smallest format (as dp_delta_best of a
 * scan would choose) into out, cap bytes, at least DP_DELTA_HDR + nbytes;
 * *fmt and *len get the format and the bytes written.  Sparse boxes take
 * one pass over the two (the runs format is written while counting).
 * REFIT_ERR_INVALID_ARG for a bad esize or size, REFIT_ERR_LIMIT for a
 * smaller cap.
 */
refit_status_t dp_delta_encode_best(const void *base, const void *cur, uint64_t nbytes,
				    unsigned esize, uint8_t *out, uint64_t cap, uint64_t *len,
				    dp_delta_fmt_t *fmt, refit_err_t *err);

/*
 * Decode enc (len bytes, untrusted) against base into out (nbytes each):
 * out becomes the encoded box's new bytes.  out may be base itself (the
 * receiver's copy updated in place); otherwise the two must not overlap.
 * REFIT_ERR_INVALID_ARG, naming what is wrong, for an encoding that is not
 * one of nbytes / esize elements of esize bytes: out is then untouched.
 */
refit_status_t dp_delta_decode(const void *base, void *out, uint64_t nbytes, unsigned esize,
			       const uint8_t *enc, uint64_t len, refit_err_t *err);

/*
 * The model of an encoding's size: expected bytes per element of the
 * smallest format (header not counted) when each element changed
 * independently with probability density (0..1), esize bytes each.
 * The runs format's numbers cost what LEB128 costs for geometric gaps and
 * lengths; dense costs esize.
 */
double dp_delta_model_bytes(double density, unsigned esize);

#endif
