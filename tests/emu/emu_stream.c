/*
 * emu_stream.c - emulated streams, events, copies and the strided-copy
 * kernel.
 *
 * A stream is a queue and a worker thread: operations run later, in order,
 * after a randomized delay whenever the worker wakes from idle
 * (REFIT_EMU_DELAY_US), so a program that reads a destination without
 * synchronising sees stale bytes and cudaStreamQuery answers
 * cudaErrorNotReady meanwhile.  Arguments are checked when an operation is
 * queued (errors returned by the call, not sticky); memory is checked when
 * it runs, as a GPU does: a device range outside one allocation, or memory
 * of another device than the stream's, kills the context (sticky
 * cudaErrorIllegalAddress).  Once the context is dead, queued operations do
 * nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/emu/emu_internal.h"

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u

struct CUstream_st {
	uint32_t magic;
	int dev;
	unsigned flags;
	int refs;                 /* registry, worker, waiters; reg_mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	emu_op_t *head, *tail;
	uint64_t queued, done;
	bool stop, idle;
	bool destroyed;           /* the handle is dead; queued work still runs */
	struct CUstream_st *next; /* registry, until the worker ends */
};

struct CUevent_st {
	uint32_t magic;
	struct CUstream_st *s;    /* referenced; NULL until recorded */
	uint64_t target;
	emu_ipcev_t *ipc;         /* interprocess (exported or imported): its record */
	struct CUevent_st *next;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *streams;              /* created ones and defaults */
static struct CUstream_st *defaults[REFIT_EMU_MAX_DEVICES];
static struct CUevent_st *events;

static void
stream_unref(struct CUstream_st *s)
{
	bool last;

	pthread_mutex_lock(&reg_mu);
	last = --s->refs == 0;
	pthread_mutex_unlock(&reg_mu);
	if (!last)
		return;
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	s->magic = 0;
	free(s);
}

static void *
worker(void *arg)
{
	struct CUstream_st *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		emu_op_t *op;
		bool woke;

		while (s->head == NULL && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->head == NULL)
			break;
		op = s->head;
		woke = s->idle;
		s->idle = false;
		pthread_mutex_unlock(&s->mu);
		if (woke)
			emu_delay();
		if (defaults[s->dev] != s)
			emu_hold_streams();
		if (emu_sticky() == cudaSuccess)
			op->run(op, s);
		pthread_mutex_lock(&s->mu);
		s->head = op->next;
		if (s->head == NULL) {
			s->tail = NULL;
			s->idle = true;
		}
		s->done++;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		op->fini(op);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&reg_mu); /* out of the registry: its reference */
	for (struct CUstream_st **pp = &streams; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	s->refs--;
	pthread_mutex_unlock(&reg_mu);
	stream_unref(s);
	return NULL;
}

/* A new stream of dev with its worker, in the registry; NULL if no thread. */
static struct CUstream_st *
stream_new(int dev, unsigned flags)
{
	struct CUstream_st *s = calloc(1, sizeof(*s));
	pthread_attr_t at;
	pthread_t th;

	if (s == NULL)
		return NULL;
	*s = (struct CUstream_st){.magic = STREAM_MAGIC, .dev = dev, .flags = flags,
				  .refs = 2, .idle = true};
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 << 10);
	if (pthread_create(&th, &at, worker, s) != 0) {
		pthread_attr_destroy(&at);
		free(s);
		return NULL;
	}
	pthread_attr_destroy(&at);
	s->next = streams; /* reg_mu held by the callers */
	streams = s;
	return s;
}

cudaError_t
emu_stream_get(cudaStream_t h, struct CUstream_st **out)
{
	struct CUstream_st *s;
	int dev = emu_cur_dev();

	pthread_mutex_lock(&reg_mu);
	if (h == NULL) {
		if (defaults[dev] == NULL)
			defaults[dev] = stream_new(dev, 0);
		s = defaults[dev];
	} else {
		for (s = streams; s && (s != h || s->destroyed); s = s->next)
			;
	}
	pthread_mutex_unlock(&reg_mu);
	if (s == NULL)
		return emu_fail(h ? cudaErrorInvalidResourceHandle : cudaErrorMemoryAllocation,
				"stream %p is not a live stream", (void *)h);
	*out = s;
	return cudaSuccess;
}

