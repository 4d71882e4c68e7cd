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
config), in place with the fp32 norms.

Usage: build/venv-megatron/bin/python tests/frameworks/test_megatron_publisher.py BUILD
Prints "megatron publisher: N passed, N failed".  About 25 s here.
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
TMP = tempfile.mkdtemp(prefix="refit-mgpub-")
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
    from megatron.core.transformer.transformer_config import TransformerConfig
    cfg = TransformerConfig(
        num_layers=layers, hidden_size=64, num_attention_heads=8, num_query_groups=2,
        ffn_hidden_size=96, kv_channels=16, gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", add_bias_linear=False, layernorm_epsilon=1e-6,
        use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16)
    torch.manual_seed(0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=256,
                     max_sequence_length=256, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope")
    with torch.no_grad():   # distinct values everywhere (norms start at 1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, dtype=torch.float32).to(p.dtype))
    return model


def expected_hf(model):
    """The Hugging Face tensors of the Megatron parameters, cut here."""
    sd = {n: t.detach() for n, t in model.named_parameters()}
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
    addr = start_cluster()
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


try:
    check("a Megatron-Core GPTModel (TP1/PP1, CPU) published by refit.torch.Publisher("
          "framework=\"megatron\"): fused QKV and gate/up cut into the Hugging Face tensors "
          "byte for byte over two steps; publish(wait=...) returns once installed; a stray "
          "parameter, another config, in place with fp32 norms refused by name",
          publisher_end_to_end)
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
