/*
 * gpu_test.c - the nccl transport's device code, on a real GPU
 * (tests/gpu/run.sh) or on the CUDA + NCCL emulator (tests/run-check-nccl.sh,
 * REFIT_GPU_TEST_EMU=1): the same program, the libraries chosen as refitd
 * chooses them (REFIT_CUDA_LIBRARY, REFIT_NCCL_LIBRARY, ...).
 *
 *   1. box copies: random boxes between random views -- padded rows, a
 *      strided innermost dim (the strided-copy kernel), size-1 dims,
 *      stride-0 (broadcast) source dims -- through the transport's device
 *      operations on every local rank's device, byte for byte against the
 *      host copy (dp_copy_box); every error checked at sync; and a box
 *      whose rows are 2^31 + 64 bytes apart (above CUDA's largest 2D
 *      pitch: copied row by row);
 *   2. a failed copy is reported at sync, not dropped (a 2D copy with a
 *      zero pitch, which CUDA refuses without poisoning the context);
 *   3. two local ranks on two devices (where there are two): each one's
 *      staging on its own device, a grouped send/recv between them;
 *      a delta unit between them (or to itself on one device): encoded
 *      by the delta kernels, its size message, then its bytes, decoded in
 *      place, byte-exact (issue 26);
 *   4. CUDA IPC: a child process opens an allocation through the
 *      transport (mem_open) and reads pieces at offsets inside it; wrong
 *      cuda_bytes and a wrong device are refused, also a claim that ends
 *      inside the next mapping (a second allocation, opened after the
 *      first: device memory of the same device right past the first);
 *   5. three processes, one rank each (their own NCCL_HOSTID, so on one
 *      GPU NCCL uses its network transport): a ring of sends, then one
 *      process leaves and the two others shrink their communicators
 *      (ncclCommShrink, no new unique id) and exchange again;
 *   6. a loopback communicator: 256 MiB to itself, byte-exact, GB/s;
 *   7. (emulator) the loader's fallback: on a machine without
 *      libcudart.so.13 the search loads libcudart.so.12;
 *   8. (emulator) a peer killed mid-group: the sender's group fails, naming
 *      the peer, even when its stream drained before the transport looked;
 *   9. (emulator) a destroy refused by an asynchronous error that came after
 *      the transport's check: aborted instead, no group left open;
 *  10. gpu_root_new whose second pipe fails leaves no descriptor open;
 *  11. ncclGroupStart refused (NCCL < 2.27 did, while the
 *      previous non-blocking group was launching): the group fails naming
 *      it, nothing is posted outside a group;
 *  12. a host copy that never ends (a stuck device): the call
 *      returns by the session's deadline, the communicators are aborted,
 *      the node is poisoned (refuses the next refit, keeps the memory the
 *      copy may still write), and the caller's buffer, reused after the
 *      call, is never written when the copy finally runs;
 *  13. (emulator) a shrink that fails (a survivor never shrinks: the
 *      deadline): the parent is aborted first, which ends the shrink and
 *      makes NCCL write its new communicator, then that one is aborted:
 *      no communicator is left (before, the variable NCCL writes was freed
 *      first and the new communicator never freed);
 *  14. (emulator) a kernel library bound to another CUDA runtime than the
 *      one refitd loaded (here: a copy of the emulated runtime as the
 *      runtime, the original as the kernels) is refused at load, naming
 *      both (its launches would use the other runtime's current device);
 *  15. stream ordering (gpu_order.c): a writer process's queued write, an
 *      interprocess event recorded after it; a session given the event
 *      reads the written bytes (the emulator holds the writer's stream
 *      until the reader's copy could have run).
 * On the emulator each process finally checks the emulator's counters:
 * nothing allocated, mapped, created or left unconsumed.
 *
 * Prints "gpu: N passed, N failed" last.  Exit 0: passed; 1: failed; 77:
 * skipped (built without the headers, or the libraries or a device are
 * missing: the reason is printed; tests/gpu/run.sh decides whether that
 * is a failure).
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
#include "tests/gpu/gpu_order.h"

#ifndef REFIT_HAVE_NCCL
int
main(void)
{
	printf("gpu: skipped: built without the CUDA and NCCL headers\n");
	return 77;
}
#else

static int passed, failed;
static bool emu;

#define EXPECT(cond, ...)                                                          \
	do {                                                                       \
		if (!(cond)) {                                                     \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                \
			printf(__VA_ARGS__);                                       \
			printf("\n");                                              \
			fflush(stdout);                                            \
			bad++;                                                     \
		}                                                                  \
	} while (0)

static void
result(const char *name, int bad)
{
	if (bad) {
		failed++;
		printf("FAIL %s\n", name);
	} else {
		passed++;
		printf("ok   %s\n", name);
	}
	fflush(stdout);
}

static atomic_int no_abort;
static int64_t session_ms = 120000;   /* a session's deadline */

/* A transport serving ranks (on devices devs, "0,1": NULL = identity). */
static xport_t *
start(const int32_t *ranks, size_t n, const char *devs, const char *name, refit_err_t *err)
{
	/* 3 GiB of staging: big_pitch needs 2 GiB */
	xport_cfg_t xc = {"", name, ranks, n, devs, 3ull << 30, NULL, NULL, NULL, false, NULL, NULL};
	xport_t *x = NULL;

	if (xport_nccl_ops.start(&xc, &x, err) != REFIT_OK)
		return NULL;
	return x;
}

/* A session of epoch over world (all ranks), this transport's local ranks;
 * id: NULL for none (shrink). */
static xport_session_t *
session(xport_t *x, uint64_t epoch, const int32_t *world, size_t nworld,
	const int32_t *local, size_t nlocal, const uint8_t *id, size_t idlen, refit_err_t *err)
{
	xport_world_t w = {epoch, world, nworld, local, nlocal, id, id ? idlen : 0, NULL, NULL, NULL, 0};
	xport_peer_t self = {"gpu-test", "nccl", true, true, 1 << 30};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = epoch, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 1 << 30, .abort = &no_abort};
	xport_session_t *s = NULL;

	xport_nccl_ops.set_world(x, &w);
	sc.deadline_ms = xport_now_ms() + session_ms;
	if (xport_nccl_ops.open(x, &sc, &s, err) != REFIT_OK)
		return NULL;
	return s;
}

/*
 * A child process's transport for rank me, on its own host
 * (NCCL_HOSTID + suffix: on one GPU NCCL then uses its network transport
 * and refuses nothing), device 0; the loaded table in *api (a static,
 * writable: tests put their stand-ins in it).  NULL: said why.
 */
static xport_t *
child_start(const char *suffix, int32_t me, gpu_api_t **api)
{
	char host[64], why[1024];
	refit_err_t err;
	xport_t *x;

	snprintf(host, sizeof(host), "%s-%s%d", getenv("NCCL_HOSTID") ? getenv("NCCL_HOSTID") :
		 "gpu-test", suffix, me);
	setenv("NCCL_HOSTID", host, 1);
	if ((*api = (gpu_api_t *)gpu_load(1, why, sizeof(why))) == NULL) {
		printf("FAIL %s rank %d: %s\n", suffix, me, why);
		return NULL;
	}
	refit_err_clear(&err);
	if ((x = start(&me, 1, "0", host, &err)) == NULL)
		printf("FAIL %s rank %d: %s\n", suffix, me, err.msg);
	return x;
}

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

static int
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
static int
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

static int
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
static refit_status_t
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
static int
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
static int
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

/* ---- 4. CUDA IPC ------------------------------------------------------------------ */

/* The allocations' size: 2 MiB, as CUDA advises for IPC (sub-allocations of
 * a larger block would share the block). */
#define IPC_BYTES (2u << 20)

