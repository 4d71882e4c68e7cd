#!/usr/bin/python3
"""A real engine receives refits: vLLM's CPU build serving a tiny Llama
(random weights generated here from a config.json) with tensor parallelism
2, registered through refit.vllm (vLLM's weight-transfer interface), and a
torch trainer -- FSDP2 x tensor parallel over gloo, 4 processes -- that
publishes with refit.torch.Publisher (fp32 DTensors; refit converts to the
engine's bf16 on the way).  A coordinator (trigger policy on_ready) and
five node daemons on loopback: the trainer's (its four processes a client
each), one per engine worker (ee0, ee1: the engine's two workers served by
two nodes), and two for a plain client of the same layout (ec0, ec1).

After each refit the engine's parameters, read through the engine
(LLM.apply_model), equal the trainer's full tensors cast to bf16 as vLLM
lays them out, byte for byte, and the engine's greedy tokens have the
logprobs transformers gives on the trainer's weights (within LOGPROB_TOL).
The engine is an AsyncLLM (as `vllm serve` runs it) driven by
refit.vllm.AsyncEngine.  A request in flight while a refit runs completes
on the old weights, also when the update comes while it runs (pause mode
"wait"); under "keep" it is frozen and resumed after the switch, under
"abort" it ends with vLLM's "abort"; a
refit that would overwrite the copy the engine serves is refused and
retried; an update that cannot come leaves the engine as it was.  A
Publish lost on one worker's node (ee1 loses the fifth refit's Publish,
test_lose_publish, until it joins again) delays version 5 on the whole
engine -- both workers keep version 4, byte for byte, and the engine
reports 4 -- and once ee1 is reachable again (its lease lapsed under
SIGSTOP; it joins again and the Publish is resent) both switch to 5.

Usage: test_engine.py BUILD_DIR [NPROC].  The environment is
BUILD/venv-vllmcpu (make deps, python/frameworks.txt).  Prints
"engine: N passed, N failed" and the costs measured.
"""
import json
import os
import signal
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
NPROC = int(sys.argv[2]) if len(sys.argv) > 2 else 4
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-engine-")
from refit.v1 import refit_pb2 as pb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, check  # noqa: E402

