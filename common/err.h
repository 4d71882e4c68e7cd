/*
 * err.h - error detail that travels with a refit_status_t.
 *
 * A refit_err_t is caller-owned storage for one message.  Functions that can
 * fail take a `refit_err_t *err` (may be NULL) and fill it with a message that
 * names the operation and quotes the bad value.  The first error set is kept:
 * later refit_err_set calls on an already-set error only return their status,
 * so cleanup paths cannot overwrite the root cause.  CHECK/CHECK_GOTO give
 * the one-cleanup-label pattern.
 */
#ifndef REFIT_COMMON_ERR_H
#define REFIT_COMMON_ERR_H

#include <stdarg.h>
#include "common/status.h"

#define REFIT_ERR_MSG_MAX 512

typedef struct refit_err {
	refit_status_t status;
	char msg[REFIT_ERR_MSG_MAX];
} refit_err_t;

/* Reset to "no error". */
void refit_err_clear(refit_err_t *err);

/*
 * Record `st` with a printf-style message unless err already holds an error.
 * Returns st, so `return refit_err_set(err, REFIT_ERR_INVALID_ARG, ...)`.
 */
refit_status_t refit_err_set(refit_err_t *err, refit_status_t st,
			     const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
refit_status_t refit_err_vset(refit_err_t *err, refit_status_t st,
			      const char *fmt, va_list ap);

/*
 * Prefix the message already in err with "prefix: " (context added on the
 * way up, e.g. the file name).  No-op when err is NULL or clear.
 */
void refit_err_prefix(refit_err_t *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define CHECK(call)                                                        \
	do {                                                               \
		refit_status_t check_rc_ = (call);                          \
		if (check_rc_ != REFIT_OK)                                  \
			return check_rc_;                                   \
	} while (0)

#define CHECK_GOTO(call, rc, label)                                        \
	do {                                                               \
		(rc) = (call);                                              \
		if ((rc) != REFIT_OK)                                       \
			goto label;                                         \
	} while (0)

#endif
