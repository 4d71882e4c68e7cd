"""Memory the node daemon can map: memfds made by refit_shm_create (sealed
against shrinking and growing, passed to the daemon at register time), seen
as numpy arrays or torch CPU tensors.

  empty(shape, dtype, copies=1, torch=False, strides=None)
      a new array (or tensor) in such memory; copies=2 gives the two copies
      a double-buffered inference instance registers (one segment)
  share(t, copies=1)
      a copy of an existing array/tensor in such memory, strides preserved
  find(t) -> (segment name, byte offset)
      where an array/tensor made here lives (register uses it)

A segment lives as long as the process (librefit has no call to free one).
"""
import ctypes
import itertools
import os
import threading

from . import _lib

_segments = []  # (base address, bytes, name)
_lock = threading.Lock()
_counter = itertools.count()

# dtype names of the layouts (README "JSON formats") by numpy / torch name
_NAMES = {"bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16",
          "int32": "int32", "int64": "int64", "float16": "fp16", "bfloat16": "bf16",
          "float32": "fp32", "float64": "fp64", "float8_e4m3fn": "fp8e4m3",
          "float8_e5m2": "fp8e5m2", "half": "fp16", "float": "fp32", "double": "fp64"}


def is_torch(t):
    return type(t).__module__.startswith("torch")


def dtype_name(dtype):
    """The layout dtype name ("bf16", "fp32", ...) of a numpy or torch dtype
    (or a string such as "float32", "torch.bfloat16", "bf16")."""
    s = dtype.__name__ if isinstance(dtype, type) else str(dtype)  # np.int32
    s = s[6:] if s.startswith("torch.") else s
    if s in _NAMES:
        return _NAMES[s]
    if s in _NAMES.values() or s in ("fp8e4m3", "fp8e5m2"):
        return s
    raise ValueError(f"refit: dtype {dtype!r} has no refit name (one of "
                     f"{', '.join(sorted(set(_NAMES.values())))})")


def _torch_dtype(dtype):
    import torch
    if isinstance(dtype, torch.dtype):
        return dtype
    name = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}.get(
        str(dtype), str(dtype).replace("torch.", ""))
    t = getattr(torch, name, None)
    if not isinstance(t, torch.dtype):
        raise ValueError(f"refit: {dtype!r} is no torch dtype")
    return t


def _np_dtype(dtype):
    import numpy as np
    name = {"fp32": "float32", "fp16": "float16", "fp64": "float64"}.get(str(dtype), dtype)
    try:
        return np.dtype(name)
    except TypeError:
        raise ValueError(f"refit: {dtype!r} is no numpy dtype (bf16 needs torch=True)") \
            from None


def segment(nbytes):
    """A new segment of nbytes: (name, base address)."""
    if nbytes <= 0:
        nbytes = 1
    name = f"refit-py-{os.getpid()}-{next(_counter)}"
    ptr = ctypes.c_void_p()
    err = ctypes.create_string_buffer(_lib.ERRLEN)
    rc = _lib.lib.refit_shm_create(name.encode(), nbytes, ctypes.byref(ptr), err, len(err))
    _lib.check(rc, err.value.decode(errors="replace"))
    with _lock:
        _segments.append((ptr.value, nbytes, name))
    return name, ptr.value


def _contiguous_strides(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= max(int(n), 1)
    return list(reversed(st))


def _span(shape, strides):
    """Elements from the first to one past the last (0 for an empty tensor)."""
    if any(int(n) == 0 for n in shape):
        return 0
    return 1 + sum((int(n) - 1) * int(s) for n, s in zip(shape, strides))


def _view(base, nbytes, shape, dtype, strides, offset, torch):
    """An array/tensor of shape and element strides at base + offset."""
    buf = (ctypes.c_uint8 * nbytes).from_address(base)
    if torch:
        import torch as th
        td = _torch_dtype(dtype)
        raw = th.frombuffer(buf, dtype=th.uint8)
        item = th.empty((), dtype=td).element_size()
        if offset % item:
            raise ValueError(f"refit: offset {offset} is not a multiple of {item}")
        flat = raw[:nbytes // item * item].view(td)
        # as_strided's storage offset counts from the segment's start
        return flat.as_strided(tuple(shape), tuple(strides), offset // item)
    import numpy as np
    nd = _np_dtype(dtype)
    return np.ndarray(tuple(shape), dtype=nd, buffer=buf, offset=offset,
                      strides=tuple(int(s) * nd.itemsize for s in strides))


def _itemsize(dtype, torch):
    if torch:
        import torch as th
        return th.empty((), dtype=_torch_dtype(dtype)).element_size()
    return _np_dtype(dtype).itemsize


def empty(shape, dtype, copies=1, torch=False, strides=None):
    """A new numpy array (torch=True: a torch CPU tensor) of shape and dtype in
    memory the daemon can map, element strides as given (default
    contiguous); copies=2 returns a tuple of two such arrays in one segment
    (a double-buffered inference instance registers both)."""
    shape = [int(n) for n in shape]
    strides = _contiguous_strides(shape) if strides is None else [int(s) for s in strides]
    if len(strides) != len(shape) or any(s < 0 for s in strides):
        raise ValueError(f"refit: strides {strides} do not fit shape {shape}")
    if copies not in (1, 2):
        raise ValueError(f"refit: copies must be 1 or 2, not {copies!r}")
    item = _itemsize(dtype, torch)
    one = _span(shape, strides) * item
    one = (one + 63) // 64 * 64  # each copy 64-byte aligned
    name, base = segment(one * copies)
    views = tuple(_view(base, one * copies, shape, dtype, strides, c * one, torch)
                  for c in range(copies))
    return views[0] if copies == 1 else views


def _strides_of(t):
    if is_torch(t):
        return list(t.stride())
    return [s // t.itemsize for s in t.strides]


def share(t, copies=1):
    """A copy of array/tensor t in memory the daemon can map, with t's shape,
    dtype and strides (copies=2: two such copies, both holding t's values)."""
    if is_torch(t) and t.is_cuda:
        raise ValueError("refit: share() is for CPU tensors; CUDA tensors are registered "
                         "by IPC handle as they are")
    st = _strides_of(t)
    if is_torch(t):
        import torch as th
        out = empty(t.shape, t.dtype, copies, True, st)
        for o in (out if copies == 2 else (out,)):
            with th.no_grad():
                o.copy_(t)
    else:
        if any(s * t.itemsize != b for s, b in zip(st, t.strides)):
            raise ValueError(f"refit: strides {t.strides} are not whole elements")
        out = empty(t.shape, t.dtype, copies, False, st)
        for o in (out if copies == 2 else (out,)):
            o[...] = t
    return out


def data_ptr(t):
    return t.data_ptr() if is_torch(t) else t.__array_interface__["data"][0]


def find(t):
    """(segment name, byte offset) of array/tensor t, made by empty()/share();
    ValueError (naming share()) when t lives elsewhere."""
    p = data_ptr(t)
    item = t.element_size() if is_torch(t) else t.itemsize
    extent = _span(t.shape, _strides_of(t)) * item
    with _lock:
        for base, nbytes, name in _segments:
            if base <= p and p + extent <= base + nbytes:
                return name, p - base
    raise ValueError("refit: this tensor is not in memory the daemon can map; make it with "
                     "refit.empty() or copy it once with refit.share()")
