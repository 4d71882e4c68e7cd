#!/usr/bin/python3
"""Failure attribution and connect deadlines (docs/faults.md, "Failure
attribution and connect deadlines"): a coordinator and three node daemons on
loopback, a trainer on node 0 sending to an instance on node 1 and one on
node 2.

 - one node's advertised data endpoint is unreachable (a listening socket
   whose accept queue is full: the kernel drops the SYNs, so a connect
   times out, as a firewalled port or a cut path does): the refit fails
   within about the connect deadline (connect_timeout_ms, default 5 s; the
   old dialer waited for slice_timeout_ms, 600 s by default), and its
   failure names both ends of the link ("data link a0 -> a2: a0 cannot
   connect to a2's data port ...", or a1's dial when the plan relays), as
   do `refitctl status` and the
   coordinator's refitd_refit_failures_total{cause="data_link"};
 - a node that connects and then stops sending (its daemon SIGSTOPped once
   its data connection is up, mid-refit): the failure names it as the one
   owing messages ("data link b0 -> b1: b0 stopped sending ..."), not a
   bystander, over TRIES tries (the share is printed; every try must).

Usage: test_attribution.py BUILD_DIR [TRIES] (default 4).  Prints the
measured times to fail and "attribution: N passed, N failed" last.
"""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
TRIES = int(sys.argv[2]) if len(sys.argv) > 2 else 4
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-attr-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refit.v1 import refit_pb2 as pb  # noqa: E402
import harness  # noqa: E402
from harness import RPN, Cluster, check, free_port, start_model, wait_for  # noqa: E402

harness.init(BUILD, TMP)
OLD_DEADLINE_S = 600      # what an unreachable peer cost before: slice_timeout_ms
SLICE_MS = 6000           # (ii): the slices' deadline, set on the coordinator
FIG = {}
HOLD = []                 # sockets kept open: the full accept queue


def layouts():
    """Trainer on node 0, instance i1 on node 1, i2 on node 2: 8 tensors,
    resharded; node 0 sends to both."""
    t = list(range(RPN))[:2]

    def lay(ranks, place):
        return [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": ranks,
                 "placements": [place]} for k in range(8)]
    return lay(t, "Shard(0)"), [("i1", lay([RPN, RPN + 1], "Shard(1)")),
                                ("i2", lay([2 * RPN, 2 * RPN + 1], "Shard(1)"))]


