"""Layouts in the JSON the C library takes (README "JSON formats"): from
DTensor-like objects, PyTorch placement strings, or explicit boxes.  One
dialect: these functions build the same dicts a layout file holds; the C
library checks them when a client registers.

  dtensor(name, t)                   t: anything with .placements,
                                     .device_mesh and a global shape (.shape)
  placements(name, dtype, shape, mesh, ["Shard(0)", "Replicate()"])
  boxes(name, dtype, shape, [(rank, offset, size), ...])
  to_json([layout, ...])             the text refit_register takes
  local_boxes(layout, rank)          [(offset, size), ...] of a rank's pieces
                                     (Replicate, Shard, _StridedShard)
"""
import json
import re

from .memory import dtype_name


def _shape(x):
    return [int(n) for n in x]


def placement_str(p):
    """The PyTorch spelling of a placement object (torch.distributed.tensor
    Shard / Replicate / _StridedShard, or anything with the same class
    name and attributes); strings pass unchanged (the library parses them)."""
    if isinstance(p, str):
        return p
    kind = type(p).__name__
    if kind == "Replicate":
        return "Replicate()"
    if kind == "Shard":
        return f"Shard({int(p.dim)})"
    if kind == "_StridedShard":
        return f"_StridedShard(dim={int(p.dim)}, split_factor={int(p.split_factor)})"
    if kind in ("Partial", "_Partial"):
        raise ValueError("refit: a Partial placement cannot be refit: reduce it first "
                         "(full_tensor() or redistribute to Replicate/Shard)")
    raise ValueError(f"refit: unknown placement {p!r} (Replicate, Shard, _StridedShard)")


def _mesh_list(mesh):
    m = getattr(mesh, "mesh", mesh)  # DeviceMesh.mesh: a tensor of global ranks
    if hasattr(m, "tolist"):
        m = m.tolist()
    return m


def placements(name, dtype, shape, mesh, places):
    """A DTensor-form layout: mesh a nested list of global ranks (or a
    DeviceMesh-like object), places one placement (string or object) per
    mesh dim."""
    return {"name": str(name), "dtype": dtype_name(dtype), "shape": _shape(shape),
            "mesh": _mesh_list(mesh), "placements": [placement_str(p) for p in places]}


def dtensor(name, t, dtype=None):
    """The layout of a DTensor-like object: .placements, .device_mesh and the
    global shape (.shape, or .size()); dtype from t.dtype unless given."""
    for attr in ("placements", "device_mesh"):
        if not hasattr(t, attr):
            raise ValueError(f"refit: {type(t).__name__} has no .{attr}: not DTensor-like")
    shape = t.shape if hasattr(t, "shape") else t.size()
    return placements(name, dtype if dtype is not None else t.dtype, shape, t.device_mesh,
                      t.placements)


def boxes(name, dtype, shape, bxs):
    """An explicit-form layout: bxs a list of (rank, offset, size) or dicts
    {"rank", "offset", "size"}; a rank's pieces are numbered in this order."""
    shards = []
    for b in bxs:
        if isinstance(b, dict):
            rank, off, size = b["rank"], b["offset"], b["size"]
        else:
            rank, off, size = b
        shards.append({"rank": int(rank), "offset": _shape(off), "size": _shape(size)})
    return {"name": str(name), "dtype": dtype_name(dtype), "shape": _shape(shape),
            "shards": shards}


def to_json(layouts):
    """The layout JSON of a list of layouts (or one)."""
    if isinstance(layouts, dict):
        layouts = [layouts]
    return json.dumps({"tensors": list(layouts)})


def _coords(mesh, rank, prefix=()):
    if isinstance(mesh, list):
        for i, sub in enumerate(mesh):
            r = _coords(sub, rank, prefix + (i,))
            if r is not None:
                return r
        return None
    return prefix if int(mesh) == rank else None


def _mesh_dims(mesh):
    dims = []
    while isinstance(mesh, list):
        dims.append(len(mesh))
        mesh = mesh[0] if mesh else None
    return dims


_STRIDED = re.compile(r"^(?:_StridedShard|_S)\((?:dim=)?(-?\d+),(?:split_factor=|sf=)?(\d+)\)$")


def _parse(p):
    s = p.replace(" ", "")
    if s in ("Replicate()", "R"):
        return ("R", None, 1)
    m = _STRIDED.match(s)
    if m:
        return ("SS", int(m.group(1)), int(m.group(2)))
    for pre in ("Shard(dim=", "Shard(", "S("):
        if s.startswith(pre) and s.endswith(")"):
            return ("S", int(s[len(pre):-1]), 1)
    raise ValueError(f"refit: local_boxes handles Replicate, Shard and _StridedShard "
                     f"placements, not {p!r}")


def _chunk(E, n, c):
    ch = -(-E // n) if E else 0
    a = min(c * ch, E)
    return a, min(a + ch, E)


def _slice(runs, a, b, out):
    """Append the global runs of local positions [a, b) of runs to out."""
    pos = 0
    for st, ln in runs:
        lo, hi = max(a, pos), min(b, pos + ln)
        if hi > lo:
            g = st + (lo - pos)
            if out and out[-1][1] > 0 and out[-1][0] + out[-1][1] == g:
                out[-1] = (out[-1][0], out[-1][1] + hi - lo)
            else:
                if out and out[-1][1] == 0:
                    out.pop()
                out.append((g, hi - lo))
        pos += ln


def _pos(runs, a):
    pos = 0
    for st, ln in runs:
        if a < pos + ln:
            return st + (a - pos)
        pos += ln
    return runs[-1][0] + runs[-1][1] if runs else 0


def _split(kind, k, n, c, runs):
    E = sum(ln for _, ln in runs)
    out, first_empty = [], None
    if kind == "S":
        a, b = _chunk(E, n, c)
        _slice(runs, a, b, out)
        first_empty = a
    else:
        for j in range(k):
            sa, sb = _chunk(E, k, j)
            if sa == E and j > 0:
                break
            ta, tb = _chunk(sb - sa, n, c)
            _slice(runs, sa + ta, sa + tb, out)
            if first_empty is None:
                first_empty = sa + ta
    if not out:
        out.append((_pos(runs, first_empty), 0))
    return out


def local_boxes(layout, rank):
    """[(offset, size)] of the pieces rank holds (piece i is entry i); [] when
    none.  DTensor form (Replicate, Shard, _StridedShard; PyTorch's uneven
    chunks) or explicit form.  Several pieces (only with _StridedShard) come
    in row-major order of the rank's runs per dim; along each dim the runs
    lie in the local tensor in ascending global order, so a piece's local
    offset along d is the total length of the runs before it."""
    shape = _shape(layout["shape"])
    if "shards" in layout:
        return [(list(s["offset"]), list(s["size"])) for s in layout["shards"]
                if int(s["rank"]) == rank]
    mesh = layout["mesh"]
    mesh = mesh if isinstance(mesh, list) else [mesh]
    c = _coords(mesh, rank)
    if c is None:
        return []
    dims = _mesh_dims(mesh)
    runs = [[(0, n)] for n in shape]
    for md, p in enumerate(layout["placements"]):
        kind, d, k = _parse(p)
        if kind == "R":
            continue
        d = d + len(shape) if d < 0 else d
        runs[d] = _split(kind, k, dims[md], c[md], runs[d])
    out = [([], [])]
    for d in range(len(shape)):
        out = [(o + [st], s + [ln]) for o, s in out for st, ln in runs[d]]
    return out
