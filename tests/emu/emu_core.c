/*
 * emu_core.c - the emulator's process state: environment, current device
 * (per host thread), the per-thread last error, the sticky error of a dead
 * context, error strings, counters and their JSON dump at exit.
 *
 * Device memory is in emu_mem.c, streams and copies in emu_stream.c, NCCL in
 * emu_nccl*.c (libnccl.so.2).  See README.md for the rules.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/emu/emu_internal.h"

static emu_env_t env;
static int env_ok = -1;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static _Atomic int sticky;
static char sticky_msg[256];
static pthread_mutex_t sticky_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread cudaError_t last_err;
static __thread int cur_dev;

static _Atomic int64_t c_alloc[REFIT_EMU_MAX_DEVICES], c_bytes[REFIT_EMU_MAX_DEVICES];
static _Atomic int64_t c_live[EMU_NCOUNTERS];
static _Atomic int64_t c_pair[REFIT_EMU_MAX_DEVICES + 1][REFIT_EMU_MAX_DEVICES + 1];

void
emu_say(const char *fmt, ...)
{
	char buf[600];

	EMU_VFORMAT(buf, fmt);
	fprintf(stderr, "refit-emu[%d]: %s\n", (int)getpid(), buf);
}

uint64_t
emu_hash(const void *p, size_t n, uint64_t h)
{
	const uint8_t *b = p;

	if (h == 0)
		h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

uint64_t
emu_rand(void)
{
	static _Atomic uint64_t s;
	uint64_t x = atomic_fetch_add(&s, 0x9e3779b97f4a7c15ULL);

	if (x == 0) { /* first use: seed from time and pid */
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		x = emu_hash(&ts, sizeof(ts), (uint64_t)getpid());
		atomic_store(&s, x);
	}
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* "N" or "MIN-MAX" microseconds */
static int
parse_delay(const char *s, unsigned *lo, unsigned *hi)
{
	char *end;
	unsigned long a = strtoul(s, &end, 10), b = a;

	if (end == s || *s < '0' || *s > '9')
		return -1;
	if (*end == '-') {
		const char *t = end + 1;

		b = strtoul(t, &end, 10);
		if (end == t || *t < '0' || *t > '9')
			return -1;
	}
	if (*end || a > b || b > 10000000)
		return -1;
	*lo = (unsigned)a;
	*hi = (unsigned)b;
	return 0;
}

static int
mkdirs(const char *dir)
{
	char p[256];

	if (snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
		return -1;
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0700) != 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(p, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

static void counters_dump(void);

/*
 * CUDA_VISIBLE_DEVICES: the host's devices this process sees, in the order
 * given; ordinal i is the i-th.  As CUDA, the list ends at the first entry
 * that is not a device of the host (or names one again); UUIDs ("GPU-...")
 * are not emulated.  A list that names no device is refused (a bad
 * environment), where CUDA would see none.
 */
static int
visible_parse(void)
{
	const char *s = getenv("CUDA_VISIBLE_DEVICES"), *p;
	bool seen[REFIT_EMU_MAX_DEVICES] = {false};
	int n = 0;

	if (s == NULL)
		return 0;
	for (p = s; *p;) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p || (*end != ',' && *end != '\0') || v < 0 || v >= env.nphys ||
		    seen[v])
			break;
		seen[v] = true;
		env.phys[n++] = (int)v;
		p = *end ? end + 1 : end;
	}
	if (n == 0) {
		emu_say("CUDA_VISIBLE_DEVICES=\"%s\": names none of the host's %d devices "
			"(0..%d)", s, env.nphys, env.nphys - 1);
		return -1;
	}
	env.ndev = n;
	return 0;
}

int
emu_phys(int ord)
{
	return ord >= 0 && ord < env.ndev ? env.phys[ord] : -1;
}

int
emu_ord(int phys)
{
	for (int d = 0; d < env.ndev; d++)
		if (env.phys[d] == phys)
			return d;
	return -1;
}

