/*
 * gpu_test.c - tests of the nccl transport on one GPU (tests/gpu/run.sh).
 *
 *   1. pack/unpack: random strided boxes copied by the transport's device
 *      operations (cudaMemcpy2DAsync), checked byte by byte against the
 *      host copy (dp_copy_box) of the same data;
 *   2. CUDA IPC between two processes: a child opens the parent's
 *      allocation through the transport (mem_open) and reads it back;
 *   3. a loopback communicator (world of one rank): grouped send/recv to
 *      itself, checked byte by byte, and a bandwidth figure.
 *
 * Exit 0: passed; 77: skipped (no headers, no libraries or no GPU: the
 * reason is printed); 1: failed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/transport/gpu.h"
#include "daemon/transport/transport.h"
#include "dataplane/view.h"

#ifndef REFIT_HAVE_NCCL
int
main(void)
{
	printf("gpu: skipped: built without the CUDA and NCCL headers\n");
	return 77;
}
#else

static int failures;

#define EXPECT(cond, ...)                                                          \
	do {                                                                       \
		if (!(cond)) {                                                     \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                \
			printf(__VA_ARGS__);                                       \
			printf("\n");                                              \
			failures++;                                                \
		}                                                                  \
	} while (0)

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static atomic_int no_abort;

static xport_session_t *
open_loopback(xport_t **xp)
{
	const xport_ops_t *o = &xport_nccl_ops;
	int32_t r0c = 0;
	xport_cfg_t xc = {"", "gpu-test", &r0c, 1, NULL};
	uint8_t id[256];
	size_t len = sizeof(id);
	int32_t r0 = 0;
	xport_world_t w = {1, &r0, 1, &r0, 1, id, 0};
	xport_peer_t self = {"gpu-test", "nccl", true, true};
	xport_session_cfg_t sc = {1, 1, &self, 1, 1 << 30, 0, &no_abort};
	xport_session_t *s = NULL;
	refit_err_t err;

	refit_err_clear(&err);
	if (o->start(&xc, xp, &err) != REFIT_OK || o->unique_id(*xp, id, &len, &err) != REFIT_OK) {
		printf("FAIL start: %s\n", err.msg);
		failures++;
		return NULL;
	}
	w.id_len = len;
	o->set_world(*xp, &w);
	sc.deadline_ms = xport_now_ms() + 60000;
	if (o->open(*xp, &sc, &s, &err) != REFIT_OK) {
		printf("FAIL open (loopback communicator): %s\n", err.msg);
		failures++;
		return NULL;
	}
	return s;
}

/* 1. random boxes: device copy == host copy */
static void
test_pack(const dp_dev_ops_t *dev)
{
	unsigned seed = 12345;

	for (int iter = 0; iter < 300; iter++) {
		int nd = 1 + rand_r(&seed) % 4;
		int64_t shape[PLAN_MAX_DIMS], pad = rand_r(&seed) % 3;
		uint32_t elem = 1u << (rand_r(&seed) % 4);
		dp_view_t hs, hd, ds, dd;
		plan_shard_t sh = {0};
		plan_box_t box;
		uint64_t n;
		uint8_t *src, *dst, *ref, *gs, *gd;

		for (int d = 0; d < nd; d++)
			shape[d] = 1 + rand_r(&seed) % 9;
		/* strided source: rows padded */
		dp_view_contiguous(&hs, NULL, nd, shape, elem);
		if (pad) {
			int64_t st = 1;

			for (int d = nd - 1; d >= 0; d--) {
				hs.stride[d] = st;
				st *= shape[d] + (d == nd - 1 ? pad : 0);
			}
		}
		n = (uint64_t)(hs.stride[0] * shape[0] + pad) * elem;
		dp_view_contiguous(&hd, NULL, nd, shape, elem);
		sh.box.off[0] = 0;
		for (int d = 0; d < nd; d++) {
			sh.box.size[d] = shape[d];
			box.off[d] = rand_r(&seed) % shape[d];
			box.size[d] = 1 + rand_r(&seed) % (shape[d] - box.off[d]);
		}
		src = malloc(n);
		dst = malloc(n);
		ref = malloc(n);
		for (uint64_t i = 0; i < n; i++)
			src[i] = (uint8_t)rand_r(&seed);
		memset(dst, 0xee, n);
		memset(ref, 0xee, n);
		gs = dev->alloc(dev->ctx, 0, n);
		gd = dev->alloc(dev->ctx, 0, n);
		dev->from_host(dev->ctx, 0, gs, src, n);
		dev->from_host(dev->ctx, 0, gd, dst, n);
		hs.base = src;
		hd.base = ref;
		dp_copy_box(&hs, &sh, &hd, &sh, &box);
		ds = hs;
		dd = hd;
		ds.base = gs;
		dd.base = gd;
		dev->copy_box(dev->ctx, 0, &ds, &sh, &dd, &sh, &box);
		dev->to_host(dev->ctx, 0, dst, gd, n);
		EXPECT(memcmp(dst, ref, n) == 0, "box copy %d (nd %d, elem %u, pad %" PRId64
		       ") differs", iter, nd, elem, pad);
		dev->free(dev->ctx, 0, gs);
		dev->free(dev->ctx, 0, gd);
		free(src);
		free(dst);
		free(ref);
	}
	printf("ok   pack/unpack: 300 random strided boxes on the GPU equal the host copy\n");
}

