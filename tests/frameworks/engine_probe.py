"""Run on each vLLM worker by engine_vllm.py (LLM.apply_model): importable by
name there (tests/frameworks is on the workers' PYTHONPATH)."""
import hashlib


def worker_params(model):
    """Run on each worker: {name: sha256 of the bytes} of its parameters."""
    import torch
    from vllm.distributed import parallel_state as ps
    res = {}
    for n, p in model.named_parameters():
        t = p.detach().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.uint16)
        res[n] = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    return ps.get_tp_group().rank_in_group, res