static int
env_parse(void)
{
	const char *s;
	char *end;
	char sub[260];

	s = getenv("REFIT_EMU_DEVICES");
	env.ndev = 8;
	if (s && *s) {
		long n = strtol(s, &end, 10);

		if (*end || n < 1 || n > REFIT_EMU_MAX_DEVICES) {
			emu_say("REFIT_EMU_DEVICES=\"%s\": want 1..%d", s, REFIT_EMU_MAX_DEVICES);
			return -1;
		}
		env.ndev = (int)n;
	}
	env.nphys = env.ndev;
	for (int d = 0; d < env.ndev; d++)
		env.phys[d] = d;
	if (visible_parse() != 0)
		return -1;
	s = getenv("REFIT_EMU_DEVICE_MEM");
	env.dev_mem = 4ULL << 30;
	if (s && *s) {
		unsigned long long n = strtoull(s, &end, 10);

		if (*end || n == 0 || *s < '0' || *s > '9') {
			emu_say("REFIT_EMU_DEVICE_MEM=\"%s\": want bytes > 0", s);
			return -1;
		}
		env.dev_mem = n;
	}
	s = getenv("REFIT_EMU_DELAY_US");
	env.delay_min_us = 100;
	env.delay_max_us = 500;
	if (s && *s && parse_delay(s, &env.delay_min_us, &env.delay_max_us) != 0) {
		emu_say("REFIT_EMU_DELAY_US=\"%s\": want N or MIN-MAX microseconds", s);
		return -1;
	}
	s = getenv("REFIT_EMU_NCCL_VERSION");
	env.nccl_version = NCCL_VERSION_CODE;
	if (s && *s) {
		long v = strtol(s, &end, 10);

		if (*end || *s < '0' || *s > '9' || v < 1 || v > 999999) {
			emu_say("REFIT_EMU_NCCL_VERSION=\"%s\": want a version code 1..999999 "
				"(NCCL 2.28.9 is 22809)", s);
			return -1;
		}
		env.nccl_version = (int)v;
	}
	s = getenv("REFIT_EMU_HANG_D2H");
	env.hang_d2h = 0;
	if (s && *s) {
		unsigned long long n = strtoull(s, &end, 10);

		if (*end || *s < '0' || *s > '9') {
			emu_say("REFIT_EMU_HANG_D2H=\"%s\": want the number of the device-to-host "
				"copy that never ends (1: the first; 0: none)", s);
			return -1;
		}
		env.hang_d2h = n;
	}
	s = getenv("REFIT_EMU_HANG_ABORT");
	env.hang_abort = 0;
	if (s && *s) {
		unsigned long long n = strtoull(s, &end, 10);

		if (*end || *s < '0' || *s > '9') {
			emu_say("REFIT_EMU_HANG_ABORT=\"%s\": want the number of the ncclCommAbort "
				"that never returns (1: the first; 0: none)", s);
			return -1;
		}
		env.hang_abort = n;
	}
	s = getenv("REFIT_EMU_FAULT_D2D");
	env.fault_d2d = 0;
	if (s && *s) {
		unsigned long long n = strtoull(s, &end, 10);

		if (*end || *s < '0' || *s > '9') {
			emu_say("REFIT_EMU_FAULT_D2D=\"%s\": want the number of the device-to-device "
				"copy that kills the context (1: the first; 0: none)", s);
			return -1;
		}
		env.fault_d2d = n;
	}
	s = getenv("REFIT_EMU_DIR");
	if (s && *s)
		snprintf(env.dir, sizeof(env.dir), "%s", s);
	else
		snprintf(env.dir, sizeof(env.dir), "/tmp/refit-emu-%d", (int)getuid());
	if (strlen(env.dir) > 80) { /* unix socket paths live there */
		emu_say("REFIT_EMU_DIR \"%s\" is longer than 80 characters", env.dir);
		return -1;
	}
	snprintf(sub, sizeof(sub), "%s/mem", env.dir);
	if (mkdirs(env.dir) != 0 || mkdirs(sub) != 0) {
		emu_say("cannot create REFIT_EMU_DIR \"%s\": %s", sub, strerror(errno));
		return -1;
	}
	s = getenv("NCCL_HOSTID");
	if (s && *s)
		snprintf(env.host, sizeof(env.host), "%s", s);
	else if (gethostname(env.host, sizeof(env.host) - 1) != 0)
		snprintf(env.host, sizeof(env.host), "localhost");
	env.host_hash = emu_hash(env.host, strlen(env.host), 0);
	s = getenv("REFIT_EMU_COUNTERS");
	if (s && strcmp(s, "1") == 0)
		atexit(counters_dump);
	return 0;
}

static _Atomic int forked;

/* CUDA cannot be used in a child forked after the parent started it */
static void
on_fork_child(void)
{
	atomic_store(&forked, 1);
}

static void
env_init(void)
{
	env_ok = env_parse() == 0;
	if (env_ok)
		emu_mem_init(&env);
	pthread_atfork(NULL, NULL, on_fork_child);
}

const emu_env_t *
emu_env(void)
{
	pthread_once(&env_once, env_init);
	return env_ok ? &env : NULL;
}

