/*
 * delta_dev.h - the delta codec (dataplane/delta.h) as data-parallel
 * phases over tiles of DP_DELTA_TILE elements: what the GPU kernels
 * (daemon/transport/delta_kernels.cu) run, one thread per tile, and what
 * the emulator (tests/emu/emu_delta.c) runs on the host, tile by tile, so
 * the emulator checks these very functions against the host codec bit for
 * bit.  The encoding is the host codec's, byte for byte (same format
 * choice, dense on a tie); a decoder refuses what dp_delta_decode refuses,
 * with the same reasons, before it writes a byte.
 *
 * Encode: E1 (tiles) counts each tile's changes, its last changed and
 * first unchanged element; E2 scans those into each tile's context (the
 * end of the run before it, the first unchanged element at or after its
 * end, the changes before it); E3 (tiles) sizes the runs that start in
 * each tile (a run's length may reach past its tile: the context says
 * where it ends); E4 places each tile's runs, chooses the format, writes
 * the header and the result (length, format); E5 (tiles) writes each
 * tile's part of the body.  A scan (E2, E4) is three steps: a (nth
 * threads, each a chunk of tiles) sums, b (one thread) scans the nth sums,
 * c (nth threads) writes each chunk's tiles.
 * Decode: D1 (tiles) counts each bitmap tile's bits, D1b sums chunks; D2
 * (one thread) checks the header, the sizes, the bitmap's counts, or
 * parses every run (checking each) and notes where each tile's first run
 * begins; D2c places a bitmap's tiles; D3 (tiles) copies base to out (or
 * the dense body) once D2 accepted; D4 (tiles) writes each tile's changed
 * elements.
 *
 * Alignment: base, cur and a decode's out are aligned to esize and read
 * as esize-byte words; the encoding is byte-granular (LEB128 numbers
 * between values) and touched a byte at a time; scratch and result are
 * 8-aligned.  The one-thread steps are O(nth) (the scans' b) and O(runs)
 * for a runs decode's D2 (LEB128 numbers are found only in order).
 *
 * Plain C, stdint only: nvcc compiles it too.
 */
#ifndef REFIT_DATAPLANE_DELTA_DEV_H
#define REFIT_DATAPLANE_DELTA_DEV_H

#include <stdint.h>

#ifdef __CUDACC__
#define DPD_FN static __host__ __device__ inline
#else
#define DPD_FN static inline
#endif

#define DP_DELTA_TILE 256u   /* elements per tile: whole bitmap bytes */
#define DPD_HDR 24u          /* DP_DELTA_HDR */

enum { DPD_DENSE = 0, DPD_BITMAP = 1, DPD_RUNS = 2, DPD_NFMT = 3 };

/* One launch: encode (dir 0) cur against base into out, or decode (dir 1)
 * enc against base into out (out may be base). */
typedef struct dp_delta_op {
	const void *base;   /* nbytes, aligned to esize */
	const void *cur;    /* encode: the new bytes, nbytes, aligned to esize */
	void *out;          /* encode: cap >= DPD_HDR + nbytes bytes; decode: nbytes, aligned */
	const void *enc;    /* decode: the encoding, len bytes (untrusted) */
	void *scratch;      /* dp_delta_dev_scratch(nbytes, esize) bytes, 8-aligned */
	uint64_t *result;   /* 2 words: encode [length, format]; decode [0 or a DPD_E_*, detail] */
	uint64_t nbytes, cap, len;
	uint32_t esize, dir;
} dp_delta_op_t;

/* a decode's refusals: dp_delta_decode's reasons */
enum {
	DPD_OK = 0, DPD_E_SHORT, DPD_E_FORMAT, DPD_E_ESIZE, DPD_E_RESERVED, DPD_E_COUNT,
	DPD_E_CHANGED, DPD_E_DENSE_SIZE, DPD_E_BITMAP_SIZE, DPD_E_BITMAP_TAIL,
	DPD_E_BITMAP_SET, DPD_E_RUN_NUMBER, DPD_E_RUN_GAP, DPD_E_RUN_PAST, DPD_E_RUN_VALUES,
	DPD_E_RUN_SET, DPD_E_N
};

