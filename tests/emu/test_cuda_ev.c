/*
 * test_cuda_ev.c - the emulator's rule tests for events across streams and
 * processes: cudaStreamWaitEvent, interprocess events
 * (cudaIpcGetEventHandle / cudaIpcOpenEventHandle) and a writer whose
 * queued work lands late (REFIT_EMU_HOLD_STREAMS).
 */
#include "tests/emu/test_emu.h"

static int to_imp[2], to_exp[2];
static char go_path[256];

/* The writer: 0x11 in its memory synchronously, then 0x22 queued on a held
 * stream and an interprocess event recorded after it; both handles to the
 * reader, which releases the hold. */
static void
ev_writer(int arg)
{
	cudaIpcMemHandle_t mh;
	cudaIpcEventHandle_t eh;
	cudaEvent_t ev;
	cudaStream_t s;
	uint8_t *d;
	char k;

	(void)arg;
	setenv("REFIT_EMU_HOLD_STREAMS", go_path, 1);
	CU(cudaMalloc((void **)&d, 4096));
	CU(cudaMemset(d, 0x11, 4096));          /* the NULL stream is not held */
	s = stream_nb();
	CU(cudaMemsetAsync(d, 0x22, 4096, s));
	CU(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
	CU(cudaEventRecord(ev, s));
	CUIS(cudaEventQuery(ev), cudaErrorNotReady);
	CU(cudaIpcGetMemHandle(&mh, d));
	CU(cudaIpcGetEventHandle(&eh, ev));
	put(to_imp[1], &mh, sizeof(mh));
	put(to_imp[1], &eh, sizeof(eh));
	get(to_exp[0], &k, 1);
	CU(cudaEventSynchronize(ev));
	CU(cudaEventDestroy(ev));
	CU(cudaStreamDestroy(s));
	CU(cudaFree(d));
}

/*
 * A reader that waits on the writer's event (cudaStreamWaitEvent) sees the
 * writer's queued bytes; one that does not reads the old ones while the
 * writer's work is still queued -- what refitd would copy without the wait.
 */
static void
t_ipc_event_orders_processes(void)
{
	cudaIpcMemHandle_t mh;
	cudaIpcEventHandle_t eh;
	cudaEvent_t ev;
	cudaStream_t s, plain;
	uint8_t *p, got[4096], stale[4096];
	pid_t pid;
	int fd;

	CK(pipe(to_imp) == 0 && pipe(to_exp) == 0, "pipe");
	snprintf(go_path, sizeof(go_path), "%s/go", tdir);
	pid = spawn(ev_writer, 0, NULL);
	get(to_imp[0], &mh, sizeof(mh));
	get(to_imp[0], &eh, sizeof(eh));
	CU(cudaIpcOpenMemHandle((void **)&p, mh, 0));
	CU(cudaIpcOpenEventHandle(&ev, eh));
	CUIS(cudaEventQuery(ev), cudaErrorNotReady);
	plain = stream_nb();
	CU(cudaMemcpyAsync(stale, p, sizeof(stale), cudaMemcpyDeviceToHost, plain));
	CU(cudaStreamSynchronize(plain));
	CK(stale[0] == 0x11 && stale[4095] == 0x11, "without a wait: byte 0 is 0x%02x, want "
	   "the old 0x11 (the writer's work is held)", stale[0]);
	s = stream_nb();
	CU(cudaStreamWaitEvent(s, ev, 0));
	CU(cudaMemcpyAsync(got, p, sizeof(got), cudaMemcpyDeviceToHost, s));
	for (int i = 0; i < 50; i++) {  /* the wait holds the copy back */
		CUIS(cudaStreamQuery(s), cudaErrorNotReady);
		usleep(1000);
	}
	CK((fd = open(go_path, O_CREAT | O_WRONLY, 0600)) >= 0, "%s", go_path);
	close(fd);
	CU(cudaStreamSynchronize(s));
	CK(got[0] == 0x22 && got[4095] == 0x22, "after the wait: byte 0 is 0x%02x, want 0x22",
	   got[0]);
	CU(cudaEventQuery(ev));
	CU(cudaEventDestroy(ev));
	CU(cudaIpcCloseMemHandle(p));
	CU(cudaStreamDestroy(s));
	CU(cudaStreamDestroy(plain));
	put(to_exp[1], "k", 1);
	reap_ok(pid);
}

static void
ev_opener(int arg)
{
	cudaIpcEventHandle_t eh;
	cudaEvent_t ev;

	(void)arg;
	get(to_imp[0], &eh, sizeof(eh));
	CUIS(cudaIpcOpenEventHandle(&ev, eh), cudaErrorMapBufferObjectFailed);
}

/*
 * The rules: an interprocess event needs cudaEventDisableTiming; only such
 * events export; one's own handle and garbage are refused; a destroyed
 * exporter's handle no longer opens; a wait on a local event of another
 * stream orders the streams; a wait on an event never recorded is a no-op.
 */
static void
t_ipc_event_rules(void)
{
	cudaEvent_t ev, plain, mine;
	cudaIpcEventHandle_t eh, junk;
	cudaStream_t a, b;
	uint8_t *d, got[64];
	pid_t pid;

	CK(pipe(to_imp) == 0, "pipe");
	pid = spawn(ev_opener, 0, NULL);
	CUIS(cudaEventCreateWithFlags(&ev, cudaEventInterprocess), cudaErrorInvalidValue);
	CU(cudaEventCreate(&plain));
	CUIS(cudaIpcGetEventHandle(&eh, plain), cudaErrorInvalidResourceHandle);
	CU(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
	CU(cudaIpcGetEventHandle(&eh, ev));
	CUIS(cudaIpcOpenEventHandle(&mine, eh), cudaErrorDeviceUninitialized);
	memset(&junk, 7, sizeof(junk));
	CUIS(cudaIpcOpenEventHandle(&mine, junk), cudaErrorInvalidValue);
	CU(cudaEventDestroy(ev));
	put(to_imp[1], &eh, sizeof(eh));
	reap_ok(pid);
	a = stream_nb();
	b = stream_nb();
	CU(cudaMalloc((void **)&d, 64));
	CU(cudaMemset(d, 0, 64));
	CU(cudaStreamWaitEvent(b, plain, 0));  /* never recorded: nothing to wait for */
	CU(cudaStreamSynchronize(b));
	CU(cudaMemsetAsync(d, 0x33, 64, a));
	CU(cudaEventRecord(plain, a));
	CU(cudaStreamWaitEvent(b, plain, 0));
	CU(cudaMemcpyAsync(got, d, 64, cudaMemcpyDeviceToHost, b));
	CU(cudaStreamSynchronize(b));
	CK(got[63] == 0x33, "stream b read 0x%02x before stream a's memset", got[63]);
	CUIS(cudaStreamWaitEvent(b, plain, 1), cudaErrorInvalidValue);
	CU(cudaEventDestroy(plain));
	CU(cudaFree(d));
	CU(cudaStreamDestroy(a));
	CU(cudaStreamDestroy(b));
}

const test_t ev_tests[] = {
	TEST(ipc_event_orders_processes), TEST(ipc_event_rules),
};
const size_t nev_tests = sizeof(ev_tests) / sizeof(ev_tests[0]);
