#!/usr/bin/python3
"""figures.py - regenerate the figures of README.md and docs/*.md.

Usage: scripts/figures.py BUILD_DIR [--set default|slow|all] [--only NAME[,NAME...]]
                          [--list]

Runs the commands that measure or model each figure (build/bin/refit-plan,
bench-plan, bench-rpc, bench-members, bench/bench_refit.py, the delta
refit's in scripts/figures_delta.py, the slow set's in
scripts/figures_slow.py, ...) and
rewrites the marked regions of README.md and docs/*.md:

    <!-- figures:NAME -->
    ...generated text...
    <!-- /figures -->

Everything between the markers is replaced; text outside them is not
touched.  `make figures` runs this with the default set (each generator
under a minute); `make figures FIGURES_SET=slow` runs only the slow ones
(the fault-injection suite's timings: about a minute here, root, processes
killed throughout; the coordinators' fail-over over etcd, test_ha.py with its
30-refit soak, about 160 s, etcd installed; the control-plane curve of
bench/bench_scale.py: up to 256 node daemons), `FIGURES_SET=all` both.
`--only` runs the regions named, whatever their set.  A slow generator
that cannot run here (a missing tool, no root, too little memory) leaves
its region as it is and says why on stderr; a generator that should run
and fails stops the run with a non-zero status and no file is written
(every region is computed first).
`--list` prints each region's name and set.

Figures that are not regenerated (one dated run of a command named beside
them: the emulated testbed, which needs root and network namespaces; the
512- to 1,024-node control-plane runs) are quoted as such in the docs.
"""
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import figures_delta  # noqa: E402 - the delta refit's regions, beside this file
import figures_slow  # noqa: E402 - the slow set's regions (faults, ha, bench-scale)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "docs/performance.md", "docs/dataplane.md", "docs/control-plane.md",
        "docs/faults.md", "docs/conversion.md", "docs/delta.md", "docs/gpu.md", "docs/ha.md"]

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


class Skip(Exception):
    """A generator that cannot run on this machine (a missing tool, no root):
    its region is left as it is and the reason goes to stderr."""


def built(build, name):
    """The path of build/bin/NAME; a generator that should run fails without it."""
    path = os.path.join(build, "bin", name)
    if not os.access(path, os.X_OK):
        sys.exit("figures: %s is not built (make all)" % path)
    return path


def rel(path):
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + "/") else path


def run_cmd(name, cmd, timeout):
    """Run a measuring command from ROOT; its stdout, or exit naming it.  It
    runs in its own process group, so that past its deadline the daemons it
    started go with it."""
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        sys.exit("figures: %s: %s ran past %d s (killed with its processes)" % (
            name, " ".join(cmd), timeout))
    if p.returncode != 0:
        sys.exit("figures: %s: %s failed (exit %d): %s%s" % (
            name, " ".join(cmd), p.returncode, out[-2000:], err[-2000:]))
    return out


def load():
    """The machine's 1-minute load average now, and this process's niceness
    (the benchmarks inherit it), for measured figures."""
    nice = os.nice(0)
    return "load average %.1f at its start%s" % (
        os.getloadavg()[0], ", under nice %d" % nice if nice else "")


def ms(s):
    return "%.1f ms" % (s * 1e3)


def bench_refit(build, state):
    """bench/bench_refit.py's figures (one run, cached for both regions)."""
    if "bench_refit" in state:
        return state["bench_refit"]
    for b in ("refitd", "refitctl", "refit-client"):
        built(build, b)
    fd, out = tempfile.mkstemp(prefix="refit-figures-", suffix=".json")
    os.close(fd)
    state["bench_refit_load"] = load()
    try:
        run_cmd("bench-refit", ["/usr/bin/python3", os.path.join(ROOT, "bench", "bench_refit.py"),
                                build, "--json", out], 600)
        with open(out) as f:
            d = json.load(f)
    finally:
        os.unlink(out)
    d["_cmd"] = "/usr/bin/python3 bench/bench_refit.py %s" % rel(build)
    state["bench_refit"] = d
    return d


