"""refit.vllm refuses, at start-up and by name, the engines it cannot serve
exactly (docs/engines.md): CUDA workers, quantization, pipeline or data
parallelism inside an engine, a parameter the framework map does not
describe or one the model lacks, a shape that differs; a pause mode a
vllm.LLM does not have (keep, abort) or none of vLLM's.  The checks run on
the worker engine's own methods with vLLM's classes imported (the vllmcpu
environment), without starting an engine.  Then vllm_switch.py: the switch
decided together over two fake nodes, and AsyncEngine's pauses.

Usage: test_vllm_refusals.py BUILD.  Prints "vllm refusals: N passed, N failed".
"""
import os
import sys
import traceback
from types import SimpleNamespace

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
os.environ.setdefault("REFIT_LIBRARY", os.path.abspath(f"{BUILD}/lib/librefit.so"))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.abspath("python"))

import torch  # noqa: E402

import refit.frameworks as fw  # noqa: E402
import refit.vllm as rv  # noqa: E402
import vllm_switch  # noqa: E402  (this folder is first on sys.path)

counts = {"passed": 0, "failed": 0}
CFG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512,
       "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def engine(device="cpu", quant=None, pp=1, dp=1):
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    cls = WeightTransferEngineFactory._registry[rv.BACKEND]()
    e = cls.__new__(cls)
    e.device = torch.device(device)
    e.model_config = SimpleNamespace(quantization=quant, model="/nonexistent")
    e.parallel_config = SimpleNamespace(pipeline_parallel_size=pp, data_parallel_size=dp)
    return e


def refused(what, fn, text):
    try:
        fn()
    except (RuntimeError, ValueError) as ex:
        if text in str(ex):
            counts["passed"] += 1
            print(f"ok   {what}: {ex}")
            return
        counts["failed"] += 1
        print(f"FAIL {what}: wrong message: {ex}")
        return
    except Exception:  # noqa: BLE001
        counts["failed"] += 1
        print(f"FAIL {what}")
        traceback.print_exc()
        return
    counts["failed"] += 1
    print(f"FAIL {what}: accepted")


class Fake(torch.nn.Module):
    """Parameters named as vLLM names them, shaped from the map (rank 0)."""

    def __init__(self, m, drop=None, extra=None, reshape=None):
        super().__init__()
        ent = next(r for r in m["ranks"] if r["rank"] == 0)
        for p in ent["params"]:
            if p["name"] == drop:
                continue
            mod = self
            parts = p["name"].split(".")
            for part in parts[:-1]:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            shape = [s + 1 for s in p["shape"]] if p["name"] == reshape else p["shape"]
            mod.register_parameter(parts[-1], torch.nn.Parameter(
                torch.zeros(shape, dtype=torch.bfloat16), requires_grad=False))
        if extra:
            self.register_parameter(extra, torch.nn.Parameter(torch.zeros(3)))


def bind(m, **kw):
    e = engine()
    e.rank, e.map = 0, m
    e.params = fw.allocate(m, copies=2)
    e.model = Fake(m, **kw)
    e._bind()


def main():
    refused("CUDA workers", lambda: engine("cuda")._check_config(), "not supported yet")
    refused("a quantized engine", lambda: engine(quant="fp8")._check_config(),
            "quantization 'fp8' is not supported")
    refused("pipeline parallelism in an engine", lambda: engine(pp=2)._check_config(),
            "pipeline / data parallelism")
    refused("data parallelism in an engine", lambda: engine(dp=2)._check_config(),
            "pipeline / data parallelism")
    refused("pause mode keep with a vllm.LLM", lambda: rv.Engine(
        None, "/nonexistent", "m", "i", pause_mode="keep"), "needs an AsyncLLM")
    refused("an unknown pause mode", lambda: rv.Engine(
        None, "/nonexistent", "m", "i", pause_mode="later"), "one of keep, wait, abort")
    m = fw.framework_map("vllm", CFG, "tp2")
    names = [p["name"] for p in m["ranks"][0]["params"]]
    qkv = next(n for n in names if "qkv_proj" in n)
    refused("a parameter the model lacks", lambda: bind(m, drop=qkv),
            f"the map names {qkv}")
    refused("a parameter the map does not describe", lambda: bind(m, extra="surprise"),
            "does not describe: surprise")
    refused("a parameter of another shape", lambda: bind(m, reshape=qkv),
            f"parameter {qkv}: the engine holds")
    try:
        bind(m)
        counts["passed"] += 1
        print("ok   the model as the map describes it is accepted")
    except Exception:  # noqa: BLE001
        counts["failed"] += 1
        print("FAIL the model as the map describes it")
        traceback.print_exc()
    vllm_switch.run(counts)
    print(f"vllm refusals: {counts['passed']} passed, {counts['failed']} failed")
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
