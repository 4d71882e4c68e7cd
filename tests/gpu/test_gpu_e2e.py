#!/usr/bin/python3
"""End-to-end refits over the nccl transport with three refitd node daemons
sharing one GPU: each daemon its own NCCL_HOSTID (NCCL_P2P_DISABLE and
NCCL_SHM_DISABLE, so NCCL's socket transport carries the bytes between
them), one rank each on device 0, librefit clients (refit-client --cuda)
registering GPU memory by CUDA IPC handle.  Run by tests/gpu/run.sh with
REFIT_TEST_GPU=1 on a GPU machine, and by tests/run-check-nccl.sh on the
emulator (there each daemon is an emulated host).

Usage: test_gpu_e2e.py BUILD_DIR.  Refits with verify on (reshard and
gather-and-broadcast, strided client memory with a strided innermost dim),
an abort midway, a node killed mid-refit and the recovery, a fourth node
joining and leaving (the survivors shrink), a trainer writing asynchronously
(--async-write: its copies queued on its own streams, an interprocess event
passed with weights_ready; on the emulator its streams are held until the
refit had time to read, REFIT_EMU_HOLD_STREAMS).  Prints "gpu-e2e: N passed,
N failed" last.
"""
import os
import signal
import sys
import threading
import time

os.environ.setdefault("REFIT_TEST_TRANSPORT", "nccl")
os.environ["REFIT_TEST_RPN"] = "1"
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
import protostubs  # noqa: E402
TMP = protostubs.generate("refit-gpu-")
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, spawn, write  # noqa: E402

harness.init(BUILD, TMP)
LEASE_MS = 1500
S = {}


def tensors(ranks, placement, n=6):
    out = []
    for k in range(n):
        shape = [[256, 192], [64], [3, 1, 40], [512, 96], [7, 9, 11], [128, 128]][k % 6]
        dt = ["fp32", "bf16", "fp16", "fp32", "u8", "fp64"][k % 6]
        pl = placement if len(shape) > 1 or placement == "Replicate()" else "Shard(0)"
        out.append({"name": f"w{k}", "dtype": dt, "shape": shape, "mesh": ranks,
                    "placements": [pl]})
    return out


def setup():
    # the emulator's cudaIpcOpenMemHandle stalls while this file exists
    # (slow_open_heartbeats), its cudaIpcCloseMemHandle while the second does
    # (slow_close_heartbeats); a GPU ignores both
    os.environ["REFIT_EMU_SLOW_IPC_OPEN"] = f"{TMP}/slow-open"
    os.environ["REFIT_EMU_SLOW_IPC_CLOSE"] = f"{TMP}/slow-close"
    # ... and its ncclGetUniqueId (in the root-holder child) while this one
    # does (slow_unique_id_heartbeats)
    os.environ["REFIT_EMU_SLOW_UNIQUE_ID"] = f"{TMP}/slow-id"
    cl = Cluster("g", 3, ["--test-msg-delay-ms", "20", "--slice-timeout-ms", "60000"],
                 lease_ms=LEASE_MS)
    S["cl"] = cl
    S["t"] = write(f"{TMP}/t.json", tensors([0], "Replicate()"))
    S["i"] = write(f"{TMP}/i.json", tensors([1, 2], "Shard(1)"))
    S["trainer"] = Client(cl, 0, "gm", "train", S["t"])
    assert S["trainer"].ok(), S["trainer"].first
    S["inst"] = [Client(cl, 1, "gm", "infer", S["i"], instance="a", install="double-buffer",
                        pad=3),
                 Client(cl, 2, "gm", "infer", S["i"], instance="a", install="double-buffer",
                        istride=2)]
    for c in S["inst"]:
        assert c.ok(), c.first
    cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="gm", retries=0, retry_backoff_ms=0, catch_up=False)), timeout=5)
    S["v"] = 1


def installed(v):
    for c in S["inst"]:
        out = c.cmd(f"wait {v} 30000")
        assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out


def step():
    S["v"] += 1
    out = S["trainer"].cmd(f"next {S['v']}")
    assert out.startswith("READY"), out


def refits_verified():
    cl = S["cl"]
    g = cl.refit("gm", 1, verify=True)
    assert g.state == pb.COMMITTED, g.failure
    installed(1)
    step()
    g = cl.refit("gm", S["v"], mode=pb.BROADCAST, verify=True)
    assert g.state == pb.COMMITTED, g.failure
    installed(S["v"])
    print(f"     {g.bytes} bytes per refit, reshard and broadcast, verify on")


def wait_running(rid):
    for _ in range(2000):
        g = S["cl"].stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
        if g.state == pb.RUNNING:
            return
        time.sleep(0.005)
    raise AssertionError(f"refit {rid} never ran")


