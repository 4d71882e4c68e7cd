#!/usr/bin/python3
"""Network faults (issue 28, item 5): the coordinator and four node daemons,
each in its own network namespace on an emulated network (netns.py: tap
links through a user-space delaying relay to a bridge, nftables for loss
and partitions), librefit clients in the root namespace (they reach their
node daemon by its unix socket).

Topology: coordinator "c"; nodes nf0..nf3 (ranks 4k..4k+3); model "nm"
with a trainer on nf0 and nf1 (ranks 0, 1, 4, 5), instance db
(double-buffered) and instance ip (in place) each spanning nf2 and nf3
(ranks 8+12, 9+13), and a single-node replica r on nf1 (ranks 6, 7).

 1. steady refits under 20 +- 5 ms one-way delay on every link and 2 %
    loss into every namespace: every refit commits on its first attempt and
    every instance is byte-exact;
 2. a node of db and ip partitioned (black hole both ways) mid-refit:
    a. with `refitctl policy nm --retries 3 --backoff-ms 300 --catch-up
       on`, the node that did NOT register db and ip with the coordinator
       (nf3 at first: the clients on nf2 registered first; read from
       GetModel each time): the retry commits on the healthy replica r,
       skipping db and ip; after the heal db and ip catch up by themselves
       (no trigger): polled until every instance holds the newest version,
       the time from the heal printed;
    b. the same with the node that registered them;
    c. without retries, nf2 and then nf3: the refit fails within the lease
       naming the node, nothing is half-installed (no rank shows the
       version, every rank holds what it held, double buffers byte-exact),
       and after the heal the next refit (the operator's next step)
       installs byte-exact everywhere;
 3. nf0 cannot reach nf2's data port (only that tcp port is dropped; nf0
    still reaches the coordinator and everything else): the refit fails
    within the node's connect deadline (connect_timeout_ms, when this
    refitd has it), the failure names both ends ("nf0 -> nf2"); over
    several tries, the share of failures naming both ends and the time to
    fail are printed; after the heal the next refit commits;
 4. the coordinator's link flapping (eth0 down/up in its namespace, twice
    per refit, three refits): members, member ids and epoch unchanged, the
    refit in flight commits, byte-exact.

Usage: test_netfaults.py BUILD_DIR.  Needs root and network namespaces
(prints "netfaults: skipped: ..." and exits 0 otherwise), nft (nftables,
scripts/deps.sh) and /dev/net/tun.  Removes every namespace, link, rule
and process it made, also after a failure or a signal.  Ends with
"netfaults: N passed, N failed".
"""
import os
import re
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

_why = netns.why_not()
if _why:
    if _why[0] == "skip":
        print(f"netfaults: skipped: {_why[1]}: 0 passed, 0 failed")
        sys.exit(0)
    print(f"FAIL netfaults cannot run: {_why[1]}")
    print("netfaults: 0 passed, 1 failed")
    sys.exit(1)

import protostubs  # noqa: E402
TMP = protostubs.generate("refit-nf-")
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import harness  # noqa: E402
from harness import Client, check, spawn, wait_for, write  # noqa: E402

harness.init(BUILD, TMP)
RPN = 4
LEASE_MS = 2000
HEARTBEAT_MS = 200
MSG_DELAY_MS = 30         # test_msg_delay_ms: slow refits, so faults land mid-refit
NODES = ["nf0", "nf1", "nf2", "nf3"]
FIG = {}


def has_key(flag):
    out = subprocess.run([f"{BUILD}/bin/refitd", "--help"], capture_output=True, text=True)
    return flag in out.stdout + out.stderr


HAS_CONNECT_TIMEOUT = has_key("--connect-timeout-ms")
# the nodes' connect deadline, where refitd has the key: its default, 5 s,
# above two lost SYNs (retransmitted after 1 s, then 2 s more) under
# scenario 1's 2 % loss
CONNECT_MS = 5000
# the nodes' slice deadline (600 s by default): well above the connect
# deadline, so that failing at one is told from failing at the other; 20 s
# where refitd has no connect deadline (scenario 3 then waits for this one)
SLICE_MS = 60000 if HAS_CONNECT_TIMEOUT else 20000


def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": ranks,
             "placements": [placement]} for k in range(16)]


