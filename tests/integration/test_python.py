#!/usr/bin/python3
"""The Python package (python/refit) end to end: a coordinator and three
node daemons as real processes on loopback (harness.py), the examples of
python/examples as real processes (a torch trainer stepping and publishing
three versions; a double-buffered and an in-place inference loop switching
versions between requests), every piece checked byte for byte against what
the trainer published; the DTensor path with objects shaped like a DTensor
checked against the C library's boxes (refit-plan boxes); an existing
strided tensor registered by copying it once; typed errors carrying the
daemon's message; `pip install` of the package from the tree, offline.

Usage: test_python.py BUILD_DIR.  Prints "python: N passed, N failed" last.
"""
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-py-")
from refit.v1 import refit_pb2 as pb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import RPN, Cluster, check, spawn  # noqa: E402

harness.init(BUILD, TMP)
LIB = harness.use_tree_package()  # the refit package from python/
import numpy as np  # noqa: E402
import torch  # noqa: E402

import refit  # noqa: E402

assert os.path.dirname(refit.__file__) == os.path.abspath("python/refit"), refit.__file__

sys.path.insert(0, os.path.abspath("python/examples"))
import trainer as trainer_example  # noqa: E402
from trainer import Mesh, Replicate, Shard  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.path.abspath("python"), REFIT_LIBRARY=LIB)
PY = "/usr/bin/python3"
T_RANKS = f"0-{RPN - 1}"
CL = Cluster("py", 3)


def read_until(p, prefix, timeout=120):
    """Lines of p's stdout up to and including the first starting with prefix."""
    lines = []
    end = time.time() + timeout
    while time.time() < end:
        line = p.stdout.readline()
        if not line:
            raise AssertionError(f"{p.args[2]} ended before {prefix!r}: {lines} "
                                 f"{p.stderr.read() if p.stderr else ''}")
        lines.append(line.strip())
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"no {prefix!r} in {timeout} s: {lines}")


def expected_sha(dump, version, name, off, size):
    full = np.fromfile(f"{dump}/{version}/{name}.bin", dtype=np.int16)
    full = full.reshape([32, 16] if name == "fc.weight" else [32])
    box = full[tuple(slice(o, o + s) for o, s in zip(off, size))]
    return hashlib.sha256(np.ascontiguousarray(box).tobytes()).hexdigest()


