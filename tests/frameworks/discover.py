#!/usr/bin/env python3
"""Discover an inference engine's map from its own loader, for model classes
no rule table of refit covers.

    build/venv-vllm/bin/python tests/frameworks/discover.py --framework vllm \\
        --config DIR_OR_CONFIG_JSON --tp N [--ep] [--dp M] --out MAP.json
    build/venv-sglang/bin/python tests/frameworks/discover.py --framework sglang \\
        --config DIR_OR_CONFIG_JSON --tp N [--ep] [--dp M] --out MAP.json

The engine side is the loader dry-run of tests/frameworks/ (test_vllm.py:
one forked process per TP rank in a real gloo world; test_sglang.py: one
process, the parallel groups stated as plain objects): the engine builds
its own model class on CPU and streams index-encoded Hugging Face tensors
through its own load_weights, so that every element of every parameter
tells which logical tensor and which flat index it holds ({param: (tid,
idx)}, fwmap.py).  derive_map() turns those arrays into a map in refit's
format (docs/frameworks.md, "The map"):

  * each parameter is cut into boxes, greedily in row-major order: from the
    first element not yet placed, a box grows along the last dim as far as
    the element's tensor continues there (same tensor, consecutive
    tensor coordinates), then along each dim before it, while the whole
    cross-section still continues (binary search on the extent).  A tensor
    with k < ndim dims sits in the parameter's trailing k dims, at one index
    of each leading dim (stacked experts): its boxes never grow along the
    leading dims.  Elements no tensor feeds become padding boxes the same
    way.  A parameter that is a concatenation of slices of a few tensors
    along one dim (qkv_proj, gate_up_proj, a vocabulary shard plus its
    padding, w13 per expert) comes out as one box per slice;
  * the pieces are expanded again and compared with the observed arrays
    element for element (LayoutError when they differ);
  * refused, naming the parameter (LayoutError): a tensor id or index out
    of range, a tensor with more dims than the parameter holding it
    (a flattened or reshaped view), more than max_pieces boxes in one
    parameter (a transposed or interleaved layout: technically boxes of one
    element or one row, useless to a planner), and one rank holding an
    element of a tensor twice (refit's coordinator refuses such a layout:
    a rank holds each element once).

The map lists only the tensors some rank holds, in the order the ranks
first use them; tensor dtypes are those of the parameters holding them
(the engine's dtype, as refit's own maps say).  check_map() names what the
registration of the map's layouts would refuse (a rank holding an element
twice; an instance leaving elements of a tensor uncovered), and the command
line prints, as warnings, checkpoint tensors no rank holds and parameters
no tensor feeds.

The command line reads the checkpoint's tensor names and shapes from the
*.safetensors headers of DIR, or (a config.json alone) from the checkpoint
transformers' own model class saves for the config (built on CPU: tiny
configs only; every tensor must have fewer than 2^24 elements, the
index encoding is float32).  --dp M: vLLM replicas are identical (one TP
world is run, its ranks copied to every instance); SGLang runs every rank.

Exit 0 with the map written, 1 when the layout cannot be expressed (the
message names the parameter), 2 when the engine cannot be imported or
cannot build or load the model.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import fwmap  # noqa: E402

MAX_PIECES = 4096          # boxes one parameter may be cut into (per rank)


class LayoutError(ValueError):
    """The observed layout cannot be expressed as a map."""


_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float": "fp32", "f32": "fp32",
           "float16": "fp16", "half": "fp16", "f16": "fp16", "float64": "fp64",
           "double": "fp64", "f64": "fp64", "float8_e4m3fn": "fp8e4m3",
           "f8_e4m3": "fp8e4m3", "float8_e5m2": "fp8e5m2", "f8_e5m2": "fp8e5m2",
           "int8": "int8", "i8": "int8", "uint8": "uint8", "u8": "uint8",
           "int16": "int16", "i16": "int16", "int32": "int32", "i32": "int32",
           "int64": "int64", "i64": "int64", "bool": "bool"}


def norm_dtype(s):
    """A dtype as refit spells it (bf16, fp32, ...), from torch's or
    safetensors' spelling."""
    s = str(s).lower().replace("torch.", "")
    return _DTYPES.get(s, s)


