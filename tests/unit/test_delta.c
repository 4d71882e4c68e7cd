/*
 * test_delta.c - the delta codec (dataplane/delta.c): bit-exact round trips
 * for every element size and format, the exact bytes of each format, the
 * refusal of malformed encodings (nothing written), the room an encoder
 * needs, and the size model against measured sizes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/delta.h"
#include "tests/unit/helpers.h"

static uint64_t rng = 88172645463325252ull;

static uint64_t
next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* base random; cur = base with each element changed with probability
 * permille/1000 (one random bit flipped: -0.0, NaN payloads included) */
static void
make_pair(uint8_t *base, uint8_t *cur, uint64_t n, unsigned es, unsigned permille)
{
	for (uint64_t i = 0; i < n * es; i++)
		base[i] = (uint8_t)next();
	memcpy(cur, base, n * es);
	for (uint64_t i = 0; i < n; i++)
		if (next() % 1000 < permille)
			cur[i * es + next() % es] ^= (uint8_t)(1u << (next() % 8));
}

static uint64_t
count_changed(const uint8_t *a, const uint8_t *b, uint64_t n, unsigned es)
{
	uint64_t c = 0;

	for (uint64_t i = 0; i < n; i++)
		c += memcmp(a + i * es, b + i * es, es) != 0;
	return c;
}

/* encode in fmt, decode into a fresh buffer and in place: both equal cur */
static void
round_trip(const uint8_t *base, const uint8_t *cur, uint64_t n, unsigned es,
	   const dp_delta_scan_t *sc, dp_delta_fmt_t fmt)
{
	uint64_t nb = n * es, cap = sc->size[fmt], len = 0;
	uint8_t *enc = malloc(cap), *out = malloc(nb + 1), *inplace = malloc(nb + 1);
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_int_eq(dp_delta_encode(base, cur, nb, es, fmt, enc, cap, &len, &e), REFIT_OK);
	ck_assert_uint_eq(len, sc->size[fmt]);
	memset(out, 0xa5, nb + 1);
	ck_assert_int_eq(dp_delta_decode(base, out, nb, es, enc, len, &e), REFIT_OK);
	ck_assert(memcmp(out, cur, nb) == 0);
	ck_assert_uint_eq(out[nb], 0xa5);
	memcpy(inplace, base, nb);
	ck_assert_int_eq(dp_delta_decode(inplace, inplace, nb, es, enc, len, &e), REFIT_OK);
	ck_assert(memcmp(inplace, cur, nb) == 0);
	free(enc);
	free(out);
	free(inplace);
}

/* encode_best: the scan's best format and size, and it decodes to cur */
static void
best_is_scans(const uint8_t *base, const uint8_t *cur, uint64_t n, unsigned es,
	      const dp_delta_scan_t *sc)
{
	uint64_t nb = n * es, len = 0;
	uint8_t *enc = malloc(DP_DELTA_HDR + nb), *out = malloc(nb);
	dp_delta_fmt_t fmt = DP_DELTA_NFMT;

	ck_assert_int_eq(dp_delta_encode_best(base, cur, nb, es, enc, DP_DELTA_HDR + nb - 1, &len,
					      &fmt, NULL), REFIT_ERR_LIMIT);
	ck_assert_int_eq(dp_delta_encode_best(base, cur, nb, es, enc, DP_DELTA_HDR + nb, &len,
					      &fmt, NULL), REFIT_OK);
	ck_assert_int_eq(fmt, dp_delta_best(sc));
	ck_assert_uint_eq(len, sc->size[fmt]);
	ck_assert_int_eq(dp_delta_decode(base, out, nb, es, enc, len, NULL), REFIT_OK);
	ck_assert(memcmp(out, cur, nb) == 0);
	free(enc);
	free(out);
}

START_TEST(delta_round_trips_every_size_and_format)
{
	static const unsigned sizes[] = {1, 2, 4, 8};
	static const unsigned permille[] = {0, 1, 30, 66, 500, 1000};
	static const uint64_t counts[] = {1, 7, 8, 9, 63, 1000, 4099};

	for (size_t s = 0; s < 4; s++)
		for (size_t d = 0; d < sizeof(permille) / sizeof(permille[0]); d++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
				unsigned es = sizes[s];
				uint64_t n = counts[c];
				uint8_t *a = malloc(n * es), *b = malloc(n * es);
				dp_delta_scan_t sc;

				make_pair(a, b, n, es, permille[d]);
				ck_assert_int_eq(dp_delta_scan(a, b, n * es, es, &sc, NULL), REFIT_OK);
				ck_assert_uint_eq(sc.nelem, n);
				ck_assert_uint_eq(sc.changed, count_changed(a, b, n, es));
				for (int f = 0; f < DP_DELTA_NFMT; f++)
					round_trip(a, b, n, es, &sc, (dp_delta_fmt_t)f);
				best_is_scans(a, b, n, es, &sc);
				free(a);
				free(b);
			}
}
END_TEST

