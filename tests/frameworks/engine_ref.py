#!/usr/bin/env python3
"""The bytes an inference engine holds after loading a Hugging Face
checkpoint, by the engine's own loader: the reference an end-to-end test
compares refit's writes into engine-layout memory against.

    build/venv-vllm/bin/python tests/frameworks/engine_ref.py --framework vllm \
        --config DIR --tp N --out OUTDIR [--ep] [--dtype D] [--allow-untouched]
    build/venv-sglang/bin/python tests/frameworks/engine_ref.py --framework sglang \
        --config DIR --tp N --out OUTDIR [--ep] [--dtype D] [--allow-untouched]

DIR holds a Hugging Face config.json and *.safetensors (model.safetensors).
For every TP rank r, OUTDIR/rank{r}.npz maps each parameter name, as the
engine's named_parameters() gives it, to the parameter's bytes as a numpy
array of its shape: bf16 as the uint16 bit patterns, fp32 as float32
(fp16 as float16, fp8 as uint8 bit patterns, integers as they are).

The engine builds the model in the checkpoint's dtype (the one floating
dtype of its safetensors tensors; --dtype bfloat16|float16|float32
overrides it) and never in float32 unless the checkpoint is float32: the
bytes are those the engine really holds.  Nothing is converted on the way
out.  Engine construction is the proofs' (test_vllm.py / test_sglang.py,
imported as modules, unchanged):

  vllm    vLLM's CPU platform, one forked process per TP rank joined in a
          gloo world by vLLM's init_distributed_environment /
          initialize_model_parallel (test_vllm.run_world); the model class
          from model_loader.utils.initialize_model (test_vllm.build_model),
          then vLLM's DefaultModelLoader(load_format="safetensors")
          .load_weights: vLLM's own safetensors iterator, the model's
          load_weights and vLLM's strict check that every parameter was
          loaded.  process_weights_after_loading is not run, as in the
          proof: on CPU it hands the linear weights to a packed CPU GEMM
          (dispatch_cpu_unquantized_gemm, remove_weight=True), which a GPU
          engine does not do; on CUDA it leaves unquantized bf16 weights
          as load_weights wrote them.
  sglang  one process, every rank in turn, its configuration published as a
          scheduler does and its groups stated as plain objects
          (test_sglang.publish, ServerArgs with dtype=D); the model class
          from model_loader.loader._initialize_model, then
          DefaultModelLoader._get_all_weights (SGLang's own safetensors
          iterator) through DefaultModelLoader.load_weights_and_postprocess
          (model.load_weights, then each quant method's
          process_weights_after_loading, as SGLang's load_model and
          update_weights_from_disk do).

--ep: the engines' expert parallelism with ep = tp (vLLM
enable_expert_parallel, SGLang ep_size = tp; refit's spec tpN,epN).

Every parameter is pre-filled with NaN before loading.  An element still
NaN afterwards was left alone by the engine's loader (on a real engine it
holds whatever torch.empty gave): that is an error naming the parameter
(--allow-untouched writes the arrays anyway, NaN there).  The engines
zero-fill vocabulary padding rows (VocabParallelEmbedding /
ParallelLMHead.weight_loader), so the padding in the reference is zero.

OUTDIR's rank{r}.npz for r < N are removed first, so that a failed run
leaves none from an earlier one.  Prints one line per rank written (stdout;
the engine's own messages are kept out of it); exit 0 on success, 1 when the engine
failed or left elements untouched, 2 when the engine (or torch) cannot be
imported or the arguments / checkpoint are unusable.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# safetensors dtype -> engine dtype name (the floating ones decide the model's)
ST_FLOAT = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def fail(code, msg):
    print("engine_ref: %s" % msg, file=sys.stderr)
    sys.stdout.flush()
    sys.exit(code)


# ------------------------------------------------------------ checkpoint


def safetensors_header(path):
    """{tensor name: (safetensors dtype, shape)} from a file's header."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("%s: too short for a safetensors file" % path)
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise ValueError("%s: header of %d bytes: not a safetensors file" % (path, n))
        h = json.loads(f.read(n))
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in h.items()
            if k != "__metadata__"}


def checkpoint_dtype(cfgdir, override):
    """The dtype the engine builds the model in: --dtype, else the one
    floating dtype of the checkpoint's tensors."""
    if not os.path.isfile(os.path.join(cfgdir, "config.json")):
        fail(2, "%s has no config.json" % cfgdir)
    files = sorted(f for f in os.listdir(cfgdir) if f.endswith(".safetensors"))
    if not files:
        fail(2, "%s has no .safetensors file" % cfgdir)
    seen = {}
    for fn in files:
        try:
            for name, (dt, _) in safetensors_header(os.path.join(cfgdir, fn)).items():
                seen.setdefault(dt, name)
        except (OSError, ValueError, KeyError) as e:
            fail(2, "cannot read %s: %s" % (fn, e))
    floats = sorted(dt for dt in seen if dt in ST_FLOAT)
    if override:
        return override
    if len(floats) != 1:
        fail(2, "the checkpoint's floating tensors are %s (e.g. %s): pass --dtype" % (
            floats or "none", ", ".join(seen[d] for d in floats) or "-"))
    return ST_FLOAT[floats[0]]


