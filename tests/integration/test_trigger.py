#!/usr/bin/python3
"""Refits without a human (issue 23): a model's trigger policy
(docs/control-plane.md, "Trigger policy").

A coordinator with default_trigger on_ready, a state file and /metrics, two
node daemons (the trainer's node holds every RunSlice 1.5 s,
--test-hold-run-ms, so a refit is in flight that long without reading the
trainer's memory), a double-buffered instance registered before the trainer:

 - on_ready: the trainer's WeightsReady v1 alone starts a refit; it commits
   and the instance holds v1's bytes;
 - coalescing: WeightsReady v2 starts a refit; v3..v6 arrive while it is
   held in flight: only v6 goes next (v3, v4, v5 skipped and counted; the
   refit of v2 fails, the trainer holding v6 by then), the model's
   installed version ends at 6, the instance holds v6's bytes, and
   /metrics counts the policy's refits and the skipped versions;
 - min_interval_ms 4000 (refitctl policy): the refits of v7 and v8 start
   at least 4000 ms after the previous one the policy started, by the
   coordinator's own created_unix_ms;
 - manual (refitctl policy --trigger manual): WeightsReady v9 starts
   nothing (no refit of it appears for 1.5 s); refitctl trigger's does;
 - the coordinator restarted over its state file keeps the policy and the
   counts, and WeightsReady v10 starts a refit with no trigger;
 - retries 3 with a 60 s back-off: v12 ready while v11's refit is held
   fails that refit (the trainer moved on); the refit of v11, waiting to
   retry, is aborted as superseded by v12 (not attempted again) and v12
   commits;
 - bad input refused: refitctl --trigger sometimes, --min-interval-ms -1 and
   99999999999; SetRefitPolicy with trigger 7 or min_interval_ms 86400001;
   --check-config with default_trigger auto.

Every wait is a poll for a state (harness.wait_for).  Usage: test_trigger.py
BUILD_DIR.  Ends with "trigger: N passed, N failed".
"""
import json
import os
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-trigger-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, free_port, wait_for, write  # noqa: E402

harness.init(BUILD, TMP)
MPORT = free_port()
STATE = f"{TMP}/coord.state"
HOLD_MS = 1500
INTERVAL = 4000
CL = None
ST = {}


def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [32, 16], "mesh": ranks,
             "placements": [placement]} for k in range(3)]


def ctl(*args):
    return subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", CL.addr] + list(args),
                          capture_output=True, text=True, timeout=30)


def model():
    return CL.stub.GetModel(pb.GetModelRequest(model="g"), timeout=10)


def refits(version=None):
    """The model's refits of all instances (not catch-ups), oldest first."""
    rs = CL.stub.ListRefits(pb.ListRefitsRequest(), timeout=10).refits
    rs = [r for r in rs if r.model == "g" and not r.instance]
    rs.sort(key=lambda r: r.id)
    return [r for r in rs if version is None or r.version == version]


def final(r):
    return r.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED)


def wait_committed(v, timeout=60):
    def probe():
        rs = refits(v)
        return len(rs) == 1 and rs[0].state == pb.COMMITTED
    wait_for(probe, timeout=timeout, what=f"a refit of v{v} committed")
    out = ST["inst"].cmd(f"wait {v} 30000")
    assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out
    return refits(v)[0]


def next_version(v):
    out = ST["trainer"].cmd(f"next {v}")
    assert out.startswith("READY"), out


def scrape():
    """{name: value} of the coordinator's unlabelled samples."""
    return harness.scrape_plain(MPORT)


