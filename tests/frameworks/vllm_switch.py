"""The switch of refit.vllm decided together, without starting an engine:
two of refit.vllm's own worker engines (RefitWeightTransferEngine, on
threads) over two fake nodes, the TP group's all_gather_object a barrier
between the threads, driven by refit.vllm.Engine (a fake vllm.LLM whose
collective_rpc calls every worker) and AsyncEngine (a fake AsyncLLM that
records its pause modes).  Run by test_vllm_refusals.py (the vllmcpu
environment: vLLM's WeightTransferEngine is the base class).

Checks: a version on one node only is never switched to (pull keeps the
old one; update(v) times out naming the worker whose node lacks it, no
worker switched); once the other node has it, both switch together; a
node that installs it during the wait is waited for; AsyncEngine pauses
in its pause mode only around the switch, resumes after a failure too,
and never pauses when the version is not on every node.
"""
import asyncio
import threading
import time
import traceback
from types import SimpleNamespace

import refit.vllm as rv
from refit.errors import Timeout


class Node:
    """What a worker's node has installed (version, active copy)."""

    def __init__(self, version=0, active=0):
        self.version, self.active = version, active
        self.served, self.broken = None, False

    def install(self, version):
        self.version, self.active = version, self.active ^ 1


class FakeClient:
    def __init__(self, node):
        self.node = node

    def state(self):
        n = self.node
        return SimpleNamespace(version=n.version, active=n.active, valid=n.version > 0)

    def wait_version(self, version, timeout_ms):
        if self.node.broken:
            from refit.errors import Unavailable
            raise Unavailable(8, "ERR_UNAVAILABLE", "the node is gone")
        end = time.monotonic() + timeout_ms / 1000
        while self.node.version < version:
            if time.monotonic() >= end:
                raise Timeout(10, "ERR_TIMEOUT", f"version {version} did not come")
            time.sleep(0.005)
        return self.state()

    def serve(self, version):
        self.node.served = version


class Group:
    """all_gather_object across the worker threads."""

    def __init__(self, n):
        self.slots = [None] * n
        self.bar = threading.Barrier(n)

    def all_gather(self, out, obj, rank):
        self.slots[rank] = obj
        self.bar.wait()
        out[:] = list(self.slots)
        self.bar.wait()


