"""Coordinators in standby over etcd (docs/ha.md), end to end: an etcd
cluster of REFIT_HA_ETCD members (3; make check's ASan run: 1) started here
on loopback ports in the suite's temporary folder, three
coordinators with state_store etcd, three node daemons given all three
coordinator addresses, librefit clients (a trainer, a double-buffered and
an in-place instance).

Usage: test_ha.py BUILD_DIR.  Checks: one leader, the standbys answer
UNAVAILABLE "not the leader: ADDR" naming it, refitctl given every
coordinator (a standby first) follows to it, /metrics shows who leads and
the leader's timed saves to etcd; a refit commits; the leader SIGKILLed ->
a standby leads, the nodes follow it, the next refit commits byte-exact and
no instance's version goes back; the leader SIGKILLed with a refit RUNNING
-> the new leader has it FAILED and refits that version again by itself
(the model's retries), installed once; a leader SIGSTOPped past its lease
-> another leads, and the old one, SIGCONTed, changes nothing and stops
with status 75; the leader's election key deleted while a change arrives
-> the change is not acknowledged, the leader stops (75), etcd's state is
not written by it; a soak of REFIT_HA_ROUNDS (30) refits in a row, the
coordinators holding each Publish REFIT_HA_HOLD_PUBLISH_MS (400) after its
decision is durable (test_hold_publish_ms), the leader SIGKILLed or
SIGSTOPped (alternating) in that window, RUNNING, at a random time (seed
REFIT_HA_SEED) or idle, one refit in five left alone -> every version
installed once on every instance (the nodes' logs), byte-exact, never going
back, a decided refit resent and not redone, a stopped old leader woken once
the new one is done stops with 75 and etcd's state and the installs are
unchanged; with three etcd members, one
SIGKILLed (the coordinators' first endpoint) -> refits commit on the other
two, restarted it rejoins, another lost -> refits commit; etcd stopped (every
member) -> a change is
refused UNAVAILABLE naming etcd, and is taken once etcd is back; an etcd
member of its own serving TLS with --client-cert-auth -> coordinators given
another CA, no client certificate, or an endpoint its certificate does not
name are refused (an error naming etcd and TLS) and never lead, the one
given etcd_tls_ca/cert/key leads and a refit commits.  Prints the fail-over time (leader
death to the first refit committed under the new leader) and the refit
latency with etcd against a coordinator with a state file.  Skips (a clear
message, exit 0) only when etcd is not installed (make deps installs it).
Here: the cluster, leader deaths, etcd members and the Publish resent; the
soak is in ha_soak.py, the TLS, state-in-chunks and watch checks in
ha_etcd.py, both run from this file's list of checks (one count, one FIG).
"""
import base64
import os
import shutil
import signal
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
ETCD = shutil.which("etcd")
if ETCD is None:
    print("ha: SKIP: etcd is not installed (make deps installs etcd-server)")
    print("ha: 0 passed, 0 failed")
    sys.exit(0)
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-ha-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402
import ha_etcd  # noqa: E402
import ha_soak  # noqa: E402
import harness  # noqa: E402
from harness import Client, check, free_port, spawn, wait_for, write  # noqa: E402

harness.init(BUILD, TMP)
ha_etcd.init(sys.modules[__name__])
TTL_MS = 2000
ETCD_MEMBERS = int(os.environ.get("REFIT_HA_ETCD", "3"))
FIG = {}


class Etcd:
    """An etcd cluster of n members (REFIT_HA_ETCD, 3 by default; make check's
    ASan run uses 1) on loopback, each member's data in TMP/etcdK (kept across
    restarts); addr: every member's client address, comma-separated."""

    def __init__(self, n):
        self.n = n
        self.cports = [free_port() for _ in range(n)]
        self.pports = [free_port() for _ in range(n)]
        self.addrs = [f"127.0.0.1:{p}" for p in self.cports]
        self.addr = ",".join(self.addrs)
        self.cluster = ",".join(f"ha{k}=http://127.0.0.1:{self.pports[k]}" for k in range(n))
        self.log = open(f"{TMP}/etcd.log", "a")
        self.p = [None] * n
        self.start()

    def spawn(self, k):
        peer = f"http://127.0.0.1:{self.pports[k]}"
        self.p[k] = spawn([ETCD, "--name", f"ha{k}", "--data-dir", f"{TMP}/etcd{k}",
                           "--listen-client-urls", f"http://{self.addrs[k]}",
                           "--advertise-client-urls", f"http://{self.addrs[k]}",
                           "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                           "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                           "--log-level", "warn"], stdout=self.log, stderr=self.log)

    def ready(self, k):
        ch = grpc.insecure_channel(self.addrs[k])
        grpc.channel_ready_future(ch).result(timeout=30)
        ch.close()

    def start(self, members=None):
        """Start every member (or those named): all spawned, then each answering."""
        ks = range(self.n) if members is None else members
        for k in ks:
            self.spawn(k)
        for k in ks:
            self.ready(k)

    def stop(self, members=None, sig=signal.SIGTERM):
        for k in range(self.n) if members is None else members:
            self.p[k].send_signal(sig)
            self.p[k].wait(timeout=20)