def setup():
    global CL
    CL = Cluster("g", 2, ["--slice-timeout-ms", "60000"],
                 coord_extra=["--default-trigger", "on_ready", "--state-file", STATE,
                              "--metrics-listen", f"127.0.0.1:{MPORT}"],
                 node_extra=lambda k: ["--test-hold-run-ms", str(HOLD_MS)] if k == 0 else [])
    ST["inst"] = Client(CL, 1, "g", "infer", write(f"{TMP}/g-i.json",
                                                    tensors([4, 5], "Shard(1)")),
                        instance="i", install="double-buffer")
    assert ST["inst"].ok(), ST["inst"].first
    ST["trainer"] = Client(CL, 0, "g", "train", write(f"{TMP}/g-t.json",
                                                       tensors([0, 1], "Shard(0)")))
    assert ST["trainer"].ok(), ST["trainer"].first


def on_ready():
    r = wait_committed(1)
    m = model()
    assert m.policy.trigger == pb.TRIGGER_ON_READY, m.policy
    assert m.policy_refits == 1 and m.skipped_versions == 0, m
    ST["first"] = r.id


def coalescing():
    next_version(2)
    wait_for(lambda: len(refits(2)) == 1 and not final(refits(2)[0]), timeout=30,
             what="the refit of v2 in flight")
    for v in range(3, 7):
        next_version(v)
    m = model()
    assert refits(2) and not final(refits(2)[0]), \
        f"the refit of v2 ended before v6 was ready: {refits(2)[0]}"
    assert m.pending_version == 6 and m.skipped_versions == 3, m
    wait_committed(6)
    vs = [r.version for r in refits() if r.id > ST["first"]]
    assert vs == [2, 6], f"refits after v1: versions {vs}, want [2, 6]"
    assert all(r.by_policy for r in refits()), [(r.id, r.by_policy) for r in refits()]
    out = ctl("status", str(refits(6)[0].id))
    assert out.returncode == 0 and "started by the trigger policy" in out.stdout, out
    m = model()
    assert m.installed_version == 6 and m.latest_version == 6, m
    assert m.skipped_versions == 3 and m.policy_refits == 3 and m.pending_version == 0, m
    want = {"refitd_policy_refits_total": 3, "refitd_skipped_versions_total": 3}
    wait_for(lambda: all(scrape().get(k) == v for k, v in want.items()), timeout=30,
             what=f"/metrics {want}")
    out = ctl("--json", "model", "g")
    js = json.loads(out.stdout)
    assert out.returncode == 0 and js["policy"]["trigger"] == "on_ready", out
    assert int(js["skipped_versions"]) == 3 and int(js["policy_refits"]) == 3, js
    out = ctl("models")
    assert out.returncode == 0 and "trigger on_ready" in out.stdout and \
        "3 skipped" in out.stdout, out


def interval():
    out = ctl("policy", "g", "--min-interval-ms", str(INTERVAL))
    assert out.returncode == 0 and f"min interval {INTERVAL} ms" in out.stdout, out
    m = model()
    assert m.policy.trigger == pb.TRIGGER_ON_READY and m.policy.min_interval_ms == INTERVAL, m
    prev = refits(6)[0]
    for v in (7, 8):
        next_version(v)
        r = wait_committed(v)
        gap = r.created_unix_ms - prev.created_unix_ms
        assert gap >= INTERVAL, f"refit of v{v} began {gap} ms after v{prev.version}'s"
        prev = r
    assert model().policy_refits == 5


def manual():
    out = ctl("policy", "g", "--trigger", "manual")
    assert out.returncode == 0, out
    m = model()
    assert m.policy.trigger == pb.TRIGGER_MANUAL and m.policy.min_interval_ms == INTERVAL, m
    next_version(9)
    try:
        wait_for(lambda: refits(9), timeout=1.5, what="a refit of v9")
        raise AssertionError(f"manual: WeightsReady v9 started {refits(9)}")
    except AssertionError as e:
        if "manual:" in str(e):
            raise
    out = ctl("trigger", "g")
    assert out.returncode == 0, out
    wait_committed(9)
    assert len(refits(9)) == 1 and model().policy_refits == 5
    assert not refits(9)[0].by_policy, refits(9)[0]


