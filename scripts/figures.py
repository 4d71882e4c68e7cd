#!/usr/bin/python3
"""figures.py - regenerate every planner and model figure in the docs.

Usage: scripts/figures.py BUILD_DIR [--only NAME[,NAME...]] [--list]

Runs build/bin/refit-plan and build/bin/bench-plan and rewrites the marked
regions of README.md and docs/performance.md:

    <!-- figures:NAME -->
    ...generated text...
    <!-- /figures -->

Everything between the markers is replaced; text outside them is not
touched.  `make figures` runs this.  The figures are the cost model's
(modelled times, not measurements) and planning times on this machine; the
testbed's measured tables come from `make testbed` (root) and are not
regenerated here.
"""
import datetime
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "docs/performance.md"]

# NVIDIA's measured figures (NCCL M2N reshard announcement): gather-and-
# broadcast and M2N refit times; Perplexity's for Kimi-K2.
CASES = [
    # label, model, train, infer, topology, placement, published broadcast, published M2N
    ("Qwen3-235B-A22B, DGX H100", "qwen3-235b-a22b", "tp4,pp4,ep8", "tp8,dp16",
     "dgx-h100", None, "6.4 s", "1.9 s"),
    ("DeepSeek-V3 671B, DGX H100", "deepseek-v3", "pp16,ep16", "tp32,dp8",
     "dgx-h100", None, "14.9 s", "2.6 s"),
    ("DeepSeek-V3 671B, GB200 NVL72, rack-aligned", "deepseek-v3", "pp16,ep16", "tp32,dp8",
     "gb200-nvl72", "rack-aligned", "3.84 s (direct, 256 GPUs)",
     "1.45 s (hierarchical, 256 GPUs)"),
    ("DeepSeek-V3 671B, GB200 NVL72, packed", "deepseek-v3", "pp16,ep16", "tp32,dp8",
     "gb200-nvl72", "packed", "-", "-"),
    ("Kimi-K2 1T, 256 -> 128 GPUs (TP8 x DP16), DGX H100", "kimi-k2", "pp16,ep16", "tp8,dp16",
     "dgx-h100", None, "-", "1.3 s (Perplexity)"),
    ("Kimi-K2 1T, 256 -> 128 GPUs (TP16 x DP8), DGX H100", "kimi-k2", "pp16,ep16", "tp16,dp8",
     "dgx-h100", None, "-", "1.3 s (Perplexity)"),
    ("Llama-3-70B, TP8xPP4xDP2 -> TP16xDP4, DGX H100", "llama-3-70b", "tp8,pp4,dp2",
     "tp16,dp4", "dgx-h100", None, "-", "-"),
    ("Qwen3-30B-A3B, TP2xPP2xEP8 -> TP4xDP8, DGX H100", "qwen3-30b-a3b", "tp2,pp2,ep8",
     "tp4,dp8", "dgx-h100", None, "-", "-"),
]

# realistic GB200 layouts: every catalogue model, rack-aligned
MATRIX_MODELS = [("Qwen3-30B-A3B", "qwen3-30b-a3b", "tp2,pp2,ep8"),
                 ("Llama-3-70B", "llama-3-70b", "tp8,pp4,dp2"),
                 ("Qwen3-235B-A22B", "qwen3-235b-a22b", "tp4,pp4,ep8"),
                 ("DeepSeek-V3", "deepseek-v3", "pp16,ep16"),
                 ("Kimi-K2", "kimi-k2", "pp16,ep16")]
MATRIX_TP = [8, 16, 32]
MATRIX_DP = [4, 16, 32]


def gib(b):
    if b >= 1 << 40:
        return "%.2f TiB" % (b / 2.0 ** 40)
    if b >= 1 << 30:
        return "%.1f GiB" % (b / 2.0 ** 30)
    return "%.0f MiB" % (b / 2.0 ** 20)


def sec(s):
    return "%.3f s" % s if s < 1 else "%.2f s" % s