int
emu_stream_dev(const struct CUstream_st *s)
{
	return s->dev;
}

static void
stream_wait(struct CUstream_st *s, uint64_t target)
{
	pthread_mutex_lock(&s->mu);
	while (s->done < target)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

/*
 * The legacy default (NULL) stream, as CUDA's: work queued on it runs after
 * the work queued before on the device's blocking streams (created without
 * cudaStreamNonBlocking), and work queued on those after the work queued
 * before on it.  A barrier is an operation that waits for such work; it
 * only ever waits for work queued before it, so barriers cannot wait on
 * each other in a circle.
 */
typedef struct barrier {
	emu_op_t h;
	size_t n;
	struct {
		struct CUstream_st *s;   /* referenced */
		uint64_t target;
	} w[];
} barrier_t;

static void
barrier_run(emu_op_t *op, struct CUstream_st *s)
{
	barrier_t *b = (barrier_t *)op;

	(void)s;
	for (size_t i = 0; i < b->n; i++)
		stream_wait(b->w[i].s, b->w[i].target);
}

static void
barrier_fini(emu_op_t *op)
{
	barrier_t *b = (barrier_t *)op;

	for (size_t i = 0; i < b->n; i++)
		stream_unref(b->w[i].s);
	free(b);
}

/* What new work on s must wait for first; NULL when nothing. */
static barrier_t *
legacy_barrier(struct CUstream_st *s)
{
	barrier_t *b = NULL;
	size_t cap = 0;
	bool legacy = defaults[s->dev] == s;

	if (!legacy && (s->flags & cudaStreamNonBlocking))
		return NULL;
	pthread_mutex_lock(&reg_mu);
	for (struct CUstream_st *x = streams; x; x = x->next)
		cap += x->dev == s->dev;
	b = calloc(1, sizeof(*b) + cap * sizeof(b->w[0]));
	if (b == NULL)
		abort();
	for (struct CUstream_st *x = streams; x; x = x->next) {
		bool other_legacy = defaults[x->dev] == x;

		if (x == s || x->dev != s->dev ||
		    (legacy ? other_legacy || (x->flags & cudaStreamNonBlocking) : !other_legacy))
			continue;
		pthread_mutex_lock(&x->mu);
		if (x->done < x->queued) {
			b->w[b->n].s = x;
			b->w[b->n++].target = x->queued;
			x->refs++;
		}
		pthread_mutex_unlock(&x->mu);
	}
	pthread_mutex_unlock(&reg_mu);
	if (b->n == 0) {
		free(b);
		return NULL;
	}
	b->h.run = barrier_run;
	b->h.fini = barrier_fini;
	return b;
}

static void
push_locked(struct CUstream_st *s, emu_op_t *op)
{
	op->next = NULL;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	s->queued++;
}

void
emu_stream_push(struct CUstream_st *s, emu_op_t *op)
{
	barrier_t *b = legacy_barrier(s);

	pthread_mutex_lock(&s->mu);
	if (b)
		push_locked(s, &b->h);
	push_locked(s, op);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static uint64_t
stream_queued(struct CUstream_st *s)
{
	uint64_t q;

	pthread_mutex_lock(&s->mu);
	q = s->queued;
	pthread_mutex_unlock(&s->mu);
	return q;
}

void
emu_streams_sync(int dev)
{
	struct CUstream_st **list;
	uint64_t *target;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&reg_mu);
	for (struct CUstream_st *s = streams; s; s = s->next)
		cap++;
	list = calloc(cap + 1, sizeof(*list));
	target = calloc(cap + 1, sizeof(*target));
	if (list == NULL || target == NULL)
		abort();
	for (struct CUstream_st *s = streams; s; s = s->next) {
		if (dev >= 0 && s->dev != dev)
			continue;
		s->refs++;
		list[n++] = s;
	}
	pthread_mutex_unlock(&reg_mu);
	for (size_t i = 0; i < n; i++)
		target[i] = stream_queued(list[i]);
	for (size_t i = 0; i < n; i++) {
		stream_wait(list[i], target[i]);
		stream_unref(list[i]);
	}
	free(list);
	free(target);
}

/* The entry checks of a cudaXCreateWithFlags: out set, no flag outside allowed. */
static cudaError_t
create_check(const char *what, const void *out, unsigned flags, unsigned allowed)
{
	cudaError_t e = emu_enter();

	if (e)
		return e;
	if (out == NULL || (flags & ~allowed))
		return emu_fail(cudaErrorInvalidValue, "%s(%p, 0x%x)", what, out, flags);
	return cudaSuccess;
}

cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
	cudaError_t e = create_check("cudaStreamCreateWithFlags", out, flags,
				     cudaStreamNonBlocking);
	struct CUstream_st *s;

	if (e)
		return e;
	pthread_mutex_lock(&reg_mu);
	s = stream_new(emu_cur_dev(), flags);
	pthread_mutex_unlock(&reg_mu);
	if (s == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaStreamCreate: no thread");
	emu_count(EMU_STREAMS, 1);
	*out = s;
	return cudaSuccess;
}

cudaError_t
cudaStreamCreate(cudaStream_t *out)
{
	return cudaStreamCreateWithFlags(out, 0);
}

/* Like CUDA: returns at once; queued work still runs, then the stream goes. */
cudaError_t
cudaStreamDestroy(cudaStream_t h)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s = NULL;

	if (e)
		return e;
	pthread_mutex_lock(&reg_mu);
	for (int d = 0; d < REFIT_EMU_MAX_DEVICES; d++)
		if (h && defaults[d] == h)
			h = NULL;
	for (s = streams; h && s && (s != h || s->destroyed); s = s->next)
		;
	if (h == NULL)
		s = NULL;
	if (s)
		s->destroyed = true;
	pthread_mutex_unlock(&reg_mu);
	if (s == NULL)
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a "
				"live stream", (void *)h);
	emu_count(EMU_STREAMS, -1);
	pthread_mutex_lock(&s->mu); /* the worker ends once the queue is empty */
	s->stop = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return cudaSuccess;
}

