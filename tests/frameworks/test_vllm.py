#!/usr/bin/env python3
"""refit's vLLM map against vLLM's own weight loading.

    build/venv-vllm/bin/python tests/frameworks/test_vllm.py BUILD_DIR
        [--only MODEL,...] [--tp N,...] [--no-ep] [--dump] [--keep]

The vLLM side is vLLM itself (pip install vllm; proven with 0.33.0), on its
CPU platform (VLLM_TARGET_DEVICE=cpu).  Tiny Hugging Face models (MODELS:
llama GQA, qwen2 with q/k/v bias, qwen3 with q_norm / k_norm and tied
embeddings, qwen3_moe as transformers 5 writes its config.json and as the
Hub's files spell it, deepseek_v3 with MLA and a dense first layer) are
written with transformers' config classes, and saved once with
save_pretrained so that the tensor names and shapes are a real
checkpoint's.  For tp 1, 2, 4, 8 (and, for the MoE models, vLLM's expert
parallelism with ep = tp: enable_expert_parallel) the script

  1. forks one process per TP rank; each joins a real torch.distributed
     gloo world through vLLM's own init_distributed_environment and
     initialize_model_parallel (no rank getter is patched);
  2. builds the real model class through vLLM's loader
     (model_loader.utils.initialize_model under the VllmConfig, float32 so
     that the encoding is exact): LlamaForCausalLM, Qwen2ForCausalLM,
     Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM;
  3. fills every parameter, streams the index-encoded checkpoint tensors
     through the model's own load_weights (stacked_params_mapping and each
     layer's weight_loader: QKVParallelLinear, MergedColumnParallelLinear,
     RowParallelLinear, VocabParallelEmbedding / ParallelLMHead, FusedMoE),
     once with ids and once with flat indices (fwmap.encode / decode);
     the first pass pre-fills -7, so that padding vLLM zero-fills is told
     from padding it leaves alone (--dump shows which);
  4. compares every element of every parameter (named_parameters() names)
     with `refit-plan framework-map --framework vllm --par tpN[,epN]
     --rank R` (fwmap.load_map / expected / compare).  The ids vLLM saw
     are renumbered as positions in the map's "tensors" list (a checkpoint
     tensor the list lacks gets an id past its end).  A vLLM parameter
     whose name differs from one of refit's only by one inserted path
     component (vLLM 0.33's "mlp.experts.routed_experts.w13_weight") is
     reported once, with the contents compared anyway.

process_weights_after_loading is not run: the layouts proven are those
load_weights writes (on CUDA some MoE backends reorder w13 afterwards).

Two more cases per model: "hf-tensors" (refit's tensor list, names and
shapes, is exactly the checkpoint transformers writes; a difference
between that checkpoint and transformers' in-memory state_dict is printed
as a note) and "dtypes" (refit's parameter dtypes against vLLM's parameters
built with the config's own dtype, bfloat16).

--dump prints vLLM's observed layout of every case, per parameter, as runs
of rows of the Hugging Face tensors (for reading; works without refit).

Prints "PASS vllm MODEL PAR rank R" or "FAIL ... : first errors" per case,
then "N passed, N failed".  Exit 0 all passed, 1 a failure, 2 vLLM (or
torch / transformers) not importable.
"""
import argparse
import copy
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import fwmap
except ImportError as e:        # not the venv vLLM lives in
    print("cannot import numpy / fwmap: %s" % e)
    sys.exit(2)

TPS = [1, 2, 4, 8]
JOIN_TIMEOUT = 600          # seconds for one tensor-parallel world's jobs

# the tiny models: name -> (transformers config class, architecture,
# kwargs[, config.json keys renamed after save_pretrained])
_DENSE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=8,
              num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
              vocab_size=250, max_position_embeddings=256, dtype="bfloat16")
