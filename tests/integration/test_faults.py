#!/usr/bin/python3
"""Fault injection, end to end: a coordinator and node daemons as real
processes on loopback, librefit clients, and faults during refits.

Usage: test_faults.py BUILD_DIR [SOAK_SECONDS].  Scenarios: a node killed
(SIGKILL) mid-refit, a node stopped (SIGSTOP) mid-refit, data connections
cut (ss -K), a retry after a membership change, a catch-up refit for a late
instance, catch-up after a partition (either node of a two-node instance
cut, in either order, across a coordinator restart), a trainer restart, a
coordinator restart mid-refit, a drain mid-refit; then a soak alternating
refits with kills and restarts for SOAK_SECONDS (default 40).  Each
asserts the detection bound, the state refitctl reports, that nothing is
half-applied (double buffer keeps the old version byte-exact, in place
stays invalid), and that the next refit is byte-exact.  Prints the
measured detection and recovery times, and "faults: N passed, N failed"
last.
"""
import hashlib
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
from nostatus_peer import survives_no_status  # noqa: E402

harness.init(BUILD, TMP)
LEASE_MS = 1000
FIG = {}


def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": ranks,
             "placements": [placement]} for k in range(8)]


# versions change this many elements per million (refit-client --sparse): a
# refit after a committed one of the same plan goes as delta (docs/delta.md)
SPARSE = ["--sparse", "5000"]


class Model:
    """Trainer on node 0 (ranks 0, 1), instance db (double buffer) on node 1,
    instance ip (in place) on node 2."""

    def __init__(self, cl, name):
        self.cl, self.name = cl, name
        self.tl = write(f"{TMP}/{name}-t.json", tensors([0, 1], "Shard(0)"))
        self.lay = {"db": (1, write(f"{TMP}/{name}-db.json", tensors([4, 5], "Shard(1)")),
                           "double-buffer"),
                    "ip": (2, write(f"{TMP}/{name}-ip.json", tensors([8, 9], "Shard(1)")),
                           "in-place")}
        self.version = 1
        self.trainer = Client(cl, 0, name, "train", self.tl, extra=SPARSE)
        assert self.trainer.ok(), self.trainer.first
        self.inst = {}
        for i in self.lay:
            self.start(i)

    def start(self, inst):
        node, lay, mode = self.lay[inst]
        c = Client(self.cl, node, self.name, "infer", lay, instance=inst, install=mode,
                   extra=SPARSE)
        assert c.ok(), c.first
        self.inst[inst] = c
        return c

    def policy(self, **kw):
        self.cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model=self.name, **kw)), timeout=5)

    def step(self):
        self.version += 1
        out = self.trainer.cmd(f"next {self.version}")
        assert out.startswith("READY"), out

    def installed(self, v=None, insts=None):
        for i in insts or self.inst:
            out = self.inst[i].cmd(f"wait {v or self.version} 20000")
            assert "mismatches=0" in out and out.startswith("INSTALLED"), (i, out)

    def running(self):
        """Step to the next version and trigger its refit; returns its id once running."""
        self.step()
        rid = self.trigger()
        wait_running(self.cl, rid)
        return rid

    def commits(self):
        """Refit this version: it commits, every instance installs it byte-exact.
        After a refit that did not commit (failed, aborted: its nodes may have
        rewritten their delta bases) it is dense; a catch-up is never a base.
        Returns its record."""
        g = self.cl.refit(self.name, self.version)
        assert g.state == pb.COMMITTED, g.failure
        self.installed()
        prev = [r for r in self.cl.stub.ListRefits(pb.ListRefitsRequest(
            model=self.name, limit=2), timeout=5).refits if r.id != g.id]
        if prev and prev[0].state != pb.COMMITTED:
            assert g.delta_base_refit == 0 and g.delta_wire_bytes == 0, (prev[0], g)
        if prev and prev[0].instance:
            assert g.delta_base_refit != prev[0].id, (prev[0], g)
        return g

    def state(self, inst):
        return self.inst[inst].cmd("state")

    def trigger(self):
        return self.cl.stub.TriggerRefit(pb.TriggerRefitRequest(
            model=self.name, version=self.version), timeout=5).refit_id


def two_clients(cl, tag, model, inst, install):
    """A trainer of model on node 0 (ranks 0, 1) and its instance inst on node 1
    (that node's first two ranks), both registered; layouts in TMP/tag-*.json."""
    rpn = harness.RPN
    trainer = Client(cl, 0, model, "train", write(f"{TMP}/{tag}-t.json",
                                                  tensors([0, 1], "Shard(0)")))
    assert trainer.ok(), trainer.first
    c = Client(cl, 1, model, "infer", write(f"{TMP}/{tag}-{inst}.json",
                                            tensors([rpn, rpn + 1], "Shard(1)")),
               instance=inst, install=install)
    assert c.ok(), c.first
    return trainer, c


def wait_running(cl, rid):
    return harness.wait_for(
        lambda: (lambda g: g if g.state == pb.RUNNING else None)(
            cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)),
        what=f"refit {rid} to run", every=0.005)


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