class NetCluster:
    """The network, the coordinator (host c) and the node daemons (nf0..nf3),
    each in its own namespace."""

    def __init__(self):
        self.net = netns.Net(before_close=harness.stop_all)
        self.caddr = self.net.add("c", 2)
        # beyond loopback: the daemons share a cluster join token (mode 0600)
        token = f"{TMP}/join.token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, (os.urandom(16).hex() + "\n").encode())
        os.close(fd)
        self.addr = f"{self.caddr}:7700"
        self.log = open(f"{TMP}/nf.log", "w")
        self.coord = spawn(["ip", "netns", "exec", self.net.ns("c"), f"{BUILD}/bin/refitd",
                            "--role", "coordinator", "--listen", self.addr,
                            "--heartbeat-ms", str(HEARTBEAT_MS),
                            "--lease-ttl-ms", str(LEASE_MS), "--log-level", "info",
                            "--join-token-file", token], stderr=self.log)
        self.nodes = []
        for k, name in enumerate(NODES):
            ip = self.net.add(name, 10 + k)
            args = ["ip", "netns", "exec", self.net.ns(name), f"{BUILD}/bin/refitd",
                    "--role", "node", "--listen", f"{ip}:7701", "--coordinator", self.addr,
                    "--node-id", name, "--ranks", f"{k * RPN}-{k * RPN + RPN - 1}",
                    "--heartbeat-ms", str(HEARTBEAT_MS), "--data-listen", f"{ip}:0",
                    "--local-socket", self.sock(k), "--slice-timeout-ms", str(SLICE_MS),
                    "--test-msg-delay-ms", str(MSG_DELAY_MS), "--log-level", "info",
                    "--join-token-file", token]
            if HAS_CONNECT_TIMEOUT:
                args += ["--connect-timeout-ms", str(CONNECT_MS)]
            self.nodes.append(spawn(args, stderr=self.log))
        # the test's channel crosses the coordinator's link too (flapped in
        # scenario 4): reconnect quickly
        self.ch = grpc.insecure_channel(self.addr, options=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500)])
        grpc.channel_ready_future(self.ch).result(timeout=20)
        self.stub = pbg.CoordinatorStub(self.ch)
        self.members(4)

    def sock(self, k):
        return f"{TMP}/nf{k}.local"

    def host(self, k):
        return NODES[k]

    def members(self, n, timeout=30):
        return wait_for(lambda: (lambda m: m if len(m.members) == n else None)(
            self.stub.ListMembers(pb.ListMembersRequest(), timeout=5)),
            timeout, f"{n} members")

    def member(self, name):
        return [m for m in self.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members
                if m.node_id == name]

    def ctl(self, *args, timeout=60):
        return subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", self.addr] +
                              list(args), capture_output=True, text=True, timeout=timeout)

    def get(self, rid):
        return self.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)

    def final(self, rid, timeout):
        """The refit's final record (gRPC errors, e.g. while a link is down,
        count as not yet)."""
        return wait_for(lambda: (lambda g: g if g.state in (
            pb.COMMITTED, pb.FAILED, pb.ABORTED) else None)(self.get(rid)),
            timeout, f"refit {rid} to end", every=0.02)


