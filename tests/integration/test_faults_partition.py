#!/usr/bin/python3
"""Catch-up after a partition, end to end (real daemons on loopback,
librefit clients): either node of a two-node instance cut (SIGSTOP: its
lease lapses) mid-refit, in either order, and across a coordinator
restart; the retry commits without them, and once back the instances are
caught up, never shown ahead of what they hold.

Usage: test_faults_partition.py BUILD_DIR.  The rest of the fault suite:
test_faults.py (shared pieces: faults_common.py).  Prints the measured
catch-up times, and "faults-partition: N passed, N failed" last.
"""
import json
import os
import signal
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-fp-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import Client, Cluster, check, wait_running, write  # noqa: E402
harness.init(BUILD, TMP)
import faults_common  # noqa: E402
from faults_common import FIG, LEASE_MS, stop_cluster, tensors  # noqa: E402


# ---- issue 28, item 1: catch-up after a partition, on every path ----------
#
# A trainer on two nodes (cu0, cu1), a single-node replica "r" (cu0), and
# two instances spanning cu2 and cu3, registered on cu2 first: "db" (double
# buffer) and "ip" (in place).  A node of theirs is stopped (SIGSTOP: on
# loopback its lease lapses as if its link were cut) while a refit runs; the
# retry commits on "r" and skips them.  When the node runs again it joins
# again and its clients register again ("again"): the instances must get a
# catch-up refit whichever node came back, in whichever order, and across a
# coordinator restart, and GetModel must never show an instance ahead of
# what it holds.
PL = None


