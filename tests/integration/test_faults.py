#!/usr/bin/python3
"""Fault injection, end to end: a coordinator and node daemons as real
processes on loopback, librefit clients, and faults during refits.

Usage: test_faults.py BUILD_DIR [SOAK_SECONDS].  Scenarios: a node killed
(SIGKILL) mid-refit, a node stopped (SIGSTOP) mid-refit, data connections
cut (ss -K), a retry after a membership change, a catch-up refit for a late
instance, a trainer restart, a coordinator restart mid-refit, a drain
mid-refit, a node leaving; then a soak alternating refits with kills and
restarts for SOAK_SECONDS (default 40), and a peer ending calls without a
grpc-status.  Each asserts the detection bound, the state refitctl
reports, that nothing is half-applied (double buffer keeps the old version
byte-exact, in place stays invalid), and that the next refit is
byte-exact.  Faults around single calls (aborts, Commits, Publishes,
watched channels): test_faults_calls.py; partitions: test_faults_partition.py
(the three share faults_common.py).  Prints the measured detection and
recovery times, and "faults: N passed, N failed" last.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
SOAK = float(sys.argv[2]) if len(sys.argv) > 2 else 40
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-ft-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, spawn, write  # noqa: E402
harness.init(BUILD, TMP)
from nostatus_peer import survives_no_status  # noqa: E402
import faults_common  # noqa: E402
from faults_common import FIG, LEASE_MS, SPARSE, Model, tensors  # noqa: E402


def final_after(cl, rid, t0, bound):
    """The refit ends, and well before the 30 s slice deadline would end it
    (so the fault was detected).  bound is what it should take on an idle
    machine: recorded in the figures, not asserted (the machine may be busy)."""
    g = cl.wait_final(rid, 60)
    took = time.time() - t0
    assert took < 20, f"refit {rid} took {took:.2f} s to fail (expected ~{bound} s)"
    return g, took


def old_version_intact(m, v):
    st = m.state("db")
    assert f"version={v} " in st and "valid=1" in st, st
    assert m.inst["db"].cmd(f"check {v}").endswith("mismatches=0")


CL = None
M = None


def setup():
    global CL, M
    # nccl sends fewer, larger messages (one group per bucket): slow them more,
    # so that faults land mid-refit
    delay = "25" if harness.TRANSPORT == "tcp" else "120"
    CL = Cluster("f", 3, ["--test-msg-delay-ms", delay, "--slice-timeout-ms", "30000"],
                 ["--state-file", f"{TMP}/coord.state"], lease_ms=LEASE_MS)
    M = Model(CL, "fm")
    M.policy(retries=0, retry_backoff_ms=0, catch_up=False)
    g = CL.refit("fm", 1)
    assert g.state == pb.COMMITTED, g.failure
    M.installed()


def delta_second_refit():
    """The same plan again after a commit: only the changed bytes travel."""
    first = M.cl.stub.ListRefits(pb.ListRefitsRequest(model=M.name, limit=1),
                                 timeout=5).refits[0]
    M.step()
    g = M.commits()
    assert g.delta_base_refit == first.id, (g, first.id)
    assert 0 < g.delta_wire_bytes < g.delta_dense_bytes / 10, g


def delta_after_abort():
    """A refit aborted mid-way may have rewritten some bases: the next is dense
    (byte-exact, both instances), the one after it delta again."""
    rid = M.running()
    CL.stub.AbortRefit(pb.AbortRefitRequest(refit_id=rid, reason="test"), timeout=5)
    assert CL.wait_final(rid).state == pb.ABORTED
    g = M.commits()  # dense: checked there
    M.step()
    g2 = M.commits()
    assert g2.delta_base_refit == g.id and g2.delta_wire_bytes > 0, g2


def sigkill_node():
    rid = M.running()
    t0 = time.time()
    CL.nodes[2].kill()
    CL.nodes[2].wait()
    g, took = final_after(CL, rid, t0, LEASE_MS / 1000 + 2)
    FIG["SIGKILL detection"] = took
    assert g.state == pb.FAILED and "f2" in g.failure, g
    old_version_intact(M, M.version - 1)
    # recovery: restart the node and its client, the next refit is byte-exact
    t1 = time.time()
    M.inst["ip"].p.kill()
    CL.restart_node(2)
    CL.wait_members(3)
    M.start("ip")
    g = M.commits()   # dense: a new epoch, the restarted node holds no bases
    FIG["SIGKILL recovery (restart node + client, refit)"] = time.time() - t1
    # the delta chain goes on, to the restarted node too: byte-exact
    M.step()
    g2 = M.commits()
    if harness.TRANSPORT == "tcp":
        assert g2.delta_base_refit == g.id and g2.delta_wire_bytes > 0, (g.id, g2)


def sigstop_node():
    rid = M.running()
    t0 = time.time()
    CL.nodes[1].send_signal(signal.SIGSTOP)
    try:
        g, took = final_after(CL, rid, t0, LEASE_MS / 1000 + 2)
        FIG["SIGSTOP detection (lease)"] = took
        # the lease lapse names the node (issue 12, item 10)
        assert g.state == pb.FAILED and "f1" in g.failure, g
        st = M.state("ip")
        assert "valid=0" in st, st   # in place: invalid until the next good refit
    finally:
        CL.nodes[1].send_signal(signal.SIGCONT)
    t1 = time.time()
    CL.wait_members(3)
    old_version_intact(M, M.version - 1)
    M.commits()
    FIG["SIGSTOP recovery (rejoin, refit)"] = time.time() - t1


def connection_cut():
    rid = M.running()
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
    ep = [m.data_endpoint for m in mem.members if m.node_id == "f1"][0]
    port = ep.rsplit(":", 1)[1]
    t0 = time.time()
    subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", port],
                   capture_output=True)
    subprocess.run(["ss", "-K", "src", "127.0.0.1", "sport", "=", port],
                   capture_output=True)
    g, took = final_after(CL, rid, t0, 5)
    if g.state == pb.COMMITTED:
        # the cut came after the last byte to f1: nothing to detect
        FIG["connection cut"] = "refit had finished"
    else:
        FIG["connection cut detection"] = took
        # the data path is named: a transport error, or the link (a cut
        # during a handshake is reported as "data link A -> B: ...")
        assert g.state == pb.FAILED and ("tcp" in g.failure or "data link" in g.failure), g
        old_version_intact(M, M.version - 1)
        g = CL.refit("fm", M.version)
        assert g.state == pb.COMMITTED, g.failure
    M.installed()


def retry_after_membership_change():
    M.policy(retries=2, retry_backoff_ms=200, catch_up=False)
    rid = M.running()
    if harness.TRANSPORT == "nccl":
        # every member of an nccl epoch builds communicators: a real node
        extra = spawn(harness.node_spawn_args(CL, "f9", "90-91"), stderr=CL.log,
                      env=harness.host_env("f9"))
        try:
            g = CL.wait_final(rid, 60)
            assert g.state == pb.COMMITTED, g
            assert g.attempt == 2 and "membership changed" in g.attempts[0], g
            M.installed()
        finally:
            extra.send_signal(signal.SIGTERM)
            extra.wait(timeout=10)
        CL.wait_members(3)
        M.policy(retries=0, retry_backoff_ms=0, catch_up=False)
        return
    # a member joins while the refit runs: a Join sent from here lands at once
    # (a node process to start could come after the refit on a busy machine);
    # it is kept alive by heartbeats until the refit is final
    j = CL.stub.Join(pb.JoinRequest(node_id="f9", host="127.0.0.1",
                                    rpc_endpoint="127.0.0.1:1", data_endpoint="127.0.0.1:1",
                                    ranks=[pb.RankInfo(rank=90), pb.RankInfo(rank=91)]),
                     timeout=10)
    try:
        def final():
            CL.stub.Heartbeat(pb.HeartbeatRequest(member_id=j.member_id), timeout=5)
            g = CL.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
            return g if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED) else None
        g = harness.wait_for(final, timeout=60, what=f"refit {rid} to end", every=0.1)
        assert g.state == pb.COMMITTED, g
        assert g.attempt == 2 and "membership changed" in g.attempts[0], g
        M.installed()
    finally:
        CL.stub.Leave(pb.LeaveRequest(member_id=j.member_id, reason="test"), timeout=5)
    CL.wait_members(3)
    M.policy(retries=0, retry_backoff_ms=0, catch_up=False)


def catch_up_late_instance():
    M.policy(retries=1, retry_backoff_ms=200, catch_up=True)
    before = M.state("db")
    lay = write(f"{TMP}/fm-late.json", tensors([2, 3], "Shard(0)"))
    M.lay["late"] = (0, lay, "double-buffer")
    t0 = time.time()
    M.start("late")
    M.installed(insts=["late"])
    FIG["catch-up (register -> installed)"] = time.time() - t0
    # the instance sees the version at its node's commit, the record turns
    # COMMITTED when every node answered: wait for it
    refs = harness.wait_for(lambda: (lambda x: x if x.refits[0].state != pb.RUNNING else None)(
        CL.stub.ListRefits(pb.ListRefitsRequest(model="fm", limit=1), timeout=5)),
        what="the catch-up refit's record to be final")
    assert refs.refits[0].instance == "late" and refs.refits[0].state == pb.COMMITTED, refs
    assert M.state("db") == before, (before, M.state("db"))  # the others untouched


def trainer_restart():
    old = int(M.trainer.first.split()[1])
    M.trainer.p.kill()
    M.trainer.p.wait()
    # the node drops the dead trainer (its sweep notices the exit)
    ch = grpc.insecure_channel(f"unix:{CL.sock(0)}")
    local = pbg.LocalStub(ch)

    def dropped():
        try:
            local.GetState(pb.ClientRequest(client_id=old), timeout=5)
            return False
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.PERMISSION_DENIED:
                return False  # still there: the dead trainer's, not this process's
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return True
    harness.wait_for(dropped, what=f"node 0 to drop trainer client {old}")
    ch.close()
    M.version += 5
    M.trainer = Client(CL, 0, "fm", "train", M.tl, version=M.version, extra=SPARSE)
    assert M.trainer.ok(), M.trainer.first
    M.commits()


def delta_after_catch_up():
    """An in-place instance's client restarts: its catch-up (another plan)
    keeps no bases and leaves the model's, so the next refit is delta for
    every unit, the restarted client's included (bases are the nodes' wire
    bytes, not its memory), byte-exact."""
    M.policy(retries=1, retry_backoff_ms=200, catch_up=True)  # as catch_up_late_instance
    M.step()
    g0 = M.commits()
    M.inst["ip"].close()
    harness.wait_for(lambda: "ip" not in [i.instance for i in CL.stub.GetModel(
        pb.GetModelRequest(model=M.name), timeout=5).instances],
        what="instance ip to be unregistered")
    M.start("ip")
    M.installed(insts=["ip"])
    refs = harness.wait_for(lambda: (lambda x: x if x.refits[0].state != pb.RUNNING else None)(
        CL.stub.ListRefits(pb.ListRefitsRequest(model=M.name, limit=1), timeout=5)),
        what="the catch-up refit's record to be final")
    assert refs.refits[0].instance == "ip" and refs.refits[0].state == pb.COMMITTED, refs
    M.step()
    g = M.commits()
    if harness.TRANSPORT == "tcp":
        assert g.delta_base_refit == g0.id and 0 < g.delta_wire_bytes < \
            g.delta_dense_bytes / 10, (g0.id, g)


def coordinator_restart():
    # a delta refit of the chain before: its figures are in the state file
    deltas = [r for r in CL.stub.ListRefits(pb.ListRefitsRequest(
        model=M.name, limit=20), timeout=5).refits if r.delta_wire_bytes]
    rid = M.running()
    CL.coord.kill()
    CL.coord.wait()
    t0 = time.time()
    CL.coord = spawn(CL.coord_args, stderr=CL.log)
    # timed from outside this process (its gRPC channel has its own back-off)
    ctl = [f"{BUILD}/bin/refitctl", "--coordinator", CL.addr]
    harness.wait_for(lambda: "3 members" in subprocess.run(
        ctl + ["members"], capture_output=True, text=True).stdout,
        what="3 members after the restart")
    FIG["coordinator restart -> all nodes rejoined"] = time.time() - t0
    out = subprocess.run(ctl + ["trigger", "fm", "--version", str(M.version), "--wait"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "COMMITTED" in out.stdout, out
    FIG["coordinator restart -> next refit committed"] = time.time() - t0
    M.installed()
    out = subprocess.run(ctl + ["--json", "status", str(rid)], capture_output=True, text=True)
    st = json.loads(out.stdout)
    assert st["state"] == "FAILED" and "restarted" in st["failure"], out
    if deltas:  # refitctl status shows its dense and delta bytes after the restart
        d = deltas[0]
        out = subprocess.run(ctl + ["status", str(d.id)], capture_output=True, text=True)
        assert f"{d.dense_wire_bytes} bytes dense, {d.delta_wire_bytes} bytes delta for " \
            f"{d.delta_dense_bytes} dense (base: refit {d.delta_base_refit})" in out.stdout, \
            (d, out.stdout)
    CL.restart_coord(spawned=True)


def drain_midway():
    rid = M.running()
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", CL.addr, "drain", "f2"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and str(rid) in out.stdout, out
    g = CL.wait_final(rid, 20)
    assert g.state == pb.ABORTED, g
    old_version_intact(M, M.version - 1)
    CL.wait_members(2)
    # the instance on the drained node goes away; the rest refits
    CL.stub.UnregisterLayout(pb.UnregisterLayoutRequest(model="fm", role=pb.INFER,
                                                        instance="ip"), timeout=5)
    M.inst.pop("ip").close()
    M.commits()


def leave_shrinks():
    """A node leaves between refits: over nccl the survivors shrink their
    communicators (no new unique id); the next refit commits, byte-exact."""
    extra = spawn(harness.node_spawn_args(CL, "f8", "80-81"), stderr=CL.log,
                  env=harness.host_env("f8"))
    CL.wait_members(3)
    M.step()
    M.commits()       # the communicators span f8 too
    extra.send_signal(signal.SIGTERM)   # leaves gracefully
    assert extra.wait(timeout=20) == 0
    CL.wait_members(2)
    mark = os.path.getsize(CL.log.name)
    M.step()
    M.commits()
    if harness.TRANSPORT == "nccl":
        with open(CL.log.name) as f:
            f.seek(mark)
            log = f.read()
        assert "communicators shrunk to epoch" in log, log[-3000:]
        assert "communicators of epoch" not in log, log[-3000:]  # none built anew


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def trigger_when_idle(cl, model, v):
    """Trigger, waiting out a refit already running (a catch-up, a retry)."""
    end = time.time() + 60
    while True:
        try:
            return cl.stub.TriggerRefit(pb.TriggerRefitRequest(model=model, version=v),
                                        timeout=5).refit_id
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS or time.time() > end:
                raise
            time.sleep(0.05)


def soak():
    cl = Cluster("k", 4, ["--slice-timeout-ms", "20000"], lease_ms=LEASE_MS)
    rng = random.Random(11)
    tl = write(f"{TMP}/soak-t.json", tensors([0, 1, 2, 3], "Shard(0)"))
    lays = {f"i{k}": (k, write(f"{TMP}/soak-i{k}.json",
                               tensors([4 * k, 4 * k + 1], "Shard(1)")))
            for k in (1, 2, 3)}
    trainer = Client(cl, 0, "soak", "train", tl)
    assert trainer.ok(), trainer.first
    inst = {i: Client(cl, n, "soak", "infer", lay, instance=i, install="double-buffer")
            for i, (n, lay) in lays.items()}
    cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="soak", retries=1, retry_backoff_ms=100, catch_up=True)), timeout=5)
    base_fd = (fds(cl.coord.pid), fds(cl.nodes[0].pid))
    v, committed, failed, kills = 1, 0, 0, 0
    end = time.time() + SOAK
    while time.time() < end:
        rid = trigger_when_idle(cl, "soak", v)
        victim = None
        if rng.random() < 0.35:
            time.sleep(rng.random() * 0.02)
            k = rng.choice([1, 2, 3])
            victim = k
            cl.nodes[k].kill()
            cl.nodes[k].wait()
            kills += 1
        g = cl.wait_final(rid, 60)
        if victim is not None:
            inst[f"i{victim}"].p.kill()
            cl.restart_node(victim)
            cl.wait_members(4)
            inst[f"i{victim}"] = Client(cl, victim, "soak", "infer", lays[f"i{victim}"][1],
                                        instance=f"i{victim}", install="double-buffer")
            assert inst[f"i{victim}"].ok(), inst[f"i{victim}"].first
        if g.state == pb.COMMITTED:
            committed += 1
        else:
            failed += 1
            g = cl.wait_final(trigger_when_idle(cl, "soak", v))  # after recovery: through
            assert g.state == pb.COMMITTED, g.failure
        for c in inst.values():
            out = c.cmd(f"wait {v} 20000")
            assert out.startswith("INSTALLED") and "mismatches=0" in out, out
        if v == 1 and harness.TRANSPORT == "nccl":
            # communicators keep their connections between refits: count from
            # the first refit's (this node's stay up all along)
            base_fd = (base_fd[0], fds(cl.nodes[0].pid))
        v += 1
        out = trainer.cmd(f"next {v}")
        assert out.startswith("READY"), out
    end_fd = (fds(cl.coord.pid), fds(cl.nodes[0].pid))
    FIG["soak"] = (f"{v - 1} versions, {committed} committed first time, {failed} failed "
                   f"and redone, {kills} node kills; fds coordinator {base_fd[0]}->"
                   f"{end_fd[0]}, node k0 {base_fd[1]}->{end_fd[1]}")
    assert end_fd[0] <= base_fd[0] + 8 and end_fd[1] <= base_fd[1] + 8, FIG["soak"]


try:
    check("cluster, model and first refit", setup)
    if CL is not None and M is not None:
        check("delta: the same plan after a commit sends the changed bytes; after every "
              "fault below the next refit is dense, byte-exact", delta_second_refit)
        check("delta: an aborted refit mid-chain: the next refit is dense, the one after "
              "delta, byte-exact", delta_after_abort)
        check("SIGKILL a node mid-refit: bounded failure naming it, old version kept",
              sigkill_node)
        check("SIGSTOP a node mid-refit: the lease catches it; in place marked invalid",
              sigstop_node)
        if harness.TRANSPORT == "tcp":  # nccl has no data connections of its own
            check("data connections cut mid-refit (ss -K)", connection_cut)
        check("retry policy: a membership change mid-refit, second attempt commits",
              retry_after_membership_change)
        check("catch-up: a late instance gets the installed version at once",
              catch_up_late_instance)
        check("trainer restart: re-registers, the next WeightsReady works", trainer_restart)
        check("delta: an instance's client restarted and caught up: the next refit is "
              "delta, byte-exact", delta_after_catch_up)
        check("coordinator restart mid-refit: reported FAILED, next refit works",
              coordinator_restart)
        check("drain mid-refit: ABORTED, old version kept, node stays out", drain_midway)
        check("a node leaves between refits: the survivors shrink, next refit commits",
              leave_shrinks)
    check(f"soak: refits with random node kills for {SOAK:.0f} s", soak)
    check("a peer ending each call without a grpc-status (etcd's TLS listener stopping "
          "mid-call): the coordinator (etcd) and a node (coordinator) log the call failed "
          "and live on; SIGTERM: 0", lambda: survives_no_status(BUILD))
finally:
    faults_common.end()
faults_common.report("faults")