_MOE = dict(_DENSE, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[])
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(_DENSE)),
    # vLLM's Qwen2Attention takes head_dim = hidden_size // heads and ignores
    # config.head_dim (transformers honours it): hidden 128 keeps head_dim
    # 16 the same in both (q/k/v bias always)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(_DENSE, hidden_size=128)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(_DENSE, tie_word_embeddings=True)),       # q_norm / k_norm
    # transformers 5 writes Qwen3MoeConfig's expert count as
    # "num_local_experts"; the Hub's Qwen3-MoE config.json files (written by
    # transformers 4) say "num_experts": the same model, spelled that way
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_MOE)),
    "qwen3_moe-hubcfg": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_MOE),
                         {"num_local_experts": "num_experts"}),
    # topk_method / scoring_func as in DeepSeek-V3's own config.json: vLLM
    # makes gate.e_score_correction_bias only for topk_method "noaux_tc"
    # (transformers always has it)
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(hidden_size=64, intermediate_size=96,
                         num_attention_heads=8, num_key_value_heads=8,
                         num_hidden_layers=2, vocab_size=250,
                         max_position_embeddings=256, dtype="bfloat16",
                         q_lora_rank=32, kv_lora_rank=32,
                         qk_nope_head_dim=16, qk_rope_head_dim=8,
                         v_head_dim=16, n_routed_experts=8,
                         n_shared_experts=1, moe_intermediate_size=32,
                         first_k_dense_replace=1, num_experts_per_tok=2,
                         n_group=2, topk_group=1, topk_method="noaux_tc",
                         scoring_func="sigmoid")),
}
ARCHS = list(MODELS)
MOE = {"qwen3_moe", "qwen3_moe-hubcfg", "deepseek_v3"}


def write_models(tmp, archs):
    """Write each config.json (transformers' config class), and the
    checkpoint transformers' own model class saves for it.  Returns arch ->
    dict(dir, config, names, shapes, sd_names: the in-memory state_dict
    keys)."""
    import json
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    out = {}
    for arch in archs:
        spec = MODELS[arch]
        cfg = getattr(transformers, spec[0])(**spec[2])
        cfg.architectures = [spec[1]]
        d = os.path.join(tmp, arch)
        os.makedirs(d)
        cfg.save_pretrained(d)      # first: from_config below changes cfg.dtype
        if len(spec) > 3:
            path = os.path.join(d, "config.json")
            j = json.load(open(path))
            for a, b in spec[3].items():
                j[b] = j.pop(a)
            with open(path, "w") as f:
                json.dump(j, f, indent=2)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), dtype=torch.float32)
        sd_names = sorted(model.state_dict())
        ck = os.path.join(d, "hf")
        model.save_pretrained(ck)
        del model
        shapes = {}
        for fn in sorted(os.listdir(ck)):
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(ck, fn), "pt") as f:
                    for k in f.keys():
                        shapes[k] = tuple(f.get_slice(k).get_shape())
        names = sorted(shapes)
        out[arch] = dict(dir=d, config=os.path.join(d, "config.json"),
                         names=names, shapes=[shapes[n] for n in names],
                         sd_names=sd_names)
    return out


# ---------------------------------------------------------------- vLLM side

def vllm_config(model_dir, tp, ep, dtype="float32"):
    from vllm.config import LoadConfig, ModelConfig, ParallelConfig, VllmConfig
    mc = ModelConfig(model=model_dir, tokenizer=model_dir,
                     skip_tokenizer_init=True, dtype=dtype, enforce_eager=True)
    pc = ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=ep)
    return VllmConfig(model_config=mc, parallel_config=pc,
                      load_config=LoadConfig(load_format="dummy"))


def build_model(vc, dtype):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    with set_current_vllm_config(vc), set_default_torch_dtype(dtype), \
            torch.device("cpu"):
        return initialize_model(vc)


SENTINEL = -7.0   # pre-fill of the first pass: tells untouched from zeroed