class Coords:
    """Three coordinators over etcd."""

    def __init__(self, etcd):
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.mports = [free_port() for _ in range(3)]
        self.log = open(f"{TMP}/coords.log", "w")
        self.procs = [None] * 3
        self.etcd = etcd
        self.extra = []  # more flags for each start (the soak's test_hold_publish_ms)
        for k in range(3):
            self.start(k)

    def start(self, k):
        a = self.addrs[k]
        self.procs[k] = spawn(
            [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", a,
             "--heartbeat-ms", "100", "--lease-ttl-ms", "1500", "--log-level", "info",
             "--metrics-listen", f"127.0.0.1:{self.mports[k]}",
             "--state-store", "etcd", "--etcd-endpoints", self.etcd.addr,
             "--etcd-lease-ttl-ms", str(TTL_MS)] + self.extra, stderr=self.log)

    def stub(self, k):
        return pbg.CoordinatorStub(grpc.insecure_channel(self.addrs[k]))

    def leader(self, skip=()):
        """The index of the coordinator that answers ListMembers (None: none yet)."""
        for k in range(3):
            if k in skip or self.procs[k].poll() is not None:
                continue
            try:
                self.stub(k).ListMembers(pb.ListMembersRequest(), timeout=0.5)
                return k
            except grpc.RpcError:
                pass
        return None

    def wait_leader(self, skip=(), timeout=30):
        return wait_for(lambda: (lambda k: (k,) if k is not None else None)(
            self.leader(skip)), timeout, "a leader")[0]


def tensors(ranks, placement):
    return [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": ranks,
             "placements": [placement]} for k in range(8)]


E = C = None
NODES, M = [], {}
HOLD_MS = 600


def HOLD(k):
    """Node 2 holds each RunSlice HOLD_MS (until an Abort): a refit stays RUNNING
    long enough to kill its leader then."""
    return ["--test-hold-run-ms", str(HOLD_MS)] if k == 2 else []
RPN = harness.RPN


def sock(k):
    return f"{TMP}/ha{k}.local"


class Shim:
    """What harness.Client needs of a cluster."""

    def sock(self, k):
        return sock(k)

    def host(self, k):
        return f"ha{k}"


def setup():
    global E, C
    E = Etcd(ETCD_MEMBERS)
    C = Coords(E)
    lead = C.wait_leader()
    coords = ",".join(C.addrs)
    log = open(f"{TMP}/nodes.log", "w")
    for k in range(3):
        NODES.append(spawn([f"{BUILD}/bin/refitd", "--role", "node", "--listen",
                            f"127.0.0.1:{free_port()}", "--coordinator", coords,
                            "--node-id", f"ha{k}", "--ranks", f"{k * RPN}-{k * RPN + RPN - 1}",
                            "--heartbeat-ms", "200", "--local-socket", sock(k),
                            "--log-level", "info"] + HOLD(k), stderr=log))
    wait_members(lead, 3)
    sh = Shim()
    M["v"] = 1
    M["train"] = Client(sh, 0, "m", "train", write(f"{TMP}/t.json",
                                                     tensors([0, 1], "Shard(0)")))
    assert M["train"].ok(), M["train"].first
    M["inst"] = []
    for node, inst, mode, pl in ((1, "db", "double-buffer", "Shard(1)"),
                                 (2, "ip", "in-place", "Replicate()")):
        c = Client(sh, node, "m", "infer", write(f"{TMP}/{inst}.json", tensors(
            [node * RPN, node * RPN + 1], pl)), instance=inst, install=mode)
        assert c.ok(), c.first
        M["inst"].append(c)
    # retries: a refit cut short by a fail-over is refit again by the new leader
    C.stub(lead).SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="m", retries=2, retry_backoff_ms=100, catch_up=True)), timeout=5)