def coordinator_restart_without_state():
    """Issue 12, item 5: a coordinator without a state file restarts empty;
    epochs still never go back, and the nodes register their clients again
    (layouts and the trainer's ready version): the next refit commits."""
    cl = Cluster("ns", 3, lease_ms=LEASE_MS)
    m = Model(cl, "nm")
    m.step()
    g = cl.refit("nm", m.version)
    assert g.state == pb.COMMITTED, g.failure
    # membership changes push the nodes' prepared epoch up
    for _ in range(3):
        cl.nodes[2].kill()
        cl.nodes[2].wait()
        cl.wait_members(2)
        cl.restart_node(2)
        cl.wait_members(3)
    m.inst["ip"].close()
    m.start("ip")
    m.step()
    g = cl.refit("nm", m.version)
    assert g.state == pb.COMMITTED, g.failure
    m.installed()
    high = g.epoch
    before = {m.member_id for m in cl.stub.ListMembers(pb.ListMembersRequest(),
                                                        timeout=5).members}
    cl.coord.kill()
    cl.coord.wait()
    cl.restart_coord()
    after = {m.member_id for m in cl.wait_members(3).members}
    # member ids are never reused: a node still heartbeating with an id of the
    # last coordinator must not be taken for the node that got it now (it
    # would never join again)
    assert not before & after, (before, after)
    # the model is known again, with the trainer's ready version
    mod = harness.wait_for(lambda: (lambda x: x if x.latest_version == m.version and len(
        x.instances) == 3 else None)(cl.stub.GetModel(pb.GetModelRequest(model="nm"),
                                                       timeout=5)),
        what="the nodes to register their clients again")
    assert sorted(i.instance for i in mod.instances) == ["", "db", "ip"], mod
    assert cl.stub.ListMembers(pb.ListMembersRequest(), timeout=5).epoch > high
    m.step()
    g = cl.refit("nm", m.version)
    assert g.state == pb.COMMITTED, g.failure
    assert g.epoch > high, (g.epoch, high)
    m.installed()


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


def group_wait_keeps_loop():
    """Issue 10, defect 7: a node whose nccl slice waits in an NCCL group
    (its peer is stopped before posting its half) still answers its loop's
    calls -- PrepareEpoch of the same epoch (nccl_set_world takes the
    transport's lock), NcclId (the lock too), Local Hello -- while the group
    still waits: nothing may poll under that lock.  With the lock held over
    the wait, PrepareEpoch returns only once the slice gave up at its
    deadline, and the refit is FAILED by then."""
    # w0 (trainer, ranks 0-3) sleeps 2 s before each send, w1 (instance,
    # ranks 4-7) posts its receives at once and logs that its group waits
    cl = Cluster("w", 2, ["--slice-timeout-ms", "30000"], lease_ms=30000,
                 node_extra=lambda k: ["--test-msg-delay-ms", "2000"] if k == 0
                 else ["--log-level", "debug"])
    procs = [cl.coord] + cl.nodes
    try:
        def lay(ranks):
            return [{"name": "w", "dtype": "fp32", "shape": [256, 64], "mesh": ranks,
                     "placements": ["Shard(0)"]}]
        tr = Client(cl, 0, "wm", "train", write(f"{TMP}/wm-t.json", lay([0, 1])))
        inst = Client(cl, 1, "wm", "infer", write(f"{TMP}/wm-i.json", lay([4, 5])),
                      instance="i", install="double-buffer")
        procs += [tr.p, inst.p]
        assert tr.ok() and inst.ok(), (tr.first, inst.first)
        mark = os.path.getsize(cl.log.name)
        rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="wm", version=1),
                                   timeout=5).refit_id

        def waiting():
            with open(cl.log.name) as f:
                f.seek(mark)
                return "nccl: node w1: group of 2 operations issued, waiting" in f.read()
        harness.wait_for(waiting, 60, "node w1 to wait in its NCCL group")
        cl.nodes[0].send_signal(signal.SIGSTOP)   # in its 2 x 2 s sleep: no sends
        try:
            g = cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
            assert g.state == pb.RUNNING, g
            mem = cl.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
            w1 = [m for m in mem.members if m.node_id == "w1"][0]
            nch = grpc.insecure_channel(w1.rpc_endpoint)
            lch = grpc.insecure_channel(f"unix:{cl.sock(1)}")
            node = pbg.NodeStub(nch)
            # the bounds are far beyond the 30 s slice deadline: the order of
            # events is what is checked, not the time taken
            # every member's data verifier (its data token's SHA-256, issue
            # 25): ListMembers does not show them; nccl does not use them
            members = []
            for m in mem.members:
                x = type(m)()
                x.CopyFrom(m)
                x.data_verifier = hashlib.sha256(m.node_id.encode()).digest()
                members.append(x)
            fut = node.PrepareEpoch.future(pb.PrepareEpochRequest(
                epoch=g.epoch, token=b"w" * 16, members=members), timeout=90)
            h = pbg.LocalStub(lch).Hello(pb.HelloRequest(), timeout=90)
            assert h.node_id == "w1" and h.joined, h
            assert fut.result().epoch == g.epoch
            assert len(node.NcclId(pb.NcclIdRequest(epoch=g.epoch),
                                   timeout=90).nccl_unique_id) > 0
            nch.close()
            lch.close()
            g = cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
            assert g.state == pb.RUNNING, \
                f"w1 answered only after its NCCL group gave up: {g.state} {g.failure}"
            with open(cl.log.name) as f:
                f.seek(mark)
                assert "slice done" not in f.read()   # w1's group still waits
        finally:
            cl.nodes[0].send_signal(signal.SIGCONT)
        g = cl.wait_final(rid, 90)
        assert g.state == pb.COMMITTED, g.failure
        out = inst.cmd("wait 1 20000")
        assert out.startswith("INSTALLED") and "mismatches=0" in out, out
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=20)


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


