/*
 * delta_gpu_test.c - the delta kernels (refit_cuda_delta, in
 * librefit-gpu-kernels.so or the emulator's libcudart.so.13) against the
 * host codec (dataplane/delta.h), bit for bit: every element size, odd
 * lengths and tile edges, none and all changed, -0.0 against 0.0, NaN
 * payloads, sparse changes (runs), medium (bitmap), long runs across
 * tiles; the encoding's bytes, length and format; decoding the host's
 * encoding into another buffer and in place; damaged encodings refused
 * exactly where the host refuses them, the output untouched; misaligned
 * descriptors refused at the launch.
 *
 *   delta-gpu-test LIB.so   prints "delta-gpu: N passed, N failed"; exit 0
 *                           and "0 passed, 0 failed" with the reason when
 *                           there is no library or no GPU.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/transport/delta_kernels.h"
#include "dataplane/delta.h"

static struct {
	refit_cuda_delta_fn delta;
	int (*devices)(void);
	void *(*alloc)(uint64_t);
	void (*free)(void *);
	int (*copy)(void *, const void *, uint64_t, int);
	int (*sync)(void);
} k;

static unsigned seed = 4242;

/* device buffers for every case, allocated once (the emulator's allocations
 * are files: one per operand and case took a minute) */
#define MAXB (70001u * 8u + 64u)
static void *dbase, *dcur, *denc, *dout, *dscr, *dres;

static void *
put(void *d, const void *h, uint64_t n)
{
	if (n && k.copy(d, h, n, 1) != 0) {
		fprintf(stderr, "delta-gpu: cannot copy %llu bytes to the device\n",
			(unsigned long long)n);
		exit(1);
	}
	return d;
}

static unsigned
rnd(unsigned n)
{
	seed = seed * 1103515245u + 12345u;
	return (seed >> 8) % n;
}

/* kinds of change */
enum { K_NONE, K_ALL, K_SPARSE, K_MEDIUM, K_LONG, K_SIGNS, K_NAN, K_NKIND };
static const char *kname[] = {"none", "all", "sparse", "medium", "long runs", "-0.0",
			      "NaN payloads"};

static void
make_case(int kind, unsigned es, uint64_t n, uint8_t *base, uint8_t *cur)
{
	for (uint64_t i = 0; i < n * es; i++)
		base[i] = (uint8_t)rnd(256);
	memcpy(cur, base, n * es);
	for (uint64_t i = 0; i < n; i++) {
		uint8_t *c = cur + i * es, *b = base + i * es;
		bool ch = kind == K_ALL || (kind == K_SPARSE && rnd(1000) < 30) ||
			  (kind == K_MEDIUM && rnd(100) < 30) ||
			  (kind == K_LONG && (i / 300) % 2 == 1 && rnd(50) != 0);

		if (kind == K_SIGNS) {  /* 0.0 in the base, -0.0 now (top bit), every 3rd */
			memset(b, 0, es);
			memset(c, 0, es);
			if (i % 3 == 0)
				c[es - 1] = 0x80;
		} else if (kind == K_NAN) {  /* NaNs whose payloads differ in the lowest bit */
			memset(b, 0xff, es);
			b[es - 1] = 0x7f;
			memcpy(c, b, es);
			if (i % 5 == 1)
				c[0] ^= 1;
		} else if (ch) {
			c[rnd(es)] ^= (uint8_t)(1 + rnd(255));
		}
	}
}

/* decode enc (len) on the device against base into a fresh buffer (or base
 * itself) and compare with the host's decode: both refuse or both give the
 * same bytes; a refused decode leaves the output untouched */
