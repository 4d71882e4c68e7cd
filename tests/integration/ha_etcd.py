"""ha_etcd.py - test_ha.py's checks of refit's use of etcd itself (docs/ha.md,
"Tested"), each run by test_ha.py as one check: TLS to an etcd member of its
own (etcd_tls: client-cert-auth, a wrong CA, no client certificate, an
endpoint its certificate does not name); the state in chunks (big_state: an
etcd member of its own with a small request limit; legacy_state: a plain
document on the main cluster's etcd); the coordinators' watches (watch_idle:
idle reads at etcd; watch_survives: etcd compacted and a member restarted).
Uses test_ha's cluster and helpers: init(test_ha's module) first.  The
cluster, leader deaths, etcd member and soak checks stay in test_ha.py and
ha_soak.py.
"""
import os
import shutil
import signal
import subprocess
import time

import grpc
from refit.v1 import refit_pb2 as pb
from refit.v1 import refit_pb2_grpc as pbg
import harness
from harness import Client, free_port, spawn, wait_for, write

t = None  # test_ha's module, set by init()


def init(test):
    """Use test's (test_ha's module's) etcd cluster E, coordinators C, TMP,
    BUILD, FIG and etcd helpers; call before any check here."""
    global t
    t = test


def tls_files(d):
    """By openssl in d: a CA, etcd's server certificate (SAN DNS localhost
    only), a client certificate, and another CA (the wrong one); their paths."""
    os.makedirs(d, exist_ok=True)

    def ossl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("ca", "other-ca"):
        ossl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
             "-subj", f"/CN=refit test etcd {ca}")
    for name, ext in (("server", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth"),
                      ("client", "subjectAltName=DNS:refit-coordinator\n"
                                 "extendedKeyUsage=clientAuth")):
        with open(f"{d}/{name}.ext", "w") as fh:
            fh.write(ext + "\n")
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {k: f"{d}/{k}" for k in ("ca.crt", "other-ca.crt", "server.crt", "server.key",
                                      "client.crt", "client.key")}


def etcd_tls():
    """One etcd member serving TLS only, with --client-cert-auth.  Refused,
    each never leading and logging an error that names etcd and TLS: a
    coordinator given another CA, one given no client certificate, one
    dialling 127.0.0.1 (not a name etcd's certificate carries).  A coordinator
    given the CA, a client certificate and the endpoint by its name
    (localhost) leads; a refit commits, installed byte-exact.  A CA file that
    is not PEM: refitd does not start, naming etcd and the file."""
    f = tls_files(f"{t.TMP}/etcd-tls")
    cport, pport = free_port(), free_port()
    addr, peer = f"127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    etcd = spawn([t.ETCD, "--name", "tls", "--data-dir", f"{t.TMP}/etcd-tls/data",
                  "--listen-client-urls", f"https://{addr}", "--advertise-client-urls",
                  f"https://localhost:{cport}", "--listen-peer-urls", peer,
                  "--initial-advertise-peer-urls", peer, "--initial-cluster", f"tls={peer}",
                  "--cert-file", f["server.crt"], "--key-file", f["server.key"],
                  "--client-cert-auth", "--trusted-ca-file", f["ca.crt"],
                  "--log-level", "warn"], stdout=t.E.log, stderr=t.E.log)
    client = ["--etcd-tls-cert", f["client.crt"], "--etcd-tls-key", f["client.key"]]
    good = ["--state-store", "etcd", "--etcd-endpoints", f"localhost:{cport}",
            "--etcd-tls-ca", f["ca.crt"]] + client
    bad = {"other-ca": good[:5] + [f["other-ca.crt"]] + client,
           "no-cert": good[:6],
           "by-ip": good[:3] + [addr] + good[4:]}
    r = subprocess.run([f"{t.BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                        f"127.0.0.1:{free_port()}"] + good[:5] + [f"{t.TMP}/etcd-tls/server.ext"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "etcd: tls: " in r.stderr and "not PEM" in r.stderr, r
    ok = harness.Cluster("hs", 2, lease_ms=1500, coord_extra=good)
    tr = Client(ok, 0, "ts", "train", write(f"{t.TMP}/tst.json", t.tensors([0, 1], "Shard(0)")))
    assert tr.ok(), tr.first
    ins = Client(ok, 1, "ts", "infer", write(f"{t.TMP}/tsi.json", t.tensors(
        [t.RPN, t.RPN + 1], "Shard(1)")), instance="db", install="double-buffer")
    assert ins.ok(), ins.first
    assert tr.cmd("next 2").startswith("READY")
    g = ok.refit("ts", 2)
    assert g.state == pb.COMMITTED, g.failure
    out = ins.cmd("wait 2 20000")
    assert out.startswith("INSTALLED 2 ") and "mismatches=0" in out, out
    # etcd answers (one leads): each of these is refused by the handshake
    refused = {}
    for k, args in bad.items():
        a = f"127.0.0.1:{free_port()}"
        refused[k] = (a, spawn([f"{t.BUILD}/bin/refitd", "--role", "coordinator", "--listen", a,
                                "--log-level", "info", "--etcd-lease-ttl-ms", str(t.TTL_MS)] +
                               args, stderr=open(f"{t.TMP}/hs-{k}.log", "w")))
    why = {"other-ca": "certificate", "by-ip": "Peer name 127.0.0.1", "no-cert": ""}
    for k, (a, p) in refused.items():
        def said():
            with open(f"{t.TMP}/hs-{k}.log") as fh:
                return [ln for ln in fh if "etcd (TLS): " in ln] or p.poll() is not None
        lines = wait_for(said, 30, f"{k}: an error naming etcd and TLS")
        assert p.poll() is None, f"{k}: exited {p.returncode}"
        print(f"     {k}: {lines[0].strip()[:300]}")
        assert why[k] in lines[0], (k, why[k], lines[0])
        try:
            pbg.CoordinatorStub(grpc.insecure_channel(a)).ListMembers(
                pb.ListMembersRequest(), timeout=2)
            raise AssertionError(f"{k}: a coordinator refused by etcd answered as the leader")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        p.terminate()
    tr.close()
    ins.close()
    etcd.terminate()

BIG_TENSORS = 1200


def etcd_metric(addr, name):
    """A counter from etcd's /metrics (summed over its labels)."""
    import urllib.request
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines()
               if ln.startswith(name + " ") or ln.startswith(name + "{"))


def big_state():
    """A state bigger than etcd's request limit: an etcd member of its own
    with --max-request-bytes 256 KiB; one coordinator (etcd_chunk_bytes
    32 KiB) and a model of BIG_TENSORS tensors on a trainer and an instance:
    registered, a refit commits byte-exact, stored in chunks (none over the
    limit); a refit puts only a few chunks a save (etcd's put count less the
    coordinator's saves, and the bytes etcd received, against the document); the coordinator SIGKILLed and
    started again loads it (the refit is known, the next commits); an
    unnamed chunk left in etcd is deleted by the next leader; a chunk
    corrupted, then one missing: the coordinator refuses to load, naming the
    chunk's key, and leads once they are put back (~16 s, ~30 s under ASan)."""
    limit = 256 * 1024
    cport, pport = free_port(), free_port()
    addr, peer = f"127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    etcd = spawn([t.ETCD, "--name", "big", "--data-dir", f"{t.TMP}/etcd-big",
                  "--listen-client-urls", f"http://{addr}", "--advertise-client-urls",
                  f"http://{addr}", "--listen-peer-urls", peer,
                  "--initial-advertise-peer-urls", peer, "--initial-cluster", f"big={peer}",
                  "--max-request-bytes", str(limit), "--log-level", "warn"],
                 stdout=t.E.log, stderr=t.E.log)
    grpc.channel_ready_future(grpc.insecure_channel(addr)).result(timeout=30)
    mport = free_port()
    cl = harness.Cluster("hb", 2, lease_ms=1500, coord_extra=[
        "--state-store", "etcd", "--etcd-endpoints", addr, "--etcd-prefix", "/big",
        "--etcd-lease-ttl-ms", "1000", "--etcd-chunk-bytes", "32KiB",
        "--metrics-listen", f"127.0.0.1:{mport}"])

    def saves():
        return harness.scrape_metrics(mport).get(("refitd_state_store_duration_seconds_count",
                                                  frozenset({"store": "etcd", "op": "save",
                                                             "outcome": "ok"}.items())), 0)
    big = [{"name": f"layers.{k // 8}.w{k % 8}", "dtype": "fp32", "shape": [8, 8],
            "mesh": [0, 1], "placements": ["Shard(0)"]} for k in range(BIG_TENSORS)]
    tr = Client(cl, 0, "big", "train", write(f"{t.TMP}/bigt.json", big))
    assert tr.ok(), tr.first
    for x in big:
        x["mesh"], x["placements"] = [t.RPN, t.RPN + 1], ["Replicate()"]
    ins = Client(cl, 1, "big", "infer", write(f"{t.TMP}/bigi.json", big), instance="bi",
                 install="double-buffer")
    assert ins.ok(), ins.first

    def refit_ok(v):
        assert tr.cmd(f"next {v}").startswith("READY")
        g = cl.refit("big", v)
        assert g.state == pb.COMMITTED, g.failure
        out = ins.cmd(f"wait {v} 30000")
        assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out
        return g
    refit_ok(2)
    doc, chunks, man = t.etcd_doc(addr, "/big")
    assert len(doc) > limit, f"the state is {len(doc)} bytes, not over etcd's limit {limit}"
    assert len(chunks) > 4, chunks
    kvs = t.etcd_kvs(addr, "/big/")
    assert max(len(kvs[k]) for k in chunks) <= 32 * 1024
    # one refit: etcd's puts (a manifest and the chunks that changed, each
    # save) and the bytes it received, against the document
    puts0, saves0 = etcd_metric(addr, "etcd_mvcc_put_total"), saves()
    rx0 = etcd_metric(addr, "etcd_network_client_grpc_received_bytes_total")
    g = refit_ok(3)
    puts = etcd_metric(addr, "etcd_mvcc_put_total") - puts0
    rx = etcd_metric(addr, "etcd_network_client_grpc_received_bytes_total") - rx0
    n = saves() - saves0
    assert n >= 1 and (puts - n) / n <= len(chunks) / 4, \
        f"a refit: {n} saves put {puts - n:.0f} chunks; the document has {len(chunks)}"
    assert rx < len(doc), f"a refit sent etcd {rx:.0f} bytes, the document is {len(doc)}"
    t.FIG[f"etcd state over etcd's --max-request-bytes {limit // 1024} KiB (a model of "
        f"{BIG_TENSORS} tensors on a trainer and an instance, etcd_chunk_bytes 32 KiB)"] = (
        f"document {len(doc)} bytes in {len(chunks)} chunks, manifest {len(man)} bytes; "
        f"one refit: {n:.0f} saves, {(puts - n) / n:.1f} chunks put a save, etcd received "
        f"{rx / 1024:.0f} KiB ({100 * rx / len(doc):.0f}% of one document)")
    # an unnamed chunk (left by a save cut short): deleted by the next leader
    orphan = "/big/chunks/" + "0" * 64
    t.etcdctl(addr, "put", orphan, "left by a crashed save")
    # a chunk corrupted, then one missing: refused, naming the key
    for pick, how, said in ((1, "corrupt", "is corrupt"), (-1, "missing", "is missing")):
        cl.coord.send_signal(signal.SIGKILL)
        cl.coord.wait()
        doc, chunks, man = t.etcd_doc(addr, "/big")  # as the one that leads left it
        kvs = t.etcd_kvs(addr, "/big/")
        k = chunks[pick]
        if how == "corrupt":
            t.etcdctl(addr, "put", k, data=kvs[k][:-1] + b"x")
        else:
            t.etcdctl(addr, "del", k)
        pos = os.path.getsize(f"{t.TMP}/hb.log")
        cl.coord = spawn(cl.coord_args, stderr=cl.log)

        def refused():
            with open(f"{t.TMP}/hb.log", errors="replace") as fh:
                fh.seek(pos)
                return [ln for ln in fh if "cannot be loaded" in ln]
        lines = wait_for(refused, 30, f"the coordinator refusing a {how} chunk")
        assert f"etcd key {k} " in lines[0] and said in lines[0], lines[0]
        print(f"     {how}: {lines[0].strip()[:240]}")
        assert cl.coord.poll() is None
        try:
            cl.stub.ListMembers(pb.ListMembersRequest(), timeout=2)
            raise AssertionError(f"a coordinator with a {how} chunk leads")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        t.etcdctl(addr, "put", k, data=kvs[k])  # put back: it loads (it retries) and leads
        cl.restart_coord(spawned=True)
    # restarted, it loaded the state: the refit is known, the unnamed chunk
    # gone, and the next refit commits
    assert cl.stub.GetRefit(pb.GetRefitRequest(refit_id=g.id),
                            timeout=5).state == pb.COMMITTED
    wait_for(lambda: orphan not in t.etcd_kvs(addr, "/big/chunks/"), 20,
             "the unnamed chunk deleted by the new leader")
    cl.wait_members(2)
    refit_ok(4)
    tr.close()
    ins.close()
    cl.coord.terminate()
    etcd.terminate()