cudaError_t
cudaStreamSynchronize(cudaStream_t h)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s;

	if (e)
		return e;
	if ((e = emu_stream_get(h, &s)) != cudaSuccess)
		return e;
	stream_wait(s, stream_queued(s));
	return emu_sticky();
}

cudaError_t
cudaStreamQuery(cudaStream_t h)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s;
	bool busy;

	if (e)
		return e;
	if ((e = emu_stream_get(h, &s)) != cudaSuccess)
		return e;
	pthread_mutex_lock(&s->mu);
	busy = s->done < s->queued;
	pthread_mutex_unlock(&s->mu);
	return busy ? cudaErrorNotReady : emu_sticky();
}

cudaError_t
cudaDeviceSynchronize(void)
{
	cudaError_t e = emu_enter();

	if (e)
		return e;
	emu_streams_sync(emu_cur_dev());
	return emu_sticky();
}

/* ---- events ------------------------------------------------------------------ */

static struct CUevent_st *
event_find(cudaEvent_t h)
{
	struct CUevent_st *ev;

	for (ev = events; ev && ev != h; ev = ev->next)
		;
	return ev;
}

cudaError_t
cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags)
{
	cudaError_t e = create_check("cudaEventCreateWithFlags", out, flags, 7u);
	struct CUevent_st *ev;
	emu_ipcev_t *ipc = NULL;

	if (e)
		return e;
	if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
		return emu_fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: "
				"cudaEventInterprocess needs cudaEventDisableTiming");
	if ((flags & cudaEventInterprocess) && (e = emu_ipcev_new(&ipc)) != cudaSuccess)
		return e;
	if ((ev = calloc(1, sizeof(*ev))) == NULL) {
		if (ipc)
			emu_ipcev_destroy(ipc);
		return emu_fail(cudaErrorMemoryAllocation, "cudaEventCreate");
	}
	ev->magic = EVENT_MAGIC;
	ev->ipc = ipc;
	pthread_mutex_lock(&reg_mu);
	ev->next = events;
	events = ev;
	pthread_mutex_unlock(&reg_mu);
	*out = ev;
	return cudaSuccess;
}

