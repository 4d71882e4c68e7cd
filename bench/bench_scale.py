#!/usr/bin/python3
"""Control-plane scale curve (part of `make bench`): for each node count, a
coordinator and N node daemons (one rank each) on loopback, a librefit
client on every node, half the nodes training and half serving one model
whose tensor is Shard(0) over the trainer ranks and Shard(1) over the
inference ranks (every receiver needs every sender), a refit, then the same
refit again (the plan from the coordinator's cache).  Nodes do not plan:
each receives its slice of the plan in RunSlice.

Per N: time for the daemons to start and join (started in groups of 16,
each after the previous joined), trigger -> every slice running, end to end
(first refit, second), the coordinator's planning time and the plan's
transfers, the largest node slice (transfers) and the slowest node's time to
decode and check it, the coordinator's threads and RSS (/proc/PID/status),
the coordinator's RSS growth per member and a node daemon's mean and largest
RSS before the refits and after them.

Usage: [LEASE_MS=30000] [START_ONLY=1] [IDLE_S=0] bench_scale.py BUILD_DIR [--layout all|pairs]
       [--order trainers-first|inference-first|random] [N ...]
(default 16 32 64 128 256; START_ONLY: start and join the daemons, no refit;
IDLE_S: before the refits, measure the CPU of the coordinator and the node
daemons over that many idle seconds, clients attached).
--layout all (default): Shard(0) over the trainers -> Shard(1) over the
inference ranks, every receiver needs every sender ((N/2)^2 transfers and
tcp connections).  --layout pairs: Shard(0) -> Shard(0) over the same count,
inference rank j needs trainer rank j only (N/2 transfers), so the control
plane can be measured at counts where the all-to-all data plane swamps the
machine.  --order: which nodes (by join order) train: the first half
(default), the second half, or a random half (seed 1).
Also per N: the load average (1 min) at the end of the first refit and the
CPU seconds spent during the first refit by the coordinator, the node
daemons and the clients (utime + stime from /proc).
Times are wall clock on a shared machine: one run, compare within a run.
"""
import random
import os
import signal
import subprocess
import sys
import time

ARGS = sys.argv[1:]
LAYOUT, ORDER = "all", "trainers-first"
for flag in ("--layout", "--order"):
    while flag in ARGS:
        k = ARGS.index(flag)
        if k + 1 >= len(ARGS):
            raise SystemExit(f"bench: {flag} needs a value")
        val = ARGS[k + 1]
        del ARGS[k:k + 2]
        if flag == "--layout":
            if val not in ("all", "pairs"):
                raise SystemExit(f"bench: --layout {val!r}: expected all or pairs")
            LAYOUT = val
        else:
            if val not in ("trainers-first", "inference-first", "random"):
                raise SystemExit(f"bench: --order {val!r}: expected trainers-first, "
                                 "inference-first or random")
            ORDER = val
BUILD = ARGS[0] if ARGS else "build"
SIZES = [int(x) for x in ARGS[1:]] or [16, 32, 64, 128, 256]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import protostubs  # noqa: E402
TMP = protostubs.generate("refit-bsc-")
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import Client, free_port, proc_status, spawn, write  # noqa: E402

harness.init(BUILD, TMP)