/* The child: opens the handles (two allocations A and B) on rank 0's
 * device, reads pieces of A. */
static int
ipc_child(int rfd)
{
	const xport_ops_t *o = &xport_nccl_ops;
	uint8_t handle[64], hb[64], buf[1024];
	int32_t r0 = 0;
	xport_t *x;
	refit_err_t err;
	void *base = NULL, *bb = NULL, *b2 = NULL;
	int bad = 0;
	const gpu_api_t *a;
	char why[1024];

	if (read(rfd, handle, sizeof(handle)) != (ssize_t)sizeof(handle) ||
	    read(rfd, hb, sizeof(hb)) != (ssize_t)sizeof(hb))
		return 3;   /* the parent skipped */
	if ((a = gpu_load(1, why, sizeof(why))) == NULL) {
		printf("FAIL ipc child: %s\n", why);
		return 1;
	}
	refit_err_clear(&err);
	if ((x = start(&r0, 1, "0", "gpu-test-ipc", &err)) == NULL) {
		printf("FAIL ipc child: %s\n", err.msg);
		return 1;
	}
	/* cuda_bytes beyond the allocation, and a wrong device, are refused */
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), -1, NULL, 1 << 24, &base, &err) ==
	       REFIT_ERR_INVALID_ARG && strstr(err.msg, "larger than the allocation"),
	       "cuda_bytes 16 MiB for a 2 MiB allocation: %s", err.msg);
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), 1, NULL, IPC_BYTES, &base, &err) ==
	       REFIT_ERR_INVALID_ARG && strstr(err.msg, "on CUDA device 1"),
	       "device 1 said for rank 0: %s", err.msg);
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), 0, NULL, IPC_BYTES, &base, &err) == REFIT_OK,
	       "mem_open: %s", err.msg);
	/* B, opened next: on the emulator its mapping starts where A's ends (as
	 * CUDA may place it), so the byte past A is device memory of device 0 */
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, hb, sizeof(hb), 0, NULL, IPC_BYTES, &bb, &err) == REFIT_OK,
	       "mem_open of the second allocation: %s", err.msg);
	if (base && bb) {
		printf("     the second mapping %s right after the first\n",
		       (uint8_t *)bb == (uint8_t *)base + IPC_BYTES ? "starts" : "does not start");
		if (emu)
			EXPECT((uint8_t *)bb == (uint8_t *)base + IPC_BYTES, "emulator: B's mapping "
			       "is not right after A's: the next case proves nothing");
	}
	/* A claimed 4 KiB larger than it is: the claim's last byte is in B */
	refit_err_clear(&err);
	EXPECT(o->mem_open(x, 0, handle, sizeof(handle), 0, NULL, IPC_BYTES + 4096, &b2, &err) ==
	       REFIT_ERR_INVALID_ARG && strstr(err.msg, "larger than the allocation"),
	       "cuda_bytes 2 MiB + 4 KiB for a 2 MiB allocation, the next mapping right "
	       "after it: %s", b2 ? "accepted" : err.msg);
	if (b2)
		o->mem_close(x, b2);
	if (base) {
		/* pieces at offsets inside the one allocation */
		for (uint64_t off = 0; off < IPC_BYTES && !bad; off += IPC_BYTES / 4) {
			cudaError_t e = a->cudaSetDevice(0);

			if (e == cudaSuccess)
				e = a->cudaMemcpy(buf, (uint8_t *)base + off + 100, sizeof(buf),
						  cudaMemcpyDeviceToHost);
			EXPECT(e == cudaSuccess, "cudaMemcpy at offset %" PRIu64 ": %s", off + 100,
			       a->cudaGetErrorString(e));
			for (size_t i = 0; i < sizeof(buf) && e == cudaSuccess; i++)
				if (buf[i] != (uint8_t)((off + 100 + i) ^ 0x5a)) {
					EXPECT(0, "byte %" PRIu64 " of the allocation differs",
					       off + 100 + i);
					break;
				}
		}
		o->mem_close(x, base);
	}
	if (bb)
		o->mem_close(x, bb);
	o->stop(x);
	return bad ? 1 : 0;
}

/* ---- 5. three processes, a ring, a shrink ----------------------------------------- */

static int
ring(xport_session_t *s, int32_t me, const int32_t *world, size_t n, uint64_t bytes,
     uint64_t salt)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	size_t k = 0;
	int32_t next, prev;
	uint8_t *a, *b, *h = malloc(bytes), *g = malloc(bytes);
	refit_err_t err;
	int bad = 0;

	while (world[k] != me)
		k++;
	next = world[(k + 1) % n];
	prev = world[(k + n - 1) % n];
	a = dev->alloc(dev->ctx, me, bytes);
	b = dev->alloc(dev->ctx, me, bytes);
	EXPECT(a && b, "cudaMalloc");
	for (uint64_t i = 0; i < bytes; i++)
		h[i] = (uint8_t)((uint64_t)me * 37 + i * 13 + salt);
	dev->from_host(dev->ctx, me, a, h, bytes);
	refit_err_clear(&err);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	{
		xport_op_t ops[2] = {{true, me, next, a, bytes}, {false, me, prev, b, bytes}};

		EXPECT(group_run(s, ops, 2, &err) == REFIT_OK, "rank %d: group: %s",
		       me, err.msg);
	}
	dev->to_host(dev->ctx, me, g, b, bytes);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	for (uint64_t i = 0; i < bytes; i++)
		if (g[i] != (uint8_t)((uint64_t)prev * 37 + i * 13 + salt)) {
			EXPECT(0, "rank %d: byte %" PRIu64 " from rank %d differs", me, i, prev);
			break;
		}
	dev->free(dev->ctx, me, a);
	dev->free(dev->ctx, me, b);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	free(h);
	free(g);
	return bad;
}

static int emu_check(const char *who);

/*
 * The NCCL unique id of a session across processes: rank 0 makes it (into
 * id, *idlen bytes on entry: its room) and writes it to each of outs; the
 * others read it from idfd.  Returns the failures.
 */
static int
share_id(xport_t *x, int32_t me, const int *outs, int nouts, int idfd, uint8_t *id,
	 size_t *idlen)
{
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	if (me == 0) {
		EXPECT(xport_nccl_ops.unique_id(x, id, idlen, &err) == REFIT_OK, "unique id: %s",
		       err.msg);
		for (int i = 0; i < nouts; i++)
			if (write(outs[i], id, *idlen) != (ssize_t)*idlen)
				bad++;
	} else {
		ssize_t r = read(idfd, id, *idlen);

		*idlen = r > 0 ? (size_t)r : 0;
	}
	return bad;
}

/*
 * Rank me of {0, 1, 2}: ids come on idfd (rank 0 makes one and writes it to
 * out0/out1), after the ring rank 2 leaves; 0 and 1 wait for a byte on
 * gofd (the parent writes it once rank 2 has exited) and shrink.
 */
static int
ring_child(int32_t me, int idfd, int out1, int out2, int gofd, int donefd)
{
	int32_t world[3] = {0, 1, 2}, world2[2] = {0, 1};
	uint8_t id[512];
	size_t idlen = sizeof(id);
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;
	char c;

	if ((x = child_start("r", me, &a)) == NULL)
		return 1;
	refit_err_clear(&err);
	bad += share_id(x, me, (const int[]){out1, out2}, 2, idfd, id, &idlen);
	s = session(x, 1, world, 3, &me, 1, id, idlen, &err);
	EXPECT(s != NULL, "rank %d: communicators of 3: %s", me, err.msg);
	if (s) {
		bad += ring(s, me, world, 3, 1 << 20, 1);
		xport_nccl_ops.close(s);
	}
	if (me == 2) {
		xport_nccl_ops.stop(x);
		bad += emu_check("rank 2 (left)");
		return bad ? 1 : 0;
	}
	if (read(gofd, &c, 1) != 1)
		bad++;
	/* epoch 2 without a unique id: shrink */
	s = session(x, 2, world2, 2, &me, 1, NULL, 0, &err);
	EXPECT(s != NULL, "rank %d: shrinking to 2: %s", me, err.msg);
	if (s) {
		bad += ring(s, me, world2, 2, 1 << 20, 2);
		xport_nccl_ops.close(s);
	}
	/* tell the parent this rank's shrunk ring ran */
	if (write(donefd, "x", 1) != 1)
		bad++;
	xport_nccl_ops.stop(x);
	bad += emu_check(me ? "rank 1" : "rank 0");
	return bad ? 1 : 0;
}