harness.init(BUILD, TMP)
LIB = harness.use_tree_package()
PY = os.path.abspath(f"{BUILD}/venv-vllmcpu/bin/python")
FW = os.path.abspath("tests/frameworks")
# bf16 logits of two CPU implementations (vLLM's oneDNN GEMMs, torch's):
# the logprobs of the same tokens differ by a few 1e-3 here; the weights of
# the previous version give differences of 1e-1 and more
LOGPROB_TOL = 0.05
LR = 5e-3  # Adam: every weight moves by about LR a step
MODEL = "tiny"
NODES = 5
LOST = 5  # ee1 loses the Publish of the fifth refit it commits
ENV = dict(os.environ, PYTHONPATH=os.path.abspath("python") + ":" + FW, REFIT_LIBRARY=LIB,
           OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
ST = {}
COSTS = {}


class Proc:
    """A venv process speaking JSON lines."""

    def __init__(self, args, log):
        # a session of its own: its process group (vLLM's engine core and
        # workers, the trainer's ranks) is ended with it (end())
        self.p = harness.spawn([PY] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=open(log, "w"), text=True, bufsize=1, env=ENV,
                               start_new_session=True)
        self.log = log

    def end(self):
        """quit, then SIGKILL whatever of its process group is left."""
        try:
            self.p.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.p.stdin.flush()
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it may have ended already
            pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def read(self, what):
        line = self.p.stdout.readline()
        if not line:
            tail = open(self.log).read()[-3000:]
            raise AssertionError(f"{what}: the process ended:\n{tail}")
        return json.loads(line)

    def cmd(self, **rq):
        self.p.stdin.write(json.dumps(rq) + "\n")
        self.p.stdin.flush()
        r = self.read(rq["cmd"])
        assert "error" not in r, f"{rq['cmd']}: {r['error']}"
        return r


def make_model(d):
    harness.make_tiny_llama(d, PY, ENV)


def model():
    return ST["cl"].stub.GetModel(pb.GetModelRequest(model=MODEL), timeout=10)


def refits():
    return ST["cl"].stub.ListRefits(pb.ListRefitsRequest(model=MODEL), timeout=10).refits


def committed(version):
    return [r for r in refits() if r.version == version and r.state == pb.COMMITTED]


def step(k):
    r = ST["trainer"].cmd(cmd="step", lr=LR)
    assert r["version"] == k, r
    COSTS.setdefault("publish_s", []).append(r["publish_s"])
    d = f"{TMP}/v{k}"
    ST["trainer"].cmd(cmd="save", dir=d)
    return d


def params_equal(d):
    r = ST["engine"].cmd(cmd="params", hf=f"{d}/model.safetensors")
    assert r["n"] > 0 and not r["mismatch"], f"{len(r['mismatch'])} of {r['n']} " \
        f"parameters differ from {d}: {r['mismatch'][:4]}"
    return r["n"]


def logprobs_match(d, other=None):
    r = ST["engine"].cmd(cmd="logprobs", hf_dir=d)
    diff = max(abs(a - b) for e, h in zip(r["engine"], r["hf"]) for a, b in zip(e, h))
    COSTS.setdefault("logprob_diff", []).append(diff)
    assert diff < LOGPROB_TOL, f"engine and transformers logprobs differ by {diff}"
    if other:  # the same tokens on another version's weights: far apart
        o = ST["engine"].cmd(cmd="logprobs", hf_dir=other)
        assert o["tokens"] == r["tokens"]
        far = max(abs(a - b) for e, h in zip(r["engine"], o["hf"]) for a, b in zip(e, h))
        COSTS.setdefault("other_version_diff", []).append(far)
        assert far > 2 * LOGPROB_TOL, f"the versions are too close to tell apart ({far})"
    return diff


def setup():
    d = f"{TMP}/tiny"
    make_model(d)
    ST["dir"] = d
    cl = Cluster("e", 0, coord_extra=["--default-trigger", "on_ready",
                                       "--slice-timeout-ms", "60000"])
    ST["cl"] = cl
    # one node daemon for the trainer's processes (a client each, one rank
    # each), one per engine worker (ee1 loses the fifth refit's Publish
    # until it joins again), one per rank of the plain client
    harness.spawn(harness.node_spawn_args(cl, "et0", "0-3"), stderr=cl.log)
    harness.spawn(harness.node_spawn_args(cl, "ee0", "4"), stderr=cl.log)
    ST["ee1"] = harness.spawn(harness.node_spawn_args(cl, "ee1", "5") + [
        "--test-lose-publish", str(LOST)], stderr=cl.log)
    # the same layout in refit-client memory (the cost comparison)
    harness.spawn(harness.node_spawn_args(cl, "ec0", "6"), stderr=cl.log)
    harness.spawn(harness.node_spawn_args(cl, "ec1", "7"), stderr=cl.log)
    cl.wait_members(NODES)
    ST["engine"] = Proc([f"{FW}/engine_vllm.py", d, f"{TMP}/ee0.local,{TMP}/ee1.local",
                         MODEL, "e1", "4", "fp32"], f"{TMP}/engine.log")
    ST["trainer"] = Proc([f"{FW}/trainer_torch.py", d, f"{TMP}/et0.local", MODEL,
                          str(NPROC)], f"{TMP}/trainer.log")


def registered():
    r = ST["engine"].read("engine start")
    COSTS["engine_init_s"] = r["init_s"]
    t = ST["trainer"].read("trainer start")
    assert t["mode"] == ("snapshot" if NPROC > 1 else "in-place"), t
    harness.wait_for(lambda: {(i.role, i.instance) for i in model().instances} >=
                     {(pb.INFER, "e1")}, what="the engine's instance registered")
    # a plain client instance holding vLLM's layout in refit memory, on a
    # node of its own: the engine's refit against it (costs())
    import refit
    import refit.frameworks as fw
    m = fw.framework_map("vllm", f"{ST['dir']}/config.json", "tp2")
    params = fw.allocate(m, copies=2)
    cs = []
    for r in (0, 1):   # rank r on node ec<r>, as the engine's workers
        mine = {k: v for k, v in params.items() if k[0] == r}
        c = refit.Client(f"{TMP}/ec{r}.local", timeout_ms=30000)
        lays = [dict(lay, convert={"from": "fp32"})
                for lay in fw.layouts(m, base=6)]
        c.register(MODEL, "infer", lays, fw.pieces(m, mine, base=6), instance="c1")
        cs.append(c)
    ST["c1"] = (cs, params)
    # a refit refused because the engine still serves the copy it would
    # write is retried (8 times, from 100 ms doubling) until the engine moved
    ST["cl"].stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model=MODEL, retries=8, retry_backoff_ms=100, catch_up=True,
        trigger=pb.TRIGGER_ON_READY)), timeout=10)


