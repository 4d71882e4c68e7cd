#!/usr/bin/env python3
"""refit's SGLang map against SGLang's own weight loading.

    build/venv-sglang/bin/python tests/frameworks/test_sglang.py BUILD_DIR
        [--only MODEL[,MODEL]] [--par SPEC[/SPEC]] [--dump]

The SGLang side is SGLang itself (pip install sglang; proven with 0.5.23,
torch 2.14.1, transformers 5.19.0), on CPU, one process, no
torch.distributed.  For each tiny Hugging Face model (MODELS: written with
transformers' config classes and saved once with save_pretrained, so that
the tensor names and shapes are those of a real checkpoint), each parallel
spec and each rank, the script

  1. publishes the engine's configuration the way a scheduler process does
     (runtime_context.publish(ServerArgs(model_path=DIR, tp_size=TP,
     dp_size=DP, ep_size=EP, device="cpu"), ranks=SpawnRanks(world_rank=
     TP rank, dp_rank=instance)), then initialize_moe_config()), and states
     the parallel groups as plain objects with rank_in_group / world_size:
     no process group exists, and SGLang's layers read only those fields
     while building and loading (as sglang.test.parallel_groups does);
  2. builds the real model class through SGLang's loader
     (model_loader.loader._initialize_model(ModelConfig, LoadConfig):
     LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
     Qwen3MoeForCausalLM from SGLang's architecture registry);
  3. zero-fills every parameter and streams the index-encoded checkpoint
     tensors through DefaultModelLoader.load_weights_and_postprocess (what
     update_weights_from_disk runs: model.load_weights, then each quant
     method's process_weights_after_loading), once with ids and once with
     flat indices (fwmap.encode / fwmap.decode), float32;
  4. compares every element of every parameter (named_parameters() names)
     with `refit-plan framework-map --framework sglang --model CONFIG.json
     --par SPEC --rank R` (fwmap.load_map / expected / compare);
  5. per spec, SGLang's side alone: the ranks together hold every element
     of every checkpoint tensor (nothing skipped by its loader).

One workaround, outside the weights: RotaryEmbedding.__init__ picks a
fused rope kernel on a platform that is neither CUDA nor SGLang's CPU
engine (`from vllm._custom_ops import rotary_embedding`: vllm is not
installed); sglang.srt.layers.rotary_embedding.base._is_cpu is set to True
so that it keeps its native forward.  Nothing else is patched: in
particular SGLANG_USE_CPU_ENGINE stays unset, so the linear / embedding /
fused-MoE weight loaders take their CUDA branches (the CPU engine pads
uneven shards instead).  What this cannot see: post-load repacking that
only runs on a GPU or behind a flag (SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED
interleaves w13 rows; --moe-runner-backend flashinfer_cutlass loads w13 as
[up | gate]; flashinfer_trtllm, SGLang's default for DeepSeek-family MoE
on SM100, block-permutes w13 / w2): the maps proven are those of the
default (triton) MoE runner.

--dump prints SGLang's observed layout, per parameter, as runs of rows of
the Hugging Face tensors (reading aid; the comparison does not need it).

Prints "PASS sglang MODEL SPEC rank R" or "FAIL ...: first errors" per
case, then "N passed, N failed".  Exit 0 all passed, 1 a failure, 2 SGLang
(or torch / transformers / numpy) not importable.
"""
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import fwmap
except ImportError as _e:   # not the SGLang venv
    print("cannot import numpy: %s" % _e)
    sys.exit(2)

# parallel specs (refit's --par; SGLang: --tp-size, --dp-size replicas
# without DP attention, --ep-size), for every model / for MoE models / for
# llama (dp: refit's rank = instance * tp + tp rank)
PARS = ("tp1", "tp2", "tp4", "tp8")
PARS_MOE = ("tp2,ep2", "tp4,ep4", "tp8,ep8")
PARS_DP = ("tp2,dp2",)

# the tiny models: (name, transformers config class, architecture, kwargs
# [, config.json keys renamed (None: dropped) after save_pretrained])
COMMON = dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16,
              hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              vocab_size=250)
