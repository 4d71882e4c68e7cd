#!/usr/bin/python3
"""check-figures.py - scripts/figures.py against a scratch tree.

Each case copies scripts/figures.py into a temporary folder with small
README.md and docs/*.md that carry marked regions, and a fake build folder
whose bench-rpc bench-members bench-delta and refit-plan (and a fake
bench/bench_refit.py, a fake Python with torch) print known output.  It checks that the regions named are rewritten from that
output and nothing else is touched; that a generator that fails stops the
run with nothing written; that a slow generator that cannot run here
leaves its region and says why on stderr with status 0 (and the other
slow one, bench-scale, runs its fake bench or says why it cannot); the
fault suite's table from its printed figures; and argument errors.  Ends with
"figures: N passed, N failed".  No build needed: nothing real runs.

Usage: tests/check-figures.py
"""
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
counts = {"passed": 0, "failed": 0}
ROOTS = []  # every scratch tree, removed after each case whatever its result

RPC_OUT = """refit control-plane benchmark (coordinator on loopback, one run)

unary Heartbeat latency, 2000 sequential calls: p50 115 us, p99 206 us, max 5334 us

members    heartbeats   wall_s         coord_cpu_s      coord_cpu_us/beat
10         10000        0.922          0.520            52.0
100        10000        0.882          0.540            54.0
1000       10000        0.805          0.400            40.0
"""

MEMBERS_OUT = """member load: N fake members (...); one run, 5-period window

members  join_s   join_err  beats_ok    late     beats/s   cpu_%     rss_MiB   threads  KiB/member
1024     0.05     0         5120        0        512.0     8.1       18.3      11       2.29
4096     0.23     1         20479       2        2048.0    21.3      19.7      10       0.90
"""

REFIT_JSON = ('{"pair": {"bytes": 268435456, "data_s": 0.125, "total_s": 0.130}, '
              '"pair_verify": {"bytes": 268435456, "data_s": 0.25, "total_s": 0.26}, '
              '"reshard": {"bytes": 84182272, "data_s": [0.05, 0.02], "total_s": [0.06, 0.025]}, '
              '"broadcast": {"bytes": 84182272, "data_s": [0.15, 0.04], '
              '"total_s": [0.152, 0.046]}, "model_mib": 80.28}')

# bench/bench_scale.py build 4 8, one real run (2026-11-30)
SCALE_OUT = """control plane at scale: N node daemons (one rank each), half train, half serve, every receiver needs every sender; join order trainers-first; one run
 nodes  start_s running_ms   e2e_ms  again_ms  plan_ms    xfers   slice decode_ms  threads  rss_MiB  KiB/member  node_MiB after_MiB  max_MiB  load1 coord_s  nodes_s clients_s
     4      0.1          9       11         8      0.1        4       2      0.00       16     16.7       227.0      16.2      16.4     16.5      1     0.0      0.0     0.0
  1024      0.1         16       22        11      0.1    16384       4      0.00       15     17.0       155.5      16.3      16.4     16.6      1     0.0      0.0     0.0
"""

# refit-plan model --json: bf16 (--infer-dtype same), fp8 halves bytes and time
PLAN_FAKE = r"""#!/bin/sh
case "$*" in
*fp8-block128*) n=500; t=0.5; c=', "conversion": {"tensors": 662, "on_senders": 660}' ;;
*) n=1000; t=1.0; c='' ;;
esac
case "$*" in  # the frameworks' memory: every byte by reshard, 3 padding bytes
*--train-framework*) c="$c"', "coverage": {"train": {"reshard_share": 1.0, "padding_bytes": 1},
 "infer": {"reshard_share": 1.0, "padding_bytes": 2}}' ;;
esac
case "$*" in  # a delta refit at 3 %: 0.0594 of the bytes
*--delta-density*) c="$c"', "delta": {"density": 0.03, "bf16_wire_ratio": 0.0594,
 "codec_gbs": [1.5, 3], "network_bytes": 59, "network_share": 0.0594, "time_s": 20.6,
 "time_share": 20.6, "busiest": "codec", "codec_free": {"time_s": 0.073, "time_share": 0.073},
 "breakeven_density": {"time": null, "time_codec_free": 0.927, "network_bytes": 0.928},
 "codec_gbs_for_10pct": 621.0}' ;;
esac
# printf, a builtin: the slow set's test runs with no PATH
printf '%s\n' "{\"placement\": \"rack-aligned\", \"reshard\": {\"payload_bytes\": 2048,
 \"network_bytes\": $n, \"busiest_nic\": {\"bytes\": 1073741824}, \"lower_bound_s\": 0.9,
 \"time_s\": $t, \"ratio\": 1.07}, \"broadcast\": {\"time_s\": 3.5}$c}"
"""