cudaError_t
cudaEventCreate(cudaEvent_t *out)
{
	return cudaEventCreateWithFlags(out, 0);
}

cudaError_t
cudaEventRecord(cudaEvent_t h, cudaStream_t sh)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s, *old;
	struct CUevent_st *ev;

	if (e)
		return e;
	if ((e = emu_stream_get(sh, &s)) != cudaSuccess)
		return e;
	pthread_mutex_lock(&reg_mu);
	if ((ev = event_find(h)) == NULL) {
		pthread_mutex_unlock(&reg_mu);
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p): not a "
				"live event", (void *)h);
	}
	if (s->dev != emu_cur_dev()) {
		pthread_mutex_unlock(&reg_mu);
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: stream of "
				"device %d while the current device is %d", s->dev,
				emu_cur_dev());
	}
	if (ev->ipc && emu_ipcev_imported(ev->ipc)) {
		pthread_mutex_unlock(&reg_mu);
		return emu_fail(cudaErrorNotSupported, "cudaEventRecord(%p): an event opened "
				"from another process's handle is only waited on here (a choice; "
				"CUDA allows recording it)", (void *)h);
	}
	old = ev->s;
	s->refs++;
	ev->s = s;
	if (ev->ipc)
		emu_ipcev_ref(ev->ipc);
	pthread_mutex_unlock(&reg_mu);
	ev->target = stream_queued(s);
	if (ev->ipc) {
		emu_ipcev_record(ev->ipc, s);
		emu_ipcev_unref(ev->ipc);
	}
	if (old)
		stream_unref(old);
	return cudaSuccess;
}

/* The event's stream (referenced) and target; NULL stream: never recorded
 * here.  An interprocess event: *ipc (referenced) and its generation now. */
static cudaError_t
event_get(cudaEvent_t h, struct CUstream_st **s, uint64_t *target, emu_ipcev_t **ipc)
{
	struct CUevent_st *ev;

	pthread_mutex_lock(&reg_mu);
	ev = event_find(h);
	*ipc = NULL;
	if (ev && ev->ipc) {
		*s = NULL;
		*ipc = ev->ipc;
		emu_ipcev_ref(*ipc);
		*target = emu_ipcev_recorded(*ipc);
	} else if (ev) {
		*s = ev->s;
		*target = ev->target;
		if (*s)
			(*s)->refs++;
	}
	pthread_mutex_unlock(&reg_mu);
	return ev ? cudaSuccess : emu_fail(cudaErrorInvalidResourceHandle, "event %p is not "
					   "a live event", (void *)h);
}

cudaError_t
cudaEventQuery(cudaEvent_t h)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s;
	uint64_t target;
	bool busy = false;
	emu_ipcev_t *ipc;

	if (e || (e = event_get(h, &s, &target, &ipc)) != cudaSuccess)
		return e;
	if (ipc) {
		busy = !emu_ipcev_done(ipc, target);
		emu_ipcev_unref(ipc);
	}
	if (s) {
		pthread_mutex_lock(&s->mu);
		busy = s->done < target;
		pthread_mutex_unlock(&s->mu);
		stream_unref(s);
	}
	return busy ? cudaErrorNotReady : emu_sticky();
}