def examples():
    dump, go = f"{TMP}/dump", f"{TMP}/go"
    infs = []
    for k, (inst, install) in enumerate([("serve0", "double-buffer"), ("serve1", "in-place")]):
        node = k + 1
        p = spawn([PY, "python/examples/inference.py", "--socket", CL.sock(node), "--model",
                   "tiny", "--instance", inst, "--install", install, "--ranks",
                   f"{node * RPN}-{node * RPN + RPN - 1}", "--until", "3"],
                  env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        read_until(p, "REGISTERED")
        infs.append(p)
    tr = spawn([PY, "python/examples/trainer.py", "--socket", CL.sock(0), "--model", "tiny",
                "--ranks", T_RANKS, "--steps", "3", "--dump", dump, "--go-file", go],
               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checked = 0
    for v in (1, 2, 3):
        read_until(tr, f"READY {v}")
        g = CL.refit("tiny", v)
        assert g.state == pb.COMMITTED, (v, g.failure)
        assert g.bytes > 0, g
        for p in infs:
            lines = read_until(p, f"SERVING {v} ")
            pieces = []
            while len(pieces) < 2 * RPN:  # fc.weight and fc.bias on each rank
                pieces += [ln for ln in read_until(p, "PIECE") if ln.startswith("PIECE")]
            for ln in pieces:
                _, ver, name, rank, off, size, sha = ln.split()
                off, size = [int(x) for x in off.split(",")], [int(x) for x in size.split(",")]
                assert int(ver) == v, ln
                assert sha == expected_sha(dump, v, name, off, size), \
                    f"{ln}: bytes differ from what the trainer published (lines {lines})"
                checked += 1
        open(f"{go}.{v + 1}", "w").close()  # the trainer's next step (4: leave)
    for p in infs + [tr]:
        p.wait(timeout=60)
        assert p.returncode == 0, (p.args, p.returncode, p.stderr.read())
    assert checked == 3 * 2 * 2 * RPN, checked


# the DTensor stand-ins of the trainer example (Shard, Replicate, Mesh), and two more
class _StridedShard:
    def __init__(self, dim, split_factor):
        self.dim, self.split_factor = dim, split_factor


class Partial:
    pass


def DTensorLike(shape, dtype, mesh, placements):  # noqa: N802  (stands in for a class)
    """The example's DTensorLike over a mesh of these global ranks."""
    return trainer_example.DTensorLike(shape, dtype, Mesh(mesh), placements)


def dtensor_path():
    cases = [([10, 5], torch.float32, [[0, 1], [2, 3]], [Shard(0), Shard(0)]),
             ([7, 9, 3], torch.bfloat16, [4, 2, 6], [Shard(1)]),
             ([6], torch.float16, [[3, 1, 2], [0, 5, 4]], [Replicate(), Shard(-1)]),
             ([4, 8], torch.int32, [[0, 1], [2, 3]], [Shard(1), Shard(0)]),
             ([3, 3], torch.float64, [0, 1, 2, 3, 4], [Shard(0)])]  # empty shards
    for i, (shape, dt, mesh, places) in enumerate(cases):
        lay = refit.layout.dtensor(f"t{i}", DTensorLike(shape, dt, mesh, places))
        strings = [str(p) if isinstance(p, str) else
                   ("Replicate()" if isinstance(p, Replicate) else f"Shard({p.dim})")
                   for p in places]
        assert lay == refit.layout.placements(f"t{i}", dt, shape, mesh, strings), lay
        path = f"{TMP}/dt{i}.json"
        with open(path, "w") as f:
            f.write(refit.layout.to_json(lay))
        out = subprocess.run([f"{BUILD}/bin/refit-plan", "boxes", path], capture_output=True,
                             text=True, check=True).stdout
        d = json.loads(out)
        for s in d.get("tensors", [d])[0]["shards"]:
            got = refit.layout.local_boxes(lay, s["rank"])
            assert got == [(s["offset"], s["size"])], (lay, s, got)
    strided = refit.layout.dtensor("s", DTensorLike([8, 4], torch.float32, [[0, 1], [2, 3]],
                                                    [_StridedShard(0, 2), Shard(0)]))
    assert strided["placements"] == ["_StridedShard(dim=0, split_factor=2)", "Shard(0)"]
    with open(f"{TMP}/s.json", "w") as f:
        f.write(refit.layout.to_json(strided))
    subprocess.run([f"{BUILD}/bin/refit-plan", "boxes", f"{TMP}/s.json"], check=True,
                   capture_output=True)  # the C library takes the same JSON
    try:
        refit.layout.dtensor("p", DTensorLike([4], torch.float32, [0, 1], [Partial()]))
        raise AssertionError("Partial accepted")
    except ValueError as e:
        assert "reduce it first" in str(e), e
    b = refit.layout.boxes("e", "fp16", [6, 4], [(0, [0, 0], [4, 4]), (1, [4, 0], [2, 4])])
    assert refit.layout.local_boxes(b, 1) == [([4, 0], [2, 4])], b


def shared_strided():
    """A transposed torch tensor and a column-sliced numpy array registered
    by copying them once (strides kept), refit into another node."""
    src_t = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4).t()  # 4x6, strides (1, 4)
    src_n = np.arange(5 * 8, dtype=np.int32).reshape(5, 8)[:, ::2]      # 5x4, strided
    t, n = refit.share(src_t), refit.share(src_n)
    assert t.stride() == (1, 4) and torch.equal(t, src_t), t.stride()
    assert n.strides == src_n.strides and (n == src_n).all(), n.strides
    r0, r1 = 0, RPN  # node 0 trains, node 1 serves
    lays = [refit.layout.placements("a", torch.float32, [4, 6], [r0], ["Replicate()"]),
            refit.layout.placements("b", np.int32, [5, 4], [r0], ["Replicate()"])]
    ilays = [refit.layout.placements("a", "fp32", [4, 6], [r1], ["Replicate()"]),
             refit.layout.placements("b", "int32", [5, 4], [r1], ["Replicate()"])]
    tr = refit.Client(CL.sock(0), timeout_ms=20000)
    tr.register("strided", "train", lays, {("a", r0): t, ("b", r0): n})
    tr.weights_ready(1)
    ia = refit.empty([4, 6], "float32", copies=2, torch=True, strides=[1, 4])
    ib = refit.empty([5, 4], "int32", copies=2)
    inf = refit.Client(CL.sock(1), timeout_ms=20000)
    inf.register("strided", "infer", ilays, {("a", r1): ia, ("b", r1): ib}, instance="x")
    g = CL.refit("strided", 1)
    assert g.state == pb.COMMITTED, g.failure
    st = inf.wait_version(1, 20000)
    assert st.version == 1 and st.valid, st
    assert torch.equal(ia[st.active], src_t) and (ib[st.active] == src_n).all()
    assert inf.state().version == 1
    inf.unregister()
    tr.unregister()
    inf.close()
    tr.close()


def publisher_and_serve():
    """refit.torch.Publisher in place: a module's parameters move into
    refit memory (no copy at publish); a double-buffered reader that says
    which version it serves (Client.serve) is never overwritten."""
    import refit.torch as rt
    torch.manual_seed(0)
    mod = torch.nn.Linear(6, 4)
    before = {n: p.detach().clone() for n, p in mod.named_parameters()}
    pub = rt.Publisher(mod, CL.sock(0), "pub", rank=0, timeout_ms=20000)
    assert pub.mode == "in-place"
    for n, p in mod.named_parameters():  # same values, now in refit memory
        assert torch.equal(p.detach(), before[n]) and refit.find(p.detach())
    opt = torch.optim.SGD(mod.parameters(), lr=0.5)
    r1 = RPN
    ilays = [refit.layout.placements(n, "fp32", list(p.shape), [r1], ["Replicate()"])
             for n, p in mod.named_parameters()]
    bufs = {n: refit.empty(list(p.shape), "float32", copies=2, torch=True)
            for n, p in mod.named_parameters()}
    inf = refit.Client(CL.sock(1), timeout_ms=20000)
    inf.register("pub", "infer", ilays, {(n, r1): b for n, b in bufs.items()}, instance="s")
    want = {}

    def step(v):
        mod(torch.ones(2, 6)).sum().backward()
        with pub.writing():
            opt.step()
        opt.zero_grad()
        pub.publish(v)
        want[v] = {n: p.detach().clone() for n, p in mod.named_parameters()}

    step(1)
    assert CL.refit("pub", 1).state == pb.COMMITTED
    st = inf.wait_version(1)
    for n in bufs:
        assert torch.equal(bufs[n][st.active], want[1][n]), n
    try:
        inf.serve(7)
        raise AssertionError("serve(7) accepted")
    except refit.RefitError as e:
        assert "version 7 is not installed" in e.message, e.message
    inf.serve(1)                      # the reader serves version 1's copy
    served = st.active
    step(2)
    assert CL.refit("pub", 2).state == pb.COMMITTED   # writes the other copy
    step(3)
    g = CL.refit("pub", 3)            # would overwrite the served copy
    assert g.state == pb.FAILED and "still serves copy" in g.failure, g.failure
    for n in bufs:
        assert torch.equal(bufs[n][served], want[1][n]), n
    inf.serve(2)
    assert CL.refit("pub", 3).state == pb.COMMITTED
    st = inf.wait_version(3)
    for n in bufs:
        assert torch.equal(bufs[n][st.active], want[3][n]), n
    inf.unregister()
    pub.close()
    inf.close()


def retry_after_refusal():
    """A refit refused on one node while its reader serves the copy it would
    write is retried by the policy (same refit, the next attempt) and
    commits once the reader moved on -- with receivers relaying to each
    other (a served instance on node 1, a plain one of the same layout on
    node 2).  On the RFT1 handshake (no attempt) every retry took a
    connection a peer made for the refused attempt and failed ("closed the
    connection after 0 messages")."""
    import refit.torch as rt
    torch.manual_seed(2)
    mod = torch.nn.Linear(64, 64)
    pub = rt.Publisher(mod, CL.sock(0), "rty", rank=0, timeout_ms=20000)
    opt = torch.optim.SGD(mod.parameters(), lr=0.5)
    insts = []
    for node, rank in ((1, RPN), (2, 2 * RPN)):
        lays = [refit.layout.placements(n, "fp32", list(p.shape), [rank], ["Replicate()"])
                for n, p in mod.named_parameters()]
        bufs = {n: refit.empty(list(p.shape), "float32", copies=2, torch=True)
                for n, p in mod.named_parameters()}
        c = refit.Client(CL.sock(node), timeout_ms=20000)
        c.register("rty", "infer", lays, {(n, rank): b for n, b in bufs.items()},
                   instance=f"i{node}")
        insts.append((c, bufs))
    CL.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="rty", retries=8, retry_backoff_ms=100, trigger=pb.TRIGGER_ON_READY)),
        timeout=10)

    def step(v):
        mod(torch.ones(2, 64)).sum().backward()
        with pub.writing():
            opt.step()
        opt.zero_grad()
        pub.publish(v)

    def refits(v):
        return [r for r in CL.stub.ListRefits(pb.ListRefitsRequest(model="rty"),
                                              timeout=10).refits if r.version == v]
    served = insts[0][0]
    for v in (1, 2):
        step(v)
        served.wait_version(v, 20000)
        if v == 1:
            served.serve(1)   # version 3 would overwrite version 1's copy
    step(3)
    harness.wait_for(lambda: any("still serves copy" in " ".join([r.failure] +
                                                                 list(r.attempts))
                                 for r in refits(3)), 30, "version 3 refused on node 1")
    served.serve(2)
    harness.wait_for(lambda: any(r.state == pb.COMMITTED for r in refits(3)), 30,
                     "version 3 committed by a retry")
    assert len(refits(3)) == 1, "a new refit, not a retry, committed"
    # every failed attempt was the refusal: none failed on the data plane
    bad = [a for a in refits(3)[0].attempts if "still serves copy" not in a]
    assert not bad, bad
    for c, bufs in insts:
        st = c.wait_version(3, 20000)
        for n, p in mod.named_parameters():
            assert torch.equal(bufs[n][st.active], p.detach()), n
        c.unregister()
        c.close()
    pub.close()


