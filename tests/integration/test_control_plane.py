#!/usr/bin/python3
"""Control-plane integration test: a real coordinator process on loopback,
called from Debian's Python gRPC (stubs generated from proto/ at test time,
which proves the coordinator speaks standard gRPC) and through refitctl.

Usage: test_control_plane.py BUILD_DIR.  One coordinator for most checks
(joins, registrations, bad layouts and strings, operator views, refitctl,
SIGHUP, leases, refits with nodes, TLS); the state file and configuration
checks, each with a coordinator of its own: test_control_plane_state.py.
Prints "control-plane: N passed, N failed" last; exit status 1 when
anything failed.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-cp-")
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (check, expect_error, free_port, infer_instance,  # noqa: E402
                     layout_to_proto, wait_for)

harness.init(BUILD, TMP)
TOKEN = "s3cret-operator-token"
port = free_port()
addr = f"127.0.0.1:{port}"
tokfile = os.path.join(TMP, "token")
with open(tokfile, "w") as f:
    f.write(TOKEN + "\n")
coord = subprocess.Popen([f"{BUILD}/bin/refitd", "--role", "coordinator",
                          "--listen", addr, "--lease-ttl-ms", "1500",
                          "--heartbeat-ms", "300", "--token-file", tokfile,
                          "--max-msg-bytes", "1MiB"],
                         stderr=subprocess.PIPE, text=True)
chan = grpc.insecure_channel(addr)
grpc.channel_ready_future(chan).result(timeout=10)
stub = pbg.CoordinatorStub(chan)
op = [("authorization", f"Bearer {TOKEN}")]
train = json.load(open("config/examples/train-tp2pp2dp2.json"))["tensors"]
infer = json.load(open("config/examples/infer-tp4x2.json"))["tensors"]
ids = {}
# the fake members "train0" and "infer0" are kept alive by heartbeats until a
# test says otherwise (the lease is short: the lease test waits for a lapse)
alive = {"train": True, "infer": True, "stop": False}


def keepalive():
    while not alive["stop"]:
        for k in ("train", "infer"):
            if alive[k] and k in ids:
                try:
                    stub.Heartbeat(pb.HeartbeatRequest(member_id=ids[k]), timeout=5)
                except grpc.RpcError:
                    pass
        time.sleep(0.2)  # pacing of the heartbeats (the lease is 1.5 s)


threading.Thread(target=keepalive, daemon=True).start()


def join_nodes():
    a = stub.Join(pb.JoinRequest(node_id="train0", host="127.0.0.1", ranks=[
        pb.RankInfo(rank=r, domain="train0") for r in range(8)]), timeout=5)
    b = stub.Join(pb.JoinRequest(node_id="infer0", host="127.0.0.1", ranks=[
        pb.RankInfo(rank=r) for r in range(8, 16)]), timeout=5)
    assert b.epoch == a.epoch + 1, (a.epoch, b.epoch)
    assert a.lease_ttl_ms == 1500 and a.heartbeat_ms == 300
    ids["train"], ids["infer"] = a.member_id, b.member_id
    expect_error(lambda: stub.Join(pb.JoinRequest(node_id="thief", ranks=[
        pb.RankInfo(rank=3)]), timeout=5), grpc.StatusCode.ALREADY_EXISTS,
        'rank 3 already belongs to node "train0"')
    expect_error(lambda: stub.Join(pb.JoinRequest(node_id=""), timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT, "node_id is empty")


def register():
    r = stub.RegisterLayout(pb.RegisterLayoutRequest(
        member_id=ids["train"], model="tiny", role=pb.TRAIN,
        tensors=[layout_to_proto(t) for t in train]), timeout=5)
    assert len(r.layout_digest) == 64 and r.tensors == 23
    ids["digest"] = r.layout_digest
    for name, ranks in (("i0", [8, 9, 10, 11]), ("i1", [12, 13, 14, 15])):
        r = stub.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=ids["infer"], model="tiny", role=pb.INFER, instance=name,
            tensors=[infer_instance(t, ranks) for t in infer]), timeout=5)
        assert r.tensors == 23


def bad_layouts():
    bad = layout_to_proto(train[0])
    bad.placements[1] = "Shard(7)"
    expect_error(lambda: stub.RegisterLayout(pb.RegisterLayoutRequest(
        member_id=ids["train"], model="other", role=pb.TRAIN, tensors=[bad]),
        timeout=5), grpc.StatusCode.INVALID_ARGUMENT,
        'placement 1 "Shard(7)" names dim 7 but the tensor has 2 dims')
    wrong = [infer_instance(t, [8, 9, 10, 11]) for t in infer]
    wrong[3].shape[0] += 1
    expect_error(lambda: stub.RegisterLayout(pb.RegisterLayoutRequest(
        member_id=ids["infer"], model="tiny", role=pb.INFER, instance="i2",
        tensors=wrong), timeout=5), grpc.StatusCode.INVALID_ARGUMENT,
        f'tensor "{infer[3]["name"]}": shape differs')
    expect_error(lambda: stub.RegisterLayout(pb.RegisterLayoutRequest(
        member_id=999, model="tiny", role=pb.INFER, tensors=wrong), timeout=5),
        grpc.StatusCode.NOT_FOUND, "member 999 is not a member")
    far = [infer_instance(t, [40, 41, 42, 43]) for t in infer]
    expect_error(lambda: stub.RegisterLayout(pb.RegisterLayoutRequest(
        member_id=ids["infer"], model="tiny", role=pb.INFER, instance="i3",
        tensors=far), timeout=5), grpc.StatusCode.INVALID_ARGUMENT,
        "rank 40 belongs to no member node")


def operator_views():
    expect_error(lambda: stub.ListMembers(pb.ListMembersRequest(), timeout=5),
                 grpc.StatusCode.UNAUTHENTICATED, "needs the operator token")
    expect_error(lambda: stub.ListMembers(pb.ListMembersRequest(), timeout=5,
                                          metadata=[("authorization", "Bearer no")]),
                 grpc.StatusCode.UNAUTHENTICATED, "operator token")
    m = stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=op)
    assert len(m.members) == 2 and m.epoch >= 2
    g = stub.GetModel(pb.GetModelRequest(model="tiny"), timeout=5, metadata=op)
    assert sorted(i.instance for i in g.instances) == ["", "i0", "i1"], g
    e = stub.ExplainPlan(pb.ExplainPlanRequest(model="tiny"), timeout=10, metadata=op)
    assert "reshard speed-up" in e.table and len(e.reshard_digest) == 64
    assert 0 < e.lower_bound_seconds <= e.reshard_seconds < e.broadcast_seconds


def weights_ready():
    r = stub.WeightsReady(pb.WeightsReadyRequest(
        member_id=ids["train"], model="tiny", version=5,
        layout_digest=ids["digest"]), timeout=5)
    assert r.latest_version == 5
    # the same version again (another node of the trainer) is fine; older is not
    r = stub.WeightsReady(pb.WeightsReadyRequest(
        member_id=ids["train"], model="tiny", version=5), timeout=5)
    assert r.latest_version == 5
    expect_error(lambda: stub.WeightsReady(pb.WeightsReadyRequest(
        member_id=ids["train"], model="tiny", version=4), timeout=5),
        grpc.StatusCode.INVALID_ARGUMENT, "version 4 is not newer than 5")
    expect_error(lambda: stub.WeightsReady(pb.WeightsReadyRequest(
        member_id=ids["train"], model="tiny", version=6, layout_digest="ab" * 32),
        timeout=5), grpc.StatusCode.FAILED_PRECONDITION, "register again")


def garbage_and_limits():
    raw = chan.unary_unary("/refit.v1.Coordinator/Join",
                           request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)
    expect_error(lambda: raw(b"\xff\xff\xff\xff\x0f", timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT, "malformed request")
    nope = chan.unary_unary("/refit.v1.Coordinator/Frobnicate",
                            request_serializer=lambda b: b,
                            response_deserializer=lambda b: b)
    expect_error(lambda: nope(b"", timeout=5), grpc.StatusCode.UNIMPLEMENTED,
                 "unknown method /refit.v1.Coordinator/Frobnicate")
    whole = pb.JoinRequest(node_id="truncated", host="h" * 40,
                           ranks=[pb.RankInfo(rank=99, domain="d")]).SerializeToString()
    expect_error(lambda: raw(whole[:len(whole) // 2], timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT, "do not decode as refit.v1.JoinRequest")
    big = pb.JoinRequest(node_id="x" * (2 << 20), ranks=[pb.RankInfo(rank=99)])
    expect_error(lambda: stub.Join(big, timeout=5),
                 grpc.StatusCode.RESOURCE_EXHAUSTED, "")


def bad_strings():
    """Issue 12, item 7: strings are checked where requests are decoded."""
    raw = chan.unary_unary("/refit.v1.Coordinator/Join",
                           request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)

    def field(num, data):  # a length-delimited field, by hand (any bytes)
        n, v = len(data), b""
        while True:
            v += bytes([(n & 0x7f) | (0x80 if n > 0x7f else 0)])
            n >>= 7
            if not n:
                break
        return bytes([num << 3 | 2]) + v + data
    rank = field(8, pb.RankInfo(rank=77).SerializeToString())
    for bad, text in ((b"caf\xe9", "JoinRequest.node_id: not valid UTF-8"),
                      (b"\xed\xa0\x80", "JoinRequest.node_id: not valid UTF-8"),
                      (b"ab\0cd", "JoinRequest.node_id: a string with a NUL byte"),
                      (b"n" * 1025, "JoinRequest.node_id: a string of 1025 bytes")):
        expect_error(lambda: raw(field(1, bad) + rank, timeout=5),
                     grpc.StatusCode.INVALID_ARGUMENT, text)
    # nested: a tensor name inside RegisterLayout, and a repeated string
    lay = layout_to_proto(train[0]).SerializeToString()
    reg = chan.unary_unary("/refit.v1.Coordinator/RegisterLayout",
                           request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)
    body = pb.RegisterLayoutRequest(member_id=ids["train"], model="m",
                                    role=pb.TRAIN).SerializeToString()
    expect_error(lambda: reg(body + field(5, field(1, b"w\xff") + lay), timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT, "TensorLayout.name: not valid UTF-8")
    expect_error(lambda: reg(body + field(5, lay + field(6, b"Shard(0)\0x")), timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT, "TensorLayout.placements: a string with")
    # valid non-ASCII is fine; the views still decode in every client
    m = stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=op)
    assert sorted(x.node_id for x in m.members) == ["infer0", "train0"], m
    stub.ListModels(pb.ListModelsRequest(), timeout=5, metadata=op)


def long_failures_and_json():
    """A failure reason longer than its buffer is cut on a character boundary
    (GetRefit and ListRefits still decode); refitctl --json escapes names."""
    ca = f"127.0.0.1:{free_port()}"
    p = subprocess.Popen([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", ca,
                          "--lease-ttl-ms", "60000"], stderr=subprocess.PIPE, text=True)
    try:
        ch = grpc.insecure_channel(ca)
        grpc.channel_ready_future(ch).result(timeout=10)
        st = pbg.CoordinatorStub(ch)
        nid = "\u00fc" * 400  # 800 bytes: the failure naming it overflows 512
        dead = f"127.0.0.1:{free_port()}"
        j = st.Join(pb.JoinRequest(node_id=nid, host="127.0.0.1", rpc_endpoint=dead,
                                   data_endpoint=dead, ranks=[pb.RankInfo(rank=0),
                                                              pb.RankInfo(rank=1)]),
                    timeout=5)
        model = 'q"uo\\te\u00e9\n'
        one = {"name": "w", "dtype": "fp32", "shape": [4], "mesh": [0],
               "placements": ["Replicate()"]}
        st.RegisterLayout(pb.RegisterLayoutRequest(member_id=j.member_id, model=model,
                                                   role=pb.TRAIN,
                                                   tensors=[layout_to_proto(one)]), timeout=5)
        one["mesh"] = [1]
        st.RegisterLayout(pb.RegisterLayoutRequest(member_id=j.member_id, model=model,
                                                   role=pb.INFER, instance="i\"0",
                                                   tensors=[layout_to_proto(one)]), timeout=5)
        st.WeightsReady(pb.WeightsReadyRequest(member_id=j.member_id, model=model,
                                               version=1), timeout=5)
        rid = st.TriggerRefit(pb.TriggerRefitRequest(model=model), timeout=5).refit_id
        g = wait_for(lambda: (lambda g: g if g.state == pb.FAILED else None)(
            st.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)),
            what="the refit to fail", timeout=60)
        assert g.failure.startswith("node " + nid[:100]), g.failure
        lr = st.ListRefits(pb.ListRefitsRequest(), timeout=5)
        assert lr.refits[0].failure == g.failure
        ctl = [f"{BUILD}/bin/refitctl", "--coordinator", ca, "--json"]
        for args in (["models"], ["model", model], ["list"], ["members"],
                     ["status", str(rid)], ["plan", model]):
            out = subprocess.run(ctl + args, capture_output=True, text=True)
            assert out.returncode == 0, (args, out)
            json.loads(out.stdout)
        d = json.loads(subprocess.run(ctl + ["models"], capture_output=True,
                                      text=True).stdout)
        assert d["models"][0]["name"] == model, d
        assert sorted(i["instance"] for i in d["models"][0]["instances"]) == ["", 'i"0'], d
        d = json.loads(subprocess.run(ctl + ["members"], capture_output=True,
                                      text=True).stdout)
        assert d["members"][0]["node_id"] == nid, d
        assert d["members"][0]["state"] == "member" and d["members"][0]["poisoned"] == "", d
        d = json.loads(subprocess.run(ctl + ["status", str(rid)], capture_output=True,
                                      text=True).stdout)
        assert d["model"] == model and d["failure"] == g.failure, d
        ch.close()
    finally:
        p.kill()
        p.wait()
def refitctl():
    ctl = [f"{BUILD}/bin/refitctl", "--coordinator", addr, "--token-file", tokfile]
    out = subprocess.run(ctl + ["members"], capture_output=True, text=True)
    assert out.returncode == 0 and "train0" in out.stdout and "infer0" in out.stdout, out
    assert "STATE" in out.stdout and " member " in out.stdout, out
    assert "poisoned" not in out.stdout, out
    out = subprocess.run(ctl + ["--json", "models"], capture_output=True, text=True)
    assert out.returncode == 0, out
    models = json.loads(out.stdout)["models"]
    assert models[0]["name"] == "tiny" and models[0]["latest_version"] == 5, models
    out = subprocess.run(ctl + ["plan", "tiny"], capture_output=True, text=True)
    assert out.returncode == 0 and "gather-and-broadcast" in out.stdout, out
    out = subprocess.run(ctl + ["model", "nope"], capture_output=True, text=True)
    assert out.returncode == 1 and 'no model "nope"' in out.stderr, out
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", addr, "members"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "UNAUTHENTICATED" in out.stderr, out
    out = subprocess.run(ctl[:1] + ["--coordinator", f"127.0.0.1:{free_port()}",
                                    "--timeout-ms", "2000", "members"],
                         capture_output=True, text=True)
    assert out.returncode == 3 and "Connection refused" in out.stderr, out


def reload_on_sighup():
    """SIGHUP re-reads the configuration: a new token applies at once."""
    with open(tokfile, "w") as f:
        f.write("rotated-token\n")
    coord.send_signal(signal.SIGHUP)
    new = [("authorization", "Bearer rotated-token")]
    wait_for(lambda: stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=new),
             what="the rotated token to apply")
    stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=new)
    expect_error(lambda: stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=op),
                 grpc.StatusCode.UNAUTHENTICATED, "operator token")
    with open(tokfile, "w") as f:
        f.write(TOKEN + "\n")
    coord.send_signal(signal.SIGHUP)
    wait_for(lambda: stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=op),
             what="the old token to come back after a second reload")


def lease_expiry():
    alive["infer"] = False
    before = stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=op).epoch
    changed = []

    def lapsed():  # keep train0 alive (heartbeats every 0.3 s), let infer0 lapse
        hb = stub.Heartbeat(pb.HeartbeatRequest(member_id=ids["train"], epoch=before),
                            timeout=5)
        changed.append(hb.epoch_changed)
        m = stub.ListMembers(pb.ListMembersRequest(), timeout=5, metadata=op)
        return m if [x.node_id for x in m.members] == ["train0"] else None
    m = wait_for(lapsed, what="infer0's lease to lapse", every=0.3)
    hb = stub.Heartbeat(pb.HeartbeatRequest(member_id=ids["train"], epoch=before),
                        timeout=5)
    assert m.epoch == before + 1 and hb.epoch_changed, (m, changed)
    expect_error(lambda: stub.Heartbeat(pb.HeartbeatRequest(member_id=ids["infer"]),
                                        timeout=5),
                 grpc.StatusCode.NOT_FOUND, "join again")
    alive["train"] = False
    r = stub.Leave(pb.LeaveRequest(member_id=ids["train"]), timeout=5)
    assert r.epoch == before + 2
def nodes_and_refits():
    """Node daemons join by themselves; a triggered refit runs the state
    machine through real Node RPCs and fails, naming the node, because no
    librefit client registered memory there; epochs fence stale Node calls;
    SIGTERM leaves."""
    pc = free_port()
    ca = f"127.0.0.1:{pc}"
    procs = []

    def spawn(args):
        p = subprocess.Popen([f"{BUILD}/bin/refitd"] + args, stderr=subprocess.PIPE,
                             text=True)
        procs.append(p)
        return p

    spawn(["--role", "coordinator", "--listen", ca, "--lease-ttl-ms", "1500",
           "--heartbeat-ms", "300"])
    pa, pb_ = free_port(), free_port()
    node_a = spawn(["--role", "node", "--listen", f"127.0.0.1:{pa}", "--coordinator", ca,
                    "--node-id", "train0", "--ranks", "0-7", "--heartbeat-ms", "300",
                    "--local-socket", f"{TMP}/train0.local"])
    node_b = spawn(["--role", "node", "--listen", f"127.0.0.1:{pb_}", "--coordinator", ca,
                    "--node-id", "infer0", "--ranks", "8-11", "--heartbeat-ms", "300",
                    "--local-socket", f"{TMP}/infer0.local"])
    pc_ = free_port()
    node_c = spawn(["--role", "node", "--listen", f"127.0.0.1:{pc_}", "--coordinator", ca,
                    "--node-id", "infer1", "--ranks", "12-15", "--heartbeat-ms", "300",
                    "--local-socket", f"{TMP}/infer1.local"])
    try:
        ch = grpc.insecure_channel(ca)
        grpc.channel_ready_future(ch).result(timeout=10)
        st = pbg.CoordinatorStub(ch)
        mem = wait_for(lambda: (lambda m: m if len(m.members) == 3 else None)(
            st.ListMembers(pb.ListMembersRequest(), timeout=5)), what="3 members")
        ids = {m.node_id: m.member_id for m in mem.members}
        assert set(ids) == {"train0", "infer0", "infer1"}, mem
        st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=ids["train0"], model="tiny", role=pb.TRAIN,
            tensors=[layout_to_proto(t) for t in train]), timeout=5)
        for name, node, ranks in (("i0", "infer0", [8, 9, 10, 11]),
                                  ("i1", "infer1", [12, 13, 14, 15])):
            st.RegisterLayout(pb.RegisterLayoutRequest(
                member_id=ids[node], model="tiny", role=pb.INFER, instance=name,
                tensors=[infer_instance(t, ranks) for t in infer]), timeout=5)
        expect_error(lambda: st.TriggerRefit(pb.TriggerRefitRequest(model="tiny"),
                                             timeout=5),
                     grpc.StatusCode.NOT_FOUND, "no weights are ready yet")
        st.WeightsReady(pb.WeightsReadyRequest(member_id=ids["train0"], model="tiny",
                                               version=1), timeout=5)
        ctl = [f"{BUILD}/bin/refitctl", "--coordinator", ca]
        out = subprocess.run(ctl + ["trigger", "tiny", "--key", "k1", "--wait"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 4 and "FAILED" in out.stdout, out
        assert "no librefit client registered its memory" in out.stdout, out
        rid = int(out.stdout.split()[1])
        out = subprocess.run(ctl + ["trigger", "tiny", "--key", "k1"], capture_output=True,
                             text=True)
        assert out.returncode == 0 and f"refit {rid} (existing, same key)" in out.stdout, out
        out = subprocess.run(ctl + ["--json", "status", str(rid)], capture_output=True,
                             text=True)
        r = json.loads(out.stdout)
        assert r["state"] == "FAILED" and len(r["plan_digest"]) == 64, r
        assert r["failure"].startswith("node "), r
        out = subprocess.run(ctl + ["list", "tiny"], capture_output=True, text=True)
        assert out.returncode == 0 and str(rid) in out.stdout, out
        out = subprocess.run(ctl + ["abort", str(rid)], capture_output=True, text=True)
        assert out.returncode == 1 and "is already FAILED" in out.stderr, out
        # a second trigger gets a new id and reuses the cached plan
        r2 = st.TriggerRefit(pb.TriggerRefitRequest(model="tiny", mode=pb.RESHARD),
                             timeout=5)
        assert r2.refit_id == rid + 1 and not r2.existing
        # epochs fence the Node service
        nch = grpc.insecure_channel(f"127.0.0.1:{pb_}")
        node = pbg.NodeStub(nch)
        ep = st.ListMembers(pb.ListMembersRequest(), timeout=5).epoch
        node.PrepareEpoch(pb.PrepareEpochRequest(epoch=ep + 5, token=b"t" * 16), timeout=5)
        expect_error(lambda: node.PrepareEpoch(pb.PrepareEpochRequest(epoch=ep), timeout=5),
                     grpc.StatusCode.FAILED_PRECONDITION, "is older than epoch")
        expect_error(lambda: node.RunSlice(pb.RunSliceRequest(refit_id=9, epoch=ep),
                                           timeout=5),
                     grpc.StatusCode.FAILED_PRECONDITION, f"this node prepared epoch {ep + 5}")
        nch.close()
        # drain: the node leaves at its next heartbeat and stays out, alive
        out = subprocess.run(ctl + ["drain", "infer1", "maintenance"], capture_output=True,
                             text=True)
        assert out.returncode == 0 and "node infer1" in out.stdout and "drained" in out.stdout, out
        mem = wait_for(lambda: (lambda m: m if "infer1" not in [x.node_id for x in m.members]
                                else None)(st.ListMembers(pb.ListMembersRequest(), timeout=5)),
                       what="infer1 to leave")
        assert sorted(m.node_id for m in mem.members) == ["infer0", "train0"], mem
        time.sleep(1.0)  # several heartbeat periods: no rejoin
        mem = st.ListMembers(pb.ListMembersRequest(), timeout=5)
        assert sorted(m.node_id for m in mem.members) == ["infer0", "train0"], mem
        assert node_c.poll() is None
        out = subprocess.run(ctl + ["drain", "nope"], capture_output=True, text=True)
        assert out.returncode == 1 and 'no member node "nope"' in out.stderr, out
        ep = mem.epoch
        # SIGTERM: the node leaves at once, long before its lease would lapse
        node_a.send_signal(signal.SIGTERM)
        assert node_a.wait(timeout=10) == 0
        mem = st.ListMembers(pb.ListMembersRequest(), timeout=5)
        assert [m.node_id for m in mem.members] == ["infer0"], mem
        assert mem.epoch == ep + 1, mem
        # an instance going away
        st.UnregisterLayout(pb.UnregisterLayoutRequest(
            member_id=ids["infer1"], model="tiny", role=pb.INFER, instance="i1"), timeout=5)
        g = st.GetModel(pb.GetModelRequest(model="tiny"), timeout=5)
        assert sorted(i.instance for i in g.instances) == ["", "i0"], g
        # SIGKILL: the lease lapses
        node_b.kill()
        node_b.wait()
        node_c.kill()
        node_c.wait()
        mem = wait_for(lambda: (lambda m: m if len(m.members) == 0 else None)(
            st.ListMembers(pb.ListMembersRequest(), timeout=5)), what="both leases to lapse")
        assert mem.epoch == ep + 2, mem
        ch.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        assert procs[0].returncode == 0, procs[0].stderr.read()


def tls_and_mutual_tls():
    """TLS with a test CA, then mutual TLS: a client without a certificate
    is refused, one with a certificate the CA signed gets in."""
    d = os.path.join(TMP, "pki")
    os.makedirs(d, exist_ok=True)

    def sh(*args):
        subprocess.run(args, check=True, capture_output=True, cwd=d)

    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
       "-out", "ca.pem", "-days", "2", "-subj", "/CN=refit-test-ca")
    for who in ("server", "client"):
        with open(os.path.join(d, f"{who}.ext"), "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key",
           "-out", f"{who}.csr", "-subj", f"/CN={who}")
        sh("openssl", "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey",
           "ca.key", "-CAcreateserial", "-out", f"{who}.pem", "-days", "2",
           "-extfile", f"{who}.ext")
    rd = lambda n: open(os.path.join(d, n), "rb").read()  # noqa: E731
    for mutual in (False, True):
        port = free_port()
        args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                f"127.0.0.1:{port}", "--tls-cert", f"{d}/server.pem",
                "--tls-key", f"{d}/server.key"]
        if mutual:
            args += ["--tls-client-ca", f"{d}/ca.pem"]
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        try:
            creds = grpc.ssl_channel_credentials(root_certificates=rd("ca.pem"))
            target = f"localhost:{port}"
            ch = grpc.secure_channel(target, creds)
            if mutual:
                try:
                    grpc.channel_ready_future(ch).result(timeout=3)
                    pbg.CoordinatorStub(ch).ListMembers(pb.ListMembersRequest(), timeout=3)
                    raise AssertionError("mutual TLS let a client without a cert in")
                except (grpc.FutureTimeoutError, grpc.RpcError):
                    pass
                ch.close()
                creds = grpc.ssl_channel_credentials(
                    root_certificates=rd("ca.pem"), private_key=rd("client.key"),
                    certificate_chain=rd("client.pem"))
                ch = grpc.secure_channel(target, creds)
            grpc.channel_ready_future(ch).result(timeout=10)
            m = pbg.CoordinatorStub(ch).ListMembers(pb.ListMembersRequest(), timeout=5)
            assert len(m.members) == 0
            ch.close()
            ctl = [f"{BUILD}/bin/refitctl", "--coordinator", target, "--tls-ca",
                   f"{d}/ca.pem", "--tls-name", "localhost"]
            if mutual:
                ctl += ["--tls-cert", f"{d}/client.pem", "--tls-key", f"{d}/client.key"]
            out = subprocess.run(ctl + ["members"], capture_output=True, text=True,
                                 timeout=30)
            assert out.returncode == 0 and "0 members" in out.stdout, out
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0


def clean_stop():
    coord.send_signal(signal.SIGTERM)
    rc = coord.wait(timeout=10)
    err = coord.stderr.read()
    assert rc == 0, (rc, err)
    assert "stopped" in err, err


try:
    for name, fn in [("join", join_nodes), ("register", register),
                     ("bad layouts", bad_layouts), ("operator views", operator_views),
                     ("weights ready", weights_ready),
                     ("garbage and limits", garbage_and_limits),
                     ("bad strings", bad_strings),
                     ("long failures and json", long_failures_and_json),
                     ("refitctl", refitctl), ("reload on SIGHUP", reload_on_sighup),
                     ("lease expiry", lease_expiry),
                     ("nodes and refits", nodes_and_refits),
                     ("tls and mutual tls", tls_and_mutual_tls),
                     ("clean stop", clean_stop)]:
        check(name, fn)
finally:
    if coord.poll() is None:
        coord.kill()
        coord.wait()
harness.summary("control-plane")
