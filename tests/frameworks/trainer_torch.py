"""A torch trainer publishing through refit.torch.Publisher, driven by
tests/integration/test_engine.py over stdin/stdout (JSON lines).  Run in
the vllmcpu environment.

Usage: trainer_torch.py MODEL_DIR SOCKET MODEL NPROC  (SOCKET: {rank} is the
process's rank)

NPROC 1: one process, fp32 parameters published in place.  NPROC 4: FSDP2
over a 2 x 2 mesh (data-parallel shards x tensor parallel, gloo), fp32
DTensor parameters published as snapshots; process 0 talks to the test,
the others follow its commands through a broadcast.

Commands:
  step {lr}     one Adam step on a fixed random batch, then publish(step):
                {"version", "publish_s"}
  save {dir}    the full parameters cast to bf16 as a Hugging Face
                checkpoint in dir (config, tokenizer, model.safetensors)
"""
import json
import os
import shutil
import sys
import time


# answers go to the original stdout; everything else (vLLM's and torch's
# logs, which print to stdout) to stderr
_ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)


def out(obj):
    _ANSWERS.write(json.dumps(obj) + "\n")
    _ANSWERS.flush()


def build(mdir, nproc, rank):
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32)
    if nproc == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = {}
    for i in range(len(model.model.layers)):
        for n in ("q_proj", "k_proj", "v_proj"):
            plan[f"model.layers.{i}.self_attn.{n}"] = ColwiseParallel()
        plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        for n in ("gate_proj", "up_proj"):
            plan[f"model.layers.{i}.mlp.{n}"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def full_state(model):
    """{name: full tensor} (DTensors gathered: a collective)."""
    res = {}
    for n, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        res[n] = t.detach()
    return res


def run(rank, nproc, mdir, sock, model_name, port):
    import torch
    if nproc > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=nproc)
    import refit.torch as rt
    torch.manual_seed(0)
    model = build(mdir, nproc, rank)
    pub = rt.Publisher(model, sock.format(rank=rank), model_name)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, model.config.vocab_size, (2, 16), generator=g)
    if rank == 0:
        out({"ready": True, "mode": pub.mode})
    step = 0
    while True:
        if rank == 0:
            line = sys.stdin.readline()
            rq = json.loads(line) if line else {"cmd": "quit"}
        else:
            rq = None
        if nproc > 1:
            box = [rq]
            dist.broadcast_object_list(box, src=0)
            rq = box[0]
        cmd = rq["cmd"]
        if cmd == "step":
            for grp in opt.param_groups:
                grp["lr"] = float(rq.get("lr", 1e-3))
            loss = model(batch, labels=batch).loss
            loss.backward()
            with pub.writing():
                opt.step()
            opt.zero_grad()
            step += 1
            t0 = time.monotonic()
            pub.publish(step)
            if rank == 0:
                out({"version": step, "publish_s": time.monotonic() - t0,
                     "loss": float(loss)})
        elif cmd == "save":
            st = full_state(model)
            if rank == 0:
                from safetensors.torch import save_file
                d = rq["dir"]
                os.makedirs(d, exist_ok=True)
                for f in os.listdir(mdir):
                    if f.endswith(".json"):
                        shutil.copy(os.path.join(mdir, f), d)
                save_file({k: v.to(torch.bfloat16).contiguous() for k, v in st.items()},
                          os.path.join(d, "model.safetensors"))
                out({"saved": d})
        elif cmd == "quit":
            if rank == 0:
                out({"bye": True})
            break
    if nproc > 1:
        dist.destroy_process_group()


def main():
    mdir, sock, model_name, nproc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if nproc == 1:
        run(0, 1, mdir, sock, model_name, 0)
    else:
        import socket

        import torch.multiprocessing as mp
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        # process 0 keeps this stdin/stdout; the others are children
        ctx = mp.get_context("fork")
        ps = [ctx.Process(target=run, args=(r, nproc, mdir, sock, model_name, port))
              for r in range(1, nproc)]
        for p in ps:
            p.start()
        run(0, nproc, mdir, sock, model_name, port)
        for p in ps:
            p.join()


if __name__ == "__main__":
    main()
