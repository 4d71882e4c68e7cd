/*
 * emu_nccl.c - the emulated NCCL API (libnccl.so.2): unique ids,
 * communicators (init, shrink, destroy, abort, asynchronous errors).  Rendezvous in emu_boot.c, the send/recv data path in emu_p2p.c.
 *
 * Non-blocking communicators (config->blocking = 0) behave as NCCL 2.28's:
 * the init and shrink calls return ncclInProgress, the work goes on in a
 * thread, ncclCommGetAsyncError says ncclInProgress until it ends, a shrink
 * writes *newcomm only then; ncclGroupEnd returns ncclInProgress and queues
 * the operations on their streams only later (cudaStreamQuery on an empty
 * stream says nothing about a group still being launched).  Using a
 * communicator before it is ready, or destroying it, is refused with
 * ncclInvalidArgument (ncclCommEnsureReady); a communicator with an
 * asynchronous error can only be aborted.  Groups (ncclGroupStart/End,
 * ncclSend/Recv) in emu_group.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/emu/emu_nccl.h"

typedef struct uid_wire {
	uint32_t magic, pad;
	uint64_t nonce;
	char path[PATH_MAX_UN];
} uid_wire_t;
_Static_assert(sizeof(uid_wire_t) <= sizeof(ncclUniqueId), "unique id too big");

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t comms;                 /* live handles */
static char last_msg[400];


/* ---- small things ---------------------------------------------------------------- */

static const char *const type_names[] = {"int8", "uint8", "int32", "uint32", "int64",
					 "uint64", "float16", "float32", "float64", "bfloat16",
					 "float8e4m3", "float8e5m2"};
static const size_t type_sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

const char *
type_name(ncclDataType_t t)
{
	return (unsigned)t < ncclNumTypes ? type_names[t] : "?";
}

size_t
type_size(ncclDataType_t t)
{
	return (unsigned)t < ncclNumTypes ? type_sizes[t] : 0;
}

/* Say an error, and keep it for ncclGetLastError. */
ncclResult_t
nccl_fail(ncclResult_t r, const char *fmt, ...)
{
	char buf[400];

	EMU_VFORMAT(buf, fmt);
	emu_say("NCCL WARN %s (%s)", buf, ncclGetErrorString(r));
	pthread_mutex_lock(&reg_mu);
	snprintf(last_msg, sizeof(last_msg), "%s", buf);
	pthread_mutex_unlock(&reg_mu);
	return r;
}

void
comm_set_err(ncclComm_t c, ncclResult_t r, const char *fmt, ...)
{
	char buf[400];
	bool first;

	EMU_VFORMAT(buf, fmt);
	pthread_mutex_lock(&c->mu);
	first = c->err == ncclSuccess;
	if (first)
		c->err = r;
	pthread_mutex_unlock(&c->mu);
	if (first)
		nccl_fail(r, "%s", buf);
}

/* ---- communicators ------------------------------------------------------------------ */

void
comm_ref(ncclComm_t c)
{
	pthread_mutex_lock(&c->mu);
	c->refs++;
	pthread_mutex_unlock(&c->mu);
}

void
comm_unref(ncclComm_t c)
{
	bool last;

	pthread_mutex_lock(&c->mu);
	last = --c->refs == 0;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (!last)
		return;
	comm_close_fds(c);
	root_unref(c->own_root);
	emu_reg_free_all(c);   /* NCCL's ncclRegCleanup at destroy and abort */
	free(c->peers);
	free(c->out_fd);
	free(c->in_fd);
	free(c->send_next);
	free(c->send_turn);
	free(c->recv_next);
	free(c->recv_turn);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->accept_mu);
	pthread_cond_destroy(&c->cv);
	c->magic = 0;
	free(c);
}

static ncclComm_t
comm_new(int rank, int nranks, int dev, bool blocking)
{
	ncclComm_t c = calloc(1, sizeof(*c));

	if (c == NULL)
		return NULL;
	c->magic = COMM_MAGIC;
	c->rank = rank;
	c->nranks = nranks;
	c->dev = dev;
	c->blocking = blocking;
	c->refs = 1;
	c->pending = 1;
	c->listen_fd = c->join_fd = -1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->accept_mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	pthread_mutex_lock(&reg_mu);
	c->reg_next = comms;
	comms = c;
	pthread_mutex_unlock(&reg_mu);
	emu_count(EMU_COMMS, 1);
	return c;
}