typedef struct dpd_glob {
	uint64_t n, nb, changed, runs_body, fmt, err, detail, pad;
} dpd_glob_t;

typedef struct dpd_tile {
	uint64_t changed;    /* E1: changes in the tile; D1: bitmap bits */
	uint64_t last_chg;   /* E1: 1 + its last changed element, 0: none */
	uint64_t first_unc;  /* E1: its first unchanged element, n: none */
	uint64_t prev_end;   /* E2: 1 + the last change before it (0: none); D2: the
			      * element after the run before its first run */
	uint64_t next_unc;   /* E2: the first unchanged element at or after its end, or n */
	uint64_t chg_before; /* E2, D2: changes before it */
	uint64_t runs_bytes; /* E3: runs-format bytes of the runs starting in it */
	uint64_t runs_off;   /* E4: body offset of its first run; D2: likewise, parsed */
} dpd_tile_t;

/* the scans: each of nth threads (at most DPD_SCAN_MAX) sums a chunk of
 * tiles, one thread scans the sums, each thread writes its chunk */
#define DPD_SCAN_MAX 1024u

typedef struct dpd_agg {
	uint64_t changed, last_chg, first_unc, runs;
} dpd_agg_t;

DPD_FN uint64_t
dp_delta_dev_tiles(uint64_t nbytes, uint32_t esize)
{
	return (nbytes / esize + DP_DELTA_TILE - 1) / DP_DELTA_TILE;
}

/* Scratch bytes a launch of nbytes in esize-byte elements needs. */
DPD_FN uint64_t
dp_delta_dev_scratch(uint64_t nbytes, uint32_t esize)
{
	return sizeof(dpd_glob_t) + DPD_SCAN_MAX * sizeof(dpd_agg_t) +
	       dp_delta_dev_tiles(nbytes, esize) * sizeof(dpd_tile_t);
}

DPD_FN dpd_glob_t *
dpd_glob(const dp_delta_op_t *a)
{
	return (dpd_glob_t *)a->scratch;
}

DPD_FN dpd_tile_t *
dpd_tile(const dp_delta_op_t *a, uint64_t t)
{
	return (dpd_tile_t *)((uint8_t *)a->scratch + sizeof(dpd_glob_t) +
			      DPD_SCAN_MAX * sizeof(dpd_agg_t)) + t;
}

DPD_FN dpd_agg_t *
dpd_agg(const dp_delta_op_t *a, uint32_t th)
{
	return (dpd_agg_t *)((uint8_t *)a->scratch + sizeof(dpd_glob_t)) + th;
}

/* thread th of nth: its chunk of tiles [*t0, *t1) */
DPD_FN void
dpd_chunk(const dp_delta_op_t *a, uint32_t th, uint32_t nth, uint64_t *t0, uint64_t *t1)
{
	uint64_t nt = dp_delta_dev_tiles(a->nbytes, a->esize), per = (nt + nth - 1) / nth;

	*t0 = th * per < nt ? th * per : nt;
	*t1 = *t0 + per < nt ? *t0 + per : nt;
}

/* element i of base and cur differ, compared as esize-byte words */
DPD_FN int
dpd_neq(const dp_delta_op_t *a, uint64_t i)
{
	switch (a->esize) {
	case 1: return ((const uint8_t *)a->base)[i] != ((const uint8_t *)a->cur)[i];
	case 2: return ((const uint16_t *)a->base)[i] != ((const uint16_t *)a->cur)[i];
	case 4: return ((const uint32_t *)a->base)[i] != ((const uint32_t *)a->cur)[i];
	default: return ((const uint64_t *)a->base)[i] != ((const uint64_t *)a->cur)[i];
	}
}