/* Signed zeros and NaN payloads are changes of bits, not of values. */
START_TEST(delta_compares_bits_not_values)
{
	uint32_t f_base[4] = {0x00000000u, 0x7fc00000u, 0x3f800000u, 0xffc00001u};
	uint32_t f_new[4] = {0x80000000u, 0x7fc00001u, 0x3f800000u, 0xffc00001u};
	uint16_t h_base[3] = {0x8000, 0x7fc1, 0x3f80};
	uint16_t h_new[3] = {0x0000, 0x7fc2, 0x3f80};
	dp_delta_scan_t sc;

	ck_assert_int_eq(dp_delta_scan(f_base, f_new, sizeof(f_base), 4, &sc, NULL), REFIT_OK);
	ck_assert_uint_eq(sc.changed, 2);
	ck_assert_uint_eq(sc.runs, 1);
	for (int f = 0; f < DP_DELTA_NFMT; f++)
		round_trip((uint8_t *)f_base, (uint8_t *)f_new, 4, 4, &sc, (dp_delta_fmt_t)f);
	ck_assert_int_eq(dp_delta_scan(h_base, h_new, sizeof(h_base), 2, &sc, NULL), REFIT_OK);
	ck_assert_uint_eq(sc.changed, 2);
	for (int f = 0; f < DP_DELTA_NFMT; f++)
		round_trip((uint8_t *)h_base, (uint8_t *)h_new, 3, 2, &sc, (dp_delta_fmt_t)f);
}
END_TEST

/* 20 two-byte elements, changed: 0, 1, 5, 19 (and 200 elements for a
 * two-byte gap): the formats byte by byte. */
START_TEST(delta_formats_byte_by_byte)
{
	uint16_t a[200] = {0}, b[200] = {0};
	uint8_t enc[512];
	uint64_t len;
	static const uint8_t hdr_runs[8] = {2, 2, 0, 0, 0, 0, 0, 0};
	/* (gap 0, two) -> 1, 0; (gap 3, one) -> 6; (gap 13, one) -> 26 */
	static const uint8_t runs[] = {1, 0, 0x11, 0x11, 0x22, 0x22, 6, 0x33, 0x33,
				       26, 0x44, 0x44};
	static const uint8_t bits[] = {0x23, 0x00, 0x08};

	b[0] = 0x1111;
	b[1] = 0x2222;
	b[5] = 0x3333;
	b[19] = 0x4444;
	ck_assert_int_eq(dp_delta_encode(a, b, 40, 2, DP_DELTA_RUNS, enc, sizeof(enc), &len, NULL),
			 REFIT_OK);
	ck_assert_uint_eq(len, DP_DELTA_HDR + sizeof(runs));
	ck_assert(memcmp(enc, hdr_runs, 8) == 0);
	ck_assert_uint_eq(enc[8], 20);
	ck_assert_uint_eq(enc[16], 4);
	ck_assert(memcmp(enc + DP_DELTA_HDR, runs, sizeof(runs)) == 0);
	ck_assert_int_eq(dp_delta_encode(a, b, 40, 2, DP_DELTA_BITMAP, enc, sizeof(enc), &len,
					 NULL), REFIT_OK);
	ck_assert_uint_eq(len, DP_DELTA_HDR + 3 + 8);
	ck_assert_uint_eq(enc[0], 1);
	ck_assert(memcmp(enc + DP_DELTA_HDR, bits, 3) == 0);
	ck_assert_uint_eq(enc[DP_DELTA_HDR + 3], 0x11);
	ck_assert_uint_eq(enc[DP_DELTA_HDR + 9], 0x44);
	/* element 199 after 199 unchanged: 2 * 199 = 398 takes two bytes (0x8e 0x03) */
	b[0] = b[1] = b[5] = b[19] = 0;
	b[199] = 0x5555;
	ck_assert_int_eq(dp_delta_encode(a, b, 400, 2, DP_DELTA_RUNS, enc, sizeof(enc), &len, NULL),
			 REFIT_OK);
	ck_assert_uint_eq(len, DP_DELTA_HDR + 4);
	ck_assert_uint_eq(enc[DP_DELTA_HDR], 0x8e);
	ck_assert_uint_eq(enc[DP_DELTA_HDR + 1], 0x03);
	ck_assert_uint_eq(enc[DP_DELTA_HDR + 2], 0x55);
	/* nothing changed: a header alone */
	ck_assert_int_eq(dp_delta_encode(a, a, 400, 2, DP_DELTA_RUNS, enc, sizeof(enc), &len, NULL),
			 REFIT_OK);
	ck_assert_uint_eq(len, DP_DELTA_HDR);
}
END_TEST

