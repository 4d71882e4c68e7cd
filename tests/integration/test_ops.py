#!/usr/bin/python3
"""Operations end to end (docs/operations.md): a coordinator and two node
daemons as real processes on loopback (harness.py), each with a Prometheus
endpoint (--metrics-listen) and JSON logs (--log-format json).

 - /metrics scraped and parsed with prometheus_client's parser and checked
   by `promtool check metrics` (skipped, saying so, only where promtool is
   missing); a committed refit moves the phase histograms by one each,
   counts its outcome once and its plan's bytes by link class (their sum
   equals the bytes the nodes moved, and the network share covers every
   byte the instance needed from another node); a failed refit (verify
   catching an injected corruption) counts once, with its cause; node
   gauges (clients by role, epoch) follow the node's state
 - grpc.health.v1.Health/Check (messages encoded by hand: this Python has
   no grpc_health): SERVING on the coordinator and a joined node,
   NOT_SERVING once the node is drained, NOT_FOUND for an unknown service,
   Watch UNIMPLEMENTED
 - the systemd watchdog: with a fake $NOTIFY_SOCKET (a datagram socket
   here) and WATCHDOG_USEC, READY=1 then WATCHDOG=1 pings at half the
   interval, STOPPING=1 at SIGTERM; none when WATCHDOG_PID names another
   process; WatchdogSec= in both units
 - every log line of every daemon parses as one JSON object with time,
   level, subsystem, node, epoch, refit, message; refit and node set
   where known
 - bad metrics_listen / log_format values are refused naming the key

Usage: test_ops.py BUILD_DIR.  Prints "ops: N passed, N failed" last.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-ops-")
import grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import RPN, Cluster, check, free_port, spawn, start_model, stop, wait_for  # noqa: E402

harness.init(BUILD, TMP)
JSONLOG = ["--log-format", "json", "--log-level", "info"]
MPORT = {}


def node_extra(k):
    MPORT[k] = free_port()
    return ["--metrics-listen", f"127.0.0.1:{MPORT[k]}"] + JSONLOG


MPORT["coord"] = free_port()
CL = Cluster("ops", 2, coord_extra=["--metrics-listen", f"127.0.0.1:{MPORT['coord']}"] +
             JSONLOG, node_extra=node_extra)


def scrape_text(who):
    with urllib.request.urlopen(f"http://127.0.0.1:{MPORT[who]}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain"), r
        return r.read().decode()


def scrape(who):
    """{(sample name, frozenset(labels)): value} of one daemon, parsed."""
    out = {}
    for fam in text_string_to_metric_families(scrape_text(who)):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def promtool(text, who):
    if shutil.which("promtool") is None:
        print(f"     SKIP promtool check metrics ({who}): promtool is not installed "
              "(Debian package prometheus)")
        return
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True)
    assert r.returncode == 0, f"promtool on {who}: {r.stdout}{r.stderr}"


def layouts():
    t = list(range(RPN))
    i = list(range(RPN, 2 * RPN))
    train = [{"name": "w", "dtype": "fp32", "shape": [64, 32], "mesh": t,
              "placements": ["Shard(0)"]},
             {"name": "b", "dtype": "bf16", "shape": [33], "mesh": t,
              "placements": ["Replicate()"]}]
    inst = [{"name": "w", "dtype": "fp32", "shape": [64, 32], "mesh": i,
             "placements": ["Shard(1)"]},
            {"name": "b", "dtype": "bf16", "shape": [33], "mesh": i,
             "placements": ["Shard(0)"]}]
    return train, [("i0", inst)]


PHASES = ("planning", "preparing", "running", "committing")
STATE = {}


def metrics_refit():
    train, insts = layouts()
    clients = start_model(CL, "m", train, insts, random.Random(7),
                          installs={"i0": "double-buffer"})
    STATE["clients"] = clients
    before = scrape("coord")
    g = CL.refit("m", 1)
    assert g.state == pb.COMMITTED, g.failure
    STATE["rid"] = g.id
    text = scrape_text("coord")
    promtool(text, "coordinator")
    after = scrape("coord")
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}

    def dv(name, **labels):
        return d.get((name, frozenset(labels.items())), 0.0)

    assert dv("refitd_refits_total", outcome="committed") == 1, d
    assert dv("refitd_refit_duration_seconds_count", outcome="committed") == 1
    for ph in PHASES:
        assert dv("refitd_refit_phase_duration_seconds_count", phase=ph) == 1, (ph, d)
        assert dv("refitd_refit_phase_duration_seconds_bucket", phase=ph, le="+Inf") == 1
    links = {ln: dv("refitd_refit_bytes_total", link=ln) for ln in ("local", "nvlink",
                                                                      "network")}
    print(f"     plan bytes by link: {links}; nodes moved {g.bytes}")
    assert sum(links.values()) == g.bytes, (links, g.bytes)
    # every byte the instance needs is on the other node (its own domain): the
    # plan moves each once, over the network
    need = 64 * 32 * 4 + 33 * 2
    assert links == {"local": 0, "nvlink": 0, "network": need}, links
    assert dv("refitd_rpc_duration_seconds_count", method="TriggerRefit", code="OK") == 1, d
    epoch = CL.stub.ListMembers(pb.ListMembersRequest(), timeout=10).epoch
    STATE["epoch"] = epoch
    # gauges follow within a refresh (once a second)
    wait_for(lambda: val(scrape("coord"), "refitd_members") == 2, 30, "refitd_members == 2")
    wait_for(lambda: val(scrape("coord"), "refitd_epoch") == epoch, 30, "refitd_epoch")
    # scraping again counts nothing again
    again = scrape("coord")
    assert val(again, "refitd_refits_total", outcome="committed") == \
        val(after, "refitd_refits_total", outcome="committed")
    # nodes: clients by role, the epoch they were told, RPCs they served
    for k, role in ((0, "train"), (1, "infer")):
        wait_for(lambda: val(scrape(k), "refitd_clients", role=role) == 1, 30,
                 f"node {k}: refitd_clients{{role={role}}} == 1")
        wait_for(lambda: val(scrape(k), "refitd_epoch") == epoch, 30, f"node {k}: epoch")
        s = scrape(k)
        assert val(s, "refitd_rpc_duration_seconds_count", method="RunSlice", code="OK") >= 1
        promtool(scrape_text(k), f"node {k}")


def ctl(*args):
    return subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", CL.addr] + list(args),
                          capture_output=True, text=True, timeout=30)


def delta_refits():
    """docs/delta.md: a second refit of the same plan sends changed bytes only
    (versions change 0.5 % of the elements), counted on the sending node and
    shown by refitctl status; refitctl policy --delta off makes refits dense
    and keeps no bases, auto brings delta back after one dense refit."""
    train, insts = layouts()
    train[0]["shape"] = insts[0][1][0]["shape"] = [256, 256]
    clients = start_model(CL, "d", train, insts, random.Random(8),
                          installs={"i0": "in-place"}, extra=["--sparse", "5000"])
    before = scrape(0)

    def step(v, delta):
        if v > 1:
            for c in clients["train"]:
                assert c.cmd(f"next {v}").startswith("READY")
        g = CL.refit("d", v, verify=True)
        assert g.state == pb.COMMITTED, g.failure
        for c in clients["infer"]:
            out = c.cmd(f"wait {v} 20000")
            assert out.startswith(f"INSTALLED {v} ") and "mismatches=0" in out, out
        assert (g.delta_wire_bytes > 0) == delta, (v, g)
        return g
    step(1, False)
    g = step(2, True)
    assert g.delta_wire_bytes < g.delta_dense_bytes / 10, g
    out = ctl("status", str(g.id))
    assert out.returncode == 0 and f"{g.delta_wire_bytes} bytes delta for " \
        f"{g.delta_dense_bytes} dense" in out.stdout, out
    js = json.loads(ctl("--json", "status", str(g.id)).stdout)
    assert js["delta_wire_bytes"] == g.delta_wire_bytes, js
    # the sender (node 0 holds the trainer) counted them; its bases are held
    after = scrape(0)
    sent = val(after, "refitd_delta_sent_bytes_total", kind="delta") - \
        val(before, "refitd_delta_sent_bytes_total", kind="delta")
    assert sent == g.delta_wire_bytes, (sent, g)
    assert val(after, "refitd_delta_dense_bytes_total") - \
        val(before, "refitd_delta_dense_bytes_total") == g.delta_dense_bytes
    wait_for(lambda: 0 < val(scrape(0), "refitd_delta_base_bytes", where="host") <=
             val(scrape(0), "refitd_delta_base_limit_bytes", where="host"), 30,
             "delta bases held")
    assert ("refitd_delta_base_evictions_total", frozenset({("where", "gpu")})) in after
    out = ctl("--json", "policy", "d", "--delta", "off")
    assert out.returncode == 0 and json.loads(out.stdout)["policy"]["delta"] == "off", out
    g = step(3, False)
    assert g.dense_wire_bytes >= g.bytes > 0, g  # dense, counted
    out = ctl("policy", "d", "--delta", "sometimes")
    assert out.returncode != 0 and "--delta takes auto or off" in out.stderr, out
    assert ctl("policy", "d", "--delta", "auto").returncode == 0
    step(4, False)   # delta off kept no bases
    step(5, True)
    stop(clients)


def metrics_failed_refit():
    before = scrape("coord")
    g = CL.refit("m", 1, verify=True, corrupt=1)
    assert g.state == pb.FAILED, g
    after = scrape("coord")
    for _ in range(3):
        CL.stub.GetRefit(pb.GetRefitRequest(refit_id=g.id), timeout=10)
    later = scrape("coord")
    for s in (after, later):
        assert val(s, "refitd_refits_total", outcome="failed") - \
            val(before, "refitd_refits_total", outcome="failed") == 1, (g.failure, s)
    causes = {dict(k[1]).get("cause"): v - before.get(k, 0.0) for k, v in after.items()
              if k[0] == "refitd_refit_failures_total" and v - before.get(k, 0.0)}
    print(f"     failure: {g.failure[:100]}...; causes counted: {causes}")
    assert causes == {"slice": 1}, causes
    assert val(after, "refitd_refits_total", outcome="committed") == \
        val(before, "refitd_refits_total", outcome="committed")


def health_call(addr, service="", method="Check"):
    ch = grpc.insecure_channel(addr)
    try:
        f = ch.unary_unary(f"/grpc.health.v1.Health/{method}",
                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
        # HealthCheckRequest {string service = 1}; HealthCheckResponse {enum status = 1}
        req = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
        rsp = f(req, timeout=10)
        return {b"": "UNKNOWN", b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING",
                b"\x08\x03": "SERVICE_UNKNOWN"}[rsp]
    finally:
        ch.close()


def node_addr(k):
    a = CL.node_args[k]
    return a[a.index("--listen") + 1]


def health():
    assert health_call(CL.addr) == "SERVING"
    assert health_call(CL.addr, "refit.v1.Coordinator") == "SERVING"
    assert health_call(node_addr(0)) == "SERVING"
    assert health_call(node_addr(1), "refit.v1.Node") == "SERVING"
    for bad in (lambda: health_call(CL.addr, "no.such.Service"),
                lambda: health_call(CL.addr, method="Watch")):
        try:
            bad()
            raise AssertionError("answered")
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED), e
    # an extra node: SERVING once it joined, NOT_SERVING once drained
    port = free_port()
    log = open(f"{TMP}/drained.log", "w")
    spawn([f"{BUILD}/bin/refitd", "--role", "node", "--listen", f"127.0.0.1:{port}",
           "--coordinator", CL.addr, "--node-id", "opsx", "--ranks",
           f"{2 * RPN}-{3 * RPN - 1}", "--heartbeat-ms", "100", "--local-socket",
           f"{TMP}/opsx.local", "--log-level", "warn"], stderr=log)
    addr = f"127.0.0.1:{port}"
    wait_for(lambda: health_call(addr) == "SERVING", 30, "the new node SERVING")
    CL.stub.DrainMember(pb.DrainMemberRequest(node_id="opsx", reason="test"), timeout=10)
    wait_for(lambda: health_call(addr) == "NOT_SERVING", 30, "the drained node NOT_SERVING")
    CL.wait_members(2)


def notify_socket(name):
    path = f"{TMP}/{name}.notify"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(1)
    return s, path


def read_notify(s, until, timeout=30):
    """Datagrams until until(list) is true."""
    got = []
    end = time.time() + timeout
    while time.time() < end and not until(got):
        try:
            got.append(s.recv(4096).decode())
        except socket.timeout:
            pass
    assert until(got), f"waited {timeout} s; got {got}"
    return got


def watchdog():
    for unit in ("systemd/refit-coordinator.service.in", "systemd/refitd.service.in"):
        with open(unit) as f:
            assert re.search(r"^WatchdogSec=\d+s?$", f.read(), re.M), unit
    s, path = notify_socket("wd")
    log = f"{TMP}/wd.log"
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
    p = spawn([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
               f"127.0.0.1:{free_port()}", "--log-level", "info"], env=env,
              stderr=open(log, "w"))
    got = read_notify(s, lambda g: any(m.startswith("READY=1") for m in g) and
                      sum(m == "WATCHDOG=1" for m in g) >= 3)
    assert got[0].startswith("READY=1"), got
    p.send_signal(signal.SIGTERM)
    read_notify(s, lambda g: "STOPPING=1" in g)
    p.wait(timeout=30)
    with open(log) as f:
        text = f.read()
    assert "systemd watchdog: 400 ms, pinging every 200 ms" in text, text
    s.close()
    # WATCHDOG_PID of another process: the interval is not ours, no pings
    s, path = notify_socket("wd2")
    env = dict(env, NOTIFY_SOCKET=path, WATCHDOG_PID="1")
    log2 = f"{TMP}/wd2.log"
    p = spawn([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
               f"127.0.0.1:{free_port()}", "--log-level", "info"], env=env,
              stderr=open(log2, "w"))
    read_notify(s, lambda g: any(m.startswith("READY=1") for m in g))
    p.send_signal(signal.SIGTERM)
    got = read_notify(s, lambda g: "STOPPING=1" in g)
    p.wait(timeout=30)
    assert "WATCHDOG=1" not in got, got
    with open(log2) as f:
        assert "watchdog" not in f.read()
    s.close()


KEYS = {"time", "level", "subsystem", "node", "epoch", "refit", "message"}


def json_logs():
    stop(STATE.get("clients", {"train": [], "infer": []}))
    CL.log.flush()
    with open(f"{TMP}/ops.log", "rb") as f:
        lines = f.read().split(b"\n")
    assert lines[-1] == b"", "the log does not end with a newline"
    objs = []
    for i, raw in enumerate(lines[:-1]):
        o = json.loads(raw.decode("utf-8"))  # every line: one object
        assert isinstance(o, dict) and KEYS <= set(o), (i, raw)
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", o["time"]), o
        assert o["level"] in ("error", "warn", "info", "debug"), o
        objs.append(o)
    assert len(objs) >= 5, objs
    rid = STATE["rid"]
    mine = [o for o in objs if o["refit"] == rid and o["subsystem"] == "coordinator"]
    assert mine and all(o["node"] is None for o in mine), objs[-10:]
    done = [o for o in mine if "COMMITTED" in o["message"]]
    assert len(done) == 1 and done[0]["epoch"] == STATE["epoch"], (done, STATE["epoch"])
    nodes = {o["node"] for o in objs if o["node"] is not None}
    assert {"ops0", "ops1"} <= nodes, nodes


def bad_flags():
    for args, key in ((["--metrics-listen", "nonsense"], "metrics_listen"),
                      (["--metrics-listen", f"127.0.0.1:{MPORT['coord']}"], "metrics_listen"),
                      (["--log-format", "xml"], "log_format")):
        r = subprocess.run([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                            f"127.0.0.1:{free_port()}"] + args, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and key in r.stderr, (args, r.returncode, r.stderr)


try:
    check("metrics: a committed refit moves every phase histogram once, counts once, "
          "bytes by link class = what the nodes moved; promtool; node gauges", metrics_refit)
    check("metrics: a failed refit (verify, injected corruption) counted once with its cause",
          metrics_failed_refit)
    check("delta refits: changed bytes only, counted by the sender, shown by refitctl "
          "status; policy --delta off and auto", delta_refits)
    check("grpc.health.v1.Health/Check: SERVING, NOT_SERVING once drained, unknown service, "
          "no Watch", health)
    check("systemd watchdog: READY, WATCHDOG=1 at half WATCHDOG_USEC, STOPPING; none for "
          "another WATCHDOG_PID; WatchdogSec= in the units", watchdog)
    check("log_format json: every line of coordinator and nodes is one JSON object with "
          "the context", json_logs)
    check("bad metrics_listen / log_format are refused naming the key", bad_flags)
finally:
    harness.stop_all()
    harness.check_exits()
harness.summary("ops")
