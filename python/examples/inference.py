#!/usr/bin/python3
"""An inference loop that serves from its refit buffers and switches
versions between requests.

    PYTHONPATH=python python3 python/examples/inference.py \
        --socket /run/refit/refitd.sock --model tiny --ranks 4-7 --until 3

Registers a double-buffered instance (or --install in-place) of the tiny
model of trainer.py, sharded its own way (fc.weight Shard(1) over its
ranks, fc.bias Replicate()), waits for the first version, then serves
requests: each request runs on the copy that holds the current version;
between requests it asks state() and switches to a newer version when one
was installed (never in the middle of a request).  After serving version
--until it exits.

Prints "SERVING <version> copy=<c>" when it switches, and per piece
"PIECE <version> <tensor> <rank> <offset,...> <size,...> <sha256>" (the
SHA-256 of the piece's bytes, row-major) for each version it switches to.
"""
import argparse
import hashlib
import time

import torch

import refit

IN, OUT = 16, 32


def ranks_arg(s):
    a, _, b = s.partition("-")
    return list(range(int(a), int(b or a) + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--instance", default="serve0")
    ap.add_argument("--ranks", default="4-7", type=ranks_arg)
    ap.add_argument("--install", default="double-buffer",
                    choices=["double-buffer", "in-place"])
    ap.add_argument("--until", type=int, default=3, help="the version to end with")
    ap.add_argument("--timeout-ms", type=int, default=60000)
    a = ap.parse_args()

    layouts = [refit.layout.placements("fc.weight", "bf16", (OUT, IN), a.ranks, ["Shard(1)"]),
               refit.layout.placements("fc.bias", "bf16", (OUT,), a.ranks, ["Replicate()"])]
    copies = 2 if a.install == "double-buffer" else 1
    client = refit.Client(a.socket, timeout_ms=a.timeout_ms)
    bufs = {}
    for lay in layouts:
        for r in client.ranks:
            for off, size in refit.layout.local_boxes(lay, r):
                b = refit.empty(size, torch.bfloat16, copies=copies, torch=True)
                bufs[(lay["name"], r)] = (off, size), (b if copies == 2 else (b,))
    client.register(a.model, "infer", layouts,
                    {k: (v[1] if copies == 2 else v[1][0]) for k, v in bufs.items()},
                    instance=a.instance, install=a.install)
    print("REGISTERED", flush=True)

    def report(version, copy):
        for (name, r), ((off, size), cs) in sorted(bufs.items()):
            raw = cs[copy].contiguous().view(torch.int16).numpy().tobytes()
            print(f"PIECE {version} {name} {r} {','.join(map(str, off))} "
                  f"{','.join(map(str, size))} {hashlib.sha256(raw).hexdigest()}", flush=True)

    st = client.wait_version(1)
    version, copy = st.version, st.active if copies == 2 else 0
    print(f"SERVING {version} copy={copy}", flush=True)
    report(version, copy)
    x = torch.randn(4, IN)
    served = 0
    deadline = time.time() + a.timeout_ms / 1000
    while True:
        # one request: this rank's slice of the layer, on the current copy
        for (name, r), ((off, size), cs) in bufs.items():
            if name == "fc.weight":
                w = cs[copy].float()
                _ = x[:, off[1]:off[1] + size[1]] @ w.t()
        served += 1
        if version >= a.until:
            break
        # between requests: switch when a newer version is installed
        st = client.state()
        if st.version > version and st.valid:
            version, copy = st.version, st.active if copies == 2 else 0
            print(f"SERVING {version} copy={copy} after {served} requests", flush=True)
            report(version, copy)
        elif time.time() > deadline:
            raise SystemExit(f"inference: version {a.until} not installed in "
                             f"{a.timeout_ms} ms (at {version})")
        else:
            time.sleep(0.01)
    print(f"DONE {version} after {served} requests", flush=True)
    client.unregister()
    client.close()


if __name__ == "__main__":
    main()
