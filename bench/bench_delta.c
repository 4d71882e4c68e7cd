/*
 * bench_delta.c - the delta codec (dataplane/delta.c): encoded sizes of
 * each format and encode / decode speed, on bf16 boxes whose elements
 * changed independently at the densities bench/delta_density.py measured
 * (docs/performance.md), or on two files (--files BASE NEW, raw bf16, as
 * delta_density.py --dump writes them).
 *
 * Per density: bitmap and runs bytes as a share of the dense bytes, the
 * model's (dp_delta_model_bytes) share, then GB/s of dense bytes: scan +
 * encode of the smallest format (dp_delta_encode_best), decode into
 * another buffer and in place, on one thread's CPU time (best of three).
 * Then the same encode and decode split over THREADS threads (default 2,
 * the cores of the machine the figures come from), on wall time.
 *
 * Usage: bench-delta [--mib N] [--threads T] [--files BASE NEW]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "dataplane/delta.h"

typedef struct job {
	const uint8_t *base, *cur;
	uint8_t *enc, *out;
	uint64_t nbytes, len;
	int decode;
} job_t;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t
next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void *
work(void *arg)
{
	job_t *j = arg;
	dp_delta_fmt_t fmt;

	if (j->decode) {
		if (dp_delta_decode(j->base, j->out, j->nbytes, 2, j->enc, j->len, NULL) != REFIT_OK)
			abort();
		return NULL;
	}
	if (dp_delta_encode_best(j->base, j->cur, j->nbytes, 2, j->enc, DP_DELTA_HDR + j->nbytes,
				 &j->len, &fmt, NULL) != REFIT_OK)
		abort();
	return NULL;
}

/* This thread's CPU seconds: one thread's figures do not depend on what
 * else the machine runs. */
static double
cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Seconds for the box split over t threads (best of 3): this thread's CPU
 * time for one, wall time for more. */
static double
timed(job_t *jobs, int t, const uint8_t *base, const uint8_t *cur, uint8_t *enc,
      uint8_t *out, uint64_t nbytes, int decode)
{
	double best = 1e30;
	uint64_t part = nbytes / 2 / (uint64_t)t * 2;
	pthread_t th[16];

	for (int rep = 0; rep < 3; rep++) {
		double t0 = t == 1 ? cpu_s() : clock_mono_s();

		for (int i = 0; i < t; i++) {
			uint64_t off = part * (uint64_t)i;

			jobs[i].base = base + off;
			jobs[i].cur = cur + off;
			jobs[i].out = out + off;
			jobs[i].enc = enc + (DP_DELTA_HDR + part) * (uint64_t)i + (uint64_t)i * 64;
			jobs[i].nbytes = i == t - 1 ? nbytes - off : part;
			jobs[i].decode = decode;
			if (t == 1)
				work(&jobs[0]);
			else if (pthread_create(&th[i], NULL, work, &jobs[i]) != 0)
				abort();
		}
		for (int i = 0; t > 1 && i < t; i++)
			pthread_join(th[i], NULL);
		t0 = (t == 1 ? cpu_s() : clock_mono_s()) - t0;
		if (t0 < best)
			best = t0;
	}
	return best;
}

static void
row(const char *label, const uint8_t *base, const uint8_t *cur, uint64_t nbytes, int threads)
{
	static job_t jobs[16];
	dp_delta_scan_t sc;
	uint8_t *enc = malloc(nbytes + (uint64_t)threads * (DP_DELTA_HDR + 64));
	uint8_t *out = malloc(nbytes), *inplace = malloc(nbytes);
	double d, enc1, dec1, inp1, encn, decn;

	if (enc == NULL || out == NULL || inplace == NULL ||
	    dp_delta_scan(base, cur, nbytes, 2, &sc, NULL) != REFIT_OK)
		abort();
	d = (double)sc.changed / (double)sc.nelem;
	enc1 = timed(jobs, 1, base, cur, enc, out, nbytes, 0);
	dec1 = timed(jobs, 1, base, cur, enc, out, nbytes, 1);
	if (memcmp(out, cur, nbytes) != 0)
		abort();
	memcpy(inplace, base, nbytes);
	{
		double t0 = cpu_s();

		if (dp_delta_decode(inplace, inplace, nbytes, 2, enc, jobs[0].len, NULL) !=
		    REFIT_OK)
			abort();
		inp1 = cpu_s() - t0;
		if (memcmp(inplace, cur, nbytes) != 0)
			abort();
	}
	encn = timed(jobs, threads, base, cur, enc, out, nbytes, 0);
	decn = timed(jobs, threads, base, cur, enc, out, nbytes, 1);
	printf("%-10s %8.3f %% %8.2f %% %8.2f %% %8.2f %%  %-7s %8.2f %8.2f %8.2f %10.2f %8.2f\n",
	       label, 100.0 * d, 100.0 * (double)sc.size[DP_DELTA_BITMAP] / (double)nbytes,
	       100.0 * (double)sc.size[DP_DELTA_RUNS] / (double)nbytes,
	       100.0 * dp_delta_model_bytes(d, 2) / 2.0, dp_delta_fmt_str(dp_delta_best(&sc)),
	       (double)nbytes / enc1 / 1e9, (double)nbytes / dec1 / 1e9,
	       (double)nbytes / inp1 / 1e9, (double)nbytes / encn / 1e9,
	       (double)nbytes / decn / 1e9);
	free(enc);
	free(out);
	free(inplace);
}

