"""Publisher(module, ..., framework="megatron"): a Megatron-Core model's
parameters -- fused QKV (per query group: its heads' q, then k, then v),
gate and up fused in linear_fc1, TP shards, PP stages, expert groups -- laid
out by refit's Megatron map (refit.frameworks, plan/framework.c), which
names every parameter as the Transformer Engine layer spec does.  The
local spec's names (megatron-core without TE) are taken too: its separate
norms (input_layernorm, pre_mlp_layernorm, MLA's q/kv_layernorm) and
experts (local_experts.K.linear_fc1.weight) are the TE spec's
linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight, ... and
experts.linear_fc1.weightK.  Wrappers' "module." prefixes (Float16Module,
DDP) are dropped.

The map's parameters and the module's must be the same set, each of the
map's shape; anything else is refused naming the parameter.  A parameter
held in another dtype than the map's (the local spec's fp32 norms; the map
holds bf16 like the checkpoint) is converted when published: such a
module publishes in snapshot mode; in place needs every dtype equal.
"""
from . import frameworks as _fw

_LOCAL = [  # TE spec name suffix -> local spec name suffix (after decoder.layers.N.)
    ("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"),
    ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
    ("self_attention.linear_q_up_proj.layer_norm_weight", "self_attention.q_layernorm.weight"),
    ("self_attention.linear_kv_up_proj.layer_norm_weight", "self_attention.kv_layernorm.weight"),
]


def local_names(te):
    """The local layer spec's names of TE spec parameter `te` (besides te)."""
    parts = te.split(".", 3)
    if len(parts) < 4 or parts[:2] != ["decoder", "layers"]:
        return []
    head, rest = ".".join(parts[:3]) + ".", parts[3]
    out = [head + loc for t, loc in _LOCAL if rest == t]
    for fc in ("linear_fc1", "linear_fc2"):
        pre = f"mlp.experts.{fc}."
        if rest.startswith(pre):
            tail = rest[len(pre):]          # weight3, bias3
            stem = tail.rstrip("0123456789")
            if stem != tail:
                out.append(f"{head}mlp.experts.local_experts.{tail[len(stem):]}.{fc}.{stem}")
    return out


def _unwrap(name):
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def parallel_spec():
    """"tpT,ppP,dpD[,epE,etpF]" of megatron.core.parallel_state, initialised."""
    from megatron.core import parallel_state as ps
    if not ps.model_parallel_is_initialized():
        raise ValueError("refit.torch: framework=\"megatron\" needs megatron.core."
                         "parallel_state initialised (or par=\"tp..,pp..\")")
    s = "tp%d,pp%d,dp%d" % (ps.get_tensor_model_parallel_world_size(),
                            ps.get_pipeline_model_parallel_world_size(),
                            ps.get_data_parallel_world_size())
    ep = ps.get_expert_model_parallel_world_size()
    etp = ps.get_expert_tensor_parallel_world_size()
    if ep > 1:
        s += ",ep%d" % ep
    if etp != ps.get_tensor_model_parallel_world_size():
        s += ",etp%d" % etp
    return s


def bind(torch, module, config, par, rank, mode, base):
    """(layouts, tensors for Client.register, [(param, refit memory)], mode)."""
    if config is None:
        raise ValueError("refit.torch: framework=\"megatron\" needs config= (the Hugging "
                         "Face config.json the model was made from, or its dict)")
    # the whole map: every process registers the layouts of all ranks
    m = _fw.framework_map("megatron", config, par or parallel_spec())
    ent = next((r for r in m["ranks"] if r["rank"] == rank), None)
    if ent is None:
        raise ValueError(f"refit.torch: rank {rank} is not in the Megatron map "
                         f"(world {m['world']})")
    have = {_unwrap(n): p for n, p in module.named_parameters()}
    have.update({_unwrap(n): b for n, b in module.named_buffers()
                 if n.endswith("expert_bias")})
    found, used = [], set()
    for p in ent["params"]:
        name = next((c for c in [p["name"]] + local_names(p["name"]) if c in have), None)
        if name is None:
            raise ValueError(f"refit.torch: the Megatron map names {p['name']}, which the "
                             "module does not have (another config or parallel spec?)")
        t = have[name]
        if list(t.shape) != list(p["shape"]):
            raise ValueError(f"refit.torch: parameter {name}: the module holds "
                             f"{list(t.shape)}, the Megatron map {p['shape']}")
        found.append((p, t, name))
        used.add(name)
    extra = sorted(n for n, t in have.items() if n not in used and t.numel())
    if extra:
        raise ValueError("refit.torch: the module has parameters the Megatron map does not "
                         f"describe: {', '.join(extra[:5])}")
    want = {p["name"]: _dtype(torch, p["dtype"]) for p, _, _ in found}
    differ = [(n, t.dtype, want[p["name"]]) for p, t, n in found
              if t.dtype != want[p["name"]]]
    cuda = any(t.is_cuda for _, t, _ in found)
    mode = mode or ("snapshot" if differ or cuda else "in-place")
    if mode == "in-place" and differ:
        raise ValueError(f"refit.torch: parameter {differ[0][0]} is {differ[0][1]}, the "
                         f"Megatron map holds {differ[0][2]}: in place needs the map's "
                         "dtype; mode=\"snapshot\" converts when publishing")
    if cuda:
        params = {(rank, p["name"]): (t.data if mode == "in-place" else
                                      torch.empty(p["shape"], dtype=want[p["name"]],
                                                  device=t.device))
                  for p, t, _ in found}
    else:
        arrs = _fw.allocate(m, ranks=[rank])
        params = {k: _as_torch(torch, a, want[k[1]]) for k, a in arrs.items()}
    pairs = []
    with torch.no_grad():
        for p, t, _ in found:
            mem = params[(rank, p["name"])]
            if mem is not t.data:
                mem.copy_(t.detach())
                if mode == "in-place":
                    t.data = mem   # the optimizer now writes refit memory
            pairs.append((t, mem))
    lays = _fw.layouts(m, base=base)
    return lays, _fw.pieces(m, params, base=base), pairs, mode


def _dtype(torch, name):
    out = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
           "fp8e4m3": getattr(torch, "float8_e4m3fn", None),
           "fp8e5m2": getattr(torch, "float8_e5m2", None)}.get(name)
    if out is None:
        raise ValueError(f"refit.torch: the Megatron map holds dtype {name}, which this "
                         "torch has no type for")
    return out


def _as_torch(torch, arr, dtype):
    """arr (refit memory; bf16 held as uint16, fp8 as uint8) as a tensor of dtype."""
    t = torch.from_numpy(arr)
    return t if t.dtype == dtype else t.view(dtype)
