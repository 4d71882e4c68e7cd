"""Prove refit's Megatron-Core map against Megatron's own code (CPU).

    build/venv-megatron/bin/python tests/frameworks/test_megatron.py BUILD_DIR
        [--only MODEL[,MODEL]] [--case SUBSTR] [--dump FILE] [-v]

For tiny Hugging Face configs (llama GQA, qwen2 with qkv bias, qwen3 with
qk-norm and tied embeddings, qwen3_moe, deepseek_v3 MLA + MoE) and a set of
parallel specs, every rank of a real gloo world (forked processes, one per
rank) does what a Megatron trainer does:

  1. megatron-bridge turns the HF config into its GPTModelProvider
     (AutoBridge.to_megatron_provider), parallel_state.initialize_model_parallel
     builds the TP/PP/DP/EP groups, and provider.provide() builds the stage's
     real GPTModel (megatron-core local layer spec: Transformer Engine does
     not install on a machine without CUDA).  The vocabulary is padded by the
     provider's own calculate_padded_vocab_size (make_vocab_size_divisible_by
     128, Megatron-LM's default: a multiple of 128 * tp).
  2. The stage's parameters are renamed to the Transformer Engine layer
     spec's names (TE_RENAME below: the TE spec fuses input_layernorm into
     linear_qkv, a dense MLP's pre_mlp_layernorm into linear_fc1, MLA's
     q/kv layernorms into linear_q_up_proj / linear_kv_up_proj, keeps
     MLA's down projections whole (TELinear, parallel_mode "duplicated")
     and stores an expert group as linear_fc1.weight0..N (TEGroupedMLP)),
     and hung on stand-in modules that carry the TE classes' names, so that
     megatron-bridge's AutoMapping picks the TE parallelism for each.
  3. megatron-bridge's own load path (load_weights_hf_to_megatron: its
     mapping registry, QKVMapping / GatedMLPMapping / AutoMapping, the TP
     scatter and broadcast over the real gloo groups, the PP name exchange,
     the EP expert numbering, the tied-embedding broadcast) fills those
     parameters from index-encoded HF tensors; decoding them gives, for
     every element, the HF tensor and flat index it holds.

CPU shims (none changes a layout; each is commented where it is made):
transformer_engine is a stub module while megatron-bridge is imported (its
peft code imports it unconditionally); torch.cuda.current_device() is "cpu"
and Tensor.cuda() a no-op; megatron-core's multi_latent_attention.HAVE_TE is
set False (without TE it is True with MagicMock classes); MLA's core
attention (no parameters) is a stand-in, as megatron-core 0.16.1's local
DotProductAttention rejects MLA's arguments; the MoE token dispatcher (no
parameters) is "allgather", as "alltoall" makes a CUDA stream; the bridge's
TP scatter gets contiguous shards (torch's gloo scatter sends a
non-contiguous tensor's raw storage; on a GPU the .to(cuda) copies).

refit's side: fwmap.load_map(BUILD, "megatron", config.json, spec, rank=r).
One line per (case, rank): PASS / FAIL with the first errors; then
"N passed, N failed".  Exit 1 on a failure, 2 when the Megatron packages
cannot be imported.
"""
import argparse
import importlib.abc
import importlib.machinery
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fwmap  # noqa: E402

SHIFT = float(1 << 24)  # one float64 holds (id + 1) * 2^24 + (index + 1)
T0 = time.time()


# ---- imports ---------------------------------------------------------------

