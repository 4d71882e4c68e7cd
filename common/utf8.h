/*
 * utf8.h - UTF-8 checks for strings at the edges (RPC requests, messages
 * cut to a buffer).
 */
#ifndef REFIT_COMMON_UTF8_H
#define REFIT_COMMON_UTF8_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * Whether s[0..n) is well-formed UTF-8 (no overlong forms, no surrogates,
 * nothing above U+10FFFF); *bad gets the offset of the first bad byte.
 */
bool utf8_valid(const char *s, size_t n, size_t *bad);
/* Cut the NUL-terminated s before its first byte that is not part of a
 * well-formed character (a message truncated mid-character ends cleanly). */
void utf8_cut(char *s);
/* vsnprintf into buf (n bytes), then utf8_cut: a message cut by the buffer
 * ends on a character boundary. */
void utf8_vformat(char *buf, size_t n, const char *fmt, va_list ap);

#endif