/* element i of src (aligned words) to byte address d */
DPD_FN void
dpd_put_elem(uint8_t *d, const void *src, uint64_t i, uint32_t es)
{
	uint64_t v;

	switch (es) {
	case 1: v = ((const uint8_t *)src)[i]; break;
	case 2: v = ((const uint16_t *)src)[i]; break;
	case 4: v = ((const uint32_t *)src)[i]; break;
	default: v = ((const uint64_t *)src)[i]; break;
	}
	for (uint32_t k = 0; k < es; k++)
		d[k] = (uint8_t)(v >> (8 * k));
}

/* es bytes at s (little-endian) into element i of dst (aligned words) */
DPD_FN void
dpd_get_elem(void *dst, uint64_t i, const uint8_t *s, uint32_t es)
{
	uint64_t v = 0;

	for (uint32_t k = 0; k < es; k++)
		v |= (uint64_t)s[k] << (8 * k);
	switch (es) {
	case 1: ((uint8_t *)dst)[i] = (uint8_t)v; break;
	case 2: ((uint16_t *)dst)[i] = (uint16_t)v; break;
	case 4: ((uint32_t *)dst)[i] = (uint32_t)v; break;
	default: ((uint64_t *)dst)[i] = v; break;
	}
}

DPD_FN uint64_t
dpd_vlen(uint64_t v)
{
	uint64_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

DPD_FN uint8_t *
dpd_vput(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* LEB128 at *p before lim: at most 64 bits, minimal; 0, or -1 refused */
DPD_FN int
dpd_vget(const uint8_t **p, const uint8_t *lim, uint64_t *v)
{
	uint64_t x = 0;
	unsigned shift = 0;

	for (const uint8_t *q = *p; q < lim; q++, shift += 7) {
		uint64_t byte = *q & 0x7f;

		if (shift == 63 && byte > 1)
			return -1;
		x |= byte << shift;
		if ((*q & 0x80) == 0) {
			if (*q == 0 && q != *p)
				return -1;
			*v = x;
			*p = q + 1;
			return 0;
		}
		if (shift == 63)
			return -1;
	}
	return -1;
}

DPD_FN void
dpd_range(const dp_delta_op_t *a, uint64_t t, uint64_t *s, uint64_t *e)
{
	uint64_t n = a->nbytes / a->esize;

	*s = t * DP_DELTA_TILE;
	*e = *s + DP_DELTA_TILE < n ? *s + DP_DELTA_TILE : n;
}

DPD_FN void
dpd_put_le(uint8_t *p, uint64_t v, int n)
{
	for (int k = 0; k < n; k++)
		p[k] = (uint8_t)(v >> (8 * k));
}

/* ---- encode ---------------------------------------------------------------- */

DPD_FN void
dpd_e1_count(const dp_delta_op_t *a, uint64_t t)
{
	dpd_tile_t *T = dpd_tile(a, t);
	uint64_t s, e, c = 0, last = 0, unc = a->nbytes / a->esize;

	dpd_range(a, t, &s, &e);
	for (uint64_t i = s; i < e; i++) {
		if (dpd_neq(a, i)) {
			c++;
			last = i + 1;
		} else if (unc == a->nbytes / a->esize) {
			unc = i;
		}
	}
	T->changed = c;
	T->last_chg = last;
	T->first_unc = unc;
}

/* E2a: thread th's chunk summed (changes, last change, first unchanged) */
DPD_FN void
dpd_e2a_sum(const dp_delta_op_t *a, uint32_t th, uint32_t nth)
{
	uint64_t t0, t1, n = a->nbytes / a->esize;
	dpd_agg_t g = {0, 0, n, 0};

	dpd_chunk(a, th, nth, &t0, &t1);
	for (uint64_t t = t0; t < t1; t++) {
		const dpd_tile_t *T = dpd_tile(a, t);

		g.changed += T->changed;
		if (T->last_chg)
			g.last_chg = T->last_chg;
		if (g.first_unc == n)
			g.first_unc = T->first_unc;
	}
	*dpd_agg(a, th) = g;
}

/* E2b: the sums scanned into what comes before (changes, the last change)
 * and after (the first unchanged element) each chunk */
DPD_FN void
dpd_e2b_scan(const dp_delta_op_t *a, uint32_t nth)
{
	uint64_t n = a->nbytes / a->esize, pe = 0, chg = 0, nu = n;

	for (uint32_t th = 0; th < nth; th++) {
		dpd_agg_t *g = dpd_agg(a, th);
		uint64_t c = g->changed, l = g->last_chg;

		g->changed = chg;
		g->last_chg = pe;
		chg += c;
		if (l)
			pe = l;
	}
	for (uint32_t th = nth; th-- > 0;) {
		dpd_agg_t *g = dpd_agg(a, th);
		uint64_t f = g->first_unc;

		g->first_unc = nu;
		if (f < n)
			nu = f;
	}
	dpd_glob(a)->n = n;
	dpd_glob(a)->changed = chg;
}

/* E2c: each tile of thread th's chunk gets its context */
DPD_FN void
dpd_e2c_context(const dp_delta_op_t *a, uint32_t th, uint32_t nth)
{
	const dpd_agg_t *g = dpd_agg(a, th);
	uint64_t t0, t1, n = a->nbytes / a->esize, pe = g->last_chg, chg = g->changed;
	uint64_t nu = g->first_unc;

	dpd_chunk(a, th, nth, &t0, &t1);
	for (uint64_t t = t0; t < t1; t++) {
		dpd_tile_t *T = dpd_tile(a, t);

		T->prev_end = pe;
		T->chg_before = chg;
		if (T->last_chg)
			pe = T->last_chg;
		chg += T->changed;
	}
	for (uint64_t t = t1; t-- > t0;) {
		dpd_tile_t *T = dpd_tile(a, t);

		T->next_unc = nu;
		if (T->first_unc < n)
			nu = T->first_unc;
	}
}

/*
 * The runs that start in tile t: their bytes (p NULL) or their records
 * written at p.  A run continuing from the tile before is not one of them;
 * a run reaching past the tile ends at the tile's next_unc.
 */
DPD_FN uint64_t
dpd_tile_runs(const dp_delta_op_t *a, uint64_t t, uint8_t *p)
{
	const dpd_tile_t *T = dpd_tile(a, t);
	uint64_t s, e, i, prev = T->prev_end, bytes = 0;
	uint32_t es = a->esize;

	dpd_range(a, t, &s, &e);
	i = s;
	if (s > 0 && prev == s) {   /* the run before goes on into this tile */
		while (i < e && dpd_neq(a, i))
			i++;
		prev = i;
	}
	while (i < e) {
		uint64_t start, end, v, len;

		if (!dpd_neq(a, i)) {
			i++;
			continue;
		}
		start = i;
		while (i < e && dpd_neq(a, i))
			i++;
		end = i < e ? i : T->next_unc;
		len = end - start;
		v = (start - prev) << 1 | (len > 1);
		bytes += dpd_vlen(v) + (len > 1 ? dpd_vlen(len - 2) : 0) + len * es;
		if (p) {
			p = dpd_vput(p, v);
			if (len > 1)
				p = dpd_vput(p, len - 2);
			for (uint64_t k = start; k < end; k++, p += es)
				dpd_put_elem(p, a->cur, k, es);
		}
		prev = end;
	}
	return bytes;
}

DPD_FN void
dpd_e3_runs(const dp_delta_op_t *a, uint64_t t)
{
	dpd_tile(a, t)->runs_bytes = dpd_tile_runs(a, t, 0);
}

/* E4a: thread th's chunk's runs bytes */
DPD_FN void
dpd_e4a_sum(const dp_delta_op_t *a, uint32_t th, uint32_t nth)
{
	uint64_t t0, t1, r = 0;

	dpd_chunk(a, th, nth, &t0, &t1);
	for (uint64_t t = t0; t < t1; t++)
		r += dpd_tile(a, t)->runs_bytes;
	dpd_agg(a, th)->runs = r;
}

/* E4b: the chunks placed, the format chosen, the header and result */
DPD_FN void
dpd_e4b_choose(const dp_delta_op_t *a, uint32_t nth)
{
	dpd_glob_t *g = dpd_glob(a);
	uint64_t off = 0, size[DPD_NFMT], best = DPD_DENSE;
	uint8_t *out = (uint8_t *)a->out;

	for (uint32_t th = 0; th < nth; th++) {
		uint64_t r = dpd_agg(a, th)->runs;

		dpd_agg(a, th)->runs = off;
		off += r;
	}
	g->nb = (g->n + 7) / 8;
	g->runs_body = off;
	size[DPD_DENSE] = DPD_HDR + a->nbytes;
	size[DPD_BITMAP] = DPD_HDR + g->nb + g->changed * a->esize;
	size[DPD_RUNS] = DPD_HDR + off;
	for (uint64_t f = DPD_BITMAP; f < DPD_NFMT; f++)
		if (size[f] < size[best])
			best = f;
	g->fmt = best;
	out[0] = (uint8_t)best;
	out[1] = (uint8_t)a->esize;
	dpd_put_le(out + 2, 0, 6);
	dpd_put_le(out + 8, g->n, 8);
	dpd_put_le(out + 16, g->changed, 8);
	a->result[0] = size[best];
	a->result[1] = best;
}

/* E4c: each tile of thread th's chunk gets its runs' offset */
DPD_FN void
dpd_e4c_place(const dp_delta_op_t *a, uint32_t th, uint32_t nth)
{
	uint64_t t0, t1, off = dpd_agg(a, th)->runs;

	dpd_chunk(a, th, nth, &t0, &t1);
	for (uint64_t t = t0; t < t1; t++) {
		dpd_tile(a, t)->runs_off = off;
		off += dpd_tile(a, t)->runs_bytes;
	}
}

DPD_FN void
dpd_e5_write(const dp_delta_op_t *a, uint64_t t)
{
	const dpd_glob_t *g = dpd_glob(a);
	const dpd_tile_t *T = dpd_tile(a, t);
	uint8_t *body = (uint8_t *)a->out + DPD_HDR, *v;
	uint64_t s, e;
	uint32_t es = a->esize;

	dpd_range(a, t, &s, &e);
	if (g->fmt == DPD_DENSE) {
		for (uint64_t i = s; i < e; i++)
			dpd_put_elem(body + i * es, a->cur, i, es);
	} else if (g->fmt == DPD_BITMAP) {
		v = body + g->nb + T->chg_before * es;
		for (uint64_t b = s; b < e; b += 8) {  /* s is a multiple of 8 */
			uint8_t m = 0;

			for (uint64_t i = b; i < b + 8 && i < e; i++)
				if (dpd_neq(a, i)) {
					m |= (uint8_t)(1u << (i - b));
					dpd_put_elem(v, a->cur, i, es);
					v += es;
				}
			body[b / 8] = m;
		}
	} else {
		dpd_tile_runs(a, t, body + T->runs_off);
	}
}

/* ---- decode ---------------------------------------------------------------- */

DPD_FN uint64_t
dpd_get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int k = 0; k < n; k++)
		v |= (uint64_t)p[k] << (8 * k);
	return v;
}

