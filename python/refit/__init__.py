"""refit: publish and receive RL model weights through the refit node daemon.

Pure Python over librefit.so (ctypes): found at $REFIT_LIBRARY, else in
the build tree (build/lib/librefit.so), else where the dynamic loader
looks (`make install`).  See docs/python.md.

    import refit
    w = refit.empty((4096, 1024), "float32", torch=True)   # daemon-mappable
    c = refit.Client("/run/refit/refitd.sock")
    c.register("llama", "train", [refit.layout.dtensor("w", dt)], {"w": w})
    c.weights_ready(1)
"""
from . import layout  # noqa: F401
from ._lib import path as library_path  # noqa: F401
from .client import Client, State  # noqa: F401
from .errors import (Aborted, AlreadyExists, InternalError, InvalidArgument,  # noqa: F401
                     LimitExceeded, NotFound, RefitError, RemoteError, StaleEpoch,
                     SystemFailure, Timeout, Unavailable)
from .memory import dtype_name, empty, find, share  # noqa: F401

__version__ = "1.0.0"
