/*
 * parse.c - numbers and sizes (see parse.h).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <strings.h>

#include "common/parse.h"
#include "common/str.h"

/* The decimal number s starts with (no sign, no blank) into *v, the rest
 * at *end; false when s does not start with a digit or the number
 * overflows. */
static bool
leading_u64(const char *s, unsigned long long *v, char **end)
{
	if (s == NULL || !isdigit((unsigned char)s[0]))
		return false;
	errno = 0;
	*v = strtoull(s, end, 10);
	return errno == 0;
}

refit_status_t
refit_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out,
		const char *what, refit_err_t *err)
{
	char *end;
	unsigned long long v;

	if (!leading_u64(s, &v, &end) || *end != '\0' || v < lo || v > hi)
		goto bad;
	*out = v;
	return REFIT_OK;
bad:
	return refit_err_set(err, REFIT_ERR_INVALID_ARG,
			     "%s: \"%s\" is not a whole number from %" PRIu64 " to %" PRIu64,
			     what, str_nz(s), lo, hi);
}

refit_status_t
refit_parse_size(const char *s, uint64_t *out, const char *what, refit_err_t *err)
{
	static const struct {
		const char *suffix;
		int shift;
	} units[] = {
		{"", 0}, {"B", 0}, {"K", 10}, {"KB", 10}, {"KiB", 10}, {"M", 20},
		{"MB", 20}, {"MiB", 20}, {"G", 30}, {"GB", 30}, {"GiB", 30},
		{"T", 40}, {"TB", 40}, {"TiB", 40},
	};
	char *end;
	unsigned long long v;

	if (!leading_u64(s, &v, &end))
		goto bad;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcasecmp(end, units[i].suffix) == 0) {
			if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
				goto bad;
			*out = (uint64_t)v << units[i].shift;
			return REFIT_OK;
		}
	}
bad:
	return refit_err_set(err, REFIT_ERR_INVALID_ARG,
			     "%s: \"%s\" is not a size (e.g. 4194304, 4M, 4MiB)",
			     what, str_nz(s));
}
