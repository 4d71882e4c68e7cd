#!/usr/bin/env python3
"""refit's DTensor resolution against real torch.distributed.tensor objects.

    build/venv-vllm/bin/python tests/frameworks/test_fsdp2.py BUILD_DIR

Spawns 4 CPU processes (gloo, loopback only) that build a tiny
transformer-like module with index-encoded parameters (tensor k holds
k * 1000 + arange(numel), identical on every rank before any sharding) and
shard it the way trainers do:

  fsdp2+tp 2x2          parallelize_module (ColwiseParallel / RowwiseParallel)
                        on the "tp" dim of a ("dp", "tp") mesh, then fully_shard
                        on "dp": FSDP shards TP-sharded dims, so parameters get
                        (_StridedShard(d, sf=2), Shard(d)); layers.1 asks FSDP
                        for Shard(1) where every TP shard's dim 1 divides evenly
                        (shard_placement_fn; FSDP2 refuses uneven dim 1),
                        giving _StridedShard(1, sf=2) on w6 (row-parallel)
  fsdp2+tp 2x2 gathered over tp
                        the even _StridedShard parameters above gathered over
                        "tp" only, (_StridedShard(d, 2), Replicate()): two boxes
                        per rank.  torch 2.14's redistribute refuses this, so
                        the gather is an all_gather over the tp group and
                        DTensor.from_local; torch's own full_tensor() of the
                        result equal to the ground truth confirms the order
  fsdp2+tp 2x2 tp-outer the same on a ("tp", "dp") mesh: FSDP's mesh is
                        [[0, 2], [1, 3]] (ranks not in row-major order)
  hsdp 2x2              fully_shard on a 2-D (replicate, shard) mesh
  fsdp2 4               fully_shard on a 1-D mesh of 4 (layers.1: dim 1 if even)
  tp 4                  pure TP on a 1-D mesh of 4 (plain parameters skipped)
  dtensor strided       distribute_tensor(..., src_data_rank=None), torch's
                        own split, with _StridedShard placements that leave a
                        rank several boxes, uneven, on 2x2 and 1-D meshes
                        (the scatter path refuses uneven _StridedShard)

Shapes are not divisible by the mesh sizes (trailing shards short or empty).
FSDP-only parameters under FSDP2 + TP (norms) live on the 1-D dp submesh,
which differs between TP ranks ([0, 2] on ranks 0 and 2, [1, 3] on 1 and 3).

For every parameter and every rank: layout = refit.layout.dtensor(name, p)
on that rank; the rank's pieces come from refit.layout.local_boxes(layout,
rank) (Python) and from `BUILD/bin/refit-plan boxes` on the layout written
as a layout file (C).  Each piece must read, at its position in the rank's
local tensor (p.to_local()), exactly the elements of the full tensor inside
its box, and the pieces together must cover the local tensor exactly once
("... rank R C" / "... rank R py").  Per layout, all its ranks' boxes must
cover the whole tensor, each element as often as the Replicate mesh dims
multiply ("... cover C" / "... cover py").

Local position of a piece: the C library prints "local_offset" for ranks
with several boxes (absent = all zeros; plan/layout.c emit_rank_boxes: the
rank's runs of each dim are in local order, a box's local offset along dim d
is the total length of the runs before it).  Python's local_boxes gives
pieces without positions; the same rule is applied to them (runs of a dim in
ascending global order, which is the order torch concatenates them in).

Also checked: p.full_tensor() equals the index-encoded tensor (the ground
truth) where all ranks' local shapes are equal -- torch 2.14 cannot gather
uneven DTensors (gloo size mismatch on uneven (_StridedShard, Shard); a
failed size check on (Shard(1), Shard(0)) with an empty TP shard), so those
are counted as SKIP, the ground truth being known by construction; and that
FSDP2 + TP really produced _StridedShard (on tensor dims 0 and 1).
FSDP2's empty shards are (0, 0) tensors locally where the placements give
(0, n): printed as NOTE (no elements either way).

Needs BUILD/bin/refit-plan and librefit.so (importing refit loads it:
build/lib, or $REFIT_LIBRARY).  REFIT_FSDP2_TIMEOUT (s, default 150) bounds
the workers; REFIT_FSDP2_DEBUG=1 makes them name each tensor on stderr.
Exit 0 all passed, 1 a failure, 2 torch.distributed.tensor not importable.
"""
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

