#!/usr/bin/python3
"""Conversion end to end: a coordinator and four node daemons on loopback
(tcp transport), a bf16/fp32/fp16 trainer and two inference instances that
hold fp8e4m3 weights with 128 x 128 block scales (and a tensor scale),
bf16/fp16 casts and an unconverted tensor, in layouts that split blocks
(converted on the receivers) and that hold whole blocks (converted on the
senders); versions change 0.5 % of the source elements, each refit is
followed by one of the next version as delta (tcp).  Every byte of every inference shard, fp8 weights and scale
tensors included, is compared with the numpy reference
(tests/conversion/ref.py) applied to the whole source tensor, after a
reshard refit and after a gather-and-broadcast refit of the next version.

Usage: test_conversion.py BUILD_DIR.  Prints "conversion: N passed,
N failed" last; exit status 1 when anything failed.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-cv-")
from refit.v1 import refit_pb2 as pb  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "conversion"))
import harness  # noqa: E402
import ref  # noqa: E402
from harness import Client, Cluster, check, write  # noqa: E402

harness.init(BUILD, TMP)
NP = {"bf16": np.uint16, "fp16": np.uint16, "fp32": np.uint32, "fp8e4m3": np.uint8,
      "uint8": np.uint8}
MX = {"from": "bf16", "scale": "mx"}        # MXFP8: 1 x 32 blocks, e8m0 scales

# ---- the model ------------------------------------------------------------------


def dt(name, dtype, shape, mesh, placements, conv=None):
    t = {"name": name, "dtype": dtype, "shape": shape, "mesh": mesh,
         "placements": placements}
    if conv:
        t["convert"] = conv
    return t


FP8 = {"from": "bf16"}                       # block scales, 128 x 128 by default
TRAIN = [
    dt("w1", "bf16", [300, 520], [0, 1, 2, 3], ["Shard(0)"]),  # 75 rows: splits blocks
    dt("w2", "bf16", [256, 384], [4, 5], ["Shard(0)"]),        # 128 rows: whole blocks
    dt("e", "bf16", [4, 200, 130], [0, 1, 2, 3], ["Shard(0)"]),  # one expert each
    dt("n", "fp32", [1000], [6, 7], ["Shard(0)"]),
    {"name": "c", "dtype": "fp32", "shape": [64, 100],
     "shards": [{"rank": 0, "offset": [0, 0], "size": [40, 100]},
                {"rank": 5, "offset": [40, 0], "size": [24, 100]}]},
    dt("t", "fp16", [40, 33], [0, 1], ["Shard(1)"]),             # tensor scale, split
    dt("u", "bf16", [10], [3], ["Replicate()"]),
    dt("x", "bf16", [64, 96], [2, 3], ["Shard(1)"]),             # 48 columns: splits blocks
]
I0 = [  # TP4 on node 2, packed memory
    dt("w1", "fp8e4m3", [300, 520], [8, 9, 10, 11], ["Shard(1)"], FP8),
    dt("w1_scale_inv", "fp32", [3, 5], [8, 9, 10, 11], ["Shard(1)"]),
    dt("w2", "fp8e4m3", [256, 384], [8, 9, 10, 11], ["Replicate()"], FP8),
    dt("w2_scale_inv", "fp32", [2, 3], [8, 9], ["Replicate()"]),
    dt("e", "fp8e4m3", [4, 200, 130], [8, 9, 10, 11], ["Shard(0)"],
       {"from": "bf16", "block": [128, 128], "scale_tensor": "e_scale_inv"}),
    dt("e_scale_inv", "fp32", [4, 2, 2], [8, 9, 10, 11], ["Shard(0)"]),
    dt("n", "bf16", [1000], [8, 9], ["Replicate()"], {"from": "fp32"}),
    dt("c", "fp16", [64, 100], [10, 11], ["Shard(0)"], {"from": "fp32"}),
    dt("t", "fp8e4m3", [40, 33], [8, 9], ["Shard(0)"], {"from": "fp16", "scale": "tensor"}),
    dt("t_scale_inv", "fp32", [], [8, 11], ["Replicate()"]),
    dt("u", "bf16", [10], [8], ["Replicate()"]),
    dt("x", "fp8e4m3", [64, 96], [8, 9], ["Shard(0)"], MX),
    dt("x_scale_inv", "uint8", [64, 3], [10], ["Replicate()"]),
]
I1 = [  # other shardings on node 3, strided memory
    dt("w1", "fp8e4m3", [300, 520], [12, 13], ["Shard(0)"], FP8),
    dt("w1_scale_inv", "fp32", [3, 5], [12, 13, 14, 15], ["Replicate()"]),
    dt("w2", "fp8e4m3", [256, 384], [12, 13, 14, 15], ["Shard(1)"], FP8),
    dt("w2_scale_inv", "fp32", [2, 3], [14, 15], ["Shard(1)"]),
    dt("e", "fp8e4m3", [4, 200, 130], [[12, 13], [14, 15]], ["Shard(0)", "Shard(1)"],
       {"from": "bf16", "block": [128, 128]}),
    dt("e_scale_inv", "fp32", [4, 2, 2], [15], ["Replicate()"]),
    dt("n", "bf16", [1000], [12, 13, 14, 15], ["Shard(0)"], {"from": "fp32"}),
    dt("c", "fp16", [64, 100], [14], ["Replicate()"], {"from": "fp32"}),
    dt("t", "fp8e4m3", [40, 33], [13], ["Replicate()"], {"from": "fp16", "scale": "tensor"}),
    dt("t_scale_inv", "fp32", [], [12], ["Replicate()"]),
    dt("u", "bf16", [10], [14, 15], ["Shard(0)"]),
    dt("x", "fp8e4m3", [64, 96], [14], ["Replicate()"], MX),
    dt("x_scale_inv", "uint8", [64, 3], [12, 13], ["Shard(1)"]),
]

# ---- the trainer's values (refit-client --finite), recomputed here ----------------

M64 = np.uint64(0xffffffffffffffff)


def mix(x):
    x = x + np.uint64(0x9e3779b97f4a7c15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return x ^ (x >> np.uint64(31))


# versions change this many elements per million (refit-client --sparse): a
# refit after a committed one of the same plan goes as delta (docs/delta.md)
SPARSE = 5000


def version_of(g, t_index, version):
    """refit-client --sparse: the version whose pattern each element holds at
    version (the last one at or before it that changed the element)."""
    w = np.full(g.shape, min(version, 1), dtype=np.uint64)
    for x in range(2, version + 1):
        hit = mix(g ^ (np.uint64(t_index) << np.uint64(48)) ^ (np.uint64(x) << np.uint64(32)) ^
                  np.uint64(0xd1b54a32d192ed03)) % np.uint64(1000000) < np.uint64(SPARSE)
        w[hit] = x
    return w


def source_bits(t_index, tensor, version):
    """The whole source tensor as refit-client --finite --sparse fills it."""
    shape = tensor["shape"]
    g = np.arange(int(np.prod(shape)) if shape else 1, dtype=np.uint64)
    v = version_of(g, t_index, version)
    h = mix(g ^ (np.uint64(t_index) << np.uint64(48)) ^ (v << np.uint64(32)) ^ v)
    one = np.uint64(1)
    sign = (h >> np.uint64(15)) & one
    d = tensor["dtype"]
    if d == "bf16":
        b = (sign << np.uint64(15)) | ((np.uint64(112) + ((h >> np.uint64(16)) & np.uint64(31)))
                                       << np.uint64(7)) | (h & np.uint64(0x7f))
    elif d == "fp16":
        b = (sign << np.uint64(15)) | ((np.uint64(1) + ((h >> np.uint64(16)) % np.uint64(30)))
                                       << np.uint64(10)) | (h & np.uint64(0x3ff))
    else:
        b = (sign << np.uint64(31)) | ((np.uint64(112) + ((h >> np.uint64(32)) & np.uint64(31)))
                                       << np.uint64(23)) | (h & np.uint64(0x7fffff))
    return b.astype(NP[d]).reshape(shape)


def expected(version):
    """name -> whole destination bits, for every tensor of the instances."""
    out = {}
    for k, t in enumerate(TRAIN):
        src = source_bits(k, t, version)
        conv = next(x.get("convert") for x in I0 if x["name"] == t["name"])
        dst = next(x["dtype"] for x in I0 if x["name"] == t["name"])
        if conv is None:
            out[t["name"]] = src
            continue
        q, s = ref.convert(src, conv["from"], dst, conv.get("scale", "block" if dst == "fp8e4m3"
                                                            else "none"), conv.get("block"))
        out[t["name"]] = q
        if s is not None and conv.get("scale") == "mx":
            out[t["name"] + "_scale_inv"] = np.asarray(s, dtype=np.uint8)
        elif s is not None:
            s = np.asarray(s, dtype=np.float32)
            bits = np.where(np.isnan(s), np.float32(0), s).view(np.uint32)
            out[conv.get("scale_tensor", t["name"] + "_scale_inv")] = \
                np.where(np.isnan(s), np.uint32(0x7fc00000), bits)
    return out


def boxes(path):
    """Resolved shards of every tensor of a layout file (refit-plan boxes)."""
    r = subprocess.run([f"{BUILD}/bin/refit-plan", "boxes", path], stdout=subprocess.PIPE,
                       check=True, text=True, timeout=60)
    return {t["name"]: t["shards"] for t in json.loads(r.stdout)["tensors"]}


def compare(clients, layout_paths, version):
    want = expected(version)
    dtypes = {t["name"]: t["dtype"] for t in I0}
    checked = {"elements": 0, "shards": 0}
    for c, path in zip(clients, layout_paths):
        d = tempfile.mkdtemp(prefix="dump-", dir=TMP)
        out = c.cmd(f"dump {d}")
        assert out.startswith("DUMPED ") and f"version={version}" in out, out
        for name, shards in boxes(path).items():
            for i, sh in enumerate(shards):
                f = f"{d}/{name}@{sh['rank']}@{i}.bin"
                if not os.path.exists(f):
                    continue            # a rank this client does not serve
                got = np.fromfile(f, dtype=NP[dtypes[name]])
                sl = tuple(slice(o, o + s) for o, s in zip(sh["offset"], sh["size"]))
                w = np.asarray(want[name])[sl].reshape(-1) if sl else \
                    np.asarray(want[name]).reshape(-1)
                bad = np.flatnonzero(got != w)
                assert got.size == w.size and not len(bad), \
                    (f"version {version}: {name} shard {i} (rank {sh['rank']}, offset "
                     f"{sh['offset']}, size {sh['size']}): {len(bad)} of {w.size} elements "
                     f"differ, first at {bad[:1]}: got {got[bad[:1]]} want {w[bad[:1]]}")
                checked["elements"] += got.size
                checked["shards"] += 1
    return checked


# ---- tests ------------------------------------------------------------------------

CL = Cluster("cv", 4, coord_extra=["--state-file", f"{TMP}/coord.state"])
STATE = {}


def setup():
    tp = write(f"{TMP}/train.json", TRAIN)
    trainers = [Client(CL, node, "conv", "train", tp,
                       extra=["--finite", "--sparse", str(SPARSE)]) for node in (0, 1)]
    for c in trainers:
        assert c.ok(), f"trainer: {c.first} {c.p.stderr.read()}"
    paths = [write(f"{TMP}/i0.json", I0), write(f"{TMP}/i1.json", I1)]
    infs = [Client(CL, 2, "conv", "infer", paths[0], instance="i0",
                   install="double-buffer"),
            Client(CL, 3, "conv", "infer", paths[1], instance="i1", install="in-place",
                   pad=3)]
    for c in infs:
        assert c.ok(), f"instance: {c.first} {c.p.stderr.read()}"
    STATE.update(trainers=trainers, infs=infs, paths=paths)


def refit_version(version, mode=pb.RESHARD, delta=False):
    """The trainers step to version (past the first), it is refitted in mode,
    every instance installs it, and each equals the numpy reference.  delta:
    verify on, encoded against the version before (tcp; else dense)."""
    if version > 1:
        for c in STATE["trainers"]:
            out = c.cmd(f"next {version}")
            assert out.startswith("READY"), out
    g = CL.refit("conv", version, mode=mode, verify=delta)
    assert g.state == pb.COMMITTED, g.failure
    if harness.TRANSPORT == "tcp":
        assert (g.delta_wire_bytes > 0) == delta and g.delta_wire_bytes < \
            max(g.delta_dense_bytes, 1) / 4, (delta, g)
    for c in STATE["infs"]:
        out = c.cmd(f"wait {version} 20000")
        assert out.startswith(f"INSTALLED {version} "), out
    return g, compare(STATE["infs"], STATE["paths"], version)


def reshard_bit_exact():
    g, n = refit_version(1)
    print(f"     reshard: {n['elements']} elements in {n['shards']} shards equal the "
          f"numpy reference ({g.bytes} bytes over {harness.TRANSPORT})")
    g, _ = refit_version(2, delta=True)
    print(f"     again as delta: {g.delta_wire_bytes} bytes for {g.delta_dense_bytes} dense, "
          f"{g.dense_wire_bytes} bytes dense")
    if harness.TRANSPORT == "nccl":   # the GPU path: its conversion kernels converted
        with open(CL.log.name) as f:
            log = f.read()
        assert "conversion kernels: " in log and "(converting models refused)" not in log, \
            log[-2000:]
        assert "communicators of epoch" in log, "the refit did not run over nccl"


def broadcast_bit_exact():
    _, n = refit_version(3, mode=pb.BROADCAST)
    print(f"     gather-and-broadcast: {n['elements']} elements in {n['shards']} shards "
          f"equal the numpy reference")
    refit_version(4, mode=pb.BROADCAST, delta=True)


def coordinator_restart_keeps_conversions():
    """The state file keeps the instances' conversions (and their digests)."""
    CL.coord.terminate()
    CL.coord.wait(timeout=20)
    CL.restart_coord()
    CL.wait_members(4, timeout=30)
    refit_version(5)  # dense: the bases the coordinator knew are not kept


