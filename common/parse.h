/*
 * parse.h - parsing of numbers and sizes given on command lines and in
 * config files.  libc only.
 */
#ifndef REFIT_COMMON_PARSE_H
#define REFIT_COMMON_PARSE_H

#include <stdint.h>

#include "common/err.h"

/*
 * A byte size: "4194304", "4M", "4MiB", "4MB" (binary: K/M/G/T = 2^10..2^40;
 * "KB"/"MB" are accepted as the same binary units, as NCCL does).
 */
refit_status_t refit_parse_size(const char *s, uint64_t *out, const char *what,
				refit_err_t *err);
/* A non-negative decimal integer in [lo, hi]. */
refit_status_t refit_parse_u64(const char *s, uint64_t lo, uint64_t hi,
			       uint64_t *out, const char *what, refit_err_t *err);

#endif
