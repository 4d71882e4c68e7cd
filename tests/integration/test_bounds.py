#!/usr/bin/python3
"""Bounded memory (docs/operations.md, "Memory bounds"): the coordinator keeps
at most refit_records refit records and frees the older ones.

A coordinator with refit_records 8, a state file and /metrics, two node
daemons, a trainer and a double-buffered instance on loopback:

 - 30 refits, one after another: after each, ListRefits holds at most 8
   records, the newest, and GetRefit of the one that just fell out answers
   NOT_FOUND; the state file holds at most 8 records;
 - /metrics: refitd_refit_records reaches 8, refitd_refit_records_allocated
   (records in memory, kept or not) equals it, and
   refitd_refit_records_freed_total counts the other 22: a record dropped
   without being freed keeps the allocated gauge above the kept one;
 - the coordinator restarted with refit_records 4 over the same state file
   keeps the newest 4 of the 8 it loads and frees the rest; the next refit
   commits and the bound still holds;
 - refit_records 0 is refused by --check-config.

Every wait is a poll for a state (harness.wait_for), nothing sleeps for a
fixed time.  Usage: test_bounds.py BUILD_DIR.  Ends with "bounds: N passed,
N failed".
"""
import json
import os
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-bounds-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, free_port, wait_for, write  # noqa: E402

harness.init(BUILD, TMP)
KEEP = 8
REFITS = 30
MPORT = free_port()
STATE = f"{TMP}/coord.state"
CL = None
ST = {"version": 0, "ids": []}


def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [32, 16], "mesh": ranks,
             "placements": [placement]} for k in range(3)]


def scrape():
    """{name: value} of the coordinator's unlabelled samples."""
    return harness.scrape_plain(MPORT)


def records():
    s = scrape()
    return (s.get("refitd_refit_records"), s.get("refitd_refit_records_allocated"),
            s.get("refitd_refit_records_freed_total"))


def listed():
    return [r.id for r in CL.stub.ListRefits(pb.ListRefitsRequest(), timeout=10).refits]


def state_records():
    with open(STATE) as f:
        return [r["id"] for r in json.load(f)["refits"]]


def refit_once():
    """The next version through, byte-exact; returns the refit's id."""
    v = ST["version"] + 1
    if v > 1:
        out = ST["trainer"].cmd(f"next {v}")
        assert out.startswith("READY"), out
    g = CL.refit("b", v)
    assert g.state == pb.COMMITTED, g.failure
    out = ST["inst"].cmd(f"wait {v} 20000")
    assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out
    ST["version"] = v
    ST["ids"].append(g.id)
    return g.id


def setup():
    global CL
    CL = Cluster("b", 2, coord_extra=["--refit-records", str(KEEP), "--state-file", STATE,
                                      "--metrics-listen", f"127.0.0.1:{MPORT}"])
    ST["trainer"] = Client(CL, 0, "b", "train", write(f"{TMP}/b-t.json",
                                                       tensors([0, 1], "Shard(0)")))
    assert ST["trainer"].ok(), ST["trainer"].first
    ST["inst"] = Client(CL, 1, "b", "infer", write(f"{TMP}/b-i.json",
                                                    tensors([4, 5], "Shard(1)")),
                        instance="i", install="double-buffer")
    assert ST["inst"].ok(), ST["inst"].first


def bound_holds():
    for _ in range(REFITS):
        rid = refit_once()
        ids = listed()
        want = ST["ids"][-KEEP:][::-1]   # ListRefits: newest first
        assert ids == want, f"after refit {rid}: ListRefits has {ids}, want {want}"
        if len(ST["ids"]) > KEEP:
            gone = ST["ids"][-KEEP - 1]
            harness.expect_error(
                lambda: CL.stub.GetRefit(pb.GetRefitRequest(refit_id=gone), timeout=10),
                grpc.StatusCode.NOT_FOUND, f"no refit {gone}")
        kept = state_records()
        assert len(kept) <= KEEP, f"after refit {rid}: the state file holds {kept}"


def wait_records(ok, what):
    """Poll /metrics (refreshed once a second) until ok(kept, allocated, freed)."""
    seen = []

    def probe():
        seen[:] = [records()]
        return ok(*seen[0])
    try:
        wait_for(probe, timeout=30, what=what)
    except AssertionError:
        raise AssertionError(f"{what}: last (kept, allocated, freed) = {seen}") from None


def memory_released():
    want = (KEEP, KEEP, REFITS - KEEP)
    wait_records(lambda *r: r == want, f"records kept, allocated, freed = {want}")


def restart_smaller():
    CL.coord.terminate()
    CL.coord.wait(timeout=30)
    i = CL.coord_args.index("--refit-records")
    CL.coord_args[i + 1] = "4"
    CL.restart_coord()
    newest = ST["ids"][-4:][::-1]
    wait_for(lambda: listed() == newest, timeout=30,
             what=f"ListRefits = the newest 4 {newest} after the restart")
    want = (4, 4, KEEP - 4)  # the new process counts its own: it loaded 8, freed 4
    wait_records(lambda *r: r == want, f"records kept, allocated, freed = {want} after "
                 "the restart")
    CL.wait_members(2)
    # the instance registers again with the new coordinator; one more refit
    wait_for(lambda: any(m.name == "b" for m in CL.stub.ListModels(
        pb.ListModelsRequest(), timeout=5).models), timeout=30, what="model b registered")
    wait_for(lambda: try_refit(), timeout=60, what="a refit after the restart")
    assert len(listed()) <= 4 and len(state_records()) <= 4, (listed(), state_records())
    # every refit since (one, and any retried or catch-up one) freed one more
    wait_records(lambda k, a, f: k == 4 and a == 4 and f >= KEEP - 4 + 1,
                 "4 records kept and allocated, 5 or more freed after one more refit")


def try_refit():
    try:
        refit_once()
        return True
    except (AssertionError, grpc.RpcError) as e:
        print(f"     (retrying: {str(e)[:120]})")
        return False


def zero_refused():
    cfg = f"{TMP}/zero.json"
    with open(cfg, "w") as f:
        json.dump({"role": "coordinator", "refit_records": 0}, f)
    out = subprocess.run([f"{BUILD}/bin/refitd", "--check-config", cfg],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "refit_records" in out.stderr, (out.returncode, out.stderr)
    with open(cfg, "w") as f:
        json.dump({"role": "coordinator", "refit_records": 1000}, f)
    out = subprocess.run([f"{BUILD}/bin/refitd", "--check-config", cfg],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "refit_records" in out.stdout, (out.returncode, out.stdout)


def main():
    try:
        check("cluster with refit_records 8 (trainer, instance)", setup)
        if CL is not None:
            check(f"{REFITS} refits: ListRefits, GetRefit and the state file keep the newest "
                  f"{KEEP}", bound_holds)
            check("old records are freed: kept = allocated = 8, freed = 22 (/metrics)",
                  memory_released)
            check("restart with refit_records 4: the newest 4 of the file kept, the rest "
                  "freed; the next refit commits", restart_smaller)
        check("--check-config: refit_records 0 refused, 1000 taken", zero_refused)
    finally:
        for c in ("trainer", "inst"):
            if c in ST:
                ST[c].close()
        harness.stop_all()
    harness.check_exits()
    harness.summary("bounds")


main()