/* ---- 8. a peer dies mid-group (emulator) -------------------------------------------- */

/*
 * The sender's side of a group whose peer dies: the emulated NCCL fails
 * the send with ncclRemoteError and its stream then completes.  The first
 * cudaStreamQuery of the group kills the peer and returns only once the
 * stream drained (a poller descheduled while the error came: the stream is
 * done, the communicator's asynchronous error is set).  The transport must
 * report the group failed, naming the peer, and not done (the defect: only
 * a stream still running had its communicator's error checked).
 */
static pid_t kill_on_query;
static __typeof__(cudaStreamQuery) *real_query;

static cudaError_t
query_after_death(cudaStream_t st)
{
	if (kill_on_query > 0) {
		kill(kill_on_query, SIGKILL);
		kill_on_query = 0;
		for (int i = 0; i < 60000 && real_query(st) == cudaErrorNotReady; i++)
			usleep(1000);
	}
	return real_query(st);
}

/* Rank me of {0, 1} on its own host: rank 0 makes the id (writes it on
 * idfd), rank 1 reads it (idfd), opens the session and waits to be
 * killed; rank 0 sends to it and kills it (peer) mid-group. */
static int
dead_peer_child(int32_t me, int idfd, pid_t peer)
{
	int32_t world[2] = {0, 1};
	uint8_t id[512];
	size_t idlen = sizeof(id);
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	if ((x = child_start("dead", me, &a)) == NULL)
		return 1;
	refit_err_clear(&err);
	bad += share_id(x, me, &idfd, 1, idfd, id, &idlen);
	s = session(x, 1, world, 2, &me, 1, id, idlen, &err);
	EXPECT(s != NULL, "dead-peer rank %d: communicators of 2: %s", me, err.msg);
	if (me == 1) {
		for (;;)      /* killed by rank 0 */
			pause();
	}
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint64_t n = 1 << 20;
		uint8_t *buf = dev->alloc(dev->ctx, 0, n);
		xport_op_t op = {true, 0, 1, buf, n};
		refit_status_t rc;
		const char *says;

		EXPECT(buf != NULL, "cudaMalloc");
		real_query = a->cudaStreamQuery;
		a->cudaStreamQuery = query_after_death;
		kill_on_query = peer;
		rc = group_run(s, &op, 1, &err);
		a->cudaStreamQuery = real_query;
		EXPECT(kill_on_query == 0, "the group never queried its stream");
		/* the emulator's own text too, through ncclGetLastError: the
		 * connection to rank 1 closed, or rank 1 could not be reached */
		says = strstr(err.msg, "NCCL's last error: ");
		EXPECT(rc == REFIT_ERR_NCCL && strstr(err.msg, "sends to rank 1") &&
		       strstr(err.msg, "remote process exited") && says &&
		       strstr(says, "rank 1"), "a send to a peer killed "
		       "mid-group: %s (%s)", rc == REFIT_OK ? "done" : "failed", err.msg);
		/* freed although the communicators are gone (the counters check) */
		dev->free(dev->ctx, 0, buf);
		xport_nccl_ops.close(s);
	}
	xport_nccl_ops.stop(x);
	bad += emu_check("the sender of a dead peer");
	return bad ? 1 : 0;
}

/* ---- 8b. the staging budget ---------------------------------------------------------- */

/*
 * A rank's staging comes from one arena of gpu_staging_budget_bytes (16 MiB
 * here): a session whose messages exceed it is refused at open, naming the
 * key; inside one, what does not fit at once fails at the next sync naming
 * the budget; given back, the free ranges merge (16 MiB fits again).
 */
static int
staging_budget(void)
{
	int32_t me = 0;
	xport_cfg_t xc = {"", "gpu-test-budget", &me, 1, "0", 16u << 20, NULL, NULL, NULL, false,
			  NULL, NULL};
	xport_peer_t self = {"gpu-test-budget", "nccl", true, true, 4 << 20};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = 1, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 4 << 20, .abort = &no_abort};
	xport_t *x = NULL;
	xport_session_t *s = NULL;
	const dp_dev_ops_t *dev;
	uint8_t id[512], *p8, *p9, *p16;
	size_t idlen = sizeof(id);
	xport_world_t w = {1, &me, 1, &me, 1, id, 0, NULL, NULL, NULL, 0};
	refit_err_t err;
	int bad = 0;

	refit_err_clear(&err);
	if (xport_nccl_ops.start(&xc, &x, &err) != REFIT_OK ||
	    xport_nccl_ops.unique_id(x, id, &idlen, &err) != REFIT_OK) {
		EXPECT(0, "start: %s", err.msg);
		return bad;
	}
	w.id_len = idlen;
	s = session(x, 1, &me, 1, &me, 1, id, idlen, &err);   /* 1 GiB messages */
	EXPECT(s == NULL && strstr(err.msg, "gpu_staging_budget_bytes 16777216"),
	       "a session of 1 GiB messages on a 16 MiB budget: %s", s ? "opened" : err.msg);
	refit_err_clear(&err);
	xport_nccl_ops.set_world(x, &w);
	sc.deadline_ms = xport_now_ms() + session_ms;
	/* a plan whose groups need 20 MiB at once on rank 0 (slice.c: the
	 * whole plan's staging), messages of 4 MiB: refused at open */
	sc.staging_need = 20u << 20;
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_ERR_LIMIT &&
	       strstr(err.msg, "needs 20971520 bytes of GPU staging at once on rank 0") &&
	       strstr(err.msg, "gpu_staging_budget_bytes 16777216") &&
	       strstr(err.msg, "before anything was allocated"),
	       "a plan needing 20 MiB at once on a 16 MiB budget: %s", s ? "opened" : err.msg);
	if (s) {
		xport_nccl_ops.close(s);
		s = NULL;
	}
	sc.staging_need = 16u << 20;   /* exactly the budget: runs */
	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_OK, "open: %s", err.msg);
	if (s == NULL)
		goto out;
	dev = xport_nccl_ops.dev(s);
	p8 = dev->alloc(dev->ctx, 0, 8 << 20);
	p9 = dev->alloc(dev->ctx, 0, 9 << 20);
	EXPECT(p8 != NULL && p9 == NULL, "8 MiB then 9 MiB of a 16 MiB arena: %p %p",
	       (void *)p8, (void *)p9);
	EXPECT(dev->sync(dev->ctx, &err) == REFIT_ERR_NOMEM &&
	       strstr(err.msg, "gpu_staging_budget_bytes 16777216") &&
	       strstr(err.msg, "8388608 in use"), "the failed allocation at sync: %s", err.msg);
	dev->free(dev->ctx, 0, p8);
	xport_nccl_ops.close(s);
	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_OK, "open again: %s", err.msg);
	if (s == NULL)
		goto out;
	dev = xport_nccl_ops.dev(s);
	p16 = dev->alloc(dev->ctx, 0, 16 << 20);
	EXPECT(p16 != NULL, "the whole arena after everything was given back");
	dev->free(dev->ctx, 0, p16);
	xport_nccl_ops.close(s);