/* 3. loopback group: send to ourselves, check, then bandwidth */
static void
test_loopback(xport_session_t *s)
{
	const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
	uint64_t n = 256ull << 20;
	uint8_t *a = dev->alloc(dev->ctx, 0, n), *b = dev->alloc(dev->ctx, 0, n);
	uint8_t *h = malloc(n), *g = malloc(n);
	refit_err_t err;
	double t0, t;
	int reps = 10;

	for (uint64_t i = 0; i < n; i++)
		h[i] = (uint8_t)(i * 131 + 7);
	dev->from_host(dev->ctx, 0, a, h, n);
	xport_op_t ops[2] = {{true, 0, 0, a, n}, {false, 0, 0, b, n}};

	refit_err_clear(&err);
	EXPECT(xport_nccl_ops.group(s, ops, 2, &err) == REFIT_OK, "group: %s", err.msg);
	dev->to_host(dev->ctx, 0, g, b, n);
	EXPECT(memcmp(g, h, n) == 0, "loopback send/recv changed the bytes");
	t0 = now_s();
	for (int i = 0; i < reps; i++)
		if (xport_nccl_ops.group(s, ops, 2, &err) != REFIT_OK)
			break;
	t = now_s() - t0;
	printf("ok   loopback communicator: 256 MiB send/recv to itself byte-exact; "
	       "%.1f GB/s over %d reps\n", n * reps / t / 1e9, reps);
	dev->free(dev->ctx, 0, a);
	dev->free(dev->ctx, 0, b);
	free(h);
	free(g);
}

/* 2. CUDA IPC: the child (forked before CUDA starts) opens our allocation */
static int
child_ipc(int rfd)
{
	const xport_ops_t *o = &xport_nccl_ops;
	uint8_t handle[64];
	xport_t *x = NULL;
	int32_t r0c = 0;
	xport_cfg_t xc = {"", "gpu-test-child", &r0c, 1, NULL};
	refit_err_t err;
	void *base = NULL;
	uint8_t buf[4096];

	if (read(rfd, handle, sizeof(handle)) != (ssize_t)sizeof(handle))
		return 2;
	refit_err_clear(&err);
	if (o->start(&xc, &x, &err) != REFIT_OK ||
	    o->mem_open(x, 0, handle, sizeof(handle), 0, 4096, &base, &err) != REFIT_OK) {
		printf("FAIL child: %s\n", err.msg);
		return 1;
	}
	{
		char why[256];
		const gpu_api_t *a = gpu_load(1, why, sizeof(why));

		a->cudaMemcpy(buf, base, sizeof(buf), cudaMemcpyDefault);
	}
	for (size_t i = 0; i < sizeof(buf); i++)
		if (buf[i] != (uint8_t)(i ^ 0x5a))
			return 1;
	o->mem_close(x, base);
	o->stop(x);
	return 0;
}

int
main(void)
{
	char why[512];
	int pfd[2], st = 0;
	pid_t pid;
	xport_t *x = NULL;
	xport_session_t *s;

	if (pipe(pfd) < 0)
		return 1;
	pid = fork();
	if (pid == 0) {
		close(pfd[1]);
		_exit(child_ipc(pfd[0]));
	}
	close(pfd[0]);
	const gpu_api_t *a = gpu_load(1, why, sizeof(why));

	if (a == NULL) {
		printf("gpu: skipped: %s\n", why);
		close(pfd[1]);
		waitpid(pid, &st, 0);
		return 77;
	}
	s = open_loopback(&x);
	if (s != NULL) {
		const dp_dev_ops_t *dev = xport_nccl_ops.dev(s);
		uint8_t host[4096];
		cudaIpcMemHandle_t h;
		void *p = NULL;

		test_pack(dev);
		test_loopback(s);
		a->cudaSetDevice(0);
		a->cudaMalloc(&p, sizeof(host));
		for (size_t i = 0; i < sizeof(host); i++)
			host[i] = (uint8_t)(i ^ 0x5a);
		a->cudaMemcpy(p, host, sizeof(host), cudaMemcpyDefault);
		a->cudaIpcGetMemHandle(&h, p);
		if (write(pfd[1], &h, sizeof(h)) != (ssize_t)sizeof(h))
			failures++;
		waitpid(pid, &st, 0);
		EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "CUDA IPC child exit %d", st);
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			printf("ok   CUDA IPC: another process opened the allocation through "
			       "the transport and read it back\n");
		a->cudaFree(p);
		xport_nccl_ops.close(s);
	} else {
		close(pfd[1]);
		waitpid(pid, &st, 0);
	}
	if (x)
		xport_nccl_ops.stop(x);
	printf("gpu: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
	return failures ? 1 : 0;
}
#endif
