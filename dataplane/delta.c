/*
 * delta.c - the delta codec (delta.h): scan, encode and decode one box's
 * bytes against a base, and the model of the encoded size.
 *
 * Changed elements are found 64 at a time: each 8-byte word of base XOR
 * new gives one bit per element lane that is not zero (a carry-free add
 * per lane, then a multiply gathers the lanes' top bits), so a block's
 * mask costs no branch; its set bits are then walked with ctz.  The mask
 * of a block is the bitmap format's byte for byte (little-endian hosts).
 * Encoding the best format writes the runs in one pass while counting,
 * and encodes again only where the bitmap or dense bytes are smaller.
 * Decoding checks the whole encoding first and writes only once it holds.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/wire.h"
#include "dataplane/delta.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "delta.c: the lane masks assume a little-endian host"
#endif

const char *
dp_delta_fmt_str(dp_delta_fmt_t f)
{
	switch (f) {
	case DP_DELTA_DENSE: return "dense";
	case DP_DELTA_BITMAP: return "bitmap";
	case DP_DELTA_RUNS: return "runs";
	default: return "?";
	}
}

static refit_status_t
check_args(const char *op, uint64_t nbytes, unsigned esize, refit_err_t *err)
{
	if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "delta %s: element size %u is not 1, 2, 4 or 8", op, esize);
	if (nbytes % esize != 0 || nbytes >> 62 != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "delta %s: %llu bytes are not whole %u-byte elements (under "
				     "2^62 bytes)", op, (unsigned long long)nbytes, esize);
	return REFIT_OK;
}

static inline uint64_t
load64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

/* One bit per es-byte lane of x (8 / es bits, lane 0 lowest): lane != 0. */
static inline __attribute__((always_inline)) uint64_t
lanes(uint64_t x, unsigned es)
{
	uint64_t h;

	switch (es) {
	case 1:
		h = (((x & 0x7f7f7f7f7f7f7f7full) + 0x7f7f7f7f7f7f7f7full) | x) &
		    0x8080808080808080ull;
		return (h >> 7) * 0x0102040810204080ull >> 56;
	case 2:
		h = (((x & 0x7fff7fff7fff7fffull) + 0x7fff7fff7fff7fffull) | x) &
		    0x8000800080008000ull;
		return ((h >> 15) * 0x0000200040008001ull >> 45) & 0xf;
	case 4:
		h = (((x & 0x7fffffff7fffffffull) + 0x7fffffff7fffffffull) | x) &
		    0x8000000080000000ull;
		return ((h >> 31) & 1) | (h >> 62);
	default:
		return x != 0;
	}
}

static inline __attribute__((always_inline)) uint64_t
block_mask_es(const uint8_t *a, const uint8_t *b, unsigned es)
{
	uint64_t m = 0;

	for (unsigned w = 0; w < 8 * es; w++)
		m |= lanes(load64(a + 8 * w) ^ load64(b + 8 * w), es) << (w * (8 / es));
	return m;
}

static inline int
elem_eq(const uint8_t *a, const uint8_t *b, unsigned es)
{
	switch (es) {
	case 1: return a[0] == b[0];
	case 2: return memcmp(a, b, 2) == 0;
	case 4: return memcmp(a, b, 4) == 0;
	default: return memcmp(a, b, 8) == 0;
	}
}

/* Bit j: element blk + j differs (blk a multiple of 64; fewer past n). */
static uint64_t
diff_mask(const uint8_t *a, const uint8_t *b, uint64_t n, unsigned es, uint64_t blk)
{
	uint64_t m = 0;

	a += blk * es;
	b += blk * es;
	if (n - blk >= 64) {
		switch (es) {
		case 1: return block_mask_es(a, b, 1);
		case 2: return block_mask_es(a, b, 2);
		case 4: return block_mask_es(a, b, 4);
		default: return block_mask_es(a, b, 8);
		}
	}
	for (uint64_t j = 0; j < n - blk; j++)
		m |= (uint64_t)!elem_eq(a + j * es, b + j * es, es) << j;
	return m;
}

static inline void
copy_elems(uint8_t *d, const uint8_t *s, uint64_t k, unsigned es)
{
	if (k == 1) {
		switch (es) {
		case 1: *d = *s; return;
		case 2: memcpy(d, s, 2); return;
		case 4: memcpy(d, s, 4); return;
		default: memcpy(d, s, 8); return;
		}
	}
	memcpy(d, s, k * es);
}

