#!/usr/bin/python3
"""A real SGLang engine receives refits: SGLang's CPU engine (sglang.Engine,
device "cpu", SGLANG_USE_CPU_ENGINE=1, bf16, torch_native attention) serving a tiny Llama (random
weights generated here from a config.json) through refit.sglang, and a
torch trainer (tests/frameworks/trainer_torch.py, one process, fp32
parameters published in place; refit converts to the engine's bf16 on the
way).  A coordinator (trigger policy on_ready) and a node daemon per
process on loopback: the trainer's (et0) and one per engine TP rank (ee0,
ee1).

After each refit the engine's parameters, read through SGLang's own API
(Engine.get_weights_by_name, whole tensors), equal the trainer's full
tensors cast to bf16 byte for byte -- as SGLang holds them: the weights of
the AMX GEMMs packed by SGLang's own sgl_kernel.convert_weight_packed from
the trainer's bytes, the others raw -- SGLang reports the weight_version
refit set, and the engine's greedy tokens are transformers' greedy tokens
on the trainer's weights (each within LOGPROB_TOL of transformers' best,
their logprobs within LOGPROB_TOL), far from the previous version's.

SGLang's CPU engine needs sgl_kernel's CPU build (common_ops), which PyPI
does not have (its sgl-kernel / sglang-kernel wheels are CUDA-only): name a
folder holding such a build's sgl_kernel package in REFIT_SGL_KERNEL_CPU
(default BUILD/sgl-kernel-cpu/out).  Without it this suite prints SKIP and the
reason, and counts nothing.

Usage: test_sglang_engine.py BUILD_DIR [TP ...]  (default: 1 2).
Internal: test_sglang_engine.py --engine MODEL_DIR SOCKETS MODEL INSTANCE
BASE TP (the engine process, in BUILD/venv-sglang).
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOGPROB_TOL = 0.05   # bf16 AMX GEMMs vs torch's on the same bf16 weights
PROMPTS = [[1, 17, 42, 99, 7], [1, 300, 5, 61]]
NEW = 8


def engine_main(argv):
    """The engine process: JSON lines in, JSON lines out."""
    mdir, socks, model, inst, base, tp = argv
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)   # SGLang's and torch's prints go to the log

    def out(o):
        answers.write(json.dumps(o) + "\n")

    import torch
    import sglang
    import refit.sglang
    t0 = time.monotonic()
    llm = sglang.Engine(model_path=mdir, device="cpu", tp_size=int(tp), dtype="bfloat16",
                        attention_backend="torch_native", disable_cuda_graph=True,
                        disable_overlap_schedule=True, max_total_tokens=4096,
                        mem_fraction_static=0.05, log_level="warning",
                        **refit.sglang.engine_args())
    eng = refit.sglang.Engine(llm, socket=socks.split(","), model=model, instance=inst,
                              base_rank=int(base), source_dtype="fp32", timeout_ms=30000)
    out({"init_s": time.monotonic() - t0})
    for line in sys.stdin:
        rq = json.loads(line)
        try:
            if rq["cmd"] == "quit":
                break
            out(_engine_cmd(llm, eng, rq, torch))
        except Exception as e:  # noqa: BLE001 - told to the test
            out({"error": f"{type(e).__name__}: {e}"})
    llm.shutdown()


def _engine_cmd(llm, eng, rq, torch):
    c = rq["cmd"]
    if c == "update":
        t0 = time.monotonic()
        v = eng.update(rq.get("version"), rq.get("timeout_ms"))
        return {"version": v, "switch_s": time.monotonic() - t0}
    if c == "weight_version":
        return {"weight_version": llm.get_model_info()["weight_version"]}
    if c == "params":
        return _params(llm, rq["hf"], torch)
    if c == "logprobs":
        return _logprobs(llm, rq["hf_dir"], torch)
    raise ValueError(f"unknown command {c}")


def _params(llm, path, torch):
    """Every Hugging Face tensor of `path` read back through SGLang's
    get_weights_by_name (TP rank 0's parameters; whole tensors at TP 1):
    equal to the trainer's bytes, raw or packed by sgl_kernel."""
    from safetensors.torch import load_file
    tp = llm.server_args.tp_size
    hf = load_file(path)
    bad, raw, packed = [], 0, 0
    for name, w in sorted(hf.items()):
        got = llm.get_weights_by_name(name, truncate_size=1 << 30)
        if got is None:
            bad.append(f"{name}: SGLang returned nothing")
            continue
        got = torch.tensor(got, dtype=torch.float32).to(torch.bfloat16)
        want = _rank0(name, w, tp)
        if got.shape == want.shape and torch.equal(got.view(torch.int16),
                                                   want.view(torch.int16)):
            raw += 1
            continue
        if want.dim() == 2:   # the AMX GEMM's weight, packed by SGLang per rank
            pack = torch.ops.sgl_kernel.convert_weight_packed
            pk = pack(want.contiguous()) if want is not w else torch.cat(
                [pack(c.contiguous()) for c in w.chunk(tp, dim=1)], dim=1)
            if pk.shape == got.shape and torch.equal(got.view(torch.int16),
                                                     pk.view(torch.int16)):
                packed += 1
                continue
        bad.append(f"{name}: {tuple(got.shape)} differs")
    return {"n": len(hf), "raw": raw, "packed": packed, "mismatch": bad}


def _rank0(name, w, tp):
    """TP rank 0's part of Hugging Face tensor `w`, as get_weights_by_name
    gives it (column-parallel rows, the vocabulary's first part; row-parallel
    o_proj / down_proj gathered whole: packed, the ranks' packed shards side
    by side)."""
    if tp == 1 or w.dim() == 1 or "o_proj" in name or "down_proj" in name:
        return w
    return w[: w.shape[0] // tp]


def _logprobs(llm, hf_dir, torch):
    """The engine's greedy tokens and logprobs, and transformers' (fp32
    math on the same bf16 weights) for those tokens and its own best."""
    import transformers
    sp = {"temperature": 0.0, "max_new_tokens": NEW}
    outs = llm.generate(input_ids=PROMPTS, sampling_params=sp, return_logprob=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.bfloat16).float()
    toks, elp, hlp, hbest = [], [], [], []
    for p, o in zip(PROMPTS, outs):
        lps = o["meta_info"]["output_token_logprobs"]
        t = [x[1] for x in lps]
        toks.append(t)
        elp.append([x[0] for x in lps])
        with torch.no_grad():
            logits = ref(torch.tensor([p + t])).logits[0].float()
        ls = torch.log_softmax(logits, -1)[len(p) - 1: len(p) - 1 + len(t)]
        hlp.append([ls[i, t[i]].item() for i in range(len(t))])
        hbest.append([ls[i].max().item() for i in range(len(t))])
    return {"tokens": toks, "engine": elp, "hf": hlp, "hf_best": hbest}


# SGLang starts its schedulers with multiprocessing's spawn, which imports
# this file again (as __mp_main__, same argv): only definitions run there
if len(sys.argv) > 1 and sys.argv[1] == "--engine" and __name__ == "__main__":
    engine_main(sys.argv[2:])
    sys.exit(0)
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
TPS = ([int(x) for x in sys.argv[2:]] or [1, 2]) if BUILD != "--engine" else []
PY = os.path.abspath(f"{BUILD}/venv-sglang/bin/python")
KDIR = os.path.abspath(os.environ.get("REFIT_SGL_KERNEL_CPU", f"{BUILD}/sgl-kernel-cpu/out"))
FW = os.path.abspath(os.path.join(HERE, "..", "frameworks"))
ENV = dict(os.environ, PYTHONPATH=":".join([KDIR, os.path.abspath("python"), FW]),
           SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


# the venv's torch is a CUDA build (PyPI's), which brings libnccl: SGLang's
# TP groups would then start a PyNcclCommunicator on the CPU device and fail
# ("Expected a cuda device, but got: cpu"); without the library (as with a
# CPU build of torch) SGLang disables it and reduces over gloo / its shm
NO_NCCL = {"SGLANG_NCCL_SO_PATH": "/nonexistent/refit-no-nccl/libnccl.so.2"}


def _skip(why):
    print(f"sglang-engine: SKIP: {why}")
    print("sglang-engine: 0 passed, 0 failed")
    sys.exit(0)


def _probe():
    """Why SGLang's CPU engine cannot run here (None: it can)."""
    if not os.path.exists(PY):
        return f"no {PY} (make deps builds it, python/frameworks.txt)"
    code = ("import torch, sgl_kernel; torch.ops.sgl_kernel.convert_weight_packed; "
            "assert sgl_kernel.__file__.startswith(%r), sgl_kernel.__file__" % KDIR)
    r = subprocess.run([PY, "-c", code], env=ENV, capture_output=True, text=True,
                       timeout=300)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return ("sgl_kernel's CPU build is not importable from REFIT_SGL_KERNEL_CPU="
                f"{KDIR} ({last}); PyPI has only its CUDA wheels (docs/python.md, SGLang)")
    return None


pb = harness = Cluster = check = TMP = None


def _init():
    """The suite's start (skips when SGLang's CPU engine cannot run here)."""
    global pb, harness, Cluster, check, TMP
    why = _probe()
    if why:
        _skip(why)
    import protostubs  # (this folder is first on sys.path)
    TMP = protostubs.generate("refit-sglang-")
    from refit.v1 import refit_pb2 as pb
    sys.path.insert(0, HERE)
    import harness
    from harness import Cluster, check
    harness.init(BUILD, TMP)
    ENV["REFIT_LIBRARY"] = harness.use_tree_package()


LR = 5e-3
ST = {}
COSTS = {}


class Proc:
    """A venv process speaking JSON lines, in a session of its own."""

    def __init__(self, args, log, env=None):
        self.p = harness.spawn([PY] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=open(log, "w"), text=True, bufsize=1, env=env or ENV,
                               start_new_session=True)
        self.log = log

    def end(self):
        try:
            self.p.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.p.stdin.flush()
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it may have ended already
            pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def read(self, what):
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"{what}: the process ended:\n"
                                 f"{open(self.log).read()[-3000:]}")
        return json.loads(line)

    def ask(self, **rq):
        self.p.stdin.write(json.dumps(rq) + "\n")
        self.p.stdin.flush()
        return self.read(rq["cmd"])

    def cmd(self, **rq):
        r = self.ask(**rq)
        assert "error" not in r, f"{rq['cmd']}: {r['error']}"
        return r


def make_model(d):
    harness.make_tiny_llama(d, PY, ENV)


def committed(version):
    rs = ST["cl"].stub.ListRefits(pb.ListRefitsRequest(model=ST["model"]), timeout=10).refits
    return [r for r in rs if r.version == version and r.state == pb.COMMITTED]


def step(k):
    r = ST["trainer"].cmd(cmd="step", lr=LR)
    assert r["version"] == k, r
    d = f"{TMP}/{ST['model']}-v{k}"
    ST["trainer"].cmd(cmd="save", dir=d)
    return d


def params_equal(d):
    r = ST["engine"].cmd(cmd="params", hf=f"{d}/model.safetensors")
    assert r["n"] > 0 and not r["mismatch"], f"{len(r['mismatch'])} of {r['n']} " \
        f"tensors differ from {d}: {r['mismatch'][:4]}"
    return r


def greedy_match(d, other=None):
    r = ST["engine"].cmd(cmd="logprobs", hf_dir=d)
    diff = max(abs(a - b) for e, h in zip(r["engine"], r["hf"]) for a, b in zip(e, h))
    gap = max(b - h for hb, hh in zip(r["hf_best"], r["hf"]) for b, h in zip(hb, hh))
    COSTS.setdefault("logprob_diff", []).append(round(diff, 5))
    assert diff < LOGPROB_TOL, f"engine and transformers logprobs differ by {diff}"
    assert gap < LOGPROB_TOL, f"a greedy token is {gap} below transformers' best"
    if other:
        o = ST["engine"].cmd(cmd="logprobs", hf_dir=other)
        far = max(abs(a - b) for e, h in zip(r["engine"], o["hf"]) for a, b in zip(e, h))
        COSTS.setdefault("other_version_diff", []).append(round(far, 4))
        assert far > 2 * LOGPROB_TOL, f"the versions are too close to tell apart ({far})"
    return diff


def setup(tp):
    model = f"tiny{tp}"
    ST["model"] = model
    d = f"{TMP}/{model}"
    make_model(d)
    ST["dir"] = d
    cl = Cluster(f"s{tp}", 0, coord_extra=["--default-trigger", "on_ready",
                                            "--slice-timeout-ms", "60000"])
    ST["cl"] = cl
    harness.spawn(harness.node_spawn_args(cl, "et0", "0"), stderr=cl.log)
    for r in range(tp):   # engine TP rank r: global rank 1 + r, on node ee<r>
        harness.spawn(harness.node_spawn_args(cl, f"ee{r}", str(1 + r)), stderr=cl.log)
    cl.wait_members(1 + tp)
    socks = ",".join(f"{TMP}/ee{r}.local" for r in range(tp))
    # more TP ranks than NUMA nodes: SGLang's CPU engine wants each rank's
    # cores named (SGLANG_CPU_OMP_THREADS_BIND), one core a rank here
    cpus = sorted(os.sched_getaffinity(0))
    bind = "|".join(str(cpus[r % len(cpus)]) for r in range(tp))
    ST["engine"] = Proc([os.path.abspath(__file__), "--engine", d, socks, model, "s1", "1",
                         str(tp)], f"{TMP}/engine-tp{tp}.log",
                        env=dict(ENV, SGLANG_CPU_OMP_THREADS_BIND=bind, **NO_NCCL))
    ST["trainer"] = Proc([f"{FW}/trainer_torch.py", d, f"{TMP}/et0.local", model, "1"],
                         f"{TMP}/trainer-tp{tp}.log")
    COSTS[f"tp{tp}_engine_init_s"] = round(ST["engine"].read("engine start")["init_s"], 2)
    ST["trainer"].read("trainer start")
    harness.wait_for(lambda: {i.instance for i in ST["cl"].stub.GetModel(
        pb.GetModelRequest(model=model), timeout=10).instances} >= {"s1"},
        what="the engine's instance registered")
    # the engine serves its checkpoint until the first switch
    params_equal(d)
    return f"engine up in {COSTS[f'tp{tp}_engine_init_s']} s, its checkpoint byte-exact"


def versions(tp):
    prev = ST["dir"]
    for k in (1, 2):
        d = step(k)
        harness.wait_for(lambda: committed(k), 60, f"refit of version {k} committed")
        r = ST["engine"].cmd(cmd="update", version=k, timeout_ms=30000)
        assert r["version"] == k, r
        COSTS.setdefault("switch_s", []).append(round(r["switch_s"], 3))
        wv = ST["engine"].cmd(cmd="weight_version")["weight_version"]
        assert wv == str(k), wv
        p = params_equal(d)
        diff = greedy_match(d, other=prev)
        prev = d
    inst = {i.instance: i for i in ST["cl"].stub.GetModel(
        pb.GetModelRequest(model=ST["model"]), timeout=10).instances}
    e = inst["s1"].engine
    assert e.framework == "sglang" and e.pause_mode == "wait", e
    return f"{p['n']} tensors byte-exact ({p['raw']} raw, {p['packed']} AMX-packed), " \
        f"greedy within {diff:.4f}; node shows {e.framework} {e.version}"


def no_version():
    r = ST["engine"].ask(cmd="update", version=99, timeout_ms=1500)
    assert "error" in r and "imeout" in r["error"], r
    assert ST["engine"].cmd(cmd="weight_version")["weight_version"] == "2"
    params_equal(f"{TMP}/{ST['model']}-v2")
    return r["error"][:120]


def teardown():
    for p in ("engine", "trainer"):
        if p in ST:
            ST.pop(p).end()
    harness.stop_all()


def main():
    _init()
    t0 = time.time()
    try:
        for tp in TPS:
            try:
                check(f"TP {tp}: a tiny Llama, a coordinator (on_ready), node daemons, "
                      "the engine registered through refit.sglang", lambda: setup(tp))
                check(f"TP {tp}: versions 1 and 2 served: SGLang's parameters equal the "
                      "trainer's, greedy tokens match transformers", lambda: versions(tp))
                check(f"TP {tp}: an update that does not come leaves the engine as it was",
                      no_version)
            finally:
                teardown()
    finally:
        print(f"     costs and differences: {json.dumps(COSTS)}")
    print(f"     {time.time() - t0:.0f} s")
    harness.summary("sglang-engine")


if __name__ == "__main__" and BUILD != "--engine":
    main()
