#!/usr/bin/python3
"""Faults around single calls, end to end (real daemons on loopback,
librefit clients): a coordinator restarted without a state file, a Commit
refused on one node of an instance (atomic switch), a Publish lost after
every Commit (resent), an Abort that overtakes RunSlice, one PrepareEpoch
per node and epoch, a node waiting in an NCCL group (nccl), and on a
cluster whose leases never end a refit: an abort with a node stopped in
RunSlice, a watched channel lost, SIGTERM with a failing channel.

Usage: test_faults_calls.py BUILD_DIR.  The rest of the fault suite:
test_faults.py (shared pieces: faults_common.py).  Prints the measured
figures, and "faults-calls: N passed, N failed" last.
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-fc-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, spawn, wait_running, write  # noqa: E402
harness.init(BUILD, TMP)
import faults_common  # noqa: E402
from faults_common import FIG, LEASE_MS, Model, stop_cluster, tensors  # noqa: E402


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


def log_lines(cl, text):
    cl.log.flush()
    with open(f"{TMP}/{cl.name}.log") as f:
        return [ln for ln in f if text in ln]


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


try:
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
finally:
    faults_common.end()
faults_common.report("faults-calls")
