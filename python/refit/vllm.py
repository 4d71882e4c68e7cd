"""refit for vLLM: a vLLM engine's own parameters receive refits, through
vLLM's weight-transfer interface (docs/vllm.md).

    import refit.vllm
    llm = vllm.LLM(model=DIR, tensor_parallel_size=2, **refit.vllm.engine_args())
    eng = refit.vllm.Engine(llm, socket="/run/refitd/local.sock", model="llama",
                            instance="serve-a", base_rank=8)
    ...
    eng.update(version)          # the engine serves `version` (or newer) now
    eng.update()                 # pull: the newest version every worker's node installed

An AsyncLLM (what `vllm serve` runs): `eng = await AsyncEngine.create(engine,
...)` with the same arguments, and vLLM's pause modes (keep / wait / abort)
for the switch: `await eng.update(version)`.

Importing this module registers the "refit" backend with vLLM's
WeightTransferEngineFactory; engine_args() names it and this module as the
worker extension, so every worker process imports it too.

At init (Engine(...), vLLM's init_weight_transfer_engine) every worker
lays its own parameters out as vLLM holds them (refit.frameworks, the C
rules of plan/framework.c), in two copies in one segment of memory, and
registers its rank of the instance (a double buffer) with its own node --
the refitd on its host, or the socket named for its rank: one engine's
workers may be served by several nodes.  A refit writes the copy the
engine does not serve while it serves; update() switches every worker to
the new copy together, between two engine steps (vLLM's
start/update/finish_weight_update collective): each worker asks its own
node which version it installed, the workers gather the answers (a
collective of the TP group) and switch only to a version every worker's
node installed -- a version committed everywhere but published on some
nodes only (a Publish lost on the way, resent until acknowledged) is
served later, never on some workers only.  Each worker then tells its node
which copy is served (Client.serve: no refit writes it until the next
switch), reruns the engine's own post-processing of those weights (vLLM's
process_weights_after_loading: the CPU backend packs its GEMM weights), and
the driver sets the engine's weight_version.  Worker 0 names the engine to
its node (Client.describe: "vllm", vLLM's version, the pause mode) and
every switch the version served (Client.serve): `refitctl models` shows
both.

Refused at init, naming what: CUDA workers (the CUDA IPC path is not done
here yet), quantized engines, pipeline or data parallelism inside the
engine, a parameter the framework map does not describe (or the other way
round).
"""
import logging
import os
import time
from dataclasses import dataclass

import torch

from . import client as _client
from . import frameworks as _fw

BACKEND = "refit"
PAUSE_MODES = ("keep", "wait", "abort")   # vLLM's (pause_generation)
logger = logging.getLogger(__name__)
_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def engine_args():
    """The vllm.LLM / EngineArgs keywords that select this integration."""
    return {"weight_transfer_config": {"backend": BACKEND},
            "worker_extension_cls": "refit.vllm.WorkerExtension"}


class Engine:
    """The driver's side: one vLLM engine (vllm.LLM made with engine_args())
    registered as inference instance `instance` of refit model `model`:
    each worker with the node whose local socket is `socket` on its host
    (or socket[r] for TP rank r: a list, one per rank); TP rank r is global rank
    base_rank + r of the model's inference layouts.  source_dtype: the
    trainer's dtype when it is not the engine's ("fp32": refit converts on
    the way, docs/conversion.md)."""

    def __init__(self, llm, socket, model, instance, base_rank=0, timeout_ms=60000,
                 source_dtype=None, pause_mode="wait"):
        _check_pause(pause_mode)
        if pause_mode != "wait":
            raise ValueError(f"refit.vllm: pause mode {pause_mode!r} needs an AsyncLLM "
                             "(pause_generation: refit.vllm.AsyncEngine); a vllm.LLM "
                             "switches between generate() calls, where every request in "
                             "flight finished: \"wait\"")
        self.pause_mode = pause_mode
        self.llm = llm
        self.model, self.instance = model, instance
        self.timeout_ms = int(timeout_ms)
        self.version = 0
        self.switch_s = []  # seconds of each switch (the engine's own share)
        llm.collective_rpc("init_weight_transfer_engine", kwargs=_init_kwargs(
            socket, model, instance, base_rank, self.timeout_ms, source_dtype, pause_mode))

    def installed(self):
        """The version every worker's node has installed for this engine
        (the lowest; 0: none)."""
        return min(v or 0 for v in self.llm.collective_rpc("refit_installed"))

    def update(self, version=None, timeout_ms=None):
        """Serve `version` or newer: wait (at most timeout_ms) until every
        worker's node installed it, then switch every worker to it.
        version None: the newest installed on every worker's node, without
        waiting (an idle engine pulling; a version some nodes lack is not
        served yet).  Returns
        the version served; raises refit.Timeout when it did not come (the
        engine keeps serving what it served).  Call it between generate()
        calls (an AsyncLLM: inside pause_generation / resume_generation)."""
        t = self.timeout_ms if timeout_ms is None else int(timeout_ms)
        want = 0 if version is None else int(version)
        if version is not None and want <= self.version:
            return self.version
        t0 = time.monotonic()
        # a worker never raises here (an error inside a collective_rpc leaves
        # the other workers' answers queued): it records the failure, the
        # session ends normally without a switch, and the driver raises
        self.llm.collective_rpc("start_weight_update")
        self.llm.collective_rpc("update_weights", kwargs={"update_info": {
            "version": want, "timeout_ms": t}})
        self.llm.collective_rpc("finish_weight_update")
        got = _served(self.llm.collective_rpc("refit_result"))
        if got != self.version:
            self.llm.llm_engine.set_weight_version(str(got))
        self.version = got
        self.switch_s.append(time.monotonic() - t0)
        return got


