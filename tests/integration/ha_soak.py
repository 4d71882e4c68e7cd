"""ha_soak.py - test_ha.py's soak (docs/ha.md, "Tested"): REFIT_HA_ROUNDS
refits in a row over three coordinators that hold each Publish
REFIT_HA_HOLD_PUBLISH_MS once its decision is durable (test_hold_publish_ms),
the leader SIGKILLed or SIGSTOPped between Commit and Publish, RUNNING, at a
random time or idle (one refit in five left alone); after every round each
version is installed once on every instance (the nodes' logs), byte-exact,
never going back.  Run by test_ha.py, whose cluster and helpers it uses
(soak(test_ha's module)).
"""
import json
import os
import random
import re
import shutil
import signal
import time

import grpc
from refit.v1 import refit_pb2 as pb
import harness
from harness import wait_for

t = None  # test_ha's module, set by soak()
ROUNDS = int(os.environ.get("REFIT_HA_ROUNDS", "30"))
# the soak's coordinators hold each Publish this long once the decision is
# durable (test_hold_publish_ms): the window a kill is aimed at
SOAK_HOLD_MS = int(os.environ.get("REFIT_HA_HOLD_PUBLISH_MS", "400"))
WINDOW = "between Commit and Publish"
# a round's kill point, in turn (the ASan run's few rounds take the first)
POINTS = (WINDOW, "in-refit", "random", "idle", "none")


class Tail:
    """The lines a log file gained since the last look."""

    def __init__(self, path):
        self.path, self.pos, self.lines = path, os.path.getsize(path), []

    def new(self):
        with open(self.path, "rb") as fh:
            fh.seek(self.pos)
            data = fh.read()
        cut = data.rfind(b"\n") + 1
        self.pos += cut
        got = data[:cut].decode(errors="replace").splitlines()
        self.lines += got
        return got

    def has(self, text):
        self.new()
        return any(text in ln for ln in self.lines)


def installs(nodes_log):
    """{(node, version): times installed} of model m since the soak began
    (each node's log line per Publish it installed)."""
    nodes_log.new()
    seen = {}
    for ln in nodes_log.lines:
        m = re.search(r'node (ha\d): refit \d+: model "m" version (\d+) installed$', ln)
        if m:
            key = (m.group(1), int(m.group(2)))
            seen[key] = seen.get(key, 0) + 1
    return seen


def once(nodes_log, v):
    """Version v installed on both instances' nodes (ha1: db, ha2: ip), and
    no version installed twice on any node since the soak began; both
    instances show v now (never an older one)."""
    seen = installs(nodes_log)
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"installed more than once (node, version): times: {twice}"
    for node in ("ha1", "ha2"):
        assert seen.get((node, v)) == 1, f"version {v} not installed once on {node}: {seen}"
    for c in t.M["inst"]:
        out = c.cmd("state")
        assert out.startswith(f"STATE version={v} "), f"after v{v}: {out}"


def quiet(v):
    """etcd's state says v installed, no Publish pending, every refit of m
    final: the new leader has nothing left to write for this version."""
    doc = json.loads(t.etcd_doc(t.E.addr, "/refit")[0])
    m = [x for x in doc["models"] if x["name"] == "m"][0]
    return (m["installed_version"] == v and not doc.get("publishes") and
            all(r["state"] in (pb.COMMITTED, pb.FAILED, pb.ABORTED) for r in doc["refits"]))


def hold_publish():
    """The three coordinators started again with test_hold_publish_ms
    (the standbys first, then the leader: a standby takes over at once)."""
    t.C.extra = ["--test-hold-publish-ms", str(SOAK_HOLD_MS)]
    lead = t.C.wait_leader()
    for k in [k for k in range(3) if k != lead] + [lead]:
        t.C.procs[k].terminate()
        t.C.procs[k].wait(timeout=20)
        t.C.start(k)
    t.wait_members(t.C.wait_leader(), 3)


