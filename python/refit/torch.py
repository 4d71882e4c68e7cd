"""refit for torch trainers: publish a module's parameters with one call
(docs/python.md, "Trainers").

    pub = refit.torch.Publisher(model, socket, "llama")     # registers
    for step in range(1, n + 1):
        with pub.writing():          # waits only while a refit reads
            optimizer.step()
        pub.publish(step)            # returns at once
    pub.publish(n + 1, wait=60000)   # or: until every instance holds it

Parameters are the module's named_parameters() (names as the module says
them, less `strip` at the front).  A DTensor parameter (FSDP2, tensor
parallel) is laid out from its real placements and mesh (refit.layout
.dtensor) and each process registers its local shard; a plain tensor is
held whole by `rank` (default: this process's rank in torch.distributed, or
0).  Every process of the trainer makes its own Publisher with the socket of
its node's daemon.

mode "in-place" (plain CPU tensors): the parameters move once into memory
the node maps (param.data is replaced; values and strides kept), so a
refit reads the very tensors the optimizer writes: `writing()` waits while
a refit still reads them, `publish()` costs nothing.  mode "snapshot" (the
default for DTensors, whose storage FSDP2 owns): refit memory holds a copy,
and publish() copies the local shards into it (at memory speed, after
waiting while a refit still reads the previous one); the next step may
write at once.  CUDA parameters: publish() first waits for the current
stream, so the daemon never reads half-written weights.

framework="megatron" (config= the Hugging Face config.json the model was
made from; par= its parallel spec, default megatron.core.parallel_state's;
base= the global rank of Megatron rank 0): a Megatron-Core model's
parameters laid out by refit's Megatron map -- fused QKV, gate/up, TP
shards, PP stages, experts (refit._megatron).

Bad input raises ValueError naming the parameter: a parameter on the meta
device, a dtype refit has no name for, a DTensor whose placements the
library refuses (at registration, with its message).
"""
import contextlib

from . import client as _client
from . import layout as _layout
from . import memory as _memory


def _is_dtensor(t):
    return hasattr(t, "placements") and hasattr(t, "device_mesh") and hasattr(t, "to_local")


def _dist_rank():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return 0


def _all_gather(obj):
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            out = [None] * dist.get_world_size()
            dist.all_gather_object(out, obj)
            return out
    except ImportError:
        pass
    return [obj]