out:
	xport_nccl_ops.stop(x);
	return bad;
}

/* ---- 8c. an abort that never returns (emulator: REFIT_EMU_HANG_ABORT) ----------------- */

/*
 * A group aborted by its session's abort flag: the communicators are
 * aborted, and that ncclCommAbort never returns (a stuck proxy or device).
 * The transport waits 10 s for it on a thread of its own, then returns the
 * group's failure and poisons the node (the next session refused, naming
 * the abort); before, the pool thread waited in ncclCommAbort forever.
 */
static int
hang_abort_child(void)
{
	int32_t me = 0;
	uint8_t id[512], *buf;
	size_t idlen = sizeof(id);
	atomic_int stop = 0;
	xport_peer_t self = {"gpu-test-hangabort", "nccl", true, true, 1 << 20};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = 1, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 1 << 20, .abort = &stop};
	xport_world_t w = {1, &me, 1, &me, 1, id, 0, NULL, NULL, NULL, 0};
	xport_session_t *s = NULL;
	const dp_dev_ops_t *dev;
	gpu_api_t *a;
	xport_t *x;
	refit_err_t err;
	char why[REFIT_ERR_MSG_MAX];
	int64_t t0;
	int bad = 0;

	setenv("REFIT_EMU_HANG_ABORT", "1", 1);
	if ((x = child_start("hangabort", me, &a)) == NULL)
		return 1;
	refit_err_clear(&err);
	if (xport_nccl_ops.unique_id(x, id, &idlen, &err) != REFIT_OK)
		return 1;
	w.id_len = idlen;
	xport_nccl_ops.set_world(x, &w);
	sc.deadline_ms = xport_now_ms() + session_ms;
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) == REFIT_OK, "open: %s", err.msg);
	if (s == NULL)
		return 1;
	dev = xport_nccl_ops.dev(s);
	buf = dev->alloc(dev->ctx, 0, 4096);
	EXPECT(buf != NULL, "staging");
	{
		xport_op_t op = {true, 0, 0, buf, 4096};   /* a send to itself, never received */

		atomic_store(&stop, 1);
		t0 = xport_now_ms();
		EXPECT(group_run(s, &op, 1, &err) != REFIT_OK, "the aborted group succeeded");
		EXPECT(xport_now_ms() - t0 < 30000, "the abort held the caller %lld ms",
		       (long long)(xport_now_ms() - t0));
	}
	EXPECT(xport_nccl_ops.poisoned(x, why, sizeof(why)) != XPORT_POISON_NONE &&
	       strstr(why, "ncclCommAbort did not return"), "poisoned: %s", why);
	xport_nccl_ops.close(s);
	s = NULL;
	atomic_store(&stop, 0);
	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.open(x, &sc, &s, &err) != REFIT_OK && strstr(err.msg, "poisoned"),
	       "the next session: %s", s ? "opened" : err.msg);
	return bad ? 1 : 0;   /* no stop: the abandoned abort holds its communicator */
}

/* ---- 9. a destroy refused by a late error (emulator) ---------------------------------- */

/*
 * The transport destroys a communicator it found healthy; an asynchronous
 * error that comes between its ncclCommGetAsyncError and its
 * ncclCommDestroy makes NCCL refuse the destroy, and NCCL 2.28 then leaves
 * the thread inside a group.  The error is brought in exactly there: the
 * armed ncclCommGetAsyncError, once it read ncclSuccess for the old
 * communicator, posts a mismatched send/recv to itself on it and returns
 * only once that failed.  The old communicator must still be freed
 * (aborted) and the thread's next group (the new epoch's communicators)
 * must run: before, the destroy's refusal was logged and nothing else, the
 * communicator leaked and the next ncclGroupEnd never launched the inits.
 */
static __typeof__(ncclCommGetAsyncError) *real_async;
static __typeof__(ncclCommInitRankConfig) *real_init;
static ncclComm_t late_comm;       /* the first communicator made */
static bool late_armed;
static void *late_buf[2];
static cudaStream_t late_stream;
static const gpu_api_t *late_api;

static ncclResult_t
init_capture(ncclComm_t *c, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg)
{
	ncclResult_t r = real_init(c, n, id, rank, cfg);

	if (late_comm == NULL && (r == ncclSuccess || r == ncclInProgress))
		late_comm = *c;
	return r;
}

static ncclResult_t
async_then_error(ncclComm_t c, ncclResult_t *st)
{
	const gpu_api_t *a = late_api;
	ncclResult_t r = real_async(c, st), now = ncclSuccess;

	if (!late_armed || c != late_comm || r != ncclSuccess || *st != ncclSuccess)
		return r;
	late_armed = false;
	if (a->cudaMalloc(&late_buf[0], 64) != cudaSuccess ||
	    a->cudaMalloc(&late_buf[1], 64) != cudaSuccess ||
	    a->cudaStreamCreateWithFlags(&late_stream, cudaStreamNonBlocking) != cudaSuccess)
		return r;  /* the test then fails: no error came */
	a->ncclGroupStart();
	a->ncclSend(late_buf[0], 64, ncclUint8, 0, c, late_stream);
	a->ncclRecv(late_buf[1], 32, ncclUint8, 0, c, late_stream);
	a->ncclGroupEnd();
	for (int i = 0; i < 20000 && real_async(c, &now) == ncclSuccess &&
	     (now == ncclSuccess || now == ncclInProgress); i++)
		usleep(1000);
	return r;   /* what was true when it was read */
}

static int
late_error_child(void)
{
	int32_t me = 0, world[1] = {0};
	uint8_t id[512];
	size_t idlen;
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	if ((x = child_start("late", me, &a)) == NULL)
		return 1;
	late_api = a;
	session_ms = 20000;  /* the inits a group left open never launch: fail sooner */
	real_async = a->ncclCommGetAsyncError;
	real_init = a->ncclCommInitRankConfig;
	a->ncclCommGetAsyncError = async_then_error;
	a->ncclCommInitRankConfig = init_capture;
	refit_err_clear(&err);
	for (uint64_t epoch = 1; epoch <= 2 && !bad; epoch++) {
		idlen = sizeof(id);
		EXPECT(xport_nccl_ops.unique_id(x, id, &idlen, &err) == REFIT_OK, "unique id: %s",
		       err.msg);
		/* epoch 2: its new id makes the transport drop epoch 1's communicator */
		late_armed = epoch == 2;
		s = session(x, epoch, world, 1, &me, 1, id, idlen, &err);
		EXPECT(s != NULL, "epoch %" PRIu64 ": the communicator: %s", epoch, err.msg);
		if (s) {
			bad += group_two(s, me, me, 4096, 0);
			xport_nccl_ops.close(s);
		}
	}
	EXPECT(late_buf[0] != NULL && !late_armed, "the late error was never brought in");
	xport_nccl_ops.stop(x);
	{
		ncclResult_t r = a->ncclGroupEnd();

		EXPECT(r == ncclInvalidUsage, "the thread was left inside a group (ncclGroupEnd "
		       "said %s)", a->ncclGetErrorString(r));
	}
	a->cudaSetDevice(0);
	if (late_buf[0] && a->cudaFree(late_buf[0]) != cudaSuccess)
		bad++;
	if (late_buf[1] && a->cudaFree(late_buf[1]) != cudaSuccess)
		bad++;
	if (late_stream && a->cudaStreamDestroy(late_stream) != cudaSuccess)
		bad++;
	bad += emu_check("the late-error child");
	return bad ? 1 : 0;
}

/* ---- 11, 12. a refused ncclGroupStart; a host copy that never ends (emulator) -------- */

