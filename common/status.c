/*
 * status.c - names of the project status codes.
 */
#include "common/status.h"

static const char *const names[REFIT_STATUS_COUNT] = {
	[REFIT_OK] = "OK",
	[REFIT_ERR_INVALID_ARG] = "ERR_INVALID_ARG",
	[REFIT_ERR_NOT_FOUND] = "ERR_NOT_FOUND",
	[REFIT_ERR_EXISTS] = "ERR_EXISTS",
	[REFIT_ERR_NOMEM] = "ERR_NOMEM",
	[REFIT_ERR_SYS] = "ERR_SYS",
	[REFIT_ERR_CUDA] = "ERR_CUDA",
	[REFIT_ERR_NCCL] = "ERR_NCCL",
	[REFIT_ERR_UNAVAILABLE] = "ERR_UNAVAILABLE",
	[REFIT_ERR_REMOTE] = "ERR_REMOTE",
	[REFIT_ERR_TIMEOUT] = "ERR_TIMEOUT",
	[REFIT_ERR_STALE_EPOCH] = "ERR_STALE_EPOCH",
	[REFIT_ERR_ABORTED] = "ERR_ABORTED",
	[REFIT_ERR_UNAUTHENTICATED] = "ERR_UNAUTHENTICATED",
	[REFIT_ERR_LIMIT] = "ERR_LIMIT",
	[REFIT_ERR_INTERNAL] = "ERR_INTERNAL",
};

const char *
refit_status_str(refit_status_t st)
{
	if ((unsigned)st >= REFIT_STATUS_COUNT)
		return "ERR_UNKNOWN";
	return names[st];
}
