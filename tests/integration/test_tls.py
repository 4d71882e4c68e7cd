#!/usr/bin/python3
"""Mutual TLS (docs/control-plane.md, "Mutual TLS"): `refitctl init DIR
--nodes tl0,tl1` makes the CA and certificates; a coordinator and two node
daemons on loopback use them and nothing else (no join token), a trainer on
node 0 and an inference instance on node 1.

 - refitctl init: every file mode 0600, the names in the certificates'
   SANs, nothing overwritten; refitctl reaches the coordinator over TLS;
 - a refit over mutual TLS commits byte-exact (the coordinator calls each
   node's Node service verifying that node's name);
 - rogues: one with no certificate (UNAUTHENTICATED), one with node tl1's
   valid certificate acting for tl0 on the coordinator and calling tl1's
   Node service (PERMISSION_DENIED naming the node), one with a certificate
   from another CA and one with an expired certificate of the cluster CA
   (the handshake fails: UNAVAILABLE); nothing changed, the next refit
   commits;
 - SIGHUP reloads the certificates: after `refitctl init` re-issues the
   coordinator's and tl0's, both serve the new ones, a refit commits;
 - data_tls on every node: a refit over TLS data connections commits
   byte-exact; a node's certificate files replaced by another node's (same
   CA) make the next refit fail (its peer refuses the name; files re-read per
   session), its own again commit; with data_tls on one node only the refit
   fails and the plain node names it (so the bytes went through TLS);
 - beyond loopback, mutual TLS alone satisfies "secure by default";
   data_tls without the TLS files is refused.

Usage: test_tls.py BUILD_DIR.  Ends with "tls: N passed, N failed".
"""
import datetime
import os
import random
import signal
import socket
import ssl
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-tls-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import RPN, Cluster, check, expect_error, free_port, start_model, wait_for  # noqa: E402

harness.init(BUILD, TMP)
D = f"{TMP}/pki"
CL = None
MODEL = {}
UN = grpc.StatusCode.UNAUTHENTICATED
PD = grpc.StatusCode.PERMISSION_DENIED
UNAVAIL = grpc.StatusCode.UNAVAILABLE


def rd(path):
    with open(path, "rb") as f:
        return f.read()


