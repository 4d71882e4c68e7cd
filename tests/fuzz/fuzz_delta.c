/*
 * fuzz_delta.c - libFuzzer harness for the delta codec (dataplane/delta.c).
 *
 * Byte 0: bits 0-1 the element size (1, 2, 4, 8), bit 2 the mode.
 * Decode mode: bytes 1-2 the box's element count (up to 1023), byte 3 the
 * base's pattern, the rest an untrusted encoding: it is refused with a
 * message and nothing written, or accepted, in place too, and then the
 * same format encodes the result (dense and bitmap in at most as many
 * bytes) and decodes it back.
 * Round-trip mode: the rest XORed onto a patterned base is the new box:
 * every format decodes to it bit for bit, in its scanned size, and so does
 * the best one, encoded in the dense one's room and decoded in place.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/delta.h"

static uint8_t rbase[8192], rout[8192], cur[8192], enc[4 * 8192];

static void
pattern(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 37 + (i >> 3));
}

static void decode_into(const uint8_t *data, size_t size, unsigned es, uint64_t nb,
			uint8_t *base, uint8_t *out, uint8_t *in);

/* the decode mode's buffers: exactly the box's size, so that ASan sees a
 * byte written past it */
static void
fuzz_decode(const uint8_t *data, size_t size, unsigned es)
{
	uint64_t n = (data[1] | (uint64_t)data[2] << 8) & 1023, nb = n * es;
	uint8_t *b = malloc(nb ? nb : 1), *o = malloc(nb ? nb : 1), *i = malloc(nb ? nb : 1);

	decode_into(data, size, es, nb, b, o, i);
	free(b);
	free(o);
	free(i);
}

static void
decode_into(const uint8_t *data, size_t size, unsigned es, uint64_t nb, uint8_t *base,
	    uint8_t *out, uint8_t *in)
{
	uint64_t len = 0;
	refit_err_t e;
	int fmt;

	pattern(base, nb, data[3]);
	memset(out, 0x5a, nb);
	memcpy(in, base, nb);
	refit_err_clear(&e);
	if (dp_delta_decode(base, out, nb, es, data + 4, size - 4, &e) != REFIT_OK) {
		if (e.msg[0] == '\0')
			abort();
		for (uint64_t i = 0; i < nb; i++)
			if (out[i] != 0x5a)
				abort();
		if (dp_delta_decode(in, in, nb, es, data + 4, size - 4, NULL) == REFIT_OK ||
		    memcmp(in, base, nb) != 0)
			abort();
		return;
	}
	/* in place gives the same bytes */
	if (dp_delta_decode(in, in, nb, es, data + 4, size - 4, NULL) != REFIT_OK ||
	    memcmp(in, out, nb) != 0)
		abort();
	/* an element marked changed may hold its base's bits: the encoder
	 * leaves it out (a bitmap shrinks; runs may split, so may grow) */
	fmt = data[4];
	if (dp_delta_encode(base, out, nb, es, (dp_delta_fmt_t)fmt, enc, sizeof(enc), &len,
			    NULL) != REFIT_OK || (fmt != DP_DELTA_RUNS && len > size - 4))
		abort();
	memcpy(in, base, nb);
	if (dp_delta_decode(base, in, nb, es, enc, len, NULL) != REFIT_OK ||
	    memcmp(in, out, nb) != 0)
		abort();
}

static void
fuzz_round_trip(const uint8_t *data, size_t size, unsigned es)
{
	uint64_t nb = (size - 1) / es * es, len;
	dp_delta_scan_t sc;
	dp_delta_fmt_t best;

	if (nb > sizeof(cur))
		nb = sizeof(cur) / es * es;
	pattern(rbase, nb, (uint8_t)size);
	for (uint64_t i = 0; i < nb; i++)
		cur[i] = rbase[i] ^ data[1 + i];
	if (dp_delta_scan(rbase, cur, nb, es, &sc, NULL) != REFIT_OK ||
	    sc.size[dp_delta_best(&sc)] > DP_DELTA_HDR + nb)
		abort();
	for (int f = 0; f < DP_DELTA_NFMT; f++) {
		if (dp_delta_encode(rbase, cur, nb, es, (dp_delta_fmt_t)f, enc, sizeof(enc), &len,
				    NULL) != REFIT_OK || len != sc.size[f])
			abort();
		memset(rout, 0x5a, nb);
		if (dp_delta_decode(rbase, rout, nb, es, enc, len, NULL) != REFIT_OK ||
		    memcmp(rout, cur, nb) != 0)
			abort();
	}
	/* the best format in the room of the dense one */
	if (dp_delta_encode_best(rbase, cur, nb, es, enc, DP_DELTA_HDR + nb, &len, &best,
				 NULL) != REFIT_OK || best != dp_delta_best(&sc) ||
	    len != sc.size[best] ||
	    dp_delta_decode(rbase, rbase, nb, es, enc, len, NULL) != REFIT_OK ||
	    memcmp(rbase, cur, nb) != 0)
		abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned es;

	if (size < 4)
		return 0;
	es = 1u << (data[0] & 3);
	if (data[0] & 4)
		fuzz_round_trip(data, size, es);
	else
		fuzz_decode(data, size, es);
	return 0;
}
