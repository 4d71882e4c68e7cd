"""bench_cluster.py - the loopback testbed the refit benchmarks start
(bench_refit.py, bench_delta_refit.py): a coordinator and node daemons as
processes listening on unix sockets in a temporary folder, refitctl
against it, librefit clients (refit-client) on the nodes' local sockets,
and the teardown.  Nothing here measures: the benchmarks time the refits.
"""
import shutil
import subprocess
import tempfile
import time


class Testbed:
    """One cluster's processes and folder; close() ends them (clients and
    nodes first, the coordinator last) and removes the folder."""

    def __init__(self, build, prefix):
        self.build = build
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.procs = []

    def spawn(self, args, **kw):
        p = subprocess.Popen(args, **kw)
        self.procs.append(p)
        return p

    def ctl(self, *args):
        """refitctl ARGS against the coordinator; its CompletedProcess."""
        return subprocess.run([f"{self.build}/bin/refitctl", "--coordinator",
                               f"unix:{self.tmp}/coord.sock"] + list(args),
                              capture_output=True, text=True, timeout=600)

    def start(self, nodes):
        """The coordinator and one node per (name, ranks) of nodes; returns once
        every node joined (SystemExit after 10 s)."""
        self.spawn([f"{self.build}/bin/refitd", "--role", "coordinator", "--listen",
                    f"unix:{self.tmp}/coord.sock", "--log-level", "warn"])
        for name, ranks in nodes:
            self.spawn([f"{self.build}/bin/refitd", "--role", "node", "--node-id", name,
                        "--ranks", ranks, "--listen", f"unix:{self.tmp}/{name}.sock",
                        "--coordinator", f"unix:{self.tmp}/coord.sock", "--local-socket",
                        f"{self.tmp}/{name}.local", "--heartbeat-ms", "200",
                        "--log-level", "warn"])
        for _ in range(100):
            if f"{len(nodes)} members" in self.ctl("members").stdout:
                return
            time.sleep(0.1)
        raise SystemExit("bench: nodes did not join")

    def client(self, node, model, role, layouts, instance="", extra=()):
        """A refit-client on node, registered (its first line read); extra: more
        of its arguments."""
        args = [f"{self.build}/bin/refit-client", "--socket", f"{self.tmp}/{node}.local",
                "--model", model, "--role", role, "--layouts", layouts, "--timeout-ms",
                "600000"] + list(extra)
        if instance:
            args += ["--instance", instance]
        p = self.spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                       bufsize=1)
        line = p.stdout.readline()
        assert line.startswith(("READY", "REGISTERED")), line
        return p

    def close(self):
        for p in reversed(self.procs[1:]):  # clients and nodes first, the coordinator last
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs[1:]):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.procs:
            self.procs[0].terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
