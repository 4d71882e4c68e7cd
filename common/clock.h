/*
 * clock.h - the monotonic clock, in the units callers count in: deadlines
 * in milliseconds, stage timings in microseconds, benchmarks in seconds
 * (and their CPU time, clock_cpu_s).
 * CLOCK_MONOTONIC: never jumps with the wall clock.  libc only.
 */
#ifndef REFIT_COMMON_CLOCK_H
#define REFIT_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t
clock_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t
clock_mono_ms(void)
{
	return clock_mono_us() / 1000;
}

static inline double
clock_mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (every thread), in seconds: benchmarks. */
static inline double
clock_cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
