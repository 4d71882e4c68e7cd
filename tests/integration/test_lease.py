#!/usr/bin/python3
"""Leases across stalls (docs/control-plane.md, "Leases and the coordinator's
own stalls"): a coordinator with a 2 s lease and three node daemons on
loopback, a trainer and an instance.

 - the coordinator stopped (SIGSTOP) for three leases and continued: it
   counts the stall (one WARN, refitd_coordinator_stalls_total), and does not
   blame the members for it: the same members at the same epoch, no lease
   expired, heartbeats go on, and the next refit commits in that epoch;
 - the coordinator stopped as long while a refit runs: the refit commits in
   its epoch;
 - a node stopped (SIGSTOP) longer than the lease still expires, and joins
   again once continued;
 - a node stopped together with the coordinator still expires after the
   coordinator continues (the stall is not a free pass), the others stay.

Usage: test_lease.py BUILD_DIR.  Ends with "lease: N passed, N failed".
"""
import os
import random
import signal
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-lease-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import RPN, Cluster, check, free_port, start_model, wait_for  # noqa: E402

harness.init(BUILD, TMP)
LEASE_MS = 2000
STOP_S = 3 * LEASE_MS / 1000   # the deliberate stop interval
MPORT = free_port()
CL = None
MODEL = {}


def scrape():
    """{(sample name, frozenset(labels)): value} of the coordinator."""
    return harness.scrape_metrics(MPORT)


