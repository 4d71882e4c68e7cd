/*
 * bench_proc.h - what the benchmarks that start refitd processes share: a
 * monotonic clock, a free loopback port, a process's CPU time.  Header-only
 * (static functions): each benchmark is one program.
 */
#ifndef REFIT_BENCH_PROC_H
#define REFIT_BENCH_PROC_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

/* CLOCK_MONOTONIC in seconds (common/clock.h) */
static inline double
now(void)
{
	return clock_mono_s();
}

/* A loopback port nobody listens on now (0 if none could be had). */
static inline int
free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;

	if (fd < 0)
		return 0;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* CPU seconds (user + system) of pid; 0 when it cannot be read */
static inline double
cpu_of(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) != NULL &&
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		ut = st = 0;
	fclose(f);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

#endif
