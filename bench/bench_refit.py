#!/usr/bin/python3
"""Refit benchmarks over the tcp data plane on loopback (part of `make bench`).

1. tcp throughput per pair: one training node sends one large tensor to one
   inference node (reshard, no verify, then verify), bytes / time moving data.
2. reshard vs gather-and-broadcast: the same layouts (a Llama-like model,
   TP2 x PP2 x DP2 training on two nodes -> two TP4 instances on two nodes),
   measured in one run, both modes, with the ratio.

Usage: bench_refit.py BUILD_DIR [--json FILE].  Times are wall clock on a
shared machine: compare the ratios within one run, not absolute numbers
across runs.  --json writes the figures also as one JSON object to FILE
(scripts/figures.py reads it).
"""
import json
import sys

from bench_cluster import Testbed

ARGS = sys.argv[1:]
JSON_OUT = None
if "--json" in ARGS:
    i = ARGS.index("--json")
    if i + 1 >= len(ARGS):
        raise SystemExit("bench_refit.py: --json needs a file name")
    JSON_OUT = ARGS[i + 1]
    del ARGS[i:i + 2]
if len(ARGS) > 1:
    raise SystemExit(f"bench_refit.py: unexpected argument \"{ARGS[1]}\" "
                     "(usage: bench_refit.py BUILD_DIR [--json FILE])")
BUILD = ARGS[0] if ARGS else "build"
FIG = {}
TB = Testbed(BUILD, "refit-bench-")
TMP, ctl, client = TB.tmp, TB.ctl, TB.client


def refit(model, version, mode="reshard", verify=False):
    args = ["--json", "trigger", model, "--version", str(version), "--mode", mode, "--wait"]
    if verify:
        args.append("--verify")
    out = ctl(*args)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["state"] == "COMMITTED", r
    data_us = max((s["micros"] for s in r["stages"]), default=0)
    return r, data_us / 1e6, (r["finished_unix_ms"] - r["created_unix_ms"]) / 1e3


def wait_all(clients, version):
    for p in clients:
        p.stdin.write(f"wait {version} 600000\n")
        p.stdin.flush()
        line = p.stdout.readline()
        assert "mismatches=0" in line, line


def step(clients, version):
    for p in clients:
        p.stdin.write(f"next {version}\n")
        p.stdin.flush()
        assert p.stdout.readline().startswith("READY")


def write(name, tensors):
    path = f"{TMP}/{name}.json"
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f)
    return path


try:
    TB.start([("train0", "0-3"), ("train1", "4-7"), ("infer0", "8-11"), ("infer1", "12-15")])
    # 1. one pair, one 256 MiB tensor: rank 0 -> rank 8
    t = write("big-t", [{"name": "w", "dtype": "fp32", "shape": [8192, 8192], "mesh": [0],
                         "placements": ["Replicate()"]}])
    i = write("big-i", [{"name": "w", "dtype": "fp32", "shape": [8192, 8192], "mesh": [8],
                         "placements": ["Replicate()"]}])
    tr = [client("train0", "big", "train", t)]
    inf = [client("infer0", "big", "infer", i, "i0")]
    print("refit benchmarks, tcp data plane on loopback (wall clock; compare ratios)")
    print()
    print("tcp throughput, one pair (train0 -> infer0), one 256 MiB fp32 tensor:")
    for v, verify in ((1, False), (2, True)):
        if v > 1:
            step(tr, v)
        r, data_s, total_s = refit("big", v, verify=verify)
        wait_all(inf, v)
        FIG["pair_verify" if verify else "pair"] = {
            "bytes": r["bytes"], "data_s": data_s, "total_s": total_s}
        print(f"  {'verify (CRC-32C) ' if verify else 'plain            '}"
              f"{r['bytes'] / 2**20:8.0f} MiB in {data_s * 1e3:7.1f} ms moving data "
              f"({r['bytes'] / data_s / 1e9:5.2f} GB/s); {total_s * 1e3:7.1f} ms end to end")
    for p in tr + inf:
        p.stdin.close()
        p.wait()
    # 2. reshard vs broadcast, same layouts: the example model, scaled up 16x per dim 0
    ex_t = json.load(open("config/examples/train-tp2pp2dp2.json"))["tensors"]
    ex_a = json.load(open("config/examples/infer-tp4-a.json"))["tensors"]
    ex_b = json.load(open("config/examples/infer-tp4-b.json"))["tensors"]
    for lst in (ex_t, ex_a, ex_b):
        for x in lst:
            x["shape"] = [x["shape"][0] * 16] + x["shape"][1:] if len(x["shape"]) > 1 \
                else x["shape"]
            x["shape"] = [d * 4 for d in x["shape"]][:1] + x["shape"][1:] \
                if len(x["shape"]) > 1 else x["shape"]
    t = write("m-t", ex_t)
    tr = [client("train0", "m", "train", t), client("train1", "m", "train", t)]
    inf = [client("infer0", "m", "infer", write("m-a", ex_a), "a"),
           client("infer1", "m", "infer", write("m-b", ex_b), "b")]
    res = {}
    for v, mode in ((1, "reshard"), (2, "broadcast"), (3, "reshard"), (4, "broadcast")):
        if v > 1:
            step(tr, v)
        r, data_s, total_s = refit("m", v, mode)
        wait_all(inf, v)
        res.setdefault(mode, []).append((r["bytes"], data_s, total_s))
    print()
    mb = sum(x[0] for x in res["reshard"]) / 2 / 2**20
    print(f"reshard vs gather-and-broadcast, Llama-like model scaled up "
          f"(TP2xPP2xDP2 on 2 nodes -> 2 x TP4 on 2 nodes), best of 2:")
    rs = min(x[1] for x in res["reshard"])
    bs = min(x[1] for x in res["broadcast"])
    print(f"  reshard    {res['reshard'][0][0] / 2**20:8.1f} MiB over tcp, "
          f"{rs * 1e3:7.1f} ms moving data")
    print(f"  broadcast  {res['broadcast'][0][0] / 2**20:8.1f} MiB over tcp, "
          f"{bs * 1e3:7.1f} ms moving data")
    print(f"  ratio      broadcast / reshard time = {bs / rs:.2f}x  (model {mb:.1f} MiB "
          f"per reshard refit)")
    for mode in ("reshard", "broadcast"):
        FIG[mode] = {"bytes": res[mode][0][0], "data_s": [x[1] for x in res[mode]],
                     "total_s": [x[2] for x in res[mode]]}
    FIG["model_mib"] = mb
    if JSON_OUT:
        with open(JSON_OUT, "w") as f:
            json.dump(FIG, f)
finally:
    TB.close()