/* D1: the bits of tile t's bitmap bytes, when the encoding is a bitmap long
 * enough to hold them (D2 checks the rest) */
DPD_FN void
dpd_d1_bits(const dp_delta_op_t *a, uint64_t t)
{
	const uint8_t *enc = (const uint8_t *)a->enc;
	uint64_t s, e, n = a->nbytes / a->esize, c = 0;

	dpd_range(a, t, &s, &e);
	if (a->len >= DPD_HDR + (n + 7) / 8 && enc[0] == DPD_BITMAP)
		for (uint64_t b = s / 8; b < (e + 7) / 8; b++)
			for (uint8_t m = enc[DPD_HDR + b]; m; m &= (uint8_t)(m - 1))
				c++;
	dpd_tile(a, t)->changed = c;
}

/* D1b: thread th's chunk's bitmap bits */
DPD_FN void
dpd_d1b_sum(const dp_delta_op_t *a, uint32_t th, uint32_t nth)
{
	uint64_t t0, t1, c = 0;

	dpd_chunk(a, th, nth, &t0, &t1);
	for (uint64_t t = t0; t < t1; t++)
		c += dpd_tile(a, t)->changed;
	dpd_agg(a, th)->changed = c;
}

DPD_FN int
dpd_refuse(dpd_glob_t *g, uint64_t why, uint64_t detail)
{
	g->err = why;
	g->detail = detail;
	return (int)why;
}