/* Bytes of v in LEB128. */
static inline unsigned
vlen(uint64_t v)
{
	unsigned n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static inline uint8_t *
vput(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* The runs format's pass: its body written at p while it fits before lim
 * (p NULL: counted only); counts into *sc; the body's bytes. */
typedef struct runs_w {
	uint8_t *p;
	const uint8_t *lim;
	uint64_t bytes, prev;
} runs_w_t;

static void
runs_flush(runs_w_t *w, const uint8_t *b, unsigned es, uint64_t start, uint64_t end)
{
	uint64_t len = end - start, v = (start - w->prev) << 1 | (len > 1);
	uint64_t need = vlen(v) + (len > 1 ? vlen(len - 2) : 0) + len * es;

	w->bytes += need;
	if (w->p != NULL && need <= (uint64_t)(w->lim - w->p)) {
		w->p = vput(w->p, v);
		if (len > 1)
			w->p = vput(w->p, len - 2);
		copy_elems(w->p, b + start * es, end - start, es);
		w->p += (end - start) * es;
	} else {
		w->p = NULL;   /* past lim: counted from here on */
	}
	w->prev = end;
}

static uint64_t
runs_pass(const uint8_t *a, const uint8_t *b, uint64_t nbytes, unsigned es, uint8_t *p,
	  const uint8_t *lim, dp_delta_scan_t *sc)
{
	uint64_t n = nbytes / es, start = 0, end = 0;
	runs_w_t w = {p, lim, 0, 0};

	for (uint64_t blk = 0; blk < n; blk += 64) {
		uint64_t m = diff_mask(a, b, n, es, blk);

		sc->changed += (uint64_t)__builtin_popcountll(m);
		while (m != 0) {
			uint64_t i = blk + (uint64_t)__builtin_ctzll(m);

			m &= m - 1;
			if (i == end && end > start) {
				end++;
				continue;
			}
			if (end > start) {
				runs_flush(&w, b, es, start, end);
				sc->runs++;
			}
			start = i;
			end = i + 1;
		}
	}
	if (end > start) {
		runs_flush(&w, b, es, start, end);
		sc->runs++;
	}
	return w.bytes;
}

static void
fill_sizes(dp_delta_scan_t *sc, uint64_t nbytes, unsigned es, uint64_t runs_body)
{
	sc->nelem = nbytes / es;
	sc->size[DP_DELTA_DENSE] = DP_DELTA_HDR + nbytes;
	sc->size[DP_DELTA_BITMAP] = DP_DELTA_HDR + (sc->nelem + 7) / 8 + sc->changed * es;
	sc->size[DP_DELTA_RUNS] = DP_DELTA_HDR + runs_body;
}

refit_status_t
dp_delta_scan(const void *base, const void *cur, uint64_t nbytes, unsigned esize,
	      dp_delta_scan_t *sc, refit_err_t *err)
{
	refit_status_t st;

	memset(sc, 0, sizeof(*sc));
	if ((st = check_args("scan", nbytes, esize, err)) != REFIT_OK)
		return st;
	fill_sizes(sc, nbytes, esize, runs_pass(base, cur, nbytes, esize, NULL, NULL, sc));
	return REFIT_OK;
}

dp_delta_fmt_t
dp_delta_best(const dp_delta_scan_t *sc)
{
	dp_delta_fmt_t best = DP_DELTA_DENSE;

	for (int f = DP_DELTA_BITMAP; f < DP_DELTA_NFMT; f++)
		if (sc->size[f] < sc->size[best])
			best = (dp_delta_fmt_t)f;
	return best;
}

/* The bitmap body at p (room checked by the caller): the blocks' masks,
 * then the changed elements' bytes. */
static void
enc_bitmap(const uint8_t *a, const uint8_t *b, uint64_t nbytes, unsigned es, uint8_t *p)
{
	uint64_t n = nbytes / es;
	uint8_t *v = p + (n + 7) / 8;

	for (uint64_t blk = 0; blk < n; blk += 64) {
		uint64_t m = diff_mask(a, b, n, es, blk);
		uint64_t nb = n - blk >= 64 ? 8 : (n - blk + 7) / 8;

		wire_put_le(p + blk / 8, m, (int)nb);
		while (m != 0) {
			copy_elems(v, b + (blk + (uint64_t)__builtin_ctzll(m)) * es, 1, es);
			v += es;
			m &= m - 1;
		}
	}
}

static void
put_header(uint8_t *out, dp_delta_fmt_t fmt, unsigned es, uint64_t n, uint64_t changed)
{
	out[0] = (uint8_t)fmt;
	out[1] = (uint8_t)es;
	memset(out + 2, 0, 6);
	wire_put_le(out + 8, n, 8);
	wire_put_le(out + 16, changed, 8);
}

static refit_status_t
too_small(refit_err_t *err, uint64_t cap, uint64_t nbytes, dp_delta_fmt_t fmt)
{
	return refit_err_set(err, REFIT_ERR_LIMIT,
			     "delta encode: %llu bytes of room are too few for %llu bytes as %s",
			     (unsigned long long)cap, (unsigned long long)nbytes,
			     dp_delta_fmt_str(fmt));
}

/* Write fmt's encoding given the scan (the runs body already written when
 * runs_done). */
static refit_status_t
emit(const uint8_t *a, const uint8_t *b, uint64_t nbytes, unsigned es, dp_delta_fmt_t fmt,
     const dp_delta_scan_t *sc, int runs_done, uint8_t *out, uint64_t cap, uint64_t *len,
     refit_err_t *err)
{
	dp_delta_scan_t again = {0};

	if (cap < sc->size[fmt])
		return too_small(err, cap, nbytes, fmt);
	if (fmt == DP_DELTA_DENSE)
		memcpy(out + DP_DELTA_HDR, b, nbytes);
	else if (fmt == DP_DELTA_BITMAP)
		enc_bitmap(a, b, nbytes, es, out + DP_DELTA_HDR);
	else if (!runs_done)
		runs_pass(a, b, nbytes, es, out + DP_DELTA_HDR, out + cap, &again);
	put_header(out, fmt, es, nbytes / es, sc->changed);
	*len = sc->size[fmt];
	return REFIT_OK;
}

refit_status_t
dp_delta_encode(const void *base, const void *cur, uint64_t nbytes, unsigned esize,
		dp_delta_fmt_t fmt, uint8_t *out, uint64_t cap, uint64_t *len, refit_err_t *err)
{
	dp_delta_scan_t sc;
	refit_status_t st;

	*len = 0;
	if ((st = check_args("encode", nbytes, esize, err)) != REFIT_OK)
		return st;
	if (fmt != DP_DELTA_DENSE && fmt != DP_DELTA_BITMAP && fmt != DP_DELTA_RUNS)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "delta encode: format %d unknown",
				     (int)fmt);
	memset(&sc, 0, sizeof(sc));
	if (fmt == DP_DELTA_RUNS && cap >= DP_DELTA_HDR) {
		/* one pass: written while it fits, sized either way */
		fill_sizes(&sc, nbytes, esize,
			   runs_pass(base, cur, nbytes, esize, out + DP_DELTA_HDR, out + cap, &sc));
		return emit(base, cur, nbytes, esize, fmt, &sc, 1, out, cap, len, err);
	}
	fill_sizes(&sc, nbytes, esize, runs_pass(base, cur, nbytes, esize, NULL, NULL, &sc));
	return emit(base, cur, nbytes, esize, fmt, &sc, 0, out, cap, len, err);
}

refit_status_t
dp_delta_encode_best(const void *base, const void *cur, uint64_t nbytes, unsigned esize,
		     uint8_t *out, uint64_t cap, uint64_t *len, dp_delta_fmt_t *fmt,
		     refit_err_t *err)
{
	dp_delta_scan_t sc;
	refit_status_t st;

	*len = 0;
	if ((st = check_args("encode", nbytes, esize, err)) != REFIT_OK)
		return st;
	if (cap < DP_DELTA_HDR + nbytes)
		return too_small(err, cap, nbytes, DP_DELTA_DENSE);
	memset(&sc, 0, sizeof(sc));
	/* the runs, written while no larger than dense; the other sizes follow */
	fill_sizes(&sc, nbytes, esize,
		   runs_pass(base, cur, nbytes, esize, out + DP_DELTA_HDR,
			     out + DP_DELTA_HDR + nbytes, &sc));
	*fmt = dp_delta_best(&sc);
	return emit(base, cur, nbytes, esize, *fmt, &sc, *fmt == DP_DELTA_RUNS, out, cap, len,
		    err);
}

/* LEB128 at *p (before lim), at most 64 bits, no superfluous bytes. */
static inline int
vget(const uint8_t **p, const uint8_t *lim, uint64_t *v)
{
	uint64_t x = 0;
	unsigned shift = 0;

	if (*p < lim && **p < 0x80) {
		*v = *(*p)++;
		return 0;
	}

	for (const uint8_t *q = *p; q < lim; q++, shift += 7) {
		uint64_t byte = *q & 0x7f;

		if (shift == 63 && byte > 1)
			return -1;               /* past 64 bits */
		x |= byte << shift;
		if ((*q & 0x80) == 0) {
			if (*q == 0 && q != *p)
				return -1;       /* overlong */
			*v = x;
			*p = q + 1;
			return 0;
		}
		if (shift == 63)
			return -1;
	}
	return -1;                               /* truncated */
}

static refit_status_t
bad(refit_err_t *err, const char *what, uint64_t a, uint64_t b)
{
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "delta decode: %s (%llu, %llu)", what,
			     (unsigned long long)a, (unsigned long long)b);
}

