"""refit.torch.Publisher(model, framework="megatron") on a real Megatron-Core
GPTModel (CPU, TP1/PP1, megatron.core.parallel_state on a gloo world of
one; the local layer spec, as Transformer Engine does not install here).

A coordinator and two node daemons run as processes (--default-trigger
on_ready); the GPTModel (llama-shaped: GQA 8 heads / 2 groups, gated MLP,
RMSNorm, untied embeddings, vocabulary 250 padded to 256) is registered by
the Publisher as the trainer on node 0; an inference instance on node 1
holds the Hugging Face tensors whole.  publish(step, wait=...) returns once
the refit the policy started installed the step; every Hugging Face tensor
then equals, byte for byte, the one this test cuts out of the Megatron
parameters itself (linear_qkv per query group: its heads' q rows, k, v;
linear_fc1: gate rows, then up; vocabulary rows past 250 dropped; the
local spec's fp32 norms as bf16).  Two steps: the first in snapshot mode
(the default here, the norms being fp32), the second after the
parameters changed.  Refused, naming the parameter: a module parameter
the map does not describe, a map parameter the module lacks (another
config), in place with the fp32 norms.  Then TP 2: two processes (this
file with --worker), megatron's parallel_state on a gloo world of two,
each publishing its shards to node 0 (a group of two clients); one refit
fills another instance's Hugging Face tensors, equal to the shards merged
here (column-parallel on dim 0, row-parallel on dim 1, linear_fc1's
[gate; up] per rank) and cut as above.  The same with PP 2: two stages,
each with its own layer 0 (the stages' layers joined by their global
numbers here).

Usage: build/venv-megatron/bin/python tests/frameworks/test_megatron_publisher.py BUILD
Prints "megatron publisher: N passed, N failed".  About 30 s here.
"""
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
os.environ.setdefault("REFIT_LIBRARY", f"{BUILD}/lib/librefit.so")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
sys.path.insert(0, os.path.abspath("python"))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import refit  # noqa: E402
import refit.torch as rt  # noqa: E402

counts = {"passed": 0, "failed": 0}
TMP = tempfile.mkdtemp(prefix="refit-mgpub-") if "--worker" not in sys.argv else None
CFG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 250,
       "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
       "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
       "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16"}
PROCS = []


def check(name, fn):
    t0 = time.monotonic()
    try:
        fn()
        counts["passed"] += 1
        print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)
    except Exception:  # noqa: BLE001 - reported
        counts["failed"] += 1
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster():
    log = open(f"{TMP}/daemons.log", "w")
    addr = f"127.0.0.1:{free_port()}"
    PROCS.append(subprocess.Popen(
        [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", addr, "--heartbeat-ms",
         "100", "--lease-ttl-ms", "3000", "--default-trigger", "on_ready", "--log-level",
         "warn"], stderr=log))
    for k in range(2):
        PROCS.append(subprocess.Popen(
            [f"{BUILD}/bin/refitd", "--role", "node", "--listen", f"127.0.0.1:{free_port()}",
             "--coordinator", addr, "--node-id", f"mg{k}", "--ranks", f"{4 * k}-{4 * k + 3}",
             "--heartbeat-ms", "100", "--local-socket", f"{TMP}/mg{k}.local", "--log-level",
             "warn"], stderr=log))
    end = time.time() + 30
    while time.time() < end:
        out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", addr, "--json",
                              "members"], capture_output=True, text=True)
        if out.returncode == 0 and len(json.loads(out.stdout).get("members", [])) == 2:
            return addr
        time.sleep(0.05)
    raise AssertionError("the two nodes did not join")


def gpt_model(layers=2):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_config import TransformerConfig
    cfg = TransformerConfig(
        tensor_model_parallel_size=ps.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=ps.get_pipeline_model_parallel_world_size(),
        num_layers=layers, hidden_size=64, num_attention_heads=8, num_query_groups=2,
        ffn_hidden_size=96, kv_channels=16, gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", add_bias_linear=False, layernorm_epsilon=1e-6,
        use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16)
    torch.manual_seed(0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=256,
                     max_sequence_length=256, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope",
                     pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage())
    tp_rank = ps.get_tensor_model_parallel_rank()
    stage = ps.get_pipeline_model_parallel_rank()
    with torch.no_grad():   # distinct values everywhere (norms start at 1; stages
        for n, p in model.named_parameters():   # differ); TP-replicated ones equal
            g = torch.Generator().manual_seed(
                sum(map(ord, n)) * 16 + stage * 1000 +
                (tp_rank if getattr(p, "tensor_model_parallel", False) else 0))
            p.add_(torch.randn(p.shape, dtype=torch.float32, generator=g).to(p.dtype))
    return model


def expected_hf(model):
    """The Hugging Face tensors of the Megatron parameters, cut here."""
    return expected_of({n: t.detach() for n, t in model.named_parameters()})


