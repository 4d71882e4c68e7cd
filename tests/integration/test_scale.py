#!/usr/bin/python3
"""The control plane at scale, end to end: one coordinator and NODES node
daemons (one rank each) as real processes on loopback, a librefit client on
every node, and refits where every receiver needs every sender (a tensor
Shard(0) over the trainer ranks -> Shard(1) over the inference ranks).

Usage: test_scale.py BUILD_DIR [NODES] (default 100).  Scenarios, each a
model with its own trainer / inference split of the same cluster, named by
the order the nodes joined (nodes join in groups of 10, each group after the
previous one is a member):
  trainers first   the first half trains, the second half serves
  inference first  the first NODES-6 serve, the last 6 train
  random           30 % of the nodes, picked at random, train
each refit twice (the second must find the plan in the coordinator's cache),
byte-exact; nodes never plan: each receives its slice of the plan (the
transfers its ranks send or receive, fewer than the plan's) and reports 0
planning.  Then, on small clusters: SliceDone is counted once (duplicates
and unknown refits are answered, nothing counted twice), a RunSlice with a
forged slice (ranks not the node's, a box outside its tensor, a rank of no
member, records cut short or out of order) is refused naming the record,
and SIGTERM ends
the coordinator within 10 s while a node is SIGSTOPped holding a call, or
mid-slice.  Prints a table (nodes, order, result, times, coordinator threads
and RSS) and "scale: N passed, N failed" last.
"""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
NODES = int(sys.argv[2]) if len(sys.argv) > 2 else 100
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-sc-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, expect_error, free_port, spawn, write  # noqa: E402
from harness import proc_status  # noqa: E402

harness.init(BUILD, TMP)
ROWS = []


def thread_names(pid):
    """Thread name -> count, from /proc/PID/task/*/comm."""
    names = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                n = f.read().strip()
        except OSError:
            continue
        names[n] = names.get(n, 0) + 1
    return names