cudaError_t
emu_enter(void)
{
	if (emu_env() == NULL)
		return cudaErrorInitializationError;
	if (atomic_load(&forked))
		return emu_fail(cudaErrorInitializationError, "CUDA was started before this "
				"process was forked: a forked child cannot use it");
	return (cudaError_t)atomic_load(&sticky);
}

cudaError_t
emu_sticky(void)
{
	return (cudaError_t)atomic_load(&sticky);
}

cudaError_t
emu_fail(cudaError_t e, const char *fmt, ...)
{
	char buf[400];

	EMU_VFORMAT(buf, fmt);
	emu_say("%s (%s)", buf, cudaGetErrorName(e));
	last_err = e;
	return e;
}

void
emu_fault(cudaError_t e, const char *fmt, ...)
{
	char buf[400];
	int zero = 0;

	EMU_VFORMAT(buf, fmt);
	pthread_mutex_lock(&sticky_mu);
	if (atomic_compare_exchange_strong(&sticky, &zero, (int)e)) {
		snprintf(sticky_msg, sizeof(sticky_msg), "%s: %s", cudaGetErrorName(e), buf);
		emu_say("STICKY %s: %s; every later CUDA call of this process fails",
			cudaGetErrorName(e), buf);
	}
	pthread_mutex_unlock(&sticky_mu);
}

int
emu_cur_dev(void)
{
	return cur_dev;
}

void
emu_delay(void)
{
	unsigned lo = env.delay_min_us, hi = env.delay_max_us;
	unsigned us = lo + (hi > lo ? (unsigned)(emu_rand() % (hi - lo + 1)) : 0);

	if (us)
		usleep(us);
}

/* ---- device selection, versions, errors --------------------------------- */

/* *out = *v, read after the entry checks (the first call sets env up). */
static cudaError_t
get_int(const char *what, int *out, const int *v)
{
	cudaError_t e = emu_enter();

	if (e)
		return e;
	if (out == NULL)
		return emu_fail(cudaErrorInvalidValue, "%s(NULL)", what);
	*out = *v;
	return cudaSuccess;
}

cudaError_t
cudaGetDeviceCount(int *count)
{
	return get_int("cudaGetDeviceCount", count, &env.ndev);
}

cudaError_t
cudaSetDevice(int device)
{
	cudaError_t e = emu_enter();

	if (e)
		return e;
	if (device < 0 || device >= env.ndev)
		return emu_fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d devices", device,
				env.ndev);
	cur_dev = device;
	return cudaSuccess;
}

cudaError_t
cudaGetDevice(int *device)
{
	return get_int("cudaGetDevice", device, &cur_dev);
}

cudaError_t
cudaDriverGetVersion(int *v)
{
	if (v == NULL)
		return cudaErrorInvalidValue;
	*v = 13000;
	return cudaSuccess;
}

cudaError_t
cudaRuntimeGetVersion(int *v)
{
	if (v == NULL)
		return cudaErrorInvalidValue;
	*v = 13000;
	return cudaSuccess;
}

cudaError_t
emu_last_swap(cudaError_t e)
{
	cudaError_t o = last_err;

	last_err = e;
	return o;
}

cudaError_t
cudaGetLastError(void)
{
	cudaError_t e = emu_enter(), l = last_err;

	last_err = cudaSuccess;
	return e ? e : l;
}

cudaError_t
cudaPeekAtLastError(void)
{
	cudaError_t e = emu_enter();

	return e ? e : last_err;
}

typedef struct err_row {
	cudaError_t e;
	const char *name, *text;
} err_row_t;