OUTSIDE = "Text outside: 1.7-2.4 GB/s, keep me.\n"

BENCH_DELTA_OUT = "box density bitmap runs\n64 MiB 2.999 % 9.25 % 5.94 %\n"
# a Python with torch: its version for -c, bench/delta_density.py's JSON otherwise
DENSITY_JSON = ('{"params": 4999424, "warm": 20, "wall_s": 21.0, "runs": {"1e-5": ['
                '{"step": 1, "loss": 8.0, "kinds": {"attention": [4, 100, 0], '
                '"mlp": [6, 100, 1], "embeddings": [10, 100, 0], "norms": [0, 100, 0]}}]}}')
TORCH_FAKE = ("#!/bin/sh\n[ \"$1\" = -c ] && { echo 2.99; exit 0; }\ncat <<'EOF'\n" +
              DENSITY_JSON + "\nEOF\n")


def region(name, body="old figures\n"):
    return "<!-- figures:%s -->\n%s<!-- /figures -->\n" % (name, body)


def script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def tree(rpc_fails=False, delta=False):
    """A scratch root (scripts/figures.py, the docs, bench/bench_refit.py) and build."""
    root = tempfile.mkdtemp(prefix="refit-figtest-")
    ROOTS.append(root)
    for d in ("scripts", "docs", "bench", "build/bin"):
        os.makedirs(os.path.join(root, d))
    for f in ("figures.py", "figures_delta.py", "figures_slow.py"):
        shutil.copy(os.path.join(HERE, "scripts", f), os.path.join(root, "scripts"))
    docs = {
        "README.md": "# x\n\n" + OUTSIDE + "\n" + region("bench-refit-summary") + "\n" +
                     region("planner-summary", "integrator's\n") + "\n" + region("bench-members")
                     + OUTSIDE,
        "docs/performance.md": OUTSIDE + region("fp8-table") + region("coverage-large"),
        "docs/dataplane.md": region("bench-refit"),
        "docs/control-plane.md": OUTSIDE + region("bench-rpc") + OUTSIDE +
                                 region("auth-table"),
        "docs/faults.md": OUTSIDE + region("faults", "the 2026-11-29 table\n"),
        "docs/conversion.md": OUTSIDE + region("bench-scale", "not generated yet\n"),
        "docs/delta.md": OUTSIDE + (region("delta-density") + region("bench-delta") +
                                    region("delta-model") if delta else ""),
        "docs/ha.md": OUTSIDE + region("ha", "a dated run\n"),
        "docs/gpu.md": OUTSIDE + region("gpu-staging"),
    }
    for name, text in docs.items():
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    b = os.path.join(root, "build", "bin")
    script(os.path.join(b, "bench-rpc"), "#!/bin/sh\n" + (
        "echo 'bench-rpc: join sim00001 failed' >&2; exit 1\n" if rpc_fails else
        "cat <<'EOF'\n" + RPC_OUT + "EOF\n"))
    script(os.path.join(b, "refit-plan"), PLAN_FAKE)
    script(os.path.join(b, "bench-members"), "#!/bin/sh\ncat <<'EOF'\n" + MEMBERS_OUT + "EOF\n")
    script(os.path.join(b, "bench-delta"), "#!/bin/sh\ncat <<'EOF'\n" + BENCH_DELTA_OUT +
           "EOF\n")
    script(os.path.join(root, "build", "torch-python"), TORCH_FAKE)
    for n in ("refitctl", "refit-client"):
        script(os.path.join(b, n), "#!/bin/sh\nexit 0\n")
    script(os.path.join(b, "refitd"), "#!/bin/sh\n[ \"$1\" = --auth-table ] || exit 0\n"
           "printf '| service | method | credential | bound to |\\n|---|---|---|---|\\n"
           "| `s.S` | `M` | member | member_id |\\n'\n")
    script(os.path.join(root, "bench", "bench_refit.py"),
           "import sys\nopen(sys.argv[sys.argv.index('--json') + 1], 'w').write(%r)\n"
           % REFIT_JSON)
    script(os.path.join(root, "bench", "bench_scale.py"),
           "print(%r, end='')\n" % SCALE_OUT)
    return root