def wait_members(k, n, timeout=30):
    return wait_for(lambda: len(C.stub(k).ListMembers(pb.ListMembersRequest(),
                                                      timeout=2).members) == n,
                    timeout, f"{n} members on coordinator {k}")


def step():
    M["v"] += 1
    out = M["train"].cmd(f"next {M['v']}")
    assert out.startswith("READY"), out


def refit(k, timeout=60):
    """Trigger this version's refit on coordinator k; (final GetRefit, seconds)."""
    t0 = time.time()
    st = C.stub(k)
    r = st.TriggerRefit(pb.TriggerRefitRequest(model="m", version=M["v"]), timeout=10)
    g = harness.refit_final(st, r.refit_id, timeout)
    return g, time.time() - t0


def installed():
    """This version is installed byte-exact on both instances, and the
    double-buffered one flipped its buffer once per version since the last
    look: no version installed twice (a double publish flips it again)."""
    for c in M["inst"]:
        out = c.cmd(f"wait {M['v']} 20000")
        assert out.startswith(f"INSTALLED {M['v']} ") and "mismatches=0" in out, out
    db = M["inst"][0].cmd("state")
    act = int(db.split("active=")[1].split()[0])
    seen = M.get("db")
    if seen is not None and seen[0] != M["v"]:
        assert act == (seen[1] + M["v"] - seen[0]) % 2, \
            f"instance db: active buffer {act} after v{seen[0]} (active {seen[1]}) -> " \
            f"v{M['v']}: installed other than once per version"
    M["db"] = (M["v"], act)


def standbys_name_leader():
    lead = C.wait_leader()
    for k in range(3):
        if k == lead:
            continue
        e = harness.expect_error(lambda: C.stub(k).ListMembers(pb.ListMembersRequest(),
                                                                timeout=5),
                                 grpc.StatusCode.UNAVAILABLE, "not the leader: ")
        assert C.addrs[lead] in e, e
    # refitctl given every coordinator, a standby first (and an address where
    # none listens), follows to the leader and says what each other answers
    nobody = f"127.0.0.1:{free_port()}"
    order = [C.addrs[k] for k in range(3) if k != lead] + [C.addrs[lead], nobody]
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", ",".join(order),
                          "members"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert f"coordinator leading: {C.addrs[lead]} (answered)" in out.stdout, out.stdout
    assert "3 members" in out.stdout, out.stdout
    for a in order[:2]:
        assert f"coordinator {a}: standby (names the leader: {C.addrs[lead]})" in \
            out.stdout, out.stdout
    assert f"coordinator {nobody}: unreachable" in out.stdout, out.stdout
    # given a standby alone: followed, and said so
    out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", order[0], "members"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert f"coordinator leading: {C.addrs[lead]} (followed from {order[0]}, a standby)" \
        in out.stdout, out.stdout
    # /metrics: leadership, and the leader's saves to etcd timed
    for k in range(3):
        m = harness.scrape_metrics(C.mports[k])
        assert m[("refitd_coordinator_leader", frozenset())] == (1 if k == lead else 0), k
    m = harness.scrape_metrics(C.mports[lead])
    saves = m.get(("refitd_state_store_duration_seconds_count", frozenset(
        {"store": "etcd", "op": "save", "outcome": "ok"}.items())), 0)
    assert saves >= 1, [k for k in m if k[0].startswith("refitd_state_store")]


def first_refit():
    lead = C.wait_leader()
    step()
    g, took = refit(lead)
    assert g.state == pb.COMMITTED, g.failure
    installed()
    for _ in range(2):
        step()
        g, took = refit(lead)
        assert g.state == pb.COMMITTED, g.failure
        installed()


def commit_under(lead, timeout=60):
    """The next version commits under coordinator lead (retried while the
    nodes are still joining it); returns when."""
    wait_members(lead, 3, timeout)
    step()
    end = time.time() + timeout
    while True:
        try:
            g, _ = refit(lead)
            if g.state == pb.COMMITTED:
                installed()
                return time.time()
            failure = g.failure
        except grpc.RpcError as e:
            failure = e.details()
        assert time.time() < end, f"no refit committed under {C.addrs[lead]}: {failure}"
        time.sleep(0.1)