def legacy_state():
    """A plain state document in PREFIX/state (as written before the chunks;
    here the main cluster's, assembled): a coordinator on that prefix loads it
    (the model, its instances and policy are there), and its next save (a policy
    changed) stores it in chunks: a manifest whose document has the change."""
    import json
    doc = t.etcd_doc(t.E.addr, "/refit")[0]
    assert doc.startswith(b"{")
    t.etcdctl(t.E.addr, "put", "/legacy/state", data=doc)
    cl = harness.Cluster("hl", 0, lease_ms=1500, coord_extra=[
        "--state-store", "etcd", "--etcd-endpoints", t.E.addr, "--etcd-prefix", "/legacy",
        "--etcd-lease-ttl-ms", "1000"])
    was = [x for x in json.loads(doc)["models"] if x["name"] == "m"][0]
    got = cl.stub.GetModel(pb.GetModelRequest(model="m"), timeout=5)
    assert (got.latest_version, len(got.instances), got.policy.retries) == (
        was["latest_version"], len(was["instances"]), was["retries"]), (got, was)
    cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="m", retries=7, retry_backoff_ms=100, catch_up=True)), timeout=5)
    new, chunks, man = t.etcd_doc(t.E.addr, "/legacy")
    assert man.startswith(b"refit-state-chunks 1\n") and chunks, man[:80]
    m = [x for x in json.loads(new)["models"] if x["name"] == "m"]
    assert m and m[0]["retries"] == 7, m
    cl.coord.terminate()