WORLD = 4
TIMEOUT_S = int(os.environ.get("REFIT_FSDP2_TIMEOUT", "150"))


# ---------------------------------------------------------------- workers


def _model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(6, 14)   # colwise: weight (14, 6), TP rows 7/7
            self.w2 = nn.Linear(14, 6)   # rowwise: weight (6, 14), TP cols 7/7
            self.w3 = nn.Linear(6, 3)    # colwise: rows 2/1, FSDP leaves an empty shard
            self.w4 = nn.Linear(3, 5)    # rowwise: cols 2/1
            self.w5 = nn.Linear(6, 1)    # colwise: rows 1/0 (a TP shard is empty)
            self.w6 = nn.Linear(8, 6)    # rowwise: cols 4/4 (FSDP may shard them: even)
            self.w7 = nn.Linear(6, 8)    # colwise: rows 4/4, FSDP 2/2 (even)
            self.norm = nn.LayerNorm(6)  # not TP-parallel: FSDP only

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 6)                # rowwise: vocab 5/5
            self.layers = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(6, 11, bias=False)      # colwise: rows 6/5

    m = Model()
    with torch.no_grad():
        for k, (_, p) in enumerate(m.named_parameters()):
            p.copy_(k * 1000 + torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape))
    return m


def _tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {"tok": RowwiseParallel(), "head": ColwiseParallel()}
    for i in range(2):
        plan.update({f"layers.{i}.w1": ColwiseParallel(), f"layers.{i}.w2": RowwiseParallel(),
                     f"layers.{i}.w3": ColwiseParallel(), f"layers.{i}.w4": RowwiseParallel(),
                     f"layers.{i}.w5": ColwiseParallel(), f"layers.{i}.w6": RowwiseParallel(),
                     f"layers.{i}.w7": ColwiseParallel()})
    return plan


