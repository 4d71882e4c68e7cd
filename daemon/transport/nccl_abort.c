/*
 * nccl_abort.c - the nccl transport's teardown: a communicator's state and
 * NCCL's last words on it, ncclCommAbort on a thread of its own bounded by
 * ABORT_MS (the node is poisoned past it), freeing one communicator or all
 * of them with their streams and staging arenas, and releasing the holders
 * of unique ids.  Calls only nccl_state.c (nccl_internal.h).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/transport/nccl_internal.h"

#ifdef REFIT_HAVE_NCCL


/* Free a rank's arena (its communicator is gone, its stream drained, so
 * nothing queued uses it: allocations still held are given up with it, a
 * later nccl_dev_free finds no arena): NCCL dropped the registration with the
 * communicator (ncclRegCleanup). */
static void
arena_free(xport_t *x, size_t li)
{
	arena_t *ar = &x->cm.arena[li];
	ncclResult_t r;

	if (ar->base == NULL)
		return;
	if (nccl_is_poisoned(x)) {  /* work that never ended may still write it */
		x->kept++;
		log_warnx("nccl: node %s: rank %d: its staging arena is kept (the node is "
			  "poisoned)", x->node_id, x->cm.local[li]);
	} else if ((r = x->api->ncclMemFree(ar->base)) != ncclSuccess) {
		log_warnx("nccl: node %s: ncclMemFree: %s", x->node_id,
			  x->api->ncclGetErrorString(r));
	}
	log_info("nccl: node %s: rank %d: GPU staging held at most %" PRIu64 " of its %" PRIu64
		 " bytes this epoch", x->node_id, x->cm.local[li], ar->a.peak, x->budget);
	gpu_arena_fini(&ar->a);
	memset(ar, 0, sizeof(*ar));
}

/* A communicator's state; ncclInProgress while its job runs. */
ncclResult_t
nccl_comm_state(const gpu_api_t *a, ncclComm_t c)
{
	ncclResult_t st = ncclSuccess, r = a->ncclCommGetAsyncError(c, &st);

	return r == ncclSuccess ? st : r;
}

/*
 * The library's own text for an error, as "; NCCL's last error: <text>", or
 * "" when it has none (or lacks ncclGetLastError): an internal error's code
 * alone says nothing, NCCL explains it there.  NCCL keeps one last message,
 * not one per communicator (the argument is unused), hence "last".
 */
const char *
nccl_says(const gpu_api_t *a, ncclComm_t c, char *buf, size_t n)
{
	const char *t = a->ncclGetLastError ? a->ncclGetLastError(c) : NULL;

	if (t == NULL || *t == '\0')
		return "";
	snprintf(buf, n, "; NCCL's last error: %s", t);
	return buf;
}

/*
 * Free one communicator (local rank rank): ncclCommDestroy when it is ready
 * and healthy, else ncclCommAbort, which works in any state.  The state can
 * change between the check and the destroy (an asynchronous error of the
 * proxy), so a refused destroy is followed by an abort.  NCCL 2.27.6 and
 * later also leave the calling thread inside a group when they refuse a
 * destroy (init.cc: ncclGroupStartInternal, then NCCLCHECK's early return
 * past ncclGroupEndInternal; 2.27.5 and before open none): that group is closed
 * here, or every later group of this thread would never be launched (its
 * ncclGroupEnd would only close the one left open) and its streams would
 * look drained.
 */
#define NCCL_DESTROY_GROUP 22706   /* the first NCCL whose refused destroy leaves a group */

/*
 * ncclCommAbort, bounded.  NCCL's abort tears down its proxy thread and
 * connections and waits for the communicator's kernels (init.cc
 * commReclaim -> commFree): a stuck device or a proxy blocked in the
 * network can hold it without end, and with it the pool thread and every
 * later refit.  It runs on a thread of its own on the caller's current
 * device; after ABORT_MS the caller goes on and the node is poisoned (the
 * communicator's work may still write its memory, so nothing of it is
 * freed; refits are refused until refitd restarts).  The abandoned thread
 * frees its job when the abort returns, if ever.
 */
#define ABORT_MS 10000

typedef struct abort_job {
	const gpu_api_t *a;
	ncclComm_t c;
	int dev;                  /* -1: none current */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done, abandoned;
	ncclResult_t r;
} abort_job_t;

static void
abort_job_free(abort_job_t *j)
{
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
}

static void *
abort_main(void *arg)
{
	abort_job_t *j = arg;
	ncclResult_t r;
	bool gone;

	if (j->dev >= 0)
		(void)j->a->cudaSetDevice(j->dev);
	r = j->a->ncclCommAbort(j->c);
	pthread_mutex_lock(&j->mu);
	j->r = r;
	j->done = true;
	gone = j->abandoned;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (gone)
		abort_job_free(j);
	return NULL;
}