class AsyncEngine:
    """The driver's side for a vLLM AsyncLLM (what `vllm serve` runs), made
    with engine_args(): `eng = await AsyncEngine.create(async_llm, ...)`
    (the arguments of Engine).  update() waits for the version while the
    engine generates (it asks every worker's node, a collective that does
    not block), then pauses generation in the engine's pause mode -- vLLM's
    pause_generation: "wait" lets the requests in flight finish first,
    "abort" aborts them (they end with finish_reason "abort"), "keep"
    freezes them and resume_generation continues them, their next tokens
    computed with the new weights -- switches every worker, sets the
    engine's weight_version and resumes."""

    @classmethod
    async def create(cls, engine, socket, model, instance, base_rank=0, timeout_ms=60000,
                     source_dtype=None, pause_mode="wait"):
        _check_pause(pause_mode)
        self = cls.__new__(cls)
        self.engine, self.pause_mode = engine, pause_mode
        self.model, self.instance = model, instance
        self.timeout_ms = int(timeout_ms)
        self.version = 0
        self.switch_s = []   # seconds each switch paused generation
        await engine.collective_rpc("init_weight_transfer_engine", kwargs=_init_kwargs(
            socket, model, instance, base_rank, self.timeout_ms, source_dtype, pause_mode))
        return self

    async def installed(self):
        """What every worker's node installed (a list, one per TP rank)."""
        return [v or 0 for v in await self.engine.collective_rpc("refit_installed")]

    async def update(self, version=None, timeout_ms=None):
        """Engine.update, generation paused only for the switch itself."""
        import asyncio
        t = self.timeout_ms if timeout_ms is None else int(timeout_ms)
        want = 0 if version is None else int(version)
        if version is not None and want <= self.version:
            return self.version
        end = time.monotonic() + t / 1000
        while want:
            have = await self.installed()
            if min(have) >= want:
                break
            if time.monotonic() >= end:
                from .errors import Timeout
                lack = [i for i, v in enumerate(have) if v < want]
                raise Timeout(10, "ERR_TIMEOUT", f"refit.vllm: version {want} is not "
                              f"installed on every worker's node in {t} ms (installed: "
                              f"{have}; the node of worker {lack[0]} lacks it); the engine "
                              f"serves {self.version}")
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await self.engine.pause_generation(mode=self.pause_mode)
        try:
            e = self.engine
            await e.collective_rpc("start_weight_update")
            await e.collective_rpc("update_weights", kwargs={"update_info": {
                "version": want, "timeout_ms": max(1, int((end - time.monotonic()) * 1000))}})
            await e.collective_rpc("finish_weight_update")
            got = _served(await e.collective_rpc("refit_result"))
            if got != self.version:
                await e.update_weight_version(str(got))
        finally:
            await self.engine.resume_generation()
        self.version = got
        self.switch_s.append(time.monotonic() - t0)
        return got


def _check_pause(mode):
    if mode not in PAUSE_MODES:
        raise ValueError(f"refit.vllm: pause mode {mode!r}: one of {', '.join(PAUSE_MODES)}")


def _init_kwargs(socket, model, instance, base_rank, timeout_ms, source_dtype, pause_mode):
    return {"init_info": {
        "socket": [str(x) for x in socket] if isinstance(socket, (list, tuple))
        else str(socket), "model": model, "instance": instance,
        "base_rank": int(base_rank), "timeout_ms": int(timeout_ms),
        "source_dtype": source_dtype or "", "pause_mode": pause_mode}}


