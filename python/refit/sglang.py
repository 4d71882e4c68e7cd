"""refit for SGLang: an SGLang engine's own parameters receive refits,
through SGLang's weight-update session (begin_weight_update,
update_weights_from_tensor with a custom weight loader, end_weight_update).

    import sglang, refit.sglang
    llm = sglang.Engine(model_path=DIR, device="cpu", tp_size=2,
                        **refit.sglang.engine_args())
    eng = refit.sglang.Engine(llm, socket="/run/refitd/local.sock", model="llama",
                              instance="serve-a", base_rank=8)
    ...
    eng.update(version)          # the engine serves `version` (or newer) now
    eng.update()                 # pull: the newest version every rank's node installed

engine_args() names this module's loader (LOADER) as one of SGLang's
custom weight loaders (--custom-weight-loader); every call of the driver
is one SGLang weight-update session whose update_weights_from_tensor
carries a command (a JSON text in the tensor's name) to that loader, which
SGLang runs in every TP rank's scheduler process with the rank's model.

At init (Engine(...)) every rank lays its own parameters out as SGLang
holds them (refit.frameworks' "sglang" map, the C rules of
plan/framework.c), in two copies in one segment of memory, and registers
its rank of the instance (a double buffer) with its own node -- the refitd
on its host, or the socket named for its rank.  The engine keeps serving
the checkpoint it started from: the loader reloads it through SGLang's own
model.load_weights into plain tensors (the session ends with SGLang's
post-processing, which repacks every weight: the CPU engine's AMX GEMMs
hold their weights packed, and what was packed cannot be packed again).

update() is one session: every rank asks its own node which version it
installed (waiting for `version`), the ranks gather the answers over the TP
group and switch only to a version every rank's node installed; each rank
tells its node which copy it serves (Client.serve: no refit writes it
until the next switch) and binds its module parameters to that copy (the
parameters SGLang runs on are refit's memory; the end of the session
reruns SGLang's post-processing -- process_weights_after_loading, the AMX
packing of the CPU engine -- from them); SGLang flushes its prefix cache,
and the driver sets the engine's weight_version.  Rank 0 names the engine
to its node (Client.describe: "sglang", SGLang's version, pause mode
"wait": sglang.Engine's calls do not overlap its generate calls) and every
switch the version served: `refitctl models` shows both.

Refused at init, naming what: devices other than the CPU (the CUDA IPC
registration of engine parameters is not done here), quantization,
pipeline or data parallelism inside the engine, DP attention, speculative
decoding (the draft model's weights would stay stale), an engine started
without engine_args(), a model directory without safetensors, a parameter
the framework map does not describe (or the other way round), another
shape or dtype.
"""
import glob
import json
import logging
import os
import tempfile
import time

import torch

from . import client as _client
from . import frameworks as _fw

LOADER = "refit.sglang.load"
_CMD = "refit.sglang:"
logger = logging.getLogger(__name__)
_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_WORKERS = {}   # id(model) -> _Worker, in each scheduler process


def engine_args():
    """The sglang.Engine / ServerArgs keywords that select this integration."""
    return {"custom_weight_loader": [LOADER]}


def check_server_args(sa):
    """Refuse, naming it, an engine configuration refit cannot serve exactly."""
    def get(k, d=None):
        return getattr(sa, k, d)
    if LOADER not in (get("custom_weight_loader") or []):
        raise ValueError("refit.sglang: the engine was started without "
                         f"custom_weight_loader=[{LOADER!r}] (refit.sglang.engine_args())")
    dev = str(get("device") or "")
    if dev != "cpu":
        raise ValueError(f"refit.sglang: device {dev or 'auto'!r} is not supported yet (the "
                         "CUDA IPC registration of engine parameters is not done); "
                         "device=\"cpu\" only")
    if get("quantization"):
        raise ValueError(f"refit.sglang: quantization {get('quantization')!r} is not "
                         "supported: refit would leave the engine's quantized weights stale")
    if (get("pp_size", 1) or 1) != 1 or (get("dp_size", 1) or 1) != 1:
        raise ValueError("refit.sglang: pipeline / data parallelism inside one engine is not "
                         "supported (register each engine as an instance)")
    if get("enable_dp_attention"):
        raise ValueError("refit.sglang: DP attention is not supported")
    if get("speculative_algorithm"):
        raise ValueError(f"refit.sglang: speculative decoding "
                         f"({get('speculative_algorithm')}) is not supported: the draft "
                         "model's weights would stay stale")
    mdir = str(get("model_path") or "")
    if not glob.glob(os.path.join(mdir, "*.safetensors")):
        raise ValueError(f"refit.sglang: {mdir!r} holds no *.safetensors (the engine's "
                         "checkpoint is reloaded from them at init)")