/* 11: ncclGroupStart refuses gstart_refuse times (as NCCL before 2.27 did
 * while the previous non-blocking group was being launched): no group
 * opened. */
static __typeof__(ncclGroupStart) *real_gstart;
static int gstart_refuse;

static ncclResult_t
gstart_refused(void)
{
	if (gstart_refuse > 0) {
		gstart_refuse--;
		return ncclInvalidUsage;
	}
	return real_gstart();
}

/*
 * 12: the armed copy to the host is held, not queued, and its stream says
 * cudaErrorNotReady from then on: a device that never ends the copy.  The
 * test runs the held copy itself later, once the transport returned and
 * the caller reused its buffer: the copy's destination must not be the
 * caller's buffer (before: the transport queued the copy into it, waited
 * 60 s and returned, and the copy could still write it).
 */
static __typeof__(cudaMemcpyAsync) *real_memcpy;
static __typeof__(cudaStreamQuery) *real_query_stuck;
static bool stuck_armed;
static cudaStream_t stuck_st;
static struct {
	void *dst;
	const void *src;
	size_t n;
	enum cudaMemcpyKind kind;
} held;

static cudaError_t
memcpy_held(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t st)
{
	if (!stuck_armed || kind != cudaMemcpyDeviceToHost)
		return real_memcpy(dst, src, n, kind, st);
	stuck_armed = false;
	held.dst = dst;
	held.src = src;
	held.n = n;
	held.kind = kind;
	stuck_st = st;
	return cudaSuccess;
}

static cudaError_t
query_stuck(cudaStream_t st)
{
	if (held.dst != NULL && st == stuck_st)
		return cudaErrorNotReady;
	return real_query_stuck(st);
}

/* A session of epoch on a world of one rank (me), from a new id. */
static xport_session_t *
own_session(xport_t *x, uint64_t epoch, int32_t me, refit_err_t *err)
{
	uint8_t id[512];
	size_t idlen = sizeof(id);

	refit_err_clear(err);
	if (xport_nccl_ops.unique_id(x, id, &idlen, err) != REFIT_OK)
		return NULL;
	return session(x, epoch, &me, 1, &me, 1, id, idlen, err);
}

static int
stuck_child(void)
{
	int32_t me = 0;
	gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	if ((x = child_start("stuck", me, &a)) == NULL)
		return 1;
	session_ms = 3000;  /* the stuck copy waits for the deadline */
	/* 11 */
	s = own_session(x, 1, me, &err);
	EXPECT(s != NULL, "epoch 1: %s", err.msg);
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint8_t *b0 = dev->alloc(dev->ctx, 0, 4096), *b1 = dev->alloc(dev->ctx, 0, 4096);
		xport_op_t ops[2] = {{true, 0, 0, b0, 4096}, {false, 0, 0, b1, 4096}};
		refit_status_t rc;
		ncclResult_t r;

		EXPECT(b0 && b1, "cudaMalloc");
		real_gstart = a->ncclGroupStart;
		a->ncclGroupStart = gstart_refused;
		gstart_refuse = 1;
		rc = group_run(s, ops, 2, &err);
		a->ncclGroupStart = real_gstart;
		EXPECT(rc == REFIT_ERR_NCCL && strstr(err.msg, "ncclGroupStart"), "a group whose "
		       "ncclGroupStart was refused: %s (%s)", rc == REFIT_OK ? "done" : "failed",
		       err.msg);
		r = a->ncclGroupEnd();
		EXPECT(r == ncclInvalidUsage, "a group was left open (ncclGroupEnd said %s)",
		       a->ncclGetErrorString(r));
		dev->free(dev->ctx, 0, b0);
		dev->free(dev->ctx, 0, b1);
		xport_nccl_ops.close(s);
	}
	/* 12, a new epoch (the communicators were aborted) */
	s = own_session(x, 2, me, &err);
	EXPECT(s != NULL, "epoch 2: %s", err.msg);
	if (s) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint8_t *buf = dev->alloc(dev->ctx, 0, 4096), *h = malloc(4096);
		cudaStream_t ts = NULL;
		refit_status_t rc;
		cudaError_t e;
		size_t i;

		EXPECT(buf != NULL, "cudaMalloc");
		memset(h, 0x11, 4096);
		dev->from_host(dev->ctx, 0, buf, h, 4096);
		EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
		real_memcpy = a->cudaMemcpyAsync;
		real_query_stuck = a->cudaStreamQuery;
		a->cudaMemcpyAsync = memcpy_held;
		a->cudaStreamQuery = query_stuck;
		stuck_armed = true;
		refit_err_clear(&err);
		dev->to_host(dev->ctx, 0, h, buf, 4096);
		rc = dev->sync(dev->ctx, &err);
		EXPECT(held.dst != NULL, "the copy to the host was never queued");
		EXPECT(rc == REFIT_ERR_TIMEOUT && strstr(err.msg, "communicators were aborted"),
		       "a copy to the host that never ends: %s (%s)", rc == REFIT_OK ? "done" :
		       "failed", err.msg);
		/* the caller reuses its buffer; then the device runs the copy */
		memset(h, 0xee, 4096);
		e = a->cudaSetDevice(0);
		if (e == cudaSuccess)
			e = a->cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking);
		if (e == cudaSuccess && held.dst)
			e = real_memcpy(held.dst, held.src, held.n, held.kind, ts);
		if (e == cudaSuccess)
			e = a->cudaStreamSynchronize(ts);
		EXPECT(e == cudaSuccess, "the held copy: %s", a->cudaGetErrorString(e));
		for (i = 0; i < 4096 && h[i] == 0xee; i++)
			;
		EXPECT(i == 4096, "the copy that ran after the call returned wrote the caller's "
		       "buffer (byte %zu is 0x%02x)", i, i < 4096 ? h[i] : 0);
		if (ts)
			a->cudaStreamDestroy(ts);
		held.dst = NULL;
		a->cudaMemcpyAsync = real_memcpy;
		a->cudaStreamQuery = real_query_stuck;
		dev->free(dev->ctx, 0, buf);   /* kept: the node is poisoned */
		xport_nccl_ops.close(s);
		free(h);
	}
	/* the next refit is refused, saying why */
	s = own_session(x, 3, me, &err);
	EXPECT(s == NULL && err.status == REFIT_ERR_UNAVAILABLE && strstr(err.msg, "poisoned") &&
	       strstr(err.msg, "kept"), "the refit after a stuck copy: %s",
	       s ? "opened" : err.msg);
	if (s)
		xport_nccl_ops.close(s);
	xport_nccl_ops.stop(x);
	return bad ? 1 : 0;
}

/* ---- 13. a shrink that fails (emulator) -------------------------------------------- */

/*
 * role 0: rank 0 (its own host), makes the id (to idfd), forms the world
 * {0, 1, 2}, then shrinks to {0, 1} -- which rank 1 never does: the shrink
 * fails at the deadline; then says done (donefd).  role 1: ranks 1 and 2
 * on devices 0 and 1 (another host), reads the id, forms the world, waits
 * for done.
 */