def gbps(x):
    return x["bytes"] / x["data_s"] / 1e9


def refit_bytes(d):
    """'80.3 MiB over tcp in both modes', or each mode's bytes where they differ."""
    r, b = d["reshard"]["bytes"], d["broadcast"]["bytes"]
    if r == b:
        return "%.1f MiB over tcp in both modes" % (r / 2.0 ** 20)
    return "%.1f MiB over tcp in reshard, %.1f MiB in gather-and-broadcast" % (
        r / 2.0 ** 20, b / 2.0 ** 20)


def gen_bench_refit(build, state):
    d = bench_refit(build, state)
    r, b = d["reshard"], d["broadcast"]
    rs, bs = min(r["data_s"]), min(b["data_s"])
    over = [t - m for x in (r, b) for t, m in zip(x["total_s"], x["data_s"])]
    return (
        "`%s` (part of `make bench`), loopback, this machine (shared: compare ratios "
        "within the run), one run on %s, %s (generated by `make figures`):\n\n"
        "| case | figure |\n|---|---|\n"
        "| tcp, one pair, one %d MiB fp32 tensor, the pair's first refit | %.2f GB/s moving "
        "data (%s; %s end to end) |\n"
        "| the same tensor again, with verify (CRC-32C) | %.2f GB/s (%s) |\n"
        "| example model scaled to %.0f MiB, TP2xPP2xDP2 on 2 nodes -> 2 x TP4 on 2 nodes, "
        "best of %d refits per mode | reshard %s, gather-and-broadcast %s moving data (x%.2f); "
        "%s |\n"
        "| the same, first refit of each mode | reshard %s, gather-and-broadcast %s |\n"
        "| per-refit overhead of these refits (end to end minus moving data: planning, "
        "PrepareEpoch, RunSlice, SliceDone, Commit, Publish) | %.0f-%.0f ms |\n" % (
            d["_cmd"], state["date"], state["bench_refit_load"], d["pair"]["bytes"] >> 20,
            gbps(d["pair"]),
            ms(d["pair"]["data_s"]), ms(d["pair"]["total_s"]), gbps(d["pair_verify"]),
            ms(d["pair_verify"]["data_s"]), d["model_mib"], len(r["data_s"]), ms(rs), ms(bs),
            bs / rs, refit_bytes(d), ms(r["data_s"][0]), ms(b["data_s"][0]),
            min(over) * 1e3, max(over) * 1e3))


def gen_bench_refit_summary(build, state):
    d = bench_refit(build, state)
    rs, bs = min(d["reshard"]["data_s"]), min(d["broadcast"]["data_s"])
    return (
        "The refit benchmark on loopback (`%s`; one run on %s, %s, generated by `make "
        "figures`; this machine): tcp throughput per pair %.2f GB/s on its first refit (%.2f "
        "GB/s on the second, with CRC-32C verify) for one %d MiB tensor; on the example model "
        "scaled to %.0f MiB, gather-and-broadcast takes "
        "x%.2f the reshard time moving data (best of %d refits per mode), %s (each node is its "
        "own domain here; broadcast's extra work is its serial stages and full copies inside "
        "domains).  `docs/dataplane.md` has the table.\n" % (
            d["_cmd"], state["date"], state["bench_refit_load"], gbps(d["pair"]),
            gbps(d["pair_verify"]),
            d["pair"]["bytes"] >> 20, d["model_mib"], bs / rs, len(d["reshard"]["data_s"]),
            refit_bytes(d)))


