"""Client: one registration with the node daemon (librefit's refit_t)."""
import ctypes
import threading
from dataclasses import dataclass

from . import _lib
from . import cuda as _cuda
from . import layout as _layout
from . import memory as _memory

_ROLES = {"train": _lib.ROLE_TRAIN, "trainer": _lib.ROLE_TRAIN, "infer": _lib.ROLE_INFER,
          "inference": _lib.ROLE_INFER}
_INSTALLS = {"double-buffer": _lib.INSTALL_DOUBLE_BUFFER, "in-place": _lib.INSTALL_IN_PLACE}


@dataclass
class State:
    """refit_state_t: version (trainer: ready; inference: installed), active
    (double buffer: the copy 0/1 holding it), valid, reading, failure."""
    version: int
    active: int
    valid: bool
    reading: bool
    failure: str


class Client:
    """A connection to the node daemon at socket (its local socket), one
    registration at a time.  Every call is bounded: timeout_ms here is the
    default of the calls that wait; an error raises a refit.RefitError
    subclass carrying the daemon's message.  Thread-safe (calls are
    serialised)."""

    def __init__(self, socket, timeout_ms=5000):
        self._lock = threading.Lock()
        self._h = None
        self.timeout_ms = int(timeout_ms)
        self.client_id = None
        self._keep = None
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(_lib.ERRLEN)
        rc = _lib.lib.refit_open(str(socket).encode(), self.timeout_ms, ctypes.byref(h), err,
                                 len(err))
        _lib.check(rc, err.value.decode(errors="replace"))
        self._h = h
        nid = ctypes.c_char_p()
        ranks = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_size_t()
        self._call(_lib.lib.refit_node_info, ctypes.byref(nid), ctypes.byref(ranks),
                   ctypes.byref(n))
        self.node_id = nid.value.decode()
        self.ranks = [ranks[i] for i in range(n.value)]

    # ---- plumbing ------------------------------------------------------------
    def _call(self, fn, *args):
        with self._lock:
            if self._h is None:
                raise ValueError("refit: the client is closed")
            rc = fn(self._h, *args)
            if rc != 0:
                _lib.check(rc, (_lib.lib.refit_errmsg(self._h) or b"").decode(
                    errors="replace"))

    def _id(self):
        if self.client_id is None:
            raise ValueError("refit: not registered (call register first)")
        return self.client_id

    def _timeout(self, timeout_ms):
        t = self.timeout_ms if timeout_ms is None else int(timeout_ms)
        if t <= 0:
            raise ValueError(f"refit: timeout_ms must be positive, not {t}")
        return t

    def close(self):
        with self._lock:
            if self._h is not None:
                _lib.lib.refit_close(self._h)
                self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---- registration --------------------------------------------------------
    def _pieces(self, layouts, tensors):
        """[(tensor name, rank, piece, [copies])] from the tensors mapping."""
        names = {lay["name"]: lay for lay in layouts}
        out = []
        for key, val in tensors.items():
            if isinstance(key, str):
                name, rank, piece = key, None, 0
            elif len(key) == 2:
                (name, rank), piece = key, 0
            else:
                name, rank, piece = key
            if name not in names:
                raise ValueError(f"refit: tensor \"{name}\" is not in the layouts")
            if rank is None:
                held = [r for r in self.ranks if _layout_has(names[name], r)]
                if len(held) != 1:
                    raise ValueError(f"refit: tensor \"{name}\": say the rank as (name, rank); "
                                     f"this node's ranks holding it: {held}")
                rank = held[0]
            copies = list(val) if isinstance(val, (tuple, list)) else [val]
            out.append((name, int(rank), int(piece), copies))
        return out

    def register(self, model, role, layouts, tensors, instance="", install="double-buffer"):
        """Register model's tensors: role "train" or "infer"; layouts a list of
        layout dicts (refit.layout), or layout JSON text; tensors maps a
        tensor name (the node serves one rank of it), (name, rank) or
        (name, rank, piece) to its local array/tensor, made by refit.empty /
        refit.share (CPU) or a torch CUDA tensor; a double-buffered
        instance gives a pair (copy 0, copy 1) in one segment.  Strides are
        the arrays' own."""
        if role not in _ROLES:
            raise ValueError(f"refit: role {role!r}: \"train\" or \"infer\"")
        if install not in _INSTALLS:
            raise ValueError(f"refit: install {install!r}: \"double-buffer\" or \"in-place\"")
        if self.client_id is not None:
            raise ValueError("refit: this client is registered already (one registration "
                             "per Client)")
        if isinstance(layouts, str):
            text = layouts
            import json
            parsed = json.loads(text)
            layouts = parsed.get("tensors", [parsed]) if isinstance(parsed, dict) else parsed
        else:
            layouts = [layouts] if isinstance(layouts, dict) else list(layouts)
            text = _layout.to_json(layouts)
        double = _ROLES[role] == _lib.ROLE_INFER and install == "double-buffer"
        pieces = self._pieces(layouts, tensors)
        mems = (_lib.Mem * max(1, len(pieces)))()
        keep = []  # what the C structures point at, alive until register returns
        cuda_devs = set()
        for i, (name, rank, piece, copies) in enumerate(pieces):
            if len(copies) != (2 if double else 1):
                raise ValueError(f"refit: tensor \"{name}\" rank {rank}: "
                                 f"{'two copies (a pair)' if double else 'one tensor'} "
                                 f"expected, got {len(copies)}")
            m = mems[i]
            m.tensor, m.rank, m.piece = name.encode(), rank, piece
            keep.append(m.tensor)
            first = copies[0]
            strides = _memory._strides_of(first)
            for c in copies[1:]:
                if _memory._strides_of(c) != strides or tuple(c.shape) != tuple(first.shape):
                    raise ValueError(f"refit: tensor \"{name}\" rank {rank}: the two copies "
                                     "differ in shape or strides")
            st = (ctypes.c_int64 * max(1, len(strides)))(*strides)
            keep.append(st)
            m.strides = st if strides else None
            if _memory.is_torch(first) and first.is_cuda:
                infos = [_cuda.ipc_piece(c) for c in copies]
                if any(x["cuda_ipc"] != infos[0]["cuda_ipc"] for x in infos):
                    raise ValueError(f"refit: tensor \"{name}\": both copies must be in one "
                                     "CUDA allocation")
                hb = ctypes.create_string_buffer(infos[0]["cuda_ipc"],
                                                 len(infos[0]["cuda_ipc"]))
                keep.append(hb)
                m.cuda_ipc = ctypes.cast(hb, ctypes.c_void_p)
                m.cuda_ipc_len = len(infos[0]["cuda_ipc"])
                m.cuda_bytes = max(x["cuda_bytes"] for x in infos)
                m.has_cuda_device, m.cuda_device = 1, infos[0]["device"]
                cuda_devs.add(int(infos[0]["device"]))
                if infos[0]["uuid"]:   # the GPU by UUID: ordinals are per process
                    ub = ctypes.create_string_buffer(infos[0]["uuid"], 16)
                    keep.append(ub)
                    m.cuda_uuid = ctypes.cast(ub, ctypes.c_char_p)
                for k, x in enumerate(infos):
                    m.offset[k] = x["offset"]
                m.shm_name = b""
            else:
                segs = [_memory.find(c) for c in copies]
                if any(s[0] != segs[0][0] for s in segs):
                    raise ValueError(f"refit: tensor \"{name}\": both copies must be in one "
                                     "segment (refit.empty(..., copies=2))")
                m.shm_name = segs[0][0].encode()
                keep.append(m.shm_name)
                for k, (_, off) in enumerate(segs):
                    m.offset[k] = off
        reg = _lib.Registration(model.encode(), _ROLES[role], instance.encode(),
                                _INSTALLS[install], text.encode(), mems, len(pieces))
        cid = ctypes.c_uint64()
        self._call(_lib.lib.refit_register, ctypes.byref(reg), ctypes.byref(cid))
        self.client_id = cid.value
        self._keep = tensors  # the memory stays referenced while registered
        self._cuda_devs = sorted(cuda_devs)
        return self.client_id

    def unregister(self):
        self._call(_lib.lib.refit_unregister, self._id())
        self.client_id = None
        self._keep = None

    # ---- trainer -------------------------------------------------------------
    def weights_ready(self, version, timeout_ms=None):
        """Trainer: the buffers now hold version (it must grow).  With torch
        CUDA tensors registered, an interprocess CUDA event is recorded on
        the current stream of each of their devices and passed along: the
        node daemon's copies wait for it on the GPU, so the step's
        asynchronous writes on those streams land first (docs/gpu.md,
        "Stream ordering"; writes on other streams: synchronise them with
        the current stream first)."""
        devs = getattr(self, "_cuda_devs", None)
        if not devs:
            self._call(_lib.lib.refit_weights_ready, self._id(), int(version),
                       self._timeout(timeout_ms))
            return
        if not hasattr(self, "_events"):
            self._events = {}   # device -> event, alive until the next step's record
        hs = b"".join(_cuda.ready_events(devs, self._events))
        buf = ctypes.create_string_buffer(hs, len(hs))
        self._call(_lib.lib.refit_weights_ready_cuda, self._id(), int(version), buf,
                   len(devs), self._timeout(timeout_ms))

    def begin_write(self, timeout_ms=None):
        """Trainer: wait (at most timeout_ms) until no refit reads the buffers,
        then mark them being written; call before the next step writes."""
        self._call(_lib.lib.refit_begin_write, self._id(), self._timeout(timeout_ms))

    def wait_installed(self, version, timeout_ms=None):
        """Trainer: wait (at most timeout_ms) until every inference instance
        of the model holds `version` or newer, as the coordinator knows it;
        the State (.version: the lowest they hold).  refit.Timeout names the
        instances that lag."""
        st = _lib.State()
        self._call(_lib.lib.refit_wait_installed, self._id(), int(version),
                   self._timeout(timeout_ms), ctypes.byref(st))
        return _state(st)

    # ---- inference -----------------------------------------------------------
    def wait_version(self, version, timeout_ms=None):
        """Inference: wait (at most timeout_ms: refit.Timeout) until version >=
        version is installed and valid; the State (its .active copy)."""
        st = _lib.State()
        self._call(_lib.lib.refit_wait_version, self._id(), int(version),
                   self._timeout(timeout_ms), ctypes.byref(st))
        return _state(st)

    def serve(self, version):
        """Inference, double buffer: this reader now serves `version` (the
        one installed, in State.active); until it serves another no refit
        writes that copy (a refit that would is refused here and retried by
        the model's policy).  An engine that switches between the copies
        calls it at every switch."""
        self._call(_lib.lib.refit_serve, self._id(), int(version))

    def describe(self, framework, version="", pause_mode=""):
        """Inference: the engine reading this client names itself (framework
        "vllm", its version, pause mode "keep" / "wait" / "abort"); refitctl
        models shows it with the version it serves (serve())."""
        self._call(_lib.lib.refit_describe, self._id(), str(framework).encode(),
                   str(version).encode(), str(pause_mode).encode())

    def state(self):
        st = _lib.State()
        self._call(_lib.lib.refit_get_state, self._id(), ctypes.byref(st))
        return _state(st)


def _state(st):
    return State(int(st.version), int(st.active), bool(st.valid), bool(st.reading),
                 st.failure.decode(errors="replace"))


def _layout_has(lay, rank):
    try:
        return bool(_layout.local_boxes(lay, rank))
    except ValueError:  # strided placements: only the C library knows; ask for the rank
        return rank in _flat(lay.get("mesh", []))


def _flat(m):
    return [x for y in m for x in _flat(y)] if isinstance(m, list) else [int(m)]
