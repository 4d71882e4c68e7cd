/*
 * bench_dataplane.c - host pack/unpack throughput of the executor's box
 * copy against memcpy of the same bytes, in one run: a column slice of a
 * row-major matrix (strided rows), a row slice (one contiguous block), and
 * a 3-D expert slice; and CRC-32C throughput (verify mode's cost).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/crc32c.h"
#include "dataplane/view.h"

static void
run(const char *label, int nd, const int64_t *shape, const plan_box_t *box, uint32_t e)
{
	dp_view_t sv, bv;
	plan_shard_t ss, bs;
	plan_box_t full;
	uint64_t bytes = (uint64_t)plan_box_volume(box, nd) * e;
	uint8_t *src = malloc(dp_view_bytes(nd, shape, e)), *buf = malloc(bytes);
	uint8_t *dst = malloc(dp_view_bytes(nd, shape, e));
	double t0, pack, unpack, mc;
	int reps = (int)(4e9 / (double)bytes) + 1;

	memset(src, 1, dp_view_bytes(nd, shape, e));
	memset(dst, 0, dp_view_bytes(nd, shape, e));
	plan_box_full(&full, shape, nd);
	dp_view_contiguous(&sv, src, nd, shape, e);
	dp_shard_of_box(&ss, &full);
	dp_view_contiguous(&bv, buf, nd, box->size, e);
	dp_shard_of_box(&bs, box);
	t0 = clock_mono_s();
	for (int r = 0; r < reps; r++)
		dp_copy_box(&sv, &ss, &bv, &bs, box);
	pack = clock_mono_s() - t0;
	sv.base = dst;
	t0 = clock_mono_s();
	for (int r = 0; r < reps; r++)
		dp_copy_box(&bv, &bs, &sv, &ss, box);
	unpack = clock_mono_s() - t0;
	t0 = clock_mono_s();
	for (int r = 0; r < reps; r++) {
		memcpy(buf, src + (r & 1), bytes - 1);
		__asm__ volatile("" ::: "memory");
	}
	mc = clock_mono_s() - t0;
	printf("%-36s %9.1f MiB %8.2f %8.2f %8.2f   %.2f / %.2f\n", label,
	       (double)bytes / (1 << 20), (double)bytes * reps / pack / 1e9,
	       (double)bytes * reps / unpack / 1e9, (double)bytes * reps / mc / 1e9,
	       mc / pack, mc / unpack);
	free(src);
	free(dst);
	free(buf);
}

int
main(void)
{
	int64_t m[2] = {8192, 8192}, x[3] = {16, 2048, 7168};
	plan_box_t cols = {{0, 2048}, {8192, 2048}}, rows = {{2048, 0}, {2048, 8192}};
	plan_box_t expert = {{3, 512, 0}, {2, 512, 7168}};
	size_t n = 256u << 20;
	uint8_t *b = malloc(n);
	double t0;
	uint32_t c = 0;

	printf("refit data-plane benchmark: host box copies (GB/s, one core, one run)\n\n");
	printf("%-36s %13s %8s %8s %8s   %s\n", "case", "bytes", "pack", "unpack", "memcpy",
	       "pack/unpack vs memcpy");
	run("bf16 [8192,8192], column slice 1/4", 2, m, &cols, 2);
	run("bf16 [8192,8192], row slice 1/4", 2, m, &rows, 2);
	run("bf16 [16,2048,7168], 2 experts x 512", 3, x, &expert, 2);
	memset(b, 7, n);
	t0 = clock_mono_s();
	for (int r = 0; r < 8; r++)
		c = crc32c(c, b, n);
	printf("\nCRC-32C (verify mode): %.2f GB/s (checksum %08x)\n",
	       8.0 * (double)n / (clock_mono_s() - t0) / 1e9, c);
	free(b);
	return 0;
}
