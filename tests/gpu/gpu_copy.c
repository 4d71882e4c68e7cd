/*
 * gpu_copy.c - gpu-test's cases on one process's devices: box copies (1), a failed
 * copy at sync (2), two local ranks and a delta unit between them (3),
 * loopback (6)
 * (the cases are listed in gpu_test.c; the harness is gpu_test.h).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/clock.h"
#include "daemon/transport/gpu.h"
#include "daemon/transport/transport.h"
#include "dataplane/delta_gpu.h"
#include "dataplane/view.h"
#include "tests/gpu/gpu_test.h"

#ifdef REFIT_HAVE_NCCL

/* ---- 1. box copies ------------------------------------------------------------ */

/* A random view of shape: padded rows, a strided innermost dim, stride-0
 * size-1 dims, broadcast (stride 0) dims when src; its bytes in *n. */
static void
rand_view(dp_view_t *v, int nd, const int64_t *shape, uint32_t elem, bool src, unsigned *seed,
	  uint64_t *n)
{
	int64_t st = 1;
	uint64_t last = 0;

	dp_view_contiguous(v, NULL, nd, shape, elem);
	for (int d = nd - 1; d >= 0; d--) {
		int k = rand_r(seed) % 6;

		if (shape[d] == 1 && k == 0) {
			v->stride[d] = 0;          /* size 1: any stride, even 0 */
		} else if (src && k == 1) {
			v->stride[d] = 0;          /* broadcast: one element read many times */
		} else if (d == nd - 1 && k == 2) {
			v->stride[d] = 2 + rand_r(seed) % 3;  /* strided innermost dim */
			st = v->stride[d] * shape[d];
		} else {
			v->stride[d] = st;
			st *= shape[d] + (k == 3 ? 1 + rand_r(seed) % 3 : 0);   /* padding */
		}
	}
	for (int d = 0; d < nd; d++)
		last += (uint64_t)(shape[d] - 1) * (uint64_t)v->stride[d];
	*n = (last + 1) * elem;
}

/* Destinations must not alias: no stride 0 over more than one element,
 * and strides of a dim at least the span of the dims inside it. */
static void
dst_view(dp_view_t *v, int nd, const int64_t *shape, uint32_t elem, unsigned *seed, uint64_t *n)
{
	int64_t st = 1;

	dp_view_contiguous(v, NULL, nd, shape, elem);
	for (int d = nd - 1; d >= 0; d--) {
		int k = rand_r(seed) % 4;

		if (d == nd - 1 && k == 0) {
			v->stride[d] = 2 + rand_r(seed) % 2;
			st = v->stride[d] * shape[d];
		} else {
			v->stride[d] = st;
			st *= shape[d] + (k == 1 ? 1 + rand_r(seed) % 2 : 0);
		}
	}
	*n = (uint64_t)st * elem;
}