# ------------------------------------------------------------ parameters


def prefill(model, torch):
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dtype.is_floating_point:
                p.data.fill_(float("nan"))


def dump_params(model, torch, np):
    """{name: numpy array of the parameter's bytes}, {name: elements still
    NaN}, {dtype name: count}."""
    arrays, untouched, dtypes = {}, {}, {}
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous()
        dt = str(t.dtype).replace("torch.", "")
        dtypes[dt] = dtypes.get(dt, 0) + 1
        if t.dtype.is_floating_point:
            try:
                n = int(torch.isnan(t.float()).sum())
            except (RuntimeError, TypeError):
                n = 0
            if n:
                untouched[name] = n
        if t.dtype == torch.bfloat16:
            a = t.view(torch.int16).numpy().view(np.uint16)
        elif t.dtype.is_floating_point and t.element_size() == 1:      # fp8
            a = t.view(torch.uint8).numpy()
        else:
            a = t.numpy()
        arrays[name] = a.copy()
    return arrays, untouched, dtypes


def write_rank(out, rank, arrays, np):
    """OUTDIR/rank{r}.npz, written whole or not at all."""
    path = os.path.join(out, "rank%d.npz" % rank)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return path


def summary(rank, path, arrays, untouched, dtypes):
    return dict(rank=rank, path=path, params=len(arrays),
                nbytes=int(sum(a.nbytes for a in arrays.values())),
                dtypes=dtypes, untouched=untouched)


# ------------------------------------------------------------ vLLM


def _quiet(logpath):
    """Send fds 1 and 2 to logpath; returns the saved fds."""
    saved = os.dup(1), os.dup(2)
    fd = os.open(logpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


def _loud(saved):
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])


def _vllm_worker(tp, rank, jobs, store, tmpdir):
    """One TP rank (forked by test_vllm.run_world in place of its worker):
    vLLM's distributed init over gloo as the proof's worker does, then
    build, load, write rank{r}.npz; exit 0, or 3 with the traceback in the
    rank's log (run_world reports its tail)."""
    log = open(os.path.join(tmpdir, "log.tp%d.r%d" % (tp, rank)), "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    job = jobs[0]
    try:
        import datetime
        import numpy as np
        import torch
        torch.set_num_threads(1)
        import test_vllm
        from vllm.config import LoadConfig, set_current_vllm_config
        from vllm.distributed import (destroy_distributed_environment,
                                      destroy_model_parallel,
                                      init_distributed_environment,
                                      initialize_model_parallel)
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        from vllm.utils.torch_utils import set_default_torch_dtype
        vc = job["vc"]
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=tp, rank=rank, local_rank=rank,
                distributed_init_method="file://" + store, backend="gloo",
                timeout=datetime.timedelta(seconds=test_vllm.JOIN_TIMEOUT))
            initialize_model_parallel(tp)
        dtype = vc.model_config.dtype
        model = test_vllm.build_model(vc, dtype)
        prefill(model, torch)
        loader = DefaultModelLoader(LoadConfig(load_format="safetensors"))
        with set_current_vllm_config(vc), set_default_torch_dtype(dtype):
            loader.load_weights(model, vc.model_config)
        arrays, untouched, dtypes = dump_params(model, torch, np)
        path = None
        if not untouched or job["allow_untouched"]:
            path = write_rank(job["out"], rank, arrays, np)
        with open(os.path.join(tmpdir, "rank%d.json" % rank), "w") as f:
            json.dump(summary(rank, path, arrays, untouched, dtypes), f)
        destroy_model_parallel()
        destroy_distributed_environment()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_vllm(args, dtype, tmp):
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    implog = os.path.join(tmp, "import.log")
    saved = _quiet(implog)
    try:
        import test_vllm
        import vllm
        from vllm.model_executor.model_loader.utils import get_model_architecture
        import vllm.model_executor.kernels.linear  # noqa: F401 (warm before forking)
        err = None
    except BaseException:
        err = traceback.format_exc()
    finally:
        _loud(saved)
    if err:
        print(open(implog).read()[-2000:], file=sys.stderr)
        fail(2, "vLLM cannot be imported (run this with build/venv-vllm/bin/python):\n%s" % err)
    saved = _quiet(implog)
    try:
        vc = test_vllm.vllm_config(args.config, args.tp, args.ep, dtype=dtype)
        get_model_architecture(vc.model_config)
        err = None
    except BaseException:
        err = traceback.format_exc()
    finally:
        _loud(saved)
    if err:
        fail(1, "vLLM refuses the model in %s (tp %d, dtype %s):\n%s" % (
            args.config, args.tp, dtype, err))
    # test_vllm.run_world forks test_vllm.worker: ours in its place
    test_vllm.worker = _vllm_worker
    jobs = [dict(vc=vc, out=args.out, allow_untouched=args.allow_untouched)]
    errs = test_vllm.run_world(args.tp, jobs, tmp)
    if errs:
        for r, e in sorted(errs.items()):
            print("vLLM tp%d rank %d: %s" % (args.tp, r, e), file=sys.stderr)
        fail(1, "vLLM failed on rank(s) %s" % sorted(errs))
    out = []
    for r in range(args.tp):
        with open(os.path.join(tmp, "rank%d.json" % r)) as f:
            out.append(json.load(f))
    return "vllm %s" % vllm.__version__, out