class _TEStub(types.ModuleType):
    """A stand-in for transformer_engine while megatron-bridge is imported:
    megatron/bridge/peft/lora_layers.py imports transformer_engine.pytorch
    unconditionally (class TELinearAdapter(te.Linear)), and the import chain
    AutoBridge -> model_bridge -> peft_bridge reaches it.  Nothing of it runs."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            import torch
            val = type(name, (torch.nn.Module,), {})
        else:
            val = _TEStub(self.__name__ + "." + name)
            val.__path__ = []
            sys.modules[val.__name__] = val
        setattr(self, name, val)
        return val


class _TEFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "transformer_engine" or name.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _TEStub(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def import_megatron():
    """Import torch, megatron-core and megatron-bridge; returns a namespace."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import torch
    torch.set_num_threads(1)
    import megatron.core  # noqa: F401  (first: its HAVE_TE probes see no TE)
    from megatron.core import parallel_state
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.module import Float16Module, MegatronModule
    have_te = True
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        have_te = False
    finder = None
    if not have_te:
        finder = _TEFinder()
        sys.meta_path.insert(0, finder)
    try:
        import megatron.bridge  # noqa: F401
        from megatron.bridge import AutoBridge
        from megatron.bridge.models.conversion import model_bridge
        from megatron.bridge.models.hf_pretrained.causal_lm import PreTrainedCausalLM
        from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
            for k in [k for k in sys.modules if k.split(".")[0] == "transformer_engine"]:
                del sys.modules[k]
    import transformers
    from importlib.metadata import version
    ns = types.SimpleNamespace(
        torch=torch, ps=parallel_state, specs=gpt_layer_specs, PGC=ProcessGroupCollection,
        Float16Module=Float16Module, MegatronModule=MegatronModule, AutoBridge=AutoBridge,
        model_bridge=model_bridge, PreTrainedCausalLM=PreTrainedCausalLM,
        padded_vocab=calculate_padded_vocab_size, transformers=transformers, have_te=have_te,
        versions={p: version(p) for p in ("torch", "megatron-core", "megatron-bridge",
                                          "transformers")})
    # megatron-core's TopKRouter allocates its expert_bias buffer on
    # torch.cuda.current_device() and megatron-bridge's ReplicatedMapping
    # moves replicated weights there: on this CPU-only machine, "cpu".
    torch.cuda.current_device = lambda: "cpu"
    # LanguageModule.setup_embeddings_and_output_layer moves a tied output
    # copy to .cuda() before its all-reduce over the embedding group
    torch.Tensor.cuda = lambda self, *a, **k: self
    # without TE, megatron.core.extensions.transformer_engine hands out
    # MagicMock stand-ins, so multi_latent_attention.HAVE_TE comes out True
    # and MLASelfAttention's isinstance(self.linear_proj, TELinear) raises
    if not have_te:
        import megatron.core.transformer.multi_latent_attention as mla
        mla.HAVE_TE = False
    # megatron-bridge's scatter_to_tp_ranks sends torch.chunk views (a
    # RowParallel split on dim 1 is not contiguous) after .to(device): on a
    # GPU that .to copies them contiguous; on CPU it returns the view, and
    # gloo's scatter sends its storage from the view's offset (the wrong
    # elements).  Hand it contiguous copies, as .to(cuda) would.
    from megatron.bridge.models.conversion import param_mapping
    scatter = param_mapping.MegatronParamMapping.scatter_to_tp_ranks

    def scatter_contiguous(self, splits, *a, **k):
        if splits:
            splits = [s.contiguous() for s in splits]
        return scatter(self, splits, *a, **k)

    param_mapping.MegatronParamMapping.scatter_to_tp_ranks = scatter_contiguous
    return ns


# ---- models ----------------------------------------------------------------

def hf_configs(tf):
    """The tiny Hugging Face configs, by name."""
    common = dict(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, torch_dtype="bfloat16")
    return {
        "llama": tf.LlamaConfig(**common, head_dim=16, tie_word_embeddings=False,
                                architectures=["LlamaForCausalLM"]),
        # 5 layers: pp2 is uneven
        "llama5": tf.LlamaConfig(**dict(common, num_hidden_layers=5), head_dim=16,
                                 tie_word_embeddings=False, architectures=["LlamaForCausalLM"]),
        # no head_dim: hidden / heads = 8
        "qwen2": tf.Qwen2Config(**common, tie_word_embeddings=False,
                                architectures=["Qwen2ForCausalLM"]),
        "qwen3": tf.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True,
                                architectures=["Qwen3ForCausalLM"]),
        "qwen3_moe": tf.Qwen3MoeConfig(**common, head_dim=16, num_experts=8,
                                       num_experts_per_tok=2, moe_intermediate_size=32,
                                       decoder_sparse_step=1, mlp_only_layers=[],
                                       norm_topk_prob=True, tie_word_embeddings=False,
                                       architectures=["Qwen3MoeForCausalLM"]),
        "deepseek_v3": tf.DeepseekV3Config(
            **dict(common, num_key_value_heads=8), q_lora_rank=32, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
            n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, n_group=1, topk_group=1, rope_scaling=None,
            scoring_func="sigmoid", topk_method="noaux_tc",
            tie_word_embeddings=False, architectures=["DeepseekV3ForCausalLM"]),
    }