int
box_copies(xport_session_t *s, const int32_t *ranks, size_t nranks)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	unsigned seed = 12345;
	refit_err_t err;
	int bad = 0, inner_strided = 0, bcast = 0;

	for (int iter = 0; iter < 400 && !bad; iter++) {
		int nd = 1 + rand_r(&seed) % 4;
		int32_t rank = ranks[iter % nranks];
		int64_t shape[PLAN_MAX_DIMS];
		uint32_t elem = 1u << (rand_r(&seed) % 4);
		dp_view_t hs, hd, ds, dd;
		plan_shard_t sh = {0};
		plan_box_t box;
		uint64_t ns, nd_;
		uint8_t *src, *dst, *ref, *gs, *gd;

		for (int d = 0; d < nd; d++)
			shape[d] = 1 + rand_r(&seed) % 7;
		rand_view(&hs, nd, shape, elem, true, &seed, &ns);
		dst_view(&hd, nd, shape, elem, &seed, &nd_);
		for (int d = 0; d < nd; d++) {
			sh.box.size[d] = shape[d];
			box.off[d] = rand_r(&seed) % shape[d];
			box.size[d] = 1 + rand_r(&seed) % (shape[d] - box.off[d]);
			bcast += hs.stride[d] == 0 && box.size[d] > 1;
		}
		inner_strided += box.size[nd - 1] > 1 && (hs.stride[nd - 1] > 1 ||
							  hd.stride[nd - 1] > 1);
		src = malloc(ns);
		dst = malloc(nd_);
		ref = malloc(nd_);
		for (uint64_t i = 0; i < ns; i++)
			src[i] = (uint8_t)rand_r(&seed);
		memset(dst, 0xee, nd_);
		memset(ref, 0xee, nd_);
		gs = dev->alloc(dev->ctx, rank, ns);
		gd = dev->alloc(dev->ctx, rank, nd_);
		EXPECT(gs && gd, "cudaMalloc on rank %d's device", rank);
		if (gs && gd) {
			dev->from_host(dev->ctx, rank, gs, src, ns);
			dev->from_host(dev->ctx, rank, gd, dst, nd_);
			hs.base = src;
			hd.base = ref;
			dp_copy_box(&hs, &sh, &hd, &sh, &box);
			ds = hs;
			dd = hd;
			ds.base = gs;
			dd.base = gd;
			dev->copy_box(dev->ctx, rank, &ds, &sh, &dd, &sh, &box);
			dev->to_host(dev->ctx, rank, dst, gd, nd_);
			refit_err_clear(&err);
			EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
			EXPECT(memcmp(dst, ref, nd_) == 0, "box copy %d (rank %d, nd %d, elem %u, "
			       "inner strides %" PRId64 "/%" PRId64 ") differs from the host copy",
			       iter, rank, nd, elem, hs.stride[nd - 1], hd.stride[nd - 1]);
		}
		dev->free(dev->ctx, rank, gs);
		dev->free(dev->ctx, rank, gd);
		free(src);
		free(dst);
		free(ref);
	}
	refit_err_clear(&err);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync after the frees: %s", err.msg);
	printf("     %d boxes with a strided innermost dim (kernel: %s), %d with broadcast "
	       "source dims, on %zu device(s)\n", inner_strided,
	       gpu_load(0, NULL, 0) && gpu_load(0, NULL, 0)->copy_strided ? "yes" : "no",
	       bcast, nranks);
	EXPECT(inner_strided > 20 && bcast > 20, "too few interesting boxes");
	/* refit's own kernel library where it was built, the emulator's on the emulator */
	EXPECT(gpu_load(0, NULL, 0)->copy_strided != NULL, "no strided-copy kernel loaded: "
	       "strided innermost dims went row by row");
	return bad;
}

/*
 * 1b. two rows 2^31 + 64 bytes apart (a pitch CUDA's 2D copies refuse:
 * cudaDeviceProp.memPitch is 2^31-1) to a compact box: copied row by row.
 * Only the rows' bytes are written (the allocation is 2 GiB, sparse on the
 * emulator).
 */
int
big_pitch(xport_session_t *s, int32_t rank)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	const int64_t pitch = (1ll << 31) + 64, shape[2] = {2, 16};
	uint64_t n = (uint64_t)pitch + 16;
	uint8_t *gs = dev->alloc(dev->ctx, rank, n), *gd = dev->alloc(dev->ctx, rank, 32);
	uint8_t row[16], got[32];
	dp_view_t sv = {gs, 2, {2, 16}, {pitch, 1}, 1}, dv;
	plan_shard_t sh = {0};
	plan_box_t box = {{0, 0}, {2, 16}};
	refit_err_t err;
	int bad = 0;

	EXPECT(gs && gd, "cudaMalloc of %" PRIu64 " bytes", n);
	if (gs == NULL || gd == NULL)
		goto out;
	dp_view_contiguous(&dv, gd, 2, shape, 1);
	sh.box.size[0] = 2;
	sh.box.size[1] = 16;
	for (int i = 0; i < 2; i++) {
		for (int k = 0; k < 16; k++)
			row[k] = (uint8_t)(i * 16 + k + 1);
		dev->from_host(dev->ctx, rank, gs + i * pitch, row, 16);
	}
	dev->copy_box(dev->ctx, rank, &sv, &sh, &dv, &sh, &box);
	dev->to_host(dev->ctx, rank, got, gd, 32);
	refit_err_clear(&err);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	for (int i = 0; i < 32 && !bad; i++)
		EXPECT(got[i] == (uint8_t)(i + 1), "byte %d is %u, not %d", i, got[i], i + 1);
out:
	dev->free(dev->ctx, rank, gs);
	dev->free(dev->ctx, rank, gd);
	return bad;
}

/* ---- 2. a failed copy surfaces at sync ----------------------------------------- */

