/*
 * strbuf.c - growable string (see strbuf.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strbuf.h"

void
strbuf_init(strbuf_t *sb)
{
	sb->cap = 64;
	sb->len = 0;
	sb->s = xmalloc(sb->cap);
	sb->s[0] = '\0';
}

void
strbuf_fini(strbuf_t *sb)
{
	free(sb->s);
	sb->s = NULL;
	sb->len = sb->cap = 0;
}

void
strbuf_reset(strbuf_t *sb)
{
	sb->len = 0;
	sb->s[0] = '\0';
}

static void
grow(strbuf_t *sb, size_t extra)
{
	size_t want = sb->len + extra + 1;

	if (want <= sb->cap)
		return;
	while (sb->cap < want)
		sb->cap *= 2;
	sb->s = xrealloc(sb->s, sb->cap);
}

void
strbuf_add(strbuf_t *sb, const void *data, size_t n)
{
	grow(sb, n);
	memcpy(sb->s + sb->len, data, n);
	sb->len += n;
	sb->s[sb->len] = '\0';
}

void
strbuf_puts(strbuf_t *sb, const char *s)
{
	strbuf_add(sb, s, strlen(s));
}

void
strbuf_printf(strbuf_t *sb, const char *fmt, ...)
{
	va_list ap, ap2;
	int n;

	va_start(ap, fmt);
	va_copy(ap2, ap);
	n = vsnprintf(sb->s + sb->len, sb->cap - sb->len, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n >= sb->cap - sb->len) {
		grow(sb, (size_t)n);
		vsnprintf(sb->s + sb->len, sb->cap - sb->len, fmt, ap2);
	}
	va_end(ap2);
	if (n > 0)
		sb->len += (size_t)n;
}

void
strbuf_i64_list(strbuf_t *sb, const int64_t *v, int n)
{
	strbuf_add(sb, "[", 1);
	for (int i = 0; i < n; i++)
		strbuf_printf(sb, i ? ", %lld" : "%lld", (long long)v[i]);
	strbuf_add(sb, "]", 1);
}

void
strbuf_json_str(strbuf_t *sb, const char *s)
{
	strbuf_add(sb, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			strbuf_add(sb, "\\", 1);
			strbuf_add(sb, s, 1);
		} else if (c < 0x20) {
			strbuf_printf(sb, "\\u%04x", c);
		} else {
			strbuf_add(sb, s, 1);
		}
	}
	strbuf_add(sb, "\"", 1);
}