def first_version():
    ST["v1"] = step(1)
    harness.wait_for(lambda: committed(1), 60, "refit of version 1 committed")
    r = ST["engine"].cmd(cmd="update", version=1, timeout_ms=30000)
    assert r["version"] == 1, r
    COSTS.setdefault("switch_s", []).append(r["switch_s"])
    assert ST["engine"].cmd(cmd="weight_version")["weight_version"] == "1"
    n = params_equal(ST["v1"])
    diff = logprobs_match(ST["v1"], other=ST["dir"])
    # operators see the engine: framework, version, pause mode, served version
    harness.wait_for(lambda: {i.instance: i.served_version for i in model().instances}
                     .get("e1") == 1, what="e1's served version in GetModel")
    inst = {i.instance: i for i in model().instances}
    e = inst["e1"].engine
    assert (e.framework, e.version, e.pause_mode) == ("vllm", "0.32.0", "wait"), e
    assert not inst["c1"].HasField("engine"), inst["c1"]
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", ST["cl"].addr, "models"],
                         capture_output=True, text=True, timeout=30)
    line = [ln for ln in out.stdout.splitlines() if " e1 " in ln]
    assert line and "vllm 0.32.0 serves v1, pause wait" in line[0], out.stdout + out.stderr
    return f"{n} parameters byte-exact, logprobs within {diff:.4f}; {line[0].strip()}"


def long_running():
    """Start the long request; its progress once it streamed a token."""
    p = ST["engine"]
    p.cmd(cmd="long_start")
    harness.wait_for(lambda: p.cmd(cmd="long_progress")["tokens"] > 0, 60,
                     "the long request streaming")


def in_flight():
    """Pause mode "wait" (the default): a request in flight while a refit
    runs finishes on version 1's weights; so does one in flight when the
    update is asked for (vLLM's pause_generation "wait" lets it drain)."""
    p = ST["engine"]
    before = p.cmd(cmd="tokens")["tokens"]
    long_running()
    ST["v2"] = step(2)
    harness.wait_for(lambda: committed(2), 60, "refit of version 2 committed")
    during = p.cmd(cmd="long_wait")
    assert (len(during["tokens"]), during["finish_reason"]) == (400, "length"), during
    assert during["tokens"] == before, \
        "the request in flight during the refit did not finish on version 1's weights"
    params_equal(ST["v1"])  # still serving version 1
    long_running()
    at = p.cmd(cmd="long_progress")["tokens"]
    r = p.cmd(cmd="update", version=2, timeout_ms=30000)
    assert r["version"] == 2, r
    assert at < 400, "the request finished before the update: nothing was in flight"
    COSTS["wait_update_called_at_token"] = at
    COSTS["switch_s"].append(r["switch_s"])
    drained = p.cmd(cmd="long_wait")
    assert (len(drained["tokens"]), drained["finish_reason"]) == (400, "length"), drained
    assert drained["tokens"] == before, \
        "the request in flight at the update did not finish on version 1's weights"
    params_equal(ST["v2"])
    logprobs_match(ST["v2"], other=ST["v1"])
    rs = [x for x in refits() if x.version == 2]
    return f"400 tokens while refit {rs[0].id} ran; 400 more while the update waited " \
        f"({at} at its call); then version 2 byte-exact"