def gen_bench_rpc(build, state):
    cmd = [built(build, "bench-rpc"), built(build, "refitd")]
    at = load()
    out = run_cmd("bench-rpc", cmd, 300)
    if "(errors!)" in out:
        sys.exit("figures: bench-rpc: heartbeats failed:\n%s" % out)
    lines = out.splitlines()
    rows = []
    for line in lines:
        f = line.split()
        if len(f) == 5 and f[0].isdigit():
            rows.append((int(f[0]), float(f[4])))
    if not rows or not any(line.startswith("unary Heartbeat latency") for line in lines):
        sys.exit("figures: bench-rpc: no latency line or member rows in its output:\n%s" % out)
    body = "\n".join(("    " + line).rstrip() for line in lines
                     if not line.startswith("refit control-plane benchmark")).strip("\n ")
    n, per = rows[-1]
    return (
        "`%s` (part of `make bench`; bench/bench_rpc.c), coordinator on loopback, one run on "
        "%s, %s (generated by `make figures`):\n\n    %s\n\n"
        "Coordinator CPU per heartbeat: %.0f-%.0f us from %s to %s members; %s nodes "
        "heartbeating every 2 s would cost it about %.1f %% of one core.\n" % (
            " ".join(rel(c) for c in cmd), state["date"], at, body,
            min(r[1] for r in rows), max(r[1] for r in rows), "{:,}".format(rows[0][0]),
            "{:,}".format(n), "{:,}".format(n), n / 2.0 * per / 1e4))


def gen_bench_members(build, state):
    cmd = [built(build, "bench-members"), built(build, "refitd")]
    at = load()
    out = run_cmd("bench-members", cmd, 600)
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 10 and f[0].isdigit():
            rows.append("| %s | %s | %s | %d | %s | %s | %s | %s |" % (
                "{:,}".format(int(f[0])), f[1], "{:,}".format(round(float(f[5]))),
                int(f[2]) + int(f[4]), f[6], f[7], f[8], "%.1f" % float(f[9])))
    if not rows:
        sys.exit("figures: bench-members: no rows in its output:\n%s" % out)
    return (
        "`%s`, one run on %s, %s (generated by `make figures`):\n\n"
        "| members | join all s | heartbeats/s | late or failed | coordinator CPU (%% of one "
        "core) | coordinator RSS MiB | threads | RSS KiB per member |\n"
        "|---|---|---|---|---|---|---|---|\n%s\n" % (
            " ".join(rel(c) for c in cmd), state["date"], at, "\n".join(rows)))


FP8_CASES = [
    # label, model, infer, topology
    ("DeepSeek-V3, PP16xEP16 -> TP32xDP8, DGX H100", "deepseek-v3", "tp32,dp8", "dgx-h100"),
    ("DeepSeek-V3, PP16xEP16 -> TP32xDP8, GB200 NVL72", "deepseek-v3", "tp32,dp8",
     "gb200-nvl72"),
    ("Kimi-K2, PP16xEP16 -> TP8xDP16, DGX H100", "kimi-k2", "tp8,dp16", "dgx-h100"),
    ("Kimi-K2, PP16xEP16 -> TP16xDP8, DGX H100", "kimi-k2", "tp16,dp8", "dgx-h100"),
]