/* D2 for the runs: check them all; each tile's first run's offset */
DPD_FN int
dpd_d2_runs(const dp_delta_op_t *a, dpd_glob_t *g, uint64_t changed)
{
	const uint8_t *p0 = (const uint8_t *)a->enc + DPD_HDR, *p = p0;
	const uint8_t *lim = (const uint8_t *)a->enc + a->len;
	uint64_t n = g->n, pos = 0, seen = 0, run = 0, v, gap, l = 0, rem, nt, t = 0;

	nt = dp_delta_dev_tiles(a->nbytes, a->esize);
	for (; p < lim; run++) {
		const uint8_t *r = p;

		if (dpd_vget(&p, lim, &v) != 0 || ((v & 1) && dpd_vget(&p, lim, &l) != 0))
			return dpd_refuse(g, DPD_E_RUN_NUMBER, run);
		gap = v >> 1;
		if (gap == 0 && run > 0)
			return dpd_refuse(g, DPD_E_RUN_GAP, run);
		rem = gap <= n - pos ? n - pos - gap : 0;
		if (gap > n - pos || rem < ((v & 1) ? 2u : 1u) || ((v & 1) && l > rem - 2))
			return dpd_refuse(g, DPD_E_RUN_PAST, run);
		l = (v & 1) ? l + 2 : 1;
		if (l * a->esize > (uint64_t)(lim - p))
			return dpd_refuse(g, DPD_E_RUN_VALUES, run);
		for (; t < nt && t * DP_DELTA_TILE <= pos + gap; t++) {
			dpd_tile(a, t)->runs_off = (uint64_t)(r - p0);
			dpd_tile(a, t)->prev_end = pos;
		}
		p += l * a->esize;
		pos += gap + l;
		seen += l;
	}
	for (; t < nt; t++) {
		dpd_tile(a, t)->runs_off = (uint64_t)(lim - p0);
		dpd_tile(a, t)->prev_end = pos;
	}
	if (seen != changed)
		return dpd_refuse(g, DPD_E_RUN_SET, seen);
	return 0;
}