class Cluster:
    """Two workers (refit.vllm's worker engine, its switch recorded) over
    two nodes, and collective_rpc over both."""

    def __init__(self, nodes):
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        cls = WeightTransferEngineFactory._registry[rv.BACKEND]()
        self.nodes, self.workers = nodes, []
        self.switched = [[] for _ in nodes]
        for r, n in enumerate(nodes):
            w = cls.__new__(cls)
            w.rank, w.world, w._group = r, len(nodes), r
            w.client, w.error, w.pending, w.serving = FakeClient(n), None, None, (0, None)
            w._switch = self.switched[r].append
            self.workers.append(w)
        self.version = ""
        self.engine = SimpleNamespace(set_weight_version=self._set)

    def _set(self, v):
        self.version = v

    def collective_rpc(self, method, kwargs=None):
        out, errs = [None] * len(self.workers), []

        def one(r, w):
            try:
                if method in ("refit_result", "refit_installed"):
                    out[r] = getattr(rv.WorkerExtension, method)(
                        SimpleNamespace(weight_transfer_engine=w))
                else:
                    out[r] = getattr(w, method)(**(kwargs or {}))
            except Exception as e:  # noqa: BLE001 - raised below
                errs.append(e)
        ths = [threading.Thread(target=one, args=(r, w)) for r, w in enumerate(self.workers)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(30)
        if errs:
            raise errs[0]
        return out


class FakeLLM:
    def __init__(self, cl):
        self.cl, self.llm_engine = cl, cl.engine

    def collective_rpc(self, method, kwargs=None):
        return self.cl.collective_rpc(method, kwargs)


class FakeAsyncLLM:
    def __init__(self, cl):
        self.cl, self.log = cl, []

    async def collective_rpc(self, method, kwargs=None):
        return await asyncio.to_thread(self.cl.collective_rpc, method, kwargs)

    async def pause_generation(self, mode="abort", clear_cache=True):
        self.log.append(("pause", mode))

    async def resume_generation(self):
        self.log.append(("resume",))

    async def update_weight_version(self, v):
        self.cl.version = v


def _engine(cl):
    eng = rv.Engine.__new__(rv.Engine)
    eng.llm, eng.pause_mode, eng.timeout_ms, eng.version, eng.switch_s = \
        FakeLLM(cl), "wait", 5000, 0, []
    return eng


def _patched():
    """all_gather_object through the fake group (the worker's _group is its rank)."""
    real = rv.torch.distributed.all_gather_object
    groups = {}

    def gather(out, obj, group=None):
        groups["g"].all_gather(out, obj, group)
    return real, groups, gather



def sync_engine():
    a, b = Node(1), Node(1)
    cl = Cluster([a, b])
    eng = _engine(cl)
    assert eng.update(1) == 1 and cl.version == "1", cl.version
    assert [len(s) for s in cl.switched] == [1, 1]
    a.install(2)                                   # b's Publish lost
    assert eng.update() == 1, "pulled a version one node lacks"
    try:
        eng.update(2, timeout_ms=300)
        raise AssertionError("update(2) returned with version 2 on one node only")
    except Timeout as e:
        assert "worker 1" in str(e), e
    assert [len(s) for s in cl.switched] == [1, 1] and cl.version == "1", cl.switched
    assert (a.served, b.served) == (1, 1)
    b.install(2)                                   # the Publish resent
    assert eng.update() == 2 and cl.version == "2"
    assert [s[-1] for s in cl.switched] == [a.active, b.active]
    a.install(3)
    threading.Timer(0.2, b.install, (3,)).start()  # b gets it during the wait
    assert eng.update(3, timeout_ms=5000) == 3 and (a.served, b.served) == (3, 3)
    return "a version on one node only: pull keeps 1, update(2) times out naming " \
        "worker 1, nobody switched; both switch once both have it"


def async_engine():
    a, b = Node(1), Node(1)
    cl = Cluster([a, b])
    e = FakeAsyncLLM(cl)

    async def go():
        eng = rv.AsyncEngine.__new__(rv.AsyncEngine)
        eng.engine, eng.pause_mode, eng.timeout_ms, eng.version, eng.switch_s = \
            e, "keep", 5000, 0, []
        assert await eng.update(1) == 1
        assert e.log == [("pause", "keep"), ("resume",)], e.log
        a.install(2)
        try:
            await eng.update(2, timeout_ms=200)
            raise AssertionError("update(2) returned with version 2 on one node only")
        except Timeout as ex:
            assert "[2, 1]" in str(ex) and "worker 1" in str(ex), ex
        assert len(e.log) == 2, f"paused for a version not on every node: {e.log}"
        eng.pause_mode = "abort"
        b.install(2)
        assert await eng.update(2) == 2 and cl.version == "2"
        assert e.log[2:] == [("pause", "abort"), ("resume",)], e.log
        # a switch that fails resumes generation all the same
        eng.pause_mode = "wait"
        a.install(3)
        b.install(3)
        b.broken = True                  # worker 1's node gone mid-session
        try:
            await eng.update(3)
            raise AssertionError("a failed switch returned")
        except Exception as ex:  # noqa: BLE001 - any failure: the resume matters
            assert "gone" in str(ex), ex
        assert e.log[4:] == [("pause", "wait"), ("resume",)], e.log
        assert cl.version == "2" and a.served == 2
    asyncio.run(go())
    return "pauses in its mode (keep, abort) only around the switch, not for a " \
        "version missing on a node, and resumes after a failed switch"


def run(counts):
    real, groups, gather = _patched()
    rv.torch.distributed.all_gather_object = gather
    try:
        for name, fn in (("the switch is decided together (Engine, two nodes)", sync_engine),
                         ("AsyncEngine pauses only around the switch", async_engine)):
            groups["g"] = Group(2)
            try:
                what = fn()
                counts["passed"] += 1
                print(f"ok   {name}: {what}")
            except Exception:  # noqa: BLE001
                counts["failed"] += 1
                print(f"FAIL {name}")
                traceback.print_exc()
    finally:
        rv.torch.distributed.all_gather_object = real