def refused(fn, text):
    """fn raises refit.InvalidArgument with text in its message."""
    try:
        fn()
    except refit.InvalidArgument as e:
        assert text in e.message, (text, e.message)
        return
    raise AssertionError(f"accepted; expected a refusal saying {text!r}")


def engines_and_wait_installed():
    """An engine names itself (Client.describe) and says the version it
    serves (Client.serve): refitctl models shows both per instance (the
    node tells the coordinator at its heartbeats).  Publisher.publish(step,
    wait=...) returns once every instance holds step; at the deadline
    refit.Timeout names the instances that lag, and only those."""
    import refit.torch as rt
    torch.manual_seed(1)
    mod = torch.nn.Linear(4, 3)
    pub = rt.Publisher(mod, CL.sock(0), "eng", rank=0, timeout_ms=20000)
    ilays = lambda r: [refit.layout.placements(n, "fp32", list(p.shape), [r],  # noqa: E731
                                               ["Replicate()"])
                       for n, p in mod.named_parameters()]
    insts = {}
    for name, node, rank in (("a", 1, RPN), ("b", 2, 2 * RPN)):
        c = refit.Client(CL.sock(node), timeout_ms=20000)
        bufs = {n: refit.empty(list(p.shape), "float32", copies=2, torch=True)
                for n, p in mod.named_parameters()}
        c.register("eng", "infer", ilays(rank), {(n, rank): b for n, b in bufs.items()},
                   instance=name)
        insts[name] = (c, bufs)
    a = insts["a"][0]
    a.describe("vllm", "0.32.0", "wait")
    for args, text in ((("vllm", "1", "later"), 'pause mode "later" is not one of'),
                       (("", "1", "wait"), "framework is empty"),
                       (("vllm", "x" * 65, "wait"), "version is 65 bytes")):
        refused(lambda: a.describe(*args), text)
    refused(lambda: pub.client.describe("vllm"), "this call is for inference clients")
    # manual trigger: nothing installs version 1, the wait names both instances
    t0 = time.monotonic()
    try:
        pub.publish(1, wait=800)
        raise AssertionError("publish(1, wait=800) returned with nothing installed")
    except refit.Timeout as e:
        assert 'instance "a" holds v0' in e.message and 'instance "b" holds v0' in \
            e.message, e.message
    assert time.monotonic() - t0 >= 0.8
    CL.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="eng", catch_up=True, trigger=pb.TRIGGER_ON_READY)), timeout=10)
    with torch.no_grad():
        mod.weight.add_(1.0)
    assert pub.publish(2, wait=True) >= 2    # the policy refits it; we wait for it
    for name, (c, bufs) in insts.items():
        st = c.state()                        # installed already: no wait
        assert st.version == 2 and st.valid, (name, st)
        assert torch.equal(bufs["weight"][st.active], mod.weight.detach()), name
    a.serve(2)

    def shown():
        m = CL.stub.GetModel(pb.GetModelRequest(model="eng"), timeout=10)
        return {i.instance: i for i in m.instances if i.role == pb.INFER}
    harness.wait_for(lambda: shown()["a"].served_version == 2, what="a's served version")
    ia, ib = shown()["a"], shown()["b"]
    assert (ia.engine.framework, ia.engine.version, ia.engine.pause_mode) == \
        ("vllm", "0.32.0", "wait"), ia.engine
    assert not ib.HasField("engine") and ib.served_version == 0, ib
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", CL.addr, "models"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    line_a = [ln for ln in out.stdout.splitlines() if " a " in ln]
    assert line_a and "vllm 0.32.0 serves v2, pause wait" in line_a[0], out.stdout
    assert "vllm" not in [ln for ln in out.stdout.splitlines() if " b " in ln][0], out.stdout
    js = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", CL.addr, "--json",
                         "models"], capture_output=True, text=True, timeout=30)
    assert js.returncode == 0, js.stderr
    ja = [i for m in json.loads(js.stdout)["models"] if m["name"] == "eng"
          for i in m["instances"] if i["instance"] == "a"][0]
    assert ja["engine"] == {"framework": "vllm", "version": "0.32.0",
                            "pause_mode": "wait"} and ja["served_version"] == 2, ja
    # a third instance, not caught up: only it lags
    CL.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="eng", catch_up=False, trigger=pb.TRIGGER_ON_READY)), timeout=10)
    c3 = refit.Client(CL.sock(2), timeout_ms=20000)
    c3.register("eng", "infer", ilays(2 * RPN + 1), {
        (n, 2 * RPN + 1): refit.empty(list(p.shape), "float32", copies=2, torch=True)
        for n, p in mod.named_parameters()}, instance="c")
    try:
        pub.client.wait_installed(2, 500)
        raise AssertionError("wait_installed(2) returned while instance c holds nothing")
    except refit.Timeout as e:
        assert 'instance "c" holds v0' in e.message and '"a"' not in e.message and \
            '"b"' not in e.message, e.message
    for c in [c3] + [v[0] for v in insts.values()]:
        c.unregister()
        c.close()
    pub.close()