# (model, tp, pp, dp or None (refit's default), ep, etp)
CASES = [
    ("llama", 1, 1, None, 1, 1), ("llama", 2, 1, None, 1, 1), ("llama", 4, 1, None, 1, 1),
    ("llama", 8, 1, None, 1, 1), ("llama", 2, 2, None, 1, 1), ("llama", 4, 2, None, 1, 1),
    ("llama", 2, 2, 2, 1, 1), ("llama", 1, 4, None, 1, 1), ("llama5", 2, 2, None, 1, 1),
    ("qwen2", 1, 1, None, 1, 1), ("qwen2", 2, 1, None, 1, 1), ("qwen2", 8, 1, None, 1, 1),
    ("qwen2", 2, 2, None, 1, 1),
    ("qwen3", 1, 1, None, 1, 1), ("qwen3", 2, 1, None, 1, 1), ("qwen3", 4, 1, None, 1, 1),
    ("qwen3", 1, 2, None, 1, 1), ("qwen3", 2, 2, None, 1, 1),
    ("qwen3_moe", 1, 1, None, 1, 1), ("qwen3_moe", 1, 1, None, 2, 1),
    ("qwen3_moe", 2, 1, None, 2, 1), ("qwen3_moe", 2, 2, None, 2, 1),
    ("qwen3_moe", 2, 1, None, 2, 2), ("qwen3_moe", 1, 1, None, 8, 1),
    ("deepseek_v3", 1, 1, None, 1, 1), ("deepseek_v3", 2, 1, None, 1, 1),
    ("deepseek_v3", 2, 1, None, 2, 1), ("deepseek_v3", 1, 2, None, 2, 1),
    ("deepseek_v3", 2, 2, None, 2, 1),
]


def par_spec(tp, pp, dp, ep, etp):
    s = "tp%d,pp%d" % (tp, pp)
    if dp is not None:
        s += ",dp%d" % dp
    if ep > 1:
        s += ",ep%d" % ep
    if etp != tp:  # refit takes Megatron's default, etp = tp, when none is given
        s += ",etp%d" % etp
    return s


def hf_tensors(ns, cfg):
    """[(name, shape)] of the HF checkpoint: the model built on the meta
    device by transformers; a tied lm_head is not stored."""
    torch = ns.torch
    with torch.device("meta"):
        model = ns.transformers.AutoModelForCausalLM.from_config(cfg)
    out = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    if getattr(cfg, "tie_word_embeddings", False):
        out = [(n, s) for n, s in out if n != "lm_head.weight"]
    return sorted(out)