class Scale:
    """A coordinator and n node daemons, node k serving rank k, started in
    groups of 10: a group starts once the previous one has joined."""

    def __init__(self, n, name="s"):
        self.n, self.name = n, name
        self.addr = f"127.0.0.1:{free_port()}"
        self.log = open(f"{TMP}/{name}.log", "w")
        self.coord = spawn([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                            self.addr, "--heartbeat-ms", "1000", "--lease-ttl-ms", "20000",
                            "--log-level", "warn"], stderr=self.log)
        self.ch = grpc.insecure_channel(self.addr)
        grpc.channel_ready_future(self.ch).result(timeout=30)
        self.stub = pbg.CoordinatorStub(self.ch)
        self.threads0 = proc_status(self.coord.pid)[0]
        self.nodes = []
        t0 = time.time()
        for g in range(0, n, 10):
            for k in range(g, min(n, g + 10)):
                self.nodes.append(spawn(
                    [f"{BUILD}/bin/refitd", "--role", "node", "--listen",
                     f"unix:{TMP}/{name}{k}.rpc", "--coordinator", self.addr, "--node-id",
                     f"{name}{k:03d}", "--ranks", str(k), "--local-socket", self.sock(k),
                     "--slice-timeout-ms", "120000", "--log-level", "warn"],
                    stderr=self.log))
            self.wait_members(min(n, g + 10))
        self.start_s = time.time() - t0
        mem = self.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
        self.order = [int(m.node_id[len(name):]) for m in mem.members]
        self.member_id = {m.node_id: m.member_id for m in mem.members}

    def sock(self, k):
        return f"{TMP}/{self.name}{k}.local"

    def host(self, k):
        """Node k's host (harness.Client asks; only the nccl emulator uses it)."""
        return f"{self.name}{k}"

    def wait_members(self, n, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            mem = self.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
            if len(mem.members) >= n:
                return
            time.sleep(0.05)
        raise AssertionError(f"{n} nodes did not join within {timeout} s")

    def trigger(self, model, version):
        return self.stub.TriggerRefit(pb.TriggerRefitRequest(model=model, version=version),
                                      timeout=30).refit_id

    def wait_final(self, rid, timeout=600):
        return harness.refit_final(self.stub, rid, timeout, rpc_timeout=30, every=0.05)


def check_slices(g, one_sender=False):
    """Nodes report no planning, and slices of the plan, not the plan: every
    transfer is in its sender's and its receiver's slice (once when both
    ranks are one node's), and no node got them all (but the only sender,
    one_sender: every transfer is its)."""
    assert g.plan_xfers > 0, g
    for x in g.nodes:
        assert x.plan_micros == 0 and not x.plan_cached, x
        assert 0 < x.slice_xfers <= g.plan_xfers, (x, g.plan_xfers)
    whole = [x.node_id for x in g.nodes if x.slice_xfers == g.plan_xfers]
    assert len(whole) == (1 if one_sender else 0), (whole, g.plan_xfers)
    total = sum(x.slice_xfers for x in g.nodes)
    assert g.plan_xfers <= total <= 2 * g.plan_xfers, (total, g.plan_xfers)


def layouts(trainers, infer, shard):
    """Every receiver needs every sender: Shard(0) over trainers, Shard(1) over
    the inference ranks."""
    t, i = len(trainers), len(infer)
    ranks = trainers if shard == 0 else infer
    return [{"name": "w", "dtype": "fp32", "shape": [2 * t, 3 * i], "mesh": ranks,
             "placements": [f"Shard({shard})"]},
            {"name": "v", "dtype": "bf16", "shape": [t, i], "mesh": ranks,
             "placements": [f"Shard({shard})"]}]


def scenario(cl, model, order, trainers):
    """A model trained on `trainers` (node = rank), served by the others."""
    infer = [k for k in cl.order if k not in set(trainers)]
    trainers = [k for k in cl.order if k in set(trainers)]
    tl = write(f"{TMP}/{model}-t.json", layouts(trainers, infer, 0))
    il = write(f"{TMP}/{model}-i.json", layouts(trainers, infer, 1))
    clients = []
    try:
        tr = [Client(cl, k, model, "train", tl) for k in trainers]
        clients += tr
        inf = [Client(cl, k, model, "infer", il, instance="i0", install="double-buffer")
               for k in infer]
        clients += inf
        for c in clients:
            assert c.ok(), c.first
        row = {"nodes": cl.n, "order": order, "split": f"{len(trainers)}/{len(infer)}"}
        for v in (1, 2):
            if v == 2:
                for c in tr:
                    out = c.cmd("next 2")
                    assert out.startswith("READY"), out
            t0 = time.time()
            rid = cl.trigger(model, v)
            g = cl.wait_final(rid)
            assert g.state == pb.COMMITTED, (order, v, g.failure)
            for c in inf:
                out = c.cmd(f"wait {v} 60000")
                assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out
            assert len(g.nodes) == cl.n and all(x.reported for x in g.nodes), g.nodes
            # recorded even when reports overtake RunSlice answers
            assert g.running_after_ms > 0, g
            check_slices(g)
            if v == 1:
                # new layouts: the coordinator plans (nodes never do)
                assert not g.plan_cached and g.plan_micros > 0, g
                row["running_ms"] = g.running_after_ms
                row["e2e_ms"] = g.finished_unix_ms - g.created_unix_ms
                row["plan_ms"] = g.plan_micros / 1e3
                row["decode_ms_max"] = max(x.decode_micros for x in g.nodes) / 1e3
                row["slice_max"] = max(x.slice_xfers for x in g.nodes)
                row["plan_xfers"] = g.plan_xfers
                row["wall_s"] = time.time() - t0
            else:
                # unchanged membership and layouts: the coordinator's cache
                assert g.plan_cached and g.plan_micros == 0, g
                row["e2e2_ms"] = g.finished_unix_ms - g.created_unix_ms
                out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", cl.addr,
                                      "status", str(rid)], capture_output=True, text=True,
                                     timeout=60)
                assert out.returncode == 0, out
                assert f"plan of {g.plan_xfers} transfers: from the coordinator's cache" \
                    in out.stdout, out.stdout
                want = f"slices on the nodes: {cl.n} of {cl.n} reported, at most " \
                    f"{max(x.slice_xfers for x in g.nodes)} transfers"
                assert want in out.stdout, out.stdout
                assert "every slice running" in out.stdout, out.stdout
        row["threads"], row["rss_kib"] = proc_status(cl.coord.pid)
        # one channel out and one connection in per member, not per call
        row["fds"] = len(os.listdir(f"/proc/{cl.coord.pid}/fd"))
        assert row["fds"] < 3 * cl.n + 64, f"coordinator holds {row['fds']} descriptors"
        row["names"] = thread_names(cl.coord.pid)
        ROWS.append(row)
    finally:
        for c in clients:
            c.close()


