#!/usr/bin/env python3
"""delta_density.py - how many bf16 weights change per RL-like training step.

Trains a small Llama (transformers' LlamaForCausalLM, random init, about
5 M parameters) on CPU with torch's Adam on fp32 master weights, publishes
bf16 copies after every step (round to nearest even, what `.to(bfloat16)`
does) and counts the bf16 elements whose bits differ from the previous
step's copy: the density a delta refit would send (issue 26).

The model first trains WARM steps at lr 1e-3 so the weights have left
their init and Adam's moments are warm (an RL job starts from a trained
model with a warm optimizer); then, for each RL-like learning rate, the
same warm state trains STEPS more steps and each step's density is
reported per tensor kind (attention, mlp, embeddings, norms; lm_head is
counted with embeddings).  "clustered" is the chance that the element
after a changed one changed too, compared with the density itself: equal
means changes fall independently (a bitmap or gap coding fits), much more
means runs.

Deterministic: seeded data and init, 2 threads, one process.  Needs torch
and transformers (the venv of tests/frameworks: build/venv-vllm).  About
80 s on 2 cores.  The warm-up matters: after 20 warm steps instead of 100 the
densities are about twice these (a young Adam's step is nearer lr per
element: its m / sqrt(v) has not yet shrunk where gradients change sign).

Usage: delta_density.py [--json] [--steps N] [--warm N (100)] [--lr 1e-7,1e-6,1e-5]
                        [--dump DIR]
--dump DIR writes, for the last step of each lr, the two bf16 copies of the
largest mlp weight as raw files (base-LR.bin, new-LR.bin) for
`bench-delta --files`.
"""
import argparse
import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

KINDS = ("attention", "mlp", "embeddings", "norms")


def kind_of(name):
    if "embed_tokens" in name or "lm_head" in name:
        return "embeddings"
    if "norm" in name:
        return "norms"
    if "self_attn" in name:
        return "attention"
    if "mlp" in name:
        return "mlp"
    raise ValueError("tensor %s: no kind" % name)


def make_model():
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(1)
    return LlamaForCausalLM(cfg).float()


def batches(n, seed, batch=8, seq=64, vocab=4096):
    """Sequences from a fixed random bigram table: learnable, deterministic."""
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, vocab, (vocab, 4), generator=g)
    out = []
    for _ in range(n):
        t = torch.empty(batch, seq, dtype=torch.long)
        t[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        pick = torch.randint(0, 4, (batch, seq), generator=g)
        for j in range(1, seq):
            t[:, j] = nxt[t[:, j - 1], pick[:, j]]
        out.append(t)
    return out


def step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return loss.detach().item()


def bf16_bits(model):
    return {n: p.detach().to(torch.bfloat16).view(torch.int16).clone()
            for n, p in model.named_parameters()}


def count(prev, cur):
    """Per kind: [changed, elements, changed followed by changed]."""
    acc = {k: [0, 0, 0] for k in KINDS}
    for n, a in prev.items():
        d = (a != cur[n]).flatten()
        a_k = acc[kind_of(n)]
        a_k[0] += int(d.sum())
        a_k[1] += d.numel()
        a_k[2] += int((d[:-1] & d[1:]).sum())
    return acc


def run_lr(model0, opt0, lr, steps, data, dump):
    model = make_model()
    model.load_state_dict(model0.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    opt.load_state_dict(opt0.state_dict())
    for g in opt.param_groups:
        g["lr"] = lr
    rows = []
    prev = bf16_bits(model)
    for s in range(steps):
        loss = step(model, opt, data[s % len(data)])
        cur = bf16_bits(model)
        acc = count(prev, cur)
        if dump and s == steps - 1:
            big = max((n for n in cur if kind_of(n) == "mlp"), key=lambda n: cur[n].numel())
            os.makedirs(dump, exist_ok=True)
            for tag, t in (("base", prev[big]), ("new", cur[big])):
                with open(os.path.join(dump, "%s-%g.bin" % (tag, lr)), "wb") as f:
                    f.write(t.numpy().tobytes())
        prev = cur
        rows.append({"step": s + 1, "loss": loss, "kinds": acc})
    return rows


def report(res, out):
    out.write("bf16 elements changed per step (Adam, fp32 master weights, %d parameters, "
              "%d warm steps at lr 1e-3):\n\n" % (res["params"], res["warm"]))
    out.write("| lr | step | all | attention | mlp | embeddings | norms | clustered "
              "(P[next changed | changed]) |\n|---|---|---|---|---|---|---|---|\n")
    for lr, rows in res["runs"].items():
        for r in rows:
            k = r["kinds"]
            ch = sum(v[0] for v in k.values())
            el = sum(v[1] for v in k.values())
            nn = sum(v[2] for v in k.values())
            out.write("| %s | %d | %.3f %% | %s | %.3f |\n" % (
                lr, r["step"], 100.0 * ch / el,
                " | ".join("%.3f %%" % (100.0 * k[x][0] / k[x][1]) for x in KINDS),
                nn / ch if ch else 0.0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--lr", default="1e-7,1e-6,1e-5")
    ap.add_argument("--dump")
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    t0 = time.monotonic()
    model = make_model()
    data = batches(a.warm + a.steps, seed=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for s in range(a.warm):
        step(model, opt, data[s])
    res = {"params": sum(p.numel() for p in model.parameters()), "warm": a.warm,
           "runs": {}}
    for lr in a.lr.split(","):
        res["runs"][lr] = run_lr(model, opt, float(lr), a.steps, data[a.warm:], a.dump)
    res["wall_s"] = time.monotonic() - t0
    if a.json:
        json.dump(res, sys.stdout)
        sys.stdout.write("\n")
    else:
        report(res, sys.stdout)
        sys.stdout.write("\n(%.0f s)\n" % res["wall_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