DPD_FN int
dpd_d2_check(const dp_delta_op_t *a, uint32_t nth)
{
	const uint8_t *enc = (const uint8_t *)a->enc;
	dpd_glob_t *g = dpd_glob(a);
	uint64_t n = a->nbytes / a->esize, hn, changed, body, set = 0;

	g->err = DPD_OK;
	g->n = n;
	g->nb = (n + 7) / 8;
	if (a->len < DPD_HDR)
		return dpd_refuse(g, DPD_E_SHORT, a->len);
	hn = dpd_get_le(enc + 8, 8);
	changed = dpd_get_le(enc + 16, 8);
	body = a->len - DPD_HDR;
	g->fmt = enc[0];
	if (enc[0] >= DPD_NFMT)
		return dpd_refuse(g, DPD_E_FORMAT, enc[0]);
	if (enc[1] != a->esize)
		return dpd_refuse(g, DPD_E_ESIZE, enc[1]);
	if (dpd_get_le(enc + 2, 6) != 0)
		return dpd_refuse(g, DPD_E_RESERVED, dpd_get_le(enc + 2, 6));
	if (hn != n)
		return dpd_refuse(g, DPD_E_COUNT, hn);
	if (changed > n)
		return dpd_refuse(g, DPD_E_CHANGED, changed);
	if (enc[0] == DPD_DENSE)
		return body != a->nbytes ? dpd_refuse(g, DPD_E_DENSE_SIZE, body) : 0;
	if (enc[0] == DPD_RUNS)
		return dpd_d2_runs(a, g, changed);
	if (body < g->nb || body - g->nb != changed * a->esize)
		return dpd_refuse(g, DPD_E_BITMAP_SIZE, body);
	for (uint32_t th = 0; th < nth; th++) {
		uint64_t c = dpd_agg(a, th)->changed;

		dpd_agg(a, th)->changed = set;
		set += c;
	}
	if ((n & 7) && (enc[DPD_HDR + g->nb - 1] >> (n & 7)) != 0)
		return dpd_refuse(g, DPD_E_BITMAP_TAIL, enc[DPD_HDR + g->nb - 1]);
	if (set != changed)
		return dpd_refuse(g, DPD_E_BITMAP_SET, set);
	return 0;
}

