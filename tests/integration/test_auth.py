#!/usr/bin/python3
"""Who may call what (docs/control-plane.md, "Who may call what"): a
coordinator and two node daemons on loopback sharing a cluster join token,
a trainer on node 0 and an inference instance on node 1, one refit.

 - a rogue process without the token (and with a wrong one) calls Join,
   Heartbeat, Leave, RegisterLayout, UnregisterLayout, WeightsReady, GetInstalled and
   SliceDone on the coordinator and PrepareEpoch, RunSlice and Publish on a
   node: every call is refused UNAUTHENTICATED;
 - a rogue holding the token calls them for another node (its member id,
   node id, ranks, instance, trainer; the Node service with a session of its
   own): every call is refused PERMISSION_DENIED naming what it tried; and
   a rogue that joined with the token under a name of its own may act for
   itself (heartbeat, leave) but not for the others' instances and trainer;
 - nothing changed: the same members and epoch, registrations, versions
   and refits; the next refit commits and the instance holds the new
   weights byte-exact; the refusals are counted in
   refitd_auth_refused_total and logged once per process and host, not once
   per call;
 - data-plane tokens are per member: a process with the join token that
   takes part in a refit (a replica on a rank of its own) gets its own
   token and the others' hashes; a data connection naming another node with
   it is refused;
 - the join token rotates with SIGHUP, no restart: the old token is refused,
   the members stay, a refit commits;
 - a join token added to a running cluster by SIGHUP is checked from then
   on, the node's Node service bound to its session;
 - refitctl init DIR makes both tokens (mode 0600, never overwritten); the
   operator token opens no node method and the join token no operator
   method (UnregisterLayout, refitctl unregister, takes either); the same
   token in both files is refused at start;
 - a daemon listening beyond loopback without a token refuses to start;
   with "insecure": true it starts and warns;
 - the local sockets are 0660 in local_socket_group; a client id is
   random, so a process cannot act on another's registration by counting;
 - a client acts on its own registrations only: another process (uid
   nobody, in the socket's group) presenting a stolen client id to every
   Local method that names one is refused PERMISSION_DENIED naming the
   client, and one registering with another process's pid, or with the
   key and segments another process passed over the memory socket, is
   refused (counted in the node's refitd_auth_refused_total); nothing
   changed (the clients, their state, the model's registrations).

Usage: test_auth.py BUILD_DIR.  Ends with "auth: N passed, N failed".
"""
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent import futures

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-auth-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import RPN, Cluster, check, expect_error, free_port, start_model, wait_for  # noqa: E402

harness.init(BUILD, TMP)
MPORT = free_port()
NMPORT = free_port()  # node au1's /metrics
JOIN = f"{TMP}/join.token"
CL = None
MODEL = {}
UN = grpc.StatusCode.UNAUTHENTICATED
PD = grpc.StatusCode.PERMISSION_DENIED


def write_token(text):
    fd = os.open(JOIN + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (text + "\n").encode())
    os.close(fd)
    os.rename(JOIN + ".new", JOIN)


def md(token, session=None):
    out = [("refit-join-token", token)] if token is not None else []
    if session is not None:
        out.append(("refit-session", session))
    return out


def layout_to_proto(t):
    """A one-dimensional DTensor layout (JSON form) as a TensorLayout."""
    return pb.TensorLayout(name=t["name"], dtype=t["dtype"], shape=t["shape"],
                           mesh_shape=[len(t["mesh"])], mesh_ranks=t["mesh"],
                           placements=t["placements"])


def snapshot():
    """Everything a rogue must not change: members, epoch, registrations,
    versions, refits."""
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
    g = CL.stub.GetModel(pb.GetModelRequest(model="lm"), timeout=10)
    refits = CL.stub.ListRefits(pb.ListRefitsRequest(), timeout=10)
    return {
        "members": sorted((m.node_id, m.member_id, m.rpc_endpoint, m.data_endpoint,
                           tuple(r.rank for r in m.ranks)) for m in mem.members),
        "epoch": mem.epoch,
        "instances": sorted((i.instance, i.role, i.layout_digest, i.installed_version)
                            for i in g.instances),
        "latest": g.latest_version,
        "refits": sorted((r.id, r.state) for r in refits.refits),
    }


def member(node):
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
    return next(m for m in mem.members if m.node_id == node)


def refused_total(reason=None):
    s = harness.scrape_metrics(MPORT)
    return sum(v for (name, labels), v in s.items()
               if name == "refitd_auth_refused_total" and
               (reason is None or dict(labels).get("reason") == reason))