# ---------------------------------------------------------------- decomposition

def _strides(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= int(n)
    return list(reversed(st))


def decompose(tid, idx, shapes, name="parameter", max_pieces=MAX_PIECES):
    """One parameter's observed (tid, idx) arrays -> (pieces, padding):
    pieces [(tensor id, offset, size, at)], padding [(at, size)], in
    row-major order of their first element.  tid < 0: written by no
    tensor.  Raises LayoutError (see the module docstring)."""
    tid = np.asarray(tid, dtype=np.int64)
    idx = np.asarray(idx, dtype=np.int64)
    if tid.shape != idx.shape:
        raise LayoutError("%s: tid shape %s and idx shape %s differ" %
                          (name, tid.shape, idx.shape))
    P = tuple(int(x) for x in tid.shape)
    n = len(P)
    shapes = [tuple(int(x) for x in s) for s in shapes]
    if tid.size and int(tid.max()) >= len(shapes):
        w = tuple(int(x) for x in np.argwhere(tid >= len(shapes))[0])
        raise LayoutError("%s%s: tensor id %d, but only %d tensors are known" %
                          (name, list(w), int(tid[w]), len(shapes)))
    numel = np.array([int(np.prod(s)) for s in shapes] + [0], dtype=np.int64)
    held = tid >= 0
    bad = held & ((idx < 0) | (idx >= numel[np.where(held, tid, -1)]))
    if bad.any():
        w = tuple(int(x) for x in np.argwhere(bad)[0])
        raise LayoutError("%s%s: index %d is outside tensor %d (%d elements)" %
                          (name, list(w), int(idx[w]), int(tid[w]), numel[int(tid[w])]))

    free = np.ones(P, dtype=bool)
    flat_free = free.reshape(-1)
    N = int(tid.size)
    pieces, padding = [], []
    cursor = 0
    while True:
        # the next element no box holds yet: every one before it is placed
        # (boxes are found in row-major order of their first element)
        step = 4096
        while cursor < N:
            chunk = flat_free[cursor:cursor + step]
            k = int(chunk.argmax())
            if chunk[k]:
                cursor += k
                break
            cursor += len(chunk)
            step = min(step * 4, 1 << 20)
        if cursor >= N:
            break
        p0 = tuple(int(x) for x in np.unravel_index(cursor, P)) if n else ()
        t = int(tid[p0])
        size = [1] * n
        if t < 0:
            def ok(sl, lo, hi):
                return bool(((tid[sl] < 0) & free[sl]).all())
            limits = [P[d] - p0[d] for d in range(n)]
            grow_dims = range(n - 1, -1, -1)
        else:
            S = shapes[t]
            lead = n - len(S)
            if lead < 0:
                raise LayoutError(
                    "%s %s: holds tensor %d of shape %s, which has more dims than "
                    "the parameter (a flattened or reshaped view cannot be a box)" %
                    (name, list(P), t, list(S)))
            c0 = [int(x) for x in np.unravel_index(int(idx[p0]), S)] if S else []
            st = _strides(S)
            i0 = int(idx[p0])

            def ok(sl, lo, hi, t=t, lead=lead, st=st, i0=i0):
                exp = np.full([h - l for l, h in zip(lo, hi)], i0, dtype=np.int64)
                for d in range(lead, n):
                    r = (np.arange(lo[d], hi[d], dtype=np.int64) - p0[d]) * st[d - lead]
                    shp = [1] * n
                    shp[d] = hi[d] - lo[d]
                    exp = exp + r.reshape(shp)
                return bool(((tid[sl] == t) & (idx[sl] == exp) & free[sl]).all())
            limits = [1] * lead + [min(P[d] - p0[d], S[d - lead] - c0[d - lead])
                                   for d in range(lead, n)]
            grow_dims = range(n - 1, lead - 1, -1)
        for d in grow_dims:
            size[d] = _grow(ok, p0, size, d, limits[d])
        sl = tuple(slice(a, a + s) for a, s in zip(p0, size))
        free[sl] = False
        if t < 0:
            padding.append((list(p0), list(size)))
        else:
            pieces.append((t, c0, size[lead:], list(p0)))
        if len(pieces) + len(padding) > max_pieces:
            raise LayoutError(
                "%s %s: more than %d boxes (at %s: tensor %d; the layout is "
                "not a concatenation of slices: transposed, interleaved or "
                "permuted elements)" % (name, list(P), max_pieces, list(p0), t))
    _verify(tid, idx, shapes, pieces, padding, name)
    return pieces, padding


def _grow(ok, p0, size, d, limit):
    """Largest extent e <= limit of dim d such that the box p0 + size (with
    size[d] = e) passes ok; size[d] is 1 and valid on entry.  Galloping,
    then binary search on the slab past the current extent (monotone: a
    slab that passes has every shorter one pass)."""
    n = len(p0)

    def slab_ok(a, b):      # extents [a, b) of dim d
        lo = [p0[i] if i != d else p0[d] + a for i in range(n)]
        hi = [p0[i] + size[i] if i != d else p0[d] + b for i in range(n)]
        return ok(tuple(slice(l, h) for l, h in zip(lo, hi)), lo, hi)

    good, step = 1, 1
    while good < limit:
        nxt = min(limit, good + step)
        if not slab_ok(good, nxt):
            break
        good, step = nxt, step * 2
    else:
        return good
    hi = min(limit, good + step)      # [good, hi) fails as a whole
    while hi - good > 1:
        mid = (good + hi) // 2
        if slab_ok(good, mid):
            good = mid
        else:
            hi = mid
    return good


def expand(P, pieces, padding, shapes):
    """Pieces and padding -> (tid, idx) of shape P (tid -1: padding, -2:
    in no box).  Raises LayoutError on overlapping boxes."""
    tid = np.full(P, -2, dtype=np.int64)
    idx = np.full(P, -1, dtype=np.int64)
    for t, off, size, at in pieces:
        lead = len(P) - len(size)
        full = [1] * lead + list(size)
        sl = tuple(slice(a, a + s) for a, s in zip(at, full))
        if (tid[sl] != -2).any():
            raise LayoutError("piece of tensor %d at %s overlaps another box" % (t, at))
        tid[sl] = t
        idx[sl] = fwmap._box_index(shapes[t], off, size).reshape(full)
    for at, size in padding:
        sl = tuple(slice(a, a + s) for a, s in zip(at, size))
        if (tid[sl] != -2).any():
            raise LayoutError("padding at %s overlaps another box" % (at,))
        tid[sl] = -1
    return tid, idx


def _verify(tid, idx, shapes, pieces, padding, name):
    et, ei = expand(tid.shape, pieces, padding, shapes)
    diff = (et == -2) | ((et < 0) != (tid < 0)) | ((tid >= 0) & ((et != tid) | (ei != idx)))
    if diff.any():
        w = tuple(int(x) for x in np.argwhere(diff)[0])
        raise LayoutError("%s%s: the boxes give tensor %d[%d], the engine holds %d[%d] "
                          "(%d elements differ)" % (name, list(w), int(et[w]), int(ei[w]),
                                                    int(tid[w]), int(idx[w]), int(diff.sum())))


# ---------------------------------------------------------------- the map

def _tensor_list(tensors):
    """[(name, shape, dtype or None)] from (name, shape[, dtype]) tuples or
    {"name", "shape"[, "dtype"]} dicts."""
    out = []
    for t in tensors:
        if isinstance(t, dict):
            out.append((t["name"], tuple(int(x) for x in t["shape"]), t.get("dtype")))
        else:
            out.append((t[0], tuple(int(x) for x in t[1]), t[2] if len(t) > 2 else None))
    return out


def derive_map(observed_by_rank, tensors, framework, model, par, dtypes=None,
               dtype="bf16", max_pieces=MAX_PIECES, allow_duplicates=False):
    """A map in refit's format (docs/frameworks.md) from what an engine's
    loader wrote.

    observed_by_rank: {rank: {param: (tid, idx)}} (or a list by rank),
      parameters in the engine's order; tid indexes `tensors`, -1 where no
      tensor landed.
    tensors: the checkpoint's tensors by id: (name, shape[, dtype]) or dicts
      (their dtype is not used: the map gives a tensor its holders' dtype).
    dtypes: parameter dtypes, {param: dtype} or {rank: {param: dtype}}
      (torch or refit spelling); parameters missing there get `dtype`.  A
      tensor's dtype is that of the first parameter holding it.
    Raises LayoutError naming the parameter when a layout is not a set of
    boxes (module docstring), or when a rank holds an element of a tensor
    twice (unless allow_duplicates)."""
    if isinstance(observed_by_rank, (list, tuple)):
        observed_by_rank = dict(enumerate(observed_by_rank))
    ranks = sorted(int(r) for r in observed_by_rank)
    if ranks != list(range(len(ranks))):
        raise LayoutError("ranks %s: expected 0..%d" % (ranks, len(ranks) - 1))
    tl = _tensor_list(tensors)
    shapes = [s for _, s, _ in tl]
    dtypes = dtypes or {}
    per_rank = bool(dtypes) and all(isinstance(v, dict) for v in dtypes.values())

    def pdtype(r, p):
        v = (dtypes.get(r, {}) if per_rank else dtypes).get(p)
        return norm_dtype(v if v is not None else dtype)

    used, order = {}, []           # tensor id -> dtype, first-use order
    rank_entries = []
    for r in ranks:
        params = []
        counts = {}                # tensor id -> int8 array: times rank r holds it
        for pname, (tid, idx) in observed_by_rank[r].items():
            label = "rank %d %s" % (r, pname)
            pieces, padding = decompose(tid, idx, shapes, label, max_pieces)
            pd = pdtype(r, pname)
            ent = {"name": pname, "dtype": pd, "shape": [int(x) for x in np.shape(tid)],
                   "pieces": [], "padding": []}
            for t, off, size, at in pieces:
                if t not in used:
                    used[t] = pd
                    order.append(t)
                ent["pieces"].append({"tensor": tl[t][0], "offset": [int(x) for x in off],
                                      "size": [int(x) for x in size],
                                      "at": [int(x) for x in at]})
                if not allow_duplicates:
                    c = counts.setdefault(t, np.zeros(shapes[t], dtype=np.int8))
                    sl = tuple(slice(o, o + s) for o, s in zip(off, size))
                    c[sl] += 1
                    if (c[sl] > 1).any():
                        w = [int(o + x) for o, x in zip(off, np.argwhere(c[sl] > 1)[0])]
                        raise LayoutError(
                            "rank %d holds element %s of %s twice (again in %s at %s): "
                            "refit's coordinator refuses a layout in which a rank holds "
                            "an element twice" % (r, w, tl[t][0], pname, list(at)))
            ent["padding"] = [{"at": [int(x) for x in a], "size": [int(x) for x in s]}
                              for a, s in padding]
            params.append(ent)
        rank_entries.append({"rank": r, "params": params})
    return {"framework": framework, "model": model, "par": par, "world": len(ranks),
            "fp8_block": 0,
            "tensors": [{"name": tl[t][0], "dtype": used[t], "shape": list(shapes[t])}
                        for t in order],
            "ranks": rank_entries}


def unused_tensors(m, tensors):
    """Names of checkpoint tensors no rank of map m holds."""
    have = {t["name"] for t in m["tensors"]}
    return [n for n, _, _ in _tensor_list(tensors) if n not in have]


def _par_tp(par):
    d = {}
    for f in str(par).split(","):
        if f[:2] in ("tp", "dp", "ep", "pp") and f[2:].isdigit():
            d[f[:2]] = int(f[2:])
    return d.get("tp")


def check_map(m):
    """What registering the map's layouts would refuse: a rank holding an
    element of a tensor twice, an instance (tp consecutive ranks, tp from
    "par"; else the whole world) leaving elements of a tensor uncovered, a
    piece outside its tensor or its parameter.  Returns error strings."""
    errs = []
    shapes = {t["name"]: tuple(t["shape"]) for t in m["tensors"]}
    world = len(m["ranks"])
    tp = _par_tp(m.get("par")) or world
    if world % tp:
        tp = world
    for inst in range(world // tp):
        cover = {n: np.zeros(s, dtype=np.int32) for n, s in shapes.items()}
        for re_ in m["ranks"][inst * tp:(inst + 1) * tp]:
            mine = {n: np.zeros(s, dtype=np.int8) for n, s in shapes.items()}
            for p in re_["params"]:
                for pc in p["pieces"]:
                    n = pc["tensor"]
                    if n not in shapes:
                        errs.append("rank %d %s: piece of %s, not in the map's tensors" %
                                    (re_["rank"], p["name"], n))
                        continue
                    off, size = pc["offset"], pc["size"]
                    if len(off) != len(shapes[n]) or any(
                            o < 0 or s < 0 or o + s > d for o, s, d in zip(off, size, shapes[n])):
                        errs.append("rank %d %s: piece %s+%s is outside %s %s" % (
                            re_["rank"], p["name"], off, size, n, list(shapes[n])))
                        continue
                    lead = len(p["shape"]) - len(size)
                    if lead < 0 or any(a < 0 or a + s > d for a, s, d in zip(
                            pc["at"], [1] * lead + list(size), p["shape"])):
                        errs.append("rank %d %s: piece of %s at %s is outside the "
                                    "parameter %s" % (re_["rank"], p["name"], n, pc["at"],
                                                      p["shape"]))
                        continue
                    sl = tuple(slice(o, o + s) for o, s in zip(off, size))
                    mine[n][sl] += 1
                    cover[n][sl] += 1
            for n, c in mine.items():
                if (c > 1).any():
                    errs.append("rank %d holds element %s of %s twice" % (
                        re_["rank"], [int(x) for x in np.argwhere(c > 1)[0]], n))
        for n, c in cover.items():
            if not c.all():
                errs.append("instance %d (ranks %d..%d): %d of %d elements of %s held by "
                            "no rank, e.g. %s" % (inst, inst * tp, inst * tp + tp - 1,
                                                  int((c == 0).sum()), c.size, n,
                                                  [int(x) for x in np.argwhere(c == 0)[0]]))
    return errs


def layout_file(m):
    """The map's layouts in layout-file JSON (explicit "shards" form): per
    tensor, the boxes {rank, offset, size} of all ranks in map order."""
    boxes = {t["name"]: [] for t in m["tensors"]}
    for re_ in m["ranks"]:
        for p in re_["params"]:
            for pc in p["pieces"]:
                boxes[pc["tensor"]].append({"rank": re_["rank"], "offset": list(pc["offset"]),
                                            "size": list(pc["size"])})
    return {"tensors": [{"name": t["name"], "dtype": t["dtype"], "shape": list(t["shape"]),
                         "shards": boxes[t["name"]]} for t in m["tensors"]]}


def summary(m):
    """A few numbers about a map: pieces and padding boxes per rank."""
    npc = [sum(len(p["pieces"]) for p in r["params"]) for r in m["ranks"]]
    npd = [sum(len(p["padding"]) for p in r["params"]) for r in m["ranks"]]
    npar = [len(r["params"]) for r in m["ranks"]]
    return "%d ranks, %d tensors, params per rank %s, pieces per rank %s, padding boxes %s" % (
        len(m["ranks"]), len(m["tensors"]), sorted(set(npar)), sorted(set(npc)), sorted(set(npd)))


# ---------------------------------------------------------------- checkpoint

MAX_ELEMS = 1 << 24


def checkpoint_tensors(model_dir, workdir, label=None):
    """[(name, shape, dtype)] of the checkpoint: the *.safetensors headers
    of model_dir, or (none there) the checkpoint transformers' own model
    class saves for model_dir/config.json (under workdir)."""
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    src = model_dir
    if not files:
        import copy
        import torch
        import transformers
        cfg = transformers.AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            meta = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg))
        big = [(k, tuple(v.shape)) for k, v in meta.state_dict().items()
               if v.numel() >= MAX_ELEMS]
        total = sum(v.numel() for v in meta.state_dict().values())
        del meta
        if big or total > (1 << 28):
            raise RuntimeError(
                "%s: too big for the loader dry-run (its indices are float32: each "
                "tensor below 2^24 elements; %d elements in all): e.g. %s; shrink the "
                "config (layers, hidden size, experts, vocabulary) keeping what shapes "
                "the layout" % (label or model_dir, total, big[:2]))
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg),
                                                              dtype=torch.float32)
        src = os.path.join(workdir, "hf")
        model.save_pretrained(src)
        del model
        files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    out = []
    for fn in files:
        with open(os.path.join(src, fn), "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
            head = json.loads(f.read(hlen))
        for k, v in head.items():
            if k != "__metadata__":
                out.append((k, tuple(int(x) for x in v["shape"]), norm_dtype(v["dtype"])))
    out.sort()
    for k, s, _ in out:
        if int(np.prod(s)) >= MAX_ELEMS:
            raise RuntimeError("%s %s: %d elements, at most 2^24 - 1 for the dry-run's "
                               "float32 index encoding" % (k, list(s), int(np.prod(s))))
    return out


def model_dir_of(config, workdir):
    """A directory with config.json for the engine: config itself when a
    directory, else a copy of the file in workdir/model."""
    if os.path.isdir(config):
        if not os.path.exists(os.path.join(config, "config.json")):
            raise RuntimeError("%s: no config.json there" % config)
        return os.path.abspath(config)
    d = os.path.join(workdir, "model")
    os.makedirs(d, exist_ok=True)
    shutil.copy(config, os.path.join(d, "config.json"))
    return d


# ---------------------------------------------------------------- engines

class EngineError(RuntimeError):
    pass


def _quiet(logfile, fn):
    """Run fn with fd 1 and 2 sent to logfile (the engines' import noise)."""
    saved = os.dup(2), os.dup(1)
    fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    try:
        return fn()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 2)
        os.dup2(saved[1], 1)
        os.close(fd)
        os.close(saved[0])
        os.close(saved[1])