def gen_fp8_table(build, state):
    plan = built(build, "refit-plan")
    rows, conv, net, tim, ratio = [], {}, [], [], []
    for (label, model, infer, topo) in FP8_CASES:
        got = {}
        for dt in ("same", "fp8-block128"):
            cmd = [plan, "model", "--model", model, "--train", "pp16,ep16", "--infer", infer,
                   "--topology", topo, "--infer-dtype", dt, "--json"]
            d = json.loads(run_cmd("fp8-table", cmd, 600))
            got[dt] = d
            r = d["reshard"]
            ratio.append(r["ratio"])
            rows.append("| %s%s | %s | %s | %s | %s | %.3f s | %.3f s | %.3f | %s |" % (
                label, ", " + d["placement"] if topo != "dgx-h100" else "",
                "bf16" if dt == "same" else "fp8, 128 x 128 blocks",
                gib(r["payload_bytes"]), gib(r["network_bytes"]),
                gib(r["busiest_nic"]["bytes"]), r["lower_bound_s"], r["time_s"], r["ratio"],
                sec(d["broadcast"]["time_s"])))
        b, f = got["same"]["reshard"], got["fp8-block128"]["reshard"]
        net.append(f["network_bytes"] / b["network_bytes"])
        tim.append(f["time_s"] / b["time_s"])
        c = got["fp8-block128"].get("conversion", {})
        conv[model] = (c.get("tensors", 0), c.get("on_senders", 0))
    return (
        "Generated by `make figures` on %s with\n\n"
        "    build/bin/refit-plan model --model MODEL --train pp16,ep16 --infer SPEC \\\n"
        "        [--topology gb200-nvl72] --infer-dtype same|fp8-block128 --json\n\n"
        "(the cost model's figures, not measurements; DGX H100 training ranks first, GB200 "
        "with the placement named; broadcast at the 4 MiB chunk).  Converted tensors: %s.\n\n"
        "| model, training -> inference, topology | inference weights | payload | network bytes "
        "| busiest NIC | lower bound | reshard (modelled) | ratio | broadcast (modelled) |\n"
        "|---|---|---|---|---|---|---|---|---|\n%s\n\n"
        "fp8 against bf16: network bytes x%.3f-%.3f, modelled reshard time x%.3f-%.3f; time / "
        "bound ratio %.3f-%.3f over all rows.\n" % (
            state["date"], ", ".join("`%s` %d (%d on the senders)" % (m, n, s)
                                     for m, (n, s) in conv.items()),
            "\n".join(rows), min(net), max(net), min(tim), max(tim), min(ratio), max(ratio)))


def gen_convert_explain(build, state):
    cmd = [built(build, "refit-plan"), "explain", "--src", "config/examples/convert-src.json",
           "--dst", "config/examples/convert-dst-fp8.json", "--topology", "dgx-h100:16"]
    out = run_cmd("convert-explain", cmd, 120).splitlines()
    at = [i for i, line in enumerate(out) if line.startswith("conversion:")]
    if not at:
        sys.exit("figures: convert-explain: no \"conversion:\" line in refit-plan explain's "
                 "output")
    return ("```\n$ build/bin/refit-plan explain --src config/examples/convert-src.json \\\n"
            "      --dst config/examples/convert-dst-fp8.json --topology dgx-h100:16\n...\n"
            "%s\n```\n" % "\n".join(out[at[0]:]))


# region -> (generator, set); `make figures` runs the default set
# the frameworks' own memory (docs/frameworks.md): label, model, train framework,
# train spec, infer framework, infer spec, infer dtype
COVERAGE = [
    ("Llama-3-70B", "llama-3-70b", "megatron", "tp8,pp4,dp2", "vllm", "tp4,dp16", "same"),
    ("Llama-3-70B", "llama-3-70b", "megatron", "tp8,pp4,dp2", "vllm", "tp4,dp16",
     "fp8-block128"),
    ("Llama-3-70B", "llama-3-70b", "fsdp2", "dp16,tp4", "sglang", "tp4,dp16", "same"),
    ("Llama-3-70B", "llama-3-70b", "fsdp2", "dp16,tp4", "sglang", "tp4,dp16", "fp8-block128"),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b", "megatron", "tp4,pp4,ep8", "vllm", "tp4,dp8", "same"),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b", "megatron", "tp4,pp4,ep8", "vllm", "tp4,dp8,ep4",
     "fp8-block128"),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b", "fsdp2", "dp32,tp4", "sglang", "tp4,dp8,ep4", "same"),
]
COVERAGE_LARGE = [
    ("Qwen3-235B-A22B", "qwen3-235b-a22b", "megatron", "tp4,pp4,ep8", "vllm", "tp8,dp16",
     "same"),
    ("Qwen3-235B-A22B", "qwen3-235b-a22b", "megatron", "tp4,pp4,ep8", "sglang",
     "tp8,dp16,ep8", "fp8-block128"),
    ("DeepSeek-V3", "deepseek-v3", "megatron", "pp16,ep16", "vllm", "tp32,dp8", "same"),
    ("DeepSeek-V3", "deepseek-v3", "megatron", "pp16,ep16", "sglang", "tp16,dp16,ep16",
     "fp8-block128"),
    ("Kimi-K2", "kimi-k2", "megatron", "pp16,ep16", "vllm", "tp16,dp8", "same"),
    ("Kimi-K2", "kimi-k2", "megatron", "pp16,ep16", "sglang", "tp16,dp8,ep16", "fp8-block128"),
]