def leader_killed():
    old = C.wait_leader()
    C.procs[old].send_signal(signal.SIGKILL)
    t0 = time.time()
    lead = C.wait_leader(skip=(old,))
    assert lead != old
    done = commit_under(lead)
    FIG["fail-over, leader SIGKILLed -> first refit committed under the new leader "
        f"(etcd_lease_ttl_ms {TTL_MS})"] = f"{done - t0:.2f} s"
    C.procs[old].wait()
    C.start(old)  # back as a standby
    wait_for(lambda: C.leader() == lead, 10, "the restarted one a standby")


def leader_killed_mid_refit():
    old = C.wait_leader()
    step()
    st = C.stub(old)
    rid = st.TriggerRefit(pb.TriggerRefitRequest(model="m", version=M["v"]),
                          timeout=10).refit_id
    wait_for(lambda: st.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5).state ==
             pb.RUNNING, 20, f"refit {rid} running", every=0.005)
    C.procs[old].send_signal(signal.SIGKILL)
    lead = C.wait_leader(skip=(old,))
    st = C.stub(lead)
    g = st.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)
    assert g.state == pb.FAILED and "restarted" in g.failure, (g.state, g.failure)
    # the new leader refits the same version by itself (the model's retries),
    # once the nodes joined it and the instances are whole again
    g = wait_for(lambda: (lambda r: r if r.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED)
                          else None)(st.GetRefit(pb.GetRefitRequest(refit_id=rid + 1),
                                                 timeout=5)),
                 60, f"refit {rid + 1} (the retry) final")
    assert g.state == pb.COMMITTED and g.version == M["v"], (g.state, g.version, g.failure)
    installed()
    commit_under(lead)
    C.procs[old].wait()
    C.start(old)
    wait_for(lambda: C.leader() == lead, 10, "the restarted one a standby")


def leader_stopped():
    old = C.wait_leader()
    C.procs[old].send_signal(signal.SIGSTOP)
    lead = C.wait_leader(skip=(old,), timeout=30)
    commit_under(lead)
    v = M["v"]
    before = state_doc() if shutil.which("etcdctl") else None
    C.procs[old].send_signal(signal.SIGCONT)
    rc = C.procs[old].wait(timeout=20)
    if before is not None:
        assert state_doc() == before, "etcd's state changed after the old leader woke up"
    assert rc == 75, f"the old leader exited {rc}, not 75 (deposed)"
    # it changed nothing: the new leader still leads, the versions stand
    assert C.leader() == lead
    out = M["inst"][0].cmd("state")
    assert out.startswith(f"STATE version={v} "), out
    C.start(old)
    commit_under(lead)


def etcd_down():
    lead = C.wait_leader()
    step()
    E.stop()
    e = harness.expect_error(lambda: C.stub(lead).TriggerRefit(pb.TriggerRefitRequest(
        model="m", version=M["v"]), timeout=10), grpc.StatusCode.UNAVAILABLE, "etcd")
    assert "cannot be made durable" in e, e
    # a standby that cannot read etcd stops naming the leader it saw last
    # once the lease TTL has passed (that leader may be long dead)
    sb = next(k for k in range(3) if k != lead and C.procs[k].poll() is None)

    def unnamed():
        try:
            C.stub(sb).ListMembers(pb.ListMembersRequest(), timeout=2)
        except grpc.RpcError as x:
            return x.details() if "none elected yet" in (x.details() or "") else None
    wait_for(unnamed, 15, f"standby {C.addrs[sb]}, etcd down, to stop naming the leader")
    E.start()
    lead = C.wait_leader()
    M["v"] -= 1
    commit_under(lead)


def etcd_member_lost():
    """Three etcd members: the first (every coordinator's first endpoint)
    SIGKILLed -> the next refits commit (quorum 2 of 3); restarted, it
    rejoins; then the second lost, refits commit; back, all three answer."""
    lead = C.wait_leader()
    E.stop([0], signal.SIGKILL)
    lead = C.wait_leader()
    commit_under(lead)
    commit_under(lead)
    E.start([0])
    E.stop([1], signal.SIGKILL)
    lead = C.wait_leader()
    commit_under(lead)
    E.start([1])
    out = subprocess.run([shutil.which("etcdctl") or "true", "--endpoints", E.addr,
                          "endpoint", "health"], capture_output=True, text=True, timeout=30)
    assert not shutil.which("etcdctl") or (out.stdout + out.stderr).count("is healthy") == 3, \
        out.stdout + out.stderr
    commit_under(C.wait_leader())