def channel(addr, name="coordinator.refit", cert=None, ca=None):
    """A TLS channel to addr verifying name; cert: (crt, key) files or None."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=rd(ca or f"{D}/ca.crt"),
        private_key=rd(cert[1]) if cert else None,
        certificate_chain=rd(cert[0]) if cert else None)
    return grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", name)])


def op_files():
    return [f"{D}/operator.crt", f"{D}/operator.key"]


def op_channel(addr):
    """The test's channel to the coordinator: refitctl init's operator
    certificate (mutual TLS, no operator token)."""
    return channel(addr, cert=op_files())


def node_files(k):
    return [f"{D}/node-tl{k}.crt", f"{D}/node-tl{k}.key"]


def tls_args(crt, key):
    return ["--tls-ca", f"{D}/ca.crt", "--tls-cert", crt, "--tls-key", key]


def refitctl_init(*args):
    return subprocess.run([f"{BUILD}/bin/refitctl", "init", *args], capture_output=True,
                          text=True, timeout=30)


def snapshot():
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
    g = CL.stub.GetModel(pb.GetModelRequest(model="lm"), timeout=10)
    refits = CL.stub.ListRefits(pb.ListRefitsRequest(), timeout=10)
    return {
        "members": sorted((m.node_id, m.member_id, m.rpc_endpoint, m.data_endpoint)
                          for m in mem.members),
        "epoch": mem.epoch,
        "instances": sorted((i.instance, i.role, i.layout_digest, i.installed_version)
                            for i in g.instances),
        "refits": sorted((r.id, r.state) for r in refits.refits),
    }


def init_files():
    """refitctl init makes the CA, the coordinator's and the nodes'
    certificates: 0600, the names in the SANs, never overwritten."""
    out = refitctl_init(D, "--nodes", "tl0,tl1")
    assert out.returncode == 0, out
    from cryptography import x509
    names = {"coordinator": "coordinator.refit", "operator": "operator.refit",
             "node-tl0": "tl0.node.refit",
             "node-tl1": "tl1.node.refit"}
    for f in ["ca.crt", "ca.key", "operator.token", "join.token"] + \
            [f"{b}.{e}" for b in names for e in ("crt", "key")]:
        mode = os.stat(f"{D}/{f}").st_mode & 0o777
        assert mode == 0o600, (f, oct(mode))
    for base, name in names.items():
        c = x509.load_pem_x509_certificate(rd(f"{D}/{base}.crt"))
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [name], (base, san)
    before = rd(f"{D}/node-tl0.crt")
    out = refitctl_init(D, "--nodes", "tl0")
    assert out.returncode == 2 and "File exists" in out.stderr, out
    assert rd(f"{D}/node-tl0.crt") == before
    out = refitctl_init(D, "--nodes", "a:b")
    assert out.returncode == 2 and "cannot be in a certificate's name" in out.stderr, out


def setup():
    global CL
    CL = Cluster("tl", 2, coord_extra=tls_args(f"{D}/coordinator.crt", f"{D}/coordinator.key"),
                 node_extra=lambda k: tls_args(*node_files(k)), channel=op_channel)
    train, insts = harness.reshard_layouts(RPN)
    MODEL["clients"] = start_model(CL, "lm", train, insts, random.Random(7),
                                   installs={"i0": "double-buffer"})
    harness.step_and_refit(CL, MODEL, 1)
    # refitctl over TLS; without the CA it cannot talk to the coordinator
    ctl = [f"{BUILD}/bin/refitctl", "--coordinator", CL.addr]
    tls = ["--tls-ca", f"{D}/ca.crt"]
    out = subprocess.run(ctl + tls + ["--tls-cert", f"{D}/operator.crt", "--tls-key",
                                      f"{D}/operator.key", "members"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "tl1" in out.stdout, out
    # mutual TLS and no operator token: operator methods need a certificate
    out = subprocess.run(ctl + tls + ["members"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "needs a client certificate from the cluster CA" in \
        out.stderr, out
    out = subprocess.run(ctl + ["members"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 3, out


def member(node):
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
    return next(m for m in mem.members if m.node_id == node)


def coordinator_calls(st, a0, a1, rid):
    ranks = [pb.RankInfo(rank=r) for r in range(RPN)]
    one = {"name": "w0", "dtype": "fp32", "shape": [64, 32], "mesh": list(range(RPN, 2 * RPN)),
           "placements": ["Shard(0)"]}
    return [
        ("Join as tl0", lambda: st.Join(pb.JoinRequest(
            node_id="tl0", host="127.0.0.1", rpc_endpoint="127.0.0.1:1",
            data_endpoint="127.0.0.1:2", ranks=ranks), timeout=5,
            metadata=[("refit-session", "s" * 32)])),
        ("Heartbeat", lambda: st.Heartbeat(pb.HeartbeatRequest(member_id=a0), timeout=5)),
        ("RegisterLayout", lambda: st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=a0, model="lm", role=pb.INFER, instance="thief",
            tensors=[pb.TensorLayout(name="w0", dtype="fp32", shape=one["shape"],
                                     mesh_shape=[RPN], mesh_ranks=one["mesh"],
                                     placements=one["placements"])]), timeout=5)),
        ("UnregisterLayout", lambda: st.UnregisterLayout(pb.UnregisterLayoutRequest(
            member_id=a0, model="lm", role=pb.INFER, instance="i0"), timeout=5)),
        ("WeightsReady", lambda: st.WeightsReady(pb.WeightsReadyRequest(
            member_id=a0, model="lm", version=99), timeout=5)),
        ("SliceDone", lambda: st.SliceDone(pb.SliceDoneRequest(
            refit_id=rid, member_id=a0, node_id="tl0", code=13, message="forged"),
            timeout=5)),
        ("Leave", lambda: st.Leave(pb.LeaveRequest(member_id=a0), timeout=5)),
    ]


def node_calls(nst, epoch):
    return [
        ("PrepareEpoch", lambda: nst.PrepareEpoch(pb.PrepareEpochRequest(
            epoch=epoch + 1, token=b"x" * 16), timeout=5)),
        ("RunSlice", lambda: nst.RunSlice(pb.RunSliceRequest(epoch=epoch, refit_id=1),
                                          timeout=5)),
        ("Publish", lambda: nst.Publish(pb.PublishRequest(refit_id=1, epoch=epoch),
                                        timeout=5)),
    ]


def expired_cert():
    """A certificate for tl0 from the cluster CA that expired yesterday."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    ca = x509.load_pem_x509_certificate(rd(f"{D}/ca.crt"))
    ca_key = serialization.load_pem_private_key(rd(f"{D}/ca.key"), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.utcnow()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tl0.node.refit")])
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(ca.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(days=10))
         .not_valid_after(now - datetime.timedelta(days=1))
         .add_extension(x509.SubjectAlternativeName([x509.DNSName("tl0.node.refit")]), False)
         .sign(ca_key, hashes.SHA256()))
    crt, kf = f"{TMP}/expired.crt", f"{TMP}/expired.key"
    with open(crt, "wb") as f:
        f.write(c.public_bytes(serialization.Encoding.PEM))
    with open(kf, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return crt, kf


def each(calls, code, text, who):
    for name, call in calls:
        try:
            expect_error(call, code, text(name) if callable(text) else text)
        except AssertionError as e:
            raise AssertionError(f"{who}: {name}: {e}") from None


def rogues_refused():
    before = snapshot()
    m0, m1 = member("tl0"), member("tl1")
    rid = before["refits"][-1][0]
    ep = before["epoch"]
    node1 = m1.rpc_endpoint
    # no certificate (TLS, the CA trusted): UNAUTHENTICATED
    st = pbg.CoordinatorStub(channel(CL.addr))
    each(coordinator_calls(st, m0.member_id, m1.member_id, rid), UN,
         "needs a node's certificate from the cluster CA", "no certificate")
    nst = pbg.NodeStub(channel(node1, "tl1.node.refit"))
    each(node_calls(nst, ep), UN, "only the coordinator", "no certificate")
    # tl1's valid certificate acting for tl0: PERMISSION_DENIED naming it
    st = pbg.CoordinatorStub(channel(CL.addr, cert=node_files(1)))
    each(coordinator_calls(st, m0.member_id, m1.member_id, rid), PD,
         lambda n: 'node "tl0" is not the caller: its certificate names node "tl1"',
         "tl1's certificate")
    nst = pbg.NodeStub(channel(node1, "tl1.node.refit", cert=node_files(0)))
    each(node_calls(nst, ep), PD, "the caller is node tl0", "tl0's certificate")
    # another CA's certificate, and an expired one: no handshake
    other = f"{TMP}/other-pki"
    assert refitctl_init(other, "--nodes", "tl0").returncode == 0
    for who, cert in (("another CA", [f"{other}/node-tl0.crt", f"{other}/node-tl0.key"]),
                      ("expired", expired_cert())):
        st = pbg.CoordinatorStub(channel(CL.addr, cert=cert))
        each(coordinator_calls(st, m0.member_id, m1.member_id, rid)[:2], UNAVAIL, "", who)
        nst = pbg.NodeStub(channel(node1, "tl1.node.refit", cert=cert))
        each(node_calls(nst, ep)[:1], UNAVAIL, "", who)
    after = snapshot()
    assert after == before, ("a refused call changed something", before, after)
    harness.step_and_refit(CL, MODEL, MODEL["version"] + 1)


def served_cert(ep, name):
    """The certificate (DER) the server at ep presents."""
    host, port = ep.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=f"{D}/ca.crt")
    ctx.check_hostname = False
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname=name) as t:
            return t.getpeercert(binary_form=True)


