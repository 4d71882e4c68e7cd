/*
 * status.h - the one status enum of the whole project.
 *
 * Every fallible function in refit returns a refit_status_t.  Human-readable
 * detail travels separately in a refit_err_t (see err.h).  The mapping of these
 * codes to gRPC status codes lives in exactly one file of the RPC layer.
 * libc only; no allocation.
 */
#ifndef REFIT_COMMON_STATUS_H
#define REFIT_COMMON_STATUS_H

typedef enum refit_status {
	REFIT_OK = 0,
	REFIT_ERR_INVALID_ARG,   /* bad input from outside: layout, config, RPC */
	REFIT_ERR_NOT_FOUND,     /* named object does not exist */
	REFIT_ERR_EXISTS,        /* named object already exists */
	REFIT_ERR_NOMEM,         /* allocation failed */
	REFIT_ERR_SYS,           /* a system call failed; errno is in the message */
	REFIT_ERR_CUDA,          /* CUDA runtime error */
	REFIT_ERR_NCCL,          /* NCCL error */
	REFIT_ERR_UNAVAILABLE,   /* backend or peer not available */
	REFIT_ERR_REMOTE,        /* the peer reported an error */
	REFIT_ERR_TIMEOUT,       /* a deadline passed */
	REFIT_ERR_STALE_EPOCH,   /* message from an older membership epoch */
	REFIT_ERR_ABORTED,       /* operation aborted on request */
	REFIT_ERR_UNAUTHENTICATED,
	REFIT_ERR_LIMIT,         /* a configured bound would be exceeded */
	REFIT_ERR_INTERNAL,      /* broken invariant: a bug in refit */
	REFIT_ERR_PERMISSION_DENIED, /* authenticated, but acting for someone else */
	REFIT_STATUS_COUNT
} refit_status_t;

/* Static name of a status ("ERR_INVALID_ARG"); never NULL. */
const char *refit_status_str(refit_status_t st);

#endif