def latency(tag, coord_extra):
    """Best refit latency (trigger -> COMMITTED) of 3 on a one-coordinator
    cluster of 2 nodes with coord_extra (the state file or etcd)."""
    cl = harness.Cluster(tag, 2, lease_ms=1500, coord_extra=coord_extra)
    tr = Client(cl, 0, tag, "train", write(f"{TMP}/{tag}t.json", tensors([0, 1], "Shard(0)")))
    assert tr.ok(), tr.first
    ins = Client(cl, 1, tag, "infer", write(f"{TMP}/{tag}i.json", tensors(
        [RPN, RPN + 1], "Shard(1)")), instance="db", install="double-buffer")
    assert ins.ok(), ins.first
    lat = []
    for v in range(2, 6):
        assert tr.cmd(f"next {v}").startswith("READY")
        t0 = time.time()
        g = cl.refit(tag, v)
        assert g.state == pb.COMMITTED, g.failure
        lat.append(time.time() - t0)
    return f"{min(lat[1:]) * 1e3:.1f} ms"


def etcd_size():
    """The keys refit keeps in etcd, and their bytes (etcdctl, where installed)."""
    if shutil.which("etcdctl") is None:
        return
    keys = etcd_kvs(E.addr, "/refit/")
    doc, chunks, man = etcd_doc(E.addr, "/refit")
    FIG["etcd keys under /refit/ (three coordinators, one model of a trainer and two "
        "instances, 8 tensors each)"] = (
        f"{len(keys)} keys: state document {len(doc)} bytes in {len(chunks)} chunk(s), "
        f"manifest {len(man)} bytes")


def election_keys():
    """etcd's election keys, each with its lease's remaining TTL (etcdctl):
    a failed fail-over says whether etcd still held the dead leader's key."""
    import json
    ctl = [shutil.which("etcdctl"), "--endpoints", E.addr]
    env = dict(os.environ, ETCDCTL_API="3")
    try:
        out = subprocess.run(ctl + ["get", "/refit/election/", "--prefix", "-w", "json"],
                             capture_output=True, timeout=20, env=env, check=True).stdout
        keys = []
        for kv in json.loads(out).get("kvs", []):
            ttl = subprocess.run(ctl + ["lease", "timetolive", f"{int(kv['lease']):x}"],
                                 capture_output=True, text=True, timeout=20, env=env).stdout
            keys.append(f"{base64.b64decode(kv['value']).decode()} (create revision "
                        f"{kv['create_revision']}): {ttl.strip()}")
        return "; ".join(keys) or "no election key"
    except (subprocess.SubprocessError, ValueError, KeyError) as e:
        return f"etcdctl failed: {e}"


def state_doc():
    """What /refit/state in etcd says of the model and its refits (by
    etcdctl, the manifest's chunks assembled): (latest, installed version),
    [(refit id, version, state)].  A new leader rewrites the document when it
    loads it (a new epoch generation), so the document's revision is no
    witness; these are."""
    import json
    doc = json.loads(etcd_doc(E.addr, "/refit")[0])
    m = [(x["latest_version"], x["installed_version"]) for x in doc["models"]
         if x["name"] == "m"]
    return m, [(r["id"], r["version"], r["state"]) for r in doc["refits"]]


def etcdctl(addr, *a, data=None):
    return subprocess.run([shutil.which("etcdctl"), "--endpoints", addr, *a], input=data,
                          capture_output=True, timeout=20, check=True,
                          env=dict(os.environ, ETCDCTL_API="3")).stdout


def etcd_kvs(addr, prefix):
    """{key: value} under prefix (bytes, exact: etcdctl -w json)."""
    import json
    out = json.loads(etcdctl(addr, "get", prefix, "--prefix", "-w", "json"))
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
            for kv in out.get("kvs", [])}