static int
dec_check(const uint8_t *base, const uint8_t *enc, uint64_t len, unsigned es, uint64_t n,
	  bool inplace, const char *what)
{
	uint64_t nb = n * es, res[2] = {9, 9};
	uint8_t *want = malloc(nb + 1), *got = malloc(nb + 1), *junk = malloc(nb + 1);
	refit_err_t err = {0};
	bool host_ok;
	int bad = 0;

	for (uint64_t i = 0; i < nb; i++)
		junk[i] = (uint8_t)(i * 7 + 3);
	memcpy(want, inplace ? base : junk, nb);
	host_ok = dp_delta_decode(base, want, nb, es, enc, len, &err) == REFIT_OK;
	void *db = put(dbase, base, nb), *de = put(denc, enc, len);
	void *dst = inplace ? db : put(dout, junk, nb);
	dp_delta_op_t op = {db, NULL, dst, de, dscr, dres, nb, 0, len, es, 1};

	if (k.delta(&op, NULL) != 0 || k.sync() != 0 || k.copy(res, dres, 16, 0) != 0 ||
	    (nb && k.copy(got, dst, nb, 0) != 0)) {
		printf("FAIL %s: a CUDA call failed\n", what);
		bad = 1;
	} else if ((res[0] == 0) != host_ok) {
		printf("FAIL %s: the host %s, the device %s (%s)\n", what,
		       host_ok ? "accepts" : "refuses", res[0] ? "refuses" : "accepts",
		       res[0] ? dpd_why(res[0]) : host_ok ? "-" : err.msg);
		bad = 1;
	} else if (!host_ok && strstr(err.msg, dpd_why(res[0])) == NULL) {
		printf("FAIL %s: the device refuses for another reason (\"%s\") than the host "
		       "(\"%s\")\n", what, dpd_why(res[0]), err.msg);
		bad = 1;
	} else if (memcmp(got, host_ok ? want : inplace ? base : junk, nb) != 0) {
		printf("FAIL %s: the device's %s bytes differ\n", what,
		       host_ok ? "decoded" : "untouched");
		bad = 1;
	}
	free(want);
	free(got);
	free(junk);
	return bad;
}

/* damaged encodings: a few random bytes changed, cut short, a bitmap's set
 * bit moved past the last element; the device refuses as the host does */
static int
damaged(const uint8_t *base, const uint8_t *henc, uint64_t hlen, unsigned es, uint64_t n,
	dp_delta_fmt_t fmt, const char *what, int *checks)
{
	int bad = 0;

	for (int d = 0; d < 6 && hlen > 0; d++) {
		uint8_t *bent = malloc(hlen);
		uint64_t blen = hlen;

		memcpy(bent, henc, hlen);
		if (d == 5)
			blen = rnd((unsigned)hlen);
		else
			bent[d == 0 ? DP_DELTA_HDR - 1 - rnd(DP_DELTA_HDR) :
			     rnd((unsigned)hlen)] ^= (uint8_t)(1u << rnd(8));
		bad |= dec_check(base, bent, blen, es, n, d & 1, what);
		(*checks)++;
		free(bent);
	}
	if (fmt == DP_DELTA_BITMAP && (n & 7)) {  /* a set bit moved past the last element */
		uint8_t *bent = malloc(hlen), *last = bent + DP_DELTA_HDR + (n + 7) / 8 - 1;
		uint64_t i = 0;

		memcpy(bent, henc, hlen);
		while (i < n && !(bent[DP_DELTA_HDR + i / 8] >> (i & 7) & 1))
			i++;
		if (i < n) {
			bent[DP_DELTA_HDR + i / 8] &= (uint8_t)~(1u << (i & 7));
			*last |= 0x80;
			bad |= dec_check(base, bent, hlen, es, n, false, what);
			(*checks)++;
		}
		free(bent);
	}
	return bad;
}

/* encode on the device: the host's bytes, length and format */
static int
enc_case(int kind, unsigned es, uint64_t n, int *checks)
{
	uint64_t nb = n * es, cap = DP_DELTA_HDR + nb, hlen = 0, res[2];
	uint8_t *base = malloc(nb + 1), *cur = malloc(nb + 1), *henc = malloc(cap),
		*genc = malloc(cap);
	dp_delta_fmt_t fmt;
	refit_err_t err;
	char what[128];
	int bad = 0;

	make_case(kind, es, n, base, cur);
	snprintf(what, sizeof(what), "%s, %llu elements of %u bytes", kname[kind],
		 (unsigned long long)n, es);
	if (dp_delta_encode_best(base, cur, nb, es, henc, cap, &hlen, &fmt, &err) != REFIT_OK) {
		printf("FAIL %s: the host encoder: %s\n", what, err.msg);
		return 1;
	}
	dp_delta_op_t op = {put(dbase, base, nb), put(dcur, cur, nb), dout, NULL, dscr, dres,
			    nb, cap, 0, es, 0};

	memset(genc, 0xee, cap);
	put(dout, genc, cap);
	if (k.delta(&op, NULL) != 0 || k.sync() != 0 || k.copy(res, dres, 16, 0) != 0 ||
	    k.copy(genc, dout, cap, 0) != 0) {
		printf("FAIL %s: a CUDA call failed\n", what);
		bad = 1;
	} else if (res[0] != hlen || res[1] != (uint64_t)fmt || memcmp(genc, henc, hlen) != 0) {
		printf("FAIL %s: the device's encoding (%llu bytes, %s) is not the host's "
		       "(%llu bytes, %s)\n", what, (unsigned long long)res[0],
		       dp_delta_fmt_str((dp_delta_fmt_t)res[1]), (unsigned long long)hlen,
		       dp_delta_fmt_str(fmt));
		bad = 1;
	}
	(*checks)++;
	bad |= dec_check(base, henc, hlen, es, n, false, what);
	bad |= dec_check(base, henc, hlen, es, n, true, what);
	*checks += 2;
	bad |= damaged(base, henc, hlen, es, n, fmt, what, checks);
	free(base);
	free(cur);
	free(henc);
	free(genc);
	return bad;
}