def observe(vc, names, shapes):
    """Build the model of vc, run its load_weights twice on encoded
    tensors; returns (order, obs, info).  obs: {param: (tid, idx)} int32,
    tid -1 where no tensor landed; info: {param: dict(shape, untouched,
    zeroed, loaded)}."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype
    model = build_model(vc, torch.float32)
    params = list(model.named_parameters())
    snaps = []
    loaded = set()
    for mode in (0, 1):
        with torch.no_grad():
            for _, p in params:
                p.fill_(SENTINEL if mode == 0 else 0.0)

        def weights():
            for tid, (n, s) in enumerate(zip(names, shapes)):
                pair = fwmap.encode(s, tid, torch, torch.float32)
                yield n, pair[mode]
        with set_current_vllm_config(vc), set_default_torch_dtype(torch.float32):
            got = model.load_weights(weights())
        if got is not None:
            loaded |= set(got)
        snaps.append({n: p.detach().to(torch.float64).cpu().numpy().copy()
                      for n, p in params})
    obs, info = {}, {}
    for n, p in params:
        a, b = snaps[0][n], snaps[1][n]
        untouched = a == SENTINEL
        zeroed = a == 0.0
        t, i = fwmap.decode(np.where(untouched, 0.0, a), b)
        obs[n] = (t.astype(np.int32), i.astype(np.int32))
        info[n] = dict(shape=tuple(p.shape), untouched=int(untouched.sum()),
                       zeroed=int(zeroed.sum()), loaded=n in loaded)
    return [n for n, _ in params], obs, info


def param_dtypes(vc):
    """{param: (dtype name, shape)} of the model built with the config's
    own dtype (no loading)."""
    import torch
    model = build_model(vc, vc.model_config.dtype)
    return {n: (str(p.dtype).replace("torch.", ""), tuple(p.shape))
            for n, p in model.named_parameters()}


def worker(tp, rank, jobs, store, outdir):
    """One tensor-parallel rank: vLLM's own distributed init over gloo,
    then every job of this world; results pickled to outdir."""
    log = open(os.path.join(outdir, "log.tp%d.r%d" % (tp, rank)), "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    status = 0
    try:
        import datetime
        import torch
        torch.set_num_threads(1)
        from vllm.config import set_current_vllm_config
        from vllm.distributed import (destroy_distributed_environment,
                                      destroy_model_parallel,
                                      init_distributed_environment,
                                      initialize_model_parallel)
        # a MoE config as the current one, so that the EP group exists
        init_vc = next((j["vc"] for j in jobs if j["moe"]), jobs[0]["vc"])
        with set_current_vllm_config(init_vc):
            init_distributed_environment(
                world_size=tp, rank=rank, local_rank=rank,
                distributed_init_method="file://" + store, backend="gloo",
                timeout=datetime.timedelta(seconds=JOIN_TIMEOUT))
            initialize_model_parallel(tp)
    except Exception:
        traceback.print_exc()
        os._exit(3)
    for job in jobs:
        res = dict(error=None)
        t0 = time.time()
        try:
            if job["kind"] == "load":
                res["order"], res["obs"], res["info"] = observe(
                    job["vc"], job["names"], job["shapes"])
            else:
                res["dtypes"] = param_dtypes(job["vc"])
        except Exception:
            res["error"] = traceback.format_exc()
            status = 4
        res["seconds"] = time.time() - t0
        with open(os.path.join(outdir, "%s.r%d.pkl" % (job["key"], rank)), "wb") as f:
            pickle.dump(res, f)
    try:
        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_world(tp, jobs, outdir):
    """Fork one process per rank; returns {rank: error text} for the ranks
    whose process failed (a rank that cannot join the world ends the
    others at once)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx = mp.get_context("fork")
    store = os.path.join(outdir, "store.tp%d" % tp)
    procs = [ctx.Process(target=worker, args=(tp, r, jobs, store, outdir))
             for r in range(tp)]
    for p in procs:
        p.start()
    deadline = time.time() + JOIN_TIMEOUT
    pending = {p.sentinel: r for r, p in enumerate(procs)}
    errs = {}
    while pending:
        ready = wait(list(pending), timeout=max(0.0, deadline - time.time()))
        if not ready:
            for r in pending.values():
                errs[r] = "rank process timed out after %ds" % JOIN_TIMEOUT
            break
        for s_ in ready:
            r = pending.pop(s_)
            procs[r].join()
            if procs[r].exitcode not in (0, 4):
                logf = os.path.join(outdir, "log.tp%d.r%d" % (tp, r))
                tail = open(logf).read()[-3000:] if os.path.exists(logf) else ""
                errs[r] = "rank process exited %s:\n%s" % (procs[r].exitcode, tail)
        if errs:
            for r in pending.values():
                errs[r] = "ended: another rank of the world failed"
            break
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, 9)
            p.join()
    return errs