def read(root):
    out = {}
    for d in ("README.md", "docs/performance.md", "docs/dataplane.md", "docs/control-plane.md",
              "docs/faults.md", "docs/conversion.md"):
        with open(os.path.join(root, d)) as f:
            out[d] = f.read()
    return out


def figures(root, *args, env=None):
    return subprocess.run(["/usr/bin/python3", os.path.join(root, "scripts", "figures.py"),
                           os.path.join(root, "build")] + list(args), cwd=root,
                          capture_output=True, text=True, env=env, timeout=120)


def between(text, name):
    a = text.index("<!-- figures:%s -->\n" % name)
    return text[a:text.index("<!-- /figures -->", a)]


def check(name, fn):
    try:
        fn()
        counts["passed"] += 1
        print("ok   %s" % name)
    except Exception:  # noqa: BLE001 - report every failure and go on
        counts["failed"] += 1
        print("FAIL %s" % name)
        traceback.print_exc()
    finally:
        while ROOTS:
            shutil.rmtree(ROOTS.pop(), ignore_errors=True)


def rewrites_named_regions():
    root = tree()
    before = read(root)
    p = figures(root, "--only", "bench-rpc,bench-members,bench-refit,bench-refit-summary")
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    after = read(root)
    rpc = between(after["docs/control-plane.md"], "bench-rpc")
    assert "p50 115 us, p99 206 us" in rpc and "1000       10000" in rpc, rpc
    # CPU per heartbeat from the rows (40-54 us); 1,000 nodes every 2 s at 40 us = 2.0 %
    assert "40-54 us from 10 to 1,000 members" in rpc and "about 2.0 % of one core" in rpc, rpc
    mem = between(after["README.md"], "bench-members")
    # late or failed = join errors + late beats
    assert "| 4,096 | 0.23 | 2,048 | 3 | 21.3 | 19.7 | 10 | 0.9 |" in mem, mem
    assert "| 1,024 | 0.05 | 512 | 0 | 8.1 | 18.3 | 11 | 2.3 |" in mem, mem
    ref = between(after["docs/dataplane.md"], "bench-refit")
    assert "2.15 GB/s moving data (125.0 ms; 130.0 ms end to end)" in ref, ref
    assert "reshard 20.0 ms, gather-and-broadcast 40.0 ms moving data (x2.00)" in ref, ref
    assert "80.3 MiB over tcp in both modes" in ref and "| 2-10 ms |" in ref, ref
    summ = between(after["README.md"], "bench-refit-summary")
    assert "2.15 GB/s on its first refit (1.07 GB/s" in summ and "x2.00" in summ, summ
    # the integrator's region, the docs without regions and the text outside: unchanged
    assert "integrator's\n" in after["README.md"]
    assert after["docs/performance.md"] == before["docs/performance.md"]
    assert after["docs/faults.md"] == before["docs/faults.md"]
    for d in ("README.md", "docs/control-plane.md"):
        assert after[d].count(OUTSIDE) == before[d].count(OUTSIDE) == 2, d
        assert after[d].startswith(before[d][:before[d].index("<!--")]), d
    return root


def fp8_table():
    root = tree()
    p = figures(root, "--only", "fp8-table")
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    t = between(read(root)["docs/performance.md"], "fp8-table")
    assert t.count("\n| ") == 9, t   # header + 8 rows: 4 cases x (bf16, fp8)
    assert "GB200 NVL72, rack-aligned | bf16 |" in t and "DGX H100, rack-aligned" not in t, t
    assert "| 0.900 s | 0.500 s | 1.070 | 3.50 s |" in t, t
    assert "network bytes x0.500-0.500, modelled reshard time x0.500-0.500" in t, t
    assert "`deepseek-v3` 662 (660 on the senders)" in t, t
    return root