CL = None
SMALL = {"threads": 0}


def start_cluster():
    global CL
    CL = Scale(NODES)
    print(f"     {NODES} node daemons started and joined in {CL.start_s:.1f} s; "
          f"coordinator threads {CL.threads0} with no members")


def scale_refits(cl):
    rng = random.Random(20261130)
    n = NODES
    order = cl.order
    check(f"{n} nodes, trainers first ({n // 2} / {n - n // 2}), twice, byte-exact",
          lambda: scenario(cl, "first-train", "trainers first", order[:n // 2]))
    check(f"{n} nodes, inference first ({n - 6} / 6 trainers last), twice, byte-exact",
          lambda: scenario(cl, "first-infer", "inference first", order[n - 6:]))
    check(f"{n} nodes, random join order of roles (30 % trainers), twice, byte-exact",
          lambda: scenario(cl, "random", "random", rng.sample(order, max(1, n * 3 // 10))))

    def threads_constant():
        # the coordinator's own threads (named refitd: the loop, libuv's pool,
        # one completion-queue thread for the server and one for calls) are as
        # many as with 3 nodes; gRPC's internal ones (executors, timers) are
        # sized by cores, not members: all together stay far below one per node
        own = [r["names"].get("refitd", 0) for r in ROWS]
        assert own and set(own) == {SMALL["names"].get("refitd")}, (SMALL, own)
        assert max(r["threads"] for r in ROWS) < 40, [r["names"] for r in ROWS]
    check("coordinator threads independent of members and refits", threads_constant)


# ---- small clusters: SliceDone once, SIGTERM with a stopped node ---------------

def small_model(cl, name, ntensors=8):
    """Trainer on node 0 (ranks 0, 1), one instance on nodes 1 and 2."""
    tl = write(f"{TMP}/{name}-t.json", [{"name": f"w{k}", "dtype": "fp32",
                                         "shape": [256, 64], "mesh": [0, 1],
                                         "placements": ["Shard(0)"]}
                                        for k in range(ntensors)])
    il = write(f"{TMP}/{name}-i.json", [{"name": f"w{k}", "dtype": "fp32",
                                         "shape": [256, 64], "mesh": [4, 5, 8, 9],
                                         "placements": ["Shard(1)"]}
                                        for k in range(ntensors)])
    cs = [Client(cl, 0, name, "train", tl)]
    cs += [Client(cl, k, name, "infer", il, instance="i0", install="double-buffer")
           for k in (1, 2)]
    for c in cs:
        assert c.ok(), c.first
    return cs


def committed_v2(g, cs):
    """g committed and every inference client (cs[1:]) installed version 2 byte-exact."""
    assert g.state == pb.COMMITTED, g.failure
    for c in cs[1:]:
        out = c.cmd("wait 2 20000")
        assert out.startswith("INSTALLED 2 ") and "mismatches=0" in out, out


def slice_rec(stage, frm, to, tensor, box):
    """One record of RunSliceRequest.slice_xfers (proto/refit/v1/refit.proto)."""
    b = struct.pack("<IiiI", stage, frm, to, tensor)
    for off, size in box:
        b += struct.pack("<qq", off, size)
    return b


def forged_slices():
    """A RunSlice whose slice is forged is refused at the node's edge, the
    error naming the record; nothing of it runs, and the next refit works."""
    cl = Cluster("fs", 3, lease_ms=20000)
    cs = small_model(cl, "fm", ntensors=1)
    try:
        g = cl.refit("fm", 1)
        assert g.state == pb.COMMITTED, g.failure
        check_slices(g, one_sender=True)
        tl = json.load(open(f"{TMP}/fm-t.json"))["tensors"][0]
        il = json.load(open(f"{TMP}/fm-i.json"))["tensors"][0]

        def lay(t):
            return pb.TensorLayout(name=t["name"], dtype=t["dtype"], shape=t["shape"],
                                   mesh_shape=[len(t["mesh"])], mesh_ranks=t["mesh"],
                                   placements=t["placements"])
        # node 1 serves ranks 4..7 and holds inference ranks 4 and 5
        node = pbg.NodeStub(grpc.insecure_channel(cl.node_args[1][4]))
        good = slice_rec(0, 0, 4, 0, [(0, 128), (0, 16)])
        cases = [
            ([slice_rec(0, 0, 1, 0, [(0, 128), (0, 16)])], {},
             'slice record 0 (stage 0, rank 0 -> 1, tensor "w0"): neither rank is this '
             "node's"),
            ([good, slice_rec(0, 0, 4, 0, [(250, 10), (0, 16)])], {},
             'slice record 1 (stage 0, rank 0 -> 4, tensor "w0"): dim 0 of its box '
             "(offset 250, size 10) is not inside the tensor (256)"),
            ([slice_rec(0, 0, 77, 0, [(0, 128), (0, 16)])], {},
             "slice record 0 (stage 0, rank 0 -> 77, tensor \"w0\"): rank 77 is no member's"),
            ([slice_rec(0, 0, 5, 0, [(0, 8), (0, 16)]), good], {},
             "slice record 1 (stage 0, rank 0 -> 4, tensor \"w0\"): out of plan order"),
            ([slice_rec(3, 0, 4, 0, [(0, 8), (0, 16)])], {},
             "slice record 0 (stage 3, rank 0 -> 4, tensor \"w0\"): the plan has 1 stages"),
            ([slice_rec(0, 0, 4, 2, [(0, 8), (0, 16)])], {},
             "slice record 0 (stage 0, rank 0 -> 4): tensor 2, the plan has 1"),
            ([good[:-4]], {}, "slice record 0 of 1: its box is cut short"),
            ([good], {"slice_nxfers": 9}, "the slice claims 9 transfers in 48 bytes"),
            ([good], {"plan_tensors": 0}, "RunSlice carries no slice of the plan"),
        ]
        for k, (recs, over, want) in enumerate(cases):
            fields = dict(refit_id=900 + k, epoch=g.epoch, attempt=1, model="fm", version=1,
                          mode=pb.RESHARD, chunk_bytes=4 << 20, staging_bytes=256 << 20,
                          instances=[pb.InstanceLayouts(role=pb.TRAIN, tensors=[lay(tl)]),
                                     pb.InstanceLayouts(instance="i0", role=pb.INFER,
                                                        tensors=[lay(il)])],
                          slice_xfers=b"".join(recs), slice_nxfers=len(recs),
                          plan_stages=1, plan_stages_per_round=1, plan_tensors=1,
                          plan_xfers=100, plan_digest="f" * 64)
            fields.update(over)
            expect_error(lambda: node.RunSlice(pb.RunSliceRequest(**fields), timeout=10),
                         grpc.StatusCode.INVALID_ARGUMENT, want)
        # nothing of them ran or stuck: the next refit commits, byte-exact
        out = cs[0].cmd("next 2")
        assert out.startswith("READY"), out
        committed_v2(cl.refit("fm", 2), cs)
    finally:
        for c in cs:
            c.close()
    print(f"     forged slices: {len(cases)} kinds refused, each naming its record")


def wait_state(cl, rid, state, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        g = cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
        if g.state == state:
            return g
        time.sleep(0.005)
    raise AssertionError(f"refit {rid} never reached {state}: {g}")


def slice_done_once():
    cl = Cluster("d", 3, ["--test-msg-delay-ms", "100"], lease_ms=20000)
    cs = small_model(cl, "dm")
    try:
        mem = {m.node_id: m.member_id for m in
               cl.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members}
        g = cl.refit("dm", 1)
        assert g.state == pb.COMMITTED, g.failure
        SMALL["threads"] = proc_status(cl.coord.pid)[0]
        SMALL["names"] = thread_names(cl.coord.pid)
        rep = pb.SliceDoneRequest(refit_id=g.id, epoch=g.epoch, attempt=1, node_id="d1",
                                  member_id=mem["d1"])
        # a report for a refit that already committed is answered, not counted
        assert not cl.stub.SliceDone(rep, timeout=5).counted
        expect_error(lambda: cl.stub.SliceDone(pb.SliceDoneRequest(refit_id=99999),
                                               timeout=5),
                     grpc.StatusCode.NOT_FOUND, "no refit 99999")
        out = cs[0].cmd("next 2")
        assert out.startswith("READY"), out
        rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="dm", version=2),
                                   timeout=5).refit_id
        g = wait_state(cl, rid, pb.RUNNING)
        bad = pb.SliceDoneRequest(refit_id=rid, epoch=g.epoch, attempt=g.attempt,
                                  node_id="d2", member_id=mem["d2"], code=13,
                                  message="injected failure")
        expect_error(lambda: cl.stub.SliceDone(pb.SliceDoneRequest(
            refit_id=rid, epoch=g.epoch, attempt=g.attempt, node_id="d1",
            member_id=mem["d2"]), timeout=5), grpc.StatusCode.INVALID_ARGUMENT, "is node")
        assert cl.stub.SliceDone(bad, timeout=5).counted
        assert not cl.stub.SliceDone(bad, timeout=5).counted  # a duplicate
        g = cl.wait_final(rid)
        assert g.state == pb.FAILED and "injected failure" in g.failure, g
        # the real report of d2 came too and changed nothing; the next refit works
        rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="dm", version=2),
                                   timeout=5).refit_id
        committed_v2(cl.wait_final(rid), cs)
    finally:
        for c in cs:
            c.close()


def sigterm_with_stopped_node(when):
    """SIGSTOP node 2 (before the trigger: the coordinator's PrepareEpoch to
    it stays unanswered; or mid-slice), SIGTERM the coordinator: it exits
    within 10 s."""
    cl = Cluster(f"t{when}", 3, ["--test-msg-delay-ms", "100"], lease_ms=60000)
    cs = small_model(cl, "tm")
    victim = cl.nodes[2]
    try:
        if when == "prepare":
            victim.send_signal(signal.SIGSTOP)
            rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="tm"),
                                       timeout=5).refit_id
            wait_state(cl, rid, pb.PREPARING)
            # the PrepareEpoch call to the stopped node is out and unanswered
            harness.wait_for(lambda: cl.stub.ListMembers(
                pb.ListMembersRequest(), timeout=5).node_calls_outstanding >= 1,
                what="a node call outstanding")
        else:
            rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="tm"),
                                       timeout=5).refit_id
            wait_state(cl, rid, pb.RUNNING)
            victim.send_signal(signal.SIGSTOP)
        t0 = time.time()
        cl.coord.send_signal(signal.SIGTERM)
        while cl.coord.poll() is None and time.time() - t0 < 10:
            time.sleep(0.02)
        took = time.time() - t0
        assert cl.coord.poll() is not None, f"coordinator still running {took:.1f} s " \
            "after SIGTERM"
        assert cl.coord.returncode == 0, cl.coord.returncode
        print(f"     SIGTERM with a node stopped ({when}): coordinator exited in "
              f"{took:.2f} s")
    finally:
        victim.send_signal(signal.SIGCONT)
        for c in cs:
            c.close()