def run_model(build, model, train, infer, topo, placement, chunks=None):
    cmd = [os.path.join(build, "bin", "refit-plan"), "model", "--model", model,
           "--train", train, "--infer", infer, "--topology", topo, "--json"]
    if placement:
        cmd += ["--placement", placement]
    if chunks:
        cmd += ["--baseline-chunks", chunks]
    rss = None
    if os.path.exists("/usr/bin/time"):
        cmd = ["/usr/bin/time", "-f", "maxrss %M"] + cmd
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("figures: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr))
    m = re.search(r"maxrss (\d+)", p.stderr)
    if m:
        rss = int(m.group(1)) * 1024
    d = json.loads(p.stdout)
    d["_wall"] = wall
    d["_rss"] = rss
    d["_cmd"] = " ".join(c for c in cmd if not c.startswith("/usr/bin/time")
                         and c not in ("-f", "maxrss %M"))
    return d


def gen_model_table(build, state):
    if "model_table" in state:
        return state["model_table"]
    rows = []
    for (label, model, train, infer, topo, pl, pub_b, pub_m) in CASES:
        d = run_model(build, model, train, infer, topo, pl)
        state.setdefault("cases", []).append((label, d))
        r, b, bb = d["reshard"], d["broadcast"], d["broadcast_best"]
        rows.append("| %s | %s | %s | %s | %s | %s | %s | %.3f | %s | %s (%d MiB) | x%.1f | x%.1f | %.2f M | %.2f s |" % (
            label, pub_b, pub_m, gib(r["network_bytes"]), gib(r["busiest_nic"]["bytes"]),
            sec(r["lower_bound_s"]), sec(r["time_s"]), r["ratio"], sec(b["time_s"]),
            sec(bb["cost"]["time_s"]), bb["chunk_bytes"] >> 20, d["speedup"],
            d["speedup_vs_best"], d["transfers"] / 1e6, d["plan_seconds"]))
    head = ("| case | published broadcast (measured) | published M2N (measured) | "
            "refit network bytes | busiest NIC | lower bound | reshard (modelled) | ratio | "
            "broadcast at 4 MiB (modelled) | broadcast at its best chunk (modelled) | "
            "speed-up vs 4 MiB | speed-up vs best | transfers | plan time |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    cmds = "\n".join("    " + d["_cmd"].replace(ROOT + "/", "") for _, d in state["cases"])
    state["model_table"] = (
        "Generated by `make figures` on %s (`scripts/figures.py`; plan times on one core "
        "of this machine).  Commands:\n\n%s\n\n%s%s\n" %
        (state["date"], cmds, head, "\n".join(rows)))
    return state["model_table"]


def gen_gb200_matrix(build, state):
    out = []
    worst = 0.0
    for (label, model, train) in MATRIX_MODELS:
        cells = []
        for tp in MATRIX_TP:
            for dp in MATRIX_DP:
                d = run_model(build, model, train, "tp%d,dp%d" % (tp, dp), "gb200-nvl72",
                              "rack-aligned", chunks="4MiB")
                r = d["reshard"]
                worst = max(worst, r["ratio"])
                cells.append("%.3f" % r["ratio"])
        out.append("| %s (`--train %s`) | %s |" % (label, train, " | ".join(cells)))
    state["matrix_worst"] = worst
    cols = " | ".join("tp%d x dp%d" % (tp, dp) for tp in MATRIX_TP for dp in MATRIX_DP)
    return ("Reshard time / lower bound on `gb200-nvl72`, rack-aligned placement (generated by "
            "`make figures` on %s; `refit-plan model --model M --train T --infer tpN,dpN "
            "--topology gb200-nvl72 --json`).  Worst cell: %.3f.\n\n| model | %s |\n|---|%s\n%s\n" %
            (state["date"], worst, cols, "---|" * (len(MATRIX_TP) * len(MATRIX_DP)),
             "\n".join(out)))


def gen_planner_summary(build, state):
    gen_model_table(build, state)
    cs = state["cases"]
    ratios = [d["reshard"]["ratio"] for _, d in cs]
    parts = []
    for label, d in cs:
        parts.append("%s %s -> %s (%.2f M transfers) in %.2f s" % (
            label.split(",")[0] + ("" if "DGX" in label else ", GB200 " + d["placement"]),
            d["train"], d["infer"], d["transfers"] / 1e6, d["plan_seconds"]))
    return ("Whole models (`refit-plan model`, see `docs/performance.md`; generated by `make "
            "figures` on %s, one core of this machine): %s; modelled reshard times are within "
            "%.2f-%.2fx of the bandwidth lower bound.\n" %
            (state["date"], "; ".join(parts), min(ratios), max(ratios)))


def gen_bench_plan(build, state):
    p = subprocess.run([os.path.join(build, "bin", "bench-plan")], cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("figures: bench-plan failed: %s" % p.stderr)
    return ("`build/bin/bench-plan` (the first part of `make bench`), one run on %s:\n\n"
            "```\n%s```\n" % (state["date"], p.stdout))


def gen_llama_explain(build, state):
    tmp = os.path.join(build, "figures-llama70b")
    os.makedirs(tmp, exist_ok=True)
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "example-llama70b.py"),
                    tmp], cwd=ROOT, check=True, capture_output=True)
    cmd = [os.path.join(build, "bin", "refit-plan"), "explain", "--src",
           os.path.join(tmp, "train.json"), "--dst", os.path.join(tmp, "infer.json"),
           "--topology", "dgx-h100:128", "--json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("figures: refit-plan explain failed: %s" % p.stderr)
    d = json.loads(p.stdout)
    r, b = d["reshard"], d["broadcast"]
    return ("A dense model plans in well under a second: Llama-3-70B from TP8 x PP4 x DP2 "
            "on 64 ranks to 4 replicas of TP16 on 64 ranks (`scripts/example-llama70b.py DIR`, "
            "then `refit-plan explain --src DIR/train.json --dst DIR/infer.json --topology "
            "dgx-h100:128`; generated by `make figures` on %s): %s messages, %.2f s to plan, "
            "validate and print both modes; modelled %s for reshard against a %s lower bound "
            "(x%.3f) and %s for gather-and-broadcast at the same 4 MiB chunks (x%.1f).\n" % (
                state["date"], "{:,}".format(r["messages"]), wall, sec(r["cost"]["time_s"]),
                sec(r["cost"]["lower_bound_s"]), r["cost"]["ratio"],
                sec(b["cost"]["time_s"]), b["cost"]["time_s"] / r["cost"]["time_s"]))


SCALE_CASES = [
    ("DeepSeek-V3, 256 -> 256 ranks (512), DGX H100", "deepseek-v3", "pp16,ep16", "tp32,dp8",
     "dgx-h100"),
    ("DeepSeek-V3, 256 -> 256 ranks (576 with idle GPUs), GB200 NVL72", "deepseek-v3",
     "pp16,ep16", "tp32,dp8", "gb200-nvl72"),
    ("Kimi-K2, 1,024 -> 1,024 ranks (2,048), DGX H100", "kimi-k2", "pp16,ep64", "tp16,dp64",
     "dgx-h100"),
]


def gen_planning_scale(build, state):
    rows = []
    for (label, model, train, infer, topo) in SCALE_CASES:
        d = run_model(build, model, train, infer, topo, None, chunks="4MiB")
        rows.append("| %s | `--train %s --infer %s --topology %s` | %.2f M | %.2f s | %.1f s | %s |" % (
            label, train, infer, topo, d["transfers"] / 1e6, d["plan_seconds"], d["_wall"],
            "%.2f GiB" % (d["_rss"] / 2.0 ** 30) if d["_rss"] else "-"))
    return ("Planning at scale (generated by `make figures` on %s; `refit-plan model --model M "
            "... --baseline-chunks 4MiB`, one core of this machine).  \"plan\" is the reshard "
            "plan alone; \"wall\" and peak RSS cover the whole command (layouts, reshard and "
            "broadcast plans, costs):\n\n| case | command | transfers | plan | wall | peak RSS |\n"
            "|---|---|---|---|---|---|\n%s\n" % (state["date"], "\n".join(rows)))


GENERATORS = {
    "planning-scale": gen_planning_scale,
    "llama-explain": gen_llama_explain,
    "model-table": gen_model_table,
    "gb200-matrix": gen_gb200_matrix,
    "planner-summary": gen_planner_summary,
    "bench-plan": gen_bench_plan,
}

MARK = re.compile(r"(<!-- figures:([a-z0-9-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    build = os.path.abspath(args[0])
    only = None
    if "--list" in args:
        for name in GENERATORS:
            print(name)
        return 0
    if "--only" in args:
        only = set(args[args.index("--only") + 1].split(","))
        bad = only - set(GENERATORS)
        if bad:
            sys.exit("figures: unknown region(s) %s (known: %s)" %
                     (", ".join(sorted(bad)), ", ".join(GENERATORS)))
    state = {"date": datetime.date.today().isoformat()}
    done = {}
    for doc in DOCS:
        path = os.path.join(ROOT, doc)
        with open(path) as f:
            text = f.read()

        def repl(m):
            name = m.group(2)
            if name not in GENERATORS:
                sys.exit("figures: %s: unknown region \"%s\"" % (doc, name))
            if only is not None and name not in only:
                return m.group(0)
            if name not in done:
                print("figures: %s ..." % name, flush=True)
                done[name] = GENERATORS[name](build, state)
            return m.group(1) + done[name] + m.group(4)

        new = MARK.sub(repl, text)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            print("figures: rewrote %s" % doc)
    missing = (only or set(GENERATORS)) - set(done)
    if missing:
        sys.exit("figures: no marked region for %s" % ", ".join(sorted(missing)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