def etcd_doc(addr, prefix):
    """The state document under prefix: (its bytes, the manifest's chunk
    keys in order, the manifest's bytes); a plain document: no chunks."""
    kvs = etcd_kvs(addr, prefix + "/")
    man = kvs[prefix + "/state"]
    if man.startswith(b"{"):
        return man, [], man
    lines = man.decode().split("\n")
    assert lines[0] == "refit-state-chunks 1", lines[0]
    keys = [f"{prefix}/chunks/{ln.split()[1]}" for ln in lines if ln.startswith("chunk ")]
    return b"".join(kvs[k] for k in keys), keys, man


def key_deleted():
    """The leader's election key deleted (as when its lease expires) while a
    change arrives: the change is not acknowledged, the leader stops with 75
    (a fenced write refused, or its election thread saw the key gone,
    whichever came first), and /refit/state was not written by it."""
    old = C.wait_leader()
    step()
    before = state_doc()
    out = subprocess.run([shutil.which("etcdctl"), "--endpoints", E.addr, "get",
                          "/refit/election/", "--prefix", "--keys-only"],
                         capture_output=True, text=True, timeout=20,
                         env=dict(os.environ, ETCDCTL_API="3"), check=True).stdout.split()
    mine = [k for k in out if subprocess.run(
        [shutil.which("etcdctl"), "--endpoints", E.addr, "get", k, "--print-value-only"],
        capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"),
        timeout=20).stdout.strip() == C.addrs[old]]
    assert len(mine) == 1, (out, mine)
    subprocess.run([shutil.which("etcdctl"), "--endpoints", E.addr, "del", mine[0]],
                   capture_output=True, env=dict(os.environ, ETCDCTL_API="3"),
                   timeout=20, check=True)
    try:
        r = C.stub(old).TriggerRefit(pb.TriggerRefitRequest(model="m", version=M["v"]),
                                     timeout=5)
        raise AssertionError(f"a deposed leader acknowledged refit {r.refit_id}")
    except grpc.RpcError:
        pass
    rc = C.procs[old].wait(timeout=20)
    assert rc == 75, f"the deposed leader exited {rc}, not 75"
    after = state_doc()
    assert after[1] == before[1], f"refits in etcd changed: {before[1]} -> {after[1]}"
    assert after[0][0][1] == before[0][0][1], (before[0], after[0])
    lead = C.wait_leader(skip=(old,))
    C.start(old)
    M["v"] -= 1
    commit_under(lead)


def latencies():
    FIG["refit latency, state file, best of 3"] = latency(
        "hf", ["--state-file", f"{TMP}/state.json"])
    FIG["refit latency, etcd (one coordinator, leader), best of 3"] = latency(
        "he", ["--state-store", "etcd", "--etcd-endpoints", E.addr, "--etcd-prefix",
               "/refit-latency"])


def publish_resent():
    """A node (ha3, a model of its own: trainer and instance "px") loses its
    Publish (test_lose_publish 1) until it joins again: the refit is FAILED
    on the leader, px holds nothing.  The leader is SIGKILLed: the new one
    loads the decision from etcd and resends it once ha3 joined it; px
    installs v1 byte-exact, with no new refit."""
    lead = C.wait_leader()
    NODES.append(spawn([f"{BUILD}/bin/refitd", "--role", "node", "--listen",
                        f"127.0.0.1:{free_port()}", "--coordinator", ",".join(C.addrs),
                        "--node-id", "ha3", "--ranks", f"{3 * RPN}-{3 * RPN + RPN - 1}",
                        "--heartbeat-ms", "200", "--local-socket", sock(3),
                        "--log-level", "info", "--test-lose-publish", "1"],
                       stderr=open(f"{TMP}/ha3.log", "w")))
    wait_members(lead, 4)
    sh = Shim()
    tr = Client(sh, 3, "pl", "train", write(f"{TMP}/pl-t.json", tensors([3 * RPN], "Shard(0)")))
    assert tr.ok(), tr.first
    px = Client(sh, 3, "pl", "infer", write(f"{TMP}/pl-x.json",
                                            tensors([3 * RPN + 1], "Shard(0)")),
                instance="px", install="double-buffer")
    assert px.ok(), px.first
    st = C.stub(lead)
    st.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="pl", retries=0, retry_backoff_ms=0, catch_up=False)), timeout=5)
    r = st.TriggerRefit(pb.TriggerRefitRequest(model="pl", version=1), timeout=10)
    g = harness.refit_final(st, r.refit_id, 60)
    assert g.state == pb.FAILED and "ha3" in g.failure and "Publish" in g.failure, g
    assert "version=1 " not in px.cmd("state")
    C.procs[lead].send_signal(signal.SIGKILL)
    C.procs[lead].wait()
    out = px.cmd("wait 1 30000")
    assert out.startswith("INSTALLED 1 ") and "mismatches=0" in out, out
    new = C.wait_leader(skip=(lead,))
    assert len(C.stub(new).ListRefits(pb.ListRefitsRequest(model="pl"),
                                      timeout=5).refits) == 1, "a new refit was made"
    C.start(lead)  # back as a standby
    tr.close()
    px.close()