class Model:
    def __init__(self, cl):
        self.cl = cl
        self.version = 1
        tl = write(f"{TMP}/nm-t.json", tensors([0, 1, 4, 5], "Shard(0)"))
        self.trainers = [Client(cl, k, "nm", "train", tl) for k in (0, 1)]
        for t in self.trainers:
            assert t.ok(), t.first
        self.lay = {"db": ([8, 12], "double-buffer"), "ip": ([9, 13], "in-place"),
                    "r": ([6, 7], "double-buffer")}
        self.inst = {}
        for name, (ranks, mode) in self.lay.items():
            path = write(f"{TMP}/nm-{name}.json", tensors(ranks, "Shard(1)"))
            for node in sorted({r // RPN for r in ranks}):
                c = Client(cl, node, "nm", "infer", path, instance=name, install=mode)
                assert c.ok(), (name, node, c.first)
                self.inst[(name, NODES[node])] = c

    def policy(self, retries, backoff_ms, catch_up):
        out = self.cl.ctl("policy", "nm", "--retries", str(retries), "--backoff-ms",
                          str(backoff_ms), "--catch-up", "on" if catch_up else "off")
        assert out.returncode == 0, out

    def step(self):
        self.version += 1
        for t in self.trainers:
            out = t.cmd(f"next {self.version}")
            assert out.startswith("READY"), out

    def trigger(self):
        return self.cl.stub.TriggerRefit(pb.TriggerRefitRequest(
            model="nm", version=self.version), timeout=10).refit_id

    def running(self):
        """Trigger this version's refit; its id once RUNNING."""
        rid = self.trigger()
        wait_for(lambda: self.cl.get(rid).state == pb.RUNNING, 30,
                 f"refit {rid} to run", every=0.005)
        return rid

    def installed(self, v=None, insts=None):
        """Every instance (or those named) holds v, byte-exact."""
        v = v or self.version
        for key, c in self.inst.items():
            if insts is None or key[0] in insts:
                out = c.cmd(f"wait {v} 30000")
                assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, (key, out)

    def holding(self, v):
        """The instances (name, node) whose client holds v, valid."""
        out = []
        for k, c in self.inst.items():
            st = c.cmd("state")
            if f"version={v} " in st and "valid=1" in st:
                out.append(k)
        return out

    def versions(self):
        """{(instance, node): the version its client holds}."""
        return {k: int(re.search(r"version=(\d+) ", c.cmd("state")).group(1))
                for k, c in self.inst.items()}

    def baseline(self):
        """Before a scenario: no refit running, every instance holding the
        newest version (an earlier scenario that failed may have left one
        behind: then one refit, as an operator would)."""
        quiet()
        if sorted(self.holding(self.version)) != sorted(self.inst):
            g = self.cl.final(self.trigger(), 60)
            assert g.state == pb.COMMITTED, ("baseline refit", g.failure)
            self.installed()

    def not_half_installed(self, failed, before):
        """No rank shows the failed version; every rank holds what it held
        before (before: versions()); double buffers serve it byte-exact, in
        place serves it or is marked invalid."""
        for (name, node), c in self.inst.items():
            st = c.cmd("state")
            old = before[(name, node)]
            assert f"version={failed} " not in st, (name, node, st)
            assert f"version={old} " in st, (name, node, old, st)
            if self.lay[name][1] == "double-buffer":
                assert "valid=1" in st, (name, node, st)
                out = c.cmd(f"check {old}")
                assert out.endswith("mismatches=0"), (name, node, out)
            elif "valid=1" in st:
                assert c.cmd(f"check {old}").endswith("mismatches=0"), (name, node, st)


CL = None
M = None


def setup():
    global CL, M
    CL = NetCluster()
    M = Model(CL)
    M.policy(0, 0, False)
    g = CL.final(M.trigger(), 60)
    assert g.state == pb.COMMITTED, g.failure
    M.installed()
    t0 = time.time()
    M.step()
    g = CL.final(M.trigger(), 60)
    assert g.state == pb.COMMITTED, g.failure
    M.installed()
    FIG["one refit on the clean network (trigger -> installed)"] = time.time() - t0
    print("     connect_timeout_ms: " +
          (f"{CONNECT_MS} ms" if HAS_CONNECT_TIMEOUT else "NOT known to this refitd"))


def loss_drops():
    """Packets the loss rules dropped so far, over every namespace."""
    n = 0
    for h in ["c"] + NODES:
        n += sum(int(x) for x in re.findall(r"packets (\d+)", CL.net.rules(h)))
    return n


def delay_and_loss():
    M.baseline()
    hosts = ["c"] + NODES
    for h in hosts:
        CL.net.delay(h, 20, 5)
        CL.net.loss(h, 2)
    try:
        # the delay is there: a call from here (the root namespace) to the
        # coordinator is delayed once, on its way into the coordinator's namespace
        t0 = time.time()
        CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10)
        rtt = time.time() - t0
        assert rtt > 0.014, f"ListMembers answered in {rtt * 1e3:.1f} ms: no delay?"
        epoch = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10).epoch
        times = []
        for _ in range(5):
            M.step()
            t0 = time.time()
            g = CL.final(M.trigger(), 120)
            assert g.state == pb.COMMITTED and g.attempt == 1, (g.state, g.attempt, g.failure)
            M.installed()
            times.append(time.time() - t0)
        assert CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10).epoch == epoch
        FIG["delay 20+-5 ms, 2 % loss: refit trigger -> installed (5 refits)"] = \
            " ".join(f"{t:.2f}" for t in times) + " s"
        dropped = loss_drops()
        FIG["delay 20+-5 ms, 2 % loss: packets dropped by the loss rules"] = str(dropped)
        assert dropped > 0, "the loss rules dropped nothing"
    finally:
        for h in hosts:
            CL.net.delay(h, 0)
            CL.net.loss(h, 0)