def der(path):
    return ssl.PEM_cert_to_DER_cert(rd(path).decode())


def rotate():
    """refitctl init re-issues the coordinator's and tl0's certificates;
    SIGHUP: both serve the new ones (before it, the old), a refit commits."""
    ep0 = member("tl0").rpc_endpoint
    old = served_cert(CL.addr, "coordinator.refit"), served_cert(ep0, "tl0.node.refit")
    assert old == (der(f"{D}/coordinator.crt"), der(f"{D}/node-tl0.crt"))
    for f in ("coordinator.crt", "coordinator.key", "node-tl0.crt", "node-tl0.key"):
        os.remove(f"{D}/{f}")
    out = refitctl_init(D, "--nodes", "tl0")
    assert out.returncode == 0, out
    new = der(f"{D}/coordinator.crt"), der(f"{D}/node-tl0.crt")
    assert new[0] != old[0] and new[1] != old[1]
    assert (served_cert(CL.addr, "coordinator.refit"),
            served_cert(ep0, "tl0.node.refit")) == old  # no reload without SIGHUP
    CL.coord.send_signal(signal.SIGHUP)
    CL.nodes[0].send_signal(signal.SIGHUP)
    wait_for(lambda: (served_cert(CL.addr, "coordinator.refit"),
                      served_cert(ep0, "tl0.node.refit")) == new, 20,
             "the new certificates served")
    harness.step_and_refit(CL, MODEL, MODEL["version"] + 1)


