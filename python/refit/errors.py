"""Typed exceptions: one per refit status (common/status.h), each carrying
the status number, its name and the message of the daemon or library."""


class RefitError(Exception):
    """A refit call failed.  .status: the refit status number, .code its name
    ("ERR_TIMEOUT"), .message the text naming the problem."""

    def __init__(self, status, code, message):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


class InvalidArgument(RefitError, ValueError):
    pass


class NotFound(RefitError, LookupError):
    pass


class AlreadyExists(RefitError):
    pass


class SystemFailure(RefitError, OSError):
    pass


class Unavailable(RefitError, ConnectionError):
    pass


class RemoteError(RefitError):
    pass


class Timeout(RefitError, TimeoutError):
    pass


class StaleEpoch(RefitError):
    pass


class Aborted(RefitError):
    pass


class LimitExceeded(RefitError):
    pass


class InternalError(RefitError):
    pass


# the numbers of common/status.h
_BY_STATUS = {1: InvalidArgument, 2: NotFound, 3: AlreadyExists, 4: RefitError,
              5: SystemFailure, 6: RefitError, 7: RefitError, 8: Unavailable, 9: RemoteError,
              10: Timeout, 11: StaleEpoch, 12: Aborted, 13: RefitError, 14: LimitExceeded,
              15: InternalError}


def raise_status(status, code, message):
    raise _BY_STATUS.get(status, RefitError)(status, code, message)