ncclResult_t
nccl_abort_bounded(xport_t *x, ncclComm_t c, int32_t rank)
{
	abort_job_t *j = xcalloc(1, sizeof(*j));
	int64_t end = xport_now_ms() + ABORT_MS;
	pthread_attr_t at;
	pthread_t t;
	ncclResult_t r;

	j->a = x->api;
	j->c = c;
	if (x->api->cudaGetDevice(&j->dev) != cudaSuccess)
		j->dev = -1;
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &at, abort_main, j) != 0) {   /* no thread: unbounded */
		pthread_attr_destroy(&at);
		abort_job_free(j);
		return x->api->ncclCommAbort(c);
	}
	pthread_attr_destroy(&at);
	pthread_mutex_lock(&j->mu);
	while (!j->done && xport_now_ms() < end) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	if (!j->done) {
		j->abandoned = true;
		pthread_mutex_unlock(&j->mu);
		nccl_poison(x, rank, "ncclCommAbort did not return within 10 s (a stuck device or "
			    "proxy): its communicator and the memory its work may write are kept");
		return ncclInProgress;   /* said: the callers log nothing more */
	}
	r = j->r;
	pthread_mutex_unlock(&j->mu);
	abort_job_free(j);
	return r;
}

void
nccl_comm_free(xport_t *x, ncclComm_t c, int32_t rank, bool abort)
{
	const gpu_api_t *a = x->api;
	ncclResult_t r;

	if (!abort && nccl_comm_state(a, c) == ncclSuccess) {
		if ((r = a->ncclCommDestroy(c)) == ncclSuccess)
			return;
		log_warnx("nccl: node %s: ncclCommDestroy (rank %d): %s; aborting it", x->node_id,
			  rank, a->ncclGetErrorString(r));
		if (a->nccl_version >= NCCL_DESTROY_GROUP && (r = a->ncclGroupEnd()) != ncclSuccess &&
		    r != ncclInProgress)
			log_warnx("nccl: node %s: ncclGroupEnd after the refused ncclCommDestroy "
				  "(rank %d): %s", x->node_id, rank, a->ncclGetErrorString(r));
	}
	if ((r = nccl_abort_bounded(x, c, rank)) != ncclSuccess && r != ncclInProgress)
		log_warnx("nccl: node %s: ncclCommAbort (rank %d): %s", x->node_id, rank,
			  a->ncclGetErrorString(r));
}

/* Free the communicators and their streams: abort (they may be
 * mid-operation, or even in progress) or destroy.  Owner only. */
void
nccl_drop_comms(xport_t *x, bool abort)
{
	const gpu_api_t *a = x->api;
	comms_t *cm = &x->cm;

	for (size_t i = 0; i < cm->nlocal && cm->comm; i++) {
		int64_t drain_ms;
		cudaError_t e;

		if (cm->dev && (e = a->cudaSetDevice(cm->dev[i])) != cudaSuccess)
			log_warnx("nccl: node %s: cudaSetDevice(%d): %s", x->node_id, cm->dev[i],
				  a->cudaGetErrorString(e));
		/* a communicator in progress or with an error cannot be destroyed
		 * (NCCL refuses): it is aborted */
		if (cm->comm[i] != NULL)
			nccl_comm_free(x, cm->comm[i], cm->local[i], abort);
		/* what the stream still holds (operations of an aborted communicator
		 * end at once) finishes before its buffers can be freed; a stream
		 * that does not poisons the node: its buffers are kept.  A node
		 * already poisoned (an abort that never returned) keeps them
		 * anyway: no wait, teardown stays bounded by the abort's 10 s */
		drain_ms = nccl_is_poisoned(x) ? 0 : DRAIN_MS;
		if (cm->stream && cm->stream[i] && !nccl_drained(a, cm->stream[i], drain_ms) &&
		    drain_ms > 0)
			nccl_poison(x, cm->local[i], "its stream did not drain within 10 s of its "
				    "communicator's end");
		if (cm->stream && cm->stream[i] &&
		    (e = a->cudaStreamDestroy(cm->stream[i])) != cudaSuccess)
			log_warnx("nccl: node %s: cudaStreamDestroy (rank %d): %s", x->node_id,
				  cm->local[i], a->cudaGetErrorString(e));
		if (cm->arena)
			arena_free(x, i);
	}
	free(cm->arena);
	free(cm->comm);
	free(cm->stream);
	free(cm->dev);
	free(cm->ranks);
	free(cm->local);
	memset(cm, 0, sizeof(*cm));
}

/*
 * End the holders of ids other than keep (NULL: all): their roots are
 * consumed (communicators formed from them) or abandoned (an epoch that
 * failed or passed).  Never under x->mu (reaping is bounded, not instant).
 */
void
nccl_release_roots(xport_t *x, const ncclUniqueId *keep)
{
	VEC(gpu_root_t) gone = {0};

	pthread_mutex_lock(&x->mu);
	for (size_t i = 0; i < x->roots.n;) {
		if (keep && memcmp(x->roots.v[i].id, keep, sizeof(*keep)) == 0) {
			i++;
			continue;
		}
		VEC_PUSH(&gone, x->roots.v[i]);
		x->roots.v[i] = x->roots.v[--x->roots.n];
	}
	pthread_mutex_unlock(&x->mu);
	for (size_t i = 0; i < gone.n; i++)
		gpu_root_release(&gone.v[i]);
	VEC_FREE(&gone);
}

#endif