int
copy_error(xport_t *x, const int32_t *world, size_t nworld, const uint8_t *id, size_t idlen)
{
	int32_t rank = world[0];
	gpu_api_t *a = (gpu_api_t *)gpu_load(1, NULL, 0);
	refit_gpu_copy_strided_fn kern = a->copy_strided;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	s = session(x, 1, world, nworld, world, nworld, id, idlen, &err);
	EXPECT(s != NULL, "open: %s", err.msg);
	if (s == NULL)
		return bad;
	{
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		int64_t shape[2] = {3, 4};
		dp_view_t sv, dv;
		plan_shard_t sh = {0};
		plan_box_t box = {{0, 0}, {3, 4}};
		uint8_t *g = dev->alloc(dev->ctx, rank, 256);

		EXPECT(g != NULL, "cudaMalloc");
		dp_view_contiguous(&sv, g, 2, shape, 4);
		dp_view_contiguous(&dv, g + 128, 2, shape, 4);
		sv.stride[1] = 0;   /* broadcast innermost dim: without the kernel a 2D copy of
				       pitch 0, which CUDA refuses (cudaErrorInvalidPitchValue) */
		sh.box.size[0] = 3;
		sh.box.size[1] = 4;
		a->copy_strided = NULL;
		dev->copy_box(dev->ctx, rank, &sv, &sh, &dv, &sh, &box);
		a->copy_strided = kern;
		refit_err_clear(&err);
		EXPECT(dev->sync(dev->ctx, &err) == REFIT_ERR_CUDA &&
		       strstr(err.msg, "cudaMemcpy2DAsync"), "a 2D copy of pitch 0 was not "
		       "reported at sync (got \"%s\")", err.msg);
		dev->free(dev->ctx, rank, g);
		xport_nccl_ops.close(s);
	}
	/* the next session starts clean and works */
	refit_err_clear(&err);
	s = session(x, 1, world, nworld, world, nworld, id, idlen, &err);
	EXPECT(s != NULL, "open after the failure: %s", err.msg);
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint8_t *g = dev->alloc(dev->ctx, rank, 64), h[64], r[64];

		for (int i = 0; i < 64; i++)
			h[i] = (uint8_t)(i * 7);
		dev->from_host(dev->ctx, rank, g, h, 64);
		dev->to_host(dev->ctx, rank, r, g, 64);
		refit_err_clear(&err);
		EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK && memcmp(h, r, 64) == 0,
		       "a copy after the failure: %s", err.msg);
		if (kern != NULL) {
			/* a box through the kernel, whose launch returns cudaGetLastError():
			 * the refused 2D copy's error must not resurface there */
			int64_t shape[1] = {4};
			dp_view_t sv, dv;
			plan_shard_t sh = {0};
			plan_box_t box = {{0}, {4}};

			dp_view_contiguous(&sv, g, 1, shape, 4);
			dp_view_contiguous(&dv, g + 32, 1, shape, 4);
			sv.stride[0] = 2;
			sh.box.size[0] = 4;
			dev->copy_box(dev->ctx, rank, &sv, &sh, &dv, &sh, &box);
			dev->to_host(dev->ctx, rank, r, g + 32, 16);
			refit_err_clear(&err);
			EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "a kernel box copy after the "
			       "failure: %s", err.msg);
			for (int i = 0; i < 4 && err.status == REFIT_OK; i++)
				EXPECT(memcmp(r + 4 * i, h + 8 * i, 4) == 0, "element %d", i);
		}
		dev->free(dev->ctx, rank, g);
		xport_nccl_ops.close(s);
	}
	return bad;
}

/* ---- 3. two local ranks on two devices ------------------------------------------ */

/* The executor's side of an exchange, reduced to one group of ops. */
typedef struct one_group {
	const xport_op_t *ops;
	size_t n;
	bool given;
} one_group_t;

static refit_status_t
one_next(void *arg, const xport_op_t **ops, size_t *n, bool *end, refit_err_t *err)
{
	one_group_t *g = arg;

	(void)err;
	*end = g->given;
	*ops = g->ops;
	*n = g->n;
	g->given = true;
	return REFIT_OK;
}

static refit_status_t
one_done(void *arg, refit_err_t *err)
{
	(void)arg;
	(void)err;
	return REFIT_OK;
}

/* ops as one group, through the transport's one entry point. */
refit_status_t
group_run(xport_session_t *s, const xport_op_t *ops, size_t n, refit_err_t *err)
{
	one_group_t g = {ops, n, false};
	xport_io_t io = {.arg = &g, .next_group = one_next, .group_done = one_done};

	return xport_nccl_ops.exchange(s, &io, err);
}

/*
 * n bytes from rank r0's device to rank r1's (r0 == r1: to itself) in one
 * group, checked byte for byte; then reps more groups timed (0: none), the
 * rate printed.
 */