static int
shrink_fail_child(int role, int idfd, int donefd)
{
	int32_t world[3] = {0, 1, 2}, mine[2] = {1, 2}, me = 0;
	uint8_t id[512];
	size_t idlen = sizeof(id);
	char host[64], why[1024], c = 'd';
	const gpu_api_t *a;
	xport_t *x;
	xport_session_t *s;
	refit_err_t err;
	int bad = 0;

	snprintf(host, sizeof(host), "%s-sf%d", getenv("NCCL_HOSTID") ?
		 getenv("NCCL_HOSTID") : "gpu-test", role);
	setenv("NCCL_HOSTID", host, 1);
	if ((a = gpu_load(1, why, sizeof(why))) == NULL) {
		printf("FAIL shrink-fail role %d: %s\n", role, why);
		return 1;
	}
	refit_err_clear(&err);
	x = role == 0 ? start(&me, 1, "0", host, &err) : start(mine, 2, "0,1", host, &err);
	if (x == NULL) {
		printf("FAIL shrink-fail role %d: %s\n", role, err.msg);
		return 1;
	}
	if (role == 0) {
		EXPECT(xport_nccl_ops.unique_id(x, id, &idlen, &err) == REFIT_OK, "unique id: %s",
		       err.msg);
		EXPECT(write(idfd, &idlen, sizeof(idlen)) == (ssize_t)sizeof(idlen) &&
		       write(idfd, id, idlen) == (ssize_t)idlen, "writing the id");
	} else {
		EXPECT(read(idfd, &idlen, sizeof(idlen)) == (ssize_t)sizeof(idlen) &&
		       idlen <= sizeof(id) && read(idfd, id, idlen) == (ssize_t)idlen,
		       "reading the id");
	}
	s = session(x, 1, world, 3, role == 0 ? &me : mine, role == 0 ? 1 : 2, id, idlen, &err);
	EXPECT(s != NULL, "shrink-fail role %d: the world of 3: %s", role, err.msg);
	if (s)
		xport_nccl_ops.close(s);
	if (role == 0 && !bad) {
		session_ms = 3000;
		refit_err_clear(&err);
		s = session(x, 2, world, 2, &me, 1, NULL, 0, &err);
		EXPECT(s == NULL && err.status == REFIT_ERR_TIMEOUT && strstr(err.msg, "shrink"),
		       "a shrink rank 1 never joins: %s", s ? "opened" : err.msg);
		if (s)
			xport_nccl_ops.close(s);
		EXPECT(write(donefd, &c, 1) == 1, "done");
	} else if (role == 1) {
		EXPECT(read(donefd, &c, 1) == 1, "waiting for rank 0");
	}
	xport_nccl_ops.stop(x);
	bad += emu_check(role == 0 ? "the rank whose shrink failed" : "ranks 1 and 2");
	return bad ? 1 : 0;
}

/* ---- 6. loopback ------------------------------------------------------------------ */

static int
loopback(xport_session_t *s, int32_t r)
{
	return group_two(s, r, r, emu ? 8ull << 20 : 256ull << 20, 10);
}

/* ---- the emulator's counters --------------------------------------------------------- */

typedef struct emu_counters {    /* tests/emu/emu.h, REFIT_EMU_MAX_DEVICES 16 */
	int devices;
	int64_t alloc_live[16], alloc_bytes_live[16];
	int64_t ipc_open, streams_live, comms_live, ids_unconsumed;
	int64_t pair_bytes[17][17];
	char sticky[256];
} emu_counters_t;

/* On the emulator: nothing left allocated, mapped or alive in this process. */
static int
emu_check(const char *who)
{
	const gpu_api_t *a = gpu_load(0, NULL, 0);
	int (*get)(emu_counters_t *);
	emu_counters_t c;
	void *h;
	int bad = 0;
	int64_t alloc = 0;

	if (!emu || a == NULL)
		return 0;
	h = dlopen(a->cuda_path, RTLD_NOW | RTLD_NOLOAD);
	*(void **)&get = h ? dlsym(h, "refitEmuGetCounters") : NULL;
	EXPECT(get != NULL, "%s: the emulator has no refitEmuGetCounters", who);
	if (get == NULL)
		return bad;
	memset(&c, 0, sizeof(c));
	EXPECT(get(&c) == 0, "refitEmuGetCounters");
	for (int d = 0; d < 16; d++)
		alloc += c.alloc_live[d];
	EXPECT(alloc == 0 && c.ipc_open == 0 && c.streams_live == 0 && c.comms_live == 0 &&
	       c.ids_unconsumed == 0 && c.sticky[0] == '\0', "%s: left behind: %" PRId64
	       " allocations, %" PRId64 " IPC mappings, %" PRId64 " streams, %" PRId64
	       " communicators, %" PRId64 " unique ids; sticky \"%s\"", who, alloc, c.ipc_open,
	       c.streams_live, c.comms_live, c.ids_unconsumed, c.sticky);
	dlclose(h);
	return bad;
}

/* ---- 7. libcudart.so.12 when there is no .so.13 ----------------------------------------- */

/*
 * The child plays a machine with CUDA 12 only: this program's dlopen (it
 * takes the place of libc's for gpu.c) refuses libcudart.so.13 by name and
 * in /usr/local/cuda/lib64 (this machine may have a real one there), and
 * CUDA_HOME is a directory whose lib64 holds only libcudart.so.12, a link
 * to the emulator's runtime.  Nothing is configured: the search must find
 * the .so.12 (issue 10, defect 10: it never fell back).
 */
static bool no_cudart13;

void *
dlopen(const char *file, int mode)
{
	static void *(*real)(const char *, int);

	if (real == NULL)
		*(void **)&real = dlsym(RTLD_NEXT, "dlopen");
	if (no_cudart13 && file != NULL && (strcmp(file, "libcudart.so.13") == 0 ||
	    strcmp(file, "/usr/local/cuda/lib64/libcudart.so.13") == 0))
		return NULL;
	return real(file, mode);
}

static int
so12_child(const char *cudart)
{
	char dir[] = "/tmp/refit-so12-XXXXXX", lib64[64], link[96], target[PATH_MAX], why[1024];
	const gpu_api_t *a;
	int bad = 0;

	if (mkdtemp(dir) == NULL || realpath(cudart, target) == NULL)
		return 1;
	snprintf(lib64, sizeof(lib64), "%s/lib64", dir);
	snprintf(link, sizeof(link), "%s/libcudart.so.12", lib64);
	if (mkdir(lib64, 0700) != 0 || symlink(target, link) != 0)
		return 1;
	setenv("CUDA_HOME", dir, 1);
	unsetenv("REFIT_CUDA_LIBRARY");
	no_cudart13 = true;
	a = gpu_load(1, why, sizeof(why));
	EXPECT(a != NULL, "no CUDA runtime: %s", why);
	if (a != NULL)
		EXPECT(strcmp(a->cuda_path, link) == 0, "the CUDA runtime loaded is %s, not %s",
		       a->cuda_path, link);
	unlink(link);
	rmdir(lib64);
	rmdir(dir);
	return bad ? 1 : 0;
}

/* ---- 14. a kernel library of another CUDA runtime (emulator) ------------------------- */

static int
two_runtimes_child(const char *cudart)
{
	char dir[] = "/tmp/refit-2rt-XXXXXX", copy[96], target[PATH_MAX], why[1024], cmd[600];
	const gpu_api_t *a;
	int bad = 0;

	if (mkdtemp(dir) == NULL || realpath(cudart, target) == NULL)
		return 1;
	snprintf(copy, sizeof(copy), "%s/libcudart.so.13", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", target, copy);
	if (system(cmd) != 0)
		return 1;
	setenv("REFIT_CUDA_LIBRARY", copy, 1);
	setenv("REFIT_GPU_KERNELS_LIBRARY", target, 1);
	a = gpu_load(1, why, sizeof(why));
	EXPECT(a == NULL && strstr(why, "another CUDA runtime") && strstr(why, copy),
	       "a kernel library bound to another runtime: %s", a ? "loaded" : why);
	unlink(copy);
	rmdir(dir);
	return bad ? 1 : 0;
}

/* ---- 10. a root holder that cannot get its pipes ------------------------------------- */

static int
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (d == NULL)
		return -1;
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n;
}

/* A descriptor limit that leaves exactly two free below it: the first pipe
 * of gpu_root_new gets them, the second fails; nothing may stay open. */