def failure_writes_nothing():
    root = tree(rpc_fails=True)
    before = read(root)
    # bench-members (README, first doc) is computed before bench-rpc fails
    p = figures(root, "--only", "bench-members,bench-rpc")
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "bench-rpc" in p.stderr and "join sim00001 failed" in p.stderr, p.stderr
    assert read(root) == before, "a file was written although a generator failed"
    return root


def slow_skip_leaves_region():
    root = tree()
    before = read(root)
    # no ss on PATH (and maybe not root): the fault suite cannot cut connections
    p = figures(root, "--set", "slow", env={"PATH": "/nonexistent"})
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert "faults left as it is" in p.stderr and ("ss" in p.stderr or "root" in p.stderr or
                                                   "grpc" in p.stderr), p.stderr
    after = read(root)
    for d in before:
        if d not in ("docs/conversion.md", "docs/performance.md"):
            assert after[d] == before[d], d
    # the large frameworks' coverage rows, from refit-plan model's JSON
    cov = between(after["docs/performance.md"], "coverage-large")
    assert cov.count("\n| ") == 7 and "| 100.00 % | 0 MiB |" in cov, cov
    assert after["docs/performance.md"].startswith(OUTSIDE + region("fp8-table")), \
        "the slow set rewrote the default set's region"
    # bench-scale runs the fake bench (or is skipped here: no gRPC, too little memory)
    sc = between(after["docs/conversion.md"], "bench-scale")
    if "bench-scale left as it is" in p.stderr:
        assert after["docs/conversion.md"] == before["docs/conversion.md"]
    else:
        assert "| 4 | 0.1 | 9 | 11 | 8 | 0.1 | 4 | 2 | 0.00 | 16 | 16.7 | 227 | " \
               "16.2 -> 16.4, 16.5 | 1 | 0.0 / 0.0 / 0.0 |" in sc, sc
        assert "| 1024 | 0.1 | 16 | 22 | 11 | 0.1 | 16,384 |" in sc, sc
        assert "not generated yet" not in sc, sc
    return root


def delta_regions():
    root = tree(delta=True)
    path = os.path.join(root, "docs", "delta.md")
    before = open(path).read()
    env = dict(os.environ, REFIT_TORCH_PYTHON=os.path.join(root, "build", "torch-python"))
    p = figures(root, "--only", "delta-density,bench-delta,delta-model", env=env)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    after = open(path).read()
    den = between(after, "delta-density")
    assert "torch 2.99" in den and "Mean density per lr: 1e-5: 5.000 %." in den, den
    # 20 of 400 elements changed, 1 of them followed by a changed one
    assert "| 1e-5 | 1 | 8.000 | 5.000 % | 4.000 % | 6.000 % | 10.000 % | 0.000 % | 0.050 |" \
        in den, den
    assert BENCH_DELTA_OUT in between(after, "bench-delta")
    mod = between(after, "delta-model")
    assert mod.count("\n| ") == 6, mod   # header + 5 densities
    assert "| 3.00 % | 0.0594 | 0.0 GiB (5.94 %) | 20.600 s (x20.600, codec) | 0.073 s " \
           "(x0.073) | 621 GB/s | 92.7 % | never |" in mod, mod
    assert after.startswith(OUTSIDE)
    # no Python with torch: that region kept, the reason on stderr, the others written
    env["REFIT_TORCH_PYTHON"] = os.path.join(root, "nonexistent")
    with open(path, "w") as f:
        f.write(before)
    p = figures(root, "--only", "delta-density,bench-delta", env=env)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert "delta-density left as it is" in p.stderr and "REFIT_TORCH_PYTHON" in p.stderr, \
        p.stderr
    after = open(path).read()
    assert between(after, "delta-density") == between(before, "delta-density")
    assert BENCH_DELTA_OUT in between(after, "bench-delta")
    return root


def load_figures():
    spec = importlib.util.spec_from_file_location("figures", os.path.join(HERE, "scripts",
                                                                          "figures.py"))
    fig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig)
    return fig