def restart():
    out = ctl("policy", "g", "--trigger", "on_ready", "--min-interval-ms", "250")
    assert out.returncode == 0, out
    CL.coord.terminate()
    CL.coord.wait(timeout=30)
    CL.restart_coord()
    m = model()
    assert m.policy.trigger == pb.TRIGGER_ON_READY and m.policy.min_interval_ms == 250, m
    assert m.skipped_versions == 3 and m.policy_refits == 5, m
    marks = {r.version: r.by_policy for r in refits()}
    assert marks.get(6) is True and marks.get(9) is False, f"after the restart: {marks}"
    CL.wait_members(2)

    def ready():
        try:
            next_version(10)
            return True
        except AssertionError as e:
            print(f"     (retrying: {str(e)[:120]})")
            return False
    wait_for(ready, timeout=60, what="WeightsReady v10 after the restart")
    wait_committed(10)
    assert model().policy_refits == 6


def supersede():
    """A policy refit that failed and waits to retry an older version is
    superseded by the newest waiting one: aborted, naming it, without a
    second attempt (the back-off, 60 s, is far longer than the test)."""
    out = ctl("policy", "g", "--retries", "3", "--backoff-ms", "60000")
    assert out.returncode == 0, out
    next_version(11)
    wait_for(lambda: len(refits(11)) == 1 and not final(refits(11)[0]), timeout=30,
             what="the refit of v11 in flight")
    next_version(12)   # the trainer moves on while v11's slice is held
    wait_committed(12)
    r11 = refits(11)[0]
    assert r11.state == pb.ABORTED and "superseded by version 12" in r11.failure, r11
    assert len(r11.attempts) <= 1, f"v11 was attempted again: {list(r11.attempts)}"
    out = ctl("policy", "g", "--retries", "0")
    assert out.returncode == 0, out


def bad_input():
    for args, text in ((["--trigger", "sometimes"], "--trigger takes manual or on_ready"),
                       (["--min-interval-ms", "-1"], "--min-interval-ms"),
                       (["--min-interval-ms", "99999999999"], "--min-interval-ms")):
        out = ctl("policy", "g", *args)
        assert out.returncode != 0 and text in out.stderr, (args, out)
    cur = model().policy
    for pol, text in ((dict(trigger=7), "unknown trigger 7"),
                      (dict(min_interval_ms=86400001), "min_interval_ms 86400001")):
        p = pb.RefitPolicy(model="g", retries=cur.retries, catch_up=cur.catch_up, **pol)
        harness.expect_error(lambda: CL.stub.SetRefitPolicy(
            pb.SetRefitPolicyRequest(policy=p), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT, text)
    m = model()
    assert m.policy.trigger == pb.TRIGGER_ON_READY and m.policy.min_interval_ms == 250, m
    cfg = f"{TMP}/bad.json"
    with open(cfg, "w") as f:
        json.dump({"role": "coordinator", "default_trigger": "auto"}, f)
    out = subprocess.run([f"{BUILD}/bin/refitd", "--check-config", cfg],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "default_trigger" in out.stderr, (out.returncode, out.stderr)


def main():
    try:
        check("cluster: default_trigger on_ready, the trainer's RunSlice held "
              f"{HOLD_MS} ms", setup)
        if CL is not None:
            check("on_ready: WeightsReady v1 alone refits v1", on_ready)
            check("coalescing: v3..v6 ready while v2's refit runs: v6 next, 3 skipped",
                  coalescing)
            check(f"min_interval_ms {INTERVAL}: refits start that far apart", interval)
            check("manual: WeightsReady starts nothing; refitctl trigger does", manual)
            check("the policy survives a coordinator restart", restart)
            check("a policy refit waiting to retry an older version is superseded",
                  supersede)
            check("bad trigger and interval refused", bad_input)
    finally:
        for c in ("trainer", "inst"):
            if c in ST:
                ST[c].close()
        harness.stop_all()
    harness.check_exits()
    harness.summary("trigger")


main()