def fp8_crosses_the_wire():
    """The coordinator's explain counts converted bytes: fewer than bf16."""
    r = subprocess.run([f"{BUILD}/bin/refit-plan", "explain", "--src", f"{TMP}/train.json",
                        "--dst", STATE["paths"][1], "--topology", "host:16"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout
    assert "on the senders" in r.stdout and "on the receivers" in r.stdout, r.stdout


def bad_conversion_refused():
    bad = [dict(t) for t in I0]
    bad[0] = dict(bad[0], convert={"from": "fp16"})
    p = write(f"{TMP}/bad.json", bad)
    c = Client(CL, 2, "conv", "infer", p, instance="bad", install="in-place")
    try:
        assert c.first.startswith("ERROR") and "from fp16 but the source is bf16" in c.first, \
            f"{c.first!r} {c.p.stderr.read()[:3000]}"
    finally:
        c.close()
        harness.PROCS.remove(c.p)   # it exits 1, as it should


try:
    check("trainer and two fp8 instances register", setup)
    if STATE:
        check("reshard: fp8 weights, scales and casts equal the numpy reference; again "
              "as delta", reshard_bit_exact)
        check("gather-and-broadcast: the next version equal the numpy reference; again "
              "as delta", broadcast_bit_exact)
        check("coordinator restarted from its state file: the next version converts alike",
              coordinator_restart_keeps_conversions)
        check("refit-plan explain shows both conversion sites", fp8_crosses_the_wire)
        check("a conversion that disagrees with the source is refused at registration",
              bad_conversion_refused)
finally:
    for k in ("trainers", "infs"):
        for c in STATE.get(k, []):
            c.close()
    harness.stop_all()
    harness.check_exits()
harness.summary("conversion")