DPD_FN void
dpd_d2_result(const dp_delta_op_t *a, uint32_t nth)
{
	dpd_d2_check(a, nth);
	a->result[0] = dpd_glob(a)->err;
	a->result[1] = dpd_glob(a)->detail;
}

/* D2c: a bitmap's tiles of thread th's chunk get the changes before them */
DPD_FN void
dpd_d2c_place(const dp_delta_op_t *a, uint32_t th, uint32_t nth)
{
	uint64_t t0, t1, set = dpd_agg(a, th)->changed;

	if (dpd_glob(a)->err != DPD_OK || dpd_glob(a)->fmt != DPD_BITMAP)
		return;
	dpd_chunk(a, th, nth, &t0, &t1);
	for (uint64_t t = t0; t < t1; t++) {
		dpd_tile(a, t)->chg_before = set;
		set += dpd_tile(a, t)->changed;
	}
}

/* D3: tile t of out from base (or from a dense body), once accepted */
DPD_FN void
dpd_d3_copy(const dp_delta_op_t *a, uint64_t t)
{
	const dpd_glob_t *g = dpd_glob(a);
	const uint8_t *body = (const uint8_t *)a->enc + DPD_HDR;
	uint64_t s, e;
	uint32_t es = a->esize;

	if (g->err != DPD_OK)
		return;
	dpd_range(a, t, &s, &e);
	if (g->fmt == DPD_DENSE) {
		for (uint64_t i = s; i < e; i++)
			dpd_get_elem(a->out, i, body + i * es, es);
		return;
	}
	if (a->out == a->base)
		return;
	for (uint64_t i = s; i < e; i++)   /* a word copy, as the elements' size */
		switch (es) {
		case 1: ((uint8_t *)a->out)[i] = ((const uint8_t *)a->base)[i]; break;
		case 2: ((uint16_t *)a->out)[i] = ((const uint16_t *)a->base)[i]; break;
		case 4: ((uint32_t *)a->out)[i] = ((const uint32_t *)a->base)[i]; break;
		default: ((uint64_t *)a->out)[i] = ((const uint64_t *)a->base)[i]; break;
		}
}