/* Take c out of the registry (its handle dies); false if it was not in. */
static bool
comm_unregister(ncclComm_t c)
{
	ncclComm_t *pp;
	bool found = false;

	pthread_mutex_lock(&reg_mu);
	for (pp = &comms; *pp; pp = &(*pp)->reg_next)
		if (*pp == c) {
			*pp = c->reg_next;
			found = true;
			break;
		}
	pthread_mutex_unlock(&reg_mu);
	if (found)
		emu_count(EMU_COMMS, -1);
	return found;
}

static bool
comm_live(ncclComm_t c)
{
	bool found = false;

	pthread_mutex_lock(&reg_mu);
	for (ncclComm_t x = comms; x && !found; x = x->reg_next)
		found = x == c;
	pthread_mutex_unlock(&reg_mu);
	return found;
}

ncclResult_t
comm_check(ncclComm_t c, const char *what)
{
	if (c == NULL)
		return nccl_fail(ncclInvalidArgument, "%s: comm is NULL", what);
	if (!comm_live(c))
		return nccl_fail(ncclInvalidArgument, "%s: comm %p is not a live communicator "
				 "(destroyed, aborted, or never created)", what, (void *)c);
	return ncclSuccess;
}

/* Under c->mu: whether an operation of c is still in flight. */
static bool
comm_busy(ncclComm_t c)
{
	return c->pending || c->launching || c->children;
}

comm_flags_t
comm_flags(ncclComm_t c)
{
	comm_flags_t f;

	pthread_mutex_lock(&c->mu);
	f.err = c->err;
	f.busy = comm_busy(c);
	f.aborted = c->aborted;
	pthread_mutex_unlock(&c->mu);
	return f;
}

/* NCCL's ncclCommEnsureReady: live, not in progress, no asynchronous error. */
ncclResult_t
comm_ready(ncclComm_t c, const char *what)
{
	ncclResult_t r = comm_check(c, what);
	comm_flags_t f;

	if (r != ncclSuccess)
		return r;
	f = comm_flags(c);
	if (f.busy)
		return nccl_fail(ncclInvalidArgument, "%s: rank %d: attempt to use communicator "
				 "before the previous operation returned ncclSuccess", what,
				 c->rank);
	if (f.err != ncclSuccess)
		return nccl_fail(f.err, "%s: rank %d: the communicator has an asynchronous error "
				 "(abort it)", what, c->rank);
	if (emu_sticky() != cudaSuccess)
		return nccl_fail(ncclUnhandledCudaError, "%s: %s", what,
				 cudaGetErrorString(emu_sticky()));
	return ncclSuccess;
}

static ncclResult_t
start_join(ncclComm_t c)
{
	pthread_attr_t at;
	pthread_t th;
	int rc;

	comm_ref(c); /* the thread's */
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 << 10);
	rc = pthread_create(&th, &at, comm_join_main, c);
	pthread_attr_destroy(&at);
	if (rc != 0) {
		comm_unref(c);
		pthread_mutex_lock(&c->mu);
		c->pending = 0;
		c->settled = true;
		pthread_mutex_unlock(&c->mu);
		comm_set_err(c, ncclSystemError, "cannot start a thread for rank %d", c->rank);
		return ncclSystemError;
	}
	return ncclSuccess;
}

ncclResult_t
comm_wait_ready(ncclComm_t c)
{
	ncclResult_t r;

	pthread_mutex_lock(&c->mu);
	while (!c->settled) /* a blocking shrink returns with *newcomm written */
		pthread_cond_wait(&c->cv, &c->mu);
	r = c->err;
	pthread_mutex_unlock(&c->mu);
	return r;
}

/* After starting c's init or shrink: defer to ncclGroupEnd, wait, or return
 * ncclInProgress. */
static ncclResult_t
init_started(ncclComm_t c)
{
	if (group_defer_init(c))
		return ncclSuccess;
	return c->blocking ? comm_wait_ready(c) : ncclInProgress;
}

static ncclResult_t
config_blocking(const ncclConfig_t *cfg, bool dflt, bool *out)
{
	*out = dflt;
	if (cfg == NULL)
		return ncclSuccess;
	if (cfg->magic != 0xcafebeef || cfg->size < offsetof(ncclConfig_t, cgaClusterSize))
		return nccl_fail(ncclInvalidArgument, "config was not set with "
				 "NCCL_CONFIG_INITIALIZER (magic 0x%x)", cfg->magic);
	if (cfg->blocking == NCCL_CONFIG_UNDEF_INT)
		return ncclSuccess;
	if (cfg->blocking != 0 && cfg->blocking != 1)
		return nccl_fail(ncclInvalidArgument, "config->blocking %d", cfg->blocking);
	*out = cfg->blocking == 1;
	return ncclSuccess;
}