def write_checkpoint(ns, cfg, tensors, path):
    """config.json + one safetensors file of index-encoded float64 tensors
    (tensor k: (k + 1) * 2^24 + flat index + 1)."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    sd = {}
    for k, (name, shape) in enumerate(tensors):
        ident, index = fwmap.encode(shape, k)
        sd[name] = ns.torch.from_numpy(ident * SHIFT + index)
    save_file(sd, os.path.join(path, "model.safetensors"))


# ---- the Transformer Engine layer spec's names -----------------------------

# local spec name (after "decoder.layers.N.") -> TE spec name; `when`: "gqa",
# "mla", "dense" (the layer's MLP is dense), or None (always)
TE_RENAME = [
    ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight", "gqa"),
    ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight", "dense"),
    ("self_attention.q_layernorm.weight", "self_attention.linear_q_up_proj.layer_norm_weight",
     "mla"),
    ("self_attention.kv_layernorm.weight",
     "self_attention.linear_kv_up_proj.layer_norm_weight", "mla"),
]

# module (suffix of its path) -> the TE spec's class, for AutoMapping
TE_CLASS = [
    ("self_attention.linear_qkv", "TELayerNormColumnParallelLinear"),
    ("self_attention.linear_proj", "TERowParallelLinear"),
    ("self_attention.linear_q_down_proj", "TELinear"),       # parallel_mode "duplicated"
    ("self_attention.linear_kv_down_proj", "TELinear"),
    ("self_attention.linear_q_up_proj", "TELayerNormColumnParallelLinear"),
    ("self_attention.linear_kv_up_proj", "TELayerNormColumnParallelLinear"),
    ("shared_experts.linear_fc1", "TEColumnParallelLinear"),
    ("shared_experts.linear_fc2", "TERowParallelLinear"),
    ("experts.linear_fc1", "TEColumnParallelGroupedLinear"),
    ("experts.linear_fc2", "TERowParallelGroupedLinear"),
    ("mlp.linear_fc1", "TELayerNormColumnParallelLinear"),
    ("mlp.linear_fc2", "TERowParallelLinear"),
    ("layernorm", "TENorm"), ("input_layernorm", "TENorm"),
    ("mlp.router", "TopKRouter"),
    ("embedding.word_embeddings", "VocabParallelEmbedding"),
    ("output_layer", "ColumnParallelLinear"),                # GPTModel's, in every spec
]


def te_name(local, layer_kind):
    """The TE spec's name of a local-spec parameter name; layer_kind is
    (MLA, dense MLP) of its layer."""
    if not local.startswith("decoder.layers."):
        return local
    head, rest = local.split(".", 3)[:3], local.split(".", 3)[3]
    prefix = ".".join(head) + "."
    mla, dense = layer_kind
    for old, new, when in TE_RENAME:
        if rest == old and (when is None or (when == "gqa" and not mla) or
                            (when == "mla" and mla) or (when == "dense" and dense)):
            return prefix + new
    if rest.startswith("mlp.experts.local_experts."):
        k, tail = rest[len("mlp.experts.local_experts."):].split(".", 1)
        fc, w = tail.rsplit(".", 1)                         # linear_fc1, weight
        return "%smlp.experts.%s.%s%s" % (prefix, fc, w, k)
    return local


def te_class(module_path):
    for suffix, cls in TE_CLASS:
        if module_path.endswith(suffix):
            return cls
    return None


# ---- one rank --------------------------------------------------------------

def _no_core_attention():
    import torch

    class NoCoreAttention(torch.nn.Module):
        """A parameter-free stand-in for core attention (never called)."""

        def __init__(self, *args, **kwargs):
            super().__init__()

    return NoCoreAttention


NoCoreAttention = None


def build_provider(ns, ckpt, tp, pp, ep, etp):
    global NoCoreAttention
    if NoCoreAttention is None:
        NoCoreAttention = _no_core_attention()
    bridge = ns.AutoBridge.from_hf_pretrained(ckpt)
    p = bridge.to_megatron_provider(load_weights=False)
    bridge_vocab_divisor = p.make_vocab_size_divisible_by
    p.tensor_model_parallel_size = tp
    p.pipeline_model_parallel_size = pp
    p.expert_model_parallel_size = ep
    p.expert_tensor_parallel_size = etp
    p.sequence_parallel = False
    if p.num_layers % pp:
        # Megatron-Core splits layers evenly unless told where the rest goes:
        # the first stages full, the last one the rest
        # (--decoder-last-pipeline-num-layers, num_layers_in_last_pipeline_stage)
        per = -(-p.num_layers // pp)
        p.num_layers_in_last_pipeline_stage = p.num_layers - (pp - 1) * per
    p.use_cpu_initialization = True
    p.perform_initialization = False
    # Megatron-LM's vocabulary padding (--make-vocab-size-divisible-by 128)
    p.should_pad_vocab = True
    p.make_vocab_size_divisible_by = 128
    # CPU: the local spec and no fused kernels
    for k in ("gradient_accumulation_fusion", "apply_rope_fusion", "masked_softmax_fusion",
              "bias_activation_fusion", "bias_dropout_fusion", "persist_layer_norm",
              "cross_entropy_loss_fusion", "moe_grouped_gemm", "moe_permute_fusion",
              "moe_shared_expert_overlap"):
        if hasattr(p, k):
            setattr(p, k, False)
    # the MoE token dispatcher has no parameters; "alltoall" makes a CUDA stream
    if getattr(p, "num_moe_experts", None):
        p.moe_token_dispatcher_type = "allgather"

    def layer_spec(config, vp_stage=None):
        spec = ns.specs.get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization="RMSNorm", vp_stage=vp_stage)
        for ls in spec.layer_specs:
            attn = ls.submodules.self_attention
            if attn.module.__name__ == "MLASelfAttention":
                # megatron-core 0.16.1's local DotProductAttention does not take
                # MLA's k_channels / v_channels; core attention has no parameters
                attn.submodules.core_attention = NoCoreAttention
        return spec

    p.transformer_layer_spec = layer_spec
    p.finalize()
    return bridge, p, bridge_vocab_divisor


def rank_main(ns, rank, world, case, ckpt, store, out_path):
    torch = ns.torch
    import datetime
    model_name, tp, pp, dp, ep, etp = case
    res = {"rank": rank, "warnings": []}

    class _Catch(logging.Handler):
        def emit(self, record):
            res["warnings"].append(record.getMessage())

    logging.getLogger().addHandler(_Catch(level=logging.WARNING))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        torch.distributed.init_process_group(
            "gloo", init_method="file://" + store, rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=120))
        ns.ps.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
            create_gloo_process_groups=False)
        res["coords"] = dict(tp=ns.ps.get_tensor_model_parallel_rank(),
                             pp=ns.ps.get_pipeline_model_parallel_rank(),
                             dp=ns.ps.get_data_parallel_rank(),
                             ep=ns.ps.get_expert_model_parallel_rank(),
                             etp=ns.ps.get_expert_tensor_parallel_rank())
        bridge, prov, res["bridge_vocab_divisor"] = build_provider(ns, ckpt, tp, pp, ep, etp)
        prov._pg_collection = ns.PGC.use_mpu_process_groups()
        model = prov.provide()
        cfg = model.config
        res["padded_vocab"] = ns.padded_vocab(cfg.vocab_size, 128, tp, logging_enabled=False)
        # dtypes as the trainer holds them: Float16Module (bf16 training)
        wrapped = ns.Float16Module(cfg, model) if (cfg.bf16 or cfg.fp16) else model
        dtypes = {}
        for n, t in wrapped.named_parameters():
            dtypes[n[len("module."):] if n.startswith("module.") else n] = str(t.dtype)
        local = [(n, tuple(t.shape), dtypes[n], type(model.get_submodule(n.rsplit(".", 1)[0])).__name__)
                 for n, t in model.named_parameters()]
        # persistent buffers the bridge also loads (router.expert_bias)
        from megatron.bridge.models.conversion.utils import persistent_buffers
        bufs = [(n, tuple(t.shape), "torch.float32" if n.endswith("expert_bias") else str(t.dtype),
                 "buffer") for n, t in persistent_buffers(model)]
        res["local"] = local + bufs
        # layer kinds: (mla, dense mlp)
        kinds = {}
        for i, layer in enumerate(model.decoder.layers):
            mlp = type(layer.mlp).__name__
            kinds[i] = (bool(getattr(cfg, "multi_latent_attention", False)), mlp == "MLP")
        shadow, names = build_shadow(ns, model, res["local"], kinds, cfg, tp)
        res["te"] = names
        # 3. megatron-bridge's load path
        mb = bridge._model_bridge
        pre = ns.PreTrainedCausalLM.from_pretrained(ckpt)
        vp = res["padded_vocab"]
        orig = mb.maybe_modify_loaded_hf_weight

        def pad_vocab(hf_param, sd):
            w = orig(hf_param, sd)
            if hf_param in ("model.embed_tokens.weight", "lm_head.weight") and w.shape[0] < vp:
                # Megatron-LM's checkpoint converters pad the vocabulary rows
                # (they repeat the last row); zeros decode as padding here
                w = torch.cat([w, w.new_zeros((vp - w.shape[0],) + tuple(w.shape[1:]))])
            return w

        mb.maybe_modify_loaded_hf_weight = pad_vocab
        mb.load_weights_hf_to_megatron(pre, [shadow])
        obs = {}
        for n, t in list(shadow.named_parameters()) + list(shadow.named_buffers()):
            v = t.detach().cpu().numpy().astype(np.float64)
            ident = np.floor(v / SHIFT)
            tid, idx = fwmap.decode(ident, v - ident * SHIFT)
            obs[n] = (tid, idx)
        res["obs"] = obs
    except Exception:
        res["error"] = traceback.format_exc()
    with open(out_path, "wb") as f:
        pickle.dump(res, f)
    try:
        torch.distributed.destroy_process_group()
    except Exception:
        pass


def build_shadow(ns, model, local, kinds, cfg, tp):
    """The stage under the TE spec's names: modules named after the TE
    classes, float64 parameters of the local spec's shapes (MLA's down
    projections whole, as TELinear "duplicated" keeps them)."""
    torch = ns.torch
    classes = {}

    def mk(cls_name, layer_number=None):
        if cls_name is None and layer_number is None:
            m = torch.nn.Module()
        elif layer_number is not None:
            m = ns.MegatronModule(cfg)
            m.layer_number = layer_number
        else:
            if cls_name not in classes:
                classes[cls_name] = type(cls_name, (torch.nn.Module,), {})
            m = classes[cls_name]()
            if cls_name == "TELinear":
                m.parallel_mode = "duplicated"
        m.config = cfg
        return m

    root = mk(None)
    names = []
    for n, shape, dtype, kind in local:
        layer = int(n.split(".")[2]) if n.startswith("decoder.layers.") else None
        tn = te_name(n, kinds[layer]) if layer is not None else n
        if tn.endswith(("linear_q_down_proj.weight", "linear_kv_down_proj.weight")):
            shape = (shape[0] * tp,) + tuple(shape[1:])
        path, pname = tn.rsplit(".", 1)
        mod, parts = root, path.split(".")
        for i, part in enumerate(parts):
            if not hasattr(mod, part) or getattr(mod, part) is None:
                sub_path = ".".join(parts[:i + 1])
                ln = None
                if i == 2 and parts[0] == "decoder" and parts[1] == "layers":
                    ln = model.decoder.layers[int(part)].layer_number
                mod.add_module(part, mk(te_class(sub_path) if i == len(parts) - 1 else None, ln))
            mod = getattr(mod, part)
        t = torch.zeros(shape, dtype=torch.float64)
        if kind == "buffer":
            mod.register_buffer(pname, t)
        else:
            mod.register_parameter(pname, torch.nn.Parameter(t, requires_grad=False))
        names.append((tn, tuple(shape), dtype, n))
    return root, names


def run_case(ns, case, ckpt, tmp, timeout=240):
    """Fork one process per rank; returns {rank: result}."""
    import multiprocessing as mp
    model_name, tp, pp, dp, ep, etp = case
    dpw = dp if dp is not None else ep
    world = tp * pp * dpw
    store = tempfile.mktemp(prefix="store", dir=tmp)
    ctx = mp.get_context("fork")
    procs, outs = [], []
    for r in range(world):
        out = os.path.join(tmp, "rank%d.pkl" % r)
        if os.path.exists(out):
            os.unlink(out)
        outs.append(out)
        p = ctx.Process(target=rank_main, args=(ns, r, world, case, ckpt, store, out))
        p.start()
        procs.append(p)
    deadline = time.time() + timeout
    res = {}
    for r, p in enumerate(procs):
        p.join(max(1.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join()
            res[r] = {"rank": r, "error": "timed out after %ds" % timeout}
            continue
        try:
            with open(outs[r], "rb") as f:
                res[r] = pickle.load(f)
        except Exception as e:
            res[r] = {"rank": r, "error": "no result (exit %s): %s" % (p.exitcode, e)}
    if os.path.exists(store):
        os.unlink(store)
    return world, res


# ---- readable layout -------------------------------------------------------

def summarize(tid, idx, names, shapes):
    """Contiguous runs of a parameter, as Hugging Face slices: a matrix row
    by row ('tensor[r0:r1]' whole rows, 'tensor[r0:r1, c0:c1]' part rows,
    'pad xN' padding rows, 'unwritten xN'), a vector element by element."""
    def label(t):
        return "pad" if t == -1 else "unwritten" if t < 0 else names[t]

    if tid.ndim <= 1:
        t, i = tid.reshape(-1), idx.reshape(-1)
        out, s = [], 0
        for e in range(1, len(t) + 1):
            if e < len(t) and t[e] == t[s] and (t[s] < 0 or i[e] == i[e - 1] + 1):
                continue
            if t[s] < 0:
                out.append("%s x%d" % (label(t[s]), e - s))
            else:
                out.append("%s[%d:%d]" % (names[t[s]], i[s], i[s] + e - s))
            s = e
        return " ".join(out)
    t2 = tid.reshape(-1, tid.shape[-1])
    i2 = idx.reshape(t2.shape)
    rows = []  # (tensor or label, hf row, hf col0, ncols)
    for r in range(t2.shape[0]):
        t, i = t2[r], i2[r]
        if (t == t[0]).all() and (t[0] < 0 or (np.diff(i) == 1).all()):
            if t[0] < 0:
                rows.append((label(t[0]), None, None, len(t)))
            else:
                cols = shapes[t[0]][-1]
                rows.append((int(t[0]), int(i[0]) // cols, int(i[0]) % cols, len(t)))
        else:
            rows.append(("mixed", None, None, len(t)))
    runs = []
    for row in rows:
        if runs:
            last = runs[-1]
            if isinstance(row[0], str) and row[0] == last[0]:
                last[4] += 1
                continue
            if (not isinstance(row[0], str) and row[0] == last[0] and row[2] == last[2] and
                    row[3] == last[3] and row[1] == last[1] + last[4]):
                last[4] += 1
                continue
        runs.append([row[0], row[1], row[2], row[3], 1])
    out = []
    for t, r0, c0, n, cnt in runs:
        if isinstance(t, str):
            out.append("%s x%d" % (t, cnt))
        else:
            full = c0 == 0 and n == shapes[t][-1]
            out.append("%s[%d:%d%s]" % (names[t], r0, r0 + cnt,
                                        "" if full else ", %d:%d" % (c0, c0 + n)))
    return " ".join(out)


# ---- main ------------------------------------------------------------------

def refit_available(build):
    try:
        out = subprocess.run([fwmap.refit_plan(build), "framework-map", "--help"],
                             capture_output=True, text=True, timeout=30)
        return out.returncode == 0, (out.stderr or out.stdout).strip()[:200]
    except Exception as e:
        return False, str(e)


def dtype_name(torch_dtype):
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
            "torch.float64": "fp64"}.get(torch_dtype, torch_dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--only", default="")
    ap.add_argument("--case", default="")
    ap.add_argument("--dump", default="")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    try:
        ns = import_megatron()
    except Exception:
        traceback.print_exc()
        print("cannot import the Megatron packages (megatron-core, megatron-bridge)")
        sys.exit(2)
    print("megatron: %s (Transformer Engine: %s); import %.1fs" % (
        ", ".join("%s %s" % kv for kv in ns.versions.items()),
        "yes" if ns.have_te else "no, local spec renamed to the TE spec", time.time() - T0))
    have_refit, why = refit_available(args.build)
    if not have_refit:
        print("refit-plan framework-map is not available (%s): Megatron's side only" % why)
    only = set(filter(None, args.only.split(",")))
    cfgs = hf_configs(ns.transformers)
    tmp = tempfile.mkdtemp(prefix="refit-megatron-")
    dump = open(args.dump, "w") if args.dump else None
    passed = failed = 0
    ckpts, tensors = {}, {}
    try:
        for case in CASES:
            model_name, tp, pp, dp, ep, etp = case
            spec = par_spec(tp, pp, dp, ep, etp)
            if only and model_name not in only:
                continue
            if args.case and args.case not in "%s %s" % (model_name, spec):
                continue
            if model_name not in ckpts:
                tensors[model_name] = hf_tensors(ns, cfgs[model_name])
                ckpts[model_name] = os.path.join(tmp, model_name)
                write_checkpoint(ns, cfgs[model_name], tensors[model_name], ckpts[model_name])
            hf_names = [n for n, _ in tensors[model_name]]
            hf_shapes = [s for _, s in tensors[model_name]]
            cfg_json = os.path.join(ckpts[model_name], "config.json")
            t1 = time.time()
            world, res = run_case(ns, case, ckpts[model_name], tmp)
            if args.v:
                print("# %s %s: %d ranks in %.1fs" % (model_name, spec, world, time.time() - t1))
            for r in range(world):
                label = "megatron %s %s rank %d" % (model_name, spec, r)
                rr = res[r]
                if "error" in rr:
                    failed += 1
                    print("FAIL %s: Megatron's side failed: %s" % (
                        label, rr["error"].strip().splitlines()[-1]))
                    if args.v:
                        print(rr["error"])
                    continue
                if dump:
                    dump.write("== %s  coords %s  padded vocab %d (bridge's own divisor: %d)\n" % (
                        label, rr["coords"], rr["padded_vocab"], rr["bridge_vocab_divisor"]))
                    for tn, shape, dt, ln in rr["te"]:
                        tid, idx = rr["obs"][tn]
                        dump.write("  %s %s %s%s: %s\n" % (
                            tn, list(shape), dtype_name(dt),
                            "" if ln == tn else " (local spec: %s)" % ln,
                            summarize(tid, idx, hf_names, hf_shapes)))
                    for w in rr["warnings"]:
                        dump.write("  warning: %s\n" % w)
                errs = ["bridge: %s" % w for w in rr["warnings"] if "mapping" in w.lower()
                        or "can't find" in w.lower()]
                if not have_refit:
                    failed += 1
                    print("FAIL %s: no refit map (refit-plan framework-map unavailable); "
                          "Megatron's side ran (%d params)" % (label, len(rr["te"])))
                    continue
                try:
                    m = fwmap.load_map(args.build, "megatron", cfg_json, spec, rank=r)
                    entry = [e for e in m["ranks"] if e["rank"] == r]
                    assert entry, "the map has no rank %d" % r
                    exp = fwmap.expected(m, entry[0])
                except Exception as e:
                    failed += 1
                    msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
                    print("FAIL %s: refit's map: %s" % (label, msg.split("): ", 1)[-1]))
                    continue
                ids, _ = fwmap.tensor_ids(m)
                rnames = [t["name"] for t in m["tensors"]]
                extra = [n for n in hf_names if n not in ids]
                allnames = rnames + extra
                trans = np.array([ids[n] if n in ids else len(rnames) + extra.index(n)
                                  for n in hf_names] + [-1, -1], dtype=np.int64)
                for t in m["tensors"]:
                    if t["name"] not in hf_names:
                        errs.append("refit's tensor %s is not in the HF checkpoint" % t["name"])
                    elif tuple(t["shape"]) != hf_shapes[hf_names.index(t["name"])]:
                        errs.append("refit's tensor %s has shape %s, HF %s" % (
                            t["name"], t["shape"], list(hf_shapes[hf_names.index(t["name"])])))
                obs = {}
                for tn, _, _, _ in rr["te"]:
                    tid, idx = rr["obs"][tn]
                    obs[tn] = (np.where(tid >= 0, trans[np.maximum(tid, 0)], tid), idx)
                errs += fwmap.compare(exp, obs, names=allnames)
                mdt = {tn: dtype_name(dt) for tn, _, dt, _ in rr["te"]}
                for p in entry[0]["params"]:
                    if p["name"] in mdt and p["dtype"] != mdt[p["name"]]:
                        errs.append("%s: dtype %s in refit's map, %s in Megatron" % (
                            p["name"], p["dtype"], mdt[p["name"]]))
                if errs:
                    failed += 1
                    print("FAIL %s: %s" % (label, "; ".join(errs[:6])))
                    if args.v:
                        for e in errs[6:40]:
                            print("    " + e)
                else:
                    passed += 1
                    print("PASS %s" % label)
    finally:
        if dump:
            dump.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print("wall %.1fs" % (time.time() - T0))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