def run_coverage(build, case):
    label, model, tf, tr, inf, spec, dt = case
    cmd = [os.path.join(build, "bin", "refit-plan"), "model", "--model", model, "--train", tr,
           "--infer", spec, "--train-framework", tf, "--infer-framework", inf,
           "--infer-dtype", dt, "--baseline-chunks", "4MiB", "--json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("figures: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr))
    d = json.loads(p.stdout)
    d["_wall"] = time.monotonic() - t0
    # the same refit as Hugging Face tensors sharded on one dim (today's layouts)
    hf = [c for c in cmd if c not in ("--train-framework", tf, "--infer-framework", inf)]
    if tf == "fsdp2":  # the HF-DTensor model takes a Megatron-style spec
        hf[hf.index("--train") + 1] = "tp%s,dp%s" % (tr.split("tp")[1], tr.split(",")[0][2:])
    q = subprocess.run(hf, cwd=ROOT, capture_output=True, text=True)
    d["_hf_ratio"] = json.loads(q.stdout)["reshard"]["ratio"] if q.returncode == 0 else None
    return d


def coverage_rows(build, cases):
    rows = []
    for case in cases:
        label, model, tf, tr, inf, spec, dt = case
        d = run_coverage(build, case)
        c, r = d["coverage"], d["reshard"]
        share = min(c["train"]["reshard_share"], c["infer"]["reshard_share"])
        rows.append("| %s | %s %s -> %s %s | %s | %.2f %% | %s | %s | %s | %.3f | %s | %.0f s |" % (
            label, tf, tr, inf, spec, "bf16" if dt == "same" else "fp8 (128 x 128)",
            100.0 * share, gib(c["infer"]["padding_bytes"] + c["train"]["padding_bytes"]),
            gib(r["network_bytes"]), sec(r["time_s"]), r["ratio"],
            "%.3f" % d["_hf_ratio"] if d["_hf_ratio"] else "-", d["_wall"]))
    return rows


COVERAGE_HEAD = ("| model | train -> inference (DGX H100) | engine dtype | bytes by reshard | "
                 "padding (not sent) | network bytes | reshard (modelled) | time / bound | "
                 "time / bound, HF layouts | run time |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n")


def gen_coverage_table(build, state):
    rows = coverage_rows(build, COVERAGE)
    return ("Generated by `make figures` on %s:\n\n    build/bin/refit-plan model --model M "
            "--train SPEC --infer SPEC \\\n        --train-framework megatron|fsdp2 "
            "--infer-framework vllm|sglang --infer-dtype same|fp8-block128 --json\n\n"
            "(\"bytes by reshard\": the smaller of both sides' shares of parameter bytes that "
            "are not padding; \"HF layouts\": the same refit planned from Hugging Face tensors "
            "sharded on one dim, the model's earlier layouts.)\n\n%s%s\n" %
            (state["date"], COVERAGE_HEAD, "\n".join(rows)))


def gen_coverage_large(build, state):
    rows = coverage_rows(build, COVERAGE_LARGE)
    return ("Generated by `make figures FIGURES_SET=slow` on %s (same command; up to 7 GiB "
            "and two minutes a row on this machine):\n\n%s%s\n" %
            (state["date"], COVERAGE_HEAD, "\n".join(rows)))


