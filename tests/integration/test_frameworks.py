#!/usr/bin/python3
"""The frameworks' own memory end to end (docs/frameworks.md): a coordinator
and four node daemons on loopback (harness.py); a trainer holding its
weights as Megatron-Core does (TP2 x PP2: interleaved linear_qkv, [gate_r;
up_r] linear_fc1, a vocabulary padded to 128 * tp, one parameter per local
expert), two vLLM instances (TP4 > 2 KV heads: qkv_proj [q_r; k_r; v_r]
with replicated KV heads, gate_up_proj, w13/w2 stacked experts, padding to
64) and an SGLang instance, all registered in place from
refit.frameworks maps (the C rules through librefit).  Two models (dense
with qkv biases, MoE with qk-norm), two versions each: every byte of every
engine parameter equals what the map builds from the Hugging Face weights,
padding untouched, and after the first refit equals what vLLM's and
SGLang's own loaders hold for the same checkpoint
(tests/frameworks/engine_ref.py, run in their environments under BUILD).
A third model goes to fp8 engines (128 x 128 blocks): weights and
weight_scale_inv byte for byte against the numpy reference quantizer.
Bad maps are refused at registration naming the tensor.

Usage: test_frameworks.py BUILD_DIR.  Prints "frameworks: N passed, N failed".
"""
import json
import os
import struct
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-fw-")
from refit.v1 import refit_pb2 as pb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import RPN, Cluster, check  # noqa: E402

harness.init(BUILD, TMP)
harness.use_tree_package()  # the refit package from python/
import numpy as np  # noqa: E402

import refit  # noqa: E402
import refit.frameworks as fw  # noqa: E402

sys.path.insert(0, os.path.abspath("tests/conversion"))
import ref as quant_ref  # noqa: E402  (the numpy reference quantizer)

assert RPN == 4, "test_frameworks.py lays out 4 ranks per node"
BASE = {"c": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
              "hidden_size": 128, "num_hidden_layers": 4,
              "vocab_size": 250, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 96, "tie_word_embeddings": False,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "hidden_act": "silu", "torch_dtype": "bfloat16"}}
MODELS = {
    "dense": dict(BASE["c"]),
    "moe": dict(BASE["c"], model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                num_experts=8, moe_intermediate_size=32, num_experts_per_tok=2,
                decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                vocab_size=300),
    # fp8 with 128 x 128 blocks: every TP4 share of a projection whole blocks
    "fp8": dict(BASE["c"], model_type="llama", architectures=["LlamaForCausalLM"],
                hidden_size=256, num_hidden_layers=2,
                num_attention_heads=4, head_dim=128, intermediate_size=512, vocab_size=500),
}
# (instance, framework, node, install)
INSTANCES = [("a", "vllm", 1, "double-buffer"), ("b", "vllm", 2, "in-place"),
             ("c", "sglang", 3, "double-buffer")]
CL = Cluster("fw", 4)
RNG = np.random.default_rng(7)


def hf_weights(m):
    """Random finite Hugging Face tensors (bf16 bit patterns: the engines'
    reference loads fill with NaN to find what they leave alone, and the
    quantizer's scales stay finite) for every logical tensor."""
    out = {}
    for t in m["tensors"]:
        assert t["dtype"] == "bf16", t
        x = RNG.standard_normal(t["shape"]).astype(np.float32) * 4
        out[t["name"]] = (x.view(np.uint32) >> 16).astype(np.uint16)
    return out


def refused(fn, text):
    """fn raises refit.InvalidArgument whose message holds text."""
    try:
        fn()
    except refit.InvalidArgument as e:
        assert text in str(e), f"{text!r} not in {e}"
        return
    raise AssertionError(f"accepted; expected a refusal naming {text!r}")


