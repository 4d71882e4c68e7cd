#!/usr/bin/python3
"""data_tls's cost on loopback: one training node sends one 256 MiB fp32
tensor to one inference node over the tcp data plane, with data_tls off and
on (TLS 1.3; both runs on mutual TLS for gRPC with `refitctl init`'s
certificates), three refits each; the best GB/s of each (bytes / time
moving data) and their ratio.

Usage: bench_data_tls.py BUILD_DIR [REFITS].  Wall clock on a shared
machine: compare the two figures of one run, not runs with each other.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
REFITS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
TMP = tempfile.mkdtemp(prefix="refit-bench-tls-")
PKI = f"{TMP}/pki"
PROCS = []
NODES = [("train0", "0"), ("infer0", "1")]


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    PROCS.append(p)
    return p


def ctl(run, *args):
    return subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", f"unix:{run}/coord.sock",
                           "--tls-ca", f"{PKI}/ca.crt", "--tls-cert", f"{PKI}/operator.crt",
                           "--tls-key", f"{PKI}/operator.key"] + list(args),
                          capture_output=True, text=True, timeout=600)


def tls(name):
    return ["--tls-ca", f"{PKI}/ca.crt", "--tls-cert", f"{PKI}/{name}.crt",
            "--tls-key", f"{PKI}/{name}.key"]


def cluster(run, data_tls):
    os.makedirs(run)
    spawn([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
           f"unix:{run}/coord.sock", "--log-level", "warn"] + tls("coordinator"))
    for name, ranks in NODES:
        spawn([f"{BUILD}/bin/refitd", "--role", "node", "--node-id", name, "--ranks", ranks,
               "--listen", f"unix:{run}/{name}.sock", "--coordinator",
               f"unix:{run}/coord.sock", "--local-socket", f"{run}/{name}.local",
               "--heartbeat-ms", "200", "--log-level", "warn", "--data-tls", data_tls] +
              tls(f"node-{name}"))
    for _ in range(100):
        if f"{len(NODES)} members" in ctl(run, "members").stdout:
            return
        time.sleep(0.1)
    raise SystemExit("bench: nodes did not join")


def client(run, node, role, layouts, instance=""):
    args = [f"{BUILD}/bin/refit-client", "--socket", f"{run}/{node}.local", "--model", "big",
            "--role", role, "--layouts", layouts, "--timeout-ms", "600000"]
    if instance:
        args += ["--instance", instance]
    p = spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    line = p.stdout.readline()
    assert line.startswith(("READY", "REGISTERED")), line
    return p


def layouts(rank):
    path = f"{TMP}/big-{rank}.json"
    with open(path, "w") as f:
        json.dump({"tensors": [{"name": "w", "dtype": "fp32", "shape": [8192, 8192],
                                "mesh": [rank], "placements": ["Replicate()"]}]}, f)
    return path


def run_one(data_tls):
    run = f"{TMP}/{data_tls}"
    cluster(run, data_tls)
    tr = client(run, "train0", "train", layouts(0))
    inf = client(run, "infer0", "infer", layouts(1), "i0")
    best = 0.0
    for v in range(1, REFITS + 1):
        if v > 1:
            tr.stdin.write(f"next {v}\n")
            tr.stdin.flush()
            assert tr.stdout.readline().startswith("READY")
        out = ctl(run, "--json", "trigger", "big", "--version", str(v), "--wait")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        assert r["state"] == "COMMITTED", r
        inf.stdin.write(f"wait {v} 600000\n")
        inf.stdin.flush()
        line = inf.stdout.readline()
        assert "mismatches=0" in line, line
        data_s = max((s["micros"] for s in r["stages"]), default=0) / 1e6
        best = max(best, r["bytes"] / data_s / 1e9)
    for p in reversed(PROCS):  # clients, nodes, then the coordinator
        if p.stdin:
            p.stdin.close()
        p.terminate()
        p.wait()
    PROCS.clear()
    return best


try:
    subprocess.run([f"{BUILD}/bin/refitctl", "init", PKI, "--nodes", "train0,infer0"],
                   capture_output=True, check=True)
    plain = run_one("off")
    enc = run_one("on")
    print(f"tcp data plane on loopback, one pair, 256 MiB fp32, best of {REFITS} refits:")
    print(f"  data_tls off  {plain:6.2f} GB/s")
    print(f"  data_tls on   {enc:6.2f} GB/s  ({enc / plain:.2f} of plain)")
finally:
    for p in PROCS:
        p.kill()
    shutil.rmtree(TMP, ignore_errors=True)
