"""CUDA tensors by IPC handle (the nccl transport).

A torch CUDA tensor is registered by the cudaIpcMemHandle_t of the
allocation its storage lives in, as torch.multiprocessing shares it:
storage._share_cuda_() answers (device, handle, storage bytes, storage
offset in the allocation, ...); the piece's offset is that offset plus the
tensor's storage_offset in bytes.  The daemon opens the handle with
cudaIpcOpenMemHandle on the rank's device and checks the memory.

Compiled in and documented; not run in this repository's CPU-only tests.
"""


def ipc_piece(t):
    """dict(cuda_ipc=bytes, cuda_bytes=int, offset=int, device=int) of a torch
    CUDA tensor, for refit_mem_t."""
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
    return {"cuda_ipc": bytes(handle), "cuda_bytes": int(offset_bytes) + int(size_bytes),
            "offset": int(offset_bytes) + t.storage_offset() * t.element_size(),
            "device": int(device)}
