#!/usr/bin/python3
"""Delta refits against dense ones on the testbed (tcp on loopback;
docs/delta.md, issue 26).

A coordinator and two node daemons (train0: ranks 0-1, infer0: ranks 2-3),
one bf16 model of 8 tensors [1024, 4096] (64 MiB), trained Shard(0) and
served Shard(1) by a double-buffered instance.  For each density D (the
measured ones: 0.05 %, 0.4 %, 3 %; and 100 %: what trying costs a refit
whose weights all change) a model whose versions change D of the
elements (refit-client --sparse, independent changes as measured): v1 dense
(warm-up), v2 and v3 with the model's delta off (dense), v4 dense again (delta
auto, but no bases were kept while off), v5 and v6 delta against the
version before.  Reported per density: the dense and delta refits' time
moving data (the slowest stage) and end to end, best of two each, and the
bytes on the wire.  Every refit is checked byte for byte by the instance.

Usage: bench_delta_refit.py BUILD_DIR [--json FILE] [--densities 0.0005,0.004,0.03,1].
Wall clock on a shared machine: compare within one run.  On loopback the
"network" is a memory copy, as fast as the codec itself: the time delta
saves here is what a network slower than one core's codec would save more
of (docs/delta.md reads the figures).
"""
import json
import sys

from bench_cluster import Testbed

ARGS = sys.argv[1:]
JSON_OUT = None
DENS = [0.0005, 0.004, 0.03, 1.0]
while len(ARGS) > 1 and ARGS[-2] in ("--json", "--densities"):
    if ARGS[-2] == "--json":
        JSON_OUT = ARGS[-1]
    else:
        DENS = [float(x) for x in ARGS[-1].split(",")]
    del ARGS[-2:]
if len(ARGS) > 1:
    raise SystemExit("usage: bench_delta_refit.py BUILD_DIR [--json FILE] "
                     "[--densities D,D,...]")
BUILD = ARGS[0] if ARGS else "build"
TB = Testbed(BUILD, "refit-bdelta-")
TMP, ctl = TB.tmp, TB.ctl
SHAPE = [1024, 4096]
NT = 8


def write(name, ranks, placement):
    path = f"{TMP}/{name}.json"
    with open(path, "w") as f:
        json.dump({"tensors": [{"name": f"w{k}", "dtype": "bf16", "shape": SHAPE,
                                "mesh": ranks, "placements": [placement]}
                               for k in range(NT)]}, f)
    return path


def client(node, model, role, layouts, ppm, instance=""):
    return TB.client(node, model, role, layouts, instance, ["--sparse", str(ppm)] +
                     (["--install", "double-buffer"] if instance else []))


def cmd(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline()


def refit(model, v, tr, inf):
    if v > 1:
        assert cmd(tr, f"next {v}").startswith("READY")
    out = ctl("--json", "trigger", model, "--version", str(v), "--wait")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["state"] == "COMMITTED", r
    line = cmd(inf, f"wait {v} 600000")
    assert "mismatches=0" in line, line
    data_s = max((s["micros"] for s in r["stages"]), default=0) / 1e6
    return r, data_s, (r["finished_unix_ms"] - r["created_unix_ms"]) / 1e3


def one(d):
    model = f"d{int(d * 1e6)}"
    ppm = int(round(d * 1e6))
    tr = client("train0", model, "train", write(f"{model}-t", [0, 1], "Shard(0)"), ppm)
    inf = client("infer0", model, "infer", write(f"{model}-i", [2, 3], "Shard(1)"), ppm, "i")
    refit(model, 1, tr, inf)
    assert ctl("policy", model, "--delta", "off").returncode == 0
    dense = [refit(model, v, tr, inf) for v in (2, 3)]
    assert ctl("policy", model, "--delta", "auto").returncode == 0
    refit(model, 4, tr, inf)
    delta = [refit(model, v, tr, inf) for v in (5, 6)]
    for p in (tr, inf):
        p.stdin.close()
        p.wait()
    assert all(r["delta_wire_bytes"] == 0 for r, _, _ in dense)
    # (a density of 1: every unit dense, the cost of trying)
    assert d >= 0.5 or all(r["delta_wire_bytes"] > 0 for r, _, _ in delta), delta
    best = lambda rs, k: min(x[k] for x in rs)  # noqa: E731
    r = delta[0][0]
    return {"density": d, "model_bytes": NT * SHAPE[0] * SHAPE[1] * 2,
            "dense_bytes": dense[0][0]["dense_wire_bytes"],
            "delta_wire_bytes": r["delta_wire_bytes"], "delta_dense_bytes":
            r["delta_dense_bytes"], "delta_dense_units_bytes": r["dense_wire_bytes"],
            "dense_data_s": best(dense, 1), "dense_total_s": best(dense, 2),
            "delta_data_s": best(delta, 1), "delta_total_s": best(delta, 2)}


try:
    TB.start([("train0", "0-1"), ("infer0", "2-3")])
    res = []
    print("delta refits vs dense, tcp on loopback, one bf16 model of %d MiB (train0 ranks "
          "0-1 -> infer0 ranks 2-3), best of 2 each" % (NT * SHAPE[0] * SHAPE[1] * 2 >> 20))
    print("%-9s %12s %12s %8s %12s %12s %12s %12s" % (
        "density", "dense B", "delta B", "share", "dense data", "delta data", "dense e2e",
        "delta e2e"))
    for d in DENS:
        x = one(d)
        res.append(x)
        wire = x["delta_wire_bytes"] + x["delta_dense_units_bytes"]
        print("%7.2f %% %12d %12d %7.2f%% %10.1f ms %10.1f ms %10.1f ms %10.1f ms" % (
            100 * d, x["dense_bytes"], wire, 100.0 * wire / x["dense_bytes"],
            1e3 * x["dense_data_s"], 1e3 * x["delta_data_s"], 1e3 * x["dense_total_s"],
            1e3 * x["delta_total_s"]))
        sys.stdout.flush()
    if JSON_OUT:
        with open(JSON_OUT, "w") as f:
            json.dump({"runs": res}, f)
finally:
    TB.close()
