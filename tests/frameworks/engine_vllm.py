"""A real vLLM engine (vLLM's CPU build, TP 2, an AsyncLLM as `vllm serve`
runs it) receiving refits through refit.vllm (AsyncEngine), driven by
tests/integration/test_engine.py over stdin/stdout (one JSON object per
line each way).  Run in the vllmcpu environment.

Usage: engine_vllm.py MODEL_DIR SOCKETS MODEL INSTANCE BASE_RANK SOURCE_DTYPE
(SOCKETS: one local socket, or one per TP rank separated by commas: the
workers served by different nodes)

Commands (a JSON object with "cmd"):
  update {version, timeout_ms}   AsyncEngine.update: {"version", "switch_s"}
                                 (no version: the newest installed)
  pause_mode {mode}              the pause mode of the next updates
  weight_version                 what the engine itself reports
  installed                      each worker's node's installed version
  params {hf}                    every worker's parameters, read through the
                                 engine (LLM.apply_model), against the map
                                 filled from the Hugging Face tensors in the
                                 safetensors file hf: {"mismatch": [...], "n"}
  logprobs {hf_dir}              greedy tokens of the prompts and their
                                 logprobs from the engine, and the same
                                 tokens' logprobs from transformers on the
                                 checkpoint hf_dir (teacher forced)
  long_start / long_wait         a long request (in flight while a refit
                                 runs); long_wait: its tokens and
                                 finish_reason; long_progress: how many
                                 tokens it streamed so far
  tokens                         the long request's tokens, run now
"""
import hashlib
import json
import os
import sys
import threading
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
# LLM.apply_model ships the function to the workers by pickle (the test's own)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

PROMPTS = [[1, 2, 3, 4, 5], [7, 11, 13], [100, 200, 300, 400]]
LONG = [5, 6, 7, 8]


# answers go to the original stdout; everything else (vLLM's and torch's
# logs, which print to stdout) to stderr
_ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)


def out(obj):
    _ANSWERS.write(json.dumps(obj) + "\n")
    _ANSWERS.flush()


class Loop:
    """An asyncio loop on a thread of its own: the AsyncLLM lives there."""

    def __init__(self):
        import asyncio
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def submit(self, coro):
        import asyncio
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro):
        return self.submit(coro).result()


async def generate(engine, prompt, params, seen=None):
    """The final output of one request; seen[0]: tokens streamed so far."""
    import uuid
    last = None
    async for o in engine.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex):
        last = o
        if seen is not None:
            seen[0] = len(o.outputs[0].token_ids)
    return last


def main():
    mdir, sock, model, inst, base, src = sys.argv[1:7]
    import asyncio

    import numpy as np
    import torch
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    import refit.frameworks as fw
    import refit.vllm as rv
    from engine_probe import worker_params

    t0 = time.monotonic()
    lp = Loop()

    async def make():
        e = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=mdir, dtype="bfloat16", max_model_len=512, tensor_parallel_size=2,
            enforce_eager=True, seed=0, **rv.engine_args()))
        r = await rv.AsyncEngine.create(e, socket=sock.split(",") if "," in sock else sock,
                                        model=model, instance=inst, base_rank=int(base),
                                        source_dtype=src if src != "-" else None)
        return e, r
    llm, eng = lp.run(make())
    out({"ready": True, "init_s": time.monotonic() - t0})
    greedy = SamplingParams(temperature=0, max_tokens=8, logprobs=0, detokenize=False)
    long_p = SamplingParams(temperature=0, max_tokens=400, min_tokens=400, ignore_eos=True,
                            detokenize=False)
    cfg = os.path.join(mdir, "config.json")
    longres = {}
    for line in sys.stdin:
        rq = json.loads(line)
        cmd = rq["cmd"]
        try:
            if cmd == "update":
                v = lp.run(eng.update(rq.get("version"), rq.get("timeout_ms")))
                out({"version": v, "switch_s": eng.switch_s[-1] if eng.switch_s else 0})
            elif cmd == "pause_mode":
                eng.pause_mode = rq["mode"]
                out({"pause_mode": eng.pause_mode})
            elif cmd == "weight_version":
                out({"weight_version": lp.run(llm.get_weight_version())})
            elif cmd == "installed":
                out({"installed": lp.run(eng.installed())})
            elif cmd == "params":
                from safetensors.torch import load_file
                hf = {k: (v.view(torch.uint16) if v.dtype == torch.bfloat16 else v).numpy()
                      for k, v in load_file(rq["hf"]).items()}
                m = fw.framework_map("vllm", cfg, "tp2")
                exp = fw.allocate(m)
                fw.fill(m, exp, hf)
                bad, n = [], 0
                got_all = lp.run(llm.collective_rpc("apply_model", args=(worker_params,)))
                for rank, got in got_all:
                    for (r, name), arr in exp.items():
                        if r != rank:
                            continue
                        n += 1
                        h = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
                        if got.get(name) != h:
                            bad.append(f"rank {r} {name}")
                out({"mismatch": bad, "n": n})
            elif cmd == "logprobs":
                async def batch():
                    return await asyncio.gather(*[generate(llm, p, greedy) for p in PROMPTS])
                res = lp.run(batch())
                toks = [list(r.outputs[0].token_ids) for r in res]
                lps = [[float(d[t].logprob) for d, t in zip(r.outputs[0].logprobs, tk)]
                       for r, tk in zip(res, toks)]
                import transformers
                ref = transformers.AutoModelForCausalLM.from_pretrained(
                    rq["hf_dir"], torch_dtype=torch.bfloat16)
                hfl = []
                with torch.no_grad():
                    for p, tk in zip(PROMPTS, toks):
                        ids = torch.tensor([p + tk])
                        lg = ref(ids).logits.float().log_softmax(-1)[0]
                        hfl.append([float(lg[len(p) - 1 + i, t]) for i, t in enumerate(tk)])
                out({"tokens": toks, "engine": lps, "hf": hfl})
            elif cmd == "long_start":
                longres["seen"] = [0]
                longres["fut"] = lp.submit(generate(llm, LONG, long_p, longres["seen"]))
                out({"started": True})
            elif cmd == "long_progress":
                out({"tokens": longres["seen"][0]})
            elif cmd == "long_wait":
                r = longres["fut"].result().outputs[0]
                out({"tokens": list(r.token_ids), "finish_reason": r.finish_reason})
            elif cmd == "tokens":
                r = lp.run(generate(llm, LONG, long_p))
                out({"tokens": list(r.outputs[0].token_ids)})
            elif cmd == "quit":
                out({"bye": True})
                break
            else:
                out({"error": f"unknown command {cmd}"})
        except Exception as e:  # noqa: BLE001 - reported to the test
            out({"error": f"{type(e).__name__}: {e}"})
    # the engine core and its workers are processes of their own: end them
    # (os._exit alone leaves them running, 3 GB each)
    try:
        llm.shutdown()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