def stop_cluster(cl, clients):
    """End a cluster of its own (SIGTERM), so later checks have the CPU."""
    for c in clients:
        c.close()
    for q in cl.nodes + [cl.coord]:
        if q.poll() is None:
            q.terminate()
            q.wait(timeout=30)


def log_lines(cl, text):
    cl.log.flush()
    with open(f"{TMP}/{cl.name}.log") as f:
        return [ln for ln in f if text in ln]


# Issue 11: a cluster whose leases (60 s) and slice deadlines (60 s) never
# end a refit here, so what ends one is the abort under test, and a node
# killed between refits stays a member long enough to watch its channel.
GL = None
GM = None


def members_ctl(cl):
    """refitctl --json members, parsed."""
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", cl.addr, "--json",
                          "members"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    return json.loads(out.stdout)


def long_lease_setup():
    global GL, GM
    GL = Cluster("g", 3, ["--slice-timeout-ms", "60000"], lease_ms=60000)
    GM = Model(GL, "gm")
    GM.policy(retries=0, retry_backoff_ms=0, catch_up=False)
    g = GL.refit("gm", 1)
    assert g.state == pb.COMMITTED, g.failure
    GM.installed()
    m = members_ctl(GL)
    assert [x["connection"] for x in m["members"]] == ["READY"] * 3, m
    assert int(m["node_calls_outstanding"]) == 0, m
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", GL.addr, "members"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "CONNECTION" in out.stdout, out
    assert out.stdout.count(" READY ") == 3 and "node calls: 0 outstanding" in out.stdout, \
        out.stdout


def abort_cancels_calls():
    """g1 stopped (SIGSTOP) between refits: the next refit's RunSlice to it
    stays outstanding (no PrepareEpoch: the epoch is unchanged).  refitctl
    abort ends the refit ABORTED at once and cancels that call: the
    coordinator's cancelled count goes up and its outstanding count back to
    0 while g1 is still stopped (uncancelled, the RunSlice would be
    outstanding until its 30 s deadline); after SIGCONT the next refit
    commits."""
    cancelled0 = int(members_ctl(GL)["node_calls_cancelled"])
    GM.step()
    GL.nodes[1].send_signal(signal.SIGSTOP)
    try:
        rid = GM.trigger()
        wait_running(GL, rid)
        # g0 and g2 answer RunSlice at its start; g1's stays outstanding
        harness.wait_for(lambda: int(members_ctl(GL)["node_calls_outstanding"]) == 1,
                         what="only g1's RunSlice outstanding")
        t0 = time.time()
        out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", GL.addr, "abort",
                              str(rid), "test: g1 is stopped"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out
        g = GL.wait_final(rid, 30)
        FIG["abort with a node stopped -> ABORTED"] = time.time() - t0
        assert g.state == pb.ABORTED and "g1 is stopped" in g.failure, g
        m = harness.wait_for(
            lambda: (lambda m: m if int(m["node_calls_cancelled"]) > cancelled0 else None)(
                members_ctl(GL)), what="g1's RunSlice cancelled")
        # the Abort sent to g1 has a 5 s deadline; the RunSlice, uncancelled, 30 s
        harness.wait_for(lambda: int(members_ctl(GL)["node_calls_outstanding"]) == 0,
                         timeout=20, what="no node call outstanding (g1 still stopped)")
        FIG["abort -> node calls back to 0"] = time.time() - t0
        assert len(m["members"]) == 3, m    # responsive, nobody dropped
    finally:
        GL.nodes[1].send_signal(signal.SIGCONT)
    g = GL.refit("gm", GM.version)
    assert g.state == pb.COMMITTED, g.failure
    GM.installed()


def watched_channel_lost():
    """g2 killed between refits: the coordinator's watch shows its channel
    TRANSIENT_FAILURE in refitctl members and logs it once naming the node
    (checked after the back-off retried for the rest of the test); nothing
    fails by it (it stays a member until its lease).  Restarted, g2 rejoins and the next refit
    commits with every channel READY."""
    ep = [m.rpc_endpoint for m in GL.stub.ListMembers(pb.ListMembersRequest(),
                                                      timeout=5).members
          if m.node_id == "g2"][0]
    line = f"coordinator: node g2: channel to {ep} TRANSIENT_FAILURE"
    GL.nodes[2].kill()
    GL.nodes[2].wait()

    def g2_conn():
        return [m["connection"] for m in members_ctl(GL)["members"] if m["node_id"] == "g2"]
    harness.wait_for(lambda: g2_conn() == ["TRANSIENT_FAILURE"],
                     what="g2's channel shown TRANSIENT_FAILURE")
    assert len(log_lines(GL, line)) == 1, log_lines(GL, "channel to")
    assert len(members_ctl(GL)["members"]) == 3
    GM.inst["ip"].p.kill()
    GL.restart_node(2)
    # its rejoin replaces the member and drops the old channel (NONE until called)
    harness.wait_for(lambda: g2_conn() in (["READY"], ["NONE"]), what="g2 rejoined")
    GM.start("ip")
    GM.step()
    g = GL.refit("gm", GM.version)
    assert g.state == pb.COMMITTED, g.failure
    GM.installed()
    m = members_ctl(GL)
    assert [x["connection"] for x in m["members"]] == ["READY"] * 3, m
    assert len(log_lines(GL, line)) == 1, log_lines(GL, "channel to")