def rejoined(name, old_member):
    """name is a member again, under a new member id."""
    return wait_for(lambda: (lambda m: m if m and m[0].member_id != old_member and len(
        CL.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members) == 4 else None)(
        CL.member(name)), 30, f"{name} to join again")


def partition_no_retry(node):
    M.policy(0, 0, False)
    M.baseline()
    before = M.versions()
    old_member = CL.member(node)[0].member_id
    M.step()
    rid = M.running()
    t0 = time.time()
    CL.net.partition(node)
    try:
        g = CL.final(rid, SLICE_MS / 1000 + 30)
        took = time.time() - t0
        FIG[f"partition of {node}, no retries: refit failed after"] = took
        assert g.state == pb.FAILED and node in g.failure, (g.state, g.failure)
        # within the lease (2 s), far below the 30 s slice deadline
        assert took < LEASE_MS / 1000 + 8, f"failed after {took:.1f} s: {g.failure}"
        M.not_half_installed(M.version, before)
    finally:
        CL.net.heal(node)
    rejoined(node, old_member)
    # the operator's next step: trigger again
    t1 = time.time()
    g = CL.final(M.trigger(), 60)
    assert g.state == pb.COMMITTED and not g.skipped, (g.state, g.failure, list(g.skipped))
    M.installed()
    FIG[f"partition of {node}, no retries: heal -> next refit installed"] = time.time() - t1


def registrants():
    """{instance: the node whose registration the coordinator keeps for it
    (Instance.member_id)} of db and ip."""
    ids = {m.member_id: m.node_id for m in CL.stub.ListMembers(
        pb.ListMembersRequest(), timeout=5).members}
    mod = CL.stub.GetModel(pb.GetModelRequest(model="nm"), timeout=5)
    return {i.instance: ids.get(i.member_id, f"member {i.member_id}")
            for i in mod.instances if i.instance in ("db", "ip")}


def partition_retry(registrant):
    """registrant: partition the node that registered db and ip with the
    coordinator (True) or the other node of both (False)."""
    M.policy(0, 0, False)
    M.baseline()
    reg = registrants()
    assert reg["db"] == reg["ip"] and reg["db"] in ("nf2", "nf3"), reg
    node = reg["db"] if registrant else ({"nf2", "nf3"} - {reg["db"]}).pop()
    print(f"     db and ip registered by {reg['db']}: partitioning {node}")
    M.policy(3, 300, True)
    try:
        old_member = CL.member(node)[0].member_id
        M.step()
        rid = M.running()
        CL.net.partition(node)
        try:
            g = CL.final(rid, SLICE_MS / 1000 + 30)
            assert g.state == pb.COMMITTED, (g.state, g.failure, list(g.attempts))
            assert g.attempt >= 2 and node in g.attempts[0], (g.attempt, list(g.attempts))
            assert sorted(g.skipped) == ["db", "ip"], list(g.skipped)
            M.installed(insts=["r"])      # the healthy replica
            for key in M.inst:
                if key[0] != "r":
                    st = M.inst[key].cmd("state")
                    assert f"version={M.version} " not in st, (key, st)
        finally:
            t_heal = time.time()
            CL.net.heal(node)
        rejoined(node, old_member)
        # no trigger: the skipped instances catch up by themselves
        want = sorted(M.inst)
        wait_for(lambda: sorted(M.holding(M.version)) == want, 30,
                 f"every instance to hold version {M.version} after the heal "
                 f"(holding: {M.holding(M.version)})", every=0.05)
        took = time.time() - t_heal
        FIG[f"partition of {node}, retries + catch-up: heal -> every instance holds "
            "the newest version"] = took
        M.installed()
    finally:
        M.policy(0, 0, False)


def quiet():
    """No refit of nm running (catch-ups included)."""
    wait_for(lambda: all(r.state not in (pb.PENDING, pb.RUNNING) for r in CL.stub.ListRefits(
        pb.ListRefitsRequest(model="nm", limit=4), timeout=5).refits), 60, "no refit running")