try:
    check("SliceDone is counted once; duplicates and unknown refits are answered",
          slice_done_once)
    check(f"{NODES} node daemons (one rank each) start and join", start_cluster)
    if CL is not None:
        scale_refits(CL)
    check("a RunSlice with a forged slice is refused, naming the record", forged_slices)
    check("SIGTERM: coordinator exits within 10 s, a node stopped holding PrepareEpoch",
          lambda: sigterm_with_stopped_node("prepare"))
    check("SIGTERM: coordinator exits within 10 s, a node stopped mid-slice",
          lambda: sigterm_with_stopped_node("running"))
finally:
    harness.stop_all()
    bad = [(p.args[0], p.args[1:3], p.returncode) for p in harness.PROCS
           if p.returncode not in (0, -15)]
    if bad:
        harness.counts["failed"] += 1
        print(f"FAIL processes exited badly (see {TMP}/*.log): {bad[:5]}")
if ROWS:
    print(f"     {'nodes':>5} {'order':<16} {'split':>7} {'running_ms':>10} {'e2e_ms':>7} "
          f"{'again_ms':>8} {'plan_ms':>7} {'xfers':>6} {'slice':>6} {'decode_ms':>9} "
          f"{'threads':>7} {'rss_MiB':>7} {'fds':>5}")
    print(f"     coordinator threads by name, 3 nodes: {SMALL.get('names')}; "
          f"{NODES} nodes: {ROWS[-1]['names']}")
    for r in ROWS:
        print(f"     {r['nodes']:>5} {r['order']:<16} {r['split']:>7} {r['running_ms']:>10} "
              f"{r['e2e_ms']:>7} {r['e2e2_ms']:>8} {r['plan_ms']:>7.1f} "
              f"{r['plan_xfers']:>6} {r['slice_max']:>6} {r['decode_ms_max']:>9.2f} "
              f"{r['threads']:>7} {r['rss_kib'] / 1024:>7.1f} {r['fds']:>5}")
harness.summary("scale")