/* D4: tile t's changed elements (a run that starts in it, wholly) */
DPD_FN void
dpd_d4_apply(const dp_delta_op_t *a, uint64_t t)
{
	const dpd_glob_t *g = dpd_glob(a);
	const dpd_tile_t *T = dpd_tile(a, t);
	const uint8_t *body = (const uint8_t *)a->enc + DPD_HDR, *lim, *p, *v;
	uint64_t s, e, pos, x = 0, l = 0;
	uint32_t es = a->esize;

	if (g->err != DPD_OK || g->fmt == DPD_DENSE)
		return;
	dpd_range(a, t, &s, &e);
	if (g->fmt == DPD_BITMAP) {
		v = body + g->nb + T->chg_before * es;
		for (uint64_t i = s; i < e; i++)
			if (body[i / 8] >> (i & 7) & 1) {
				dpd_get_elem(a->out, i, v, es);
				v += es;
			}
		return;
	}
	lim = (const uint8_t *)a->enc + a->len;
	p = body + T->runs_off;
	pos = T->prev_end;
	while (p < lim) {   /* checked by D2 */
		dpd_vget(&p, lim, &x);
		l = 0;
		if (x & 1)
			dpd_vget(&p, lim, &l);
		l = (x & 1) ? l + 2 : 1;
		pos += x >> 1;
		if (pos >= e)
			break;
		for (uint64_t k = 0; k < l; k++, p += es)
			dpd_get_elem(a->out, pos + k, p, es);
		pos += l;
	}
}

/* NULL, or why a launcher refuses the descriptor (a GPU would fault on a
 * misaligned word; the launcher checks first) */
DPD_FN const char *
dpd_op_refused(const dp_delta_op_t *a)
{
	uint32_t es = a->esize;

	if (es != 1 && es != 2 && es != 4 && es != 8)
		return "an element size not 1, 2, 4 or 8";
	if (a->dir > 1)
		return "a direction not encode (0) or decode (1)";
	if (a->nbytes % es != 0 || a->nbytes >> 62 != 0)
		return "a size not whole elements (under 2^62 bytes)";
	if ((uintptr_t)a->base % es != 0)
		return "a base not aligned to its element size";
	if (a->dir == 0 && (uintptr_t)a->cur % es != 0)
		return "new bytes not aligned to their element size";
	if (a->dir == 1 && (uintptr_t)a->out % es != 0)
		return "an output not aligned to its element size";
	if ((uintptr_t)a->scratch % 8 != 0 || (uintptr_t)a->result % 8 != 0)
		return "scratch or result not aligned to 8 bytes";
	if (a->dir == 0 && a->cap < DPD_HDR + a->nbytes)
		return "an output smaller than the header and the dense bytes";
	return 0;
}

/* a decode's refusal, in dp_delta_decode's words */
DPD_FN const char *
dpd_why(uint64_t e)
{
	switch (e) {
	case DPD_E_SHORT: return "shorter than its header";
	case DPD_E_FORMAT: return "unknown format";
	case DPD_E_ESIZE: return "element size not the box's";
	case DPD_E_RESERVED: return "reserved header bytes not zero";
	case DPD_E_COUNT: return "element count not the box's";
	case DPD_E_CHANGED: return "more changed elements than elements";
	case DPD_E_DENSE_SIZE: return "dense body of another size";
	case DPD_E_BITMAP_SIZE: return "bitmap body of another size";
	case DPD_E_BITMAP_TAIL: return "bitmap bits set past the last element";
	case DPD_E_BITMAP_SET: return "bitmap holds another count of elements than the header";
	case DPD_E_RUN_NUMBER: return "run's numbers truncated, overlong or past 64 bits";
	case DPD_E_RUN_GAP: return "run follows the previous one with no gap";
	case DPD_E_RUN_PAST: return "run past the last element";
	case DPD_E_RUN_VALUES: return "run's values truncated";
	case DPD_E_RUN_SET: return "runs hold another count of elements than the header";
	default: return "?";
	}
}

#endif