def _fsdp(model, mesh, dim1_layer=True):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    n = mesh.size(mesh.ndim - 1)  # the shard dim (HSDP: the inner one)

    def dim1(p):
        # FSDP2 shards dims other than 0 only evenly, and every rank must
        # choose the same: Shard(1) when each TP rank's dim 1 divides by n
        if p.ndim != 2:
            return Shard(0)
        cols = [p.shape[1]]
        if hasattr(p, "placements") and Shard(1) in p.placements:
            k = p.device_mesh.size()
            c = -(-p.shape[1] // k)
            cols = [max(0, min(c, p.shape[1] - i * c)) for i in range(k)]
        return Shard(1) if all(x % n == 0 for x in cols) else Shard(0)
    for i, blk in enumerate(model.layers):
        fully_shard(blk, mesh=mesh, shard_placement_fn=dim1 if (i == 1 and dim1_layer) else None)
    fully_shard(model, mesh=mesh)
    return model


def _ground_truth(np, base, shape):
    n = 1
    for s in shape:
        n *= s
    return (base + np.arange(n, dtype=np.float64)).reshape(shape)


def worker(rank, port, outdir):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(WORLD),
                       "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")})
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.distributed.tensor.placement_types import _StridedShard
    import refit.layout as rl

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    recs = []

    def even(p):
        """Whether all ranks' local shapes are equal.  torch 2.14 gathers
        uneven DTensors wrongly or not at all: full_tensor() aborts in gloo
        on uneven (_StridedShard, Shard), fails a size check on
        (Shard(1), Shard(0)) with an empty TP shard, redistribute fails a
        size check; so torch is asked only about even ones.
        Collective: every rank calls it for the same tensor."""
        shapes = [None] * WORLD
        dist.all_gather_object(shapes, tuple(p.to_local().shape))
        return len(set(shapes)) == 1

    def record(scen, name, p, base):
        """p: a DTensor (collective calls: every rank, same order)."""
        rec = {"scenario": scen, "name": name, "rank": rank, "base": base,
               "shape": list(p.shape), "placements": [repr(x) for x in p.placements],
               "mesh": p.device_mesh.mesh.tolist()}
        if os.environ.get("REFIT_FSDP2_DEBUG"):
            print(f"[{rank}] {scen} {name} {rec['placements']}", file=sys.stderr, flush=True)
        local = p.to_local().detach()
        rec["local"] = local.to(torch.float64).numpy().copy()
        if even(p):
            full = p.full_tensor().detach().to(torch.float64).numpy()
            rec["full_ok"] = bool(full.shape == tuple(rec["shape"]) and
                                  np.array_equal(full, _ground_truth(np, base, rec["shape"])))
        else:
            rec["full_ok"] = None  # not asked of torch (see even_strided)
        try:
            rec["layout"] = rl.dtensor(name, p)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            rec["layout"] = f"{type(e).__name__}: {e}"
        if isinstance(rec["layout"], dict):
            try:
                rec["py"] = [(list(o), list(s)) for o, s in rl.local_boxes(rec["layout"], rank)]
            except Exception as e:  # noqa: BLE001
                rec["py"] = f"{type(e).__name__}: {e}"
        recs.append(rec)

    def model_params(scen, model, plain_ok=False):
        for k, (name, p) in enumerate(model.named_parameters()):
            if plain_ok and not isinstance(p, DTensor):
                continue  # pure TP: parameters outside the plan stay plain tensors
            if not isinstance(p, DTensor):
                raise SystemExit(f"{scen}: {name} is not a DTensor ({type(p).__name__})")
            record(scen, name, p, k * 1000)

    # FSDP2 + TP on 2x2, dp outer and tp outer
    for scen, names in (("fsdp2+tp 2x2", ("dp", "tp")), ("fsdp2+tp 2x2 tp-outer", ("tp", "dp"))):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
        model = parallelize_module(_model(torch), mesh["tp"], _tp_plan())
        model_params(scen, _fsdp(model, mesh["dp"]))
        if scen == "fsdp2+tp 2x2":
            # a real FSDP2 + TP parameter gathered over "tp" only:
            # (_S(d, 2), R) leaves every rank two boxes.  torch 2.14's
            # redistribute fails a size check on this, so the gather is done
            # here (all_gather over the tp group, pieces in tp order along d)
            # and torch's full_tensor() of the result, which must equal the
            # ground truth, confirms that order is torch's
            for k, (name, p) in enumerate(model.named_parameters()):
                if not (any(isinstance(x, _StridedShard) for x in p.placements) and even(p)):
                    continue
                d = p.placements[1].dim
                local = p.to_local().detach().contiguous()
                parts = [torch.empty_like(local) for _ in range(mesh["tp"].size())]
                dist.all_gather(parts, local, group=p.device_mesh.get_group(1))
                q = DTensor.from_local(torch.cat(parts, dim=d), p.device_mesh,
                                       [p.placements[0], Replicate()], shape=p.shape,
                                       stride=p.stride())
                record("fsdp2+tp 2x2 gathered over tp", name + " (_S,R)", q, k * 1000)

    # HSDP on 2x2 (replicate, shard)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
    model_params("hsdp 2x2", _fsdp(_model(torch), mesh))

    # plain FSDP2 on 4
    mesh1 = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    model_params("fsdp2 4", _fsdp(_model(torch), mesh1))

    # pure TP on 4
    mesh1 = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    model_params("tp 4", parallelize_module(_model(torch), mesh1, _tp_plan()), plain_ok=True)

    # _StridedShard placements, several boxes per rank, uneven: torch's own
    # split (distribute_tensor with src_data_rank=None: every rank applies
    # the placements' _split_tensor left to right; the scatter path refuses
    # uneven _StridedShard)
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    mesh1 = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    S, R = Shard, Replicate

    def SS(d, k):
        return _StridedShard(d, split_factor=k)
    cases = [
        ("docstring s0x2.s0 (8,8)", (8, 8), mesh2, [SS(0, 2), S(0)]),
        ("s0x2.s0 (11,4)", (11, 4), mesh2, [SS(0, 2), S(0)]),
        ("s0x2.rep (10,6)", (10, 6), mesh2, [SS(0, 2), R()]),
        ("s0x2.s1x3 (10,7)", (10, 7), mesh2, [SS(0, 2), SS(1, 3)]),
        ("s1.s0x2 (7,5)", (7, 5), mesh2, [S(1), SS(0, 2)]),
        ("s0x3.s0 (13,)", (13,), mesh2, [SS(0, 3), S(0)]),
        ("s0x2.s0x2 (9,2)", (9, 2), mesh2, [SS(0, 2), SS(0, 2)]),
        ("s0x3 (9,)", (9,), mesh1, [SS(0, 3)]),
        ("s1x3 (3,11)", (3, 11), mesh1, [SS(1, 3)]),
        ("s0x2 (5,2)", (5, 2), mesh1, [SS(0, 2)]),
    ]
    base = 100000
    for name, shape, mesh, pl in cases:
        n = 1
        for s in shape:
            n *= s
        full = (base + torch.arange(n, dtype=torch.float32)).reshape(shape)
        record("dtensor strided", name, distribute_tensor(full, mesh, pl, src_data_rank=None),
               base)
        base += 1000

    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump({"torch": torch.__version__, "recs": recs}, f)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- checks