def watched_shutdown():
    """SIGTERM with every node channel watched, one of them failing (g1
    killed): the coordinator ends with exit 0 (under ASan: nothing leaked)
    at once, not at a watch's 60 s deadline; the other nodes stop on SIGTERM."""
    GL.nodes[1].kill()
    GL.nodes[1].wait()
    harness.wait_for(lambda: [m["connection"] for m in members_ctl(GL)["members"]
                              if m["node_id"] == "g1"] in (["TRANSIENT_FAILURE"],
                                                          ["CONNECTING"], ["IDLE"]),
                     what="g1's channel no longer READY")
    GL.coord.send_signal(signal.SIGTERM)
    rc = GL.coord.wait(timeout=30)
    assert rc == 0, f"coordinator exited {rc} (see {TMP}/g.log)"
    stop_cluster(GL, list(GM.inst.values()) + [GM.trainer])
    bad = [(k, q.returncode) for k, q in enumerate(GL.nodes) if k != 1 and q.returncode != 0]
    assert not bad, f"nodes that did not exit 0 on SIGTERM: {bad} (see {TMP}/g.log)"


def atomic_switch():
    """Issue 12, item 9: an instance whose ranks span two nodes switches to a
    version on both or on neither.  Node at2 refuses its second Commit
    (test_fail_commit 2): refit v2 fails and NO rank of either instance shows
    v2 (the double buffers serve v1 byte-exact, in place stays invalid and
    says why); v3 then installs everywhere."""
    rpn = harness.RPN
    cl = Cluster("at", 2, ["--slice-timeout-ms", "30000"], lease_ms=3000)
    args = harness.node_spawn_args(cl, "at2", f"{2 * rpn}-{3 * rpn - 1}") + \
        ["--test-fail-commit", "2"]
    cl.nodes.append(spawn(args, stderr=cl.log, env=harness.host_env(cl.host(2))))
    cl.wait_members(3)
    tl = write(f"{TMP}/at-t.json", tensors([0, 1], "Shard(0)"))
    trainer = Client(cl, 0, "am", "train", tl)
    assert trainer.ok(), trainer.first
    inst = {}
    for name, ranks, mode in (("x", [rpn, 2 * rpn], "double-buffer"),
                              ("y", [rpn + 1, 2 * rpn + 1], "in-place")):
        lay = write(f"{TMP}/at-{name}.json", tensors(ranks, "Shard(1)"))
        for node in (1, 2):
            c = Client(cl, node, "am", "infer", lay, instance=name, install=mode)
            assert c.ok(), c.first
            inst[(name, node)] = c
    cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="am", retries=0, retry_backoff_ms=0, catch_up=False)), timeout=5)
    g = cl.refit("am", 1)
    assert g.state == pb.COMMITTED, g.failure
    for c in inst.values():
        out = c.cmd("wait 1 20000")
        assert out.startswith("INSTALLED 1 ") and "mismatches=0" in out, out
    # v2: every slice runs, at2's Commit is refused
    out = trainer.cmd("next 2")
    assert out.startswith("READY"), out
    g = cl.refit("am", 2)
    assert g.state == pb.FAILED and "at2" in g.failure and "Commit" in g.failure, g
    for (name, node), c in inst.items():
        st = c.cmd("state")
        assert "version=2" not in st, (name, node, st)
        assert "version=1 " in st, (name, node, st)
        if name == "x":  # double buffer: still serving v1, byte-exact
            assert "valid=1" in st, (name, node, st)
            assert c.cmd("check 1").endswith("mismatches=0"), (name, node)
        else:  # in place: written, never shown, and it says so
            assert "valid=0" in st and "not installed" in st, (name, node, st)
    # the next refit installs on every rank
    out = trainer.cmd("next 3")
    assert out.startswith("READY"), out
    g = cl.refit("am", 3)
    assert g.state == pb.COMMITTED, g.failure
    for c in inst.values():
        out = c.cmd("wait 3 20000")
        assert out.startswith("INSTALLED 3 ") and "valid=1" in out and \
            "mismatches=0" in out, out
    stop_cluster(cl, [trainer] + list(inst.values()))