def next_running():
    """The trainer steps; a refit of the new version is triggered and running."""
    cl = S["cl"]
    step()
    rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="gm", version=S["v"]),
                               timeout=5).refit_id
    wait_running(rid)
    return cl, rid


def abort_midway():
    cl, rid = next_running()
    cl.stub.AbortRefit(pb.AbortRefitRequest(refit_id=rid, reason="test"), timeout=5)
    g = cl.wait_final(rid, 60)
    assert g.state in (pb.ABORTED, pb.COMMITTED), g
    for c in S["inst"]:   # double buffer: the old version or the new, whole
        st = c.cmd("state")
        assert "valid=1" in st, st
    g = cl.refit("gm", S["v"], verify=True)   # fresh communicators after the abort
    assert g.state == pb.COMMITTED, g.failure
    installed(S["v"])


def node_killed():
    cl, rid = next_running()
    t0 = time.time()
    cl.nodes[2].kill()
    cl.nodes[2].wait()
    g = cl.wait_final(rid, 60)
    took = time.time() - t0
    assert g.state in (pb.FAILED, pb.COMMITTED), g
    assert took < LEASE_MS / 1000 + 10, f"{took:.1f} s to fail"
    print(f"     node kill: {pb.RefitState.Name(g.state)} after {took:.2f} s")
    S["inst"][1].p.kill()
    cl.restart_node(2)
    cl.wait_members(3)
    S["inst"][1] = Client(cl, 2, "gm", "infer", S["i"], instance="a",
                          install="double-buffer", istride=2)
    assert S["inst"][1].ok(), S["inst"][1].first
    g = cl.refit("gm", S["v"], verify=True)
    assert g.state == pb.COMMITTED, g.failure
    installed(S["v"])


def join_leave_shrink():
    cl = S["cl"]
    extra = spawn(harness.node_spawn_args(cl, "g9", "9"), stderr=cl.log,
                  env=harness.host_env("g9"))
    cl.wait_members(4)
    step()
    g = cl.refit("gm", S["v"], verify=True)
    assert g.state == pb.COMMITTED, g.failure
    installed(S["v"])
    extra.send_signal(signal.SIGTERM)
    assert extra.wait(timeout=30) == 0
    cl.wait_members(3)
    mark = os.path.getsize(cl.log.name)
    step()
    g = cl.refit("gm", S["v"], verify=True)
    assert g.state == pb.COMMITTED, g.failure
    installed(S["v"])
    with open(cl.log.name) as f:
        f.seek(mark)
        log = f.read()
    assert "communicators shrunk to epoch" in log, log[-3000:]


def slow_open_heartbeats():
    """A registration whose cudaIpcOpenMemHandle stalls (the emulator holds it
    while a file exists) does not stall the node's loop: while it is pending
    the coordinator sees fresh heartbeats from the node for more than a
    lease; then the registration completes."""
    if harness.GPU_REAL:
        print("     skipped: a GPU's driver cannot be made to stall here")
        return
    cl = S["cl"]
    slow = os.environ["REFIT_EMU_SLOW_IPC_OPEN"]
    got = {}

    def register():
        got["c"] = Client(cl, 1, "gm2", "infer", S["i"], instance="s",
                          install="double-buffer")
    with open(slow, "w"):
        pass
    th = threading.Thread(target=register)
    try:
        th.start()
        fresh_beats(cl, "g1", lambda: th.is_alive() and "c" not in got)
    finally:
        os.unlink(slow)
        th.join(60)
    assert "c" in got and got["c"].ok(), got["c"].first if "c" in got else "no client"
    got["c"].close()


def fresh_beats(cl, node, stalled):
    """The coordinator sees fresh heartbeats from `node` for more than a lease
    while stalled() holds."""
    fresh, last, t0 = 0, None, time.time()
    # the node's lease age falls at each heartbeat it sends meanwhile
    while time.time() - t0 < 30 and (fresh < 4 or time.time() - t0 < LEASE_MS / 1000):
        ages = {m.node_id: m.lease_age_ms for m in
                cl.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members}
        assert node in ages, f"node {node} left the membership: {ages}"
        fresh += last is not None and ages[node] < last
        last = ages[node]
        time.sleep(0.05)
    assert stalled(), "the CUDA call did not stall"
    assert fresh >= 4, f"{fresh} heartbeats seen while the CUDA call was stalled"


