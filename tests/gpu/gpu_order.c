/*
 * gpu_order.c - gpu-test's stream ordering case (docs/gpu.md, "Stream
 * ordering"): a writer process fills its allocation with 0x11, queues 0x22
 * on a stream of its own, records an interprocess event after it and gives
 * both handles away; the transport's session, given the event
 * (xport_session_cfg_t.events), copies the memory out.  It must read 0x22.
 * On the emulator the writer's stream is held (REFIT_EMU_HOLD_STREAMS)
 * until the reader's copy was queued and had time to run, so a session that
 * does not wait reads 0x11; on a GPU the writer's work is quick and the
 * case checks the calls (open, wait) work.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/transport/gpu.h"
#include "daemon/transport/transport.h"
#include "tests/gpu/gpu_order.h"
#include "tests/gpu/gpu_test.h"

#ifdef REFIT_HAVE_NCCL

#define ORDER_BYTES (2u << 20)

static int bad;

static void
go_path(char *buf, size_t n)
{
	const char *d = getenv("REFIT_EMU_DIR");

	snprintf(buf, n, "%s/gpu-order-go", d ? d : "/tmp");
}

/* The writer: what gpu_api_t lacks comes from the same runtime by dlsym. */
static int
writer(int out, int in)
{
	char why[512], go[256];
	const gpu_api_t *a;
	void *rt, *p = NULL;
	cudaStream_t st;
	cudaEvent_t ev;
	cudaIpcMemHandle_t mh;
	cudaIpcEventHandle_t eh;
	__typeof__(cudaMemsetAsync) *memset_async;
	__typeof__(cudaEventCreateWithFlags) *ev_create;
	__typeof__(cudaEventRecord) *ev_record;
	__typeof__(cudaIpcGetEventHandle) *ev_handle;
	cudaError_t e;
	char k;

	go_path(go, sizeof(go));
	setenv("REFIT_EMU_HOLD_STREAMS", go, 1);   /* read by the emulator only */
	if ((a = gpu_load(1, why, sizeof(why))) == NULL || (rt = dlopen(a->cuda_path,
								       RTLD_NOW)) == NULL)
		return 77;
	memset_async = (__typeof__(memset_async))dlsym(rt, "cudaMemsetAsync");
	ev_create = (__typeof__(ev_create))dlsym(rt, "cudaEventCreateWithFlags");
	ev_record = (__typeof__(ev_record))dlsym(rt, "cudaEventRecord");
	ev_handle = (__typeof__(ev_handle))dlsym(rt, "cudaIpcGetEventHandle");
	if (!memset_async || !ev_create || !ev_record || !ev_handle)
		return 77;
	e = a->cudaSetDevice(0);
	if (e == cudaSuccess)
		e = a->cudaMalloc(&p, ORDER_BYTES);
	if (e == cudaSuccess)
		e = a->cudaMemset(p, 0x11, ORDER_BYTES);
	if (e == cudaSuccess)
		e = a->cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = memset_async(p, 0x22, ORDER_BYTES, st);   /* the step's write, queued */
	if (e == cudaSuccess)
		e = ev_create(&ev, cudaEventInterprocess | cudaEventDisableTiming);
	if (e == cudaSuccess)
		e = ev_record(ev, st);
	if (e == cudaSuccess)
		e = a->cudaIpcGetMemHandle(&mh, p);
	if (e == cudaSuccess)
		e = ev_handle(&eh, ev);
	if (e != cudaSuccess) {
		printf("FAIL order writer: %s\n", a->cudaGetErrorString(e));
		return 1;
	}
	if (write(out, &mh, sizeof(mh)) != (ssize_t)sizeof(mh) ||
	    write(out, &eh, sizeof(eh)) != (ssize_t)sizeof(eh) || read(in, &k, 1) != 1)
		return 1;
	a->cudaStreamSynchronize(st);
	a->cudaStreamDestroy(st);
	a->cudaFree(p);
	return 0;
}