# ------------------------------------------------------------ SGLang


def run_sglang(args, dtype, tmp):
    import functools
    import numpy as np
    import test_sglang
    S = test_sglang.import_stack()      # exits 2 when SGLang is not importable
    torch = S["torch"]
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    # the published ServerArgs carry the checkpoint's dtype (SGLang's "auto"
    # takes config.json's dtype, and float16 when it has none)
    S = dict(S, ServerArgs=functools.partial(S["ServerArgs"], dtype=dtype))
    par = "tp%d" % args.tp + (",ep%d" % args.tp if args.ep else "")
    loader = S["loader"]
    cpu = torch.device("cpu")
    out = []
    log = os.path.join(tmp, "sglang.log")
    for rank in range(args.tp):
        saved = _quiet(log)         # SGLang's progress bars and warnings
        err = None
        try:
            sa = test_sglang.publish(S, args.config, par, rank)
            mc = S["ModelConfig"].from_server_args(sa)
            if str(mc.dtype).replace("torch.", "") != dtype:
                raise RuntimeError("SGLang's ModelConfig says dtype %s, not %s" % (mc.dtype, dtype))
            with set_default_torch_dtype(mc.dtype), cpu:
                model = loader._initialize_model(mc, S["LoadConfig"]())
            prefill(model, torch)
            dl = loader.DefaultModelLoader(S["LoadConfig"]())
            loader.DefaultModelLoader.load_weights_and_postprocess(
                model, dl._get_all_weights(mc, model), cpu)
            arrays, untouched, dtypes = dump_params(model, torch, np)
            del model
        except Exception:
            err = traceback.format_exc()
        finally:
            _loud(saved)
        if err:
            print(open(log).read()[-3000:], file=sys.stderr)
            fail(1, "SGLang failed on rank %d of %s:\n%s" % (rank, par, err))
        path = None
        if not untouched or args.allow_untouched:
            path = write_rank(args.out, rank, arrays, np)
        out.append(summary(rank, path, arrays, untouched, dtypes))
    return "sglang %s" % S["sglang"].__version__, out


# ------------------------------------------------------------ main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", required=True, choices=["vllm", "sglang"])
    ap.add_argument("--config", required=True, help="directory: config.json + *.safetensors")
    ap.add_argument("--tp", required=True, type=int)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ep", action="store_true", help="expert parallelism, ep = tp")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                    help="the model's dtype (default: the checkpoint's)")
    ap.add_argument("--allow-untouched", action="store_true",
                    help="write ranks whose parameters the loader left partly "
                    "unwritten (NaN there) instead of failing")
    args = ap.parse_args()
    if args.tp < 1:
        ap.error("--tp must be at least 1")
    args.config = os.path.abspath(args.config)
    args.out = os.path.abspath(args.out)
    t0 = time.time()
    dtype = checkpoint_dtype(args.config, args.dtype)
    os.makedirs(args.out, exist_ok=True)
    for r in range(args.tp):    # a failed run leaves no earlier run's ranks
        path = os.path.join(args.out, "rank%d.npz" % r)
        if os.path.exists(path):
            os.remove(path)
    tmp = tempfile.mkdtemp(prefix="refit-engine-ref-")
    try:
        run = run_vllm if args.framework == "vllm" else run_sglang
        engine, ranks = run(args, dtype, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bad = []
    for s in ranks:
        u = s["untouched"]
        if u:
            first = sorted(u)[:4]
            bad.append("rank %d: %d element(s) of %d parameter(s) left as allocated "
                       "by %s's loader (%s)" % (
                           s["rank"], sum(u.values()), len(u), args.framework,
                           ", ".join("%s: %d" % (k, u[k]) for k in first)))
        if s["path"]:
            print("rank %d: %s: %d parameters, %d bytes (%s)%s" % (
                s["rank"], s["path"], s["params"], s["nbytes"],
                ", ".join("%s %d" % kv for kv in sorted(s["dtypes"].items())),
                " UNTOUCHED ELEMENTS (NaN)" if u else ""))
    sys.stdout.flush()
    print("%s, %s tp%d%s, dtype %s: %.1fs" % (
        engine, os.path.basename(args.config.rstrip("/")), args.tp,
        ",ep%d" % args.tp if args.ep else "", dtype, time.time() - t0),
        file=sys.stderr)
    if bad and args.allow_untouched:
        print("engine_ref: warning: %s" % "; ".join(bad), file=sys.stderr)
    elif bad:
        fail(1, "; ".join(bad) + " (--allow-untouched writes them anyway)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