static uint8_t *
slurp(const char *path, uint64_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p;
	long sz;

	if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) <= 0 ||
	    fseek(f, 0, SEEK_SET) != 0 || (p = malloc((size_t)sz)) == NULL ||
	    fread(p, 1, (size_t)sz, f) != (size_t)sz) {
		fprintf(stderr, "bench-delta: cannot read %s\n", path);
		exit(2);
	}
	fclose(f);
	*n = (uint64_t)sz & ~(uint64_t)1;
	return p;
}

int
main(int argc, char **argv)
{
	static const double dens[] = {0.0011, 0.009, 0.03, 0.065, 0.1, 0.3};
	uint64_t nbytes = 64ull << 20, nb2;
	int threads = 2;
	const char *fb = NULL, *fn = NULL;
	uint8_t *base, *cur;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
			nbytes = strtoull(argv[++i], NULL, 10) << 20;
		else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (strcmp(argv[i], "--files") == 0 && i + 2 < argc) {
			fb = argv[++i];
			fn = argv[++i];
		} else {
			fprintf(stderr, "usage: bench-delta [--mib N] [--threads T] "
				"[--files BASE NEW]\n");
			return 2;
		}
	}
	if (threads < 1 || threads > 16 || nbytes == 0) {
		fprintf(stderr, "bench-delta: --threads 1..16, --mib > 0\n");
		return 2;
	}
	{
		double load[1] = {0};

		getloadavg(load, 1);
		printf("delta codec, bf16, %s: GB/s of dense bytes per CPU second of one "
		       "thread (in-place: one run, others best of 3); encode-N, decode-N: wall "
		       "time over %d threads (load average %.1f at the start)\n\n",
		       fb ? "two files" : "independent changes", threads, load[0]);
	}
	printf("%-10s %10s %10s %10s %10s  %-7s %8s %8s %8s %10s %8s\n", "box", "density",
	       "bitmap", "runs", "model", "best", "encode", "decode", "in-place", "encode-N",
	       "decode-N");
	if (fb != NULL) {
		base = slurp(fb, &nbytes);
		cur = slurp(fn, &nb2);
		if (nb2 != nbytes) {
			fprintf(stderr, "bench-delta: %s and %s differ in size\n", fb, fn);
			return 2;
		}
		row("files", base, cur, nbytes, threads);
		return 0;
	}
	base = malloc(nbytes);
	cur = malloc(nbytes);
	for (uint64_t i = 0; i < nbytes; i += 8) {
		uint64_t v = next();

		memcpy(base + i, &v, 8);
	}
	for (size_t k = 0; k < sizeof(dens) / sizeof(dens[0]); k++) {
		char label[32];
		uint64_t thr = (uint64_t)(dens[k] * 18446744073709551616.0);

		memcpy(cur, base, nbytes);
		/* one ulp up: the change of a rounding boundary crossed */
		for (uint64_t i = 0; i < nbytes; i += 2)
			if (next() < thr)
				cur[i] ^= 1;
		snprintf(label, sizeof(label), "%llu MiB", (unsigned long long)(nbytes >> 20));
		row(label, base, cur, nbytes, threads);
	}
	free(base);
	free(cur);
	return 0;
}
