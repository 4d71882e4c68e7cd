"""faults_common.py - what the fault suites share (test_faults.py,
test_faults_calls.py, test_faults_partition.py): the lease they run with,
the figures they print, a small model (a trainer and two instances over
three nodes) and its steps, ending a cluster of a check's own, and a
suite's end (processes left running or exited badly, the figures, the
summary line).  Imported after protostubs.generate and harness.init: its
files go to harness.TMP.
"""
from refit.v1 import refit_pb2 as pb

import harness
from harness import Client, wait_running, write

LEASE_MS = 1000
# the measured detection and recovery times, printed before the summary
# (scripts/figures_slow.py reads them)
FIG = {}



def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": ranks,
             "placements": [placement]} for k in range(8)]


# the clients' versions change harness.SPARSE elements per million: a refit
# after a committed one of the same plan goes as delta (docs/delta.md)
SPARSE = ["--sparse", str(harness.SPARSE)]


class Model:
    """Trainer on node 0 (ranks 0, 1), instance db (double buffer) on node 1,
    instance ip (in place) on node 2."""

    def __init__(self, cl, name):
        self.cl, self.name = cl, name
        self.tl = write(f"{harness.TMP}/{name}-t.json", tensors([0, 1], "Shard(0)"))
        self.lay = {"db": (1, write(f"{harness.TMP}/{name}-db.json", tensors([4, 5], "Shard(1)")),
                           "double-buffer"),
                    "ip": (2, write(f"{harness.TMP}/{name}-ip.json", tensors([8, 9], "Shard(1)")),
                           "in-place")}
        self.version = 1
        self.trainer = Client(cl, 0, name, "train", self.tl, extra=SPARSE)
        assert self.trainer.ok(), self.trainer.first
        self.inst = {}
        for i in self.lay:
            self.start(i)

    def start(self, inst):
        node, lay, mode = self.lay[inst]
        c = Client(self.cl, node, self.name, "infer", lay, instance=inst, install=mode,
                   extra=SPARSE)
        assert c.ok(), c.first
        self.inst[inst] = c
        return c

    def policy(self, **kw):
        self.cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model=self.name, **kw)), timeout=5)

    def step(self):
        self.version += 1
        out = self.trainer.cmd(f"next {self.version}")
        assert out.startswith("READY"), out

    def installed(self, v=None, insts=None):
        for i in insts or self.inst:
            out = self.inst[i].cmd(f"wait {v or self.version} 20000")
            assert "mismatches=0" in out and out.startswith("INSTALLED"), (i, out)

    def running(self):
        """Step to the next version and trigger its refit; returns its id once running."""
        self.step()
        rid = self.trigger()
        wait_running(self.cl, rid)
        return rid

    def commits(self):
        """Refit this version: it commits, every instance installs it byte-exact.
        After a refit that did not commit (failed, aborted: its nodes may have
        rewritten their delta bases) it is dense; a catch-up is never a base.
        Returns its record."""
        g = self.cl.refit(self.name, self.version)
        assert g.state == pb.COMMITTED, g.failure
        self.installed()
        prev = [r for r in self.cl.stub.ListRefits(pb.ListRefitsRequest(
            model=self.name, limit=2), timeout=5).refits if r.id != g.id]
        if prev and prev[0].state != pb.COMMITTED:
            assert g.delta_base_refit == 0 and g.delta_wire_bytes == 0, (prev[0], g)
        if prev and prev[0].instance:
            assert g.delta_base_refit != prev[0].id, (prev[0], g)
        return g

    def state(self, inst):
        return self.inst[inst].cmd("state")

    def trigger(self):
        return self.cl.stub.TriggerRefit(pb.TriggerRefitRequest(
            model=self.name, version=self.version), timeout=5).refit_id


def stop_cluster(cl, clients):
    """End a cluster of its own (SIGTERM), so later checks have the CPU."""
    for c in clients:
        c.close()
    for q in cl.nodes + [cl.coord]:
        if q.poll() is None:
            q.terminate()
            q.wait(timeout=30)


def end():
    """After a suite's checks (in its finally): every process stopped; one
    failure for any left running, any that exited badly (check_exits), the
    emulator's leaks."""
    harness.stop_all()
    leaked = [p.args[:3] for p in harness.PROCS if p.poll() is None]
    if leaked:
        harness.counts["failed"] += 1
        print(f"FAIL processes left running: {leaked}")
    harness.check_exits()
    harness.report_emu_leaks()


def report(suite):
    """The figures measured, then the summary line "SUITE: N passed, N failed"."""
    for k, v in FIG.items():
        print(f"     {k}: {v if isinstance(v, str) else f'{v:.2f} s'}")
    harness.summary(suite)