class Engine:
    """The driver's side: one sglang.Engine (made with engine_args())
    registered as inference instance `instance` of refit model `model`:
    each TP rank with the node whose local socket is `socket` on its host
    (or socket[r] for TP rank r: a list, one per rank); TP rank r is global
    rank base_rank + r of the model's inference layouts.  source_dtype: the
    trainer's dtype when it is not the engine's ("fp32": refit converts on
    the way, docs/conversion.md)."""

    def __init__(self, engine, socket, model, instance, base_rank=0, timeout_ms=60000,
                 source_dtype=None):
        sa = engine.server_args
        check_server_args(sa)
        self.engine = engine
        self.model, self.instance = model, instance
        self.timeout_ms = int(timeout_ms)
        self.version = 0
        self.switch_s = []   # seconds of each update session (the engine's own share)
        self.tp = int(getattr(sa, "tp_size", 1) or 1)
        self._dir = tempfile.mkdtemp(prefix="refit-sglang-")
        import sglang
        res = self._session("init", {
            "socket": [str(x) for x in socket] if isinstance(socket, (list, tuple))
            else str(socket), "model": model, "instance": instance,
            "base_rank": int(base_rank), "timeout_ms": self.timeout_ms,
            "source_dtype": source_dtype or "", "model_path": str(sa.model_path),
            "sglang": getattr(sglang, "__version__", "")})
        if res.get("error"):
            raise _error(res["error"])

    def update(self, version=None, timeout_ms=None):
        """Serve `version` or newer: wait (at most timeout_ms) until every
        rank's node installed it, then switch every rank to it.  version
        None: the newest installed on every rank's node, without waiting.
        Returns the version served; raises refit.Timeout when it did not
        come (the engine keeps serving what it served).  Call it between
        generate() calls."""
        t = self.timeout_ms if timeout_ms is None else int(timeout_ms)
        want = 0 if version is None else int(version)
        if version is not None and want <= self.version:
            return self.version
        t0 = time.monotonic()
        res = self._session("update", {"version": want, "timeout_ms": t})
        got = int(res.get("version", self.version))
        if got != self.version:
            self._set_weight_version(str(got))
        self.version = got
        self.switch_s.append(time.monotonic() - t0)
        if res.get("error"):
            raise _error(res["error"])
        return got

    def _session(self, op, args):
        """One SGLang weight-update session carrying command `op` to the
        loader on every rank; rank 0's answer (a JSON file)."""
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer
        out = os.path.join(self._dir, f"{op}-{time.monotonic_ns()}.json")
        cmd = json.dumps({"op": op, "args": args, "out": out})
        payload = [(_CMD + cmd, torch.zeros(1))]
        e = self.engine
        ok, msg = _ok(e.begin_weight_update())
        if not ok:
            raise RuntimeError(f"refit.sglang: begin_weight_update: {msg}")
        try:
            obj = UpdateWeightsFromTensorReqInput(
                serialized_named_tensors=[MultiprocessingSerializer.serialize(payload)
                                          for _ in range(self.tp)],
                load_format=LOADER, flush_cache=True)
            ok, msg = e.loop.run_until_complete(
                e.tokenizer_manager.update_weights_from_tensor(obj, None))
        finally:
            end_ok, end_msg = _ok(e.end_weight_update())
        if not ok:
            raise RuntimeError(f"refit.sglang: update_weights_from_tensor ({op}): {msg}")
        if not end_ok:
            raise RuntimeError(f"refit.sglang: end_weight_update: {end_msg}")
        try:
            with open(out) as f:
                return json.load(f)
        except OSError as err:
            raise RuntimeError(f"refit.sglang: rank 0 left no answer to {op} ({err})") from None
        finally:
            try:
                os.unlink(out)
            except OSError:
                pass

    def _set_weight_version(self, v):
        from sglang.srt.managers.io_struct import UpdateWeightVersionReqInput
        e = self.engine
        e.loop.run_until_complete(e.tokenizer_manager.update_weight_version(
            UpdateWeightVersionReqInput(new_version=v, abort_all_requests=False)))


