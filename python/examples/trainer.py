#!/usr/bin/python3
"""A torch trainer that steps and publishes versions through refit.

    PYTHONPATH=python python3 python/examples/trainer.py \
        --socket /run/refit/refitd.sock --model tiny --ranks 0-3 --steps 3

A tiny model (one Linear layer) is trained with SGD on random data.  Its
weights are published in bf16, sharded over the trainer's ranks like a
DTensor (fc.weight Shard(0), fc.bias Replicate()): after every step the
trainer calls begin_write() (no refit reads the buffers any more), copies
the parameters into its refit buffers and calls weights_ready(step).  Only
the pieces of the ranks this node daemon serves are registered: run one
trainer per node.

--dump DIR writes every published version's full tensors, row-major, to
DIR/<version>/<tensor>.bin (the end-to-end test compares them byte for
byte with what inference received).  Steps are --interval seconds apart;
after the last it stays registered --linger seconds, so that refits can
read it.  --go-file F instead waits for F.<step> to exist before each
step after the first, and for F.<steps+1> before it unregisters (the test
paces the steps that way).  Prints "READY <version>" per version.
"""
import argparse
import os
import sys
import time

import torch

import refit

IN, OUT = 16, 32


class Shard:
    """Shaped like torch.distributed.tensor.Shard (torch 1.13 has no DTensor)."""

    def __init__(self, dim):
        self.dim = dim


class Replicate:
    pass


class Mesh:
    """Shaped like a DeviceMesh: .mesh, a tensor of global ranks."""

    def __init__(self, ranks):
        self.mesh = torch.tensor(ranks)


class DTensorLike:
    """What refit.layout.dtensor reads from a DTensor: placements, mesh, shape."""

    def __init__(self, shape, dtype, mesh, placements):
        self.shape, self.dtype = torch.Size(shape), dtype
        self.device_mesh, self.placements = mesh, placements


def ranks_arg(s):
    a, _, b = s.partition("-")
    return list(range(int(a), int(b or a) + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="the node daemon's local socket")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ranks", default="0-3", type=ranks_arg,
                    help="the trainer's mesh of global ranks, A-B")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dump", help="write every version's tensors under this folder")
    ap.add_argument("--go-file", help="before each later step, wait for this file")
    ap.add_argument("--interval", type=float, default=10,
                    help="seconds between steps, without --go-file")
    ap.add_argument("--linger", type=float, default=30,
                    help="seconds to stay registered after the last step, without --go-file")
    ap.add_argument("--timeout-ms", type=int, default=30000)
    a = ap.parse_args()

    torch.manual_seed(0)
    net = torch.nn.Linear(IN, OUT)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mesh = Mesh(a.ranks)
    published = {"fc.weight": DTensorLike((OUT, IN), torch.bfloat16, mesh, [Shard(0)]),
                 "fc.bias": DTensorLike((OUT,), torch.bfloat16, mesh, [Replicate()])}
    layouts = [refit.layout.dtensor(n, t) for n, t in published.items()]

    client = refit.Client(a.socket, timeout_ms=a.timeout_ms)
    bufs = {}  # (tensor, rank) -> (its box, the refit buffer)
    for lay in layouts:
        for r in client.ranks:
            for off, size in refit.layout.local_boxes(lay, r):
                bufs[(lay["name"], r)] = (off, size), refit.empty(size, torch.bfloat16,
                                                                   torch=True)
    params = {"fc.weight": net.weight, "fc.bias": net.bias}

    def publish(version):
        for (name, _), ((off, size), buf) in bufs.items():
            full = params[name].detach().to(torch.bfloat16)
            buf.copy_(full[tuple(slice(o, o + s) for o, s in zip(off, size))])
        if a.dump:
            d = os.path.join(a.dump, str(version))
            os.makedirs(d, exist_ok=True)
            for name, p in params.items():
                raw = p.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy()
                raw.tofile(os.path.join(d, name + ".bin"))

    x = torch.randn(64, IN)
    y = torch.randn(64, OUT)
    publish(1)  # the initial weights are version 1
    client.register(a.model, "train", layouts, {k: v[1] for k, v in bufs.items()})
    client.weights_ready(1)
    print("READY 1", flush=True)
    def wait_go(step):
        if not a.go_file:
            time.sleep(a.interval if step <= a.steps else a.linger)
            return
        end = time.time() + 300
        while a.go_file and not os.path.exists(f"{a.go_file}.{step}"):
            if time.time() > end:
                sys.exit(f"trainer: {a.go_file}.{step} did not appear in 300 s")
            time.sleep(0.02)

    for step in range(2, a.steps + 1):
        wait_go(step)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        client.begin_write()  # no refit reads the old version from here on
        publish(step)
        client.weights_ready(step)
        print(f"READY {step} loss={loss.item():.4f}", flush=True)
    wait_go(a.steps + 1)
    client.unregister()
    client.close()


if __name__ == "__main__":
    main()