/* decode must refuse enc (len bytes) and leave both outputs untouched */
static const char *
refused(const uint8_t *base, uint64_t nb, unsigned es, const uint8_t *enc, uint64_t len)
{
	static refit_err_t e;
	uint8_t *out = malloc(nb), *in = malloc(nb);

	memset(out, 0x5a, nb);
	memcpy(in, base, nb);
	refit_err_clear(&e);
	ck_assert_int_eq(dp_delta_decode(base, out, nb, es, enc, len, &e), REFIT_ERR_INVALID_ARG);
	ck_assert(e.msg[0] != '\0');
	for (uint64_t i = 0; i < nb; i++)
		ck_assert_uint_eq(out[i], 0x5a);
	refit_err_clear(&e);
	ck_assert_int_eq(dp_delta_decode(in, in, nb, es, enc, len, &e), REFIT_ERR_INVALID_ARG);
	ck_assert(memcmp(in, base, nb) == 0);
	free(out);
	free(in);
	return e.msg;
}

START_TEST(delta_refuses_malformed_encodings)
{
	uint16_t a[20] = {0}, b[20] = {0};
	uint8_t enc[256], bad[256];
	uint64_t len, blen;

	b[0] = 1;
	b[1] = 2;
	b[5] = 3;
	b[19] = 4;
	for (int f = 0; f < DP_DELTA_NFMT; f++) {
		ck_assert_int_eq(dp_delta_encode(a, b, 40, 2, (dp_delta_fmt_t)f, enc, sizeof(enc),
						 &len, NULL), REFIT_OK);
		/* every truncation */
		for (uint64_t l = 0; l < len; l++)
			refused((uint8_t *)a, 40, 2, enc, l);
		/* one byte too many */
		memcpy(bad, enc, len);
		bad[len] = 0;
		refused((uint8_t *)a, 40, 2, bad, len + 1);
		/* another box: element size, element count */
		refused((uint8_t *)a, 40, 4, enc, len);
		refused((uint8_t *)a, 38, 2, enc, len);
	}
	ck_assert_int_eq(dp_delta_encode(a, b, 40, 2, DP_DELTA_RUNS, enc, sizeof(enc), &len, NULL),
			 REFIT_OK);
	memcpy(bad, enc, len);
	bad[0] = 3;
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "unknown format") != NULL);
	memcpy(bad, enc, len);
	bad[5] = 1;
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "reserved") != NULL);
	memcpy(bad, enc, len);
	bad[16] = 21;
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "more changed") != NULL);
	/* runs: a second run with no gap; a run past the end; an overlong number */
	memcpy(bad, enc, len);
	bad[DP_DELTA_HDR + 6] = 0;   /* gap of the run at element 5 */
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "no gap") != NULL);
	memcpy(bad, enc, len);
	bad[DP_DELTA_HDR + 9] = 28;   /* last run at element 20 of 20 */
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "past the last") != NULL);
	memcpy(bad, enc, len);
	bad[DP_DELTA_HDR + 9] = 27;   /* a run of two at element 19 of 20 */
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "past the last") != NULL);
	memcpy(bad, enc, DP_DELTA_HDR);
	blen = DP_DELTA_HDR;
	memcpy(bad + blen, (const uint8_t[]){0x80, 0x00, 0x00, 0x01, 0x00}, 5);
	bad[16] = 1;
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, blen + 5), "overlong") != NULL);
	memcpy(bad + blen, (const uint8_t[]){0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
					     0x7f, 0x00, 0x01, 0x00}, 13);
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, blen + 13), "64 bits") != NULL);
	memcpy(bad, enc, len);
	bad[16] = 3;   /* the runs hold 4 */
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "count") != NULL);
	/* bitmap: a bit past element 19; a count that is not the bitmap's */
	ck_assert_int_eq(dp_delta_encode(a, b, 40, 2, DP_DELTA_BITMAP, enc, sizeof(enc), &len,
					 NULL), REFIT_OK);
	memcpy(bad, enc, len);
	bad[DP_DELTA_HDR + 2] |= 0x10;
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "past the last") != NULL);
	memcpy(bad, enc, len);
	bad[DP_DELTA_HDR + 2] = 0x00;
	bad[DP_DELTA_HDR + 1] = 0x01;   /* same count, other element: accepted */
	ck_assert_int_eq(dp_delta_decode(a, b, 40, 2, bad, len, NULL), REFIT_OK);
	bad[DP_DELTA_HDR + 1] = 0x03;
	ck_assert(strstr(refused((uint8_t *)a, 40, 2, bad, len), "count") != NULL);
}
END_TEST