def setup():
    global CL
    write_token("join-" + os.urandom(16).hex())
    CL = Cluster("au", 2, ["--join-token-file", JOIN],
                 coord_extra=["--join-token-file", JOIN, "--metrics-listen",
                              f"127.0.0.1:{MPORT}"],
                 node_extra=lambda k: ["--metrics-listen", f"127.0.0.1:{NMPORT}"] if k == 1
                 else [])
    train, insts = harness.reshard_layouts(RPN)
    MODEL["clients"] = start_model(CL, "lm", train, insts, random.Random(5),
                                   installs={"i0": "double-buffer"})
    harness.step_and_refit(CL, MODEL, 1)


def coordinator_calls(st, meta, a0, a1, rid):
    """Every member method of the coordinator, each acting for node au0 or
    au1 (their member ids a0, a1): (name, call) pairs."""
    one = {"name": "w0", "dtype": "fp32", "shape": [64, 32], "mesh": list(range(RPN, 2 * RPN)),
           "placements": ["Shard(0)"]}
    ranks = [pb.RankInfo(rank=r) for r in range(RPN)]
    return [
        ("Join as au0", lambda: st.Join(pb.JoinRequest(
            node_id="au0", host="127.0.0.1", rpc_endpoint="127.0.0.1:1",
            data_endpoint="127.0.0.1:2", ranks=ranks), timeout=5, metadata=meta)),
        ("Heartbeat", lambda: st.Heartbeat(pb.HeartbeatRequest(member_id=a0), timeout=5,
                                           metadata=meta)),
        ("Leave", lambda: st.Leave(pb.LeaveRequest(member_id=a1), timeout=5,
                                   metadata=meta)),
        ("RegisterLayout", lambda: st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=a1, model="lm", role=pb.INFER, instance="thief",
            tensors=[layout_to_proto(one)]), timeout=5, metadata=meta)),
        ("UnregisterLayout", lambda: st.UnregisterLayout(pb.UnregisterLayoutRequest(
            member_id=a1, model="lm", role=pb.INFER, instance="i0"), timeout=5,
            metadata=meta)),
        ("WeightsReady", lambda: st.WeightsReady(pb.WeightsReadyRequest(
            member_id=a0, model="lm", version=99), timeout=5, metadata=meta)),
        ("GetInstalled", lambda: st.GetInstalled(pb.GetInstalledRequest(
            member_id=a0, model="lm"), timeout=5, metadata=meta)),
        ("SliceDone", lambda: st.SliceDone(pb.SliceDoneRequest(
            refit_id=rid, member_id=a0, node_id="au0", code=13, message="forged"),
            timeout=5, metadata=meta)),
    ]


def node_calls(node_ep, meta, epoch):
    nst = pbg.NodeStub(grpc.insecure_channel(node_ep))
    return [
        ("PrepareEpoch", lambda: nst.PrepareEpoch(pb.PrepareEpochRequest(
            epoch=epoch + 1, token=b"x" * 16), timeout=5, metadata=meta)),
        ("RunSlice", lambda: nst.RunSlice(pb.RunSliceRequest(epoch=epoch, refit_id=1),
                                          timeout=5, metadata=meta)),
        ("Publish", lambda: nst.Publish(pb.PublishRequest(refit_id=1, epoch=epoch),
                                        timeout=5, metadata=meta)),
    ]