/* ---- the API ---------------------------------------------------------------------------- */

ncclResult_t
ncclGetVersion(int *version)
{
	const emu_env_t *env = emu_env();

	if (version == NULL)
		return nccl_fail(ncclInvalidArgument, "ncclGetVersion(NULL)");
	if (env == NULL)
		return nccl_fail(ncclSystemError, "ncclGetVersion: the emulator did not start");
	*version = env->nccl_version; /* NCCL_VERSION_CODE unless REFIT_EMU_NCCL_VERSION */
	return ncclSuccess;
}

ncclResult_t
ncclGetUniqueId(ncclUniqueId *id)
{
	const emu_env_t *env = emu_env();
	static _Atomic uint64_t seq;
	uid_wire_t w = {WIRE_MAGIC, 0, emu_rand(), ""};
	char why[300];

	if (id == NULL)
		return nccl_fail(ncclInvalidArgument, "ncclGetUniqueId(NULL)");
	if (env == NULL || emu_enter() == cudaErrorInitializationError)
		return nccl_fail(ncclSystemError, "ncclGetUniqueId: the emulator did not start "
				 "(or this process was forked after it did)");
	emu_slow_unique_id();
	snprintf(w.path, sizeof(w.path), "%s/r.%d.%llu.sock", env->dir, (int)getpid(),
		 (unsigned long long)atomic_fetch_add(&seq, 1));
	if (root_start(w.path, true, why, sizeof(why)) == NULL)
		return nccl_fail(ncclSystemError, "ncclGetUniqueId: %s", why);
	memset(id, 0, sizeof(*id));
	memcpy(id->internal, &w, sizeof(w));
	return ncclSuccess;
}

ncclResult_t
ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
		       ncclConfig_t *config)
{
	const char *w = "ncclCommInitRankConfig";
	uid_wire_t u;
	bool blocking;
	ncclComm_t c;
	ncclResult_t r;

	if (out == NULL)
		return nccl_fail(ncclInvalidArgument, "%s: comm is NULL", w);
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return nccl_fail(ncclInvalidArgument, "%s: rank %d of %d", w, rank, nranks);
	memcpy(&u, id.internal, sizeof(u));
	u.path[sizeof(u.path) - 1] = 0;
	if (u.magic != WIRE_MAGIC)
		return nccl_fail(ncclInvalidArgument, "%s: the id is not from ncclGetUniqueId", w);
	if ((r = config_blocking(config, true, &blocking)) != ncclSuccess)
		return r;
	if (emu_enter() != cudaSuccess)
		return nccl_fail(ncclUnhandledCudaError, "%s: %s", w,
				 cudaGetErrorString(emu_enter()));
	if ((c = comm_new(rank, nranks, emu_cur_dev(), blocking)) == NULL)
		return nccl_fail(ncclSystemError, "%s: out of memory", w);
	snprintf(c->root_path, sizeof(c->root_path), "%s", u.path);
	*out = c; /* NCCL: the handle is valid at once, in progress until ready */
	if ((r = start_join(c)) != ncclSuccess)
		return r;
	return init_started(c);
}

ncclResult_t
ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
	return ncclCommInitRankConfig(out, nranks, id, rank, NULL);
}

static int
cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

/* The sorted exclusion list (sorted in place, as NCCL does) is valid. */
static ncclResult_t
shrink_check(ncclComm_t c, int *excl, int nex, ncclComm_t *newcomm, int flags)
{
	const char *w = "ncclCommShrink";

	if (newcomm == NULL || excl == NULL || nex <= 0)
		return nccl_fail(ncclInvalidArgument, "%s: newcomm %p, excludeRanksList %p, "
				 "excludeRanksCount %d", w, (void *)newcomm, (void *)excl, nex);
	if (flags & ~NCCL_SHRINK_ABORT)
		return nccl_fail(ncclInvalidArgument, "%s: flags 0x%x", w, flags);
	qsort(excl, (size_t)nex, sizeof(int), cmp_int);
	for (int i = 0; i < nex; i++) {
		if (excl[i] < 0 || excl[i] >= c->nranks || (i && excl[i] == excl[i - 1]))
			return nccl_fail(ncclInvalidArgument, "%s: excluded rank %d (of %d, or "
					 "twice)", w, excl[i], c->nranks);
		if (excl[i] == c->rank)
			return nccl_fail(ncclInvalidArgument, "%s: rank %d excludes itself", w,
					 c->rank);
	}
	if (nex >= c->nranks)
		return nccl_fail(ncclInvalidArgument, "%s: excludes all %d ranks", w, c->nranks);
	return ncclSuccess;
}

