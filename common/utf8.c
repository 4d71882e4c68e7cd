/*
 * utf8.c - UTF-8 well-formedness (RFC 3629 / Unicode table 3-7).
 */
#include <stdio.h>
#include <string.h>

#include "common/utf8.h"

/* Length of the well-formed character at s (n bytes left), 0 if none. */
static size_t
char_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		unsigned char lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;

		return n >= 3 && s[1] >= lo && s[1] <= hi && (s[2] & 0xc0) == 0x80 ? 3 : 0;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		unsigned char lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;

		return n >= 4 && s[1] >= lo && s[1] <= hi && (s[2] & 0xc0) == 0x80 &&
		       (s[3] & 0xc0) == 0x80 ? 4 : 0;
	}
	return 0;
}

bool
utf8_valid(const char *s, size_t n, size_t *bad)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;

	while (i < n) {
		size_t k = char_len(p + i, n - i);

		if (k == 0) {
			if (bad)
				*bad = i;
			return false;
		}
		i += k;
	}
	return true;
}

void
utf8_cut(char *s)
{
	size_t n = strlen(s), bad;

	if (!utf8_valid(s, n, &bad))
		s[bad] = '\0';
}

void
utf8_vformat(char *buf, size_t n, const char *fmt, va_list ap)
{
	if (n == 0)
		return;
	vsnprintf(buf, n, fmt, ap);
	utf8_cut(buf);
}