def rogues_refused():
    before = snapshot()
    m0, m1 = member("au0"), member("au1")
    rid = before["refits"][-1][0]
    ch = grpc.insecure_channel(CL.addr)
    st = pbg.CoordinatorStub(ch)
    n0 = refused_total()
    with open(JOIN) as f:
        token = f.read().strip()
    own = os.urandom(32).hex()   # a session of the rogue's own
    cases = [(None, UN, "needs the cluster join token"),
             ("wrong-" + token, UN, "the one sent is not it")]
    for tok, code, text in cases:
        meta = md(tok, own)
        for name, call in coordinator_calls(st, meta, m0.member_id, m1.member_id, rid) + \
                node_calls(m1.rpc_endpoint, meta, before["epoch"]):
            try:
                expect_error(call, code, text)
            except AssertionError as e:
                raise AssertionError(f"{name} with token {tok!r}: {e}") from None
    # the token, another node's identity: PERMISSION_DENIED naming it
    meta = md(token, own)
    want = {"Join as au0": 'node "au0" is live member',
            "Heartbeat": f'member {m0.member_id} is node "au0"',
            "Leave": f'member {m1.member_id} is node "au1"',
            "RegisterLayout": f'member {m1.member_id} is node "au1"',
            "UnregisterLayout": f'member {m1.member_id} is node "au1"',
            "WeightsReady": f'member {m0.member_id} is node "au0"',
            "GetInstalled": f'member {m0.member_id} is node "au0"',
            "SliceDone": f'member {m0.member_id} is node "au0"'}
    for name, call in coordinator_calls(st, meta, m0.member_id, m1.member_id, rid):
        try:
            expect_error(call, PD, want[name])
        except AssertionError as e:
            raise AssertionError(f"{name} as another member: {e}") from None
    for name, call in node_calls(m1.rpc_endpoint, meta, before["epoch"]):
        try:
            expect_error(call, PD, "only the coordinator this node joined may call it")
        except AssertionError as e:
            raise AssertionError(f"Node.{name} with another session: {e}") from None
    # another node's ranks under a name of its own
    expect_error(lambda: st.Join(pb.JoinRequest(
        node_id="rogue", host="127.0.0.1", rpc_endpoint="127.0.0.1:1",
        data_endpoint="127.0.0.1:2", ranks=[pb.RankInfo(rank=0)]), timeout=5, metadata=meta),
        PD, 'rank 0 already belongs to node "au0"')
    # another node's endpoints under a name and ranks of its own: the
    # coordinator would call it, with the node's session, as that node
    for rpc_ep, data_ep in ((m1.rpc_endpoint, "127.0.0.1:2"), ("127.0.0.1:1", m1.data_endpoint)):
        expect_error(lambda: st.Join(pb.JoinRequest(
            node_id="rogue", host="127.0.0.1", rpc_endpoint=rpc_ep, data_endpoint=data_ep,
            ranks=[pb.RankInfo(rank=1000)]), timeout=5, metadata=meta),
            PD, f'is live member {m1.member_id}\'s (node "au1")')
    after = snapshot()
    assert after == before, ("a refused call changed something", before, after)
    n = refused_total() - n0
    assert n >= 2 * 7 + 7 + 3, f"refitd_auth_refused_total grew by {n} (coordinator only)"
    assert refused_total("identity") >= 7 and refused_total("missing") >= 7 and \
        refused_total("wrong") >= 7, harness.scrape_metrics(MPORT)
    ch.close()


def member_of_its_own():
    """A rogue with the token joins under its own name and ranks: it may act
    for itself, not for what the others registered."""
    with open(JOIN) as f:
        token = f.read().strip()
    own = os.urandom(32).hex()
    meta = md(token, own)
    st = pbg.CoordinatorStub(grpc.insecure_channel(CL.addr))
    j = st.Join(pb.JoinRequest(node_id="rogue", host="127.0.0.1", rpc_endpoint="127.0.0.1:1",
                               data_endpoint="127.0.0.1:2", ranks=[pb.RankInfo(rank=1000)]),
                timeout=5, metadata=meta)
    # its heartbeat names an engine of an instance it does not hold: not taken
    st.Heartbeat(pb.HeartbeatRequest(member_id=j.member_id, engines=[pb.InstanceEngine(
        model="lm", instance="i0", served_version=77, engine=pb.EngineInfo(
            framework="forged"))]), timeout=5, metadata=meta)
    i0 = [i for i in CL.stub.GetModel(pb.GetModelRequest(model="lm"), timeout=5).instances
          if i.instance == "i0"][0]
    assert i0.served_version != 77 and i0.engine.framework != "forged", i0
    expect_error(lambda: st.GetInstalled(pb.GetInstalledRequest(
        member_id=j.member_id, model="lm"), timeout=5, metadata=meta),
        PD, 'trainer "" was not registered by member')
    # without its session, its own member id is not enough
    expect_error(lambda: st.Heartbeat(pb.HeartbeatRequest(member_id=j.member_id), timeout=5,
                                      metadata=md(token)), PD, "is missing")
    expect_error(lambda: st.UnregisterLayout(pb.UnregisterLayoutRequest(
        member_id=j.member_id, model="lm", role=pb.INFER, instance="i0"), timeout=5,
        metadata=meta), PD, 'instance "i0" was not registered by member')
    expect_error(lambda: st.WeightsReady(pb.WeightsReadyRequest(
        member_id=j.member_id, model="lm", version=99), timeout=5, metadata=meta),
        PD, 'trainer "" was not registered by member')
    one = {"name": "w0", "dtype": "fp32", "shape": [64, 32],
           "mesh": list(range(RPN, 2 * RPN)), "placements": ["Shard(0)"]}
    expect_error(lambda: st.RegisterLayout(pb.RegisterLayoutRequest(
        member_id=j.member_id, model="lm", role=pb.INFER, instance="thief",
        tensors=[layout_to_proto(one)]), timeout=5, metadata=meta),
        PD, "none of its ranks is member")
    st.Leave(pb.LeaveRequest(member_id=j.member_id), timeout=5, metadata=meta)
    assert sorted(m.node_id for m in
                  CL.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members) == \
        ["au0", "au1"]
    g = CL.stub.GetModel(pb.GetModelRequest(model="lm"), timeout=5)
    assert sorted(i.instance for i in g.instances) == ["", "i0"], g