ncclResult_t
ncclCommShrink(ncclComm_t comm, int *excl, int nex, ncclComm_t *newcomm, ncclConfig_t *config,
	       int flags)
{
	ncclResult_t r;
	bool blocking;
	ncclComm_t c;
	int newrank;
	uint64_t uid;
	char why[300];

	if ((r = comm_check(comm, "ncclCommShrink")) != ncclSuccess ||
	    (r = shrink_check(comm, excl, nex, newcomm, flags)) != ncclSuccess)
		return r;
	if (flags & NCCL_SHRINK_ABORT) { /* first end the parent's operations */
		pthread_mutex_lock(&comm->mu);
		comm->terminated = true;
		comm_shutdown_data(comm);
		pthread_mutex_unlock(&comm->mu);
	}
	if ((r = comm_ready(comm, "ncclCommShrink")) != ncclSuccess ||
	    (r = config_blocking(config, comm->blocking, &blocking)) != ncclSuccess)
		return r;
	*newcomm = NULL; /* NCCL: NULL until the shrink completes */
	newrank = comm->rank;
	for (int i = 0; i < nex; i++)
		newrank -= excl[i] < comm->rank;
	if ((c = comm_new(newrank, comm->nranks - nex, comm->dev, blocking)) == NULL)
		return nccl_fail(ncclSystemError, "ncclCommShrink: out of memory");
	pthread_mutex_lock(&comm->mu);
	uid = emu_hash(&comm->shrinks, sizeof(comm->shrinks), comm->uid);
	comm->shrinks++;
	comm->children++;
	comm->refs++;
	c->sib = comm->kids;
	comm->kids = c;
	pthread_mutex_unlock(&comm->mu);
	c->uid = emu_hash(excl, (size_t)nex * sizeof(int), uid);
	c->parent = comm;
	c->publish = newcomm;
	c->root_wait = true;
	snprintf(c->root_path, sizeof(c->root_path), "%s/s.%016llx.sock", emu_env()->dir,
		 (unsigned long long)c->uid);
	if (newrank == 0 && (c->own_root = root_start(c->root_path, false, why,
						      sizeof(why))) == NULL)
		comm_set_err(c, ncclSystemError, "ncclCommShrink: %s", why);
	cudaSetDevice(comm->dev); /* as NCCL does */
	if ((r = start_join(c)) != ncclSuccess) {
		pthread_mutex_lock(&comm->mu);
		for (ncclComm_t *k = &comm->kids; *k; k = &(*k)->sib)
			if (*k == c) {
				*k = c->sib;
				break;
			}
		comm->children--;
		pthread_mutex_unlock(&comm->mu);
		comm_unref(comm);
		c->parent = NULL;
		return r;
	}
	return init_started(c);
}

ncclResult_t
ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *out)
{
	ncclResult_t r = comm_check(c, "ncclCommGetAsyncError");
	comm_flags_t f;

	if (r != ncclSuccess)
		return r;
	if (out == NULL)
		return nccl_fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
	f = comm_flags(c);
	r = f.err == ncclSuccess && f.busy ? ncclInProgress : f.err;
	if (r == ncclSuccess && emu_sticky() != cudaSuccess)
		r = ncclUnhandledCudaError;
	*out = r;
	return ncclSuccess;
}