def _ok(res):
    if isinstance(res, tuple):
        return bool(res[0]), str(res[1]) if len(res) > 1 else ""
    return bool(res), ""


def _error(err):
    status, code, msg = err
    if status:
        from .errors import _BY_STATUS, RefitError
        return _BY_STATUS.get(status, RefitError)(status, code, msg)
    return RuntimeError(f"refit.sglang: {msg}")


def _torch_view(arr, dtype):
    t = torch.from_numpy(arr)
    return t.view(_TORCH[dtype]) if dtype == "bf16" else t


def _socket_of(sock, rank, world):
    if isinstance(sock, (list, tuple)):
        if len(sock) != world:
            raise ValueError(f"refit.sglang: {len(sock)} sockets for {world} TP ranks: one "
                             "per tensor-parallel rank, or one path for all")
        return str(sock[rank])
    return str(sock)


def load(model, named_tensors):
    """SGLang's custom weight loader (update_weights_from_tensor with
    load_format=LOADER), in every TP rank: runs the driver's command.  It
    never raises (the scheduler would die, and the other ranks wait in the
    collective): a failure is told to every rank and answered to the
    driver."""
    for name, _ in named_tensors:
        if not name.startswith(_CMD):
            continue
        cmd = json.loads(name[len(_CMD):])
        w = _WORKERS.get(id(model))
        if cmd["op"] == "init":
            w = _Worker(model)
            _WORKERS[id(model)] = w
            res = w.init(cmd["args"])
        elif w is None:
            res = {"error": (0, "", "the engine is not registered (refit.sglang.Engine)")}
        else:
            res = w.update(cmd["args"])
        if w is None or w.rank == 0:
            tmp = cmd["out"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(res, f)
            os.replace(tmp, cmd["out"])


class _Worker:
    """One TP rank's side (see the module's text)."""

    def __init__(self, model):
        from sglang.srt.runtime_context import get_parallel
        par = get_parallel()
        self.model = model
        self.rank, self.world = int(par.tp_rank), int(par.tp_size)
        self.group = par.tp_group.cpu_group
        self.client = None
        self.serving = (0, None)   # (version, copy); copy None: the checkpoint
        self.disk = None           # the checkpoint's tensors while they are served

    def _agree(self, mine):
        alls = [None] * self.world
        torch.distributed.all_gather_object(alls, mine, group=self.group)
        return alls

    def init(self, a):
        try:
            self._init(a)
            err = None
        except Exception as e:  # noqa: BLE001 - told to every rank
            err = (getattr(e, "status", 0), getattr(e, "code", ""),
                   f"rank {self.rank}: " + getattr(e, "message", str(e)))
        alls = self._agree(err)
        err = next((x for x in alls if x is not None), None)
        if err is not None and self.client is not None:
            self.client.close()
            self.client = None
        self._rebind()   # SGLang repacks every weight at the session's end
        return {"error": err, "version": 0}

    def _init(self, a):
        cfg = os.path.join(a["model_path"], "config.json")
        self.map = _fw.framework_map("sglang", cfg, f"tp{self.world}")
        self.params = _fw.allocate(self.map, ranks=[self.rank], copies=2)
        self._bind()
        self._reload(a["model_path"])
        lays = _fw.layouts(self.map, base=a["base_rank"])
        for lay in lays:
            if a["source_dtype"] and lay["dtype"] != a["source_dtype"]:
                lay["convert"] = {"from": a["source_dtype"]}
        cl = _client.Client(_socket_of(a["socket"], self.rank, self.world),
                            timeout_ms=a["timeout_ms"])
        try:
            cl.register(a["model"], "infer", lays,
                        _fw.pieces(self.map, self.params, base=a["base_rank"]),
                        instance=a["instance"], install="double-buffer")
            if self.rank == 0:
                cl.describe("sglang", a["sglang"], "wait")
        except Exception:
            cl.close()
            raise
        self.client = cl

    def _bind(self):
        """Check this rank's parameters against the map; keep, per
        parameter, its module, name and the two copies as tensors."""
        ent = next(r for r in self.map["ranks"] if r["rank"] == self.rank)
        named = dict(self.model.named_parameters())
        self.binds = []
        mapped = set()
        for p in ent["params"]:
            modname, _, pname = p["name"].rpartition(".")
            try:
                mod = self.model.get_submodule(modname)
            except AttributeError:
                mod = None
            cur = None if mod is None else mod._parameters.get(pname)
            if cur is None:
                raise RuntimeError(f"refit.sglang: the map names {p['name']}, which this "
                                   "engine's model does not have")
            ts = tuple(_torch_view(x, p["dtype"]) for x in self.params[(self.rank, p["name"])])
            packed = bool(getattr(mod, "use_intel_amx_backend", False))
            same = (cur.numel() == ts[0].numel() if packed
                    else tuple(cur.shape) == tuple(ts[0].shape))
            if not same or cur.dtype != ts[0].dtype:
                raise RuntimeError(f"refit.sglang: parameter {p['name']}: the engine holds "
                                   f"{tuple(cur.shape)} {cur.dtype}, the map says "
                                   f"{tuple(ts[0].shape)} {ts[0].dtype}")
            self.binds.append((mod, pname, ts))
            mapped.add(p["name"])
        extra = sorted(n for n, t in named.items() if n not in mapped and t.numel())
        if extra:
            raise RuntimeError("refit.sglang: the engine has parameters the framework map "
                               f"does not describe: {', '.join(extra[:5])}")

    def _reload(self, mdir):
        """The checkpoint the engine started from, through SGLang's own
        load_weights, into plain tensors the engine serves until the first
        switch (its packed weights cannot be unpacked)."""
        from safetensors.torch import load_file
        self.disk = [torch.empty_like(ts[0]) for _, _, ts in self.binds]
        self._set(self.disk)
        for f in sorted(glob.glob(os.path.join(mdir, "*.safetensors"))):
            self.model.load_weights(list(load_file(f).items()))

    def _set(self, tensors):
        with torch.no_grad():
            for (mod, pname, _), t in zip(self.binds, tensors):
                old = mod._parameters[pname]
                new = torch.nn.Parameter(t, requires_grad=False)
                new.__dict__ = old.__dict__   # SGLang's weight_loader and its attributes
                mod._parameters[pname] = new

    def _rebind(self):
        """Bind every parameter to what this rank serves (raw, unpacked)."""
        if not getattr(self, "binds", None):
            return
        c = self.serving[1]
        self._set(self.disk if c is None else [ts[c] for _, _, ts in self.binds])

    def update(self, a):
        deadline = time.monotonic() + a["timeout_ms"] / 1000
        want = int(a["version"])
        while True:
            mine = self._installed(want, deadline)
            alls = self._agree(mine)
            err = next((x[2] for x in alls if x[2] is not None), None)
            vers = sorted({x[0] for x in alls})
            if err is None and len(vers) > 1 and want and time.monotonic() < deadline:
                want = vers[-1]   # one node is ahead: wait for it on all
                continue
            break
        if err is None and len(vers) == 1 and vers[0] and \
                self.serving != (vers[0], mine[1]):
            try:   # no refit writes this copy until the next switch
                self.client.serve(vers[0])
            except Exception as e:  # noqa: BLE001 - the copy is the active one
                logger.warning("refit.sglang: rank %d: Serve %d: %s", self.rank, vers[0], e)
            self.serving = (vers[0], mine[1])
            self.disk = None
        elif err is None and len(vers) > 1:
            err = (10, "ERR_TIMEOUT", f"version {max(vers)} is not installed on every "
                   f"rank's node (installed: {[x[0] for x in alls]}); the engine serves "
                   f"{self.serving[0]}")
        self._rebind()
        return {"version": self.serving[0], "error": err}

    def _installed(self, want, deadline):
        """(version, active copy, failure) of this rank's node."""
        try:
            if want:
                left = max(1, int((deadline - time.monotonic()) * 1000))
                st = self.client.wait_version(want, left)
            else:
                st = self.client.state()
                if st.version == 0 or not st.valid:
                    return (self.serving[0], self.serving[1], None)
            return (st.version, st.active, None)
        except Exception as e:  # noqa: BLE001 - told to every rank
            return (0, 0, (getattr(e, "status", 0), getattr(e, "code", ""),
                           f"rank {self.rank}: " + getattr(e, "message", str(e))))