/* Check the runs of body [p, lim) of n elements, changed of them. */
static refit_status_t
check_runs(const uint8_t *p, const uint8_t *lim, uint64_t n, unsigned es, uint64_t changed,
	   refit_err_t *err)
{
	uint64_t pos = 0, seen = 0, run = 0, v, gap, l = 0, rem;

	for (; p < lim; run++) {
		if (vget(&p, lim, &v) != 0 || ((v & 1) && vget(&p, lim, &l) != 0))
			return bad(err, "run's numbers truncated, overlong or past 64 bits "
				   "(run, element)", run, pos);
		gap = v >> 1;
		if (gap == 0 && run > 0)
			return bad(err, "run follows the previous one with no gap (run, element)",
				   run, pos);
		rem = gap <= n - pos ? n - pos - gap : 0;
		if (gap > n - pos || rem < ((v & 1) ? 2 : 1) || ((v & 1) && l > rem - 2))
			return bad(err, "run past the last element (run, elements)", run, n);
		l = (v & 1) ? l + 2 : 1;
		if (l * es > (uint64_t)(lim - p))
			return bad(err, "run's values truncated (run, bytes left)", run,
				   (uint64_t)(lim - p));
		p += l * es;
		pos += gap + l;
		seen += l;
	}
	if (seen != changed)
		return bad(err, "runs hold another count of elements than the header "
			   "(runs', header's)", seen, changed);
	return REFIT_OK;
}