/* a misaligned base, or an encode's output too small: refused at the launch */
static int
refusals(int *checks)
{
	void *db = k.alloc(64), *ds = k.alloc(dp_delta_dev_scratch(32, 2)), *dr = k.alloc(16);
	dp_delta_op_t op = {(uint8_t *)db + 1, db, db, NULL, ds, dr, 32, 64, 0, 2, 0};
	int bad = 0;

	if (k.delta(&op, NULL) != 1) {
		printf("FAIL a misaligned base was not refused with cudaErrorInvalidValue\n");
		bad = 1;
	}
	op.base = db;
	op.cap = 32 + DP_DELTA_HDR - 1;
	if (k.delta(&op, NULL) != 1) {
		printf("FAIL an encode's output under header + dense bytes was not refused\n");
		bad = 1;
	}
	*checks += 2;
	k.sync();
	k.free(db);
	k.free(ds);
	k.free(dr);
	return bad;
}

int
main(int argc, char **argv)
{
	static const uint64_t lens[] = {0, 1, 7, 9, 255, 256, 257, 513, 1000, 4099, 70001};
	static const unsigned sizes[] = {1, 2, 4, 8};
	void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
	int checks = 0, failed = 0, cases = 0;

	if (h == NULL) {
		printf("delta-gpu: skipped: no kernel library (%s)\ndelta-gpu: 0 passed, 0 failed\n",
		       argc > 1 ? dlerror() : "none given");
		return 0;
	}
	*(void **)&k.delta = dlsym(h, "refit_cuda_delta");
	*(void **)&k.devices = dlsym(h, "refit_cuda_devices");
	*(void **)&k.alloc = dlsym(h, "refit_cuda_alloc");
	*(void **)&k.free = dlsym(h, "refit_cuda_free");
	*(void **)&k.copy = dlsym(h, "refit_cuda_copy");
	*(void **)&k.sync = dlsym(h, "refit_cuda_sync");
	if (!k.delta || !k.devices || !k.alloc || !k.free || !k.copy || !k.sync) {
		printf("FAIL the library lacks the delta launcher\ndelta-gpu: 0 passed, 1 failed\n");
		return 1;
	}
	if (k.devices() < 1) {
		printf("delta-gpu: skipped: no GPU\ndelta-gpu: 0 passed, 0 failed\n");
		return 0;
	}
	dbase = k.alloc(MAXB);
	dcur = k.alloc(MAXB);
	denc = k.alloc(MAXB);
	dout = k.alloc(MAXB);
	dscr = k.alloc(dp_delta_dev_scratch(MAXB, 1));
	dres = k.alloc(16);
	if (!dbase || !dcur || !denc || !dout || !dscr || !dres) {
		printf("FAIL cannot allocate device buffers\ndelta-gpu: 0 passed, 1 failed\n");
		return 1;
	}
	for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++)
		for (size_t l = 0; l < sizeof(lens) / sizeof(*lens); l++)
			for (int kind = 0; kind < K_NKIND; kind++, cases++)
				failed += enc_case(kind, sizes[s], lens[l], &checks) != 0;
	failed += refusals(&checks);
	k.free(dbase);
	k.free(dcur);
	k.free(denc);
	k.free(dout);
	k.free(dscr);
	k.free(dres);
	cases++;
	printf("delta-gpu: %d cases (%d checks): %d passed, %d failed\n", cases, checks,
	       cases - failed, failed);
	return failed != 0;
}