def _free_port():
    """Below the ephemeral range (as tests/integration/harness.py's
    free_port): a bind(0) port may be taken by an outgoing connection
    before gloo binds it."""
    import random
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            hi = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        hi = 32768
    for _ in range(200):
        port = random.randrange(10000, max(hi, 10001))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port")


def _c_boxes(build, layouts, tmp):
    """{layout json text: [(rank, offset, size, local_offset)]} from refit-plan boxes."""
    keys = sorted(layouts)
    tensors = []
    for i, key in enumerate(keys):
        lay = dict(json.loads(key))
        lay["name"] = f"t{i}"
        tensors.append(lay)
    path = os.path.join(tmp, "layouts.json")
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f)
    r = subprocess.run([os.path.join(build, "bin", "refit-plan"), "boxes", path],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"refit-plan boxes failed ({r.returncode}): {r.stderr.strip()}")
    out = {}
    for t in json.loads(r.stdout)["tensors"]:
        key = keys[int(t["name"][1:])]
        out[key] = [(s["rank"], s["offset"], s["size"],
                     s.get("local_offset", [0] * len(s["offset"]))) for s in t["shards"]]
    return out


def _py_local_offsets(pieces):
    """Local position of each piece: per dim, the distinct runs in ascending
    global order, a piece sits after the runs before it."""
    if not pieces:
        return []
    nd = len(pieces[0][0])
    runs = [sorted({(o[d], s[d]) for o, s in pieces}) for d in range(nd)]
    res = []
    for o, s in pieces:
        lo = []
        for d in range(nd):
            lo.append(sum(ln for st, ln in runs[d] if (st, ln) < (o[d], s[d])))
        res.append(lo)
    return res