static void
apply_runs(const uint8_t *p, const uint8_t *lim, unsigned es, uint8_t *out)
{
	uint64_t pos = 0, v = 0, l = 0;

	while (p < lim) {
		vget(&p, lim, &v);
		l = 0;
		if (v & 1)
			vget(&p, lim, &l);
		l = (v & 1) ? l + 2 : 1;
		pos += v >> 1;
		copy_elems(out + pos * es, p, l, es);
		p += l * es;
		pos += l;
	}
}

/* Check the bitmap of n elements (its bits past n clear, changed set). */
static refit_status_t
check_bitmap(const uint8_t *bits, uint64_t n, uint64_t changed, refit_err_t *err)
{
	uint64_t set = 0, nb = (n + 7) / 8, i = 0;

	for (; i + 8 <= nb; i += 8)
		set += (uint64_t)__builtin_popcountll(load64(bits + i));
	for (; i < nb; i++)
		set += (uint64_t)__builtin_popcount(bits[i]);
	if ((n & 7) && (bits[nb - 1] >> (n & 7)) != 0)
		return bad(err, "bitmap bits set past the last element (elements, last byte)", n,
			   bits[nb - 1]);
	if (set != changed)
		return bad(err, "bitmap holds another count of elements than the header "
			   "(bitmap's, header's)", set, changed);
	return REFIT_OK;
}