def _served(res):
    """The version every worker serves after a session (raises what failed)."""
    got, err = res[0]
    if err is not None:
        raise _error(err)
    if any(r[0] != got for r in res):  # a bug: never shown to requests
        raise RuntimeError(f"refit.vllm: workers serve versions {[r[0] for r in res]}")
    return got


def _error(err):
    """The exception worker 0 met, raised again here (its refit type)."""
    status, code, msg = err
    if status:
        from .errors import _BY_STATUS, RefitError
        return _BY_STATUS.get(status, RefitError)(status, code, msg)
    return RuntimeError(f"refit.vllm: {msg}")


@dataclass
class RefitInitInfo:
    socket: str
    model: str
    instance: str
    base_rank: int = 0
    timeout_ms: int = 60000
    source_dtype: str = ""   # the trainer's dtype when it differs (fp32: converted)
    pause_mode: str = "wait"  # shown to operators (refitctl models)


@dataclass
class RefitUpdateInfo:
    version: int = 0
    timeout_ms: int = 60000


def _torch_view(arr, dtype):
    t = torch.from_numpy(arr)
    return t.view(_TORCH[dtype]) if dtype in ("bf16",) else t


def _socket_of(sock, rank, world):
    """The local socket of TP rank `rank`'s node: one path (every worker's
    host runs a node there) or a list, one per rank."""
    if isinstance(sock, (list, tuple)):
        if len(sock) != world:
            raise ValueError(f"refit.vllm: {len(sock)} sockets for {world} workers: one "
                             "per tensor-parallel rank, or one path for all")
        return str(sock[rank])
    return str(sock)