def several_clients_per_node():
    """A trainer and an instance each spread over two processes' clients on
    one node (a client per rank, as FSDP2 and vLLM workers run): the node
    registers each group once all its ranks are there, tells the
    coordinator a version once every trainer client holds it, and refits
    into all of them; an overlapping rank is refused; a member leaving and
    coming back re-forms the group."""
    t0, t1, i0, i1 = 0, 1, RPN, RPN + 1
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    tl = [refit.layout.placements("w", "fp32", [8, 6], [t0, t1], ["Shard(0)"])]
    il = [refit.layout.placements("w", "fp32", [8, 6], [i0, i1], ["Shard(1)"])]

    def trainer(rank, k):
        c = refit.Client(CL.sock(0), timeout_ms=20000)
        buf = refit.share(full[4 * k:4 * k + 4].clone())
        c.register("grp", "train", tl, {("w", rank): buf})
        return c, buf

    def latest():
        return CL.stub.GetModel(pb.GetModelRequest(model="grp"), timeout=10).latest_version

    ta, abuf = trainer(t0, 0)
    tb, bbuf = trainer(t1, 1)
    ibufs, insts = [], []
    for k, r in enumerate((i0, i1)):
        c = refit.Client(CL.sock(1), timeout_ms=20000)
        b = refit.empty([8, 3], "float32", copies=2, torch=True)
        c.register("grp", "infer", il, {("w", r): b}, instance="g")
        ibufs.append(b)
        insts.append(c)
    try:
        refit.Client(CL.sock(0), timeout_ms=20000).register(
            "grp", "train", tl, {("w", t0): refit.empty([4, 6], "float32")})
        raise AssertionError("a second client of rank 0 was accepted")
    except refit.RefitError as e:
        assert "rank 0 is registered on this node already" in e.message, e.message
    ta.weights_ready(1)
    assert latest() == 0, "the coordinator heard of version 1 before every rank held it"
    tb.weights_ready(1)
    assert latest() == 1
    g = CL.refit("grp", 1)
    assert g.state == pb.COMMITTED, g.failure
    for k, c in enumerate(insts):
        st = c.wait_version(1)
        assert torch.equal(ibufs[k][st.active], full[:, 3 * k:3 * k + 3]), k
    # a member leaves: the group is no longer whole here; another takes its rank
    tb.unregister()
    tb.close()
    harness.wait_for(lambda: not any(i.role == pb.TRAIN for i in CL.stub.GetModel(
        pb.GetModelRequest(model="grp"), timeout=10).instances), what="the trainer gone")
    full += 1000
    ta.begin_write()
    with torch.no_grad():
        abuf.copy_(full[:4])
    ta.weights_ready(2)  # kept here: the group lacks rank 1
    assert latest() == 1
    tb, bbuf = trainer(t1, 1)
    assert latest() == 1
    tb.weights_ready(2)
    assert latest() == 2
    g = CL.refit("grp", 2)
    assert g.state == pb.COMMITTED, g.failure
    for k, c in enumerate(insts):
        st = c.wait_version(2)
        assert torch.equal(ibufs[k][st.active], full[:, 3 * k:3 * k + 3]), k
    # an engine with a client per worker serves a version once all of them do

    def inst_g():
        return [i for i in CL.stub.GetModel(pb.GetModelRequest(model="grp"),
                                            timeout=10).instances if i.instance == "g"][0]
    insts[0].describe("vllm", "0.32.0", "wait")
    insts[0].serve(2)
    harness.wait_for(lambda: inst_g().engine.framework == "vllm", what="g's engine shown")
    assert inst_g().served_version == 0, inst_g()   # worker 1 serves nothing yet
    insts[1].serve(2)
    harness.wait_for(lambda: inst_g().served_version == 2, what="g served by both")
    for c in insts + [ta, tb]:
        c.unregister()
        c.close()