def blackhole():
    """A loopback port whose accept queue is full: SYNs to it are dropped
    and a connect times out.  Checked here before it is used."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    addr = ls.getsockname()
    HOLD.append(ls)
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(addr)
        except BlockingIOError:
            pass
        HOLD.append(s)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(addr)
        raise AssertionError(f"{addr}: a connect went through; no blackhole here")
    except (socket.timeout, TimeoutError):
        pass
    finally:
        probe.close()
    return f"{addr[0]}:{addr[1]}"


scrape = harness.scrape_metrics


def stop_cluster(cl, clients):
    harness.stop(clients)
    for p in [cl.coord] + cl.nodes:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in [cl.coord] + cl.nodes:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def abort_quietly(cl, rid):
    try:
        cl.stub.AbortRefit(pb.AbortRefitRequest(refit_id=rid, reason="test over"),
                           timeout=5)
    except Exception:  # noqa: BLE001 - already final
        pass


def unreachable_port():
    """(i) node a2 advertises a data endpoint nobody can connect to."""
    hole = blackhole()
    mport = free_port()
    cl = Cluster("a", 3, [], coord_extra=["--metrics-listen", f"127.0.0.1:{mport}",
                                          "--log-level", "info"],
                 node_extra=lambda k: ["--data-advertise", hole] if k == 2 else [])
    train, insts = layouts()
    clients = start_model(cl, "am", train, insts, random.Random(3),
                          installs={"i1": "double-buffer", "i2": "double-buffer"})
    rid = None
    try:
        t0 = time.time()
        rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="am", version=1),
                                   timeout=10).refit_id
        # a generous bound: 60 s is a tenth of the old behaviour's 600 s
        g = harness.refit_final(cl.stub, rid, 60)
        took = time.time() - t0
        FIG["(i) one peer's data port unreachable: trigger -> FAILED"] = took
        assert g.state == pb.FAILED, g
        # a0 sends to a2, and so may a1 (the plan may relay between the
        # instances): either dial names the link, both ends
        want = re.compile(r"^data link (a[01]) -> a2: \1 cannot connect to a2's data port "
                          + re.escape(hole) + r": Connection timed out")
        assert want.search(g.failure), g.failure
        out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", cl.addr, "status",
                              str(rid)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and g.failure in out.stdout, out
        s = scrape(mport)
        n = s.get(("refitd_refit_failures_total", frozenset({("cause", "data_link")})), 0)
        assert n == 1, {k: v for k, v in s.items() if k[0].startswith("refitd_refit_fail")}
        with open(f"{TMP}/a.log") as f:
            dl = [ln.strip() for ln in f if "slice deadline" in ln]
        assert dl, "the coordinator logged no slice deadline"
        print(f"     {dl[0]}")
        print(f"     failure: {g.failure}")
    except AssertionError:
        if rid is not None:
            abort_quietly(cl, rid)
        raise
    finally:
        stop_cluster(cl, clients)


def established(pid, port):
    """Does process pid hold an established TCP connection to 127.0.0.1:port?"""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            ln = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if ln.startswith("socket:["):
            inodes.add(ln[8:-1])
    with open("/proc/net/tcp") as f:
        next(f)
        for row in f:
            c = row.split()
            if c[3] == "01" and int(c[2].split(":")[1], 16) == port and c[9] in inodes:
                return True
    return False


def stopped_sender():
    """(ii) node b0 connects, then stops (SIGSTOP) mid-refit, TRIES times."""
    # a long lease: the slices' deadline, not the lease, ends each try
    cl = Cluster("b", 3, ["--test-msg-delay-ms", "60"],
                 coord_extra=["--slice-timeout-ms", str(SLICE_MS)], lease_ms=60000)
    train, insts = layouts()
    clients = start_model(cl, "bm", train, insts, random.Random(5),
                          installs={"i1": "double-buffer", "i2": "double-buffer"})
    named, fails, version = 0, [], 1
    try:
        t0 = time.time()
        g = cl.refit("bm", 1)
        assert g.state == pb.COMMITTED, g.failure
        FIG["(ii) a good refit with the message delay"] = time.time() - t0
        harness.expect_installed(clients, 1)
        mem = {m.node_id: m for m in cl.stub.ListMembers(pb.ListMembersRequest(),
                                                         timeout=10).members}
        port1 = int(mem["b1"].data_endpoint.rsplit(":", 1)[1])
        node0 = cl.nodes[0]
        for t in range(TRIES):
            version += 1
            out = clients["train"][0].cmd(f"next {version}")
            assert out.startswith("READY"), out
            t0 = time.time()
            rid = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="bm", version=version),
                                       timeout=10).refit_id
            try:
                wait_for(lambda: established(node0.pid, port1), 30,
                         "node b0's data connection to b1")
                node0.send_signal(signal.SIGSTOP)
                g = harness.refit_final(cl.stub, rid, SLICE_MS / 1000 + 60)
            finally:
                node0.send_signal(signal.SIGCONT)
            took = time.time() - t0
            ok = g.state == pb.FAILED and re.search(
                r"^data link b0 -> b[12]: b0 (stopped sending|never connected)", g.failure)
            named += bool(ok)
            if not ok:
                fails.append(g.failure or pb.RefitState.Name(g.state))
            print(f"     try {t + 1}: {took:.1f} s: {g.failure}")
        FIG["(ii) a stopped sender named as the one owing messages"] = \
            f"{named} of {TRIES} tries ({100 * named // TRIES} %)"
        assert named == TRIES, fails
        # the cluster still works: the next refit commits
        version += 1
        out = clients["train"][0].cmd(f"next {version}")
        assert out.startswith("READY"), out
        g = cl.refit("bm", version)
        assert g.state == pb.COMMITTED, g.failure
    finally:
        stop_cluster(cl, clients)


try:
    check("one peer's data port unreachable: the refit fails within the connect "
          "deadline, naming both ends", unreachable_port)
    check(f"a node stopped mid-refit is named as the one owing messages ({TRIES} tries)",
          stopped_sender)
finally:
    harness.stop_all()
    for s in HOLD:
        s.close()
    harness.check_exits()
for k, v in FIG.items():
    print(f"     {k}: {v if isinstance(v, str) else f'{v:.2f} s'}")
harness.summary("attribution")
