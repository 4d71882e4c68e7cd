/*
 * log.c - see log.h.  Global state here is process-wide configuration set
 * once at start-up; the context is per thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static const char *log_prog = "refit";
static enum log_level log_lvl = LOG_LVL_INFO;
static uint32_t log_mask = LOG_SUB_ALL;
static __thread log_context_t log_ctx = {NULL, -1, 0, 0};

void
log_init(const char *progname, enum log_level level, uint32_t submask)
{
	log_prog = progname;
	log_lvl = level;
	log_mask = submask;
}

int
log_level_parse(const char *s)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};

	for (int i = 0; i < 4; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return -1;
}

void
log_set_context(const log_context_t *ctx)
{
	log_ctx = *ctx;
}

void
log_emit(enum log_level lvl, uint32_t sub, int with_errno, const char *fmt, ...)
{
	static const char *const tag[] = {"error", "warn", "info", "debug"};
	char line[2048];
	size_t n;
	int saved = errno;
	va_list ap;

	if (lvl > log_lvl || (lvl == LOG_LVL_DEBUG && !(sub & log_mask)))
		return;
	n = (size_t)snprintf(line, sizeof(line), "%s: %s:", log_prog, tag[lvl]);
	if (log_ctx.node != NULL && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " node=%s", log_ctx.node);
	if (log_ctx.rank >= 0 && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " rank=%d", log_ctx.rank);
	if (log_ctx.epoch && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " epoch=%llu",
				      (unsigned long long)log_ctx.epoch);
	if (log_ctx.refit_id && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " refit=%llu",
				      (unsigned long long)log_ctx.refit_id);
	if (n < sizeof(line))
		line[n++] = ' ';
	va_start(ap, fmt);
	if (n < sizeof(line))
		n += (size_t)vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	if (with_errno && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, ": %s", strerror(saved));
	if (n >= sizeof(line) - 1)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, n);
	errno = saved;
}