def data_tls_rotation(cl, cs):
    """dt0's certificate files replaced by dx0's (the cluster CA's, another
    node's name): the next refit's data connection is refused by dt1 (the
    files are re-read as a session starts, no SIGHUP); dt0's own again: the
    refit after commits."""
    base = f"{D}/node-dt0"
    keep = {e: rd(f"{base}.{e}") for e in ("crt", "key")}

    def put(src):
        for e in ("crt", "key"):
            with open(f"{base}.{e}.new", "wb") as f:
                f.write(src[e])
            os.replace(f"{base}.{e}.new", f"{base}.{e}")
    put({e: rd(f"{D}/node-dx0.{e}") for e in ("crt", "key")})
    for v, ok in ((2, False), (3, True)):
        out = cs["train"][0].cmd(f"next {v}")
        assert out.startswith("READY"), out
        g = cl.refit("dm", v, timeout=120)
        if ok:
            assert g.state == pb.COMMITTED, g.failure
            harness.expect_installed(cs, v)
        else:
            assert g.state == pb.FAILED, g
            cl.log.flush()
            wait_for(lambda: 'TLS with node "dt0"' in open(f"{TMP}/dt.log").read(), 20,
                     "dt1 refusing dx0's certificate for dt0")
            put(keep)


def data_tls():
    """data_tls on every node: a refit commits byte-exact over TLS data
    connections; with it on one node only, the refit fails naming TLS and
    the peer (the bytes did go through TLS)."""
    assert refitctl_init(D, "--nodes", "dt0,dt1,dx0,dx1").returncode == 0
    coord = tls_args(f"{D}/coordinator.crt", f"{D}/coordinator.key")
    train, insts = harness.reshard_layouts(RPN)
    for name, on, commits in (("dt", (True, True), True), ("dx", (True, False), False)):
        cl = Cluster(name, 2, coord_extra=coord, channel=op_channel, node_extra=lambda k: tls_args(
            f"{D}/node-{name}{k}.crt", f"{D}/node-{name}{k}.key") +
            ["--data-tls", "on" if on[k] else "off"])
        cs = start_model(cl, "dm", train, insts, random.Random(3),
                         installs={"i0": "double-buffer"})
        try:
            g = cl.refit("dm", 1, timeout=120)
            if commits:
                assert g.state == pb.COMMITTED, g.failure
                harness.expect_installed(cs, 1)
                data_tls_rotation(cl, cs)
            else:
                assert g.state == pb.FAILED, g
                cl.log.flush()
                wait_for(lambda: "data_tls is on there, off here" in
                         open(f"{TMP}/{name}.log").read(), 20, "the node naming data_tls")
        finally:
            harness.stop(cs)


def secure_default():
    """Beyond loopback, mutual TLS is enough (no warning); a certificate
    without a CA to verify callers is not."""
    port = free_port()
    args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", f"0.0.0.0:{port}",
            "--tls-cert", f"{D}/coordinator.crt", "--tls-key", f"{D}/coordinator.key"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "not loopback" in out.stderr, out
    with open(f"{TMP}/empty.json", "w") as f:
        f.write("{}\n")
    out = subprocess.run([f"{BUILD}/bin/refitd", "--check-config", f"{TMP}/empty.json",
                          "--role", "node", "--ranks", "0", "--data-tls", "on"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and 'data_tls "on" needs tls_cert, tls_key and tls_ca' in \
        out.stderr, out
    log = open(f"{TMP}/exposed.log", "w")
    p = harness.spawn(args + ["--tls-ca", f"{D}/ca.crt", "--log-level", "info"], stderr=log)
    try:
        wait_for(lambda: "listening on" in open(f"{TMP}/exposed.log").read(), 20,
                 "the coordinator to listen")
        assert "INSECURE" not in open(f"{TMP}/exposed.log").read()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        log.close()


try:
    check("refitctl init: CA, coordinator and node certificates, 0600, names in SANs, "
          "never overwritten", init_files)
    check("a cluster on mutual TLS only (2 nodes): model, first refit byte-exact, "
          "refitctl over TLS", setup)
    if CL is not None and MODEL.get("clients"):
        check("rogues with no certificate, another node's, another CA's, an expired one: "
              "refused, nothing changed, the next refit commits", rogues_refused)
        check("SIGHUP reloads rotated certificates (coordinator and node), refit commits",
              rotate)
    check("data_tls: a refit over TLS data connections commits byte-exact; on one node "
          "only, it fails naming TLS", data_tls)
    check("beyond loopback: mutual TLS satisfies secure by default", secure_default)
finally:
    if MODEL.get("clients"):
        harness.stop(MODEL["clients"])
    harness.stop_all()
    harness.check_exits()
harness.summary("tls")