def pause_keep_abort():
    """vLLM's other pause modes, one request in flight under each: "keep"
    freezes it and resumes it after the switch (it completes, 400 tokens;
    what it streamed before the update is version 5's, its later tokens
    version 6's: not version 5's alone), "abort" ends it
    with vLLM's own finish_reason "abort"; the engine serves the new
    version after each."""
    p = ST["engine"]
    before = p.cmd(cmd="tokens")["tokens"]   # version 5
    p.cmd(cmd="pause_mode", mode="keep")
    ST["v6"] = step(6)
    harness.wait_for(lambda: committed(6), 60, "refit of version 6 committed")
    long_running()
    at = p.cmd(cmd="long_progress")["tokens"]
    r = p.cmd(cmd="update", version=6, timeout_ms=30000)
    assert r["version"] == 6, r
    kept = p.cmd(cmd="long_wait")
    assert (len(kept["tokens"]), kept["finish_reason"]) == (400, "length"), kept
    assert at < 400 and kept["tokens"][:at] == before[:at], (at, kept["tokens"][:at])
    # the switch came mid-request: its later tokens are version 6's
    assert kept["tokens"] != before, "the kept request never saw version 6"
    params_equal(ST["v6"])
    COSTS["keep_streamed_before_update"] = at
    p.cmd(cmd="pause_mode", mode="abort")
    ST["v7"] = step(7)
    harness.wait_for(lambda: committed(7), 60, "refit of version 7 committed")
    long_running()
    r = p.cmd(cmd="update", version=7, timeout_ms=30000)
    assert r["version"] == 7, r
    ab = p.cmd(cmd="long_wait")
    assert ab["finish_reason"] == "abort" and len(ab["tokens"]) < 400, \
        (len(ab["tokens"]), ab["finish_reason"])
    COSTS["abort_tokens"] = len(ab["tokens"])
    assert p.cmd(cmd="weight_version")["weight_version"] == "7"
    params_equal(ST["v7"])
    p.cmd(cmd="pause_mode", mode="wait")
    return f"keep: 400 tokens, {at} streamed on version 5 before the update, the " \
        f"rest after it; abort: ended \"abort\" after {len(ab['tokens'])} tokens"


def served_copy_protected():
    ST["v3"] = step(3)
    harness.wait_for(lambda: committed(3), 60, "refit of version 3 committed")
    ST["v4"] = step(4)
    # version 4 would overwrite the copy that holds version 2, which the
    # engine still serves: refused on the engine's node, retried
    harness.wait_for(lambda: any(r.version == 4 and "still serves copy" in
                                 " ".join([r.failure] + list(r.attempts)) for r in refits()),
                     60, "version 4 refused")
    params_equal(ST["v2"])
    r = ST["engine"].cmd(cmd="update")  # pull: the newest installed
    assert r["version"] == 3, r
    params_equal(ST["v3"])
    harness.wait_for(lambda: committed(4), 60, "version 4 committed after the switch")
    r = ST["engine"].cmd(cmd="update", version=4, timeout_ms=30000)
    assert r["version"] == 4, r
    COSTS["switch_s"].append(r["switch_s"])
    params_equal(ST["v4"])
    logprobs_match(ST["v4"])
    return "refused while served, committed once the engine moved on"


def update_that_never_comes():
    p = ST["engine"]
    p.p.stdin.write(json.dumps({"cmd": "update", "version": 99, "timeout_ms": 1500}) + "\n")
    p.p.stdin.flush()
    r = p.read("update 99")
    assert "error" in r and "Timeout" in r["error"] or "timeout" in r["error"].lower(), r
    assert p.cmd(cmd="weight_version")["weight_version"] == "4"
    params_equal(ST["v4"])
    r = p.cmd(cmd="update", version=4, timeout_ms=5000)
    assert r["version"] == 4, r
    return r.get("error", "") or "timed out; version 4 still served on both workers"


