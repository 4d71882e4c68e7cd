#!/usr/bin/env python3
"""Self-test of tests/frameworks/discover.py: maps discovered from an
engine's own loader equal refit's generated maps.

    build/venv-vllm/bin/python tests/frameworks/test_discover.py [BUILD_DIR]
    build/venv-sglang/bin/python tests/frameworks/test_discover.py [BUILD_DIR]
        [--only MODEL,...]

Uses whichever engine imports (vLLM first, then SGLang), and the tiny
models of test_vllm.py / test_sglang.py: llama (GQA, 2 KV heads: replicated
from tp 4), qwen2 (q/k/v biases), qwen3 (tied embeddings, q_norm / k_norm)
and qwen3_moe (TP-split experts, and ep = tp).  For each (model, spec):

  "discover": the engine's loader dry-run on every rank (discover.py), the
    map derived from what it wrote (discover.derive_map), then against
    `refit-plan framework-map --framework F --model CONFIG --par SPEC`:
    the same world, the same tensors (names, shapes, dtypes), on every rank
    the same parameters (names, shapes, dtypes), and both maps expanded by
    fwmap.expected and compared element for element (tensor ids by name);
  "layouts": the discovered map's layouts in layout-file JSON (explicit
    shards: for each tensor the boxes {rank, offset, size} of all ranks, in
    map order) accepted by the C library: `refit-plan boxes FILE` exits 0
    and prints every box back, `refit-plan plan --src FILE --dst FILE
    --topology host:WORLD` validates (the source covers every tensor), and
    discover.check_map finds no rank holding an element twice.

A few cases on synthetic arrays check what the decomposition refuses
(transposed, flattened, duplicated elements) and that an interleaved layout
still comes out exact, one box per row.

Prints PASS / FAIL lines, then "N passed, N failed".  Exit 0 all passed,
1 a failure, 2 no engine importable.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import fwmap
    import discover
except ImportError as _e:
    print("cannot import numpy / discover: %s" % _e)
    sys.exit(2)

ROOT = os.path.dirname(os.path.dirname(HERE))

# model -> specs (refit's --par); the same for both engines
SPECS = {
    "llama": ["tp1", "tp2", "tp4", "tp8"],
    "qwen2": ["tp1", "tp2", "tp4", "tp8"],
    "qwen3": ["tp1", "tp2", "tp4", "tp8"],
    "qwen3_moe": ["tp1", "tp2", "tp4", "tp8", "tp2,ep2", "tp4,ep4", "tp8,ep8"],
}


def parse(par):
    d = {"tp": 1, "dp": 1, "ep": 1}
    for f in par.split(","):
        d[f[:2]] = int(f[2:])
    return d["tp"], d["dp"], d["ep"] > 1


class Results:
    def __init__(self):
        self.n_pass = self.n_fail = 0

    def case(self, title, errs):
        if errs:
            self.n_fail += 1
            print("FAIL %s: %s" % (title, "\n    ".join(errs[:10]) +
                                   ("\n    (%d errors)" % len(errs) if len(errs) > 10 else "")))
        else:
            self.n_pass += 1
            print("PASS %s" % title)
        sys.stdout.flush()


# ---------------------------------------------------------------- checks

def compare_maps(ref, got):
    """(errors, dtype notes): got (discovered) against ref (refit's map).
    Dtypes are notes, not errors: they are what the engine makes of the
    config's dtype (both engines downcast a float32 config: SGLang to
    fp16, vLLM to its platform's first dtype), not a layout."""
    errs, notes = [], []
    if ref["world"] != got["world"]:
        errs.append("world %s in refit's map, %s discovered" % (ref["world"], got["world"]))
    rt = {t["name"]: t for t in ref["tensors"]}
    gt = {t["name"]: t for t in got["tensors"]}
    errs += ["tensor %s: in refit's map, held by no rank of the engine" % n
             for n in rt if n not in gt]
    errs += ["tensor %s: held by the engine, not in refit's map" % n
             for n in gt if n not in rt]
    for n in rt:
        if n in gt:
            for k in ("shape", "dtype"):
                if rt[n][k] != gt[n][k]:
                    msg = "tensor %s: %s %s in refit's map, %s discovered" % (
                        n, k, rt[n][k], gt[n][k])
                    if k == "shape":
                        errs.append(msg)
                    else:
                        notes.append((msg, rt[n][k], gt[n][k]))
    names = [t["name"] for t in ref["tensors"]]
    rid = {n: i for i, n in enumerate(names)}
    names += [n for n in gt if n not in rid]
    aid = {n: i for i, n in enumerate(names)}
    # the discovered map's tensor ids -> refit's (names refit lacks after)
    remap = np.array([aid[t["name"]] for t in got["tensors"]] + [-1], dtype=np.int64)
    granks = {r["rank"]: r for r in got["ranks"]}
    for rr in ref["ranks"]:
        r = rr["rank"]
        if r not in granks:
            errs.append("rank %d: not discovered" % r)
            continue
        gr = granks[r]
        rp = {p["name"]: p for p in rr["params"]}
        gp = {p["name"]: p for p in gr["params"]}
        for n in rp:
            if n in gp:
                for k in ("shape", "dtype"):
                    if rp[n][k] != gp[n][k]:
                        msg = "rank %d %s: %s %s in refit's map, %s discovered" % (
                            r, n, k, rp[n][k], gp[n][k])
                        if k == "shape":
                            errs.append(msg)
                        else:
                            notes.append((msg, rp[n][k], gp[n][k]))
        exp = fwmap.expected(ref, rr)
        obs = {}
        for n, (t, i) in fwmap.expected(got, gr).items():
            obs[n] = (remap[t], i)      # padding -1 -> remap[-1] = -1
        errs += ["rank %d %s" % (r, e) for e in fwmap.compare(exp, obs, names=names)]
    return errs, notes


def same_pieces(ref, got):
    """True when every rank's parameters have the very pieces and padding
    boxes of refit's map (orders of parameters and tensors aside)."""
    def key(m):
        return {r["rank"]: {p["name"]: (p["shape"], p["pieces"], p["padding"])
                            for p in r["params"]} for r in m["ranks"]}
    return key(ref) == key(got)


def c_accepts(build, m, tmp, tag):
    """The discovered map's layouts through the C library: refit-plan boxes
    and refit-plan plan (source coverage validated); errors."""
    errs = []
    lay = discover.layout_file(m)
    path = os.path.join(tmp, "layouts.%s.json" % tag.replace(" ", "_").replace(",", "_"))
    with open(path, "w") as f:
        json.dump(lay, f, indent=1)
    exe = fwmap.refit_plan(build)
    out = subprocess.run([exe, "boxes", path], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return ["refit-plan boxes %s exited %d: %s" % (path, out.returncode,
                                                     out.stderr.strip()[:500])]
    try:
        back = json.loads(out.stdout)
        want = {t["name"]: [(s["rank"], s["offset"], s["size"]) for s in t["shards"]]
                for t in lay["tensors"]}
        got = {t["name"]: [(s["rank"], s["offset"], s["size"]) for s in t["shards"]]
               for t in back["tensors"]}
        if got != want:
            errs.append("refit-plan boxes printed other boxes than the layout file holds")
    except Exception as e:  # noqa: BLE001
        errs.append("refit-plan boxes printed no JSON: %s" % e)
    out = subprocess.run([exe, "plan", "--src", path, "--dst", path, "--topology",
                          "host:%d" % m["world"]], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or "validated" not in out.stdout:
        errs.append("refit-plan plan --src/--dst %s exited %d: %s" % (
            path, out.returncode, (out.stderr or out.stdout).strip()[:500]))
    errs += discover.check_map(m)
    return errs


def synthetic(res):
    """What the decomposition refuses, and an interleaved layout."""
    L = discover.LayoutError
    shapes = [(64, 32), (64, 32)]

    def refused(title, fn, words):
        try:
            fn()
            res.case("decompose: %s refused" % title, ["not refused"])
        except L as e:
            res.case("decompose: %s refused" % title,
                     [] if words in str(e) else ["message lacks %r: %s" % (words, e)])
    tr = np.arange(64 * 32, dtype=np.int64).reshape(64, 32).T.copy()
    refused("transposed", lambda: discover.decompose(
        np.zeros((32, 64), np.int64), tr, shapes, "p", max_pieces=256), "more than 256 boxes")
    refused("flattened", lambda: discover.decompose(
        np.zeros((2048,), np.int64), np.arange(2048), shapes, "p"), "more dims")
    a = (np.zeros((64, 32), np.int64), np.arange(2048).reshape(64, 32))
    refused("an element twice on a rank", lambda: discover.derive_map(
        {0: {"a": a, "b": a}}, [("x", (64, 32)), ("y", (64, 32))], "vllm", "m", "tp1"),
        "twice")
    t = np.zeros((130, 32), np.int64)
    t[1:128:2] = 1
    t[128:] = -1
    i = np.full((130, 32), -1, np.int64)
    i[0:128:2] = np.arange(2048).reshape(64, 32)
    i[1:128:2] = np.arange(2048).reshape(64, 32)
    try:
        pc, pd = discover.decompose(t, i, shapes, "interleaved")
        res.case("decompose: interleaved rows exact, one box per row",
                 [] if (len(pc), len(pd)) == (128, 1) else
                 ["%d pieces, %d padding boxes" % (len(pc), len(pd))])
    except L as e:
        res.case("decompose: interleaved rows exact, one box per row", [str(e)])


# ---------------------------------------------------------------- engines

def vllm_models(tmp, archs):
    import test_vllm as tv
    ms = discover._quiet(os.path.join(tmp, "engine.log"), lambda: tv.write_models(tmp, archs))
    return {a: dict(dir=ms[a]["dir"], config=ms[a]["config"], names=ms[a]["names"],
                    shapes=ms[a]["shapes"]) for a in archs}


def sglang_models(S, ts, tmp, archs):
    out = {}
    for name, (d, ckpt) in ts.write_models(S, tmp).items():
        if name in archs:
            out[name] = dict(dir=d, config=os.path.join(d, "config.json"),
                             names=[k for k, _ in ckpt], shapes=[s for _, s in ckpt])
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    only = None
    if "--only" in argv:
        only = argv[argv.index("--only") + 1].split(",")
        args = [a for a in args if a != argv[argv.index("--only") + 1]]
    build = os.path.abspath(args[0] if args else os.path.join(ROOT, "build"))
    archs = [a for a in SPECS if not only or a in only]
    t0 = time.time()
    res = Results()
    synthetic(res)
    if importlib.util.find_spec("vllm") is not None:
        fw = "vllm"
    elif importlib.util.find_spec("sglang") is not None:
        fw = "sglang"
    else:
        print("neither vLLM nor SGLang importable")
        return 2
    tmp = tempfile.mkdtemp(prefix="refit-discover-test-")
    try:
        try:
            if fw == "vllm":
                tv = discover.vllm_setup(tmp)
                import vllm
                import torch
                print("vllm %s, torch %s (imported in %.1fs)" % (
                    vllm.__version__, torch.__version__, time.time() - t0))
                models = vllm_models(tmp, archs)
            else:
                ts, S = discover.sglang_setup()
                print("sglang %s, torch %s (imported in %.1fs)" % (
                    S["sglang"].__version__, S["torch"].__version__, time.time() - t0))
                models = sglang_models(S, ts, tmp, archs)
        except discover.EngineError as e:
            print(str(e))
            return 2
        sys.stdout.flush()
        cases = [(a, par) for a in archs for par in SPECS[a]]
        t1 = time.time()
        observed, failed = {}, {}
        if fw == "vllm":
            reqs = []
            for a, par in cases:
                tp, _, ep = parse(par)
                m = models[a]
                reqs.append(("%s/%s" % (a, par), m["dir"], m["names"], m["shapes"], tp, ep))
            for k, v in discover.vllm_observe(tmp, reqs).items():
                if isinstance(v, discover.EngineError):
                    failed[tuple(k.split("/"))] = str(v).strip().splitlines()[-8:]
                else:
                    observed[k] = v
        else:
            for a, par in cases:
                m = models[a]
                try:
                    observed["%s/%s" % (a, par)] = discover.sglang_observe(
                        ts, S, m["dir"], m["names"], m["shapes"], par)
                except discover.EngineError as e:
                    failed[a, par] = str(e).strip().splitlines()[-8:]
        t_engine = time.time() - t1
        for a, par in cases:
            title = "%s %s %s" % (fw, a, par)
            if (a, par) in failed:
                res.case("discover " + title, ["engine: " + "\n    ".join(failed[a, par])])
                continue
            m = models[a]
            obs, dts = observed["%s/%s" % (a, par)]
            try:
                disc = discover.derive_map(obs, list(zip(m["names"], m["shapes"])), fw,
                                           a, par, dtypes=dts)
            except discover.LayoutError as e:
                res.case("discover " + title, ["derive_map: %s" % e])
                continue
            notes, same = [], False
            try:
                ref = fwmap.load_map(build, fw, m["config"], par)
                errs, notes = compare_maps(ref, disc)
                same = same_pieces(ref, disc)
            except Exception as e:  # noqa: BLE001
                errs = ["%s: %s" % (type(e).__name__, e)] + \
                    traceback.format_exc().strip().splitlines()[-3:]
            res.case("discover %s (%s; %s)" % (
                title, discover.summary(disc),
                "the very pieces of refit's map" if same else
                "other boxes than refit's map, the same elements"), errs)
            if notes:
                kinds = sorted(set("%s in refit's map, %s discovered" % (a_, b_)
                                   for _, a_, b_ in notes))
                print("  note: %d dtypes differ (%s), e.g. %s" % (
                    len(notes), "; ".join(kinds), notes[0][0]))
            # the comparison itself can fail: one piece moved by one row
            if (a, par) == cases[0]:
                bad = json.loads(json.dumps(disc))
                p = next(p for p in bad["ranks"][0]["params"] if p["pieces"]
                         and p["pieces"][0]["size"][0] > 1)
                p["pieces"][0]["offset"][0] += 1
                p["pieces"][0]["size"][0] -= 1
                p["padding"].append({"at": list(p["pieces"][0]["at"]),
                                     "size": [1] + [int(x) for x in p["shape"][1:]]})
                p["pieces"][0]["at"][0] += 1
                e2 = compare_maps(ref, bad)[0] if not errs else ["(not run)"]
                res.case("discover %s: a map with one row moved is told apart" % title,
                         [] if e2 else ["compare_maps found no difference"])
            res.case("layouts %s accepted by the C library" % title,
                     c_accepts(build, disc, tmp, "%s.%s" % (a, par)))
        print("%s loader dry-runs %.1fs, total %.1fs" % (fw, t_engine, time.time() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (res.n_pass, res.n_fail))
    return 1 if res.n_fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
