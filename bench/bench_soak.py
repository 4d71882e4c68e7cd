#!/usr/bin/python3
"""Memory soak (part of `make bench`): many refits in a row on loopback, and
what each daemon holds after them.

A coordinator (state file on, /metrics on) and three node daemons (/metrics
on; a fourth leaves and joins again every 100 refits), a trainer (refit-client, node 0) and two double-buffered inference
instances (node 1; node 2), the clients the integration tests use
(tests/integration/harness.py).  Each step: WeightsReady of the next
version, TriggerRefit, GetRefit until final, every instance checks its
bytes (mismatches=0), and every 10 steps ListRefits and a scrape of every
/metrics.  At each checkpoint (after 100 and 1,000 refits by default) it
prints, per daemon, RSS and anonymous RSS (/proc/PID/status: VmRSS,
RssAnon), open fds and threads, and what malloc holds (its /metrics
refitd_heap_inuse_bytes: allocated and not freed; refitd_heap_system_bytes:
taken from the system), the coordinator's kept refit records and the
records it has freed with the bytes they hold (refitd_refit_records,
..._freed_total, ..._bytes), then the growth per refit between the first
and the last checkpoint.  RSS that grows
while the heap in use stays flat is the allocator's (fragmentation, free
memory it keeps), not memory the daemons hold.

Usage: bench_soak.py BUILD_DIR [--refits 100,1000] [--records N]
                     [--epoch-every K] [--json FILE]
--refits: the checkpoints (refit counts, ascending; the last is the run's
length).  --records N: the coordinator's refit_records (default: the
daemon's own, 256; leave it out to measure a build from before the key
existed).  --epoch-every K (default 100; 0: never): every K refits a
fourth node daemon, with no clients and not measured, leaves and a fresh
one joins, so the membership epoch moves on twice and the next refit
prepares the new epoch on every node.  --json FILE: the figures also as
one JSON object.
Exits 1 when a refit fails or a byte is wrong.
"""
import json
import os
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import protostubs  # noqa: E402

ARGS = sys.argv[1:]


def opt(name, default, conv=str):
    if name not in ARGS:
        return default
    i = ARGS.index(name)
    if i + 1 >= len(ARGS):
        raise SystemExit(f"bench_soak.py: {name} needs a value")
    v = ARGS[i + 1]
    del ARGS[i:i + 2]
    try:
        return conv(v)
    except ValueError:
        raise SystemExit(f"bench_soak.py: {name} \"{v}\": not a valid value")


def counts(s):
    out = [int(x) for x in s.split(",") if x]
    if not out or out != sorted(out) or out[0] < 1:
        raise ValueError(s)
    return out


CHECKS = opt("--refits", [100, 1000], counts)
RECORDS = opt("--records", None, int)
EPOCHS = opt("--epoch-every", 100, int)
JSON_OUT = opt("--json", None)
if len(ARGS) > 1:
    raise SystemExit(f"bench_soak.py: unexpected argument \"{ARGS[1]}\" (usage: "
                     "bench_soak.py BUILD_DIR [--refits 100,1000] [--records N] "
                     "[--epoch-every K] [--json FILE])")
BUILD = ARGS[0] if ARGS else "build"

TMP = protostubs.generate("refit-soak-")
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, free_port, node_spawn_args, spawn, write  # noqa: E402

harness.init(BUILD, TMP)


def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [64, 32], "mesh": ranks,
             "placements": [placement]} for k in range(4)]


def proc(pid, text):
    """(RSS KiB, anonymous RSS KiB, fds, threads, heap in use KiB, heap from
    the system KiB) of a process; the heap figures from its /metrics text
    (None: not exported)."""
    rss = anon = th = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == "VmRSS":
                rss = int(v.split()[0])
            elif k == "RssAnon":
                anon = int(v.split()[0])
            elif k == "Threads":
                th = int(v.split()[0])
    heap = [gauge(text, n) for n in ("refitd_heap_inuse_bytes", "refitd_heap_system_bytes")]
    return (rss, anon, len(os.listdir(f"/proc/{pid}/fd")), th) + \
        tuple(None if h is None else int(h) // 1024 for h in heap)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    mports = [free_port() for _ in range(4)]
    coord_extra = ["--state-file", f"{TMP}/coord.state",
                   "--metrics-listen", f"127.0.0.1:{mports[0]}"]
    if RECORDS is not None:
        coord_extra += ["--refit-records", str(RECORDS)]
    cl = Cluster("s", 3, coord_extra=coord_extra, lease_ms=3000,
                 node_extra=lambda k: ["--metrics-listen", f"127.0.0.1:{mports[k + 1]}"])
    tl = write(f"{TMP}/soak-t.json", tensors([0, 1], "Shard(0)"))
    trainer = Client(cl, 0, "soak", "train", tl)
    assert trainer.ok(), trainer.first
    insts = []
    for k in (1, 2):
        lay = write(f"{TMP}/soak-i{k}.json", tensors([4 * k, 4 * k + 1], "Shard(1)"))
        c = Client(cl, k, "soak", "infer", lay, instance=f"i{k}", install="double-buffer")
        assert c.ok(), c.first
        insts.append(c)
    procs = [("coordinator", cl.coord.pid, mports[0])] + \
        [(f"node s{k}", p.pid, mports[k + 1]) for k, p in enumerate(cl.nodes)]
    extra = new_epochs(cl, None)
    rows, t0 = {}, time.time()
    for v in range(1, CHECKS[-1] + 1):
        rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="soak", version=v),
                                   timeout=10).refit_id
        g = harness.refit_final(cl.stub, rid, 120, every=0.005)
        if g.state != pb.COMMITTED:
            raise SystemExit(f"bench_soak: refit {rid} (v{v}) ended {g.state}: {g.failure}")
        for c in insts:
            out = c.cmd(f"wait {v} 20000")
            if not (out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out):
                raise SystemExit(f"bench_soak: v{v}: {out}")
        out = trainer.cmd(f"next {v + 1}")
        assert out.startswith("READY"), out
        if EPOCHS and v % EPOCHS == 0:
            extra = new_epochs(cl, extra)
        if v % 10 == 0:
            cl.stub.ListRefits(pb.ListRefitsRequest(), timeout=10)
            for _, _, p in procs:
                scrape(p)
        if v in CHECKS:
            rows[v] = checkpoint(procs, time.time() - t0)
            report(v, rows[v])
    for c in insts + [trainer]:
        c.close()
    harness.stop_all()
    growth(rows)


