"""Loading librefit.so and its C types (client/refit.h)."""
import ctypes
import ctypes.util
import os

from ._libdir import LIBDIR
from .errors import raise_status

# client/refit.h
ROLE_TRAIN, ROLE_INFER = 1, 2
INSTALL_DOUBLE_BUFFER, INSTALL_IN_PLACE = 0, 1
ERRLEN = 1024


class Mem(ctypes.Structure):
    """refit_mem_t"""
    _fields_ = [("tensor", ctypes.c_char_p), ("rank", ctypes.c_int32),
                ("piece", ctypes.c_int32), ("shm_name", ctypes.c_char_p),
                ("offset", ctypes.c_uint64 * 2), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("cuda_ipc", ctypes.c_void_p), ("cuda_ipc_len", ctypes.c_size_t),
                ("cuda_bytes", ctypes.c_uint64), ("has_cuda_device", ctypes.c_int),
                ("cuda_device", ctypes.c_int32), ("cuda_uuid", ctypes.c_char_p)]


class Registration(ctypes.Structure):
    """refit_registration_t"""
    _fields_ = [("model", ctypes.c_char_p), ("role", ctypes.c_int),
                ("instance", ctypes.c_char_p), ("install", ctypes.c_int),
                ("layouts_json", ctypes.c_char_p), ("mem", ctypes.POINTER(Mem)),
                ("nmem", ctypes.c_size_t)]


class State(ctypes.Structure):
    """refit_state_t"""
    _fields_ = [("version", ctypes.c_uint64), ("active", ctypes.c_uint32),
                ("valid", ctypes.c_int), ("reading", ctypes.c_int),
                ("failure", ctypes.c_char * 512)]


def _candidates():
    env = os.environ.get("REFIT_LIBRARY")
    if env:
        return [env]  # said explicitly: nothing else is tried
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(LIBDIR, "librefit.so.1")] if LIBDIR else []  # make install
    # a built tree: python/refit/ -> build/lib/librefit.so
    for build in (os.environ.get("REFIT_BUILD"), "build"):
        if build:
            out.append(os.path.join(here, "..", "..", build, "lib", "librefit.so"))
    out += ["librefit.so.1", "librefit.so"]  # the dynamic loader's search path
    found = ctypes.util.find_library("refit")
    if found:
        out.append(found)
    for prefix in ("/usr/local/lib", "/usr/lib"):
        out.append(os.path.join(prefix, "librefit.so.1"))
    return out


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("refit: librefit.so not found (build it with `make`, install it with "
                      "`make install`, or set REFIT_LIBRARY); tried: " + "; ".join(tried))


lib, path = _load()

_c = ctypes
_H = _c.c_void_p
for name, res, args in [
        ("refit_open", _c.c_int, [_c.c_char_p, _c.c_int, _c.POINTER(_H), _c.c_char_p,
                                  _c.c_size_t]),
        ("refit_close", None, [_H]),
        ("refit_errmsg", _c.c_char_p, [_H]),
        ("refit_status_name", _c.c_char_p, [_c.c_int]),
        ("refit_node_info", _c.c_int, [_H, _c.POINTER(_c.c_char_p),
                                       _c.POINTER(_c.POINTER(_c.c_int32)),
                                       _c.POINTER(_c.c_size_t)]),
        ("refit_register", _c.c_int, [_H, _c.POINTER(Registration), _c.POINTER(_c.c_uint64)]),
        ("refit_unregister", _c.c_int, [_H, _c.c_uint64]),
        ("refit_weights_ready", _c.c_int, [_H, _c.c_uint64, _c.c_uint64, _c.c_int]),
        ("refit_weights_ready_cuda", _c.c_int, [_H, _c.c_uint64, _c.c_uint64, _c.c_void_p,
                                                _c.c_size_t, _c.c_int]),
        ("refit_begin_write", _c.c_int, [_H, _c.c_uint64, _c.c_int]),
        ("refit_wait_version", _c.c_int, [_H, _c.c_uint64, _c.c_uint64, _c.c_int,
                                          _c.POINTER(State)]),
        ("refit_get_state", _c.c_int, [_H, _c.c_uint64, _c.POINTER(State)]),
        ("refit_serve", _c.c_int, [_H, _c.c_uint64, _c.c_uint64]),
        ("refit_describe", _c.c_int, [_H, _c.c_uint64, _c.c_char_p, _c.c_char_p,
                                      _c.c_char_p]),
        ("refit_wait_installed", _c.c_int, [_H, _c.c_uint64, _c.c_uint64, _c.c_int,
                                            _c.POINTER(State)]),
        ("refit_shm_create", _c.c_int, [_c.c_char_p, _c.c_uint64, _c.POINTER(_c.c_void_p),
                                        _c.c_char_p, _c.c_size_t]),
        ("refit_framework_map", _c.c_int, [_c.c_char_p, _c.c_char_p, _c.c_char_p,
                                           _c.c_char_p, _c.c_int, _c.POINTER(_c.c_void_p),
                                           _c.c_char_p, _c.c_size_t]),
        ("refit_free", None, [_c.c_void_p])]:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = res, args


def status_name(rc):
    return lib.refit_status_name(rc).decode()


def check(rc, message):
    """Raise the typed exception of status rc (not REFIT_OK) with message."""
    if rc != 0:
        raise_status(rc, status_name(rc), message)