int
group_two(xport_session_t *s, int32_t r0, int32_t r1, uint64_t n, int reps)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	uint8_t *a = dev->alloc(dev->ctx, r0, n), *b = dev->alloc(dev->ctx, r1, n);
	uint8_t *h = malloc(n), *g = malloc(n);
	xport_op_t ops[2] = {{true, r0, r1, a, n}, {false, r1, r0, b, n}};
	refit_err_t err;
	double t0, t;
	int bad = 0;

	EXPECT(a && b, "cudaMalloc");
	for (uint64_t i = 0; i < n; i++)
		h[i] = (uint8_t)(i * 131 + 7);
	dev->from_host(dev->ctx, r0, a, h, n);
	refit_err_clear(&err);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	EXPECT(group_run(s, ops, 2, &err) == REFIT_OK, "group: %s", err.msg);
	dev->to_host(dev->ctx, r1, g, b, n);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	EXPECT(memcmp(g, h, n) == 0, "rank %d -> rank %d changed the bytes", r0, r1);
	t0 = clock_mono_s();
	for (int i = 0; i < reps && !bad; i++)
		EXPECT(group_run(s, ops, 2, &err) == REFIT_OK, "group: %s", err.msg);
	t = clock_mono_s() - t0;
	if (reps > 0)
		printf("     %" PRIu64 " MiB send/recv rank %d -> %d byte-exact; %.1f GB/s over "
		       "%d reps%s\n", n >> 20, r0, r1, n * reps / t / 1e9, reps,
		       emu ? " (emulator: not a GPU figure)" : "");
	dev->free(dev->ctx, r0, a);
	dev->free(dev->ctx, r1, b);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	free(h);
	free(g);
	return bad;
}

/*
 * A delta unit from rank r0's device to rank r1's (issue 26 item 3): n
 * bf16 bytes, every 97th element changed (-0.0 for 0.0, a NaN's payload,
 * others), encoded by the kernels on r0 against its base, the size message
 * (wire bytes, base tag) in one group, the encoding in the next (its size
 * now known to r1), decoded on r1 in place into its copy of the base:
 * byte-exact against the new bytes, the wire a fraction of dense.
 */
/* bf16 base and new bytes: every 97th element changed, -0.0 for 0.0 and a
 * NaN's payload among them */
static void
delta_fill(uint8_t *hb, uint8_t *hc, uint64_t n)
{
	for (uint64_t i = 0; i + 2 <= n; i += 2) {
		uint16_t v = (uint16_t)(i * 2654435761u >> 7), c = v;

		if (i % 97 == 0)
			c = v == 0 ? 0x8000 : (v & 0x7f80) == 0x7f80 ? v ^ 1 : (uint16_t)(v + 1);
		if (i % 1000 == 0)
			v = 0, c = 0x8000;                /* 0.0 -> -0.0 */
		if (i % 1500 == 2)
			v = 0x7fc1, c = 0x7fc3;           /* a NaN's payload */
		memcpy(hb + i, &v, 2);
		memcpy(hc + i, &c, 2);
	}
}

/* The size message from r0 to r1 in a group of its own: what r1 read. */
static int
delta_size(xport_session_t *s, int32_t r0, int32_t r1, uint8_t *s0, uint8_t *s1, uint64_t len,
	   uint64_t *wire)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	xport_op_t so[2] = {{true, r0, r1, s0, DP_GDELTA_SIZE_MSG},
			    {false, r1, r0, s1, DP_GDELTA_SIZE_MSG}};
	uint8_t szh[DP_GDELTA_SIZE_MSG];
	uint64_t tag = 0;
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	dp_gdelta_size_put(szh, len, 77);
	dev->from_host(dev->ctx, r0, s0, szh, sizeof(szh));
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	EXPECT(group_run(s, so, 2, &err) == REFIT_OK, "size group: %s", err.msg);
	dev->to_host(dev->ctx, r1, szh, s1, sizeof(szh));
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	dp_gdelta_size_get(szh, wire, &tag);
	EXPECT(*wire == len && tag == 77, "the size message: %" PRIu64 " bytes, tag %" PRIu64
	       " (sent %" PRIu64 ", 77)", *wire, tag, len);
	return bad;
}

typedef struct dbufs {
	uint8_t *b0, *c0, *e0, *w0, *s0, *b1, *e1, *w1, *s1;
} dbufs_t;

/* The encoding (wire bytes) from r0 to r1, decoded in place into r1's base;
 * r1's bytes then into got. */
static int
delta_payload(xport_session_t *s, int32_t r0, int32_t r1, const dbufs_t *d, uint64_t n,
	      uint64_t wire, uint8_t *got)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	xport_op_t po[2] = {{true, r0, r1, d->e0, wire}, {false, r1, r0, d->e1, wire}};
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	EXPECT(group_run(s, po, 2, &err) == REFIT_OK, "payload group: %s", err.msg);
	dp_gdelta_decode(dev, r1, d->b1, d->b1, n, 2, d->e1, wire, d->w1);
	EXPECT(dp_gdelta_decode_result(dev, r1, d->w1, &err) == REFIT_OK, "decode: %s", err.msg);
	dev->to_host(dev->ctx, r1, got, d->b1, n);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	return bad;
}