def data_handshake(ep, epoch, token, node, source=None):
    """One tcp data-plane handshake to ep (magic, token length, epoch, refit
    id, attempt, 64 token bytes, 128 node id bytes), from the address source (None:
    the kernel's choice): the node's one-byte answer."""
    host, port = ep.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5,
                                  source_address=(source, 0) if source else None) as s:
        s.sendall((0x32544652).to_bytes(4, "little") + len(token).to_bytes(4, "little") +
                  epoch.to_bytes(8, "little") + (1).to_bytes(8, "little") +
                  (0).to_bytes(4, "little") +
                  token.ljust(64, b"\0") + node.encode().ljust(128, b"\0"))
        return s.recv(1)


class FakeNode(pbg.NodeServicer):
    """A process holding the join token that serves the Node service itself:
    it keeps what PrepareEpoch gives it and runs nothing."""

    def __init__(self):
        self.prepared = []

    def PrepareEpoch(self, request, context):
        self.prepared.append(request)
        return pb.PrepareEpochResponse(epoch=request.epoch)

    def RunSlice(self, request, context):
        context.abort(grpc.StatusCode.INTERNAL, "a fake node runs nothing")

    def Abort(self, request, context):
        return pb.AbortResponse()


def data_token_per_member():
    """A token holder that joins, registers a replica on its own rank and so
    takes part in a refit gets its own data-plane token only: with it a data
    connection naming another node is refused; naming itself, taken."""
    token = open(JOIN).read().strip()
    meta = md(token, os.urandom(32).hex())
    fake = FakeNode()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_NodeServicer_to_server(fake, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    st = pbg.CoordinatorStub(grpc.insecure_channel(CL.addr))
    try:
        j = st.Join(pb.JoinRequest(node_id="fake", host="127.0.0.1",
                                   rpc_endpoint=f"127.0.0.1:{port}",
                                   data_endpoint=f"127.0.0.1:{free_port()}",
                                   ranks=[pb.RankInfo(rank=1000)]), timeout=5, metadata=meta)
        st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=j.member_id, model="lm", role=pb.INFER, instance="fake",
            tensors=[layout_to_proto({"name": f"w{k}", "dtype": "fp32", "shape": [64, 32],
                                      "mesh": [1000], "placements": ["Replicate()"]})
                     for k in range(3)]), timeout=5, metadata=meta)
        v = MODEL["version"] + 1
        assert MODEL["clients"]["train"][0].cmd(f"next {v}").startswith("READY")
        rid = CL.stub.TriggerRefit(pb.TriggerRefitRequest(model="lm", version=v),
                                   timeout=10).refit_id
        wait_for(lambda: fake.prepared, 30, "PrepareEpoch at the fake node")
        g = CL.wait_final(rid, 60)
        assert g.state in (pb.FAILED, pb.ABORTED), g
        prep = fake.prepared[-1]
        mine = {m.node_id: m for m in prep.members}
        assert hashlib.sha256(prep.token).digest() == mine["fake"].data_verifier
        assert mine["au0"].data_verifier != mine["fake"].data_verifier
        ep = mine["au1"].data_endpoint
        assert data_handshake(ep, prep.epoch, prep.token, "au0") == b"\x02"
        assert data_handshake(ep, prep.epoch, prep.token, "nobody") == b"\x02"
        assert data_handshake(ep, prep.epoch, prep.token, "fake") == b"\x00"
        # its own token, from another address than the data endpoint it
        # registered (127.0.0.1): refused (5), the node logs both addresses
        assert data_handshake(ep, prep.epoch, prep.token, "fake", "127.0.0.2") == b"\x05"
        wait_for(lambda: any("comes from 127.0.0.2, but the node's data endpoint is at "
                             "127.0.0.1" in ln for ln in open(f"{TMP}/{CL.name}.log")),
                 10, "a node's log naming both addresses")
        # a flood of bad data handshakes: each counted, logged once a minute per host
        for _ in range(20):
            assert data_handshake(ep, prep.epoch, b"x" * 32, "au0", "127.0.0.3") == b"\x02"

        def counted():
            s = harness.scrape_metrics(NMPORT)
            return {dict(lb).get("reason"): v for (name, lb), v in s.items()
                    if name == "refitd_auth_refused_total" and
                    dict(lb).get("method") == "tcp data connection"}
        wait_for(lambda: counted().get("token", 0) >= 20 + 2 and
                 counted().get("source", 0) >= 1, 10, "the refusals counted")
        lines = [ln for ln in open(f"{TMP}/{CL.name}.log")
                 if "refused a data connection from 127.0.0.3" in ln]
        assert len(lines) == 1, lines
        # away again: its replica, then itself; the refit of v commits
        st.UnregisterLayout(pb.UnregisterLayoutRequest(
            member_id=j.member_id, model="lm", role=pb.INFER, instance="fake"),
            timeout=5, metadata=meta)
        st.Leave(pb.LeaveRequest(member_id=j.member_id), timeout=5, metadata=meta)
    finally:
        srv.stop(0)
    wait_for(lambda: all(r.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED) for r in
                         CL.stub.ListRefits(pb.ListRefitsRequest(), timeout=5).refits),
             60, "no refit in flight")
    g = CL.refit("lm", v, timeout=120)
    assert g.state == pb.COMMITTED, g.failure
    harness.expect_installed(MODEL["clients"], v)
    MODEL["version"] = v