START_TEST(delta_encoder_needs_its_room)
{
	uint8_t a[400], b[400], enc[424];
	uint64_t len;
	dp_delta_scan_t sc;
	refit_err_t e;

	make_pair(a, b, 100, 4, 300);
	ck_assert_int_eq(dp_delta_scan(a, b, 400, 4, &sc, NULL), REFIT_OK);
	for (int f = 0; f < DP_DELTA_NFMT; f++) {
		refit_err_clear(&e);
		ck_assert_int_eq(dp_delta_encode(a, b, 400, 4, (dp_delta_fmt_t)f, enc,
						 sc.size[f] - 1, &len, &e), REFIT_ERR_LIMIT);
		ck_assert(strstr(e.msg, dp_delta_fmt_str((dp_delta_fmt_t)f)) != NULL);
		ck_assert_int_eq(dp_delta_encode(a, b, 400, 4, (dp_delta_fmt_t)f, enc, sc.size[f],
						 &len, NULL), REFIT_OK);
		ck_assert_uint_eq(len, sc.size[f]);
	}
	refit_err_clear(&e);
	ck_assert_int_eq(dp_delta_scan(a, b, 400, 3, &sc, &e), REFIT_ERR_INVALID_ARG);
	ck_assert(strstr(e.msg, "element size 3") != NULL);
	refit_err_clear(&e);
	ck_assert_int_eq(dp_delta_encode(a, b, 398, 4, DP_DELTA_RUNS, enc, sizeof(enc), &len, &e),
			 REFIT_ERR_INVALID_ARG);
	ck_assert(strstr(e.msg, "398 bytes") != NULL);
	ck_assert_int_eq(dp_delta_encode(a, b, 400, 4, (dp_delta_fmt_t)7, enc, sizeof(enc), &len,
					 NULL), REFIT_ERR_INVALID_ARG);
	/* the best format: dense when nothing smaller, runs when sparse */
	ck_assert_int_eq(dp_delta_best(&sc), DP_DELTA_DENSE);
	make_pair(a, b, 200, 2, 10);
	ck_assert_int_eq(dp_delta_scan(a, b, 400, 2, &sc, NULL), REFIT_OK);
	ck_assert_int_eq(dp_delta_best(&sc), sc.changed ? DP_DELTA_RUNS : DP_DELTA_DENSE);
}
END_TEST

/* The model against the sizes measured on independent changes (1 Mi bf16
 * elements): within 2 % of the best format's size above 0.1 %. */
START_TEST(delta_model_matches_measured_sizes)
{
	static const unsigned permille[] = {1, 10, 30, 66, 100, 200, 600};
	const uint64_t n = 1u << 20;
	uint8_t *a = malloc(n * 2), *b = malloc(n * 2);
	dp_delta_scan_t sc;

	ck_assert(dp_delta_model_bytes(0.0, 2) == 0.0);
	ck_assert(dp_delta_model_bytes(1.0, 2) == 2.0);
	ck_assert(dp_delta_model_bytes(1.0, 8) == 8.0);
	for (size_t i = 0; i < sizeof(permille) / sizeof(permille[0]); i++) {
		double d, model, got;

		make_pair(a, b, n, 2, permille[i]);
		ck_assert_int_eq(dp_delta_scan(a, b, n * 2, 2, &sc, NULL), REFIT_OK);
		d = (double)sc.changed / (double)n;
		model = dp_delta_model_bytes(d, 2) * (double)n;
		got = (double)(sc.size[dp_delta_best(&sc)] - DP_DELTA_HDR);
		ck_assert_msg(fabs(model - got) <= 0.02 * got, "density %.4f: model %.0f, got %.0f",
			      d, model, got);
		if (i > 0)
			ck_assert(dp_delta_model_bytes(d, 2) >
				  dp_delta_model_bytes(permille[i - 1] / 1000.0 * 0.9, 2));
	}
	free(a);
	free(b);
}
END_TEST

Suite *
suite_delta(void)
{
	return th_suite("delta",
			th_tcase("delta", 60,
				 TH_TESTS(delta_round_trips_every_size_and_format,
					  delta_compares_bits_not_values, delta_formats_byte_by_byte,
					  delta_refuses_malformed_encodings,
					  delta_encoder_needs_its_room,
					  delta_model_matches_measured_sizes)),
			NULL);
}