def typed_errors():
    try:
        refit.Client(f"{TMP}/nobody.sock", timeout_ms=2000)
        raise AssertionError("connected to nothing")
    except refit.Unavailable as e:
        assert "nobody.sock" in e.message and e.code == "ERR_UNAVAILABLE", e
    c = refit.Client(CL.sock(2), timeout_ms=20000)
    w = refit.empty([4], "float32")
    # a rank this node does not serve: the daemon says which
    try:
        c.register("bad", "train", [refit.layout.placements("w", "fp32", [4], [0], ["R"])],
                   {("w", 0): w})
        raise AssertionError("registered a rank of another node")
    except refit.InvalidArgument as e:
        print("     daemon said:", type(e).__name__, e.message)
        assert "rank 0" in e.message, e
    lay = refit.layout.placements("w", "fp32", [4], [2 * RPN], ["R"])
    try:  # bad JSON is refused by the library before anything is sent
        c.register("bad", "train", '{"tensors": [{"name": "w"}]}', {})
        raise AssertionError("bad layout accepted")
    except refit.InvalidArgument as e:
        assert "layouts" in e.message, e
    try:
        c.register("bad", "train", [lay], {("w", 2 * RPN): np.zeros(4, np.float32)})
        raise AssertionError("memory of the heap accepted")
    except ValueError as e:
        assert "refit.share" in str(e), e
    c.register("late", "infer", [lay], {("w", 2 * RPN): refit.empty([4], "float32", copies=2)},
               instance="z")
    t0 = time.time()
    try:
        c.wait_version(5, 300)
        raise AssertionError("waited for a version nobody publishes")
    except refit.Timeout as e:
        assert isinstance(e, TimeoutError) and e.message, e
    assert time.time() - t0 < 60  # bounded (generous: a busy machine)
    # CUDA events with weights_ready on a host-memory node, too many: refused
    t = refit.Client(CL.sock(2), timeout_ms=20000)
    t.register("evm", "train", [lay], {("w", 2 * RPN): refit.empty([4], "float32")})
    evs = ctypes.create_string_buffer(64 * 17)
    for n, says in ((1, "reads host memory"), (17, "at most 16")):
        refused(lambda: t._call(refit._lib.lib.refit_weights_ready_cuda, t._id(), 1, evs, n,
                                5000), says)
    t.close()
    c.unregister()
    try:
        c.state()
        raise AssertionError("state of an unregistered client")
    except ValueError as e:
        assert "not registered" in str(e), e
    c.close()


