"""The frameworks' own memory (docs/frameworks.md): Megatron-Core's, vLLM's
and SGLang's real per-rank parameters -- fused, padded, interleaved -- as
pieces of the Hugging Face tensors, registered in place.

The rules live once, in C (plan/framework.c); this module asks librefit for
a map and turns it into what Client.register takes.

    m = refit.frameworks.framework_map("vllm", "config.json", "tp4")
    params = refit.frameworks.allocate(m, ranks=[0, 1])     # name -> array
    lays = refit.frameworks.layouts(m, ranks=range(4), base=8)
    c.register("llama", "infer", lays,
               refit.frameworks.pieces(m, params, base=8), instance="a")

Parameters here are numpy arrays in memory the daemon can map (one segment
per call of allocate); bf16 and fp16 are held as their 16-bit patterns
(uint16), fp8 as uint8.  A framework rank r is global rank base + r.
"""
import ctypes
import json

import numpy as np

from . import _lib
from . import layout as _layout
from . import memory as _memory

_NP = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
       "fp8e4m3": np.uint8, "fp8e5m2": np.uint8, "int32": np.int32, "int64": np.int64,
       "int8": np.int8, "uint8": np.uint8}


def framework_map(framework, model, par, rank=None, quant=None):
    """The map of `model` (an architecture file, a Hugging Face config.json
    path, or a dict of either) under `framework` ("megatron", "vllm",
    "sglang") and parallel spec `par`; rank: one rank's parameters only;
    quant "fp8-block128": an engine's projections in fp8 with their block
    scales (weight_scale_inv parameters)."""
    if isinstance(model, dict):
        model = json.dumps(model)
    out = ctypes.c_void_p()
    err = ctypes.create_string_buffer(_lib.ERRLEN)
    rc = _lib.lib.refit_framework_map(str(framework).encode(), str(model).encode(),
                                      str(par).encode(), (quant or "").encode(),
                                      -1 if rank is None else int(rank),
                                      ctypes.byref(out), err, len(err))
    _lib.check(rc, err.value.decode(errors="replace"))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        _lib.lib.refit_free(out)


def _ranks(m, ranks):
    return [r["rank"] for r in m["ranks"]] if ranks is None else [int(r) for r in ranks]


def _rank_entry(m, rank):
    for r in m["ranks"]:
        if r["rank"] == rank:
            return r
    raise ValueError(f"refit: rank {rank} is not in this {m['framework']} map "
                     f"(world {m['world']})")


def layouts(m, ranks=None, base=0):
    """Explicit layouts of every logical tensor held by `ranks` (framework
    ranks; default all), as global ranks base + r.  A rank's pieces of a
    tensor are numbered in its parameters' order, as pieces() numbers them."""
    boxes = {t["name"]: [] for t in m["tensors"]}
    for r in _ranks(m, ranks):
        for p in _rank_entry(m, r)["params"]:
            for pc in p["pieces"]:
                boxes[pc["tensor"]].append((base + r, pc["offset"], pc["size"]))
    out = []
    for t in m["tensors"]:
        if boxes[t["name"]]:
            lay = _layout.boxes(t["name"], t["dtype"], t["shape"], boxes[t["name"]])
            if "convert" in t:
                lay["convert"] = dict(t["convert"])
            out.append(lay)
    return out


def _placement(m, ranks):
    """[(rank, param, byte offset)] of `ranks`' parameters packed in one
    buffer (each 64-byte aligned) and the buffer's size."""
    plist = [(r, p) for r in _ranks(m, ranks) for p in _rank_entry(m, r)["params"]]
    out, total = [], 0
    for r, p in plist:
        item = np.dtype(_NP[p["dtype"]]).itemsize
        out.append((r, p, total))
        total += (int(np.prod(p["shape"])) * item + 63) // 64 * 64
    return out, max(total, 64)


def _views(m, bufs, ranks):
    out = {}
    for r, p, off in _placement(m, ranks)[0]:
        dt = np.dtype(_NP[p["dtype"]])
        n = int(np.prod(p["shape"]))
        views = tuple(b[off:off + n * dt.itemsize].view(dt).reshape(p["shape"]) for b in bufs)
        out[(r, p["name"])] = views if len(bufs) == 2 else views[0]
    return out


def allocate(m, ranks=None, copies=1):
    """{(rank, param name): array} (copies=2: a pair) for the parameters of
    `ranks`, zero-filled, in one segment the daemon can map."""
    total = _placement(m, ranks)[1]
    segs = _memory.empty([total], "uint8", copies)
    return _views(m, segs if copies == 2 else (segs,), ranks)


def attach(m, bufs, ranks=None):
    """What allocate(m, ranks, len(bufs)) returned, over buffers `bufs` (one
    or two uint8 arrays of its size, e.g. another process's segment mapped
    here): the same arrays at the same offsets."""
    total = _placement(m, ranks)[1]
    if len(bufs) not in (1, 2) or any(b.nbytes < total for b in bufs):
        raise ValueError(f"refit: attach needs 1 or 2 buffers of {total} bytes")
    return _views(m, tuple(bufs), ranks)


def piece_view(param, piece):
    """The view of `param` (an array) a map piece occupies."""
    lead = param.ndim - len(piece["size"])
    idx = tuple(piece["at"][:lead]) + tuple(slice(a, a + s) for a, s in
                                            zip(piece["at"][lead:], piece["size"]))
    return param[idx]


def pieces(m, params, base=0):
    """What Client.register takes for `params` (from allocate): {(tensor,
    global rank, piece): view (or pair)}, pieces numbered as layouts()
    numbers them (the map's order, whatever params holds)."""
    out = {}
    for r in sorted({r for r, _ in params}):
        count = {}
        for p in _rank_entry(m, r)["params"]:
            arr = params.get((r, p["name"]))
            for pc in p["pieces"]:
                k = count.get(pc["tensor"], 0)
                count[pc["tensor"]] = k + 1
                if arr is None:
                    continue
                out[(pc["tensor"], base + r, k)] = (
                    tuple(piece_view(a, pc) for a in arr) if isinstance(arr, tuple)
                    else piece_view(arr, pc))
    return out


def fill(m, params, hf, copy=0):
    """Write Hugging Face tensors (`hf`: name -> array) into `params` as the
    framework holds them (a trainer's starting point, or a reference);
    padding is left as it is."""
    for (r, name), arr in params.items():
        a = arr[copy] if isinstance(arr, tuple) else arr
        p = next(x for x in _rank_entry(m, r)["params"] if x["name"] == name)
        for pc in p["pieces"]:
            src = hf[pc["tensor"]][tuple(slice(o, o + s) for o, s in
                                         zip(pc["offset"], pc["size"]))]
            piece_view(a, pc)[...] = src
