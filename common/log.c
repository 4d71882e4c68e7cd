/*
 * log.c - see log.h.  Global state here is process-wide configuration set
 * once at start-up, and the process's node and epoch; a thread's own
 * context overrides them.
 */
#include <errno.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/str.h"
#include "common/utf8.h"

static const char *log_prog = "refit";
static enum log_level log_lvl = LOG_LVL_INFO;
static uint32_t log_mask = LOG_SUB_ALL;
static __thread log_context_t log_ctx = {NULL, -1, 0, 0};
static char log_node[128];                  /* set before threads log */
static _Atomic uint64_t log_epoch;          /* the process's, any thread */
static atomic_int log_fmt = LOG_FMT_TEXT;   /* set by the loop, read by every thread */

/* This thread's context with the process's node and epoch where it has none. */
static log_context_t
context(void)
{
	log_context_t c = log_ctx;

	if (c.node == NULL && log_node[0])
		c.node = log_node;
	if (c.epoch == 0)
		c.epoch = atomic_load(&log_epoch);
	return c;
}

void
log_set_format(enum log_format fmt)
{
	atomic_store(&log_fmt, (int)fmt);
}

/* s (UTF-8) as a JSON string, quoted, at line + *n */
static void
json_str(char *line, size_t cap, size_t *n, const char *s)
{
	size_t len = strlen(s);

	if (*n < cap)
		line[(*n)++] = '"';
	for (size_t i = 0; i < len && *n + 8 < cap; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\') {
			line[(*n)++] = '\\';
			line[(*n)++] = (char)ch;
		} else if (ch < 0x20) {
			*n += (size_t)snprintf(line + *n, cap - *n, "\\u%04x", ch);
		} else {
			line[(*n)++] = (char)ch;
		}
	}
	if (*n < cap)
		line[(*n)++] = '"';
}

static const char *
sub_name(uint32_t sub)
{
	static const char *const n[] = {"main", "plan", "rpc", "coordinator", "node", "transport"};

	for (int i = 0; i < 6; i++)
		if (sub == 1u << i)
			return n[i];
	return NULL;
}

/* One JSON object for the message msg (already formatted). */
static size_t
json_line(char *line, size_t cap, enum log_level lvl, uint32_t sub, const char *msg)
{
	static const char *const tag[] = {"error", "warn", "info", "debug"};
	log_context_t ctx = context();
	char when[40], word[32];
	const char *rf;
	struct timespec ts;
	struct tm tm;
	size_t n = 0, w = 0;
	unsigned long long refit = ctx.refit_id;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	while (w + 1 < sizeof(word) && (islower((unsigned char)msg[w]) ||
					isdigit((unsigned char)msg[w]) || msg[w] == '_' ||
					msg[w] == '-'))
		w++;
	if (w > 0 && (msg[w] == ':' || msg[w] == ' ') && w + 1 < sizeof(word)) {
		memcpy(word, msg, w);
		word[w] = '\0';
	} else {
		snprintf(word, sizeof(word), "%s", log_prog);
	}
	if (refit == 0 && (rf = strstr(msg, "refit ")) != NULL && isdigit((unsigned char)rf[6]))
		refit = strtoull(rf + 6, NULL, 10);
	n += (size_t)snprintf(line + n, cap - n, "{\"time\":\"%s.%03ldZ\",\"level\":\"%s\","
			      "\"subsystem\":", when, ts.tv_nsec / 1000000, tag[lvl]);
	json_str(line, cap, &n, sub_name(sub) ? sub_name(sub) : word);
	if (n < cap)
		n += (size_t)snprintf(line + n, cap - n, ",\"node\":");
	if (ctx.node)
		json_str(line, cap, &n, ctx.node);
	else if (n < cap)
		n += (size_t)snprintf(line + n, cap - n, "null");
	if (ctx.rank >= 0 && n < cap)
		n += (size_t)snprintf(line + n, cap - n, ",\"rank\":%d", ctx.rank);
	if (n < cap)
		n += (size_t)snprintf(line + n, cap - n, ctx.epoch ? ",\"epoch\":%llu" :
				      ",\"epoch\":null", (unsigned long long)ctx.epoch);
	if (n < cap)
		n += (size_t)snprintf(line + n, cap - n, refit ? ",\"refit\":%llu" :
				      ",\"refit\":null", refit);
	if (n < cap)
		n += (size_t)snprintf(line + n, cap - n, ",\"message\":");
	json_str(line, cap, &n, msg);
	if (n + 2 < cap) {
		line[n++] = '}';
		line[n++] = '\n';
	} else { /* cut: still one object */
		n = (size_t)snprintf(line, cap, "{\"time\":\"%s.%03ldZ\",\"level\":\"%s\","
				     "\"subsystem\":\"%s\",\"node\":null,\"epoch\":null,"
				     "\"refit\":null,\"message\":\"(a log line too long for "
				     "JSON was cut)\"}\n", when, ts.tv_nsec / 1000000, tag[lvl],
				     log_prog);
	}
	return n;
}

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
log_set_refit(uint64_t refit_id)
{
	log_ctx.refit_id = refit_id;
}

void
log_set_node(const char *node)
{
	snprintf(log_node, sizeof(log_node), "%s", str_nz(node));
}

void
log_set_epoch(uint64_t epoch)
{
	atomic_store(&log_epoch, epoch);
}

void
log_emit(enum log_level lvl, uint32_t sub, int with_errno, const char *fmt, ...)
{
	static const char *const tag[] = {"error", "warn", "info", "debug"};
	char line[2048];
	size_t n;
	int saved = errno;
	log_context_t ctx;
	va_list ap;

	if (lvl > log_lvl || (lvl == LOG_LVL_DEBUG && !(sub & log_mask)))
		return;
	if (atomic_load(&log_fmt) == LOG_FMT_JSON) {
		char msg[1800], out[4096];
		size_t bad;

		va_start(ap, fmt);
		n = (size_t)vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		if (with_errno && n < sizeof(msg))
			snprintf(msg + n, sizeof(msg) - n, ": %s", strerror(saved));
		while (!utf8_valid(msg, strlen(msg), &bad))
			msg[bad] = '?'; /* JSON is UTF-8: a stray byte becomes '?' */
		n = json_line(out, sizeof(out), lvl, sub, msg);
		(void)!write(STDERR_FILENO, out, n);
		errno = saved;
		return;
	}
	ctx = context();
	n = (size_t)snprintf(line, sizeof(line), "%s: %s:", log_prog, tag[lvl]);
	if (ctx.node != NULL && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " node=%s", ctx.node);
	if (ctx.rank >= 0 && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " rank=%d", ctx.rank);
	if (ctx.epoch && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " epoch=%llu",
				      (unsigned long long)ctx.epoch);
	if (ctx.refit_id && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " refit=%llu",
				      (unsigned long long)ctx.refit_id);
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