static void
apply_bitmap(const uint8_t *bits, uint64_t n, unsigned es, const uint8_t *v, uint8_t *out)
{
	uint64_t nb = (n + 7) / 8;

	for (uint64_t w = 0; w < nb; w += 8) {
		uint64_t m = 0;

		if (w + 8 <= nb)
			m = wire_get_le(bits + w, 8);
		else
			m = wire_get_le(bits + w, (int)(nb - w));
		while (m != 0) {
			uint64_t i = w * 8 + (uint64_t)__builtin_ctzll(m);

			copy_elems(out + i * es, v, 1, es);
			v += es;
			m &= m - 1;
		}
	}
}

refit_status_t
dp_delta_decode(const void *base, void *out, uint64_t nbytes, unsigned esize,
		const uint8_t *enc, uint64_t len, refit_err_t *err)
{
	uint64_t n, hn, changed, body;
	const uint8_t *p = enc + DP_DELTA_HDR;
	refit_status_t st;

	if ((st = check_args("decode", nbytes, esize, err)) != REFIT_OK)
		return st;
	n = nbytes / esize;
	if (len < DP_DELTA_HDR)
		return bad(err, "shorter than its header (bytes, header)", len, DP_DELTA_HDR);
	hn = wire_get_le(enc + 8, 8);
	changed = wire_get_le(enc + 16, 8);
	body = len - DP_DELTA_HDR;
	if (enc[0] >= DP_DELTA_NFMT)
		return bad(err, "unknown format (format, element size)", enc[0], enc[1]);
	if (enc[1] != esize)
		return bad(err, "element size not the box's (encoded, box's)", enc[1], esize);
	if (wire_get_le(enc + 2, 6) != 0)
		return bad(err, "reserved header bytes not zero (value, format)",
			   wire_get_le(enc + 2, 6), enc[0]);
	if (hn != n)
		return bad(err, "element count not the box's (encoded, box's)", hn, n);
	if (changed > n)
		return bad(err, "more changed elements than elements (changed, elements)", changed,
			   n);
	switch ((dp_delta_fmt_t)enc[0]) {
	case DP_DELTA_DENSE:
		if (body != nbytes)
			return bad(err, "dense body of another size (bytes, box's)", body, nbytes);
		memcpy(out, p, nbytes);
		return REFIT_OK;
	case DP_DELTA_BITMAP:
		if (body < (n + 7) / 8 || body - (n + 7) / 8 != changed * esize)
			return bad(err, "bitmap body of another size (bytes, expected)", body,
				   (n + 7) / 8 + changed * esize);
		if ((st = check_bitmap(p, n, changed, err)) != REFIT_OK)
			return st;
		if (out != base)
			memcpy(out, base, nbytes);
		apply_bitmap(p, n, esize, p + (n + 7) / 8, out);
		return REFIT_OK;
	default:
		if ((st = check_runs(p, p + body, n, esize, changed, err)) != REFIT_OK)
			return st;
		if (out != base)
			memcpy(out, base, nbytes);
		apply_runs(p, p + body, esize, out);
		return REFIT_OK;
	}
}

/* Expected LEB128 bytes of X when P(X >= x) = tail^x (x >= 0). */
static double
vlen_expect(double tail)
{
	double e = 1.0, x = 128.0;

	for (int k = 1; k < 10 && tail > 0.0; k++, x *= 128.0) {
		double pk = pow(tail, x);

		if (pk < 1e-300)
			break;
		e += pk;
	}
	return e;
}

double
dp_delta_model_bytes(double density, unsigned esize)
{
	double d = density < 0.0 ? 0.0 : density > 1.0 ? 1.0 : density;
	double bitmap = 0.125 + d * esize, runs = d * esize, best = esize;

	/* d(1 - d) runs per element, each with the number 2G + (L > 1): G >= 1
	 * unchanged elements before it, P(G >= x) = (1 - d)^(x - 1), so one
	 * byte and one more for each 2^(7k - 1) G reaches; and, with
	 * probability d (L > 1), L - 2: P(L - 2 >= x | L > 1) = d^x. */
	if (d > 0.0 && d < 1.0) {
		double g = 1.0;

		for (double x = 64.0; x < 1e19; x *= 128.0) {
			double pk = pow(1.0 - d, x - 1.0);

			if (pk < 1e-300)
				break;
			g += pk;
		}
		runs += d * (1.0 - d) * (g + d * vlen_expect(d));
	}
	if (bitmap < best)
		best = bitmap;
	if (runs < best)
		best = runs;
	return best;
}
