/*
 * strbuf.h - a growable, always NUL-terminated byte string.
 *
 * Used for canonical plan serialisation, JSON and table output.  Caller owns
 * the struct (strbuf_init/strbuf_fini); sb->s is valid after init.
 */
#ifndef REFIT_COMMON_STRBUF_H
#define REFIT_COMMON_STRBUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct strbuf {
	char *s;
	size_t len, cap;
} strbuf_t;

void strbuf_init(strbuf_t *sb);
void strbuf_fini(strbuf_t *sb);
void strbuf_reset(strbuf_t *sb);
void strbuf_add(strbuf_t *sb, const void *data, size_t n);
void strbuf_puts(strbuf_t *sb, const char *s);
void strbuf_printf(strbuf_t *sb, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Append "[a, b, c]" for n int64 values. */
void strbuf_i64_list(strbuf_t *sb, const int64_t *v, int n);
/* Append s as a JSON string literal, quotes included. */
void strbuf_json_str(strbuf_t *sb, const char *s);

#endif
