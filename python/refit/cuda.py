"""CUDA tensors by IPC handle (the nccl transport).

A torch CUDA tensor is registered by the cudaIpcMemHandle_t of the
allocation its storage lives in, as torch.multiprocessing shares it:
storage._share_cuda_() answers (device, handle, storage bytes, storage
offset in the allocation, ...); the piece's offset is that offset plus the
tensor's storage_offset in bytes.  The daemon opens the handle with
cudaIpcOpenMemHandle on the rank's device and checks the memory.

Current PyTorch answers the caching allocator's shareable handle
(c10/cuda/CUDACachingAllocator.cpp, shareIpcHandle): a version byte, a type
byte and, for type 'c' (memory of cudaMalloc), the 64-byte handle of the
allocation; older PyTorch answers the 64-byte handle alone.  Type 'e'
(expandable segments: memory of the driver's VMM API) cannot be opened with
cudaIpcOpenMemHandle and is refused here, before anything reaches the
daemon.

Compiled in and documented; not run in this repository's CPU-only tests
(ipc_handle and ipc_piece are, with objects shaped like torch's).
"""

IPC_HANDLE_BYTES = 64
EVENT_HANDLE_BYTES = 64
TORCH_HANDLE_VERSION = 2

VMM_REFUSED = ("expandable segments / VMM memory cannot be exported by legacy CUDA IPC; "
               "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")


def ipc_handle(h):
    """The 64-byte cudaIpcMemHandle_t in what torch's _share_cuda_() answered
    as its handle (bytes): the handle itself, or PyTorch's shareable handle of
    type 'c' with its 2-byte header stripped.  ValueError for type 'e' and
    anything else."""
    h = bytes(h)
    if len(h) == IPC_HANDLE_BYTES:
        return h
    if len(h) >= 2 and h[1:2] == b"e":
        raise ValueError("refit: the tensor's memory is PyTorch's expandable segments "
                         "(a shareable handle of type 'e'): " + VMM_REFUSED)
    if len(h) == 2 + IPC_HANDLE_BYTES and h[0] == TORCH_HANDLE_VERSION and h[1:2] == b"c":
        return h[2:]
    raise ValueError(f"refit: torch's CUDA IPC handle has {len(h)} bytes (starting "
                     f"{h[:2]!r}): neither a cudaIpcMemHandle_t ({IPC_HANDLE_BYTES} bytes) "
                     f"nor a shareable handle of version {TORCH_HANDLE_VERSION}, type 'c'")


def ready_events(devices, keep):
    """The 64-byte IPC handles (cudaIpcEventHandle_t) of one interprocess
    event per device in `devices`, each recorded now on that device's current
    stream (after the step's writes queued there), for
    refit_weights_ready_cuda.  keep: device -> torch.cuda.Event, reused from
    step to step: an event must live while the node daemon may open it, and
    it is recorded again only after begin_write (no refit reads then).
    torch.cuda.Event(interprocess=True) is created without timing, as CUDA
    requires (cudaEventInterprocess | cudaEventDisableTiming); ipc_handle()
    is torch's cudaIpcGetEventHandle."""
    import torch
    out = []
    for d in devices:
        ev = keep.get(d)
        if ev is None:
            ev = keep[d] = torch.cuda.Event(interprocess=True)
        with torch.cuda.device(d):
            ev.record(torch.cuda.current_stream(d))
        h = bytes(ev.ipc_handle())
        if len(h) != EVENT_HANDLE_BYTES:
            raise ValueError(f"refit: torch's CUDA event handle has {len(h)} bytes, not "
                             f"{EVENT_HANDLE_BYTES}")
        out.append(h)
    return out


def device_uuid(device):
    """The 16-byte UUID of CUDA device `device` (an ordinal of this process),
    as torch reads it (cudaDeviceProp.uuid); None where torch has no CUDA or
    no UUID to give.  The node daemon knows its GPUs by UUID: under
    CUDA_VISIBLE_DEVICES each process numbers its GPUs from 0."""
    try:
        import torch
        u = torch.cuda.get_device_properties(device).uuid
        return bytes(u.bytes)
    except (ImportError, AttributeError, AssertionError, RuntimeError, TypeError,
            ValueError):
        return None


def ipc_piece(t):
    """dict(cuda_ipc=bytes, cuda_bytes=int, offset=int, device=int, uuid=bytes or
    None) of a torch CUDA tensor, for refit_mem_t."""
    if not getattr(t, "is_cuda", False):
        raise ValueError("refit: ipc_piece() takes a torch CUDA tensor")
    st = t.storage()
    share = getattr(st, "_share_cuda_", None)
    if share is None:  # torch >= 2: the untyped storage shares
        share = st.untyped()._share_cuda_
    info = share()
    device, handle, size_bytes, offset_bytes = info[0], info[1], info[2], info[3]
    if not isinstance(handle, (bytes, bytearray)) or not handle:
        raise ValueError("refit: torch returned no CUDA IPC handle for this tensor")
    return {"cuda_ipc": ipc_handle(handle), "cuda_bytes": int(offset_bytes) + int(size_bytes),
            "offset": int(offset_bytes) + t.storage_offset() * t.element_size(),
            "device": int(device), "uuid": device_uuid(int(device))}