def val(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def ours(samples):
    """The samples the checks here read (for their failure messages)."""
    return {n: val(samples, n) for n in ("refitd_epoch", "refitd_members",
                                         "refitd_lease_expiries_total",
                                         "refitd_coordinator_stalls_total",
                                         "refitd_coordinator_stalled_seconds_total")}


def beats(samples):
    """Heartbeats the coordinator answered OK so far."""
    return val(samples, "refitd_rpc_duration_seconds_count", method="Heartbeat", code="OK")


def members():
    """{node_id: member_id} and the epoch, from ListMembers."""
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
    return {m.node_id: m.member_id for m in mem.members}, mem.epoch


def log_lines(text):
    CL.log.flush()
    with open(f"{TMP}/{CL.name}.log") as f:
        return [ln for ln in f if text in ln]


def setup():
    global CL
    # info: the coordinator logs why each epoch changed ("lease expired: ...")
    CL = Cluster("ls", 3, ["--test-msg-delay-ms", "25"],
                 coord_extra=["--metrics-listen", f"127.0.0.1:{MPORT}", "--log-level", "info"],
                 lease_ms=LEASE_MS)
    # 8 tensors resharded: with the nodes' message delay a refit runs long
    # enough to stop it midway
    train, insts = harness.reshard_layouts(RPN, count=8, shape=(256, 64))
    MODEL["clients"] = start_model(CL, "lm", train, insts, random.Random(7),
                                   installs={"i0": "double-buffer"})
    MODEL["version"] = 1
    harness.step_and_refit(CL, MODEL, 1)
    s = scrape()
    assert val(s, "refitd_coordinator_stalls_total") == 0, ours(s)


def coordinator_stopped():
    before, epoch = members()
    assert len(before) == 3, before
    s0 = scrape()
    expired0 = val(s0, "refitd_lease_expiries_total")
    CL.coord.send_signal(signal.SIGSTOP)
    try:
        time.sleep(STOP_S)   # the fault itself: three leases without running
    finally:
        CL.coord.send_signal(signal.SIGCONT)
    s1 = wait_for(lambda: (lambda s: s if val(s, "refitd_coordinator_stalls_total") >= 1
                           else None)(scrape()), 60, "the stall to be counted")
    # heartbeats go on after it: two leases' worth from every node, enough
    # running time after the stall for any lease it had left unrenewed to lapse
    need = beats(s1) + 3 * 2 * LEASE_MS / (LEASE_MS // 10)
    s2 = wait_for(lambda: (lambda s: s if beats(s) >= need else None)(scrape()), 120,
                  f"{need:.0f} heartbeats answered after the stall")
    after, epoch2 = members()
    assert after == before and epoch2 == epoch, \
        ("the members or the epoch changed across the coordinator's stall",
         before, epoch, after, epoch2, log_lines("lease expired"))
    assert val(s2, "refitd_lease_expiries_total") == expired0, ours(s2)
    assert not log_lines("lease expired"), log_lines("lease expired")
    # one WARN per stall (a busy machine may add short ones of its own)
    stalls = log_lines("coordinator: stalled for")
    assert len(stalls) >= 1 and val(s2, "refitd_coordinator_stalls_total") == len(stalls), \
        (stalls, ours(s2))
    # the stall lasted at least the stop, less the tick it may have begun in
    stalled = val(s2, "refitd_coordinator_stalled_seconds_total")
    assert stalled >= STOP_S - 0.2, stalled
    MODEL["version"] += 1
    g = harness.step_and_refit(CL, MODEL, MODEL["version"])
    assert g.epoch == epoch, ("the refit ran in another epoch", g.epoch, epoch)


def refit_across_stall():
    """The coordinator stopped while a refit runs: the refit commits in its
    epoch (the slices end meanwhile; their SliceDone reports are resent until
    the coordinator answers)."""
    before, epoch = members()
    cs = MODEL["clients"]
    MODEL["version"] += 1
    v = MODEL["version"]
    out = cs["train"][0].cmd(f"next {v}")
    assert out.startswith("READY"), out
    s0 = scrape()
    rid = CL.stub.TriggerRefit(pb.TriggerRefitRequest(model="lm", version=v),
                               timeout=10).refit_id
    wait_for(lambda: CL.stub.GetRefit(pb.GetRefitRequest(refit_id=rid),
                                      timeout=10).state == pb.RUNNING,
             60, f"refit {rid} to run", every=0.005)
    CL.coord.send_signal(signal.SIGSTOP)
    try:
        time.sleep(STOP_S)   # the fault itself
    finally:
        CL.coord.send_signal(signal.SIGCONT)
    g = CL.wait_final(rid, 120)
    assert g.state == pb.COMMITTED, g.failure
    assert g.epoch == epoch, (g.epoch, epoch)
    harness.expect_installed(cs, v)
    assert members() == (before, epoch), (before, epoch, members())
    # the stop did land in RUNNING: that phase lasted at least the stop
    s1 = scrape()
    ph = "refitd_refit_phase_duration_seconds"
    ran = val(s1, f"{ph}_sum", phase="running") - val(s0, f"{ph}_sum", phase="running")
    assert val(s1, f"{ph}_count", phase="running") - \
        val(s0, f"{ph}_count", phase="running") == 1, ours(s1)
    assert ran >= STOP_S - 0.2, ("the coordinator was not stopped while the refit ran", ran)
    assert val(s1, "refitd_lease_expiries_total") == val(s0, "refitd_lease_expiries_total")


def wait_gone(node):
    return wait_for(lambda: (lambda m: m if node not in m[0] else None)(members()), 60,
                    f"node {node}'s lease to expire")


def node_stopped():
    before, epoch = members()
    assert len(before) == 3, before
    expired0 = val(scrape(), "refitd_lease_expiries_total")
    CL.nodes[2].send_signal(signal.SIGSTOP)
    try:
        after, epoch2 = wait_gone("ls2")
    finally:
        CL.nodes[2].send_signal(signal.SIGCONT)
    assert epoch2 > epoch, (epoch, epoch2)
    assert {k: v for k, v in before.items() if k != "ls2"} == after, (before, after)
    assert val(scrape(), "refitd_lease_expiries_total") == expired0 + 1
    assert log_lines(f"lease expired: member {before['ls2']} (ls2)")
    CL.wait_members(3)


def node_and_coordinator_stopped():
    before, epoch = members()
    assert len(before) == 3, before
    expired0 = val(scrape(), "refitd_lease_expiries_total")
    stalls0 = val(scrape(), "refitd_coordinator_stalls_total")
    CL.nodes[2].send_signal(signal.SIGSTOP)
    try:
        CL.coord.send_signal(signal.SIGSTOP)
        try:
            time.sleep(STOP_S)   # the fault itself
        finally:
            CL.coord.send_signal(signal.SIGCONT)
        after, _ = wait_gone("ls2")
        assert {k: v for k, v in before.items() if k != "ls2"} == after, (before, after)
        s = scrape()
        assert val(s, "refitd_coordinator_stalls_total") >= stalls0 + 1, ours(s)
        assert val(s, "refitd_lease_expiries_total") == expired0 + 1, ours(s)
        assert log_lines(f"lease expired: member {before['ls2']} (ls2)")
    finally:
        CL.nodes[2].send_signal(signal.SIGCONT)
    CL.wait_members(3)
    MODEL["version"] += 1
    harness.step_and_refit(CL, MODEL, MODEL["version"])


try:
    check("cluster (2 s lease, 3 nodes), model and first refit", setup)
    if CL is not None and MODEL.get("clients"):
        check("coordinator stopped for 3 leases: same members and epoch, the stall "
              "counted once, the next refit commits", coordinator_stopped)
        check("coordinator stopped for 3 leases while a refit runs: it commits in its "
              "epoch", refit_across_stall)
        check("a node stopped past its lease still expires, and joins again",
              node_stopped)
        check("a node stopped with the coordinator expires after it continues; the "
              "others stay", node_and_coordinator_stopped)
finally:
    if MODEL.get("clients"):
        harness.stop(MODEL["clients"])
    harness.stop_all()
    harness.check_exits()
harness.summary("lease")