def publish_lost_on_one_node():
    """Item 1: ee1 loses the Publish of version 5 (test_lose_publish) until
    it joins again: ee0 installed 5, ee1 still holds 4; the engine keeps
    serving 4 on both workers, byte for byte, whatever it is asked; once
    ee1 is reachable again (SIGSTOP until its lease lapsed: it joins again,
    the Publish is resent) the engine switches both workers to 5."""
    ST["v5"] = step(5)
    harness.wait_for(lambda: any(r.version == 5 and r.state == pb.FAILED and "ee1" in
                                 r.failure and "Publish" in r.failure for r in refits()),
                     60, "version 5's Publish lost on ee1")
    p = ST["engine"]
    harness.wait_for(lambda: p.cmd(cmd="installed")["installed"] == [5, 4], 30,
                     "ee0 installed 5, ee1 still 4")
    r = p.cmd(cmd="update")  # pull: 5 is not on every worker's node
    assert r["version"] == 4, r
    assert p.cmd(cmd="weight_version")["weight_version"] == "4"
    params_equal(ST["v4"])
    p.p.stdin.write(json.dumps({"cmd": "update", "version": 5, "timeout_ms": 1500}) + "\n")
    p.p.stdin.flush()
    r = p.read("update 5")
    assert "error" in r and "[5, 4]" in r["error"] and "worker 1" in r["error"], r
    why = r["error"]
    assert p.cmd(cmd="weight_version")["weight_version"] == "4"
    params_equal(ST["v4"])
    # ee1 cut off until its lease lapses, then reachable again
    ST["ee1"].send_signal(signal.SIGSTOP)
    try:
        ST["cl"].wait_members(NODES - 1)
    finally:
        ST["ee1"].send_signal(signal.SIGCONT)
    r = p.cmd(cmd="update", version=5, timeout_ms=30000)
    assert r["version"] == 5, r
    assert p.cmd(cmd="installed")["installed"] == [5, 5]
    assert p.cmd(cmd="weight_version")["weight_version"] == "5"
    params_equal(ST["v5"])
    logprobs_match(ST["v5"], other=ST["v4"])
    return f"held at 4 on both workers while ee1 lacked 5 ({why}); both switched " \
        "to 5 once ee1 was back"


def costs():
    """Item 6: the engine's node and the plain client's receive the same
    layout (the same bytes by plan); the time each node's slice took in the
    same refits, and the time from publish to serving."""
    rs = [r for r in refits() if r.state == pb.COMMITTED]
    COSTS["refit_s"] = [round((r.finished_unix_ms - r.created_unix_ms) / 1000, 4)
                        for r in rs if r.finished_unix_ms]
    COSTS["bytes"] = [r.bytes for r in rs][:1]
    ratio = []
    for r in rs:
        full = ST["cl"].stub.GetRefit(pb.GetRefitRequest(refit_id=r.id), timeout=10)
        t = {n.node_id: n.slice_micros for n in full.nodes}
        for k in (0, 1):
            if t.get(f"ee{k}") and t.get(f"ec{k}"):
                ratio.append(round(t[f"ee{k}"] / t[f"ec{k}"], 3))
    assert ratio, "no refit reported both nodes' slices"
    COSTS["slice_engine_over_client"] = ratio
    # both instances took every version
    last = max(r.version for r in refits())  # 5: committed, published late
    for c in ST["c1"][0]:
        st = c.state()
        assert st.version == last and st.valid, (last, st)
    return json.dumps(COSTS)


def main():
    if not os.path.exists(PY):
        print(f"FAIL no {PY}: make deps builds it (python/frameworks.txt [vllmcpu])")
        print("engine: 0 passed, 1 failed")
        sys.exit(1)
    t0 = time.time()
    try:
        check("setup: a tiny Llama, a coordinator (on_ready), node daemons", setup)
        check("the engine (vLLM CPU, TP 2) and the trainer registered", registered)
        check("version 1 served: engine parameters equal the trainer's, logprobs match "
              "transformers", first_version)
        check("a request in flight during a refit completes on the old weights",
              in_flight)
        check("a refit never writes the copy the engine serves", served_copy_protected)
        check("an update that does not come leaves the engine as it was",
              update_that_never_comes)
        check("a Publish lost on one worker's node delays the version on the whole "
              "engine, never a mix", publish_lost_on_one_node)
        check("pause modes keep and abort: a request in flight under each", pause_keep_abort)
        check("costs", costs)
    finally:
        print(f"     costs and differences: {json.dumps(COSTS)}")
        for p in ("engine", "trainer"):
            if p in ST:
                ST[p].end()
        harness.stop_all()
    print(f"     {time.time() - t0:.0f} s")
    harness.summary("engine")


if __name__ == "__main__":
    main()