def new_epochs(cl, extra):
    """A fourth node daemon (no clients, not measured) leaves (SIGTERM) and a
    fresh one joins: two new epochs, which the next refit prepares on every
    node (per-epoch state: members, token, transport, buffer pool, plan)."""
    if not EPOCHS:
        return None
    if extra is not None:
        extra.terminate()
        extra.wait(timeout=30)
        cl.wait_members(3)
    p = spawn(node_spawn_args(cl, "s3", f"{3 * harness.RPN}-{4 * harness.RPN - 1}"),
              stderr=cl.log)
    cl.wait_members(4)
    return p


def checkpoint(procs, secs):
    """Every process's figures (proc), once the gauges (refreshed each second)
    have been refreshed since the last refit."""
    time.sleep(1.2)  # the daemons' gauge tick; what is read is RSS, not time
    texts = [scrape(p) for _, _, p in procs]
    rec = (gauge(texts[0], "refitd_refit_records"),
           gauge(texts[0], "refitd_refit_records_freed_total"),
           gauge(texts[0], "refitd_refit_records_bytes"), gauge(texts[0], "refitd_epoch"))
    return [(name, proc(pid, t)) for (name, pid, _), t in zip(procs, texts)], rec, secs


def report(v, row):
    procs, rec, secs = row
    kept = f"; epoch {int(rec[3]) & 0xffffffff}" if rec[3] is not None else ""
    if rec[0] is not None:
        kept += f"; coordinator records kept {rec[0]:.0f} ({rec[2] / 1024:.0f} KiB), " \
            f"freed {rec[1]:.0f}"
    print(f"after {v} refits ({secs:.0f} s{kept}):")
    print(f"  {'process':<12} {'RSS KiB':>8} {'anon KiB':>8} {'fds':>4} {'threads':>7} "
          f"{'heap used KiB':>13} {'heap held KiB':>13}")
    for name, (rss, anon, fd, th, hu, hs) in procs:
        print(f"  {name:<12} {rss:>8} {anon:>8} {fd:>4} {th:>7} {str(hu or '-'):>13} "
              f"{str(hs or '-'):>13}")
    sys.stdout.flush()


def growth(rows):
    if len(rows) < 2:
        return
    a, b = min(rows), max(rows)
    n = b - a
    fig = {"refits": sorted(rows), "records": RECORDS, "procs": {}}
    print(f"growth per refit between {a} and {b} refits:")
    for (name, pa), (_, pb_) in zip(rows[a][0], rows[b][0]):
        d = [None if pb_[i] is None or pa[i] is None else pb_[i] - pa[i] for i in range(6)]
        heap = "" if d[4] is None else \
            f", heap used {d[4] * 1024 / n:+7.1f} B/refit, held {d[5] * 1024 / n:+7.1f} B/refit"
        if name == "coordinator" and rows[a][1][2] is not None:
            rb = (rows[b][1][2] - rows[a][1][2]) / n
            heap += f" (kept records {rb:+.1f} B/refit of it)"
            fig["records_b_per_refit"] = rb
        print(f"  {name:<12} RSS {d[0] * 1024 / n:+7.1f} B/refit, anon "
              f"{d[1] * 1024 / n:+7.1f} B/refit, fds {d[2]:+d}, threads {d[3]:+d}{heap}")
        fig["procs"][name] = {"at": {str(v): rows[v][0][[x[0] for x in rows[v][0]].index(name)][1]
                                     for v in rows},
                              "rss_b_per_refit": d[0] * 1024 / n,
                              "anon_b_per_refit": d[1] * 1024 / n,
                              "heap_used_b_per_refit": None if d[4] is None
                              else d[4] * 1024 / n}
    ka, kb = rows[a][1][0], rows[b][1][0]
    if ka is not None and ka != kb:
        print(f"  (the coordinator's kept records went {ka:.0f} -> {kb:.0f}: up to its "
              "refit_records bound they are kept on purpose; --records N below the first "
              "checkpoint measures past the bound)")
    if JSON_OUT:
        with open(JSON_OUT, "w") as f:
            json.dump(fig, f)


if __name__ == "__main__":
    try:
        main()
    finally:
        harness.stop_all()
        harness.tidy_tmp(TMP, False)