MODELS = [
    ("llama", "LlamaConfig", "LlamaForCausalLM", dict(COMMON)),  # untied
    ("qwen2", "Qwen2Config", "Qwen2ForCausalLM",
     dict(COMMON, tie_word_embeddings=False)),          # q/k/v bias always
    # head_dim == hidden_size / num_attention_heads, as in Qwen2 checkpoints
    # (above: head_dim 16, hidden 64 / 8 heads = 8, which SGLang's Qwen2
    # honours: it reads config.head_dim)
    ("qwen2-hidden128", "Qwen2Config", "Qwen2ForCausalLM",
     dict(COMMON, hidden_size=128, tie_word_embeddings=False)),
    ("qwen3", "Qwen3Config", "Qwen3ForCausalLM",
     dict(COMMON, tie_word_embeddings=True)),           # q_norm / k_norm
    ("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(COMMON, num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=32, tie_word_embeddings=False)),
    # transformers 5 writes Qwen3MoeConfig's expert count as
    # "num_local_experts"; the Hub's Qwen3-MoE config.json files (written by
    # transformers 4) say "num_experts": the same model, spelled that way
    ("qwen3_moe-hubcfg", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(COMMON, num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=32, tie_word_embeddings=False),
     {"num_local_experts": "num_experts"}),
    # vocabulary 200 pads to 256: at tp8 rank 6 holds 8 rows and 24 of
    # padding, rank 7 only padding; kv_heads 1: every rank one replica
    ("llama-v200-kv1", "LlamaConfig", "LlamaForCausalLM",
     dict(COMMON, vocab_size=200, num_key_value_heads=1)),
    # attention_bias: HF Llama (and Qwen3) put it on q, k, v and o_proj;
    # SGLang keeps o_proj.bias whole on every rank
    ("llama-attnbias", "LlamaConfig", "LlamaForCausalLM",
     dict(COMMON, attention_bias=True)),
    # a config.json without "tie_word_embeddings": transformers' class
    # default (False for every model type here) decides, and SGLang reads
    # the config through transformers
    ("llama-notiekey", "LlamaConfig", "LlamaForCausalLM", dict(COMMON),
     {"tie_word_embeddings": None}),
]
# the specs each model runs (default: PARS)
MODEL_PARS = {
    "llama": PARS + PARS_DP,
    "qwen3_moe": PARS + PARS_MOE,
    "qwen3_moe-hubcfg": PARS + PARS_MOE,
    "llama-v200-kv1": ("tp4", "tp8"),
    "llama-attnbias": ("tp1", "tp2"),
    "llama-notiekey": ("tp2",),
}


# ------------------------------------------------------------ SGLang side


def import_stack():
    """Import torch, transformers and the SGLang pieces used; exit 2 if not."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import torch
        import transformers
        import sglang
        from sglang.srt.server_args import ServerArgs
        from sglang.srt import runtime_context as rc
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.model_loader import loader
        import sglang.srt.layers.rotary_embedding.base as rope_base
    except Exception as e:  # ImportError, or a CUDA probe at import time
        print("cannot import SGLang: %s: %s" % (type(e).__name__, e))
        traceback.print_exc()
        sys.exit(2)
    # the one workaround (see the module docstring)
    rope_base._is_cpu = True
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    return dict(torch=torch, transformers=transformers, sglang=sglang,
                ServerArgs=ServerArgs, rc=rc, ModelConfig=ModelConfig,
                LoadConfig=LoadConfig, loader=loader)


class Group:
    """A parallel group as SGLang's layers read it while building and
    loading: rank_in_group, world_size (and the pipeline ends)."""

    def __init__(self, name, rank, size):
        self.name, self.rank_in_group, self.world_size = name, rank, size
        self.rank = self.local_rank = rank
        self.ranks = list(range(size))
        self.is_first_rank, self.is_last_rank = rank == 0, rank == size - 1
        self.device_group = self.cpu_group = None

    def __repr__(self):
        return "Group(%s %d/%d)" % (self.name, self.rank_in_group, self.world_size)


def parse_par(par):
    """refit's sglang SPEC tpN[,dpM][,epK] -> (tp, dp, ep)."""
    d = {"tp": 1, "dp": 1, "ep": 1}
    for f in par.split(","):
        d[f[:2]] = int(f[2:])
    return d["tp"], d["dp"], d["ep"]


def publish(S, model_dir, par, rank):
    """Publish an engine's configuration for refit's rank `rank` (instance
    rank // tp, TP rank rank % tp), as that scheduler process does, and
    state its groups; returns the ServerArgs."""
    rc = S["rc"]
    tp, dp, ep = parse_par(par)
    inst, rank = divmod(rank, tp)
    rc.reset_context()
    sa = S["ServerArgs"](model_path=model_dir, tp_size=tp, dp_size=dp, ep_size=ep,
                         device="cpu")
    rc.publish(sa, role="test", ranks=rc.SpawnRanks(
        world_rank=rank, dp_rank=inst if dp > 1 else None))
    p = rc.get_parallel()
    ranks = dict(
        tp=(p.tp_rank, p.tp_size), attn_tp=(p.attn_tp_rank, p.attn_tp_size),
        attn_cp=(p.attn_cp_rank, p.attn_cp_size), pp=(p.pp_rank, p.pp_size),
        moe_ep=(p.moe_ep_rank, p.moe_ep_size), moe_tp=(p.moe_tp_rank, p.moe_tp_size),
        moe_dp=(p.moe_dp_rank, p.moe_dp_size), dcp=(0, 1), world=(rank, tp),
        shared_experts_tp=(p.tp_rank, p.tp_size))
    p.override_permanently(**{k + "_group": Group(k, r, n) for k, (r, n) in ranks.items()})
    assert (p.tp_rank, p.tp_size) == (rank, tp), (p.tp_rank, p.tp_size)
    # the scheduler seeds the MoE runtime flags right after publish
    from sglang.srt.layers.moe.utils import initialize_moe_config
    initialize_moe_config()
    return sa


def sglang_model(S, model_dir, par, rank):
    torch = S["torch"]
    sa = publish(S, model_dir, par, rank)
    mc = S["ModelConfig"].from_server_args(sa)
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    with set_default_torch_dtype(torch.float32), torch.device("cpu"):
        model = S["loader"]._initialize_model(mc, S["LoadConfig"]())
    return model


def observe(S, model, ckpt, ids):
    """Load the index-encoded checkpoint twice (ids, then indices) through
    SGLang's loader; {param name: (tid, idx)} as fwmap.decode gives them."""
    torch = S["torch"]
    loader = S["loader"].DefaultModelLoader
    seen = {}
    for k in (0, 1):
        with torch.no_grad():
            for _, p in model.named_parameters():
                p.data.zero_()

        def weights(k=k):
            for name, shape in ckpt:
                yield name, fwmap.encode(shape, ids[name], torch=torch,
                                         dtype=torch.float32)[k]
        loader.load_weights_and_postprocess(model, weights(), torch.device("cpu"))
        # parameters may be rebound by a post-load step: read them again
        for name, p in model.named_parameters():
            seen.setdefault(name, []).append(p.detach().float().cpu().numpy().copy())
    return {name: fwmap.decode(v[0], v[1]) for name, v in seen.items()}


# ------------------------------------------------------------ models


def write_models(S, tmp):
    """Write each tiny model's config.json and a save_pretrained checkpoint;
    returns {name: (dir, [(tensor name, shape)] in checkpoint order)}."""
    torch, tr = S["torch"], S["transformers"]
    from safetensors import safe_open
    out = {}
    torch.manual_seed(0)
    for name, cls, arch, kw, *rename in MODELS:
        d = os.path.join(tmp, name)
        cfg = getattr(tr, cls)(architectures=[arch], **kw)
        m = tr.AutoModelForCausalLM.from_config(cfg)
        m.save_pretrained(d)
        if rename:
            path = os.path.join(d, "config.json")
            with open(path) as f:
                j = json.load(f)
            for a, b in rename[0].items():   # b None: drop the key
                v = j.pop(a)
                if b is not None:
                    j[b] = v
            with open(path, "w") as f:
                json.dump(j, f, indent=2)
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            ckpt = [(k, tuple(f.get_slice(k).get_shape())) for k in f.keys()]
        out[name] = (d, ckpt)
    return out


# ------------------------------------------------------------ reading


def runs(tid, idx, names, shapes):
    """Readable runs of one parameter: rows of the param (leading dims
    flattened) as rows of the logical tensors."""
    if tid.ndim == 1:
        return runs1(tid, idx, names)
    t2 = tid.reshape(-1, tid.shape[-1])
    i2 = idx.reshape(-1, idx.shape[-1])
    rows = []
    for r in range(t2.shape[0]):
        t, ix = t2[r], i2[r]
        if (t == -1).all():
            rows.append(("pad", None, None, None))
            continue
        if not (t == t[0]).all() or t[0] < 0:
            rows.append(("mixed", None, None, None))
            continue
        shp = shapes[int(t[0])]
        cols = shp[-1] if len(shp) > 1 else int(np.prod(shp))
        src_row, c0 = divmod(int(ix[0]), cols)
        ok = (np.diff(ix) == 1).all() and c0 + len(ix) <= cols
        rows.append((int(t[0]), src_row if ok else None, c0 if ok else None,
                     len(ix) if ok else None))
    out = []
    for r, (t, sr, c0, n) in enumerate(rows):
        if out:
            a, b, pt, psr0, psr1, pc0, pn = out[-1]
            if (t == pt and c0 == pc0 and n == pn and
                    (t in ("pad", "mixed") or (sr is not None and psr1 is not None
                                               and sr == psr1 + 1))):
                out[-1] = (a, r, pt, psr0, sr, pc0, pn)
                continue
        out.append((r, r, t, sr, sr, c0, n))
    lines = []
    for a, b, t, s0, s1, c0, n in out:
        if t == "pad":
            src = "padding (zero)"
        elif t == "mixed":
            src = "mixed tensors in a row"
        elif s0 is None:
            src = "%s (not a row slice)" % names[t]
        else:
            src = "%s rows %d..%d cols %d..%d" % (names[t], s0, s1, c0, c0 + n - 1)
        lines.append("    rows %d..%d <- %s" % (a, b, src))
    return lines


def runs1(tid, idx, names):
    """Readable runs of a 1-D parameter: element ranges of the tensors."""
    out = []
    for e in range(len(tid)):
        t, i = int(tid[e]), int(idx[e])
        if out and out[-1][2] == t and (t < 0 or out[-1][4] == i - 1):
            out[-1][1], out[-1][4] = e, i
        else:
            out.append([e, e, t, i, i])
    return ["    elems %d..%d <- %s" % (a, b, "padding (zero)" if t < 0 else
                                         "%s[%d..%d]" % (names[t], i0, i1))
            for a, b, t, i0, i1 in out]


def dump(name, par, rank, obs, names, shapes):
    print("== sglang %s %s rank %d" % (name, par, rank))
    for p in sorted(obs):
        t, i = obs[p]
        print("  %s %s" % (p, list(t.shape)))
        for ln in runs(t, i, names, shapes):
            print(ln)


# ------------------------------------------------------------ main


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    opts = {}
    it = iter(argv)
    for a in it:
        if a in ("--only", "--par"):
            opts[a] = next(it)
        elif a == "--dump":
            opts[a] = True
    if not args:
        print(__doc__)
        return 2
    build = args[0]
    only = opts.get("--only", "").split(",") if "--only" in opts else None
    t0 = time.time()
    S = import_stack()
    print("sglang %s, torch %s, transformers %s (imported in %.1fs)" % (
        S["sglang"].__version__, S["torch"].__version__,
        S["transformers"].__version__, time.time() - t0))
    passed = failed = 0
    tmp = tempfile.mkdtemp(prefix="refit-sglang-")
    try:
        models = write_models(S, tmp)
        for name, *_ in MODELS:
            if only and name not in only:
                continue
            d, ckpt = models[name]
            cfg_path = os.path.join(d, "config.json")
            pars = MODEL_PARS.get(name, PARS)
            if "--par" in opts:
                pars = opts["--par"].split("/")
            for par in pars:
                held = {}   # tensor name -> bool array: some rank holds it
                unloaded = []
                tp, dp, _ = parse_par(par)
                for rank in range(tp * dp):
                    case = "sglang %s %s rank %d" % (name, par, rank)
                    try:
                        errs, obs, names, shapes = run_case(
                            S, build, d, cfg_path, ckpt, par, rank)
                        mark_held(held, obs, names, shapes)
                    except Exception as e:   # SGLang's side failed
                        errs, obs = ["%s: %s" % (type(e).__name__, e)], None
                        unloaded.append(rank)
                        tb = traceback.format_exc().strip().splitlines()
                        errs += ["  " + ln for ln in tb[-6:]]
                    if opts.get("--dump") and obs is not None:
                        dump(name, par, rank, obs, names, shapes)
                    if errs:
                        failed += 1
                        print("FAIL %s: %s" % (case, "\n    ".join(errs[:12])))
                    else:
                        passed += 1
                        print("PASS %s" % case)
                    sys.stdout.flush()
                # SGLang's side alone: the TP group holds every element of
                # every checkpoint tensor (none skipped by its loader)
                case = "sglang %s %s: the ranks hold the whole checkpoint" % (name, par)
                errs = coverage(held, ckpt) if not unloaded else [
                    "not checked: SGLang did not load rank(s) %s" % unloaded]
                if errs:
                    failed += 1
                    print("FAIL %s: %s" % (case, "\n    ".join(errs[:12])))
                else:
                    passed += 1
                    print("PASS %s" % case)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("wall %.1fs" % (time.time() - t0))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def mark_held(held, obs, names, shapes):
    for tid, idx in obs.values():
        for t in np.unique(tid[tid >= 0]):
            t = int(t)
            h = held.setdefault(names[t], np.zeros(int(np.prod(shapes[t])), bool))
            h[idx[tid == t]] = True


def coverage(held, ckpt):
    errs = []
    for k, shp in ckpt:
        h = held.get(k)
        if h is None:
            errs.append("%s: held by no rank" % k)
        elif not h.all():
            errs.append("%s: %d of %d elements held by no rank (first: flat %d)" % (
                k, int((~h).sum()), h.size, int(np.argmin(h))))
    return errs


def load_map(build, cfg_path, par, rank):
    """fwmap.load_map, again after the binary is back when it is being
    relinked under us (a shared build tree): polls for it, 60 s at most."""
    for attempt in range(3):
        try:
            return fwmap.load_map(build, "sglang", cfg_path, par, rank=rank)
        except OSError:
            if attempt == 2:
                raise
            exe, end = fwmap.refit_plan(build), time.time() + 60
            while not os.access(exe, os.X_OK) and time.time() < end:
                time.sleep(0.2)


def run_case(S, build, model_dir, cfg_path, ckpt, par, rank):
    """One (model, par, rank): (errors, observed, id -> name, id -> shape)."""
    errs = []
    shapes_ck = dict(ckpt)
    m = None
    try:
        m = load_map(build, cfg_path, par, rank)
    except Exception as e:
        errs.append("refit-plan: %s" % e)
    if m is not None:
        ids, shapes = fwmap.tensor_ids(m)
        names = [t["name"] for t in m["tensors"]]
        for t in m["tensors"]:
            if t["name"] not in shapes_ck:
                errs.append("%s: in refit's tensors, not in the checkpoint" % t["name"])
            elif tuple(t["shape"]) != shapes_ck[t["name"]]:
                errs.append("%s: shape %s in refit's tensors, %s in the checkpoint" % (
                    t["name"], t["shape"], list(shapes_ck[t["name"]])))
    else:
        ids, shapes, names = {}, [], []
    # checkpoint tensors refit does not list still get an id (after its own)
    for k, shp in ckpt:
        if k not in ids:
            if m is not None:
                errs.append("%s: in the checkpoint, not in refit's tensors" % k)
            ids[k] = len(names)
            names.append(k)
            shapes.append(shp)
    model = sglang_model(S, model_dir, par, rank)
    obs = observe(S, model, ckpt, ids)
    if m is not None:
        ranks = [r for r in m["ranks"] if r["rank"] == rank]
        if len(ranks) != 1:
            errs.append("refit's map has %d entries for rank %d" % (len(ranks), rank))
        else:
            try:
                exp = fwmap.expected(m, ranks[0])
                errs += fwmap.compare(exp, obs, names=names)
            except Exception as e:   # a piece outside its tensor, an overlap
                errs.append("refit's map: %s: %s" % (type(e).__name__, e))
    return errs, obs, names, shapes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
