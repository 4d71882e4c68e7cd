/*
 * cvt_gpu_test.c - the CUDA conversion kernels (librefit-convert-cuda.so)
 * against the host conversion, bit for bit: casts, block scales of
 * block-aligned regions (partial edge blocks), and e4m3 quantization of
 * sub-regions out of a widened buffer (the receiver's case), for bf16,
 * fp16 and fp32 sources with special values.
 *
 *   cvt-gpu-test LIB.so    prints "cvt-gpu: N passed, N failed"; exit 0 and
 *                          "0 passed, 0 failed" with the reason when there
 *                          is no library or no GPU.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/transport/convert_kernels.h"
#include "dataplane/convert.h"

static struct {
	refit_cuda_convert_fn convert;
	int (*devices)(void);
	void *(*alloc)(uint64_t);
	void (*free)(void *);
	int (*copy)(void *, const void *, uint64_t, int);
	int (*sync)(void);
} k;

static unsigned seed = 12345;

static unsigned
rnd(unsigned n)
{
	seed = seed * 1103515245u + 12345u;
	return (seed >> 8) % n;
}

static uint32_t
rnd_bits(plan_dtype_t dt)
{
	static const uint32_t sp[] = {0, 0x80000000u, 0x7f800000u, 0x7fc00000u, 1};
	uint32_t u = (uint32_t)rnd(2) << 31 | (110 + rnd(30)) << 23 | rnd(1u << 23);

	if (rnd(3000) == 0)
		u = sp[rnd(5)];
	if (dt == PLAN_DT_BF16)
		return u >> 16;
	if (dt == PLAN_DT_FP16)
		return dp_cvt_fp16(u);
	return u;
}

static void *
to_dev(const void *h, uint64_t n)
{
	void *d = k.alloc(n);

	if (d == NULL || k.copy(d, h, n, 1) != 0) {
		fprintf(stderr, "cvt-gpu: cannot copy %llu bytes to the device\n",
			(unsigned long long)n);
		exit(1);
	}
	return d;
}

/* One case: a rows x cols tensor, blocks br x bc; GPU vs host. */
static int
one_case(plan_dtype_t from)
{
	int64_t rows = 1 + rnd(300), cols = 1 + rnd(300), br = 1 + rnd(130), bc = 1 + rnd(130);
	int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
	size_t e = plan_dtype_size(from), n = (size_t)(rows * cols);
	uint8_t *x = malloc(n * e), *q = malloc(n), *gq = malloc(n);
	uint32_t *sc = malloc((size_t)(gr * gc) * 4), *gsc = malloc((size_t)(gr * gc) * 4);
	dp_quant_t g = {from, PLAN_DT_FP8E4M3, 2, {rows, cols}, {br, bc}, false};
	int64_t gshape[2] = {gr, gc};
	plan_box_t full, gb, want;
	plan_shard_t fs, gs;
	dp_view_t sv, qv, scv;
	int bad = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t b = rnd_bits(from);

		memcpy(x + i * e, &b, e);
	}
	plan_box_full(&full, g.shape, 2);
	dp_shard_of_box(&fs, &full);
	plan_box_full(&gb, gshape, 2);
	dp_shard_of_box(&gs, &gb);
	dp_view_contiguous(&sv, x, 2, g.shape, (uint32_t)e);
	dp_view_contiguous(&qv, q, 2, g.shape, 1);
	dp_view_contiguous(&scv, sc, 2, gshape, 4);
	memset(q, 0, n);
	/* a sub-region (the receiver's box inside its widened buffer) */
	want.off[0] = rnd((unsigned)rows);
	want.off[1] = rnd((unsigned)cols);
	want.size[0] = 1 + rnd((unsigned)(rows - want.off[0]));
	want.size[1] = 1 + rnd((unsigned)(cols - want.off[1]));
	dp_quant_region(&g, &sv, &fs, &full, NULL, NULL, &scv, &gs);
	dp_quant_region(&g, &sv, &fs, &want, &qv, &fs, NULL, NULL);

	void *dx = to_dev(x, n * e), *dq = k.alloc(n), *dsc = k.alloc((uint64_t)(gr * gc) * 4);
	uint8_t *src0 = (uint8_t *)dx + (want.off[0] * cols + want.off[1]) * (int64_t)e;
	uint8_t *dst0 = (uint8_t *)dq + want.off[0] * cols + want.off[1];

	dp_cvt_op_t sop = {DP_CVT_SCALES, from, 0, 0, dx, cols, 1, NULL, 0, 0, dsc, gc, 1,
			   rows, cols, 0, 0, br, bc};
	dp_cvt_op_t qop = {DP_CVT_QUANT, from, PLAN_DT_FP8E4M3, 0, src0, cols, 1, dst0, cols, 1,
			   dsc, gc, 1, want.size[0], want.size[1], want.off[0], want.off[1], br, bc};

	memset(gq, 0, n);
	if (k.copy(dq, gq, n, 1) != 0 ||
	    k.convert(&sop, NULL) != 0 || k.convert(&qop, NULL) != 0 || k.sync() != 0 ||
	    k.copy(gq, dq, n, 0) != 0 || k.copy(gsc, dsc, (uint64_t)(gr * gc) * 4, 0) != 0) {
		fprintf(stderr, "cvt-gpu: a CUDA call failed\n");
		bad = 1;
	} else {
		bad = memcmp(q, gq, n) != 0 || memcmp(sc, gsc, (size_t)(gr * gc) * 4) != 0;
	}
	if (bad)
		printf("FAIL %s %lldx%lld blocks %lldx%lld\n", plan_dtype_name(from),
		       (long long)rows, (long long)cols, (long long)br, (long long)bc);
	k.free(dx);
	k.free(dq);
	k.free(dsc);
	free(x);
	free(q);
	free(gq);
	free(sc);
	free(gsc);
	return bad;
}