def asymmetric_port():
    """nf0 cannot reach nf2's data port: only that traffic is dropped."""
    M.policy(0, 0, False)
    M.baseline()
    before = M.versions()
    a, b = "nf0", "nf2"
    ep = CL.member(b)[0].data_endpoint
    host, port = ep.rsplit(":", 1)
    assert host == CL.net.addr(b), ep
    M.step()
    CL.net.block(a, host, int(port))
    bound = (CONNECT_MS / 1000 if HAS_CONNECT_TIMEOUT else 5) + 10
    tries, named, arrow, times, slow = 4, 0, 0, [], None
    try:
        for k in range(tries):
            t0 = time.time()
            rid = M.trigger()
            g = CL.final(rid, SLICE_MS / 1000 + 60)
            took = time.time() - t0
            times.append(took)
            assert g.state == pb.FAILED, (g.state, g.failure)
            both = a in g.failure and b in g.failure
            named += both
            arrow += bool(re.search(rf"\b{a}\b\S*\s*->\s*\S*\b{b}\b", g.failure))
            print(f"     try {k + 1}: failed after {took:.2f} s: {g.failure}")
            if took > bound:
                slow = took
                break      # each further try would wait as long
        # nf0 still reaches the coordinator: no membership change
        assert len(CL.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members) == 4
        M.not_half_installed(M.version, before)
    finally:
        CL.net.heal(a)
        n = len(times)
        FIG["asymmetric partition nf0 -/-> nf2 data port: failures naming both ends"] = \
            f"{named}/{n} ({arrow}/{n} as \"{a} -> {b}\")"
        if times:
            FIG["asymmetric partition: time to fail (min / max)"] = \
                f"{min(times):.2f} / {max(times):.2f} s (connect deadline " + \
                (f"{CONNECT_MS} ms)" if HAS_CONNECT_TIMEOUT else
                 f"unset: connect_timeout_ms unknown to this refitd; slice deadline "
                 f"{SLICE_MS} ms)")
    g = CL.final(M.trigger(), 60)
    assert g.state == pb.COMMITTED, g.failure
    M.installed()
    assert slow is None, f"failed after {slow:.1f} s: not within the connect deadline " \
        f"({CONNECT_MS / 1000:.0f} s)" + ("" if HAS_CONNECT_TIMEOUT else
                                         ": this refitd has no connect_timeout_ms")
    assert named == n, f"only {named} of {n} failures name both {a} and {b}"
    assert HAS_CONNECT_TIMEOUT, "this refitd has no connect_timeout_ms"


def coordinator_flaps():
    M.policy(0, 0, False)
    M.baseline()
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
    before = (mem.epoch, sorted((m.node_id, m.member_id) for m in mem.members))
    in_flight = 0
    for _ in range(3):
        M.step()
        rid = M.running()
        flaps = []
        for _ in range(2):
            t = time.time()
            CL.net.link("c", False)
            time.sleep(0.4)        # the outage itself, well inside the 2 s lease
            CL.net.link("c", True)
            flaps.append(t)
            time.sleep(0.3)
        g = CL.final(rid, 60)
        assert g.state == pb.COMMITTED, (g.state, g.failure)
        in_flight += g.finished_unix_ms / 1000 > flaps[0]
        M.installed()
    mem = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
    after = (mem.epoch, sorted((m.node_id, m.member_id) for m in mem.members))
    assert after == before, (before, after)
    FIG["coordinator link flapping: refits still running at the first flap"] = \
        f"{in_flight} of 3"
    assert in_flight >= 1, "no refit was still running when the link went down"


T0 = time.time()
try:
    check("4 nodes and a coordinator in network namespaces; first refits", setup)
    if M is not None:
        check("delay 20 +- 5 ms and 2 % loss: every refit commits first time, byte-exact",
              delay_and_loss)
        check("the node of db and ip that did NOT register them partitioned mid-refit, "
              "retries + catch-up: the retry commits on r, db and ip catch up by "
              "themselves after the heal", lambda: partition_retry(False))
        check("the node that registered db and ip partitioned mid-refit, retries + "
              "catch-up: the retry commits on r, db and ip catch up by themselves after "
              "the heal", lambda: partition_retry(True))
        for node in ("nf2", "nf3"):
            check(f"{node} (a node of db and ip) partitioned mid-refit, no retries: fails "
                  "within the lease, nothing half-installed, next refit byte-exact",
                  lambda n=node: partition_no_retry(n))
        check("nf0 cannot reach nf2's data port: fails within the connect deadline, "
              "naming both ends", asymmetric_port)
        check("the coordinator's link flapping: same members, epoch and ids; refits commit",
              coordinator_flaps)
finally:
    harness.stop_all()
    if CL is not None:
        CL.net.close()
    harness.check_exits()
for k, v in FIG.items():
    print(f"     {k}: {v if isinstance(v, str) else f'{v:.2f} s'}")
print(f"     suite: {time.time() - T0:.0f} s")
harness.summary("netfaults")