class Partition:
    """The cluster and its clients for the partition scenarios."""

    def __init__(self):
        rpn = harness.RPN
        self.cl = Cluster("cu", 4, ["--test-msg-delay-ms", "25", "--slice-timeout-ms",
                                    "30000"],
                          ["--state-file", f"{TMP}/cu.state"], lease_ms=LEASE_MS,
                          node_extra=lambda k: ["--log-level", "info"])
        self.name, self.version = "cm", 1
        tl = write(f"{TMP}/cu-t.json", tensors([0, rpn], "Shard(0)"))
        self.trainers = [Client(self.cl, k, "cm", "train", tl) for k in (0, 1)]
        for t in self.trainers:
            assert t.ok(), t.first
        # clients per instance: {instance: [(node, client)]}, first node first
        self.inst = {}
        self.add("r", [(0, 2), (0, 3)], "double-buffer")
        self.add("db", [(2, 2 * rpn), (3, 3 * rpn)], "double-buffer")
        self.add("ip", [(2, 2 * rpn + 1), (3, 3 * rpn + 1)], "in-place")
        self.cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model="cm", retries=4, retry_backoff_ms=200, catch_up=True)), timeout=5)
        g = self.cl.refit("cm", 1)
        assert g.state == pb.COMMITTED, g.failure
        self.holds(1)

    def add(self, name, where, mode):
        lay = write(f"{TMP}/cu-{name}.json", tensors([rk for _, rk in where], "Shard(1)"))
        self.inst[name] = []
        for node in dict.fromkeys(n for n, _ in where):
            c = Client(self.cl, node, "cm", "infer", lay, instance=name, install=mode)
            assert c.ok(), c.first
            self.inst[name].append((node, c))

    def step(self):
        self.version += 1
        for t in self.trainers:
            out = t.cmd(f"next {self.version}")
            assert out.startswith("READY"), out

    def holds(self, v, names=None):
        """Every client of the instances installed v, byte-exact (waits)."""
        for i in names or self.inst:
            for node, c in self.inst[i]:
                out = c.cmd(f"wait {v} 30000")
                assert out.startswith(f"INSTALLED {v} ") and "valid=1" in out and \
                    "mismatches=0" in out, (i, node, out)

    def model(self):
        return self.cl.stub.GetModel(pb.GetModelRequest(model="cm"), timeout=5)

    def shown(self):
        """{instance: (installed_version, invalid)} as GetModel shows them, and
        the model's installed version."""
        m = self.model()
        return {i.instance: (i.installed_version, i.invalid) for i in m.instances
                if i.role == pb.INFER}, m.installed_version

    def never_ahead(self, held):
        """GetModel shows no instance ahead of held[instance] (the version it
        holds for sure now), none of them valid past it, and the model's
        installed version not ahead of any instance."""
        inst, model_v = self.shown()
        for name, v in held.items():
            assert name in inst, (name, inst)
            assert inst[name][0] <= v, (f"instance {name} shown at v{inst[name][0]} "
                                        f"but holds v{v}", inst)
        assert all(model_v <= (0 if bad else v) for v, bad in inst.values()), (model_v, inst)
        return inst

    def registered_again(self, node, mark):
        """Node cu<node>'s clients (model cm) registered again since mark."""
        want = sum(1 for i in self.inst.values() for n, _ in i if n == node)
        lines = [ln for ln in log_lines_from(self.cl, mark, f"node cu{node}: client ")
                 if "registered again" in ln]
        return len(lines) >= want

    def cut(self, nodes):
        """Stop nodes while a refit of the next version runs; the retry
        commits on "r" and skips db and ip.  GetModel is polled throughout:
        never ahead.  Returns the refit."""
        old = self.version
        self.step()
        rid = self.cl.stub.TriggerRefit(pb.TriggerRefitRequest(
            model="cm", version=self.version), timeout=5).refit_id
        wait_running(self.cl, rid)
        for k in nodes:
            self.cl.nodes[k].send_signal(signal.SIGSTOP)
        try:
            return self.skipped(rid, old)
        except BaseException:
            self.resume()   # the next scenarios start from a whole cluster
            raise

    def resume(self):
        for q in self.cl.nodes:
            q.send_signal(signal.SIGCONT)

    def skipped(self, rid, old):
        """The retry of refit rid commits on "r" only; GetModel never shows
        an instance past old (polled while it runs)."""
        held = {"db": old, "ip": old}

        def final():
            if self.never_ahead(held)["r"][0] == self.version:  # only once it holds it
                st = self.inst["r"][0][1].cmd("state")
                assert f"version={self.version} " in st and "valid=1" in st, st
            g = self.cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
            return g if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED) else None
        g = harness.wait_for(final, timeout=60, what=f"refit {rid} to end", every=0.02)
        assert g.state == pb.COMMITTED, g
        assert sorted(g.skipped) == ["db", "ip"], g
        self.holds(self.version, ["r"])
        inst, model_v = self.shown()
        assert inst["r"] == (self.version, False), inst
        assert inst["db"] == (old, False), inst      # behind, still serving old
        assert inst["ip"][0] <= old and inst["ip"][1], inst  # in place: invalid
        assert model_v < self.version, (model_v, inst)
        self.ctl_shows(old)
        return g

    def ctl_shows(self, old):
        """refitctl model (text and --json) and models show the same."""
        ctl = [f"{BUILD}/bin/refitctl", "--coordinator", self.cl.addr]
        out = subprocess.run(ctl + ["--json", "model", "cm"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out
        js = {i["instance"]: i for i in json.loads(out.stdout)["instances"]}
        assert int(js["db"]["installed_version"]) == old and not js["db"]["invalid"], js
        assert js["ip"]["invalid"] and js["ip"]["install"] == "in-place", js
        assert int(js["r"]["installed_version"]) == self.version, js
        for cmd in (["model", "cm"], ["models"]):
            out = subprocess.run(ctl + cmd, capture_output=True, text=True, timeout=30)
            lines = {ln.split()[1]: ln for ln in out.stdout.splitlines()
                     if ln.startswith("  infer")}
            assert out.returncode == 0 and f"installed v{old} (behind)" in lines["db"] and \
                "INVALID" in lines["ip"] and f"installed v{self.version}" in lines["r"], \
                out.stdout

    def heal(self, order, between=None):
        """SIGCONT the nodes in order, each once the previous one's clients
        registered again (between() runs after the first).  Polls until every
        instance holds the newest version (never shown ahead meanwhile);
        returns the seconds from the first SIGCONT to that."""
        try:
            return self.heal_in(order, between)
        finally:
            self.resume()

    def heal_in(self, order, between):
        old = self.version - 1
        t0 = None
        for k, node in enumerate(order):
            mark = os.path.getsize(self.cl.log.name)
            self.cl.nodes[node].send_signal(signal.SIGCONT)
            t0 = t0 or time.time()
            harness.wait_for(lambda: self.consistent(old)[0] and
                             self.registered_again(node, mark), timeout=60,
                             what=f"cu{node}'s clients to register again")
            if k == 0 and between:
                between()
        self.caught_up(old)
        took = time.time() - t0
        self.holds(self.version)
        return took

    def consistent(self, old):
        """GetModel (read first) shows each instance at old or at the newest
        version, and at the newest only when each of its clients holds it
        (valid).  Returns (True, done: every instance shown at the newest)."""
        v = self.version
        inst, model_v = self.shown()
        for name, (iv, bad) in inst.items():
            assert iv in (old, v), (name, iv, inst)
            if iv == v and not bad:
                for node, c in self.inst[name]:
                    st = c.cmd("state")
                    assert f"version={v} " in st and "valid=1" in st, (name, node, st)
        assert all(model_v <= (0 if bad else iv) for iv, bad in inst.values()), (model_v, inst)
        return True, all(iv == v and not bad for iv, bad in inst.values())

    def caught_up(self, old):
        """Poll until GetModel shows every instance at the newest version,
        never ahead of what the clients hold meanwhile."""
        harness.wait_for(lambda: self.consistent(old)[1], timeout=60,
                         what=f"every instance at v{self.version}", every=0.02)


def log_lines_from(cl, mark, text):
    cl.log.flush()
    with open(f"{TMP}/{cl.name}.log") as f:
        f.seek(mark)
        return [ln for ln in f.read().splitlines() if text in ln]


def partition_setup():
    global PL
    PL = Partition()


def partition_other_node():
    """The node that registered the instances second is cut, then healed."""
    PL.cut([3])
    FIG["catch-up after a partition: non-first node back -> all at newest"] = PL.heal([3])


def partition_first_node():
    PL.cut([2])
    FIG["catch-up after a partition: first node back -> all at newest"] = PL.heal([2])


def partition_both(order):
    def half():
        # one node back, the other still away: the instances stay behind
        inst, _ = PL.shown()
        assert inst["db"][0] == PL.version - 1 and inst["ip"][1], inst
    PL.cut([2, 3])
    return PL.heal(order, between=half)


def partition_both_first_back():
    FIG["catch-up after a partition: both cut, first node back first -> all at newest"] = \
        partition_both([2, 3])


def partition_both_other_back():
    FIG["catch-up after a partition: both cut, other node back first -> all at newest"] = \
        partition_both([3, 2])


def partition_coordinator_restart():
    """The instances are behind (cu3 stopped) when the coordinator restarts
    from its state file: it still shows them behind, and catches them up
    once cu3 is back (every node registers again with the new coordinator)."""
    PL.cut([3])
    old = PL.version - 1
    cl = PL.cl
    cl.coord.kill()
    cl.coord.wait()
    cl.restart_coord()
    inst, model_v = harness.wait_for(lambda: (lambda s: s if len(s[0]) == 3 else None)(
        PL.shown()), what="the model after the restart")
    assert inst["r"] == (PL.version, False) and inst["db"] == (old, False) and \
        inst["ip"][1], inst
    assert model_v < PL.version, (model_v, inst)
    FIG["catch-up after a partition: coordinator restarted, node back -> all at newest"] = \
        PL.heal([3])


def partition_stop():
    stop_cluster(PL.cl, PL.trainers + [c for i in PL.inst.values() for _, c in i])


try:
    check("partition: cluster of 4 nodes, instances spanning cu2 and cu3", partition_setup)
    if PL is not None:
        check("partition: the instances' other node cut mid-refit, retried without them, "
              "back: caught up", partition_other_node)
        check("partition: the instances' first node cut, back: caught up",
              partition_first_node)
        check("partition: both nodes cut, the first back first: caught up once both are",
              partition_both_first_back)
        check("partition: both nodes cut, the other back first: caught up once both are",
              partition_both_other_back)
        check("partition: coordinator restarted while the instances are behind: "
              "still shown behind, caught up once the node is back",
              partition_coordinator_restart)
        check("partition: cluster stopped", partition_stop)
finally:
    faults_common.end()
faults_common.report("faults-partition")