def vllm_setup(workdir):
    """Import vLLM as test_vllm.py does (CPU platform, quiet); returns the
    test_vllm module.  EngineError when it cannot be imported."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import traceback

    def imp():
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            import vllm  # noqa: F401
            import vllm.model_executor.kernels.linear  # noqa: F401 (before forking)
            return None
        except Exception:
            return traceback.format_exc()
    log = os.path.join(workdir, "import.log")
    err = _quiet(log, imp)
    if err:
        raise EngineError("vLLM cannot be imported:\n%s" % err)
    import test_vllm
    return test_vllm


def vllm_observe(workdir, requests, dtypes=True):
    """Run vLLM's loader for each request (key, model_dir, names, shapes,
    tp, ep): one gloo world per tp, every request of that tp in it.
    Returns {key: ({rank: {param: (tid, idx)}}, {rank: {param: dtype}})
    or an EngineError naming the request, the rank and vLLM's error}."""
    tv = vllm_setup(workdir)
    from vllm.model_executor.model_loader.utils import get_model_architecture
    log = os.path.join(workdir, "engine.log")
    bytp, keys, out = {}, {}, {}
    for key, mdir, names, shapes, tp, ep in requests:
        def mk(mdir=mdir, tp=tp, ep=ep):
            vc = tv.vllm_config(mdir, tp, ep)
            vd = tv.vllm_config(mdir, tp, ep, "auto") if dtypes else None
            get_model_architecture(vc.model_config)
            return vc, vd
        try:
            vc, vd = _quiet(log, mk)
        except Exception as e:
            out[key] = EngineError("vLLM cannot configure %s: %s: %s" % (
                key, type(e).__name__, e))
            continue
        # test_vllm's worker makes a MoE job's config the current one while
        # it initialises the parallel groups (so that the EP group exists)
        moe = vc.model_config.is_moe
        moe = bool(moe() if callable(moe) else moe)
        jobs = bytp.setdefault(tp, [])
        fkey = "req%d" % len(keys)      # result file names: no path characters
        keys[fkey] = key
        jobs.append(dict(kind="load", key="%s.load" % fkey, vc=vc, moe=moe,
                         names=list(names), shapes=[tuple(s) for s in shapes]))
        if dtypes:
            jobs.append(dict(kind="dtype", key="%s.dtype" % fkey, vc=vd, moe=moe))
    import pickle
    for tp, jobs in sorted(bytp.items()):
        wdir = os.path.join(workdir, "tp%d" % tp)
        os.makedirs(wdir, exist_ok=True)
        werrs = tv.run_world(tp, jobs, wdir)
        for j in jobs:
            fkey, kind = j["key"].rsplit(".", 1)
            key = keys[fkey]
            if isinstance(out.get(key), EngineError):
                continue
            for r in range(tp):
                f = os.path.join(wdir, "%s.r%d.pkl" % (j["key"], r))
                if r in werrs:
                    out[key] = EngineError("vLLM tp%d rank %d: %s" % (tp, r, werrs[r]))
                    break
                if not os.path.exists(f):
                    out[key] = EngineError("vLLM wrote no result for %s rank %d" % (key, r))
                    break
                with open(f, "rb") as fh:
                    res = pickle.load(fh)
                if res["error"]:
                    out[key] = EngineError("vLLM failed on %s (%s) rank %d:\n%s" % (
                        key, kind, r, res["error"].strip()[-3000:]))
                    break
                obs, dts = out.setdefault(key, ({}, {}))
                if kind == "load":
                    obs[r] = {n: (res["obs"][n][0].astype(np.int64),
                                  res["obs"][n][1].astype(np.int64)) for n in res["order"]}
                else:
                    dts[r] = {n: v[0] for n, v in res["dtypes"].items()}
    return out


def sglang_setup():
    """Import SGLang as test_sglang.py does; returns (test_sglang module,
    its stack).  EngineError when it cannot be imported."""
    import test_sglang as ts
    try:
        S = ts.import_stack()
    except SystemExit:
        raise EngineError("SGLang cannot be imported (see above)")
    return ts, S


def sglang_observe(ts, S, model_dir, names, shapes, par, dtypes=True):
    """Run SGLang's loader for every rank of par (tpN[,dpM][,epK]): ({rank:
    {param: (tid, idx)}}, {rank: {param: dtype}})."""
    torch = S["torch"]
    tp, dp, _ = ts.parse_par(par)
    ckpt = list(zip(names, [tuple(s) for s in shapes]))
    ids = {n: i for i, n in enumerate(names)}
    obs, dts = {}, {}
    for rank in range(tp * dp):
        try:
            model = ts.sglang_model(S, model_dir, par, rank)
            o = ts.observe(S, model, ckpt, ids)
            order = [n for n, _ in model.named_parameters()]
            obs[rank] = {n: (o[n][0].astype(np.int64), o[n][1].astype(np.int64))
                         for n in order}
            del model
            if dtypes:
                sa = ts.publish(S, model_dir, par, rank)
                mc = S["ModelConfig"].from_server_args(sa)
                from sglang.srt.model_loader.utils import set_default_torch_dtype
                with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
                    m2 = S["loader"]._initialize_model(mc, S["LoadConfig"]())
                dts[rank] = {n: str(p.dtype) for n, p in m2.named_parameters()}
                del m2
        except Exception as e:
            import traceback
            raise EngineError("SGLang %s rank %d: %s: %s\n%s" % (
                par, rank, type(e).__name__, e,
                "\n".join(traceback.format_exc().strip().splitlines()[-6:])))
    return obs, dts


def par_spec(tp, dp=1, ep=False):
    return "tp%d" % tp + (",dp%d" % dp if dp > 1 else "") + (",ep%d" % tp if ep else "")


def discover(framework, config, tp, ep=False, dp=1, workdir=None, model=None,
             max_pieces=MAX_PIECES, log=print):
    """The command line's work: run the engine's loader on every rank, derive
    the map.  Returns (map, checkpoint tensors)."""
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="refit-discover-")
    try:
        par = par_spec(tp, dp, ep)
        t0 = time.time()
        if framework == "vllm":
            vllm_setup(workdir)
        else:
            ts, S = sglang_setup()
        log("%s imported in %.1fs" % (framework, time.time() - t0))
        mdir = model_dir_of(config, workdir)
        tens = _quiet(os.path.join(workdir, "engine.log"),
                      lambda: checkpoint_tensors(mdir, workdir, config))
        names = [n for n, _, _ in tens]
        shapes = [s for _, s, _ in tens]
        t1 = time.time()
        if framework == "vllm":
            res = vllm_observe(workdir, [("m", mdir, names, shapes, tp, ep)])["m"]
            if isinstance(res, EngineError):
                raise res
            obs, dts = res
            if dp > 1:      # replicas: the same engine, ranks inst * tp + r
                obs = {i * tp + r: obs[r] for i in range(dp) for r in range(tp)}
                dts = {i * tp + r: dts[r] for i in range(dp) for r in range(tp)}
        else:
            obs, dts = sglang_observe(ts, S, mdir, names, shapes, par)
        log("%s loader dry-run, %d ranks, in %.1fs" % (framework, len(obs), time.time() - t1))
        if model is None:       # as refit-plan names a config.json's model
            with open(os.path.join(mdir, "config.json")) as f:
                model = json.load(f).get("model_type") or config
        m = derive_map(obs, tens, framework, model, par, dtypes=dts,
                       max_pieces=max_pieces)
        return m, tens
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="discover an engine's map (refit's format) from its own loader")
    ap.add_argument("--framework", required=True, choices=["vllm", "sglang"])
    ap.add_argument("--config", required=True,
                    help="a Hugging Face model directory (config.json, optionally "
                         "*.safetensors) or a config.json")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", action="store_true", help="expert parallelism, ep = tp")
    ap.add_argument("--dp", type=int, default=1, help="replicas (ranks instance * tp + r)")
    ap.add_argument("--out", required=True, help="the map JSON ('-': stdout)")
    ap.add_argument("--model", default=None, help='the map\'s "model" (default: the config\'s model_type)')
    ap.add_argument("--max-pieces", type=int, default=MAX_PIECES,
                    help="boxes one parameter may be cut into (default %d)" % MAX_PIECES)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)
    if a.tp < 1 or a.dp < 1:
        ap.error("--tp and --dp must be at least 1")

    def log(s):
        print(s, file=sys.stderr)
        sys.stderr.flush()
    workdir = tempfile.mkdtemp(prefix="refit-discover-")
    try:
        try:
            m, tens = discover(a.framework, a.config, a.tp, a.ep, a.dp, workdir,
                               a.model, a.max_pieces, log)
        except EngineError as e:
            log("discover: %s" % e)
            return 2
        except LayoutError as e:
            log("discover: the layout cannot be expressed as a map: %s" % e)
            return 1
        except RuntimeError as e:
            log("discover: %s" % e)
            return 2
        for n in unused_tensors(m, tens):
            log("warning: checkpoint tensor %s is held by no rank" % n)
        for r in m["ranks"]:
            for p in r["params"]:
                if not p["pieces"]:
                    log("warning: rank %d %s: no checkpoint tensor feeds it (all padding)" %
                        (r["rank"], p["name"]))
        for e in check_map(m)[:20]:
            log("warning: %s" % e)
        text = json.dumps(m, indent=1)
        if a.out == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(a.out, "w") as f:
                f.write(text + "\n")
        log("wrote %s: %s" % (a.out, summary(m)))
        return 0
    finally:
        if a.keep:
            log("work directory %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