/* The reader: a session given the event copies the memory to the host. */
static void
reader(const gpu_api_t *a, int in, bool emu)
{
	const xport_ops_t *o = &xport_nccl_ops;
	int32_t me = 0;
	atomic_int stop = 0;
	xport_cfg_t xc = {"", "gpu-test-order", &me, 1, "0", 64u << 20, NULL, NULL, NULL,
			  false, NULL, NULL};
	xport_peer_t self = {"gpu-test-order", "nccl", true, true, 1 << 20};
	xport_event_t ev = {.client = 7};
	xport_session_cfg_t sc = {.refit_id = 1, .epoch = 1, .peers = &self, .npeers = 1,
				  .max_msg_bytes = 1 << 20, .abort = &stop, .events = &ev,
				  .nevents = 1};
	uint8_t mh[64], *host = malloc(ORDER_BYTES);
	xport_t *x = NULL;
	xport_session_t *s = NULL;
	const dp_dev_ops_t *dev;
	void *base = NULL, *stage;
	refit_err_t err;
	char go[256];
	int fd;

	refit_err_clear(&err);
	EXPECT(read(in, mh, sizeof(mh)) == (ssize_t)sizeof(mh) &&
		read(in, ev.handle, sizeof(ev.handle)) == (ssize_t)sizeof(ev.handle),
		"no handles from the writer");
	EXPECT(o->start(&xc, &x, &err) == REFIT_OK, "start: %s", err.msg);
	if (bad || alone_world(x, &err) != REFIT_OK ||   /* the harness's (gpu_test.h) */
	    o->mem_open(x, 0, mh, sizeof(mh), 0, NULL, ORDER_BYTES, &base, &err) != REFIT_OK) {
		EXPECT(0, "setup: %s", err.msg);
		goto out;
	}
	sc.deadline_ms = xport_now_ms() + 60000;
	if (o->open(x, &sc, &s, &err) != REFIT_OK) {
		EXPECT(0, "open with the writer's event: %s", err.msg);
		goto out;
	}
	dev = o->dev(s);
	stage = dev->alloc(dev->ctx, 0, ORDER_BYTES);
	EXPECT(stage != NULL, "staging");
	if (stage) {
		dev->copy(dev->ctx, 0, stage, base, ORDER_BYTES);
		if (emu) {   /* time for a copy that does not wait to run, then release */
			usleep(50000);
			go_path(go, sizeof(go));
			if ((fd = open(go, O_CREAT | O_WRONLY, 0600)) >= 0)
				close(fd);
		}
		dev->to_host(dev->ctx, 0, host, stage, ORDER_BYTES);
		EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
		EXPECT(host[0] == 0x22 && host[ORDER_BYTES - 1] == 0x22, "the session read "
			"0x%02x, not the writer's 0x22: it did not wait for the writer's event",
			host[0]);
		dev->free(dev->ctx, 0, stage);
		EXPECT(dev->sync(dev->ctx, &err) == REFIT_OK, "sync: %s", err.msg);
	}
	o->close(s);
out:
	if (base)
		o->mem_close(x, base);
	if (x)
		o->stop(x);
	free(host);
	(void)a;
}

int
order_child(bool emu)
{
	int tr[2], tw[2], st = 0;
	char why[512];
	const gpu_api_t *a;
	pid_t pid;

	if (pipe(tr) < 0 || pipe(tw) < 0)
		return 1;
	if ((pid = fork()) == 0) {
		close(tr[0]);
		close(tw[1]);
		_exit(writer(tr[1], tw[0]));
	}
	close(tr[1]);
	close(tw[0]);
	if ((a = gpu_load(1, why, sizeof(why))) == NULL) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return 77;
	}
	reader(a, tr[0], emu);
	if (write(tw[1], "d", 1) != 1)
		bad++;
	waitpid(pid, &st, 0);
	EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer exited 0x%x", st);
	return bad ? 1 : 0;
}

#else

int
order_child(bool emu)
{
	(void)emu;
	return 77;
}

#endif