def _check_pieces(np, local, full, pieces):
    """pieces: [(offset, size, local_offset)]; None or the first mismatch."""
    seen = np.zeros(local.shape, dtype=np.int64)
    for off, size, loc in pieces:
        if len(off) != full.ndim or len(size) != full.ndim or len(loc) != full.ndim:
            return f"piece {off}+{size}@{loc}: wrong rank of dims"
        if any(o < 0 or o + s > n for o, s, n in zip(off, size, full.shape)):
            return f"box {off}+{size} outside the tensor {list(full.shape)}"
        if 0 in size:
            continue  # holds nothing (FSDP2's empty shards are (0, 0) locally)
        if any(l < 0 or l + s > n for l, s, n in zip(loc, size, local.shape)):
            return (f"box {off}+{size} at local {loc} outside the local tensor "
                    f"{list(local.shape)}")
        gsl = tuple(slice(o, o + s) for o, s in zip(off, size))
        lsl = tuple(slice(l, l + s) for l, s in zip(loc, size))
        a, b = local[lsl], full[gsl]
        if not np.array_equal(a, b):
            idx = tuple(int(x) for x in np.argwhere(a != b)[0])
            return (f"box {off}+{size} at local {loc}: local"
                    f"{[l + i for l, i in zip(loc, idx)]} = {a[idx]:g}, expected "
                    f"full{[o + i for o, i in zip(off, idx)]} = {b[idx]:g}")
        seen[lsl] += 1
    if local.ndim != full.ndim:
        return f"local tensor has {local.ndim} dims, the tensor {full.ndim}"
    if seen.size and (seen != 1).any():
        idx = tuple(int(x) for x in np.argwhere(seen != 1)[0])
        return (f"local element {list(idx)} of {list(local.shape)} covered "
                f"{int(seen[idx])} times (value {local[idx]:g})")
    return None


def _fmt_boxes(pieces):
    return " ".join(f"{o}+{s}@{l}" for o, s, l in pieces) or "none"