IDLE_S = 3.0


def etcd_ranges():
    """Range calls etcd's members answered so far (their /metrics, on the
    client port: grpc_server_handled_total of KV Range, every code), summed."""
    import urllib.request
    n = 0
    for a in t.E.addrs:
        with urllib.request.urlopen(f"http://{a}/metrics", timeout=10) as r:
            for ln in r.read().decode().splitlines():
                if ln.startswith("grpc_server_handled_total{") and \
                        'grpc_method="Range"' in ln:
                    n += float(ln.rsplit(" ", 1)[1])
    return n


def idle_reads():
    """etcd reads per second by the three coordinators over IDLE_S of no
    change (the nodes heartbeating): etcd's own count of Range calls.
    Polling every 100 ms read 10 a second each."""
    t.C.wait_leader()
    assert all(p.poll() is None for p in t.C.procs), "a coordinator is down"
    # settle: a coordinator restarted by the check before campaigns, and
    # each reads once on that change; up to 5 s for half a second of none
    # (never with polling: then the window is measured anyway)
    end, last = time.time() + 5, etcd_ranges()
    while time.time() < end:
        time.sleep(0.5)
        now = etcd_ranges()
        if now == last:
            break
        last = now
    before, t0 = etcd_ranges(), time.time()
    time.sleep(IDLE_S)  # a window measured, not a condition awaited
    return (etcd_ranges() - before) / (time.time() - t0)