def _make_engine_class():
    from vllm.distributed import parallel_state as ps
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    class RefitWeightTransferEngine(WeightTransferEngine):
        """The worker's side (see the module's text)."""
        init_info_cls = RefitInitInfo
        update_info_cls = RefitUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, info):
            self._check_config()
            tp = ps.get_tp_group()
            self.rank, self.world = tp.rank_in_group, tp.world_size
            self._group = tp.cpu_group
            cfg = os.path.join(self.model_config.model, "config.json")
            self.map = _fw.framework_map("vllm", cfg, f"tp{self.world}")
            self.client = None
            self.error = None
            self.pending = None   # (version, copy) between update and finish
            self.serving = (0, None)
            sock = _socket_of(info.socket, self.rank, self.world)
            # every worker registers its own rank of the instance with the
            # node of its host (or the socket named for its rank): the
            # workers of one engine may be served by several nodes
            params = _fw.allocate(self.map, ranks=[self.rank], copies=2)
            lays = _fw.layouts(self.map, base=info.base_rank)  # the whole instance
            for lay in lays:
                if info.source_dtype and lay["dtype"] != info.source_dtype:
                    lay["convert"] = {"from": info.source_dtype}
            cl = _client.Client(sock, timeout_ms=info.timeout_ms)
            cl.register(info.model, "infer", lays,
                        _fw.pieces(self.map, params, base=info.base_rank),
                        instance=info.instance, install="double-buffer")
            if self.rank == 0:
                import vllm
                cl.describe("vllm", getattr(vllm, "__version__", ""), info.pause_mode)
            self.client = cl
            self.params = params
            self._bind()

        def _check_config(self):
            mc, pc = self.model_config, self.parallel_config
            if self.device.type != "cpu":
                raise RuntimeError(f"refit.vllm: workers on {self.device.type} are not "
                                   "supported yet (the CUDA IPC registration of engine "
                                   "parameters is not done); CPU workers only")
            if getattr(mc, "quantization", None):
                raise RuntimeError(f"refit.vllm: quantization {mc.quantization!r} is not "
                                   "supported: refit would leave the engine's quantized "
                                   "weights stale")
            if pc.pipeline_parallel_size != 1 or pc.data_parallel_size != 1:
                raise RuntimeError("refit.vllm: pipeline / data parallelism inside one engine "
                                   "is not supported (register each engine as an instance)")

        def _bind(self):
            """Check this worker's parameters against the map; keep, per
            parameter, its module, name and the two copies as tensors."""
            ent = next(r for r in self.map["ranks"] if r["rank"] == self.rank)
            model = self.model
            named = dict(model.named_parameters())
            self.binds = []
            mapped = set()
            for p in ent["params"]:
                modname, _, pname = p["name"].rpartition(".")
                try:
                    mod = model.get_submodule(modname)
                except AttributeError:
                    raise RuntimeError(f"refit.vllm: the map names {p['name']}, which this "
                                       "engine's model does not have") from None
                cur = mod._parameters.get(pname)
                if cur is None:
                    raise RuntimeError(f"refit.vllm: the map names {p['name']}, which this "
                                       "engine's model does not have")
                pair = self.params[(self.rank, p["name"])]
                ts = tuple(_torch_view(a, p["dtype"]) for a in pair)
                if cur.numel() and (tuple(cur.shape) != tuple(ts[0].shape) or
                                    cur.dtype != ts[0].dtype):
                    raise RuntimeError(f"refit.vllm: parameter {p['name']}: the engine holds "
                                       f"{tuple(cur.shape)} {cur.dtype}, the map says "
                                       f"{tuple(ts[0].shape)} {ts[0].dtype}")
                self.binds.append((mod, pname, ts))
                mapped.add(p["name"])
            extra = sorted(n for n, t in named.items() if n not in mapped and t.numel())
            if extra:
                raise RuntimeError("refit.vllm: the engine has parameters the framework map "
                                   f"does not describe: {', '.join(extra[:5])}")

        # vLLM's session: start, update (wait for the version), finish (switch)
        def start_weight_update(self):
            self.pending = None

        def update_weights(self, update_info):
            info = self.parse_update_info(update_info)
            self.receive_weights(info)

        def receive_weights(self, info):
            """The workers agree on a version every one's node installed
            (each asks its own node, then all gather): a version installed
            on some nodes only (a Publish lost on one) is not switched to."""
            deadline = time.monotonic() + info.timeout_ms / 1000
            want = int(info.version)
            self.pending = None
            while True:
                mine = self._installed(want, deadline)
                alls = [None] * self.world
                torch.distributed.all_gather_object(alls, mine, group=self._group)
                err = next((a[2] for a in alls if a[2] is not None), None)
                vers = sorted({a[0] for a in alls})
                if err is None and len(vers) > 1 and want and time.monotonic() < deadline:
                    want = vers[-1]   # one node is ahead: wait for it on all
                    continue
                break
            self.error = err
            if err is not None or len(vers) != 1:
                return  # a version not on every node yet: keep serving
            try:   # no refit writes this copy until the next switch
                self.client.serve(vers[0])
            except Exception as e:  # noqa: BLE001 - the copy is the active one:
                # no refit writes it either; the node shows the old version
                logger.warning("refit.vllm: worker %d: Serve %d: %s", self.rank, vers[0], e)
            self.pending = (vers[0], mine[1])

        def _installed(self, want, deadline):
            """(version, active copy, failure) of this worker's node."""
            try:
                if want:
                    left = max(1, int((deadline - time.monotonic()) * 1000))
                    st = self.client.wait_version(want, left)
                else:
                    st = self.client.state()
                    if st.version == 0 or not st.valid:
                        if self.serving[0]:
                            return (self.serving[0], self.serving[1], None)
                        raise RuntimeError("no version is installed here yet")
                return (st.version, st.active, None)
            except Exception as e:  # noqa: BLE001 - told to every worker
                return (0, 0, (getattr(e, "status", 0), getattr(e, "code", ""),
                               f"worker {self.rank}: " + getattr(e, "message", str(e))))

        def finish_weight_update(self):
            if self.pending is None:
                return
            version, copy = self.pending
            self.pending = None
            if self.serving == (version, copy):
                return
            self._switch(copy)
            self.serving = (version, copy)

        def _switch(self, copy):
            mods = []
            with torch.no_grad():
                for mod, pname, ts in self.binds:
                    mod._parameters[pname] = torch.nn.Parameter(ts[copy], requires_grad=False)
                    if not mods or mods[-1] is not mod:
                        mods.append(mod)
                for mod in dict.fromkeys(mods):
                    qm = getattr(mod, "quant_method", None)
                    if qm is not None and hasattr(qm, "process_weights_after_loading"):
                        qm.process_weights_after_loading(mod)
                # the engine's packing may drop the raw weight (CPU GEMMs):
                # put it back, so that the parameters stay readable
                for mod, pname, ts in self.binds:
                    cur = mod._parameters.get(pname)
                    if cur is None or cur.numel() == 0:
                        mod._parameters[pname] = torch.nn.Parameter(ts[copy],
                                                                    requires_grad=False)

        def shutdown(self):
            if self.client is not None:
                self.client.close()
                self.client = None

    return RefitWeightTransferEngine


def _register_backend():
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:  # no vLLM here, or one without the interface
        return
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _make_engine_class())


_register_backend()


class WorkerExtension:
    """Mixed into vLLM's workers (worker_extension_cls): importing this
    module registered the backend; these are the driver's extra calls."""

    def refit_installed(self):
        e = self.weight_transfer_engine
        return e.client.state().version if e.client is not None else None

    def refit_result(self):
        """(the version served, the last update's failure or None)."""
        e = self.weight_transfer_engine
        return e.serving[0], e.error