class Publisher:
    """A torch module's parameters registered as the trainer of `model` on
    the node at `socket` (see the module's text)."""

    def __init__(self, module, socket, model, mode=None, rank=None, strip="",
                 timeout_ms=30000, names=None, framework=None, config=None, par=None,
                 base=0):
        import torch
        self._torch = torch
        if mode not in (None, "in-place", "snapshot"):
            raise ValueError(f"refit.torch: mode {mode!r}: \"in-place\" or \"snapshot\"")
        if framework is not None:
            if framework != "megatron":
                raise ValueError(f"refit.torch: framework {framework!r}: \"megatron\" (or "
                                 "None: the module's own names and placements)")
            from . import _megatron
            self.rank = _dist_rank() if rank is None else int(rank)
            self.version = 0
            lays, tensors, self._pairs, self.mode = _megatron.bind(
                torch, module, config, par, self.rank, mode, int(base))
            self.client = _client.Client(socket, timeout_ms=timeout_ms)
            self.client.register(model, "train", lays, tensors)
            self._dirty = False
            return
        params = [(n[len(strip):] if strip and n.startswith(strip) else n, p)
                  for n, p in module.named_parameters()]
        if names is not None:
            keep = set(names)
            params = [(n, p) for n, p in params if n in keep]
        if not params:
            raise ValueError("refit.torch: the module has no parameters to publish")
        anyd = any(_is_dtensor(p) for _, p in params)
        self.mode = mode or ("snapshot" if anyd else "in-place")
        if self.mode not in ("in-place", "snapshot"):
            raise ValueError(f"refit.torch: mode {self.mode!r}: \"in-place\" or \"snapshot\"")
        self.rank = _dist_rank() if rank is None else int(rank)
        self.version = 0
        self._pairs = []   # (param, refit memory)
        mine, tensors, meta = [], {}, {}
        for name, p in params:
            if p.device.type == "meta":
                raise ValueError(f"refit.torch: parameter {name} is on the meta device")
            dt = _memory.dtype_name(p.dtype)
            if _is_dtensor(p):
                if self.mode == "in-place":
                    raise ValueError(f"refit.torch: parameter {name} is a DTensor, whose "
                                     "storage FSDP2 / tensor parallelism own: use "
                                     "mode=\"snapshot\"")
                local = p.to_local()
                boxes = _layout.local_boxes(_layout.dtensor(name, p), _dist_rank())
                if len(boxes) > 1:
                    raise ValueError(f"refit.torch: parameter {name}: rank {self.rank} "
                                     f"holds {len(boxes)} pieces (a strided placement); "
                                     "one piece per rank is supported")
            else:
                local = p
                boxes = [([0] * p.dim(), list(p.shape))]
            meta[name] = (dt, list(p.shape))
            if boxes and local.numel():
                mine.append((name, self.rank, list(boxes[0][0]), list(boxes[0][1])))
            if local.is_cuda:
                if self.mode == "in-place":
                    mem = local.data
                else:
                    mem = torch.empty_like(local.data)
                    mem.copy_(local.data)
            else:
                mem = _memory.share(local.detach().contiguous() if self.mode == "snapshot"
                                    else local.detach())
                if self.mode == "in-place":
                    p.data = mem   # the optimizer now writes refit memory
            if local.numel():
                tensors[(name, self.rank)] = mem
            self._pairs.append((p, mem))
        # one layout of every tensor on every process: each process knows
        # only its own submesh (FSDP2's mesh of a parameter replicated over
        # tensor parallelism), so the processes tell each other their boxes
        every = _all_gather(mine)
        lays = []
        for name, (dt, shape) in meta.items():
            bxs = [(r, off, size) for part in every for (n, r, off, size) in part if n == name]
            lays.append(_layout.boxes(name, dt, shape, bxs))
        self.client = _client.Client(socket, timeout_ms=timeout_ms)
        self.client.register(model, "train", lays, tensors)
        self._dirty = False

    @contextlib.contextmanager
    def writing(self, timeout_ms=None):
        """Around the step that writes the parameters (in place: waits while
        a refit still reads them; snapshot: nothing to wait for)."""
        if self.mode == "in-place":
            self.client.begin_write(timeout_ms)
        yield
        self._dirty = True

    def publish(self, step, timeout_ms=None, wait=False):
        """The parameters now hold version `step` (it must grow): the
        producing CUDA stream is waited for, the snapshot taken (snapshot
        mode: after any refit reading the previous one finished), and the
        node told.  wait False (default): returns at once after that, None.
        wait True, or a number of milliseconds: then waits (at most that, or
        timeout_ms) until every inference instance of the model holds `step`
        or newer and returns the lowest version they hold; refit.Timeout
        names the instances that lag (the version stays published)."""
        if not (wait is None or isinstance(wait, bool) or
                (isinstance(wait, (int, float)) and wait > 0)):
            raise ValueError(f"refit.torch: wait={wait!r}: False, True or a positive number "
                             "of milliseconds")
        torch = self._torch
        if torch.cuda.is_available() and any(m.is_cuda for _, m in self._pairs):
            torch.cuda.current_stream().synchronize()
        if self.mode == "snapshot":
            self.client.begin_write(timeout_ms)
            with torch.no_grad():
                for p, mem in self._pairs:
                    src = p.to_local() if _is_dtensor(p) else p
                    if src.numel():
                        mem.copy_(src.detach())
        self.client.weights_ready(int(step), timeout_ms)
        self.version = int(step)
        self._dirty = False
        if wait is False or wait is None:
            return None
        t = timeout_ms if wait is True else wait
        return self.client.wait_installed(int(step), None if t is None else int(t)).version

    def close(self):
        self.client.close()