def abort_before_run_slice():
    """An Abort that overtakes RunSlice is remembered: the RunSlice is refused
    at once (it used to start and wait for peers that had stopped, until its
    deadline).  Node ab1 holds RunSlice until the Abort of its refit came
    (test_hold_run_ms); its slice deadline (60 s) is above the wait here."""
    rpn = harness.RPN
    cl = Cluster("ab", 1, ["--slice-timeout-ms", "60000"], lease_ms=3000)
    args = harness.node_spawn_args(cl, "ab1", f"{rpn}-{2 * rpn - 1}") + \
        ["--test-hold-run-ms", "30000", "--slice-timeout-ms", "60000", "--log-level", "info"]
    cl.nodes.append(spawn(args, stderr=cl.log, env=harness.host_env(cl.host(1))))
    cl.wait_members(2)
    trainer, ip = two_clients(cl, "ab", "bm", "ip", "in-place")
    rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="bm", version=1),
                               timeout=5).refit_id
    harness.wait_for(lambda: log_lines(cl, f"node ab1: refit {rid}: RunSlice held"),
                     what="ab1 to hold the RunSlice")
    g = cl.stub.AbortRefit(pb.AbortRefitRequest(refit_id=rid, reason="test"), timeout=5)
    assert g.state == pb.ABORTED, g
    harness.wait_for(lambda: log_lines(cl, f"node ab1: refit {rid} (attempt 1): RunSlice "
                                           "refused"),
                     what="ab1 to refuse the RunSlice the Abort overtook")
    st = ip.cmd("state")  # nothing was written: in place still valid
    assert "valid=1" in st and "version=0" in st, st
    assert not log_lines(cl, f"node ab1: refit {rid}: slice"), \
        log_lines(cl, f"node ab1: refit {rid}: slice")
    stop_cluster(cl, [trainer, ip])


def prepare_once_per_epoch():
    """Issue 12, item 8: two refits in one epoch send PrepareEpoch once per
    node (a second one used to reset the transport of the epoch)."""
    cl = Cluster("pe", 2, ["--log-level", "info"], lease_ms=3000)
    trainer, db = two_clients(cl, "pe", "pm", "db", "double-buffer")
    g1 = cl.refit("pm", 1)
    assert g1.state == pb.COMMITTED, g1.failure
    out = trainer.cmd("next 2")
    assert out.startswith("READY"), out
    g2 = cl.refit("pm", 2)
    assert g2.state == pb.COMMITTED, g2.failure
    assert db.cmd("wait 2 20000").startswith("INSTALLED 2 ")
    assert g1.epoch == g2.epoch, ("the membership changed between the refits",
                                  g1.epoch, g2.epoch)
    for k in range(2):
        got = log_lines(cl, f"node pe{k}: epoch {g1.epoch} prepared")
        assert len(got) == 1, (k, got)
    stop_cluster(cl, [trainer, db])


def publish_resent():
    """Issue 27, item 3: a decided Publish is durable and resent until every
    node acknowledged it.  Node pr1 loses the Publish of every second refit
    it commits (test_lose_publish 2) until it joins again (as on a link cut
    between Commit and Publish): v2 is FAILED on the coordinator, pr1 keeps
    v1; once pr1 is reachable again (its lease lapsed under SIGSTOP, it
    joins again) it installs v2 byte-exact, with no new refit; a Publish of
    v2 sent once more is acknowledged, not installed twice.  Then v4 is
    lost the same way, the coordinator is killed and restarted from its
    state file, and the restarted one resends it: pr1 installs v4."""
    rpn = harness.RPN
    state = f"{TMP}/pr.state"
    cl = Cluster("pr", 2, ["--slice-timeout-ms", "30000"], ["--state-file", state],
                 lease_ms=LEASE_MS, node_extra=lambda k: ["--test-lose-publish", "2",
                                                          "--log-level", "info"]
                 if k == 1 else [])
    trainer = Client(cl, 0, "pm", "train", write(f"{TMP}/pr-t.json",
                                                 tensors([0], "Shard(0)")))
    assert trainer.ok(), trainer.first
    x = Client(cl, 1, "pm", "infer", write(f"{TMP}/pr-x.json", tensors([rpn], "Shard(0)")),
               instance="x", install="double-buffer")
    assert x.ok(), x.first
    cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="pm", retries=0, retry_backoff_ms=0, catch_up=False)), timeout=5)

    def refits():
        return len(cl.stub.ListRefits(pb.ListRefitsRequest(model="pm"), timeout=5).refits)

    def shown_x():
        m = cl.stub.GetModel(pb.GetModelRequest(model="pm"), timeout=5)
        return [i.installed_version for i in m.instances if i.instance == "x"]

    def lost(v):
        out = trainer.cmd(f"next {v}")
        assert out.startswith("READY"), out
        g = cl.refit("pm", v)
        assert g.state == pb.FAILED and "pr1" in g.failure and "Publish" in g.failure, g
        st = x.cmd("state")
        assert f"version={v - 1} " in st and "valid=1" in st, st
        assert x.cmd(f"check {v - 1}").endswith("mismatches=0")
        return g

    def installed(v, n):
        out = x.cmd(f"wait {v} 20000")
        assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out
        harness.wait_for(lambda: shown_x() == [v], what=f"GetModel to show x at v{v}")
        assert refits() == n, "a new refit was made"

    g = cl.refit("pm", 1)
    assert g.state == pb.COMMITTED, g.failure
    assert x.cmd("wait 1 20000").startswith("INSTALLED 1 ")
    g2 = lost(2)
    # cut off until its lease lapses, then reachable again
    cl.nodes[1].send_signal(signal.SIGSTOP)
    try:
        cl.wait_members(1)
    finally:
        cl.nodes[1].send_signal(signal.SIGCONT)
    installed(2, 2)
    # a Publish resent once more (its answer lost): acknowledged, not installed
    # twice (a second flip would show v1's buffer)
    ep = [m.rpc_endpoint for m in cl.wait_members(2).members if m.node_id == "pr1"][0]
    pbg.NodeStub(grpc.insecure_channel(ep)).Publish(pb.PublishRequest(
        refit_id=g2.id, epoch=g2.epoch, model="pm", version=2), timeout=5)
    st = x.cmd("state")
    assert "version=2 " in st and x.cmd("check 2").endswith("mismatches=0"), st
    out = trainer.cmd("next 3")
    assert out.startswith("READY"), out
    g = cl.refit("pm", 3)
    assert g.state == pb.COMMITTED, g.failure
    assert x.cmd("wait 3 20000").startswith("INSTALLED 3 ")
    lost(4)
    cl.coord.kill()
    cl.coord.wait()
    cl.restart_coord()
    cl.wait_members(2)
    installed(4, 4)
    assert json.load(open(state)).get("publishes") is None, "the decision was kept"
    stop_cluster(cl, [trainer, x])


