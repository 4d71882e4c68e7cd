/*
 * json_util.c - small strict accessors over cJSON, and file reading (documents,
 * token files).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec/json_util.h"
#include "common/alloc.h"

#define MAX_FILE_BYTES (1ull << 30)

refit_status_t
codec_read_file(const char *path, char **buf, size_t *len, refit_err_t *err)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	char *b;
	size_t n;

	*buf = NULL;
	if (f == NULL)
		return refit_err_set(err, errno == ENOENT ? REFIT_ERR_NOT_FOUND :
				     REFIT_ERR_SYS, "%s: %s", path, strerror(errno));
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size > MAX_FILE_BYTES) {
		fclose(f);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: not a regular file of at most 1 GiB", path);
	}
	b = xmalloc((size_t)st.st_size + 1);
	n = fread(b, 1, (size_t)st.st_size, f);
	if (ferror(f)) {
		fclose(f);
		free(b);
		return refit_err_set(err, REFIT_ERR_SYS, "%s: read failed", path);
	}
	fclose(f);
	b[n] = '\0';
	*buf = b;
	*len = n;
	return REFIT_OK;
}

refit_status_t
codec_read_token(const char *path, char **token, refit_err_t *err)
{
	size_t len;

	CHECK(codec_read_file(path, token, &len, err));
	while (len > 0 && ((*token)[len - 1] == '\n' || (*token)[len - 1] == '\r' ||
			   (*token)[len - 1] == ' '))
		(*token)[--len] = '\0';
	if (len == 0) {
		free(*token);
		*token = NULL;
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: the token file is empty",
				     path);
	}
	return REFIT_OK;
}

refit_status_t
json_check_keys(const cJSON *obj, const char *const *allowed, const char *what,
		refit_err_t *err)
{
	const cJSON *it;

	cJSON_ArrayForEach(it, obj) {
		bool ok = false;

		for (size_t i = 0; allowed[i] && !ok; i++)
			ok = strcmp(it->string, allowed[i]) == 0;
		if (!ok) {
			char list[256] = "";
			size_t n = 0;

			for (size_t i = 0; allowed[i] && n < sizeof(list) - 1; i++)
				n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s",
						      i ? ", " : "", allowed[i]);
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "%s: unknown key \"%s\" (known: %s)",
					     what, it->string, list);
		}
	}
	return REFIT_OK;
}

refit_status_t
json_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out, const char *what,
	 refit_err_t *err)
{
	double d;

	if (!cJSON_IsNumber(v))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: expected an integer", what);
	d = v->valuedouble;
	if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: %g is not an integer from %lld to %lld", what, d,
				     (long long)lo, (long long)hi);
	*out = (int64_t)d;
	return REFIT_OK;
}

refit_status_t
json_num(const cJSON *v, double *out, const char *what, refit_err_t *err)
{
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: expected a number", what);
	*out = v->valuedouble;
	return REFIT_OK;
}

refit_status_t
json_str(const cJSON *v, const char **out, const char *what, refit_err_t *err)
{
	if (!cJSON_IsString(v) || v->valuestring == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: expected a string", what);
	*out = v->valuestring;
	return REFIT_OK;
}

refit_status_t
json_int_array(const cJSON *v, int64_t lo, int64_t hi, int64_t *out, int max,
	       int *n, const char *what, refit_err_t *err)
{
	const cJSON *it;
	int k = 0;

	if (!cJSON_IsArray(v))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: expected an array of integers", what);
	cJSON_ArrayForEach(it, v) {
		char w[160];

		if (k == max)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "%s: more than %d entries", what, max);
		snprintf(w, sizeof(w), "%s[%d]", what, k);
		CHECK(json_int(it, lo, hi, &out[k], w, err));
		k++;
	}
	*n = k;
	return REFIT_OK;
}

refit_status_t
json_parse(const char *text, size_t len, cJSON **out, const char *what,
	   refit_err_t *err)
{
	const char *end = NULL;

	*out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
	if (*out == NULL) {
		size_t off = end && end >= text ? (size_t)(end - text) : 0;
		size_t line = 1;

		for (size_t i = 0; i < off && i < len; i++)
			line += text[i] == '\n';
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "%s: malformed JSON near line %zu (byte %zu)",
				     what, line, off);
	}
	return REFIT_OK;
}