# ---------------------------------------------------------------- summaries

def layout_summary(tid, idx, names, shapes):
    """Readable boxes of one observed (or expected) parameter: per run of
    rows (leading dims flattened), which tensor rows/cols it holds."""
    shp = tid.shape
    cols = shp[-1] if len(shp) > 1 else shp[0]
    t2 = tid.reshape(-1, cols)
    i2 = idx.reshape(-1, cols)

    def segs(row):
        out = []
        t, i = t2[row], i2[row]
        c = 0
        while c < cols:
            tt = int(t[c])
            if tt < 0:
                e = c
                while e + 1 < cols and t[e + 1] < 0:
                    e += 1
                out.append((-1, 0, 0, c, e + 1))
                c = e + 1
                continue
            last = shapes[tt][-1] if len(shapes[tt]) > 1 else shapes[tt][0] if shapes[tt] else 1
            sr, sc = divmod(int(i[c]), last)
            e = c
            while (e + 1 < cols and t[e + 1] == tt and i[e + 1] == i[e] + 1
                   and (int(i[e + 1]) // last) == sr):
                e += 1
            out.append((tt, sr, sc, c, e + 1))
            c = e + 1
        return out

    def rowname(r):
        if len(shp) <= 2:
            return str(r)
        lead = np.unravel_index(r, shp[:-1])
        return ",".join(str(int(x)) for x in lead)

    lines = []
    cur = None
    nrows = t2.shape[0]
    for r in range(nrows):
        s = segs(r)
        key = tuple((a, c, d, e) for a, _, c, d, e in s)
        srows = tuple(b for _, b, _, _, _ in s)
        if (cur is not None and cur["key"] == key and
                all(x == y + 1 or a < 0 for x, y, (a, *_) in
                    zip(srows, cur["last"], s)) and
                (len(shp) <= 2 or np.unravel_index(r, shp[:-1])[:-1] ==
                 np.unravel_index(cur["r0"], shp[:-1])[:-1])):
            cur["r1"] = r
            cur["last"] = srows
            continue
        cur = dict(key=key, r0=r, r1=r, first=srows, last=srows)
        lines.append(cur)
    out = []
    for c in lines:
        parts = []
        for (tt, sc, c0, c1), sr0, sr1 in zip(c["key"], c["first"], c["last"]):
            rng = "cols %d:%d" % (c0, c1) if len(shp) > 1 else "%d:%d" % (c0, c1)
            if tt < 0:
                parts.append("%s PAD" % rng)
            elif len(shapes[tt]) > 1:
                parts.append("%s <- %s[%d:%d, %d:%d]" % (
                    rng, names[tt], sr0, sr1 + 1, sc, sc + c1 - c0))
            else:
                parts.append("%s <- %s[%d:%d]" % (rng, names[tt], sc, sc + c1 - c0))
        if len(shp) > 1:
            head = "  rows %s..%s: " % (rowname(c["r0"]), rowname(c["r1"]))
        else:
            head = "  "
        out.append(head + "; ".join(parts))
    return out


def dump_case(title, order, obs, info, names, shapes, dtypes=None):
    print("---- %s" % title)
    for n in order:
        t, i = obs[n]
        inf = info[n]
        extra = []
        if dtypes and n in dtypes:
            extra.append(dtypes[n][0])
        pad = int((t < 0).sum())
        if pad:
            extra.append("%d elements no tensor feeds: %d zero-filled by vLLM's "
                         "loader, %d untouched" % (pad, inf["zeroed"], inf["untouched"]))
        if not inf["loaded"]:
            extra.append("not in load_weights' loaded set")
        print("%s %s %s" % (n, list(inf["shape"]), " ".join(
            "(%s)" % e for e in extra)))
        for line in layout_summary(t, i, names, shapes):
            print(line)


# ---------------------------------------------------------------- refit side

def refit_available(build):
    import subprocess
    exe = fwmap.refit_plan(build)
    if not os.path.exists(exe):
        return "%s does not exist" % exe
    try:
        out = subprocess.run([exe, "framework-map", "--help"],
                             capture_output=True, text=True, timeout=60)
    except Exception as e:  # noqa: BLE001
        return "%s framework-map --help: %s" % (exe, e)
    if out.returncode != 0:
        return "%s framework-map --help exited %d: %s" % (
            exe, out.returncode, (out.stderr or out.stdout).strip()[:300])
    return None


def renamed_contents(exp, obs, names):
    """fwmap.compare, except that a vLLM parameter whose name differs from
    one of refit's only by one inserted path component (vLLM 0.33's
    "experts.routed_experts.") is reported once, with its contents compared
    anyway: the message says whether only the name is wrong."""
    only_exp = set(exp) - set(obs)
    pairs = {}
    for k in sorted(set(obs) - set(exp)):
        parts = k.split(".")
        for j in range(len(parts)):
            k2 = ".".join(parts[:j] + parts[j + 1:])
            if k2 in only_exp and k2 not in pairs.values():
                pairs[k] = k2
                break
    skip = set(pairs) | set(pairs.values())
    out = []
    for k, k2 in pairs.items():
        e = fwmap.compare({k: exp[k2]}, {k: obs[k]}, names=names, limit=4)
        out.append("%s: vLLM's name; refit's map says %s (%s)" % (
            k, k2, "contents equal" if not e else "contents differ: " + "; ".join(e)))
    out += fwmap.compare({k: v for k, v in exp.items() if k not in skip},
                         {k: v for k, v in obs.items() if k not in skip}, names=names)
    return out


def norm_dtype(s):
    s = str(s).lower()
    return {"bfloat16": "bf16", "float32": "fp32", "f32": "fp32",
            "float16": "fp16", "f16": "fp16", "half": "fp16",
            "float": "fp32"}.get(s, s)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--only", default="")
    ap.add_argument("--tp", default="")
    ap.add_argument("--no-ep", action="store_true")
    ap.add_argument("--dump", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    archs = [a for a in args.only.split(",") if a] or ARCHS
    for a in archs:
        if a not in ARCHS:
            ap.error("unknown model %s (one of %s)" % (a, ",".join(ARCHS)))
    tps = [int(x) for x in args.tp.split(",") if x] or TPS
    t_start = time.time()

    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = tempfile.mkdtemp(prefix="refit-vllm-")
    # vLLM and torch are chatty on import: keep it out of the report
    implog = os.path.join(tmp, "import.log")
    saved = os.dup(2), os.dup(1)
    fd = os.open(implog, os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import vllm
        from vllm.model_executor.model_loader.utils import get_model_architecture
        import vllm.model_executor.kernels.linear  # noqa: F401 (lazy import, warm it before forking)
        err = None
    except Exception:
        err = traceback.format_exc()
    finally:
        os.dup2(saved[0], 2)
        os.dup2(saved[1], 1)
        os.close(fd)
    if err:
        print(open(implog).read()[-3000:])
        print("vLLM cannot be imported:\n%s" % err)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(2)
    print("vllm %s, torch %s, transformers %s; models in %s" % (
        vllm.__version__, torch.__version__, transformers.__version__, tmp))
    sys.stdout.flush()

    # Hugging Face models and vLLM configs (built here, before forking)
    fd = os.open(implog, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    try:
        models = write_models(tmp, archs)
        cfgs = {}
        for a in archs:
            for tp in tps:
                for ep in ([False, True] if a in MOE and not args.no_ep else [False]):
                    cfgs[a, tp, ep] = vllm_config(models[a]["dir"], tp, ep)
            cfgs[a, "dtype"] = vllm_config(models[a]["dir"], 1, False, "auto")
            get_model_architecture(cfgs[a, "dtype"].model_config)
    finally:
        os.dup2(saved[0], 2)
        os.close(fd)

    # refit's maps
    why_no_refit = refit_available(build)
    results = []           # (name, ok, errors)

    def case(name, errs):
        results.append((name, not errs, errs))
        if errs:
            print("FAIL %s : %s" % (name, " | ".join(errs[:6]) +
                                    (" | (%d errors)" % len(errs) if len(errs) > 6 else "")))
        else:
            print("PASS %s" % name)
        sys.stdout.flush()

    # vLLM side: one world per tp, every model (and EP) in it
    t_vllm = time.time()
    world_errs = {}
    for tp in tps:
        jobs = []
        for a in archs:
            for ep in ([False, True] if a in MOE and not args.no_ep else [False]):
                jobs.append(dict(kind="load", key="%s.tp%d.ep%d" % (a, tp, ep),
                                 vc=cfgs[a, tp, ep], moe=a in MOE,
                                 names=models[a]["names"], shapes=models[a]["shapes"]))
            if tp == 1:
                jobs.append(dict(kind="dtype", key="%s.dtype" % a, vc=cfgs[a, "dtype"],
                                 moe=a in MOE))
        world_errs[tp] = run_world(tp, jobs, tmp)
        for r, e in sorted(world_errs[tp].items()):
            print("vLLM tp%d rank %d: %s" % (tp, r, e))
    t_vllm = time.time() - t_vllm

    def job_result(key, rank, tp):
        if rank in world_errs[tp]:
            return None, "vLLM rank %d of tp%d failed: %s" % (
                rank, tp, world_errs[tp][rank].splitlines()[0])
        f = os.path.join(tmp, "%s.r%d.pkl" % (key, rank))
        if not os.path.exists(f):
            return None, "vLLM wrote no result for %s rank %d" % (key, rank)
        res = pickle.load(open(f, "rb"))
        if res["error"]:
            return None, "vLLM failed: %s" % res["error"].strip().splitlines()[-1]
        return res, None

    for a in archs:
        m = models[a]
        # refit's tensor list vs the checkpoint transformers writes
        title = "vllm %s hf-tensors" % a
        refit_maps = {}
        if why_no_refit:
            case(title, ["refit-plan unavailable: %s" % why_no_refit])
        else:
            try:
                m0 = fwmap.load_map(build, "vllm", m["config"], "tp1", rank=0)
                refit_maps["tp1", 0] = m0
                rt = {t["name"]: tuple(t["shape"]) for t in m0["tensors"]}
                hf = dict(zip(m["names"], m["shapes"]))
                errs = ["%s %s: in the checkpoint transformers writes, not in refit's tensors" %
                        (n, list(hf[n])) for n in sorted(set(hf) - set(rt))]
                errs += ["%s %s: in refit's tensors, not in the checkpoint transformers writes" %
                         (n, list(rt[n])) for n in sorted(set(rt) - set(hf))]
                errs += ["%s: shape %s in refit's tensors, %s in transformers" %
                         (n, list(rt[n]), list(hf[n])) for n in sorted(set(rt) & set(hf))
                         if rt[n] != hf[n]]
                case(title, errs)
            except Exception as e:  # noqa: BLE001
                case(title, ["refit-plan: %s" % e])
        sd_extra = sorted(set(m["sd_names"]) - set(m["names"]))
        ck_extra = sorted(set(m["names"]) - set(m["sd_names"]))
        if sd_extra or ck_extra:
            print("  note: transformers' in-memory state_dict differs from its saved "
                  "checkpoint: only in state_dict %s; only in checkpoint %d names%s" % (
                      sd_extra, len(ck_extra),
                      " (%s ...)" % ", ".join(ck_extra[:3]) if ck_extra else ""))

        # dtypes (config dtype, tp1)
        dres, derr = job_result("%s.dtype" % a, 0, 1) if 1 in tps else (None, "tp1 not run")
        title = "vllm %s dtypes" % a
        if derr:
            case(title, [derr])
        elif why_no_refit:
            case(title, ["refit-plan unavailable: %s" % why_no_refit])
        else:
            try:
                mp_ = refit_maps.get(("tp1", 0)) or fwmap.load_map(
                    build, "vllm", m["config"], "tp1", rank=0)
                errs = []
                for p in mp_["ranks"][0]["params"]:
                    v = dres["dtypes"].get(p["name"])
                    if v is not None and norm_dtype(v[0]) != norm_dtype(p["dtype"]):
                        errs.append("%s: refit says %s, vLLM has %s" % (p["name"], p["dtype"], v[0]))
                case(title, errs)
            except Exception as e:  # noqa: BLE001
                case(title, ["refit-plan: %s" % e])

        for tp in tps:
            for ep in ([False, True] if a in MOE and not args.no_ep else [False]):
                par = "tp%d" % tp + (",ep%d" % tp if ep else "")
                key = "%s.tp%d.ep%d" % (a, tp, ep)
                for r in range(tp):
                    title = "vllm %s %s rank %d" % (a, par, r)
                    res, err = job_result(key, r, tp)
                    if err:
                        case(title, [err])
                        continue
                    names = list(m["names"])
                    shapes = list(m["shapes"])
                    if args.dump:
                        dump_case(title + " (vLLM observed)", res["order"], res["obs"],
                                  res["info"], names, shapes,
                                  dres["dtypes"] if dres else None)
                    if why_no_refit:
                        case(title, ["refit-plan unavailable: %s" % why_no_refit])
                        continue
                    try:
                        rm = fwmap.load_map(build, "vllm", m["config"], par, rank=r)
                        ranks = [x for x in rm["ranks"] if x["rank"] == r]
                        if len(ranks) != 1:
                            case(title, ["refit's map has %d entries for rank %d" % (len(ranks), r)])
                            continue
                        exp = fwmap.expected(rm, ranks[0])
                    except Exception as e:  # noqa: BLE001
                        case(title, ["refit-plan: %s" % e])
                        continue
                    # vLLM was fed the checkpoint's tensors; renumber them as
                    # positions in refit's list (names refit lacks go after)
                    rnames = [t["name"] for t in rm["tensors"]]
                    rid = {n: k for k, n in enumerate(rnames)}
                    allnames = rnames + [n for n in names if n not in rid]
                    aid = {n: k for k, n in enumerate(allnames)}
                    remap = np.array([aid[n] for n in names] + [-1], dtype=np.int64)
                    obs = {}
                    for n, (t, i) in res["obs"].items():
                        t = t.astype(np.int64)
                        obs[n] = (remap[t], i.astype(np.int64))
                    errs = renamed_contents(exp, obs, allnames)
                    case(title, errs)

    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    npass = sum(1 for _, ok, _ in results if ok)
    nfail = len(results) - npass
    print("vLLM loading %.1fs, total %.1fs" % (t_vllm, time.time() - t_start))
    print("%d passed, %d failed" % (npass, nfail))
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