def gen_auth_table(build, state):
    """The authorization table of rpc/rpc_auth.c, as refitd prints it."""
    p = subprocess.run([built(build, "refitd"), "--auth-table"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or not p.stdout.startswith("| service |"):
        sys.exit("figures: refitd --auth-table failed: %s%s" % (p.stderr, p.stdout[:200]))
    return ("The table in `rpc/rpc_auth.c`, printed by `refitd --auth-table` (`make "
            "figures`); the server refuses to register a method without a row and "
            "`tests/unit/test_auth.c` fails on a method of the protos without one:\n\n"
            + p.stdout)


GPU_STAGING = [
    # label, model, train, infer, topology, placement
    ("DeepSeek-V3 671B, PP16xEP16 -> TP32xDP8, DGX H100", "deepseek-v3", "pp16,ep16",
     "tp32,dp8", "dgx-h100", None),
    ("DeepSeek-V3 671B, PP16xEP16 -> TP32xDP8, GB200 NVL72", "deepseek-v3", "pp16,ep16",
     "tp32,dp8", "gb200-nvl72", "rack-aligned"),
    ("Kimi-K2 1T, PP16xEP16 -> TP8xDP16, DGX H100", "kimi-k2", "pp16,ep16", "tp8,dp16",
     "dgx-h100", None),
]
GPU_BUDGET = 1 << 30   # gpu_staging_budget_bytes' default (daemon/config.c)


def gen_gpu_staging(build, state):
    """The nccl transport's GPU staging per rank for catalogue plans (plan/gpu_staging.c
    on the reshard plan, the relay peak from its validator), against the budget."""
    rows = []
    for label, model, train, infer, topo, placement in GPU_STAGING:
        cmd = [built(build, "refit-plan"), "model", "--model", model, "--train", train,
               "--infer", infer, "--topology", topo, "--validate", "--json"]
        if placement:
            cmd += ["--placement", placement]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit("figures: %s failed: %s" % (" ".join(cmd), p.stderr))
        g = json.loads(p.stdout)["gpu_staging"]
        held = g["group_peak_bytes"] + g["relay_peak_bytes"]
        rows.append("| %s | %s (rank %d) | %s | %s | %s | %.0f %% |" % (
            label, gib(g["group_peak_bytes"]), g["group_peak_rank"],
            gib(g["relay_peak_bytes"]), gib(held), gib(GPU_BUDGET), 100.0 * held / GPU_BUDGET))
    return ("Generated by `make figures` on %s:\n\n    build/bin/refit-plan model --model M "
            "--train SPEC --infer SPEC --topology T --validate --json   (\"gpu_staging\")\n\n"
            "(\"groups\": the most one rank's message buffers of one group hold, sender and "
            "receiver sides, each rounded to 256 bytes, verify trailer included; "
            "\"relays\": the most relay data one rank holds in a round; \"held\": their sum, "
            "an upper bound of what the data path holds on one rank at once, without "
            "conversion scratch; the plan's staging_bytes is 256 MiB.  From the plan, not "
            "measured on a GPU.)\n\n"
            "| plan | groups, peak | relays, peak | held at most | budget (default) | of the "
            "budget |\n|---|---|---|---|---|---|\n%s\n" % (state["date"], "\n".join(rows)))


def gen_bench_data_tls(build, state):
    """data_tls's cost on loopback: bench/bench_data_tls.py's output."""
    for b in ("refitd", "refitctl", "refit-client"):
        built(build, b)
    ld = load()
    out = run_cmd("bench-data-tls", ["/usr/bin/python3", os.path.join(
        ROOT, "bench", "bench_data_tls.py"), build], 600)
    return ("`/usr/bin/python3 bench/bench_data_tls.py %s`, this machine (shared, two cores "
            "for both ends: compare the two lines), one run on %s, %s (generated by `make "
            "figures`):\n\n```\n%s```\n" % (rel(build), state["date"], ld, out))


GENERATORS = {
    "gpu-staging": (gen_gpu_staging, "default"),
    "auth-table": (gen_auth_table, "default"),
    "bench-data-tls": (gen_bench_data_tls, "default"),
    "planning-scale": (gen_planning_scale, "default"),
    "llama-explain": (gen_llama_explain, "default"),
    "model-table": (gen_model_table, "default"),
    "gb200-matrix": (gen_gb200_matrix, "default"),
    "planner-summary": (gen_planner_summary, "default"),
    "bench-plan": (gen_bench_plan, "default"),
    "fp8-table": (gen_fp8_table, "default"),
    "convert-explain": (gen_convert_explain, "default"),
    "bench-refit-summary": (gen_bench_refit_summary, "default"),
    "bench-refit": (gen_bench_refit, "default"),
    "bench-rpc": (gen_bench_rpc, "default"),
    "bench-members": (gen_bench_members, "default"),
    "coverage-table": (gen_coverage_table, "default"),
    "coverage-large": (gen_coverage_large, "slow"),
    # the slow set (scripts/figures_slow.py): real processes for a minute or more
    "faults": (lambda b, s: figures_slow.gen_faults(sys.modules[__name__], b, s), "slow"),
    "ha": (lambda b, s: figures_slow.gen_ha(sys.modules[__name__], b, s), "slow"),
    "bench-scale": (lambda b, s: figures_slow.gen_bench_scale(sys.modules[__name__], b, s),
                    "slow"),
    # docs/delta.md (scripts/figures_delta.py); delta-density needs torch
    "delta-density": (lambda b, s: figures_delta.gen_density(sys.modules[__name__], b, s),
                      "default"),
    "bench-delta": (lambda b, s: figures_delta.gen_bench_delta(sys.modules[__name__], b, s),
                    "default"),
    "delta-model": (lambda b, s: figures_delta.gen_model(sys.modules[__name__], b, s),
                    "default"),
    "delta-testbed": (lambda b, s: figures_delta.gen_testbed(sys.modules[__name__], b, s),
                      "default"),
}
SETS = ("default", "slow", "all")

MARK = re.compile(r"(<!-- figures:([a-z0-9-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)


def usage(msg):
    sys.stderr.write("figures: %s\n%s" % (msg, __doc__))
    return 2


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    build = os.path.abspath(args[0])
    rest = args[1:]
    only, which = None, "default"
    while rest:
        a = rest.pop(0)
        if a == "--list":
            for name, (_, st) in GENERATORS.items():
                print("%s %s" % (name, st))
            return 0
        if a in ("--only", "--set") and not rest:
            return usage("%s needs a value" % a)
        if a == "--only":
            only = set(x for x in rest.pop(0).split(",") if x)
            bad = only - set(GENERATORS)
            if bad or not only:
                return usage("unknown region(s) \"%s\" (known: %s)" %
                             (", ".join(sorted(bad)), ", ".join(GENERATORS)))
        elif a == "--set":
            which = rest.pop(0)
            if which not in SETS:
                return usage("unknown set \"%s\" (known: %s)" % (which, ", ".join(SETS)))
        else:
            return usage("unexpected argument \"%s\"" % a)
    if only is None:
        only = set(n for n, (_, st) in GENERATORS.items()
                   if which == "all" or st == which)
    state = {"date": datetime.date.today().isoformat()}
    done, skipped, found = {}, {}, set()
    rewritten = []
    for doc in DOCS:
        path = os.path.join(ROOT, doc)
        with open(path) as f:
            text = f.read()

        def repl(m):
            name = m.group(2)
            if name not in GENERATORS:
                sys.exit("figures: %s: unknown region \"%s\"" % (doc, name))
            found.add(name)
            if name not in only:
                return m.group(0)
            if name not in done and name not in skipped:
                print("figures: %s ..." % name, flush=True)
                try:
                    done[name] = GENERATORS[name][0](build, state)
                except Skip as e:
                    skipped[name] = str(e)
                    sys.stderr.write("figures: %s left as it is: %s\n" % (name, e))
            if name in skipped:
                return m.group(0)
            return m.group(1) + done[name] + m.group(4)

        new = MARK.sub(repl, text)
        if new != text:
            rewritten.append((doc, path, new))
    missing = only - found
    if missing:
        sys.exit("figures: no marked region for %s" % ", ".join(sorted(missing)))
    # every region computed: only now is any file written
    for doc, path, new in rewritten:
        with open(path, "w") as f:
            f.write(new)
        print("figures: rewrote %s" % doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