def running(pid):
    """pid is a live process (not gone, not a zombie waiting for init)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def deadline_kills_group():
    fig = load_figures()
    root = tempfile.mkdtemp(prefix="refit-figtest-")
    ROOTS.append(root)
    pidfile = os.path.join(root, "pid")
    try:
        fig.run_cmd("t", ["sh", "-c", "sleep 300 & echo $! > %s; wait" % pidfile], 1)
    except SystemExit as e:
        assert "ran past 1 s" in str(e), e
    else:
        raise AssertionError("a command past its deadline was taken")
    with open(pidfile) as f:
        pid = int(f.read())
    end = time.monotonic() + 30
    while running(pid) and time.monotonic() < end:
        time.sleep(0.05)
    alive = running(pid)
    assert not alive, "the command's child %d outlived its deadline" % pid


def faults_table():
    fig = load_figures()
    out = ("ok   something (1.0 s)\n     SIGKILL detection: 0.02 s\n"
           "     soak: 12 versions, 10 committed first time; fds 15->15\n"
           "faults: 30 passed, 0 failed\n")
    t = fig.figures_slow.faults_table(out, "tests/integration/test_faults.py build 30",
                                      "2026-11-30")
    assert "| SIGKILL detection | 0.02 s |\n| soak | 12 versions, 10 committed first time; " \
           "fds 15->15 |\n" in t, t
    assert "one run on 2026-11-30" in t, t
    for bad in ("     SIGKILL detection: 0.02 s\nfaults: 29 passed, 1 failed\n",
                "ok   x\nfaults: 30 passed, 0 failed\n"):
        try:
            fig.figures_slow.faults_table(bad, "cmd", "2026-11-30")
        except SystemExit as e:
            assert "faults" in str(e), e
        else:
            raise AssertionError("a failed or silent fault suite was taken: %r" % bad)


def bad_arguments():
    root = tree()
    before = read(root)
    for args, word in ((["--set", "fast"], "unknown set"), (["--only", "nope"], "unknown region"),
                       (["--only"], "needs a value"), (["--bogus"], "unexpected argument")):
        p = figures(root, *args)
        assert p.returncode == 2 and word in p.stderr, (args, p.returncode, p.stderr)
    # after the region that is computed: still nothing written
    with open(os.path.join(root, "docs", "faults.md"), "a") as f:
        f.write(region("no-such-region"))
    p = figures(root, "--only", "bench-rpc")
    assert p.returncode != 0 and 'unknown region "no-such-region"' in p.stderr, p.stderr
    after = read(root)
    assert after["docs/control-plane.md"] == before["docs/control-plane.md"]
    return root


def auth_table():
    root = tree()
    before = read(root)
    p = figures(root, "--only", "auth-table")
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    after = read(root)
    got = between(after["docs/control-plane.md"], "auth-table")
    assert "| `s.S` | `M` | member | member_id |" in got and "old figures" not in got, got
    assert after["docs/control-plane.md"].startswith(OUTSIDE + region("bench-rpc") + OUTSIDE)
    for d in before:
        if d != "docs/control-plane.md":
            assert after[d] == before[d], d
    # a refitd that prints no table: refused, nothing written
    script(os.path.join(root, "build", "bin", "refitd"), "#!/bin/sh\nexit 0\n")
    p = figures(root, "--only", "auth-table")
    assert p.returncode != 0 and "--auth-table" in p.stderr, (p.returncode, p.stderr)
    assert read(root) == after
    return root


check("the regions named are rewritten from their commands' output, nothing else",
      rewrites_named_regions)
check("the fp8 table from refit-plan model's JSON, bf16 and fp8 rows, their ratios", fp8_table)
check("a generator that fails: non-zero status, no file written", failure_writes_nothing)
check("a slow generator that cannot run: region kept, reason on stderr, status 0",
      slow_skip_leaves_region)
check("the fault suite's figures as a table; a failed or silent suite refused", faults_table)
check("a command past its deadline is killed with the processes it started",
      deadline_kills_group)
check("the delta refit's regions from their fakes; no torch: its region kept", delta_regions)
check("bad arguments and unknown regions are refused, naming them", bad_arguments)
check("the authorization table from refitd --auth-table, nothing else touched", auth_table)
print("figures: %d passed, %d failed" % (counts["passed"], counts["failed"]))
sys.exit(1 if counts["failed"] else 0)