def soak_round(i, rng, clog, nlog, tally):
    """One refit; its leader SIGKILLed or SIGSTOPped at the round's point:
    the window between the durable decision and the Publish (held
    there), RUNNING, a random time after the trigger, after it committed
    (idle) -- or not at all.  Then the version is installed once on both
    instances, byte-exact, whether committed before, redone by the new
    leader (retries) or its decision resent by it; a stopped old leader,
    woken once the new one is done, stops with 75 and changes nothing."""
    point, kind = POINTS[i % len(POINTS)], ("SIGKILL", "SIGSTOP")[i % 2]
    old = t.C.wait_leader()
    t.wait_members(old, 3)
    t.step()
    v, st = t.M["v"], t.C.stub(old)
    rid = st.TriggerRefit(pb.TriggerRefitRequest(model="m", version=v), timeout=10).refit_id
    held = f"refit {rid} (m v{v}): the decision to publish is durable"
    if point == "none":
        g = harness.refit_final(st, rid, 60)
        assert g.state == pb.COMMITTED, g.failure
        t.installed()
        return once(nlog, v)
    if point == WINDOW:
        wait_for(lambda: clog.has(held), 60, f"refit {rid}'s Publish held", every=0.005)
    elif point == "in-refit":
        wait_for(lambda: st.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5).state ==
                 pb.RUNNING, 30, f"refit {rid} running", every=0.005)
    elif point == "random":
        time.sleep(rng.uniform(0, 0.7 + SOAK_HOLD_MS / 1000))  # the kill point itself
    else:
        assert harness.refit_final(st, rid, 60).state == pb.COMMITTED
        t.installed()
    t.C.procs[old].send_signal(getattr(signal, kind))
    tally[kind] += 1
    tally[point] += 1
    try:
        t.C.wait_leader(skip=(old,))
    except AssertionError as e:
        raise AssertionError(f"{e} ({kind} of coordinator {t.C.addrs[old]}, {point}); etcd "
                             f"now: {t.election_keys()}") from None
    if kind == "SIGKILL":
        t.C.procs[old].wait()
    left = clog.has(f"refit {rid}: the held Publish leaves")  # the old one is still now
    if point == WINDOW:
        assert not left, f"the {kind} came after refit {rid}'s held Publish left: " \
            f"REFIT_HA_HOLD_PUBLISH_MS ({SOAK_HOLD_MS}) too short for this machine"
    t.installed()
    g = from_leader(rid)
    if g.state == pb.COMMITTED:
        tally["committed before the kill"] += 1
    elif g.state == pb.FAILED and "after it decided to publish" in g.failure:
        tally["decided before the kill, Publish resent by the next leader"] += 1
    else:
        assert g.state == pb.FAILED and "restarted" in g.failure, (g.state, g.failure)
        tally["cut short, redone"] += 1
    assert point != WINDOW or "after it decided" in g.failure, (point, g.state, g.failure)
    if kind == "SIGSTOP":
        ctl = shutil.which("etcdctl")
        if ctl:
            wait_for(lambda: quiet(v), 30, f"the new leader done with v{v}")
        before, seen = ctl and t.state_doc(), installs(nlog)
        t.C.procs[old].send_signal(signal.SIGCONT)
        rc = t.C.procs[old].wait(timeout=20)
        assert rc == 75, f"the stopped old leader exited {rc}, not 75"
        assert not ctl or t.state_doc() == before, \
            "etcd's state changed after the old leader woke up"
        assert installs(nlog) == seen, "an install after the old leader woke up"
    t.C.start(old)
    supervise(tally)
    once(nlog, v)


STALLS = "a lease lost to a stall, restarted"


def from_leader(rid):
    """Refit rid's record from the coordinator leading now (the one that
    took over may itself lose its lease to a stall on a loaded machine and
    exit 75: then ask the next)."""
    def ask():
        try:
            return t.C.stub(t.C.wait_leader()).GetRefit(pb.GetRefitRequest(refit_id=rid),
                                                         timeout=5)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None
    return wait_for(ask, 60, f"refit {rid}'s record from the leader")


def supervise(tally):
    """What systemd does for a coordinator that exits 75 (a lease lost to a
    stall, not a kill of the soak's): start it again, and count it."""
    for k, p in enumerate(t.C.procs):
        if p.poll() is not None:
            assert p.returncode == 75, f"coordinator {t.C.addrs[k]} exited {p.returncode}"
            tally[STALLS] = tally.get(STALLS, 0) + 1
            t.C.start(k)


def soak(test):
    """REFIT_HA_ROUNDS refits in a row (soak_round), the coordinators
    holding each Publish SOAK_HOLD_MS; the kill points in turn (POINTS),
    SIGKILL and SIGSTOP alternating, the random delays seeded
    (REFIT_HA_SEED)."""
    global t
    t = test
    rng = random.Random(os.environ.get("REFIT_HA_SEED", "27"))
    hold_publish()
    clog, nlog = Tail(f"{t.TMP}/coords.log"), Tail(f"{t.TMP}/nodes.log")
    tally = dict.fromkeys(["SIGKILL", "SIGSTOP", WINDOW, "in-refit", "random", "idle",
                           "committed before the kill", "cut short, redone",
                           "decided before the kill, Publish resent by the next leader"], 0)
    for i in range(ROUNDS):
        soak_round(i, rng, clog, nlog, tally)
    assert ROUNDS < 1 or tally[WINDOW] >= 1
    kills = tally["SIGKILL"] + tally["SIGSTOP"]
    t.FIG[f"soak, {ROUNDS} refits in a row, the leader killed in {kills} of them"] = (
        f"SIGKILL {tally['SIGKILL']}, SIGSTOP {tally['SIGSTOP']}; killed {WINDOW} "
        f"{tally[WINDOW]}, in-refit (RUNNING) {tally['in-refit']}, at a random time "
        f"{tally['random']}, idle {tally['idle']}; "
        + ", ".join(f"{k} {tally[k]}" for k in ("committed before the kill",
                                               "cut short, redone",
                                               "decided before the kill, Publish resent "
                                               "by the next leader"))
        + (f"; leases lost to stalls, restarted {tally[STALLS]}" if tally.get(STALLS) else ""))