ncclResult_t
ncclCommDestroy(ncclComm_t c)
{
	ncclResult_t r;
	comm_flags_t f;

	if (c == NULL)
		return ncclSuccess;
	if ((r = comm_check(c, "ncclCommDestroy")) != ncclSuccess)
		return r;
	f = comm_flags(c);
	/* NCCL 2.27.6 and later (init.cc: ncclGroupStartInternal before the
	 * checks, NCCLCHECK returns past the ncclGroupEndInternal; v2.27.5 has
	 * no group there) open a group first and return these refusals without
	 * closing it: the calling thread is left inside a group (its next
	 * ncclGroupEnd closes that one; until then nothing it posts runs) */
	if ((f.busy || f.err != ncclSuccess) && emu_env()->nccl_version >= 22706)
		group_leave_open();
	if (f.busy)
		return nccl_fail(ncclInvalidArgument, "ncclCommDestroy: rank %d: attempt to use "
				 "communicator before the previous operation returned "
				 "ncclSuccess (NCCL >= 2.27.6 leaves this thread inside a group)",
				 c->rank);
	if (f.err != ncclSuccess)
		return nccl_fail(f.err, "ncclCommDestroy: rank %d has an asynchronous error: abort "
				 "it instead (NCCL >= 2.27.6 leaves this thread inside a group)",
				 c->rank);
	if (!comm_unregister(c))
		return nccl_fail(ncclInvalidArgument, "ncclCommDestroy: comm %p destroyed twice",
				 (void *)c);
	/* NCCL completes what was issued before it frees the communicator */
	pthread_mutex_lock(&c->mu);
	c->gone = true;
	while (c->refs > 1)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	comm_unref(c);
	return ncclSuccess;
}

ncclResult_t
ncclCommAbort(ncclComm_t c)
{
	ncclResult_t r;

	if (c == NULL)
		return ncclSuccess;
	if ((r = comm_check(c, "ncclCommAbort")) != ncclSuccess)
		return r;
	if (emu_env()->hang_abort) {  /* a stuck teardown (proxy, driver): never returns */
		static _Atomic uint64_t aborts;

		if (++aborts == emu_env()->hang_abort) {
			emu_say("ncclCommAbort: rank %d: abort %llu never returns "
				"(REFIT_EMU_HANG_ABORT)", c->rank, (unsigned long long)aborts);
			for (;;)
				pause();
		}
	}
	if (!comm_unregister(c))
		return nccl_fail(ncclInvalidArgument, "ncclCommAbort: comm %p freed twice",
				 (void *)c);
	pthread_mutex_lock(&c->mu);
	c->gone = true;
	c->aborted = true;
	comm_shutdown_fds(c);
	root_cancel(c->own_root);
	pthread_cond_broadcast(&c->cv);
	while (c->pending) /* the init thread sees the abort and ends */
		pthread_cond_wait(&c->cv, &c->mu);
	/*
	 * Shrinks of c in progress end too, and only then does the abort
	 * return: NCCL 2.28.9 sets the child's abort flag (init.cc
	 * setCommAbortFlags: comm->childAbortFlag) and joins c's group job,
	 * the shrink's included (ncclCommEnsureReady -> ncclGroupJobAbort);
	 * the shrink job, ending, writes its new communicator (failed, to be
	 * aborted by the caller) into *newcomm (ncclCommInitRankFunc's exit:
	 * "assign it to user pointer").  So that variable must live until the
	 * parent's abort returned, and the new handle must be aborted then.
	 */
	for (ncclComm_t k = c->kids; k; k = k->sib) {
		pthread_mutex_lock(&k->mu);
		k->aborted = true;
		comm_shutdown_fds(k);
		root_cancel(k->own_root);
		pthread_cond_broadcast(&k->cv);
		pthread_mutex_unlock(&k->mu);
	}
	while (c->children) /* each one published its handle */
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	comm_unref(c); /* operations still queued hold theirs and end at once */
	return ncclSuccess;
}

static ncclResult_t
comm_query(ncclComm_t c, const void *out, const char *what)
{
	if (out == NULL)
		return nccl_fail(ncclInvalidArgument, "%s: output is NULL", what);
	return comm_ready(c, what);
}

ncclResult_t
ncclCommCount(const ncclComm_t c, int *count)
{
	ncclResult_t r = comm_query(c, count, "ncclCommCount");

	if (r == ncclSuccess)
		*count = c->nranks;
	return r;
}

ncclResult_t
ncclCommCuDevice(const ncclComm_t c, int *device)
{
	ncclResult_t r = comm_query(c, device, "ncclCommCuDevice");

	if (r == ncclSuccess)
		*device = c->dev;
	return r;
}

ncclResult_t
ncclCommUserRank(const ncclComm_t c, int *rank)
{
	ncclResult_t r = comm_query(c, rank, "ncclCommUserRank");

	if (r == ncclSuccess)
		*rank = c->rank;
	return r;
}

const char *
ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO "
					    "for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for "
				     "details)";
	case ncclInternalError: return "internal error - please report this issue to the "
				       "NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for "
					 "details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

const char *
ncclGetLastError(ncclComm_t comm)
{
	(void)comm;
	return last_msg;
}