# ---- issue 28, item 1: catch-up after a partition, on every path ----------
#
# A trainer on two nodes (cu0, cu1), a single-node replica "r" (cu0), and
# two instances spanning cu2 and cu3, registered on cu2 first: "db" (double
# buffer) and "ip" (in place).  A node of theirs is stopped (SIGSTOP: on
# loopback its lease lapses as if its link were cut) while a refit runs; the
# retry commits on "r" and skips them.  When the node runs again it joins
# again and its clients register again ("again"): the instances must get a
# catch-up refit whichever node came back, in whichever order, and across a
# coordinator restart, and GetModel must never show an instance ahead of
# what it holds.
PL = None


class Partition:
    """The cluster and its clients for the partition scenarios."""

    def __init__(self):
        rpn = harness.RPN
        self.cl = Cluster("cu", 4, ["--test-msg-delay-ms", "25", "--slice-timeout-ms",
                                    "30000"],
                          ["--state-file", f"{TMP}/cu.state"], lease_ms=LEASE_MS,
                          node_extra=lambda k: ["--log-level", "info"])
        self.name, self.version = "cm", 1
        tl = write(f"{TMP}/cu-t.json", tensors([0, rpn], "Shard(0)"))
        self.trainers = [Client(self.cl, k, "cm", "train", tl) for k in (0, 1)]
        for t in self.trainers:
            assert t.ok(), t.first
        # clients per instance: {instance: [(node, client)]}, first node first
        self.inst = {}
        self.add("r", [(0, 2), (0, 3)], "double-buffer")
        self.add("db", [(2, 2 * rpn), (3, 3 * rpn)], "double-buffer")
        self.add("ip", [(2, 2 * rpn + 1), (3, 3 * rpn + 1)], "in-place")
        self.cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model="cm", retries=4, retry_backoff_ms=200, catch_up=True)), timeout=5)
        g = self.cl.refit("cm", 1)
        assert g.state == pb.COMMITTED, g.failure
        self.holds(1)

    def add(self, name, where, mode):
        lay = write(f"{TMP}/cu-{name}.json", tensors([rk for _, rk in where], "Shard(1)"))
        self.inst[name] = []
        for node in dict.fromkeys(n for n, _ in where):
            c = Client(self.cl, node, "cm", "infer", lay, instance=name, install=mode)
            assert c.ok(), c.first
            self.inst[name].append((node, c))

    def step(self):
        self.version += 1
        for t in self.trainers:
            out = t.cmd(f"next {self.version}")
            assert out.startswith("READY"), out

    def holds(self, v, names=None):
        """Every client of the instances installed v, byte-exact (waits)."""
        for i in names or self.inst:
            for node, c in self.inst[i]:
                out = c.cmd(f"wait {v} 30000")
                assert out.startswith(f"INSTALLED {v} ") and "valid=1" in out and \
                    "mismatches=0" in out, (i, node, out)

    def model(self):
        return self.cl.stub.GetModel(pb.GetModelRequest(model="cm"), timeout=5)

    def shown(self):
        """{instance: (installed_version, invalid)} as GetModel shows them, and
        the model's installed version."""
        m = self.model()
        return {i.instance: (i.installed_version, i.invalid) for i in m.instances
                if i.role == pb.INFER}, m.installed_version

    def never_ahead(self, held):
        """GetModel shows no instance ahead of held[instance] (the version it
        holds for sure now), none of them valid past it, and the model's
        installed version not ahead of any instance."""
        inst, model_v = self.shown()
        for name, v in held.items():
            assert name in inst, (name, inst)
            assert inst[name][0] <= v, (f"instance {name} shown at v{inst[name][0]} "
                                        f"but holds v{v}", inst)
        assert all(model_v <= (0 if bad else v) for v, bad in inst.values()), (model_v, inst)
        return inst

    def registered_again(self, node, mark):
        """Node cu<node>'s clients (model cm) registered again since mark."""
        want = sum(1 for i in self.inst.values() for n, _ in i if n == node)
        lines = [ln for ln in log_lines_from(self.cl, mark, f"node cu{node}: client ")
                 if "registered again" in ln]
        return len(lines) >= want

    def cut(self, nodes):
        """Stop nodes while a refit of the next version runs; the retry
        commits on "r" and skips db and ip.  GetModel is polled throughout:
        never ahead.  Returns the refit."""
        old = self.version
        self.step()
        rid = self.cl.stub.TriggerRefit(pb.TriggerRefitRequest(
            model="cm", version=self.version), timeout=5).refit_id
        wait_running(self.cl, rid)
        for k in nodes:
            self.cl.nodes[k].send_signal(signal.SIGSTOP)
        try:
            return self.skipped(rid, old)
        except BaseException:
            self.resume()   # the next scenarios start from a whole cluster
            raise

    def resume(self):
        for q in self.cl.nodes:
            q.send_signal(signal.SIGCONT)

    def skipped(self, rid, old):
        """The retry of refit rid commits on "r" only; GetModel never shows
        an instance past old (polled while it runs)."""
        held = {"db": old, "ip": old}

        def final():
            if self.never_ahead(held)["r"][0] == self.version:  # only once it holds it
                st = self.inst["r"][0][1].cmd("state")
                assert f"version={self.version} " in st and "valid=1" in st, st
            g = self.cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
            return g if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED) else None
        g = harness.wait_for(final, timeout=60, what=f"refit {rid} to end", every=0.02)
        assert g.state == pb.COMMITTED, g
        assert sorted(g.skipped) == ["db", "ip"], g
        self.holds(self.version, ["r"])
        inst, model_v = self.shown()
        assert inst["r"] == (self.version, False), inst
        assert inst["db"] == (old, False), inst      # behind, still serving old
        assert inst["ip"][0] <= old and inst["ip"][1], inst  # in place: invalid
        assert model_v < self.version, (model_v, inst)
        self.ctl_shows(old)
        return g

    def ctl_shows(self, old):
        """refitctl model (text and --json) and models show the same."""
        ctl = [f"{BUILD}/bin/refitctl", "--coordinator", self.cl.addr]
        out = subprocess.run(ctl + ["--json", "model", "cm"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out
        js = {i["instance"]: i for i in json.loads(out.stdout)["instances"]}
        assert int(js["db"]["installed_version"]) == old and not js["db"]["invalid"], js
        assert js["ip"]["invalid"] and js["ip"]["install"] == "in-place", js
        assert int(js["r"]["installed_version"]) == self.version, js
        for cmd in (["model", "cm"], ["models"]):
            out = subprocess.run(ctl + cmd, capture_output=True, text=True, timeout=30)
            lines = {ln.split()[1]: ln for ln in out.stdout.splitlines()
                     if ln.startswith("  infer")}
            assert out.returncode == 0 and f"installed v{old} (behind)" in lines["db"] and \
                "INVALID" in lines["ip"] and f"installed v{self.version}" in lines["r"], \
                out.stdout

    def heal(self, order, between=None):
        """SIGCONT the nodes in order, each once the previous one's clients
        registered again (between() runs after the first).  Polls until every
        instance holds the newest version (never shown ahead meanwhile);
        returns the seconds from the first SIGCONT to that."""
        try:
            return self.heal_in(order, between)
        finally:
            self.resume()

    def heal_in(self, order, between):
        old = self.version - 1
        t0 = None
        for k, node in enumerate(order):
            mark = os.path.getsize(self.cl.log.name)
            self.cl.nodes[node].send_signal(signal.SIGCONT)
            t0 = t0 or time.time()
            harness.wait_for(lambda: self.consistent(old)[0] and
                             self.registered_again(node, mark), timeout=60,
                             what=f"cu{node}'s clients to register again")
            if k == 0 and between:
                between()
        self.caught_up(old)
        took = time.time() - t0
        self.holds(self.version)
        return took

    def consistent(self, old):
        """GetModel (read first) shows each instance at old or at the newest
        version, and at the newest only when each of its clients holds it
        (valid).  Returns (True, done: every instance shown at the newest)."""
        v = self.version
        inst, model_v = self.shown()
        for name, (iv, bad) in inst.items():
            assert iv in (old, v), (name, iv, inst)
            if iv == v and not bad:
                for node, c in self.inst[name]:
                    st = c.cmd("state")
                    assert f"version={v} " in st and "valid=1" in st, (name, node, st)
        assert all(model_v <= (0 if bad else iv) for iv, bad in inst.values()), (model_v, inst)
        return True, all(iv == v and not bad for iv, bad in inst.values())

    def caught_up(self, old):
        """Poll until GetModel shows every instance at the newest version,
        never ahead of what the clients hold meanwhile."""
        harness.wait_for(lambda: self.consistent(old)[1], timeout=60,
                         what=f"every instance at v{self.version}", every=0.02)


def log_lines_from(cl, mark, text):
    cl.log.flush()
    with open(f"{TMP}/{cl.name}.log") as f:
        f.seek(mark)
        return [ln for ln in f.read().splitlines() if text in ln]


def partition_setup():
    global PL
    PL = Partition()


def partition_other_node():
    """The node that registered the instances second is cut, then healed."""
    PL.cut([3])
    FIG["catch-up after a partition: non-first node back -> all at newest"] = PL.heal([3])


def partition_first_node():
    PL.cut([2])
    FIG["catch-up after a partition: first node back -> all at newest"] = PL.heal([2])


def partition_both(order):
    def half():
        # one node back, the other still away: the instances stay behind
        inst, _ = PL.shown()
        assert inst["db"][0] == PL.version - 1 and inst["ip"][1], inst
    PL.cut([2, 3])
    return PL.heal(order, between=half)


def partition_both_first_back():
    FIG["catch-up after a partition: both cut, first node back first -> all at newest"] = \
        partition_both([2, 3])


def partition_both_other_back():
    FIG["catch-up after a partition: both cut, other node back first -> all at newest"] = \
        partition_both([3, 2])


def partition_coordinator_restart():
    """The instances are behind (cu3 stopped) when the coordinator restarts
    from its state file: it still shows them behind, and catches them up
    once cu3 is back (every node registers again with the new coordinator)."""
    PL.cut([3])
    old = PL.version - 1
    cl = PL.cl
    cl.coord.kill()
    cl.coord.wait()
    cl.restart_coord()
    inst, model_v = harness.wait_for(lambda: (lambda s: s if len(s[0]) == 3 else None)(
        PL.shown()), what="the model after the restart")
    assert inst["r"] == (PL.version, False) and inst["db"] == (old, False) and \
        inst["ip"][1], inst
    assert model_v < PL.version, (model_v, inst)
    FIG["catch-up after a partition: coordinator restarted, node back -> all at newest"] = \
        PL.heal([3])


def partition_stop():
    stop_cluster(PL.cl, PL.trainers + [c for i in PL.inst.values() for _, c in i])


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
    if harness.TRANSPORT == "nccl":
        check("a node waiting in an NCCL group answers PrepareEpoch, NcclId and Hello "
              "(no polling under the transport's lock)", group_wait_keeps_loop)
    check("coordinator restart without a state file: epochs go on, clients re-registered",
          coordinator_restart_without_state)
    check("atomic switch: a Commit refused on one node publishes the version nowhere",
          atomic_switch)
    check("a Publish lost after every Commit: resent once the node is reachable again, "
          "and by a restarted coordinator (state file): installed, no new refit",
          publish_resent)
    check("an Abort that overtakes RunSlice: the RunSlice is refused at once",
          abort_before_run_slice)
    check("two refits in one epoch: one PrepareEpoch per node", prepare_once_per_epoch)
    check("partition: cluster of 4 nodes, instances spanning cu2 and cu3", partition_setup)
    if PL is not None:
        check("partition: the instances' other node cut mid-refit, retried without them, "
              "back: caught up", partition_other_node)
        check("partition: the instances' first node cut, back: caught up",
              partition_first_node)
        check("partition: both nodes cut, the first back first: caught up once both are",
              partition_both_first_back)
        check("partition: both nodes cut, the other back first: caught up once both are",
              partition_both_other_back)
        check("partition: coordinator restarted while the instances are behind: "
              "still shown behind, caught up once the node is back",
              partition_coordinator_restart)
        check("partition: cluster stopped", partition_stop)
    check("long-lease cluster, model and first refit (every channel READY)",
          long_lease_setup)
    if GL is not None and GM is not None:
        check("abort with a node stopped in RunSlice: ABORTED, its call cancelled, "
              "outstanding back to 0, next refit commits", abort_cancels_calls)
        check("a node killed between refits: its channel shown TRANSIENT_FAILURE, "
              "logged once naming it; restarted, the next refit commits",
              watched_channel_lost)
        check("SIGTERM with watched channels, one failing: the coordinator exits 0 at once",
              watched_shutdown)
    check(f"soak: refits with random node kills for {SOAK:.0f} s", soak)
    check("a peer ending each call without a grpc-status (etcd's TLS listener stopping "
          "mid-call): the coordinator (etcd) and a node (coordinator) log the call failed "
          "and live on; SIGTERM: 0", lambda: survives_no_status(BUILD))
finally:
    harness.stop_all()
    leaked = [p.args[:3] for p in harness.PROCS if p.poll() is None]
    if leaked:
        harness.counts["failed"] += 1
        print(f"FAIL processes left running: {leaked}")
    # killed on purpose: -9; stopped: 0 (or -15 when a client was mid-call);
    # anything else (a sanitizer abort, a crash) fails
    bad = [(p.args[0], p.args[1:3], p.returncode) for p in harness.PROCS
           if p.returncode not in (0, -9, -15)]
    if bad:
        harness.counts["failed"] += 1
        print(f"FAIL processes exited badly (see {TMP}/*.log): {bad}")
    harness.report_emu_leaks()
for k, v in FIG.items():
    print(f"     {k}: {v if isinstance(v, str) else f'{v:.2f} s'}")
harness.summary("faults")
