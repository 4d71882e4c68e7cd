/*
 * json_util.h - strict accessors over cJSON (codec-internal).
 *
 * Each accessor checks the JSON type and range and, on failure, sets an
 * error that names `what` (the path of the field, e.g. `layout "w":
 * shape[2]`).
 */
#ifndef REFIT_CODEC_JSON_UTIL_H
#define REFIT_CODEC_JSON_UTIL_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "codec/json.h"

/* Fail naming the first key of obj not in the NULL-terminated allowed[]. */
refit_status_t json_check_keys(const cJSON *obj, const char *const *allowed,
			       const char *what, refit_err_t *err);
refit_status_t json_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out,
			const char *what, refit_err_t *err);
refit_status_t json_num(const cJSON *v, double *out, const char *what,
			refit_err_t *err);
refit_status_t json_str(const cJSON *v, const char **out, const char *what,
			refit_err_t *err);
refit_status_t json_int_array(const cJSON *v, int64_t lo, int64_t hi,
			      int64_t *out, int max, int *n, const char *what,
			      refit_err_t *err);
/* Parse text (not necessarily NUL-terminated); error gives the line. */
refit_status_t json_parse(const char *text, size_t len, cJSON **out,
			  const char *what, refit_err_t *err);

#endif
