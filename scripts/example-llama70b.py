#!/usr/bin/python3
"""Write layout files for a Llama-3-70B refit: training TP8 x PP4 x DP2 on
64 ranks (ranks 0-63, 8 nodes), inference 4 replicas of TP16 on 64 ranks
(64-127, two nodes each).  Usage:

    scripts/example-llama70b.py OUTDIR
    build/bin/refit-plan explain --src OUTDIR/train.json \\
        --dst OUTDIR/infer.json --topology dgx-h100:128
"""
import json
import os
import sys

H, I, V, L, KV = 8192, 28672, 128256, 80, 1024


def main(out):
    os.makedirs(out, exist_ok=True)
    src, dst = [], []

    def add(name, shape, dim, stage):
        pl = ["Replicate()", "Replicate()" if dim is None else f"Shard({dim})"]
        tmesh = [[dp * 32 + stage * 8 + tp for tp in range(8)] for dp in range(2)]
        imesh = [[64 + r * 16 + t for t in range(16)] for r in range(4)]
        src.append({"name": name, "dtype": "bf16", "shape": shape,
                    "mesh": tmesh, "placements": pl})
        dst.append({"name": name, "dtype": "bf16", "shape": shape,
                    "mesh": imesh, "placements": pl})

    add("model.embed_tokens.weight", [V, H], 0, 0)
    for l in range(L):
        p, stage = f"model.layers.{l}.", l * 4 // L
        add(p + "input_layernorm.weight", [H], None, stage)
        add(p + "post_attention_layernorm.weight", [H], None, stage)
        add(p + "self_attn.qkv_proj.weight", [H + 2 * KV, H], 0, stage)
        add(p + "self_attn.o_proj.weight", [H, H], 1, stage)
        add(p + "mlp.gate_up_proj.weight", [2 * I, H], 0, stage)
        add(p + "mlp.down_proj.weight", [H, I], 1, stage)
    add("model.norm.weight", [H], None, 3)
    add("lm_head.weight", [V, H], 0, 3)
    for fname, tensors in (("train.json", src), ("infer.json", dst)):
        with open(os.path.join(out, fname), "w") as f:
            json.dump({"model": "llama-3-70b", "tensors": tensors}, f)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