static int
root_pipe_failure(void)
{
	struct rlimit old, lim;
	gpu_root_t r;
	char why[256];
	int bad = 0, before, after, rc, fd, freefds = 0;

	if (getrlimit(RLIMIT_NOFILE, &old) != 0)
		return 1;
	for (fd = 0; fd < 4096 && freefds < 2; fd++)
		if (fcntl(fd, F_GETFD) < 0)
			freefds++;
	lim = old;
	lim.rlim_cur = (rlim_t)fd;
	before = open_fds();
	if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
		return 1;
	rc = gpu_root_new(&r, 10000, why, sizeof(why));
	after = open_fds();     /* the opendir fd fits again: the pipes' are back */
	if (setrlimit(RLIMIT_NOFILE, &old) != 0)
		bad++;
	after = after < 0 ? open_fds() : after;
	EXPECT(rc != 0 && strstr(why, "pipe"), "gpu_root_new with one free pipe: rc %d (%s)",
	       rc, why);
	if (rc == 0)
		gpu_root_release(&r);
	EXPECT(after == before, "%d descriptors open before, %d after the failed pipe", before,
	       after);
	return bad;
}

/* ---- main ------------------------------------------------------------------------------ */

static int
wait_child(pid_t pid, int timeout_s)
{
	int st = 0;

	for (int i = 0; i < timeout_s * 20; i++) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(50000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return 124;
}

/* Wait for a child that ran one case (bounded): the case's result. */
static void
child_result(pid_t pid, int timeout_s, const char *name)
{
	int bad = 0, rc = wait_child(pid, timeout_s);

	EXPECT(rc == 0, "the child exited %d", rc);
	result(name, bad);
}

int
main(int argc, char **argv)
{
	char why[1024];
	int ipc[2], idp[2][2], gop[2][2], donep[2], deadp[2];
	pid_t ipc_pid, rp[3], so12_pid = -1, dead_pid[2] = {-1, -1}, late_pid = -1;
	pid_t late2276_pid = -1, hang_abort_pid = -1;
	pid_t stuck_pid = -1, sf_pid[2] = {-1, -1}, rt2_pid = -1, order_pid;
	int sfid[2], sfdone[2];
	const char *cudart = getenv("REFIT_CUDA_LIBRARY");
	int32_t two[2] = {0, 1};
	const gpu_api_t *a;
	uint8_t id[512];
	size_t idlen = sizeof(id);
	xport_t *x = NULL;
	xport_session_t *s;
	refit_err_t err;
	int bad;

	if (argc == 2 && strcmp(argv[1], GPU_ROOT_HOLDER_ARG) == 0)
		return gpu_root_holder_main();
	emu = getenv("REFIT_GPU_TEST_EMU") != NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* children first, before CUDA starts in this process */
	if (pipe(ipc) < 0 || pipe(idp[0]) < 0 || pipe(idp[1]) < 0 || pipe(gop[0]) < 0 ||
	    pipe(gop[1]) < 0 || pipe(donep) < 0 || pipe(deadp) < 0)
		return 1;
	if ((ipc_pid = fork()) == 0) {
		close(ipc[1]);
		_exit(ipc_child(ipc[0]));
	}
	close(ipc[0]);
	if (emu && cudart != NULL && (so12_pid = fork()) == 0)
		_exit(so12_child(cudart));
	if (emu && cudart != NULL && (rt2_pid = fork()) == 0)
		_exit(two_runtimes_child(cudart));
	for (int k = 0; k < 3; k++)
		if ((rp[k] = fork()) == 0) {
			int rc = ring_child(k, k ? idp[k - 1][0] : -1, idp[0][1], idp[1][1],
					    k < 2 ? gop[k][0] : -1, donep[1]);
			_exit(rc);
		}
	/* 8, on the emulator only: real NCCL may hang or end a send to a dead
	 * peer without an error (its proxy sends what the kernel buffered) */
	if (emu && (dead_pid[1] = fork()) == 0) {
		close(deadp[1]);
		_exit(dead_peer_child(1, deadp[0], -1));
	}
	if (emu && dead_pid[1] > 0 && (dead_pid[0] = fork()) == 0)
		_exit(dead_peer_child(0, deadp[1], dead_pid[1]));
	close(deadp[0]);
	close(deadp[1]);
	if (emu && (late_pid = fork()) == 0)
		_exit(late_error_child());
	if (emu && (hang_abort_pid = fork()) == 0)
		_exit(hang_abort_child());
	/* the same on NCCL 2.27.6, whose refused destroy already leaves a group */
	if (emu && (late2276_pid = fork()) == 0) {
		setenv("REFIT_EMU_NCCL_VERSION", "22706", 1);
		_exit(late_error_child());
	}
	/* 11, 12 on a GPU too: the stand-ins are in the loaded table, and the
	 * real ncclCommAbort and cudaMallocHost run */
	if ((stuck_pid = fork()) == 0)
		_exit(stuck_child());
	if ((order_pid = fork()) == 0)
		_exit(order_child(emu));
	if (pipe(sfid) < 0 || pipe(sfdone) < 0)
		return 1;
	for (int k = 0; emu && k < 2; k++)
		if ((sf_pid[k] = fork()) == 0)
			_exit(shrink_fail_child(k, k ? sfid[0] : sfid[1],
						k ? sfdone[0] : sfdone[1]));
	close(sfid[0]);
	close(sfid[1]);
	close(sfdone[0]);
	close(sfdone[1]);
	a = gpu_load(1, why, sizeof(why));
	if (a == NULL) {
		printf("gpu: skipped: %s\n", why);
		close(ipc[1]);
		for (int k = 0; k < 3; k++) {
			kill(rp[k], SIGKILL);
			waitpid(rp[k], NULL, 0);
		}
		for (int k = 0; k < 2; k++)
			if (dead_pid[k] > 0) {
				kill(dead_pid[k], SIGKILL);
				waitpid(dead_pid[k], NULL, 0);
			}
		if (late2276_pid > 0) {
			kill(late2276_pid, SIGKILL);
			waitpid(late2276_pid, NULL, 0);
		}
		if (hang_abort_pid > 0) {
			kill(hang_abort_pid, SIGKILL);
			waitpid(hang_abort_pid, NULL, 0);
		}
		if (late_pid > 0) {
			kill(late_pid, SIGKILL);
			waitpid(late_pid, NULL, 0);
		}
		if (stuck_pid > 0) {
			kill(stuck_pid, SIGKILL);
			waitpid(stuck_pid, NULL, 0);
		}
		if (order_pid > 0) {
			kill(order_pid, SIGKILL);
			waitpid(order_pid, NULL, 0);
		}
		for (int k = 0; k < 2; k++)
			if (sf_pid[k] > 0) {
				kill(sf_pid[k], SIGKILL);
				waitpid(sf_pid[k], NULL, 0);
			}
		waitpid(ipc_pid, NULL, 0);
		if (so12_pid > 0)
			waitpid(so12_pid, NULL, 0);
		if (rt2_pid > 0)
			waitpid(rt2_pid, NULL, 0);
		return 77;
	}
	printf("     CUDA runtime %s, NCCL %d from %s, %d device(s), kernel %s\n", a->cuda_path,
	       a->nccl_version, a->nccl_path, a->ndevices,
	       a->copy_strided ? a->kernels_path : "none");

	/* 1, 2, 3, 6 in this process: rank 0 (and rank 1 where a second device is) */
	refit_err_clear(&err);
	x = start(two, a->ndevices >= 2 ? 2 : 1, a->ndevices >= 2 ? "0,1" : "0", "gpu-test",
		  &err);
	if (x == NULL || xport_nccl_ops.unique_id(x, id, &idlen, &err) != REFIT_OK) {
		printf("FAIL start: %s\n", err.msg);
		failed++;
	} else {
		size_t nl = a->ndevices >= 2 ? 2 : 1;

		s = session(x, 1, two, nl, two, nl, id, idlen, &err);
		if (s == NULL) {
			printf("FAIL open (%zu local communicators): %s\n", nl, err.msg);
			failed++;
		} else {
			result("box copies on the GPU equal the host copies (strided innermost "
			       "dims, size-1 and stride-0 dims, padded rows)", box_copies(s, two, nl));
			if (nl == 2)
				result("two local ranks on devices 0 and 1: staging on each rank's "
				       "device, grouped send/recv between them",
				       group_two(s, 0, 1, 1 << 20, 0) + group_two(s, 1, 0, 12345, 0));
			else
				printf("     skipped: two local ranks on two devices (one device)\n");
			result("a delta unit between two ranks: encoded by the kernels, its size "
			       "message, then its bytes, decoded in place byte-exact",
			       delta_two(s, 0, (int32_t)(nl - 1), 1 << 20));
			result("loopback communicator: send/recv to itself",
			       loopback(s, 0));
			/* last in the session: a failure here stays in its error */
			result("a box whose rows are 2^31 + 64 bytes apart (above CUDA's "
			       "largest 2D pitch) is copied row by row", big_pitch(s, 0));
			xport_nccl_ops.close(s);
		}
		/* same epoch, same id: the communicators are reused */
		result("a failed copy is reported at sync, and the next session is clean",
		       copy_error(x, two, nl, id, idlen));
		xport_nccl_ops.stop(x);
		result("a rank's staging within gpu_staging_budget_bytes: messages larger than "
		       "the budget refused at open, a plan needing more at once than the "
		       "budget refused at open, what does not fit at once fails naming it",
		       staging_budget());
	}

	/* 4. IPC: two allocations of 2 MiB, the first with a pattern, pieces of
	 * it read at offsets */
	{
		uint8_t *host = malloc(IPC_BYTES);
		void *p = NULL, *q = NULL;
		cudaIpcMemHandle_t h, hq;
		cudaError_t e;
		int rc;

		bad = 0;
		for (size_t i = 0; i < IPC_BYTES; i++)
			host[i] = (uint8_t)(i ^ 0x5a);
		e = a->cudaSetDevice(0);
		if (e == cudaSuccess)
			e = a->cudaMalloc(&p, IPC_BYTES);
		if (e == cudaSuccess)
			e = a->cudaMalloc(&q, IPC_BYTES);
		if (e == cudaSuccess)
			e = a->cudaMemcpy(p, host, IPC_BYTES, cudaMemcpyHostToDevice);
		if (e == cudaSuccess)
			e = a->cudaIpcGetMemHandle(&h, p);
		if (e == cudaSuccess)
			e = a->cudaIpcGetMemHandle(&hq, q);
		EXPECT(e == cudaSuccess, "IPC setup: %s", a->cudaGetErrorString(e));
		if (e == cudaSuccess && (write(ipc[1], &h, sizeof(h)) != (ssize_t)sizeof(h) ||
					 write(ipc[1], &hq, sizeof(hq)) != (ssize_t)sizeof(hq)))
			bad++;
		close(ipc[1]);
		rc = wait_child(ipc_pid, 120);
		EXPECT(rc == 0, "the IPC child exited %d", rc);
		if (p != NULL && (e = a->cudaFree(p)) != cudaSuccess)
			EXPECT(0, "cudaFree: %s", a->cudaGetErrorString(e));
		if (q != NULL && (e = a->cudaFree(q)) != cudaSuccess)
			EXPECT(0, "cudaFree: %s", a->cudaGetErrorString(e));
		free(host);
		result("CUDA IPC: another process opens the allocation on rank 0's device, reads "
		       "pieces at offsets inside it; wrong cuda_bytes or device refused, also a "
		       "claim ending inside the next mapping", bad);
	}

	/* 5. three processes */
	{
		int rc2, rc0, rc1;
		char c;

		bad = 0;
		rc2 = wait_child(rp[2], 180);
		EXPECT(rc2 == 0, "rank 2 exited %d", rc2);
		if (write(gop[0][1], "g", 1) != 1 || write(gop[1][1], "g", 1) != 1)
			bad++;
		/* ranks 0 and 1 each say done once their shrunk ring ran */
		for (int k = 0; k < 2; k++)
			if (read(donep[0], &c, 1) != 1)
				bad++;
		rc0 = wait_child(rp[0], 180);
		rc1 = wait_child(rp[1], 180);
		EXPECT(rc0 == 0 && rc1 == 0, "ranks 0 and 1 exited %d and %d", rc0, rc1);
		result("three processes, one rank each: a ring of sends; one leaves, the two "
		       "others shrink their communicators (no new id) and exchange again", bad);
	}
	if (so12_pid > 0) {
		int rc = wait_child(so12_pid, 60);

		bad = 0;
		EXPECT(rc == 0, "the child exited %d", rc);
		result("no libcudart.so.13 on the machine: the search loads libcudart.so.12 "
		       "($CUDA_HOME/lib64)", bad);
	}
	if (dead_pid[0] > 0) {
		int rc0 = wait_child(dead_pid[0], 180), rc1 = wait_child(dead_pid[1], 60);

		bad = 0;
		EXPECT(rc0 == 0, "the sender exited %d", rc0);
		EXPECT(rc1 == 128 + SIGKILL, "the peer exited %d, not killed by the sender", rc1);
		result("a peer killed mid-group: the sender's group fails naming the peer "
		       "(ncclCommGetAsyncError after its stream drained), not done", bad);
	} else if (dead_pid[1] > 0) {
		kill(dead_pid[1], SIGKILL);
		waitpid(dead_pid[1], NULL, 0);
	}
	if (late_pid > 0)
		child_result(late_pid, 60, "a destroy refused by an error that came after the "
			     "check: the communicator is aborted, the thread is not left inside "
			     "a group, the next epoch's communicators form");
	if (hang_abort_pid > 0)
		child_result(hang_abort_pid, 90, "an ncclCommAbort that never returns: the group "
			     "fails within 10 s of it, the node is poisoned naming it");
	if (late2276_pid > 0)
		child_result(late2276_pid, 60, "the same on NCCL 2.27.6, whose refused destroy "
			     "already leaves a group (v2.27.6 init.cc)");
	if (stuck_pid > 0)
		child_result(stuck_pid, 180, "a refused ncclGroupStart fails the group naming "
			     "it; a copy to the host that never ends: aborted by the deadline, "
			     "the node poisoned (next refit refused, memory kept), the caller's "
			     "buffer never written");
	if (order_pid > 0)
		child_result(order_pid, 90, "stream ordering: a client's write queued on its own "
			     "stream, an interprocess event recorded after it; the session given "
			     "the event reads the written bytes");
	if (rt2_pid > 0)
		child_result(rt2_pid, 60, "a kernel library bound to another CUDA runtime than "
			     "refitd's is refused at load, naming both");
	if (sf_pid[0] > 0 && sf_pid[1] > 0) {
		int rc0 = wait_child(sf_pid[0], 180), rc1 = wait_child(sf_pid[1], 60);

		bad = 0;
		EXPECT(rc0 == 0 && rc1 == 0, "the children exited %d and %d", rc0, rc1);
		result("a shrink that fails (a survivor never shrinks): parents aborted first, "
		       "the new communicators NCCL then publishes aborted, none left", bad);
	}
	result("a root holder whose second pipe fails (descriptor limit) leaves no "
	       "descriptor open", root_pipe_failure());
	bad = emu_check("the main process");
	if (emu)
		result("emulator counters: nothing left allocated, mapped or alive", bad);
	printf("gpu: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
#endif
