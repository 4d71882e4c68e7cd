/*
 * err.c - first-error-wins message buffer.
 */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/utf8.h"

void
refit_err_clear(refit_err_t *err)
{
	if (err == NULL)
		return;
	err->status = REFIT_OK;
	err->msg[0] = '\0';
}

refit_status_t
refit_err_vset(refit_err_t *err, refit_status_t st, const char *fmt, va_list ap)
{
	if (err == NULL || err->status != REFIT_OK)
		return st;
	err->status = st;
	utf8_vformat(err->msg, sizeof(err->msg), fmt, ap);
	return st;
}

refit_status_t
refit_err_set(refit_err_t *err, refit_status_t st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	refit_err_vset(err, st, fmt, ap);
	va_end(ap);
	return st;
}

void
refit_err_prefix(refit_err_t *err, const char *fmt, ...)
{
	char pre[REFIT_ERR_MSG_MAX], old[REFIT_ERR_MSG_MAX];
	va_list ap;

	if (err == NULL || err->status == REFIT_OK)
		return;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	/* "pre: old", truncated to the buffer */
	size_t n = strlen(pre), room = sizeof(err->msg) - 1;

	if (n > room)
		n = room;
	memcpy(err->msg, pre, n);
	for (const char *s = ": "; *s && n < room; s++)
		err->msg[n++] = *s;
	for (const char *s = old; *s && n < room; s++)
		err->msg[n++] = *s;
	err->msg[n] = '\0';
	utf8_cut(err->msg);
}