def slow_close_heartbeats():
    """A client that goes (unregisters, exits) while cudaIpcCloseMemHandle
    stalls (the emulator holds it while a file exists) does not stall the
    node's loop: the coordinator sees fresh heartbeats from the node for
    more than a lease; then the close completes (the counters at the end
    show no mapping left open)."""
    if harness.GPU_REAL:
        print("     skipped: a GPU's driver cannot be made to stall here")
        return
    cl = S["cl"]
    slow = os.environ["REFIT_EMU_SLOW_IPC_CLOSE"]
    c = Client(cl, 1, "gm3", "infer", S["i"], instance="s", install="double-buffer")
    assert c.ok(), c.first
    with open(slow, "w"):
        pass
    th = threading.Thread(target=c.close)
    try:
        th.start()
        fresh_beats(cl, "g1", lambda: True)
        # the client's unregistration was answered while the close stalls
        th.join(30)
        assert not th.is_alive(), "the client did not exit while the close stalled"
    finally:
        os.unlink(slow)
        th.join(60)
    assert not th.is_alive(), "the client did not exit"


def async_trainer():
    """The refit waits for the trainer's events: the old bytes are never read."""
    cl = S["cl"]
    S["trainer"].close()
    go = f"{TMP}/async-go"
    os.environ["REFIT_EMU_HOLD_STREAMS"] = go   # the emulator's; a GPU ignores it
    try:
        S["trainer"] = Client(cl, 0, "gm", "train", S["t"], version=S["v"],
                              extra=["--async-write"])
    finally:
        del os.environ["REFIT_EMU_HOLD_STREAMS"]
    assert S["trainer"].ok(), S["trainer"].first
    step()   # queued, held
    rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="gm", version=S["v"]),
                               timeout=5).refit_id
    ended = None
    for _ in range(50):   # 1 s in which a refit that does not wait ends (0.5 s)
        g = cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
        if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED):
            ended = g
            break
        time.sleep(0.02)
    with open(go, "w"):
        pass
    if not harness.GPU_REAL:
        assert ended is None, (f"the refit ended ({pb.RefitState.Name(ended.state)}) "
                               "while the trainer's writes were still queued")
    g = cl.wait_final(rid, 60)
    assert g.state == pb.COMMITTED, g.failure
    installed(S["v"])


def slow_unique_id_heartbeats():
    """A new epoch's NCCL unique id that is slow to make (the emulator holds
    ncclGetUniqueId in refitd's root-holder child while a file exists) does
    not stall the loop of the node making it (g0, the lowest rank's): while
    the refit waits for the id, the coordinator sees fresh heartbeats from
    g0 for more than a lease; then the refit commits."""
    if harness.GPU_REAL:
        print("     skipped: a GPU's NCCL cannot be made to stall here")
        return
    cl = S["cl"]
    slow = os.environ["REFIT_EMU_SLOW_UNIQUE_ID"]
    extra = spawn(harness.node_spawn_args(cl, "g8", "8"), stderr=cl.log,
                  env=harness.host_env("g8"))
    try:
        cl.wait_members(4)   # a new epoch: the next refit asks g0 for an id
        step()
        with open(slow, "w"):
            pass
        try:
            rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="gm", version=S["v"]),
                                       timeout=5).refit_id

            def waiting():
                g = cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
                return g.state not in (pb.RUNNING, pb.COMMITTED, pb.FAILED, pb.ABORTED)
            fresh_beats(cl, "g0", waiting)
        finally:
            os.unlink(slow)
        g = cl.wait_final(rid, 60)
        assert g.state == pb.COMMITTED, g.failure
        installed(S["v"])
    finally:
        extra.send_signal(signal.SIGTERM)
        assert extra.wait(timeout=30) == 0
        cl.wait_members(3)


try:
    check("three node daemons on one GPU (own NCCL_HOSTID each), librefit clients",
          setup)
    if "cl" in S:
        check("refits with verify on: reshard, gather-and-broadcast, strided memory",
              refits_verified)
        check("abort midway; the next refit commits on fresh communicators", abort_midway)
        check("a node killed mid-refit; restarted, the next refit commits", node_killed)
        check("a fourth node joins, then leaves: the survivors shrink", join_leave_shrink)
        check("a trainer writing asynchronously: the refit waits for its CUDA events",
              async_trainer)
        check("a registration whose cudaIpcOpenMemHandle stalls: heartbeats go on",
              slow_open_heartbeats)
        check("a client goes while its cudaIpcCloseMemHandle stalls: heartbeats go on",
              slow_close_heartbeats)
        check("a new epoch's ncclGetUniqueId stalls: the node's heartbeats go on",
              slow_unique_id_heartbeats)
finally:
    for c in S.get("inst", []) + ([S["trainer"]] if "trainer" in S else []):
        c.close()
    harness.stop_all()
    bad = [(p.args[0], p.args[1:3], p.returncode) for p in harness.PROCS
           if p.returncode not in (0, -9, -15)]
    if bad:
        harness.counts["failed"] += 1
        print(f"FAIL processes exited badly (see {TMP}/*.log): {bad}")
    harness.report_emu_leaks()
harness.summary("gpu-e2e")