def merge_tp(shards):
    """The TP ranks' state dicts as one TP-1 state dict, merged here:
    column-parallel (vocabulary rows, linear_qkv's groups) on dim 0,
    row-parallel (linear_proj, linear_fc2) on dim 1, linear_fc1 per rank
    [gate; up] into [all gate; all up], norms as any rank holds them."""
    out = {}
    for n in shards[0]:
        ts = [sd[n] for sd in shards]
        if n.endswith(("linear_proj.weight", "linear_fc2.weight")):
            out[n] = torch.cat(ts, 1)
        elif n.endswith("linear_fc1.weight"):
            half = ts[0].shape[0] // 2
            out[n] = torch.cat([t[:half] for t in ts] + [t[half:] for t in ts])
        elif n.endswith(("word_embeddings.weight", "output_layer.weight",
                         "linear_qkv.weight")):
            out[n] = torch.cat(ts)
        else:
            assert all(torch.equal(t, ts[0]) for t in ts), n   # replicated
            out[n] = ts[0]
    return out


def expected_of(sd):
    heads, groups, d, ffn, vocab = 8, 2, 16, 96, CFG["vocab_size"]
    hpg = heads // groups
    bf = torch.bfloat16
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"][:vocab],
           "lm_head.weight": sd["output_layer.weight"][:vocab],
           "model.norm.weight": sd["decoder.final_layernorm.weight"].to(bf)}
    for i in range(CFG["num_hidden_layers"]):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = sd[m + "self_attention.linear_qkv.weight"].reshape(groups, hpg + 2, d, -1)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :hpg].reshape(heads * d, -1)
        out[h + "self_attn.k_proj.weight"] = qkv[:, hpg].reshape(groups * d, -1)
        out[h + "self_attn.v_proj.weight"] = qkv[:, hpg + 1].reshape(groups * d, -1)
        out[h + "self_attn.o_proj.weight"] = sd[m + "self_attention.linear_proj.weight"]
        fc1 = sd[m + "mlp.linear_fc1.weight"]
        out[h + "mlp.gate_proj.weight"] = fc1[:ffn]
        out[h + "mlp.up_proj.weight"] = fc1[ffn:]
        out[h + "mlp.down_proj.weight"] = sd[m + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = sd[m + "input_layernorm.weight"].to(bf)
        out[h + "post_attention_layernorm.weight"] = sd[m + "pre_mlp_layernorm.weight"].to(bf)
    return out


def refused(fn, text):
    try:
        fn()
    except ValueError as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError(f"accepted; expected a refusal saying {text!r}")


def publisher_end_to_end():
    start_cluster()
    torch.distributed.init_process_group("gloo", init_method=f"file://{TMP}/store", rank=0,
                                         world_size=1, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(1, 1)
    cfg_path = f"{TMP}/config.json"
    with open(cfg_path, "w") as f:
        json.dump(CFG, f)
    model = gpt_model()
    # refusals first: nothing registered by them
    extra = gpt_model()
    extra.register_parameter("stray", torch.nn.Parameter(torch.zeros(3)))
    refused(lambda: rt.Publisher(extra, f"{TMP}/mg0.local", "bad", framework="megatron",
                                 config=cfg_path), "does not describe: stray")
    with open(f"{TMP}/config3.json", "w") as f:
        json.dump(dict(CFG, num_hidden_layers=3), f)
    refused(lambda: rt.Publisher(gpt_model(), f"{TMP}/mg0.local", "bad",
                                 framework="megatron", config=f"{TMP}/config3.json"),
            "names decoder.layers.2.")
    refused(lambda: rt.Publisher(gpt_model(), f"{TMP}/mg0.local", "bad",
                                 framework="megatron", config=cfg_path, mode="in-place"),
            "decoder.layers.0.input_layernorm.weight is torch.float32")
    pub = rt.Publisher(model, f"{TMP}/mg0.local", "mg", framework="megatron",
                       config=cfg_path, timeout_ms=60000)
    assert pub.mode == "snapshot", pub.mode
    # the inference instance: Hugging Face tensors whole, on rank 4 (node 1)
    want = expected_hf(model)
    lays, bufs = [], {}
    for name, t in want.items():
        lays.append(refit.layout.placements(name, "bf16", list(t.shape), [4], ["Replicate()"]))
        bufs[(name, 4)] = refit.empty(list(t.shape), "bfloat16", copies=2, torch=True)
    inf = refit.Client(f"{TMP}/mg1.local", timeout_ms=60000)
    inf.register("mg", "infer", lays, bufs, instance="hf")
    for step in (1, 2):
        if step == 2:
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(-0.5)
            want = expected_hf(model)
        t0 = time.monotonic()
        got = pub.publish(step, wait=60000)
        print(f"     step {step}: publish(wait) {time.monotonic() - t0:.2f} s", flush=True)
        assert got >= step, got
        st = inf.state()
        assert st.version == step and st.valid, st
        for name, t in want.items():
            have = bufs[(name, 4)][st.active]
            assert torch.equal(have.view(torch.int16), t.contiguous().view(torch.int16)), name
    inf.unregister()
    inf.close()
    pub.close()


def worker(rank, tmp, tp, pp, model_name):
    """One rank of a TP x PP trainer: its shards published, then saved
    (stage layers renamed to their global numbers)."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/{model_name}.store",
                                         rank=rank, world_size=tp * pp,
                                         timeout=datetime.timedelta(seconds=120))
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tp, pp)
    model = gpt_model()
    pub = rt.Publisher(model, f"{tmp}/mg0.local", model_name, framework="megatron",
                       config=f"{tmp}/config.json", timeout_ms=60000)
    got = pub.publish(1, wait=60000)
    first = ps.get_pipeline_model_parallel_rank() * (CFG["num_hidden_layers"] // pp)
    sd = {}
    for n, t in model.named_parameters():
        if n.startswith("decoder.layers."):
            k, rest = n[len("decoder.layers."):].split(".", 1)
            n = f"decoder.layers.{int(k) + first}.{rest}"
        sd[n] = t.detach()
    torch.save(sd, f"{tmp}/{model_name}.rank{rank}.pt")
    print(json.dumps({"rank": rank, "installed": got, "mode": pub.mode}), flush=True)
    pub.close()


def parallel(tp, pp, model_name, irank):
    """tp x pp processes (megatron's parallel_state on gloo), all on node 0
    (a group of clients): each registers its shards, one refit fills the
    Hugging Face tensors of an instance on rank irank (node 1), equal to the
    shards merged here."""
    want_shapes = {n: list(t.shape) for n, t in expected_hf(gpt_model()).items()}
    lays, bufs = [], {}
    for name, shape in want_shapes.items():
        lays.append(refit.layout.placements(name, "bf16", shape, [irank], ["Replicate()"]))
        bufs[(name, irank)] = refit.empty(shape, "bfloat16", copies=2, torch=True)
    inf = refit.Client(f"{TMP}/mg1.local", timeout_ms=60000)
    inf.register(model_name, "infer", lays, bufs, instance="hf")
    world = tp * pp
    procs = [subprocess.Popen([sys.executable, __file__, BUILD, "--worker", str(r), TMP,
                               str(tp), str(pp), model_name], stdout=subprocess.PIPE,
                              stderr=open(f"{TMP}/{model_name}.worker{r}.log", "w"), text=True)
             for r in range(world)]
    outs = []
    for r, p in enumerate(procs):
        last = (p.communicate(timeout=300)[0].strip().splitlines() or [""])[-1]
        if p.returncode != 0 or not last.startswith("{"):
            with open(f"{TMP}/{model_name}.worker{r}.log") as f:
                raise AssertionError(f"rank {r} failed: {f.read()[-3000:]}")
        outs.append(json.loads(last))
    assert all(o["installed"] >= 1 and o["mode"] == "snapshot" for o in outs), outs
    # Megatron's rank order: TP fastest, then PP (dp 1)
    sds = [torch.load(f"{TMP}/{model_name}.rank{r}.pt") for r in range(world)]
    merged = {}
    for stage in range(pp):
        merged.update(merge_tp(sds[stage * tp:(stage + 1) * tp]))
    want = expected_of(merged)
    st = inf.state()
    assert st.version == 1 and st.valid, st
    for name, t in want.items():
        have = bufs[(name, irank)][st.active]
        assert torch.equal(have.view(torch.int16), t.contiguous().view(torch.int16)), name
    inf.unregister()
    inf.close()


if len(sys.argv) > 2 and sys.argv[2] == "--worker":
    worker(int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    sys.exit(0)

try:
    check("a Megatron-Core GPTModel (TP1/PP1, CPU) published by refit.torch.Publisher("
          "framework=\"megatron\"): fused QKV and gate/up cut into the Hugging Face tensors "
          "byte for byte over two steps; publish(wait=...) returns once installed; a stray "
          "parameter, another config, in place with fp32 norms refused by name",
          publisher_end_to_end)
    check("a GPTModel with TP 2 (two processes, one node): each publishes its shards, "
          "the Hugging Face tensors equal the shards merged, byte for byte",
          lambda: parallel(2, 1, "mgtp2", 5))
    check("a GPTModel with PP 2 (two stages, one node): each publishes its stage, the "
          "Hugging Face tensors equal the stages joined, byte for byte",
          lambda: parallel(1, 2, "mgpp2", 6))
finally:
    for p in PROCS:
        p.terminate()
    for p in PROCS:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    if counts["failed"] == 0:
        shutil.rmtree(TMP, ignore_errors=True)
    else:
        print(f"     daemons' log: {TMP}/daemons.log")
print(f"megatron publisher: {counts['passed']} passed, {counts['failed']} failed")
sys.exit(1 if counts["failed"] else 0)