def refit_after():
    harness.step_and_refit(CL, MODEL, MODEL["version"] + 1)
    CL.log.flush()
    with open(f"{TMP}/{CL.name}.log") as f:
        lines = [ln for ln in f if "rpc: refused a call from" in ln]
    # dozens refused, each process logs its first one from this host only
    assert 1 <= len(lines) <= 3, lines


def rotate():
    """SIGHUP with a new token in the file: old refused, members stay."""
    before = snapshot()
    old = open(JOIN).read().strip()
    write_token("join-" + os.urandom(16).hex())
    for p in [CL.coord] + CL.nodes:
        p.send_signal(signal.SIGHUP)
    st = pbg.CoordinatorStub(grpc.insecure_channel(CL.addr))

    def old_refused():
        # member 0 is nobody's: NOT_FOUND while the old token is good
        try:
            st.Heartbeat(pb.HeartbeatRequest(member_id=0), timeout=5, metadata=md(old, "x"))
        except grpc.RpcError as e:
            return e.code() == UN and "the one sent is not it" in e.details()
        return False
    wait_for(old_refused, 20, "the coordinator to refuse the old token")
    # heartbeats with the new token answered: the members stay, no restart
    ok0 = beats()
    wait_for(lambda: beats() >= ok0 + 6, 20, "heartbeats under the new token")
    after = snapshot()
    assert after["members"] == before["members"], (before, after)
    harness.step_and_refit(CL, MODEL, MODEL["version"] + 1)


def beats():
    s = harness.scrape_metrics(MPORT)
    return s.get(("refitd_rpc_duration_seconds_count",
                  frozenset({"method": "Heartbeat", "code": "OK"}.items())), 0)


def token_added_by_reload():
    """A loopback cluster without a token gets one by SIGHUP: the
    coordinator and the node's Node service check it from then on, and the
    node binds its Node service to its session (the member stays)."""
    cfg, tok = f"{TMP}/ad.json", f"{TMP}/ad.token"
    with open(cfg, "w") as f:
        f.write("{}\n")
    cl = Cluster("ad", 1, ["--config", cfg], coord_extra=["--config", cfg])
    m = cl.wait_members(1).members[0]
    with open(tok, "w") as f:
        f.write("join-" + os.urandom(16).hex() + "\n")
    with open(cfg, "w") as f:
        f.write('{"join_token_file": "%s"}\n' % tok)
    for p in (cl.coord, cl.nodes[0]):
        p.send_signal(signal.SIGHUP)
    nst = pbg.NodeStub(grpc.insecure_channel(m.rpc_endpoint))

    def refused(call, code):
        try:
            call()
        except grpc.RpcError as e:
            return e.code() == code
        return False
    # NcclId changes nothing (tcp has no communicator ids): refused once reloaded
    wait_for(lambda: refused(lambda: nst.NcclId(pb.NcclIdRequest(), timeout=5), UN), 20,
             "the node to want the join token")
    wait_for(lambda: refused(lambda: cl.stub.Heartbeat(pb.HeartbeatRequest(member_id=0),
                                                       timeout=5), UN), 20,
             "the coordinator to want the join token")
    token = open(tok).read().strip()
    expect_error(lambda: nst.PrepareEpoch(pb.PrepareEpochRequest(epoch=m.joined_epoch + 9),
                                          timeout=5, metadata=md(token, "x" * 64)),
                 PD, "only the coordinator this node joined may call it")
    assert cl.wait_members(1).members[0].member_id == m.member_id