def watch_idle():
    """Idle coordinators (a leader, two standbys) read etcd well under once a
    second: they wait on a Watch; polling read 30 times a second."""
    rate = idle_reads()
    t.FIG["etcd reads per second by three idle coordinators (Range calls counted by "
        f"etcd over {IDLE_S:.0f} s)"] = f"{rate:.1f}"
    assert rate < 1.0, f"{rate:.1f} Range calls a second at etcd from idle coordinators " \
        "(polling every 100 ms reads 30)"


def standbys_follow(timeout=30):
    """The leader SIGKILLed: a standby leads, and the other standby names it
    (it learned of the change); the killed one back as a standby."""
    old = t.C.wait_leader()
    t.C.procs[old].send_signal(signal.SIGKILL)
    t.C.procs[old].wait()
    lead = t.C.wait_leader(skip=(old,), timeout=timeout)
    sb = next(k for k in range(3) if k not in (old, lead))

    def named():
        try:
            t.C.stub(sb).ListMembers(pb.ListMembersRequest(), timeout=2)
        except grpc.RpcError as x:
            return t.C.addrs[lead] in (x.details() or "")
    wait_for(named, timeout, f"standby {t.C.addrs[sb]} to name the new leader {t.C.addrs[lead]}")
    t.C.start(old)
    wait_for(lambda: t.C.leader() == lead, 10, "the restarted one a standby")


def watch_survives():
    """etcd compacted to its current revision, then the member every
    coordinator watches first (its first endpoint) restarted: the watches
    are lost and stand again -- a new leader is followed by the standbys,
    and idle coordinators read etcd under once a second again (not the
    fallback's 10 a second each)."""
    import json
    ctl = [shutil.which("etcdctl"), "--endpoints", t.E.addr]
    env = dict(os.environ, ETCDCTL_API="3")
    out = subprocess.run(ctl + ["get", "/refit/state", "-w", "json"], capture_output=True,
                         timeout=20, env=env, check=True).stdout
    rev = json.loads(out)["header"]["revision"]
    subprocess.run(ctl + ["compact", str(rev)], capture_output=True, timeout=20, env=env,
                   check=True)
    standbys_follow()
    t.E.stop([0])
    t.E.start([0])
    standbys_follow()
    rate = idle_reads()
    assert rate < 1.0, f"{rate:.1f} Range calls a second after an etcd member restart: " \
        "the watches did not stand again"
    with open(f"{t.TMP}/coords.log") as fh:
        again = sum("a watch stands again" in ln for ln in fh)
    assert again >= 1, "no coordinator logged its watch standing again"