class CudaLike:
    """A CUDA tensor as refit.cuda sees one: its storage answers _share_cuda_()
    as torch does, with the handle given."""

    is_cuda = True

    def __init__(self, handle):
        self.handle = handle

    def storage(self):
        return self

    def _share_cuda_(self):
        return (3, self.handle, 4096, 512, b"ref", 0, b"ev", False)

    def storage_offset(self):
        return 10

    def element_size(self):
        return 2


def torch_ipc_handles():
    from refit import cuda
    h = bytes(range(64))
    for given in (h, b"\x02c" + h):   # torch < 2.3; shareIpcHandle's type 'c'
        p = cuda.ipc_piece(CudaLike(given))
        assert p == {"cuda_ipc": h, "cuda_bytes": 512 + 4096, "offset": 512 + 20,
                     "device": 3, "uuid": None}, p   # CPU-only torch: no UUID to give
    for bad, says in ((b"\x02e" + h + b"more", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
                       "False"), (b"\x01c" + h, "version 2"), (h[:10], "10 bytes")):
        try:
            cuda.ipc_piece(CudaLike(bad))
            raise AssertionError(f"handle {bad[:2]!r} of {len(bad)} bytes accepted")
        except ValueError as e:
            assert says in str(e), e


def pip_install():
    """pip install of the tree's package, offline, importable elsewhere."""
    src = f"{TMP}/pysrc"
    shutil.copytree("python", src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                  "__pycache__"))
    r = subprocess.run([PY, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                        "--target", f"{TMP}/site", src], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, PYTHONPATH=f"{TMP}/site", REFIT_LIBRARY=LIB)
    r = subprocess.run([PY, "-c", "import refit, sys; print(refit.__file__); "
                        "print(refit.empty([2], 'float32').shape)"], cwd=TMP, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(f"{TMP}/site/refit/"), r
    r = subprocess.run([PY, "-c", "import refit"], cwd=TMP, capture_output=True, text=True,
                       env=dict(env, REFIT_LIBRARY=f"{TMP}/none.so"))
    assert r.returncode != 0 and "librefit.so not found" in r.stderr, r.stderr


try:
    check("examples: torch trainer (3 versions) -> double-buffered and in-place inference "
          "loops switching between requests, every piece byte for byte", examples)
    check("DTensor-like objects, placement strings and boxes give the C library's layouts",
          dtensor_path)
    check("existing tensors registered by copying once, strides kept (torch .t(), numpy "
          "slices), refit byte for byte", shared_strided)
    check("refit.torch.Publisher in place (no copy at publish); a reader's served copy "
          "(Client.serve) is never overwritten", publisher_and_serve)
    check("a refit refused while its reader serves that copy commits on a retry once "
          "it moved on (receivers relaying; the handshake carries the attempt)",
          retry_after_refusal)
    check("an engine's framework, pause mode and served version shown by refitctl models; "
          "publish(step, wait=...) returns once every instance holds it, a timeout names "
          "the lagging instances", engines_and_wait_installed)
    check("torch's CUDA IPC handles: 64 bytes or shareable type 'c' taken, 'e' refused "
          "naming PYTORCH_CUDA_ALLOC_CONF", torch_ipc_handles)
    check("several clients of one trainer and one instance on a node (a client per "
          "rank): registered once whole, ready once all hold it, overlap refused, a "
          "member replaced", several_clients_per_node)
    check("typed exceptions carry the daemon's and library's messages; bounded waits",
          typed_errors)
    check("pip install of python/ offline; REFIT_LIBRARY; a clear error without the library",
          pip_install)
finally:
    harness.stop_all()
    harness.check_exits()
harness.summary("python")