def cpu_s(pid):
    """utime + stime of a process, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def layouts(trainers, infer, trainer_side):
    t, i = len(trainers), len(infer)
    ranks = trainers if trainer_side else infer
    shard = 0 if trainer_side or LAYOUT == "pairs" else 1
    return [{"name": "w", "dtype": "fp32", "shape": [2 * t, 3 * i], "mesh": ranks,
             "placements": [f"Shard({shard})"]}]


def wait_final(stub, rid, timeout=900):
    end = time.time() + timeout
    while time.time() < end:
        g = stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=60)
        if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED):
            return g
        time.sleep(0.05)
    raise SystemExit(f"bench: refit {rid} did not finish")


def one(n):
    procs0 = len(harness.PROCS)
    addr = f"127.0.0.1:{free_port()}"
    log = open(f"{TMP}/n{n}.log", "w")
    coord = spawn([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", addr,
                   "--heartbeat-ms", "2000", "--lease-ttl-ms",
                   os.environ.get("LEASE_MS", "30000"), "--log-level", "warn"], stderr=log)
    ch = grpc.insecure_channel(addr)
    grpc.channel_ready_future(ch).result(timeout=30)
    stub = pbg.CoordinatorStub(ch)
    rss0 = proc_status(coord.pid)[1]
    nodes = []
    t0 = time.time()
    for g in range(0, n, 16):
        for k in range(g, min(n, g + 16)):
            nodes.append(spawn([f"{BUILD}/bin/refitd", "--role", "node", "--listen",
                                f"unix:{TMP}/b{k}.rpc", "--coordinator", addr,
                                "--node-id", f"b{k:04d}", "--ranks", str(k),
                                "--local-socket", f"{TMP}/b{k}.local",
                                "--slice-timeout-ms", "600000", "--log-level", "warn"],
                               stderr=log))
        end = time.time() + 300
        while len(stub.ListMembers(pb.ListMembersRequest(), timeout=60).members) < \
                min(n, g + 16):
            if time.time() > end:
                raise SystemExit(f"bench: {n} nodes did not join")
            time.sleep(0.05)
    start_s = time.time() - t0
    if os.environ.get("START_ONLY"):
        th, rss = proc_status(coord.pid)
        print(f"{n:>6} {start_s:>8.1f}  (started and joined; no refit)  coordinator threads "
              f"{th}, RSS {rss / 1024:.1f} MiB; node daemon RSS "
              f"{sum(proc_status(p.pid)[1] for p in nodes) / n / 1024:.1f} MiB", flush=True)
        stop(procs0, ch)
        return
    order = [int(m.node_id[1:]) for m in
             stub.ListMembers(pb.ListMembersRequest(), timeout=60).members]
    if ORDER == "inference-first":
        order = order[n - n // 2:] + order[:n - n // 2]
    elif ORDER == "random":
        random.Random(1).shuffle(order)
    trainers, infer = order[:n // 2], order[n // 2:]
    if LAYOUT == "pairs":
        infer = infer[:len(trainers)]  # one inference rank per trainer rank
    tl = write(f"{TMP}/t{n}.json", layouts(trainers, infer, True))
    il = write(f"{TMP}/i{n}.json", layouts(trainers, infer, False))

    class Sock:
        def sock(self, k):
            return f"{TMP}/b{k}.local"
    tr = [Client(Sock(), k, "m", "train", tl) for k in trainers]
    inf = [Client(Sock(), k, "m", "infer", il, instance="i0") for k in infer]
    for c in tr + inf:
        assert c.ok(), c.first
    node_rss = sum(proc_status(p.pid)[1] for p in nodes) / n
    idle_s = float(os.environ.get("IDLE_S", "0"))
    if idle_s > 0:  # CPU of the idle control plane (heartbeats, timers), clients attached
        c0 = (cpu_s(coord.pid), sum(cpu_s(p.pid) for p in nodes))
        time.sleep(idle_s)
        c1 = (cpu_s(coord.pid) - c0[0], sum(cpu_s(p.pid) for p in nodes) - c0[1])
        print(f"{n:>6} idle {idle_s:.0f} s, clients attached, no refit: coordinator "
              f"{100 * c1[0] / idle_s:.1f} % of a core, node daemons {100 * c1[1] / idle_s:.1f} "
              f"% of a core ({1e3 * c1[1] / idle_s / n:.2f} ms/s each), load {loadavg():.0f}",
              flush=True)
    rows = {}
    for v in (1, 2):
        if v == 2:
            for c in tr:
                assert c.cmd("next 2").startswith("READY")
        if v == 1:
            cpu0 = (cpu_s(coord.pid), sum(cpu_s(p.pid) for p in nodes),
                    sum(cpu_s(c.p.pid) for c in tr + inf))
        rid = stub.TriggerRefit(pb.TriggerRefitRequest(model="m", version=v),
                                timeout=60).refit_id
        g = wait_final(stub, rid)
        if v == 1:
            load1 = loadavg()
            cpu1 = (cpu_s(coord.pid) - cpu0[0], sum(cpu_s(p.pid) for p in nodes) - cpu0[1],
                    sum(cpu_s(c.p.pid) for c in tr + inf) - cpu0[2])
        if g.state != pb.COMMITTED:
            raise SystemExit(f"bench: {n} nodes ({LAYOUT}, {ORDER}): refit {v} {g.failure} "
                             f"after {g.finished_unix_ms - g.created_unix_ms} ms (load "
                             f"{loadavg():.0f}; CPU s coordinator {cpu1[0]:.1f}, node daemons "
                             f"{cpu1[1]:.1f}, clients {cpu1[2]:.1f}; coordinator log "
                             f"{TMP}/n{n}.log)")
        for c in inf:
            out = c.cmd(f"wait {v} 600000")
            assert "mismatches=0" in out, out
        rows[v] = g
    th, rss = proc_status(coord.pid)
    node_rss_after = sum(proc_status(p.pid)[1] for p in nodes) / n
    node_max_after = max(proc_status(p.pid)[1] for p in nodes)
    g1, g2 = rows[1], rows[2]
    # nodes never plan; the second refit takes the coordinator's cached plan
    assert g2.plan_cached and all(x.plan_micros == 0 for x in list(g1.nodes) + list(g2.nodes))
    print(f"{n:>6} {start_s:>8.1f} {g1.running_after_ms:>10} "
          f"{g1.finished_unix_ms - g1.created_unix_ms:>8} "
          f"{g2.finished_unix_ms - g2.created_unix_ms:>9} "
          f"{g1.plan_micros / 1e3:>8.1f} {g1.plan_xfers:>8} "
          f"{max(x.slice_xfers for x in g1.nodes):>7} "
          f"{max(x.decode_micros for x in g1.nodes) / 1e3:>9.2f} {th:>8} {rss / 1024:>8.1f} "
          f"{(rss - rss0) / n:>11.1f} {node_rss / 1024:>9.1f} {node_rss_after / 1024:>9.1f} "
          f"{node_max_after / 1024:>8.1f} {load1:>6.0f} {cpu1[0]:>7.1f} {cpu1[1]:>8.1f} "
          f"{cpu1[2]:>7.1f}",
          flush=True)
    for c in tr + inf:
        c.close()
    stop(procs0, ch)


def stop(procs0, ch):
    for p in reversed(harness.PROCS[procs0:]):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in harness.PROCS[procs0:]:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    ch.close()


print("control plane at scale: N node daemons (one rank each), half train, half serve, "
      + ("every receiver needs every sender" if LAYOUT == "all" else
         "each receiver needs one sender (pairs)") + f"; join order {ORDER}; one run")
print(f"{'nodes':>6} {'start_s':>8} {'running_ms':>10} {'e2e_ms':>8} {'again_ms':>9} "
      f"{'plan_ms':>8} {'xfers':>8} {'slice':>7} {'decode_ms':>9} {'threads':>8} "
      f"{'rss_MiB':>8} {'KiB/member':>11} {'node_MiB':>9} {'after_MiB':>9} {'max_MiB':>8} "
      f"{'load1':>6} {'coord_s':>7} {'nodes_s':>8} {'clients_s':>7}")
ok = False
try:
    for n in SIZES:
        one(n)
    ok = True
finally:
    harness.stop_all()
    harness.tidy_tmp(TMP, 0 if ok else 1)  # logs kept (and named) when a size failed