static const err_row_t errs[] = {
	{cudaSuccess, "cudaSuccess", "no error"},
	{cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
	{cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
	{cudaErrorInitializationError, "cudaErrorInitializationError",
	 "initialization error"},
	{cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
	{cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer",
	 "invalid device pointer"},
	{cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
	 "invalid copy direction for memcpy"},
	{cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
	{cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
	{cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized",
	 "invalid device context"},
	{cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed",
	 "mapping of buffer object failed"},
	{cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
	 "invalid resource handle"},
	{cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
	{cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
	 "an illegal memory access was encountered"},
	{cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
	{cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
	{cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
	{cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

/* The row of e, or NULL. */
static const err_row_t *
err_find(cudaError_t e)
{
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (errs[i].e == e)
			return &errs[i];
	return NULL;
}

const char *
cudaGetErrorName(cudaError_t e)
{
	const err_row_t *r = err_find(e);

	return r ? r->name : "cudaErrorUnknown";
}

const char *
cudaGetErrorString(cudaError_t e)
{
	const err_row_t *r = err_find(e);

	return r ? r->text : "unrecognized error code";
}

/* ---- counters -------------------------------------------------------------- */

void
emu_count_alloc(int dev, int64_t n, int64_t bytes)
{
	atomic_fetch_add(&c_alloc[dev], n);
	atomic_fetch_add(&c_bytes[dev], bytes);
}

void
emu_count(emu_counter_t which, int delta)
{
	atomic_fetch_add(&c_live[which], delta);
}

void
emu_count_pair(int src, int dst, uint64_t bytes)
{
	if (src < 0 || src > REFIT_EMU_HOST)
		src = REFIT_EMU_HOST;
	if (dst < 0 || dst > REFIT_EMU_HOST)
		dst = REFIT_EMU_HOST;
	atomic_fetch_add(&c_pair[src][dst], (int64_t)bytes);
}

EMU_API int
refitEmuGetCounters(refitEmuCounters_t *out)
{
	if (out == NULL)
		return -1;
	memset(out, 0, sizeof(*out));
	out->devices = emu_env() ? env.ndev : 0;
	for (int d = 0; d < REFIT_EMU_MAX_DEVICES; d++) {
		out->alloc_live[d] = atomic_load(&c_alloc[d]);
		out->alloc_bytes_live[d] = atomic_load(&c_bytes[d]);
	}
	out->ipc_open = atomic_load(&c_live[EMU_IPC]);
	out->streams_live = atomic_load(&c_live[EMU_STREAMS]);
	out->comms_live = atomic_load(&c_live[EMU_COMMS]);
	out->ids_unconsumed = atomic_load(&c_live[EMU_IDS]);
	for (int s = 0; s <= REFIT_EMU_HOST; s++)
		for (int d = 0; d <= REFIT_EMU_HOST; d++)
			out->pair_bytes[s][d] = atomic_load(&c_pair[s][d]);
	pthread_mutex_lock(&sticky_mu);
	snprintf(out->sticky, sizeof(out->sticky), "%s", sticky_msg);
	pthread_mutex_unlock(&sticky_mu);
	return 0;
}

static void
json_array(FILE *f, const char *key, const int64_t *v, int n)
{
	fprintf(f, "\"%s\":[", key);
	for (int i = 0; i < n; i++)
		fprintf(f, "%s%lld", i ? "," : "", (long long)v[i]);
	fprintf(f, "],");
}

static void
json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static void
counters_dump(void)
{
	refitEmuCounters_t c;
	char path[300], tmp[310], sub[260];
	FILE *f;
	bool first = true;

	refitEmuGetCounters(&c);
	snprintf(sub, sizeof(sub), "%s/counters", env.dir);
	snprintf(path, sizeof(path), "%s/%d.json", sub, (int)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (mkdirs(sub) != 0 || (f = fopen(tmp, "w")) == NULL) {
		emu_say("cannot write counters to %s: %s", path, strerror(errno));
		return;
	}
	fprintf(f, "{\"pid\":%d,\"host\":", (int)getpid());
	json_string(f, env.host);
	fprintf(f, ",\"devices\":%d,", c.devices);
	json_array(f, "alloc_live", c.alloc_live, c.devices);
	json_array(f, "alloc_bytes_live", c.alloc_bytes_live, c.devices);
	fprintf(f, "\"ipc_open\":%lld,\"streams_live\":%lld,\"comms_live\":%lld,"
		"\"ids_unconsumed\":%lld,\"pair_bytes\":{", (long long)c.ipc_open,
		(long long)c.streams_live, (long long)c.comms_live, (long long)c.ids_unconsumed);
	for (int s = 0; s <= REFIT_EMU_HOST; s++)
		for (int d = 0; d <= REFIT_EMU_HOST; d++) {
			char a[8], b[8];

			if (c.pair_bytes[s][d] == 0)
				continue;
			snprintf(a, sizeof(a), s == REFIT_EMU_HOST ? "h" : "%d", s);
			snprintf(b, sizeof(b), d == REFIT_EMU_HOST ? "h" : "%d", d);
			fprintf(f, "%s\"%s->%s\":%lld", first ? "" : ",", a, b,
				(long long)c.pair_bytes[s][d]);
			first = false;
		}
	fprintf(f, "},\"sticky\":");
	json_string(f, c.sticky);
	fprintf(f, "}\n");
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		emu_say("cannot write counters to %s: %s", path, strerror(errno));
}