def write_checkpoint(d, cfg, hf):
    """A Hugging Face checkpoint of hf (bf16 bit patterns): config.json and
    model.safetensors, as the engines load them."""
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f)
    header, off = {}, 0
    for name, a in hf.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(f"{d}/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in hf.values():
            f.write(np.ascontiguousarray(a, dtype="<u2").tobytes())


def engine_reference(framework, ckpt, tp):
    """[{param: bytes}] per rank: what the engine's own loader holds after
    loading ckpt (tests/frameworks/engine_ref.py in the engine's venv)."""
    out = f"{ckpt}-{framework}"
    r = subprocess.run([f"{BUILD}/venv-{framework}/bin/python", "tests/frameworks/engine_ref.py",
                        "--framework", framework, "--config", ckpt, "--tp", str(tp),
                        "--out", out], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"engine_ref.py {framework}: {r.stdout}{r.stderr}"
    return [dict(np.load(f"{out}/rank{k}.npz")) for k in range(tp)]


class Trainer:
    def __init__(self, model, cfg):
        self.m = fw.framework_map("megatron", cfg, "tp2,pp2")
        self.params = fw.allocate(self.m)
        self.c = refit.Client(CL.sock(0), timeout_ms=30000)
        self.c.register(model, "train", fw.layouts(self.m), fw.pieces(self.m, self.params))

    def publish(self, version, hf):
        if version > 1:
            self.c.begin_write()
        fw.fill(self.m, self.params, hf)
        self.c.weights_ready(version)


def hf_fp8(m, hf):
    """What an fp8 engine holds of the Hugging Face weights hf: each fp8
    tensor quantized by the numpy reference, its scales beside it."""
    out = dict(hf)
    for t in m["tensors"]:
        if "convert" in t:
            q, sc = quant_ref.convert(hf[t["name"]], t["convert"]["from"], "fp8e4m3", "block",
                                      t["convert"]["block"])
            out[t["name"]] = np.asarray(q, dtype=np.uint8)
            out[t["name"] + "_scale_inv"] = np.asarray(sc, dtype=np.float32)
    return out


class Engine:
    def __init__(self, model, cfg, name, framework, node, install, quant=None):
        self.name, self.install, self.quant = name, install, quant
        self.framework = framework
        self.m = fw.framework_map(framework, cfg, "tp4", quant=quant)
        self.base = node * RPN
        self.params = fw.allocate(self.m, copies=2 if install == "double-buffer" else 1)
        self.c = refit.Client(CL.sock(node), timeout_ms=30000)
        self.c.register(model, "infer", fw.layouts(self.m, base=self.base),
                        fw.pieces(self.m, self.params, base=self.base), instance=name,
                        install=install)

    def check(self, version, hf, engine=None):
        """Every parameter byte equals the map's build from hf, padding 0;
        and, given `engine` (per rank {param: bytes} from the engine's own
        loader on the same checkpoint), equals what the engine holds."""
        st = self.c.wait_version(version, 30000)
        assert st.version == version and st.valid, (self.name, st)
        ref = fw.allocate(self.m)
        fw.fill(self.m, ref, hf_fp8(self.m, hf) if self.quant else hf)
        if engine is not None:
            for (rank, name), arr in self.params.items():
                got = arr[st.active] if isinstance(arr, tuple) else arr
                want = engine[rank][name]
                assert got.shape == want.shape and np.array_equal(
                    got.view(np.uint8), want.view(np.uint8)), \
                    f"instance {self.name} rank {rank} {name}: differs from the engine's load"
            assert {n for _, n in self.params} == set(engine[0]), \
                f"instance {self.name}: parameters differ from the engine's"
        nbytes = 0
        for key, arr in self.params.items():
            got = arr[st.active] if isinstance(arr, tuple) else arr
            if not np.array_equal(got.view(np.uint8), ref[key].view(np.uint8)):
                bad = np.argwhere(got.view(np.uint8) != ref[key].view(np.uint8))[0]
                raise AssertionError(f"instance {self.name} rank {key[0]} {key[1]}: byte "
                                     f"{list(bad)} differs from the map's build")
            nbytes += got.nbytes
        return nbytes


def model_refits(model, instances=INSTANCES):
    cfg = MODELS[model]
    tr = Trainer(model, cfg)
    engines = [Engine(model, cfg, *i) for i in instances]
    moved = 0
    for version in (1, 2):
        hf = hf_weights(tr.m)
        refs = {}
        if version == 1 and model != "fp8":
            # the reference: each engine's own loader on the same checkpoint
            ckpt = f"{TMP}/ckpt-{model}"
            write_checkpoint(ckpt, cfg, hf)
            for f in {e.framework for e in engines}:
                refs[f] = engine_reference(f, ckpt, 4)
        tr.publish(version, hf)
        g = CL.refit(model, version)
        assert g.state == pb.COMMITTED, (model, version, g.failure)
        for e in engines:
            moved += e.check(version, hf, refs.get(e.framework))
    # the engines' parameters hold padding the trainer never sends
    pad = sum(len(p["padding"]) for e in engines for r in e.m["ranks"] for p in r["params"])
    assert pad > 0, "no padded parameter: the test lost its point"
    for e in engines + [tr]:
        e.c.unregister()
        e.c.close()
    assert moved > 0


def dense():
    model_refits("dense")


def moe():
    model_refits("moe")


def fp8():
    """SGLang and vLLM in fp8 with 128 x 128 block scales: refit quantizes
    on the way and writes the scales straight into weight_scale_inv."""
    model_refits("fp8", [("c", "sglang", 3, "double-buffer", "fp8-block128"),
                         ("b", "vllm", 2, "in-place", "fp8-block128")])
    m = fw.framework_map("sglang", MODELS["fp8"], "tp4", quant="fp8-block128")
    names = [p["name"] for p in m["ranks"][0]["params"]]
    assert "model.layers.0.self_attn.qkv_proj.weight_scale_inv" in names, names
    assert "model.layers.1.mlp.gate_up_proj.weight_scale_inv" in names, names


def bad_maps():
    """A map whose pieces overlap on one rank, or that leaves part of a
    tensor out of an instance, is refused at registration naming it."""
    cfg = MODELS["dense"]
    m = fw.framework_map("vllm", cfg, "tp4")
    lays = fw.layouts(m, base=RPN)
    params = fw.allocate(m)
    pieces = fw.pieces(m, params, base=RPN)
    c = refit.Client(CL.sock(1), timeout_ms=30000)
    try:
        # rank 4 holds q_proj rows 0-31; claim rows 16-47 once more
        q = next(lay for lay in lays if lay["name"].endswith("layers.0.self_attn.q_proj.weight"))
        H = MODELS["dense"]["hidden_size"]
        dup = dict(q, shards=q["shards"] + [{"rank": RPN, "offset": [16, 0],
                                             "size": [32, H]}])
        extra = {("model.layers.0.self_attn.q_proj.weight", RPN, 1):
                 refit.empty([32, H], "uint16")}
        refused(
            lambda: c.register("badmap", "infer", [dup if lay is q else lay for lay in lays],
                               {**pieces, **extra}, instance="x", install="in-place"),
            "rank 4 holds the box at [0, 0] and the box at [16, 0]")
        # drop the last rank's share of o_proj: the instance no longer has it all
        o = next(lay for lay in lays if lay["name"].endswith("layers.1.self_attn.o_proj.weight"))
        short = dict(o, shards=o["shards"][:-1])
        gone = {k: v for k, v in pieces.items()
                if not (k[0] == o["name"] and k[1] == RPN + 3)}
        refused(
            lambda: c.register("badmap", "infer", [short if lay is o else lay for lay in lays],
                               gone, instance="x", install="in-place"),
            "layout \"model.layers.1.self_attn.o_proj.weight\": the shards leave %d of %d "
            "elements uncovered, e.g. element [0, 96]" % (H * 32, H * 128))
    finally:
        c.close()


try:
    check("dense (qkv biases): Megatron TP2xPP2 -> 2 x vLLM TP4 (tp > kv heads) + SGLang "
          "TP4, 2 versions, every engine byte as vLLM's and SGLang's own loaders hold the "
          "same checkpoint", dense)
    check("MoE (qk-norm, 8 experts): Megatron per-expert weights -> vLLM/SGLang w13/w2, "
          "2 versions, byte for byte against the engines' own loaders", moe)
    check("fp8: Megatron bf16 -> SGLang and vLLM fp8 (128 x 128 blocks, TP4) with "
          "scales in weight_scale_inv, byte for byte against the numpy quantizer", fp8)
    check("bad maps refused at registration: a rank holding an element twice, an "
          "instance missing part of a tensor", bad_maps)
finally:
    harness.stop_all()
    harness.check_exits()
harness.summary("frameworks")
