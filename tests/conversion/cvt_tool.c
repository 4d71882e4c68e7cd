/*
 * cvt_tool.c - the C conversion of one whole tensor, for the numpy
 * cross-check (tests/conversion/test_ref.py).
 *
 *   cvt-tool FROM TO none|tensor|block|mx SHAPE [BLOCK]   (SHAPE, BLOCK: 4,6)
 *
 * reads the tensor's raw bits (row-major) from stdin, writes the converted
 * bits, then for fp8 the fp32 scales (row-major grid), to stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/convert.h"

static int
dims(const char *s, int64_t *v)
{
	int n = 0;

	while (*s && n < PLAN_MAX_DIMS) {
		char *end;

		v[n++] = strtoll(s, &end, 10);
		s = *end == ',' ? end + 1 : end;
		if (*end != ',' && *end != '\0')
			return -1;
	}
	return n;
}

int
main(int argc, char **argv)
{
	dp_quant_t q;
	int64_t bl[PLAN_MAX_DIMS], grid[PLAN_MAX_DIMS], n = 1, ng = 1;
	int nb = 0;
	plan_box_t full;
	plan_shard_t sh, gs;
	dp_view_t sv, qv, scv;

	memset(&q, 0, sizeof(q));
	if (argc < 5 || plan_dtype_parse(argv[1], &q.from) != REFIT_OK ||
	    plan_dtype_parse(argv[2], &q.to) != REFIT_OK ||
	    (q.ndim = dims(argv[4], q.shape)) < 1 ||
	    (argc > 5 && (nb = dims(argv[5], bl)) < 1) || nb > q.ndim ||
	    !dp_cvt_supported(q.from, q.to)) {
		fprintf(stderr, "usage: cvt-tool FROM TO none|tensor|block|mx SHAPE [BLOCK]\n");
		return 2;
	}
	for (int d = 0; d < q.ndim; d++) {
		n *= q.shape[d];
		q.block[d] = 1;
		if (strcmp(argv[3], "tensor") == 0)
			q.block[d] = q.shape[d] ? q.shape[d] : 1;
		else if ((strcmp(argv[3], "block") == 0 || strcmp(argv[3], "mx") == 0) &&
			 d >= q.ndim - nb)
			q.block[d] = bl[d - (q.ndim - nb)];
	}
	q.mx = strcmp(argv[3], "mx") == 0;
	dp_quant_grid(&q, grid);
	for (int d = 0; d < q.ndim; d++)
		ng *= grid[d];
	size_t ie = plan_dtype_size(q.from), oe = plan_dtype_size(q.to);
	uint8_t *in = malloc((size_t)n * ie + 1), *out = calloc((size_t)n * oe + 1, 1);
	uint32_t *sc = calloc((size_t)ng + 1, 4);

	if (!in || !out || !sc || fread(in, ie, (size_t)n, stdin) != (size_t)n) {
		fprintf(stderr, "cvt-tool: short input\n");
		return 1;
	}
	plan_box_full(&full, q.shape, q.ndim);
	dp_shard_of_box(&sh, &full);
	dp_view_contiguous(&sv, in, q.ndim, q.shape, (uint32_t)ie);
	dp_view_contiguous(&qv, out, q.ndim, q.shape, (uint32_t)oe);
	if (q.to != PLAN_DT_FP8E4M3) {
		dp_cvt_box(&sv, &sh, q.from, &qv, &sh, q.to, 0, &full);
		ng = 0;
	} else {
		plan_box_t gb;

		plan_box_full(&gb, grid, q.ndim);
		dp_shard_of_box(&gs, &gb);
		dp_view_contiguous(&scv, sc, q.ndim, grid, q.mx ? 1 : 4);
		dp_quant_region(&q, &sv, &sh, &full, &qv, &sh, &scv, &gs);
	}
	if (fwrite(out, oe, (size_t)n, stdout) != (size_t)n ||
	    fwrite(sc, q.mx ? 1 : 4, (size_t)ng, stdout) != (size_t)ng)
		return 1;
	return 0;
}
