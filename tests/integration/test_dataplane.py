#!/usr/bin/python3
"""Data-plane end-to-end test: a coordinator and six node daemons as real
processes on loopback (tcp transport), librefit clients (refit-client) as
trainers and inference instances, weights checked byte by byte.

Usage: test_dataplane.py BUILD_DIR [PAIRS].  PAIRS random layout pairs
(default 50) are each refit in reshard mode (version 1) and then in
gather-and-broadcast mode (version 2).  Then: verify mode catching an
injected corruption, an abort midway (double buffer keeps the old version,
in-place is marked invalid), a client killed mid-refit, bad registrations,
and a data connection with a wrong token.  Prints "dataplane: N passed,
N failed" last; exit status 1 when anything failed.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
PAIRS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
TMP = tempfile.mkdtemp(prefix="refit-dp-")
subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iproto",
                f"--python_out={TMP}", f"--grpc_python_out={TMP}",
                "proto/refit/v1/refit.proto"], check=True)
sys.path.insert(0, TMP)
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402

passed = failed = 0
PROCS = []
NODES = 6
RPN = 4  # ranks per node
DTYPES = ["bf16", "fp32", "u8", "fp64", "fp16"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check(name, fn):
    global passed, failed
    t0 = time.time()
    try:
        fn()
        passed += 1
        print(f"ok   {name} ({time.time() - t0:.1f} s)")
    except Exception:  # noqa: BLE001 - report every failure and go on
        failed += 1
        print(f"FAIL {name}")
        traceback.print_exc()


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    PROCS.append(p)
    return p


class Cluster:
    """A coordinator and n node daemons; node k serves ranks k*RPN..."""

    def __init__(self, name, n, extra=(), coord_extra=()):
        self.name, self.n = name, n
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log = open(f"{TMP}/{name}.log", "w")
        self.coord = spawn([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                            self.addr, "--heartbeat-ms", "300", "--lease-ttl-ms", "3000",
                            "--log-level", "warn"] + list(coord_extra), stderr=self.log)
        self.nodes = []
        for k in range(n):
            np_ = free_port()
            ranks = f"{k * RPN}-{k * RPN + RPN - 1}"
            self.nodes.append(spawn(
                [f"{BUILD}/bin/refitd", "--role", "node", "--listen",
                 f"127.0.0.1:{np_}", "--coordinator", self.addr, "--node-id",
                 f"{name}{k}", "--ranks", ranks, "--heartbeat-ms", "300",
                 "--local-socket", self.sock(k), "--log-level", "warn"] + list(extra),
                stderr=self.log))
        self.ch = grpc.insecure_channel(self.addr)
        grpc.channel_ready_future(self.ch).result(timeout=10)
        self.stub = pbg.CoordinatorStub(self.ch)
        for _ in range(200):
            if len(self.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members) == n:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"{name}: nodes did not join")

    def sock(self, k):
        return f"{TMP}/{self.name}{k}.local"

    def node_of(self, rank):
        return rank // RPN

    def refit(self, model, version, mode=pb.RESHARD, verify=False, corrupt=0,
              timeout=120):
        r = self.stub.TriggerRefit(pb.TriggerRefitRequest(
            model=model, version=version, mode=mode, verify=verify,
            test_corrupt_msg=corrupt), timeout=10)
        return self.wait_final(r.refit_id, timeout)

    def wait_final(self, rid, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            g = self.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=10)
            if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED):
                return g
            time.sleep(0.02)
        raise AssertionError(f"refit {rid} did not finish")


class Client:
    """One refit-client process, driven over its stdin/stdout."""

    def __init__(self, cl, node, model, role, layouts, instance="", install=None,
                 pad=0):
        args = [f"{BUILD}/bin/refit-client", "--socket", cl.sock(node), "--model", model,
                "--role", role, "--layouts", layouts, "--timeout-ms", "30000"]
        if instance:
            args += ["--instance", instance]
        if install:
            args += ["--install", install]
        if pad:
            args += ["--pad", str(pad)]
        self.p = spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, bufsize=1)
        self.first = self.p.stdout.readline().strip()

    def ok(self):
        return self.first.startswith(("READY", "REGISTERED"))

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        assert out, f"client died: {self.p.stderr.read()}"
        return out

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write("quit\n")
                self.p.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()


# ---- random layouts ----------------------------------------------------------

def dtensor(name, dt, shape, ranks, rng, strided=True):
    """A DTensor layout over a 1-D or 2-D mesh of the given ranks."""
    n = len(ranks)
    if n >= 4 and n % 2 == 0 and rng.random() < 0.5:
        mesh = [ranks[:n // 2], ranks[n // 2:]]
        ndm = 2
    else:
        mesh = list(ranks)
        ndm = 1
    pl = []
    for _ in range(ndm):
        c = rng.random()
        d = rng.randrange(len(shape))
        if c < 0.3:
            pl.append("Replicate()")
        elif c < 0.85 or not strided:
            pl.append(f"Shard({d})")
        else:
            pl.append(f"_StridedShard(dim={d}, split_factor=2)")
    if ndm == 2 and pl[1].startswith("_Strided"):
        pl[1] = "Replicate()"  # strided shards come before the shard they pair with
    return {"name": name, "dtype": dt, "shape": shape, "mesh": mesh, "placements": pl}


def explicit(name, dt, shape, ranks, rng, cover=True):
    """Boxes along dim 0, uneven, some ranks holding several, maybe replicated."""
    cuts = sorted(set([0, shape[0]] + [rng.randrange(1, shape[0]) for _ in range(
        rng.randrange(0, 4))] if shape[0] > 1 else [0, shape[0]]))
    shards = []
    for a, b in zip(cuts, cuts[1:]):
        for r in rng.sample(ranks, min(len(ranks), rng.choice([1, 1, 2]))):
            shards.append({"rank": r, "offset": [a] + [0] * (len(shape) - 1),
                           "size": [b - a] + shape[1:]})
    return {"name": name, "dtype": dt, "shape": shape, "shards": shards}


def rand_pair(i, rng, total_ranks):
    """(trainer layouts, [(instance, layouts)]) for pair i."""
    kind = i % 5
    if kind == 3:
        specs = [([rng.randrange(1, 9)], rng.choice(DTYPES)) for _ in range(40)]
    elif kind == 4:
        specs = [([512, 2048 + rng.randrange(64)], "fp32")]  # ~4 MiB: chunked
    else:
        specs = [([rng.randrange(1, 40) for _ in range(rng.randrange(1, 4))],
                  rng.choice(DTYPES)) for _ in range(rng.randrange(1, 7))]
    all_r = list(range(total_ranks))
    tr = sorted(rng.sample(all_r, rng.randrange(1, 9)))
    ninst = rng.choice([1, 2])
    free = list(all_r)
    rng.shuffle(free)
    insts = []
    for k in range(ninst):
        n = rng.randrange(1, 7)
        insts.append(sorted(free[:n]))
        free = free[n:]
    train, infs = [], [[] for _ in insts]
    for t, (shape, dt) in enumerate(specs):
        name = f"t{t}"
        use_explicit = rng.random() < 0.3
        train.append(explicit(name, dt, shape, tr, rng) if use_explicit
                     else dtensor(name, dt, shape, tr, rng))
        for k, ir in enumerate(insts):
            infs[k].append(explicit(name, dt, shape, ir, rng) if rng.random() < 0.3
                           else dtensor(name, dt, shape, ir, rng))
    return train, [(f"i{k}", infs[k]) for k in range(len(insts))]


def write(path, tensors):
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f)
    return path


def ranks_of(tensors):
    rs = set()
    for t in tensors:
        if "mesh" in t:
            m = t["mesh"]
            for x in (m if isinstance(m[0], int) else [y for row in m for y in row]):
                rs.add(x)
        else:
            rs.update(s["rank"] for s in t["shards"])
    return rs


def start_model(cl, model, train, insts, rng, installs=None):
    """Clients for a model on every node its ranks touch; returns them."""
    tp = write(f"{TMP}/{model}-train.json", train)
    clients = {"train": [], "infer": []}
    for node in sorted({cl.node_of(r) for r in ranks_of(train)}):
        c = Client(cl, node, model, "train", tp)
        assert c.ok(), f"{model}: trainer on node {node}: {c.first} {c.p.stderr.read()}"
        clients["train"].append(c)
    for k, (iname, tensors) in enumerate(insts):
        ip = write(f"{TMP}/{model}-{iname}.json", tensors)
        for node in sorted({cl.node_of(r) for r in ranks_of(tensors)}):
            inst = (installs or {}).get(iname) or rng.choice(["double-buffer", "in-place"])
            c = Client(cl, node, model, "infer", ip, instance=iname, install=inst,
                       pad=rng.choice([0, 0, 3]))
            assert c.ok(), f"{model}: {iname} on node {node}: {c.first} {c.p.stderr.read()}"
            clients["infer"].append(c)
    return clients


def expect_installed(clients, version):
    for c in clients["infer"]:
        out = c.cmd(f"wait {version} 20000")
        assert out.startswith(f"INSTALLED {version} ") and "mismatches=0" in out, out


def stop(clients):
    for c in clients["train"] + clients["infer"]:
        c.close()


# ---- tests ----------------------------------------------------------------------

MAIN = Cluster("n", NODES)


def random_pairs():
    rng = random.Random(20261129)
    stats = {"pairs": 0, "bytes": 0}
    batch = 4
    for b in range(0, PAIRS, batch):
        live = []
        for i in range(b, min(PAIRS, b + batch)):
            train, insts = rand_pair(i, rng, NODES * RPN)
            model = f"m{i}"
            live.append((model, start_model(MAIN, model, train, insts, rng)))
        for model, clients in live:
            g = MAIN.refit(model, 1)
            assert g.state == pb.COMMITTED, (model, g.failure)
            stats["bytes"] += g.bytes
            expect_installed(clients, 1)
            for c in clients["train"]:
                out = c.cmd("next 2")
                assert out.startswith("READY"), out
            g = MAIN.refit(model, 2, mode=pb.BROADCAST)
            assert g.state == pb.COMMITTED, (model, "broadcast", g.failure)
            expect_installed(clients, 2)
            stats["pairs"] += 1
        for _, clients in live:
            stop(clients)
    print(f"     {stats['pairs']} pairs installed byte-exactly in both modes, "
          f"{stats['bytes']} reshard bytes over tcp")


def verify_catches_corruption():
    rng = random.Random(7)
    train = [dtensor("w", "fp32", [64, 48], [0, 1, 2, 3], rng),
             {"name": "b", "dtype": "bf16", "shape": [64], "mesh": [0, 4],
              "placements": ["Shard(0)"]}]
    train[0]["placements"] = ["Shard(0)"]
    train[0]["mesh"] = [0, 1, 2, 3]
    inf = [{"name": "w", "dtype": "fp32", "shape": [64, 48], "mesh": [8, 12],
            "placements": ["Shard(1)"]},
           {"name": "b", "dtype": "bf16", "shape": [64], "mesh": [8, 12],
            "placements": ["Replicate()"]}]
    cls = start_model(MAIN, "vfy", train, [("i0", inf)], rng,
                      {"i0": "double-buffer"})
    g = MAIN.refit("vfy", 1, verify=True)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 1)
    for c in cls["train"]:
        assert c.cmd("next 2").startswith("READY")
    g = MAIN.refit("vfy", 2, verify=True, corrupt=1)
    assert g.state == pb.FAILED and "CRC-32C" in g.failure, g
    assert "tensor \"" in g.failure, g.failure
    for c in cls["infer"]:
        st = c.cmd("state")
        assert "version=1 " in st and "valid=1" in st, st
        assert c.cmd("check 1").endswith("mismatches=0")
    # without corruption version 2 goes through
    g = MAIN.refit("vfy", 2, verify=True)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 2)
    stop(cls)


SLOW = None


def slow_cluster():
    global SLOW
    # small staging: one packed message in flight per node (the cap path)
    SLOW = Cluster("s", 3, ["--test-msg-delay-ms", "30"], ["--staging-bytes", "4MiB"])


def slow_model(name, rng):
    train = [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": [0, 1],
              "placements": ["Shard(0)"]} for k in range(8)]
    inf = lambda ranks: [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64],  # noqa: E731
                          "mesh": ranks, "placements": ["Shard(1)"]} for k in range(8)]
    return start_model(SLOW, name, train, [("db", inf([4, 5])), ("ip", inf([8, 9]))], rng,
                       {"db": "double-buffer", "ip": "in-place"})


def wait_running(cl, rid):
    for _ in range(500):
        g = cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
        if g.state == pb.RUNNING:
            return
        time.sleep(0.01)
    raise AssertionError(f"refit {rid} never ran: {g}")


def abort_midway():
    rng = random.Random(3)
    cls = slow_model("slow", rng)
    g = SLOW.refit("slow", 1, chunk=None) if False else SLOW.refit("slow", 1)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 1)
    for c in cls["train"]:
        assert c.cmd("next 2").startswith("READY")
    r = SLOW.stub.TriggerRefit(pb.TriggerRefitRequest(model="slow", version=2), timeout=5)
    wait_running(SLOW, r.refit_id)
    time.sleep(0.1)
    SLOW.stub.AbortRefit(pb.AbortRefitRequest(refit_id=r.refit_id, reason="test"),
                         timeout=5)
    g = SLOW.wait_final(r.refit_id)
    assert g.state == pb.ABORTED, g
    time.sleep(0.5)
    for c in cls["infer"]:
        st = c.cmd("state")
        if c.p.args[c.p.args.index("--instance") + 1] == "db":
            assert "version=1 " in st and "valid=1" in st, st
            assert c.cmd("check 1").endswith("mismatches=0")
        else:
            assert "valid=0" in st, st
    # the next refit of version 2 installs everything
    g = SLOW.refit("slow", 2)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 2)
    stop(cls)


def client_dies_midway():
    rng = random.Random(4)
    cls = slow_model("die", rng)
    r = SLOW.stub.TriggerRefit(pb.TriggerRefitRequest(model="die", version=1), timeout=5)
    wait_running(SLOW, r.refit_id)
    victim = cls["infer"][0]
    victim.p.kill()
    victim.p.wait()
    g = SLOW.wait_final(r.refit_id)
    assert g.state == pb.FAILED and "went away" in g.failure, g
    # the daemons still serve: a new client registers and the refit runs
    others = [c for c in cls["infer"] if c is not victim]
    inst = victim.p.args[victim.p.args.index("--instance") + 1]
    lay = victim.p.args[victim.p.args.index("--layouts") + 1]
    node = int(victim.p.args[victim.p.args.index("--socket") + 1][-7])
    again = Client(SLOW, node, "die", "infer", lay, instance=inst,
                   install="double-buffer" if inst == "db" else "in-place")
    assert again.ok(), again.first
    g = SLOW.refit("die", 1)
    assert g.state == pb.COMMITTED, g.failure
    cls["infer"] = others + [again]
    expect_installed(cls, 1)
    stop(cls)


def local_stub(cl, k):
    ch = grpc.insecure_channel(f"unix:{cl.sock(k)}")
    return pbg.LocalStub(ch), ch


def expect_error(fn, code, text):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"{e.code()} != {code}: {e.details()}"
        assert text in e.details(), f"{text!r} not in {e.details()!r}"
        return e.details()
    raise AssertionError(f"no error, expected {code}")


def bad_registrations():
    st, ch = local_stub(MAIN, 0)
    h = st.Hello(pb.HelloRequest(), timeout=5)
    assert h.node_id == "n0" and list(h.ranks) == [0, 1, 2, 3] and h.joined, h
    lay = pb.TensorLayout(name="w", dtype="fp32", shape=[8, 4], mesh_shape=[2],
                          mesh_ranks=[0, 1], placements=["Shard(0)"])

    def reg(mem, layout=lay, model="bad", role=pb.TRAIN, install=pb.DOUBLE_BUFFER):
        return st.RegisterClient(pb.LocalRegisterRequest(
            model=model, role=role, install=install, pid=os.getpid(),
            tensors=[pb.LocalTensor(layout=layout, memory=mem)]), timeout=10)

    shm = "/refit-test-%d" % os.getpid()
    with open("/dev/shm" + shm, "wb") as f:
        f.write(b"\0" * 100)
    try:
        expect_error(lambda: reg([pb.PieceMemory(rank=0, shm_name="/no-such-refit-shm",
                                                 offsets=[0]),
                                  pb.PieceMemory(rank=1, shm_name=shm, offsets=[0])]),
                     grpc.StatusCode.NOT_FOUND, 'shared memory "/no-such-refit-shm"')
        expect_error(lambda: reg([pb.PieceMemory(rank=0, shm_name=shm, offsets=[0]),
                                  pb.PieceMemory(rank=1, shm_name=shm, offsets=[90])]),
                     grpc.StatusCode.INVALID_ARGUMENT, "needs 64 bytes, but shared memory")
        expect_error(lambda: reg([pb.PieceMemory(rank=0, shm_name=shm, offsets=[0])]),
                     grpc.StatusCode.INVALID_ARGUMENT, "rank 1 (served by this node) holds "
                     "piece 0 but no memory")
        expect_error(lambda: reg([pb.PieceMemory(rank=0, shm_name=shm, offsets=[0]),
                                  pb.PieceMemory(rank=1, shm_name=shm, offsets=[32]),
                                  pb.PieceMemory(rank=5, shm_name=shm, offsets=[0])]),
                     grpc.StatusCode.INVALID_ARGUMENT, "rank 5, which this node does not")
        expect_error(lambda: reg([pb.PieceMemory(rank=0, shm_name=shm, offsets=[0]),
                                  pb.PieceMemory(rank=1, shm_name=shm, offsets=[32])],
                                 role=pb.INFER),
                     grpc.StatusCode.INVALID_ARGUMENT, "double-buffer install needs 2")
        ok = reg([pb.PieceMemory(rank=0, shm_name=shm, offsets=[0]),
                  pb.PieceMemory(rank=1, shm_name=shm, offsets=[32])])
        assert ok.client_id > 0
        # an instance whose layout disagrees with the trainer's (shape)
        bad = pb.TensorLayout(name="w", dtype="fp32", shape=[8, 5], mesh_shape=[2],
                              mesh_ranks=[2, 3], placements=["Shard(0)"])
        expect_error(lambda: reg([pb.PieceMemory(rank=2, shm_name=shm, offsets=[0, 0]),
                                  pb.PieceMemory(rank=3, shm_name=shm, offsets=[0, 0])],
                                 layout=bad, role=pb.INFER),
                     grpc.StatusCode.INVALID_ARGUMENT, "shape")
        expect_error(lambda: st.WaitVersion(pb.ClientRequest(client_id=999), timeout=5),
                     grpc.StatusCode.NOT_FOUND, "no librefit client 999")
        expect_error(lambda: st.WaitVersion(pb.ClientRequest(client_id=ok.client_id),
                                            timeout=5),
                     grpc.StatusCode.INVALID_ARGUMENT, "is a trainer")
        st.Unregister(pb.ClientRequest(client_id=ok.client_id), timeout=5)
        assert st.Hello(pb.HelloRequest(), timeout=5).joined
    finally:
        os.unlink("/dev/shm" + shm)
        ch.close()


def wrong_token_connection():
    mem = MAIN.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
    ep = mem.members[0].data_endpoint
    host, port = ep.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    # magic, token_len, epoch, refit id, 64 token bytes, 128 node id bytes
    hs = (0x31544652).to_bytes(4, "little") + (16).to_bytes(4, "little") + \
        mem.epoch.to_bytes(8, "little") + (1).to_bytes(8, "little") + b"x" * 64 + \
        b"intruder".ljust(128, b"\0")
    s.sendall(hs)
    ans = s.recv(1)
    assert ans in (b"\x01", b"\x02"), ans  # wrong epoch (none prepared) or wrong token
    assert s.recv(1) == b"", "the node kept the connection"
    s.close()
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\0" * 300)
    assert s.recv(1) == b"\x03"
    s.close()
    # still serving
    g = MAIN.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
    assert len(g.members) == NODES


def mixed_transports_refused():
    rng = random.Random(9)
    train = [{"name": "w", "dtype": "fp32", "shape": [16], "mesh": [0],
              "placements": ["Replicate()"]}]
    inf = [{"name": "w", "dtype": "fp32", "shape": [16], "mesh": [4],
            "placements": ["Replicate()"]}]
    cls = start_model(MAIN, "mix", train, [("i0", inf)], rng, {"i0": "double-buffer"})
    j = MAIN.stub.Join(pb.JoinRequest(node_id="gpu-node", host="127.0.0.1",
                                      rpc_endpoint="127.0.0.1:1", data_endpoint="nccl",
                                      transport="nccl",
                                      ranks=[pb.RankInfo(rank=999)]), timeout=5)
    try:
        g = MAIN.refit("mix", 1)
        assert g.state == pb.FAILED and "mixed transports" in g.failure, g
    finally:
        MAIN.stub.Leave(pb.LeaveRequest(member_id=j.member_id, reason="test"), timeout=5)
    g = MAIN.refit("mix", 1)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 1)
    stop(cls)


try:
    check("random layout pairs, reshard and broadcast, byte-exact", random_pairs)
    check("verify mode catches a corrupted message; nothing installed",
          verify_catches_corruption)
    check("slow cluster starts", slow_cluster)
    check("abort midway: double buffer keeps v1, in-place marked invalid", abort_midway)
    check("a librefit client killed mid-refit fails it; daemon keeps serving",
          client_dies_midway)
    check("bad registrations get clear errors", bad_registrations)
    check("a data connection with a wrong token or no handshake is refused",
          wrong_token_connection)
    check("an epoch mixing tcp and nccl nodes is refused, naming the node",
          mixed_transports_refused)
finally:
    for p in reversed(PROCS):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in PROCS:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    for p in [MAIN.coord] + MAIN.nodes:
        if p.returncode not in (0, -15):
            failed += 1
            print(f"FAIL daemon {p.args[:3]} exited {p.returncode}; see {TMP}/n.log")
print(f"dataplane: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