def main():
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    try:
        import numpy as np
    except ImportError as e:
        print(f"SKIP numpy not importable: {e}")
        return 2
    try:
        import torch  # noqa: F401
        import torch.distributed.tensor  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"SKIP torch.distributed.tensor / fully_shard not importable: {e}")
        return 2
    t0 = time.monotonic()
    plan_bin = os.path.join(build, "bin", "refit-plan")
    if not os.access(plan_bin, os.X_OK):
        print(f"FAIL {plan_bin} missing (make first)")
        return 1

    tmp = tempfile.mkdtemp(prefix="refit-fsdp2-")
    try:
        port = _free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                   str(r), str(port), tmp], env=env)
                 for r in range(WORLD)]
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)  # polling the children's exit, not waiting for a guess
        bad = [(r, p.poll()) for r, p in enumerate(procs) if p.poll() != 0]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if bad:
            print(f"FAIL workers: {bad} (exit codes; None = killed after {TIMEOUT_S}s)")
            print("0 passed, 1 failed")
            return 1
        recs, tver = [], None
        for r in range(WORLD):
            with open(os.path.join(tmp, f"rank{r}.pkl"), "rb") as f:
                d = pickle.load(f)
            tver = d["torch"]
            recs.extend(d["recs"])
        print(f"torch {tver}, {WORLD} ranks, gloo on 127.0.0.1:{port}")

        layouts = {json.dumps(r["layout"], sort_keys=True) for r in recs
                   if isinstance(r.get("layout"), dict)}
        cbx = _c_boxes(build, layouts, tmp)

        npass = nfail = 0

        def result(ok, what, detail=""):
            nonlocal npass, nfail
            if ok:
                npass += 1
                print(f"PASS {what}" + (f"  {detail}" if detail else ""))
            else:
                nfail += 1
                print(f"FAIL {what}: {detail}")

        # placements seen (rank 0's view; ranks differ only in FSDP-only submeshes)
        scenarios = []
        for r in recs:
            if r["scenario"] not in scenarios:
                scenarios.append(r["scenario"])
        for scen in scenarios:
            print(f"-- {scen}: placements seen on rank 0")
            for r in recs:
                if r["scenario"] == scen and r["rank"] == 0:
                    if "error" in r:
                        print(f"   {r['name']}: {r['error']}")
                    else:
                        print(f"   {r['name']:28s} shape {r['shape']} mesh {r['mesh']} "
                              f"({', '.join(r['placements'])})")
        for scen in ("fsdp2+tp 2x2", "fsdp2+tp 2x2 tp-outer"):
            strided = sorted({(r["name"], ", ".join(r["placements"])) for r in recs
                              if r["scenario"] == scen and "error" not in r and
                              any(p.startswith("_StridedShard") for p in r["placements"])})
            dims = {p.split("dim=")[1].split(",")[0] for _, pl in strided for p in pl.split("), ")
                    if p.startswith("_StridedShard")}
            result(len(strided) > 0 and dims >= {"0", "1"},
                   f"{scen} FSDP2 produced _StridedShard",
                   f"{len(strided)} parameters, on tensor dims {sorted(dims)}")

        import refit.layout as rl
        nskip = nquirk = 0
        covered = set()
        for r in recs:
            what = f"{r['scenario']} {r['name']} rank {r['rank']}"
            full = _ground_truth(np, r["base"], r["shape"])
            local = r["local"]
            if r["full_ok"] is None:
                nskip += 1
            elif not r["full_ok"]:
                result(False, what + " torch full_tensor", "differs from the index-encoded "
                       "tensor the module was built with")
            if not isinstance(r["layout"], dict):
                result(False, what + " layout", r["layout"])
                continue
            pl = ", ".join(r["placements"])
            key = json.dumps(r["layout"], sort_keys=True)
            # C: this rank's boxes at their local_offset
            cp = [(o, s, l) for rk, o, s, l in cbx[key] if rk == r["rank"]]
            err = _check_pieces(np, local, full, cp)
            if len(cp) == 1 and list(local.shape) != list(cp[0][1]):
                nquirk += 1
                print(f"NOTE {what}: torch's local tensor is {list(local.shape)}, the DTensor "
                      f"placements ({pl}) give {list(cp[0][1])} (no elements either way)")
            result(err is None, what + " C",
                   f"({pl}) local {list(local.shape)}: {_fmt_boxes(cp)}" + (
                       f"; {err}" if err else ""))
            # Python: local_boxes, positions by the ascending-runs rule
            if isinstance(r.get("py"), str):
                result(False, what + " py", f"({pl}) local_boxes raised {r['py']}")
            else:
                pp = [(o, s, l) for (o, s), l in zip(r["py"], _py_local_offsets(r["py"]))]
                err = _check_pieces(np, local, full, pp)
                result(err is None, what + " py",
                       f"({pl}) local {list(local.shape)}: {_fmt_boxes(pp)}" + (
                           f"; {err}" if err else ""))
            # every layout once: all its ranks' boxes cover the tensor, each
            # element as many times as the Replicate mesh dims multiply
            if (r["scenario"], r["name"], key) in covered:
                continue
            covered.add((r["scenario"], r["name"], key))
            what = f"{r['scenario']} {r['name']} mesh {r['mesh']}"
            lay = r["layout"]
            dims, m = [], lay["mesh"]
            while isinstance(m, list):
                dims.append(len(m))
                m = m[0]
            reps = 1
            for n, p in zip(dims, lay["placements"]):
                reps *= n if p.startswith("Replicate") else 1
            ranks = np.array(lay["mesh"]).flatten().tolist()
            byimpl = {"C": [(o, s) for rk, o, s, _ in cbx[key]]}
            try:
                byimpl["py"] = [b for rk in ranks for b in rl.local_boxes(lay, rk)]
            except Exception as e:  # noqa: BLE001
                byimpl["py"] = f"{type(e).__name__}: {e}"
            for impl, bxs in byimpl.items():
                if isinstance(bxs, str):
                    result(False, f"{what} cover {impl}", f"local_boxes raised {bxs}")
                    continue
                cnt = np.zeros(r["shape"], dtype=np.int64)
                for o, s in bxs:
                    cnt[tuple(slice(a, a + b) for a, b in zip(o, s))] += 1
                bad = np.argwhere(cnt != reps)
                result(len(bad) == 0, f"{what} cover {impl}",
                       f"{len(bxs)} boxes, every element {reps}x" if len(bad) == 0 else
                       f"element {bad[0].tolist()} held {int(cnt[tuple(bad[0])])} times, "
                       f"expected {reps}")
        if nskip:
            print(f"SKIP torch full_tensor() on {nskip} uneven rank-tensors (torch cannot "
                  "gather them; the ground truth is the index-encoded tensor)")
        print(f"wall {time.monotonic() - t0:.1f}s")
        print(f"{npass} passed, {nfail} failed")
        return 1 if nfail else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    sys.exit(main())
