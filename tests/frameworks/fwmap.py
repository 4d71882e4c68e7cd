"""Shared pieces of the framework proofs (tests/frameworks/).

refit's side: `refit-plan framework-map` prints, for a framework, a model
and a parallel spec, every rank's parameters as pieces of the Hugging Face
("logical") tensors (docs/frameworks.md).  The framework's side: each
proof runs the framework's own loader or converter on index-encoded
tensors and reports, for every element of every parameter, which logical
tensor and which flat index it came from.  Both sides are expanded to the
same form and compared element by element:

    {param name: (tid, idx)}   two int64 numpy arrays of the param's shape;
                               tid = logical tensor id (-1: not written),
                               idx = flat row-major index in that tensor

Logical tensor ids are positions in the map's "tensors" list (the same
list for every rank), so the framework side encodes tensor k as id k.
"""
import json
import os
import subprocess

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def refit_plan(build):
    return os.path.join(build, "bin", "refit-plan")


def load_map(build, framework, model, par, rank=None):
    """Run refit-plan framework-map and return its JSON."""
    cmd = [refit_plan(build), "framework-map", "--framework", framework,
           "--model", model, "--par", par]
    if rank is not None:
        cmd += ["--rank", str(rank)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), out.returncode,
                                                   out.stderr.strip()))
    return json.loads(out.stdout)


def tensor_ids(m):
    """Logical tensor name -> id, and id -> shape, from a map."""
    ids = {t["name"]: i for i, t in enumerate(m["tensors"])}
    shapes = [tuple(t["shape"]) for t in m["tensors"]]
    return ids, shapes


def _box_index(shape, offset, size):
    """Flat row-major indices of a box of a tensor of `shape`."""
    grids = np.meshgrid(*[np.arange(o, o + s, dtype=np.int64)
                          for o, s in zip(offset, size)], indexing="ij")
    return np.ravel_multi_index(tuple(grids), shape).astype(np.int64)


def expected(m, rank_entry):
    """Expand one rank of a map into {param: (tid, idx)}.

    Fails (AssertionError naming the param) when pieces or padding overlap
    or leave an element of the parameter unassigned."""
    ids, shapes = tensor_ids(m)
    out = {}
    for p in rank_entry["params"]:
        shp = tuple(p["shape"])
        tid = np.full(shp, -2, dtype=np.int64)
        idx = np.full(shp, -1, dtype=np.int64)
        for pc in p["pieces"]:
            # a tensor with fewer dims than the parameter: its dims are the
            # parameter's trailing ones, at one index of each leading dim
            lead = len(shp) - len(pc["size"])
            size = [1] * lead + list(pc["size"])
            sl = tuple(slice(a, a + s) for a, s in zip(pc["at"], size))
            t = ids[pc["tensor"]]
            assert (tid[sl] == -2).all(), "%s: piece of %s at %s overlaps another" % (
                p["name"], pc["tensor"], pc["at"])
            tid[sl] = t
            idx[sl] = _box_index(shapes[t], pc["offset"], pc["size"]).reshape(size)
        for pad in p.get("padding", []):
            sl = tuple(slice(a, a + s) for a, s in zip(pad["at"], pad["size"]))
            assert (tid[sl] == -2).all(), "%s: padding at %s overlaps" % (p["name"], pad["at"])
            tid[sl] = -1
        bad = np.argwhere(tid == -2)
        assert len(bad) == 0, "%s: element %s is in no piece and no padding" % (
            p["name"], tuple(bad[0]))
        out[p["name"]] = (tid, idx)
    return out


def compare(exp, obs, names=None, limit=8):
    """Element-by-element comparison; returns a list of error strings
    (empty: equal).  `names` (id -> name) makes the messages readable."""
    errs = []
    nm = (lambda t: names[t] if names is not None and t >= 0 else str(t))
    for k in sorted(set(exp) | set(obs)):
        if k not in obs:
            errs.append("%s: in refit's map, not in the framework's parameters" % k)
            continue
        if k not in exp:
            errs.append("%s: a framework parameter refit's map does not have" % k)
            continue
        (et, ei), (ot, oi) = exp[k], obs[k]
        if et.shape != ot.shape:
            errs.append("%s: shape %s in refit's map, %s in the framework" %
                        (k, et.shape, ot.shape))
            continue
        # padding (-1) compares only the tensor id: its index is meaningless
        diff = (et != ot) | ((et >= 0) & (ei != oi))
        for where in np.argwhere(diff)[:limit]:
            w = tuple(int(x) for x in where)
            errs.append("%s%s: refit says %s[%d], the framework holds %s[%d]" % (
                k, list(w), nm(int(et[w])), int(ei[w]), nm(int(ot[w])), int(oi[w])))
        if diff.sum() > limit:
            errs.append("%s: %d elements differ in all" % (k, int(diff.sum())))
    return errs


def encode(shape, tid, torch=None, dtype=None):
    """Two float tensors for a logical tensor: its id + 1 everywhere, and its
    flat index + 1 (exact in float32 below 2^24 elements).  With torch,
    torch tensors of `dtype`; else numpy float64."""
    n = int(np.prod(shape))
    assert n < (1 << 24), "encode: %s has too many elements for float32" % (shape,)
    ident = np.full(shape, tid + 1, dtype=np.float64)
    index = (np.arange(n, dtype=np.float64) + 1).reshape(shape)
    if torch is None:
        return ident, index
    return (torch.tensor(ident, dtype=dtype), torch.tensor(index, dtype=dtype))


def decode(ident, index):
    """Inverse of encode on what a framework wrote: (tid, idx) int64 arrays,
    -1 where nothing was written (the parameter was zero-filled first)."""
    t = np.asarray(ident, dtype=np.float64).round().astype(np.int64) - 1
    i = np.asarray(index, dtype=np.float64).round().astype(np.int64) - 1
    i[t < 0] = -1
    return t, i