cudaError_t
cudaEventSynchronize(cudaEvent_t h)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s;
	uint64_t target;
	emu_ipcev_t *ipc;

	if (e || (e = event_get(h, &s, &target, &ipc)) != cudaSuccess)
		return e;
	if (ipc) {
		emu_ipcev_wait(ipc, target);
		emu_ipcev_unref(ipc);
	}
	if (s) {
		stream_wait(s, target);
		stream_unref(s);
	}
	return emu_sticky();
}

cudaError_t
cudaEventDestroy(cudaEvent_t h)
{
	cudaError_t e = emu_enter();
	struct CUevent_st **pp, *ev = NULL;

	if (e)
		return e;
	pthread_mutex_lock(&reg_mu);
	for (pp = &events; *pp; pp = &(*pp)->next)
		if (*pp == h) {
			ev = *pp;
			*pp = ev->next;
			break;
		}
	pthread_mutex_unlock(&reg_mu);
	if (ev == NULL)
		return emu_fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a "
				"live event", (void *)h);
	if (ev->s)
		stream_unref(ev->s);
	if (ev->ipc)
		emu_ipcev_destroy(ev->ipc);
	ev->magic = 0;
	free(ev);
	return cudaSuccess;
}

/* ---- cross-stream and cross-process waits --------------------------------- */

/* What cudaStreamWaitEvent queues for an event of this process. */
typedef struct evwait {
	emu_op_t h;
	struct CUstream_st *s;    /* referenced */
	uint64_t target;
} evwait_t;

static void
evwait_run(emu_op_t *op, struct CUstream_st *s)
{
	evwait_t *w = (evwait_t *)op;

	(void)s;
	stream_wait(w->s, w->target);
}

static void
evwait_fini(emu_op_t *op)
{
	evwait_t *w = (evwait_t *)op;

	stream_unref(w->s);
	free(w);
}

/* As CUDA: later work on the stream waits for the work the event's most
 * recent record (at this call) captured, on any device, in any process
 * (interprocess events); an event never recorded: nothing to wait for. */
cudaError_t
cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned flags)
{
	cudaError_t e = emu_enter();
	struct CUstream_st *s, *es;
	uint64_t target;
	emu_ipcev_t *ipc;
	evwait_t *w;

	if (e)
		return e;
	if (flags != cudaEventWaitDefault)
		return emu_fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags 0x%x", flags);
	if ((e = emu_stream_get(sh, &s)) != cudaSuccess ||
	    (e = event_get(h, &es, &target, &ipc)) != cudaSuccess)
		return e;
	if (ipc) {
		emu_ipcev_push_wait(ipc, s);
		emu_ipcev_unref(ipc);
		return cudaSuccess;
	}
	if (es == NULL)
		return cudaSuccess;
	if ((w = calloc(1, sizeof(*w))) == NULL)
		abort();
	w->h.run = evwait_run;
	w->h.fini = evwait_fini;
	w->s = es;
	w->target = target;
	emu_stream_push(s, &w->h);
	return cudaSuccess;
}

cudaError_t
emu_event_ipc(cudaEvent_t h, emu_ipcev_t **out)
{
	struct CUevent_st *ev;

	pthread_mutex_lock(&reg_mu);
	ev = event_find(h);
	*out = ev ? ev->ipc : NULL;
	if (*out)
		emu_ipcev_ref(*out);
	pthread_mutex_unlock(&reg_mu);
	return ev ? cudaSuccess : emu_fail(cudaErrorInvalidResourceHandle, "event %p is not "
					   "a live event", (void *)h);
}

cudaError_t
emu_event_import(emu_ipcev_t *ipc, cudaEvent_t *out)
{
	struct CUevent_st *ev = calloc(1, sizeof(*ev));

	if (ev == NULL)
		return emu_fail(cudaErrorMemoryAllocation, "cudaIpcOpenEventHandle");
	ev->magic = EVENT_MAGIC;
	ev->ipc = ipc;
	pthread_mutex_lock(&reg_mu);
	ev->next = events;
	events = ev;
	pthread_mutex_unlock(&reg_mu);
	*out = ev;
	return cudaSuccess;
}