static int
delta_free(const dp_dev_ops_t *dev, int32_t r0, int32_t r1, dbufs_t *d)
{
	uint8_t *p0[] = {d->b0, d->c0, d->e0, d->w0, d->s0}, *p1[] = {d->b1, d->e1, d->w1, d->s1};
	refit_err_t err;
	int bad = 0;

	for (size_t i = 0; i < sizeof(p0) / sizeof(*p0); i++)
		if (p0[i])
			dev->free(dev->ctx, r0, p0[i]);
	for (size_t i = 0; i < sizeof(p1) / sizeof(*p1); i++)
		if (p1[i])
			dev->free(dev->ctx, r1, p1[i]);
	refit_err_clear(&err);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync after the frees: %s", err.msg);
	return bad;
}

/*
 * A delta unit from rank r0's device to rank r1's (issue 26 item 3): n
 * bf16 bytes (delta_fill), encoded by the kernels on r0 against its base,
 * the size message (wire bytes, base tag) in one group, the encoding in
 * the next (its size now known to r1), decoded on r1 in place into its
 * copy of the base: byte-exact against the new bytes, the wire a fraction
 * of dense.
 */
int
delta_two(xport_session_t *s, int32_t r0, int32_t r1, uint64_t n)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	uint64_t wk = dp_gdelta_work(n, 2), len = 0, wire = 0;
	uint8_t *hb = malloc(n), *hc = malloc(n), *g = malloc(n);
	dp_delta_fmt_t fmt = DP_DELTA_DENSE;
	dbufs_t d = {dev->alloc(dev->ctx, r0, n), dev->alloc(dev->ctx, r0, n),
		     dev->alloc(dev->ctx, r0, DP_DELTA_HDR + n), dev->alloc(dev->ctx, r0, wk),
		     dev->alloc(dev->ctx, r0, DP_GDELTA_SIZE_MSG), dev->alloc(dev->ctx, r1, n),
		     NULL, dev->alloc(dev->ctx, r1, wk),
		     dev->alloc(dev->ctx, r1, DP_GDELTA_SIZE_MSG)};
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	EXPECT(dev->delta != NULL, "the transport has no delta kernels");
	EXPECT(d.b0 && d.c0 && d.e0 && d.w0 && d.s0 && d.b1 && d.w1 && d.s1, "cudaMalloc");
	delta_fill(hb, hc, n);
	if (!bad) {
		dev->from_host(dev->ctx, r0, d.b0, hb, n);
		dev->from_host(dev->ctx, r0, d.c0, hc, n);
		dev->from_host(dev->ctx, r1, d.b1, hb, n);
		dp_gdelta_encode(dev, r0, d.b0, d.c0, n, 2, d.e0, d.w0);
		EXPECT(dp_gdelta_encode_result(dev, r0, d.w0, &len, &fmt, &err) == REFIT_OK,
		       "encode: %s", err.msg);
	}
	if (!bad)
		bad += delta_size(s, r0, r1, d.s0, d.s1, len, &wire);
	if (!bad)
		EXPECT((d.e1 = dev->alloc(dev->ctx, r1, wire)) != NULL, "cudaMalloc");
	if (!bad)
		bad += delta_payload(s, r0, r1, &d, n, wire, g);
	if (!bad) {
		EXPECT(memcmp(g, hc, n) == 0, "rank %d's decoded bytes differ from rank %d's new "
		       "bytes", r1, r0);
		EXPECT(fmt != DP_DELTA_DENSE && wire * 10 < n, "%" PRIu64 " bytes on the wire "
		       "(%s) for %" PRIu64 " dense", wire, dp_delta_fmt_str(fmt), n);
		printf("     delta rank %d -> %d: %" PRIu64 " dense bytes as %" PRIu64 " (%s), "
		       "decoded in place byte-exact\n", r0, r1, n, wire, dp_delta_fmt_str(fmt));
	}
	bad += delta_free(dev, r0, r1, &d);
	free(hb);
	free(hc);
	free(g);
	return bad;
}

/* ---- 6. loopback ------------------------------------------------------------------ */

int
loopback(xport_session_t *s, int32_t r)
{
	return group_two(s, r, r, emu ? 8ull << 20 : 256ull << 20, 10);
}

#endif