try:
    check(f"etcd ({ETCD_MEMBERS} member(s)), three coordinators, three nodes given all "
          "three, a model", setup)
    if M:
        check("one leader; the standbys answer UNAVAILABLE \"not the leader: ADDR\" "
              "naming it; refitctl follows, members says who leads and what each other "
              "coordinator answers; /metrics refitd_coordinator_leader",
              standbys_name_leader)
        check("refits commit under the leader, byte-exact", first_refit)
        check("leader SIGKILLed: a standby leads, the nodes follow, the next refit "
              "commits byte-exact", leader_killed)
        check("leader SIGKILLed mid-refit (RUNNING): the new leader has it FAILED (not "
              "lost) and refits the version again by itself (retries 2), installed once",
              leader_killed_mid_refit)
        check("leader SIGSTOPped past its lease: another leads; SIGCONTed it changes "
              "nothing and stops (status 75)", leader_stopped)
        if shutil.which("etcdctl"):
            check("the leader's election key deleted while a change arrives: not "
                  "acknowledged, the leader stops (75), etcd's state not written by it",
                  key_deleted)
        check(f"soak: {ha_soak.ROUNDS} refits in a row, the leader SIGKILLed or SIGSTOPped "
              "between Commit and Publish, in-refit, at random and idle: every version "
              "installed once on every instance, byte-exact, never going back; a stopped "
              "old leader woken changes nothing", lambda: ha_soak.soak(sys.modules[__name__]))
        if E.n == 3:
            check("an etcd member SIGKILLed (each coordinator's first endpoint): refits "
                  "commit on the other two; restarted it rejoins; another lost, refits "
                  "commit", etcd_member_lost)
        check("etcd stopped (every member): a change is refused UNAVAILABLE naming etcd, a "
              "standby stops naming the leader after the lease TTL; taken once etcd is back",
              etcd_down)
        check("refit latency: the state file and etcd (figures)", latencies)
        check("etcd keys and bytes (figure)", etcd_size)
        if shutil.which("openssl"):
            check("TLS to etcd (client-cert-auth): another CA, no client certificate, an "
                  "endpoint the certificate does not name: refused naming etcd and TLS, "
                  "never leading; with etcd_tls_*: leads, a refit commits", ha_etcd.etcd_tls)
        check("a Publish lost, the leader SIGKILLed: the new leader resends it from "
              "etcd, installed once, no new refit", publish_resent)
        check("idle coordinators wait on an etcd Watch: under one Range a second at etcd "
              "(polling: 30) (figure)", ha_etcd.watch_idle)
        if shutil.which("etcdctl"):
            check("etcd compacted, then an etcd member restarted: the watches stand again, "
                  "standbys follow a new leader, idle reads stay under one a second",
                  ha_etcd.watch_survives)
        if shutil.which("etcdctl"):
            check("a state over etcd's request limit: stored in chunks, a refit writes a "
                  "few, a restart loads it, an unnamed chunk deleted, a corrupt or missing "
                  "chunk refused naming its key", ha_etcd.big_state)
            check("a plain state document (written before the chunks) in etcd: loads, the "
                  "next save stores it in chunks", ha_etcd.legacy_state)
finally:
    harness.stop_all()
    bad = [(p.args[0], p.args[1:3], p.returncode) for p in harness.PROCS
           if p.returncode not in (0, -9, -15, 75)]
    if bad:
        harness.counts["failed"] += 1
        print(f"FAIL processes exited badly (see {TMP}/*.log): {bad}")
for k, v in FIG.items():
    print(f"     {k}: {v}")
harness.summary("ha")