static int
cast_case(plan_dtype_t to)
{
	size_t n = 1 + rnd(100000);
	uint32_t *x = malloc(n * 4);
	uint16_t *y = malloc(n * 2), *gy = malloc(n * 2);
	int bad;

	for (size_t i = 0; i < n; i++)
		x[i] = rnd_bits(PLAN_DT_FP32) ^ (uint32_t)rnd(1 << 16);
	dp_cvt_run(x, PLAN_DT_FP32, y, to, 0, n);
	void *dx = to_dev(x, n * 4), *dy = k.alloc(n * 2);

	dp_cvt_op_t op = {DP_CVT_CAST, PLAN_DT_FP32, to, 0, dx, 0, 1, dy, 0, 1, NULL, 0, 0,
			  1, (int64_t)n, 0, 0, 1, 1};

	bad = k.convert(&op, NULL) != 0 || k.sync() != 0 ||
	      k.copy(gy, dy, n * 2, 0) != 0 || memcmp(y, gy, n * 2) != 0;
	if (bad)
		printf("FAIL cast fp32 -> %s, %zu elements\n", plan_dtype_name(to), n);
	k.free(dx);
	k.free(dy);
	free(x);
	free(y);
	free(gy);
	return bad;
}

int
main(int argc, char **argv)
{
	void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
	int passed = 0, failed = 0;

	if (h == NULL) {
		printf("cvt-gpu: skipped: no kernel library (%s)\ncvt-gpu: 0 passed, 0 failed\n",
		       argc > 1 ? dlerror() : "none given");
		return 0;
	}
	*(void **)&k.convert = dlsym(h, "refit_cuda_convert");
	*(void **)&k.devices = dlsym(h, "refit_cuda_devices");
	*(void **)&k.alloc = dlsym(h, "refit_cuda_alloc");
	*(void **)&k.free = dlsym(h, "refit_cuda_free");
	*(void **)&k.copy = dlsym(h, "refit_cuda_copy");
	*(void **)&k.sync = dlsym(h, "refit_cuda_sync");
	if (!k.convert || !k.devices || !k.alloc || !k.free || !k.copy ||
	    !k.sync) {
		printf("FAIL the library lacks a launcher\ncvt-gpu: 0 passed, 1 failed\n");
		return 1;
	}
	if (k.devices() < 1) {
		printf("cvt-gpu: skipped: no GPU\ncvt-gpu: 0 passed, 0 failed\n");
		return 0;
	}
	for (int i = 0; i < 60; i++) {
		int f = one_case(i % 3 == 0 ? PLAN_DT_FP32 : i % 3 == 1 ? PLAN_DT_BF16 : PLAN_DT_FP16);

		passed += !f;
		failed += f;
	}
	for (int i = 0; i < 6; i++) {
		int f = cast_case(i % 2 ? PLAN_DT_BF16 : PLAN_DT_FP16);

		passed += !f;
		failed += f;
	}
	printf("cvt-gpu: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