def operator_and_join_apart():
    """refitctl init makes the two secrets; the operator token opens no node
    method, the join token no operator method; UnregisterLayout (refitctl
    unregister) takes either; one token in both files is refused at start."""
    # refitctl init makes both secrets: mode 0600, distinct, never overwritten
    d = f"{TMP}/secrets"
    out = subprocess.run([f"{BUILD}/bin/refitctl", "init", d], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out
    op, jt = f"{d}/operator.token", f"{d}/join.token"
    optok, jtok = open(op).read().strip(), open(jt).read().strip()
    for path, tok in ((op, optok), (jt, jtok)):
        assert os.stat(path).st_mode & 0o777 == 0o600, oct(os.stat(path).st_mode)
        assert len(tok) == 64 and int(tok, 16) >= 0, tok
    assert optok != jtok
    out = subprocess.run([f"{BUILD}/bin/refitctl", "init", d], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "File exists" in out.stderr, out
    assert open(op).read().strip() == optok and open(jt).read().strip() == jtok
    addr = f"127.0.0.1:{free_port()}"
    args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", addr,
            "--token-file", op, "--join-token-file", jt]
    log = open(f"{TMP}/opjoin.log", "w")
    p = harness.spawn(args, stderr=log)
    try:
        ch = grpc.insecure_channel(addr)
        grpc.channel_ready_future(ch).result(timeout=20)
        st = pbg.CoordinatorStub(ch)
        bearer = [("authorization", "Bearer " + optok)]
        sess = os.urandom(32).hex()
        expect_error(lambda: st.ListMembers(pb.ListMembersRequest(), timeout=5,
                                            metadata=md(jtok, sess)), UN, "operator token")
        expect_error(lambda: st.Join(pb.JoinRequest(node_id="n0", ranks=[pb.RankInfo(rank=0)]),
                                     timeout=5, metadata=bearer), UN, "join token")
        j = st.Join(pb.JoinRequest(node_id="n0", ranks=[pb.RankInfo(rank=0), pb.RankInfo(rank=1)]),
                    timeout=5, metadata=md(jtok, sess))
        for role, inst, rank in ((pb.TRAIN, "", 0), (pb.INFER, "a", 1)):
            st.RegisterLayout(pb.RegisterLayoutRequest(
                member_id=j.member_id, model="m", role=role, instance=inst,
                tensors=[layout_to_proto({"name": "w", "dtype": "fp32", "shape": [4],
                                          "mesh": [rank], "placements": ["Replicate()"]})]),
                timeout=5, metadata=md(jtok, sess))
        # neither credential: refused; the operator's: done, for any member
        unreg = pb.UnregisterLayoutRequest(model="m", role=pb.INFER, instance="a")
        expect_error(lambda: st.UnregisterLayout(unreg, timeout=5), UN, "join token")
        st.UnregisterLayout(unreg, timeout=5, metadata=bearer)
        g = st.GetModel(pb.GetModelRequest(model="m"), timeout=5, metadata=bearer)
        assert [i.instance for i in g.instances] == [""], g
        ch.close()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        log.close()
    out = subprocess.run(args[:5] + ["--token-file", jt, "--join-token-file", jt],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "hold the same token" in out.stderr, out


def secure_default():
    port = free_port()
    args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", f"0.0.0.0:{port}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "not loopback" in out.stderr and \
        "join_token_file" in out.stderr, out
    cfg = f"{TMP}/insecure.json"
    with open(cfg, "w") as f:
        f.write('{"role": "coordinator", "insecure": true}\n')
    log = open(f"{TMP}/insecure.log", "w")
    p = harness.spawn(args[:1] + ["--config", cfg] + args[1:], stderr=log)
    try:
        wait_for(lambda: "INSECURE" in open(f"{TMP}/insecure.log").read(), 20,
                 "the warning at start")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        log.close()


def tree_refit():
    """This tree's refit package, imported once (its shared-memory segment
    names count per process)."""
    if "refit.client" not in sys.modules:
        lib = harness.use_tree_package()
        if not os.path.exists(lib):  # the ASan build has no librefit: the normal one's
            os.environ["REFIT_LIBRARY"] = os.path.abspath(
                f"{os.path.dirname(BUILD.rstrip('/'))}/lib/librefit.so")
    import refit
    return refit


def local_socket():
    """The local sockets are 0660 in local_socket_group; a client id is a
    capability (random: the next one is not the last plus one); a group
    that does not exist refuses the start."""
    import ctypes
    import stat
    cl = Cluster("ls", 1, ["--local-socket-group", "daemon"])
    for path in (cl.sock(0), cl.sock(0) + ".mem"):
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == 1, (path, oct(st.st_mode),
                                                                       st.st_gid)
    refit = tree_refit()
    from refit import _lib
    a = refit.Client(cl.sock(0))
    a.register("ls", "train", [refit.layout.placements("w", "fp32", [4], [0], ["Replicate()"])],
               {("w", 0): refit.empty([4], "float32")})
    b = refit.Client(cl.sock(0))
    b.register("ls", "infer", [refit.layout.placements("w", "fp32", [4], [1], ["Replicate()"])],
               {("w", 1): refit.empty([4], "float32", copies=2)}, instance="i")
    assert b.client_id != a.client_id + 1, (a.client_id, b.client_id)
    st = _lib.State()
    rc = _lib.lib.refit_get_state(a._h, ctypes.c_uint64(a.client_id + 1), ctypes.byref(st))
    assert rc == 2, f"client id {a.client_id + 1} answered {rc}"  # REFIT_ERR_NOT_FOUND
    b.close()
    a.close()
    args = [f"{BUILD}/bin/refitd", "--role", "node", "--listen", f"127.0.0.1:{free_port()}",
            "--coordinator", cl.addr, "--node-id", "lsx", "--ranks", "9",
            "--local-socket", f"{TMP}/lsx.local", "--local-socket-group", "no-such-group"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "no-such-group" in out.stderr, out


ROGUE = r"""
import json, sys, grpc
sock, calls = json.loads(sys.stdin.read())
out = []
with grpc.insecure_channel("unix:" + sock) as ch:
    for method, req in calls:
        f = ch.unary_unary("/refit.v1.Local/" + method)
        try:
            f(bytes.fromhex(req), timeout=10)
            out.append([method, "OK", ""])
        except grpc.RpcError as e:
            out.append([method, e.code().name, e.details()])
print(json.dumps(out))
"""


def rogue(sock, calls):
    """Local calls [(method, request)] from another process, uid nobody in
    the socket's group (daemon): [(method, code name, details)]."""
    out = subprocess.run([sys.executable, "-c", ROGUE], user=65534, group=1,
                         extra_groups=[], capture_output=True, text=True, timeout=60,
                         input=json.dumps([sock, [(m, r.SerializeToString().hex())
                                                  for m, r in calls]]))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def local_owner():
    """A client acts on its own registrations only (SO_PEERCRED): a stolen
    client id, a registration for another pid, another process's memory."""
    os.chmod(TMP, 0o711)  # the rogue (nobody) reaches the sockets, lists nothing
    mport = free_port()
    cl = Cluster("lo", 1, ["--local-socket-group", "daemon", "--metrics-listen",
                           f"127.0.0.1:{mport}"])
    sock = cl.sock(0)
    refit = tree_refit()
    a = refit.Client(sock)
    a.register("lo", "train", [refit.layout.placements("w", "fp32", [4], [0], ["Replicate()"])],
               {("w", 0): refit.empty([4], "float32")})
    b = refit.Client(sock)
    b.register("lo", "infer", [refit.layout.placements("w", "fp32", [4], [1], ["Replicate()"])],
               {("w", 1): refit.empty([4], "float32", copies=2)}, instance="i")
    a.weights_ready(1)
    before = (a.state(), b.state(), cl.stub.GetModel(pb.GetModelRequest(model="lo"), timeout=10))
    cr = pb.ClientRequest
    calls = [("WeightsReady", cr(client_id=a.client_id, version=7)),
             ("BeginWrite", cr(client_id=a.client_id, timeout_ms=100)),
             ("WaitInstalled", cr(client_id=a.client_id, version=1, timeout_ms=100)),
             ("GetState", cr(client_id=a.client_id)),
             ("Unregister", cr(client_id=a.client_id)),
             ("WaitVersion", cr(client_id=b.client_id, version=1, timeout_ms=100)),
             ("Serve", cr(client_id=b.client_id, version=1)),
             ("Describe", cr(client_id=b.client_id, engine=pb.EngineInfo(framework="rogue"))),
             ("Unregister", cr(client_id=b.client_id))]
    # the memory socket: segments this process passed, their key stolen
    fd = harness.memfd("lo-seg", 16)
    conn, key = harness.mem_pass(sock, {"lo-seg": fd})
    lay = layout_to_proto({"name": "w", "dtype": "fp32", "shape": [4], "mesh": [0],
                           "placements": ["Replicate()"]})
    mem = pb.LocalTensor(layout=lay, memory=[pb.PieceMemory(rank=0, piece=0, shm_name="lo-seg",
                                                            offsets=[0])])
    steal = pb.LocalRegisterRequest(model="lo2", role=pb.TRAIN, install=pb.IN_PLACE,
                                    pid=os.getpid(), tensors=[mem], mem_key=key)
    calls.append(("RegisterClient", steal))
    got = rogue(sock, calls)
    assert len(got) == len(calls), got
    for (method, req), (m, code, details) in zip(calls, got):
        cid = getattr(req, "client_id", 0)
        if method == "RegisterClient":
            assert code == "PERMISSION_DENIED" and f"pid {os.getpid()} is not the caller's" \
                in details and "uid 65534" in details, (method, code, details)
        else:
            assert code == "PERMISSION_DENIED" and f"client {cid} " in details and \
                f"registered by pid {os.getpid()}" in details and "uid 65534" in details, \
                (method, code, details)
    counted = sum(v for (name, labels), v in harness.scrape_metrics(mport).items()
                  if name == "refitd_auth_refused_total" and
                  dict(labels).get("reason") == "identity")
    assert counted == len(calls), (counted, len(calls))
    own = rogue_own_pid(sock, steal)
    assert own[1] == "NOT_FOUND" and "was not passed to this node by this process" in own[2], own
    after = (a.state(), b.state(), cl.stub.GetModel(pb.GetModelRequest(model="lo"), timeout=10))
    assert after == before, (before, after)
    expect_error(lambda: cl.stub.GetModel(pb.GetModelRequest(model="lo2"), timeout=10),
                 grpc.StatusCode.NOT_FOUND, "lo2")
    conn.close()
    os.close(fd)
    b.close()
    a.close()


def rogue_own_pid(sock, req):
    """RegisterClient from the rogue naming its own pid (the stolen key):
    (method, code, details)."""
    code = r"""
import json, os, sys, grpc
sock, req = json.loads(sys.stdin.read())
raw = bytearray(bytes.fromhex(req))
with grpc.insecure_channel("unix:" + sock) as ch:
    f = ch.unary_unary("/refit.v1.Local/RegisterClient")
    # field 5 (pid, varint) appended: the last value of a field wins
    pid, tail = os.getpid(), bytearray([0x28])
    while True:
        b = pid & 0x7f
        pid >>= 7
        tail.append(b | (0x80 if pid else 0))
        if not pid:
            break
    try:
        f(bytes(raw + tail), timeout=10)
        print(json.dumps(["RegisterClient", "OK", ""]))
    except grpc.RpcError as e:
        print(json.dumps(["RegisterClient", e.code().name, e.details()]))
"""
    out = subprocess.run([sys.executable, "-c", code], user=65534, group=1, extra_groups=[],
                         capture_output=True, text=True, timeout=60,
                         input=json.dumps([sock, req.SerializeToString().hex()]))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


try:
    check("cluster with a join token (2 nodes), model and first refit", setup)
    if CL is not None and MODEL.get("clients"):
        check("rogues without the token, with a wrong one, and with the token acting "
              "for another node: UNAUTHENTICATED / PERMISSION_DENIED, nothing changed, "
              "counted", rogues_refused)
        check("a token holder joined under its own name acts for itself only",
              member_of_its_own)
        check("the next refit commits byte-exact; refusals logged once per process",
              refit_after)
        check("data-plane tokens are per member, from the member's address: a token "
              "holder's own does not pass it for another node", data_token_per_member)
        check("SIGHUP rotates the join token: old refused, members stay, refit commits",
              rotate)
    check("a join token added by SIGHUP: checked from then on, the node's service bound "
          "to its session", token_added_by_reload)
    check("refitctl init makes both tokens (0600); they open different methods; "
          "UnregisterLayout either; one token for both refused", operator_and_join_apart)
    check("beyond loopback: no token refuses to start; \"insecure\": true warns",
          secure_default)
    check("local sockets 0660 in local_socket_group; client ids are capabilities; an "
          "unknown group refuses the start", local_socket)
    check("a client acts on its own registrations only: a stolen client id, a "
          "registration for another pid or with another's memory, from uid nobody: "
          "PERMISSION_DENIED naming the client, nothing changed", local_owner)
finally:
    if MODEL.get("clients"):
        harness.stop(MODEL["clients"])
    harness.stop_all()
    harness.check_exits()
harness.summary("auth")
