#!/usr/bin/python3
"""Data-plane limits end to end, each check on a small cluster of its own
(real daemons on loopback, librefit clients; REFIT_TEST_TRANSPORT=nccl as
in test_dataplane.py): an abort midway (double buffer keeps the old
version, in place marked invalid), a librefit client killed mid-refit, the
relay staging of gather-and-broadcast within the plan's bound, delta
bases evicted for another model's (LRU), and over tcp: delta with room for
only some bases, no data connection before an epoch, a dial stopped by an
abort, the instance lease, a refit that skips unhealthy instances.

Usage: test_dataplane_limits.py BUILD_DIR.  The random layout pairs and the
checks on the six-node cluster: test_dataplane.py.  Prints
"dataplane-limits: N passed, N failed" last; exit status 1 when anything
failed.
"""
import os
import random
import re
import socket
import subprocess
import sys
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-dl-")
from refit.v1 import refit_pb2 as pb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (SPARSE, Client, Cluster, RPN, check, expect_installed,  # noqa: E402
                     handshake, instances_of, start_model, stop, wait_running)

harness.init(BUILD, TMP)


def delta_partial_room():
    """A receiving node with room for some of its bases (delta_base_bytes
    256 KiB of 528 KiB received): it reports the messages it kept none of,
    and the next refit sends those dense, the others encoded, byte-exact."""
    cl = Cluster("dl", 2, node_extra=lambda k: ["--delta-base-bytes", "256KiB"] if k else [])
    t = lambda name, shape, rank: {"name": name, "dtype": "fp32", "shape": shape,  # noqa: E731
                                   "mesh": [rank], "placements": ["Replicate()"]}
    cls = start_model(cl, "dl", [t("a", [64, 64], 0), t("b", [256, 512], 1)],
                      [("i", [t("a", [64, 64], RPN), t("b", [256, 512], RPN + 1)])],
                      random.Random(5), {"i": "in-place"}, extra=["--sparse", str(SPARSE)])
    g1 = cl.refit("dl", 1)
    assert g1.state == pb.COMMITTED and g1.delta_wire_bytes == 0, g1
    expect_installed(cls, 1)
    for c in cls["train"]:
        assert c.cmd("next 2").startswith("READY")
    g = cl.refit("dl", 2, verify=True)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 2)
    print(f"     {g.delta_wire_bytes} bytes delta for {g.delta_dense_bytes} dense, "
          f"{g.dense_wire_bytes} bytes dense (the receiver's lacks)")
    assert g.delta_base_refit == g1.id and 0 < g.delta_wire_bytes < g.delta_dense_bytes / 10, g
    assert g.dense_wire_bytes >= 128 << 10, g
    stop(cls)


def delta_eviction():
    """Two models sent from node 0 to node 1, whose delta_base_bytes (384
    KiB) holds one model's bases (256 KiB): the second model's bases evict
    the idle first's, least recently used, so the active model stays delta;
    the first's next refit is dense (node 1 reported the eviction; node 0
    still holds its sent bases) and keeps bases again (evicting the
    other's), then delta; byte-exact."""
    cl = Cluster("de", 2, node_extra=lambda k: ["--delta-base-bytes",
                                                "384KiB" if k else "64MiB"])
    lay = lambda rank: [{"name": "w", "dtype": "fp32", "shape": [256, 256],  # noqa: E731
                         "mesh": [rank], "placements": ["Replicate()"]}]
    ms = {m: start_model(cl, m, lay(0), [("i", lay(RPN))], random.Random(7),
                         {"i": "in-place"}, extra=["--sparse", str(SPARSE)]) for m in "ab"}
    ver = {"a": 0, "b": 0}

    def refit(m, delta):
        ver[m] += 1
        for c in ms[m]["train"] if ver[m] > 1 else []:
            assert c.cmd(f"next {ver[m]}").startswith("READY")
        g = cl.refit(m, ver[m], verify=True)
        assert g.state == pb.COMMITTED, g.failure
        expect_installed(ms[m], ver[m])
        assert (g.delta_wire_bytes > 0) == delta, (m, ver[m], delta, g)
        if delta:
            assert g.delta_wire_bytes < g.delta_dense_bytes / 10, g
        return g

    refit("b", False)
    refit("b", True)
    refit("a", False)          # b's bases evicted for a's
    for _ in range(2):
        refit("a", True)       # b idle: a stays delta
    refit("b", False)          # b's evicted bases: dense, a's evicted now
    refit("b", True)
    for k in ms.values():
        stop(k)


def relay_staging_bounded():
    """Gather-and-broadcast with relays: each node's entry rank receives its
    node's half of a 32 MiB model and passes on what it does not keep.  The
    staging it holds at once stays within the plan's bound (relay data per
    round, staging_bytes = 4 MiB, a round freed when it is done), not the
    whole relayed volume."""
    cl = Cluster("r", 3, ["--log-level", "info"], ["--staging-bytes", "4MiB"])
    rng = random.Random(5)
    train = [{"name": f"w{k}", "dtype": "fp32", "shape": [1024, 1024], "mesh": [0],
              "placements": ["Replicate()"]} for k in range(8)]
    inf = [{"name": f"w{k}", "dtype": "fp32", "shape": [1024, 1024],
            "mesh": list(range(4, 12)), "placements": ["Shard(0)"]} for k in range(8)]
    cls = start_model(cl, "rl", train, [("i0", inf)], rng, {"i0": "double-buffer"})
    mark = os.path.getsize(cl.log.name)
    g = cl.refit("rl", 1, mode=pb.BROADCAST)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 1)
    stop(cls)
    with open(cl.log.name) as f:
        f.seek(mark)
        peaks = {m[0]: int(m[1]) for m in re.findall(
            r"node (r\d): refit \d+: slice done.*relay staging peak (\d+) bytes", f.read())}
    print(f"     relay staging peak per node: {peaks}")
    assert len(peaks) == 3, peaks
    if harness.TRANSPORT == "nccl":
        # over tcp one node holds all 32 MiB at once today (reported, not
        # this branch's); a grouped slice releases each round's relays
        assert max(peaks.values()) <= 8 << 20, peaks


SLOW = None


def slow_cluster():
    global SLOW
    # small staging: one packed message in flight per node (the cap path)
    SLOW = Cluster("s", 3, ["--test-msg-delay-ms", "30"], ["--staging-bytes", "4MiB"])


def slow_model(name, rng):
    train = [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64], "mesh": [0, 1],
              "placements": ["Shard(0)"]} for k in range(8)]
    inf = lambda ranks: [{"name": f"w{k}", "dtype": "fp32", "shape": [256, 64],  # noqa: E731
                          "mesh": ranks, "placements": ["Shard(1)"]} for k in range(8)]
    return start_model(SLOW, name, train, [("db", inf([4, 5])), ("ip", inf([8, 9]))], rng,
                       {"db": "double-buffer", "ip": "in-place"})


def abort_midway():
    rng = random.Random(3)
    cls = slow_model("slow", rng)
    g = SLOW.refit("slow", 1, chunk=None) if False else SLOW.refit("slow", 1)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 1)
    for c in cls["train"]:
        assert c.cmd("next 2").startswith("READY")
    r = SLOW.stub.TriggerRefit(pb.TriggerRefitRequest(model="slow", version=2), timeout=5)
    wait_running(SLOW, r.refit_id)
    time.sleep(0.1)
    SLOW.stub.AbortRefit(pb.AbortRefitRequest(refit_id=r.refit_id, reason="test"),
                         timeout=5)
    g = SLOW.wait_final(r.refit_id)
    assert g.state == pb.ABORTED, g
    for c in cls["infer"]:
        if c.p.args[c.p.args.index("--instance") + 1] == "db":
            harness.wait_for(lambda: (lambda s: s if "version=1 " in s and "valid=1" in s
                                           else None)(c.cmd("state")),
                                  what="the double-buffered instance to keep v1")
            assert c.cmd("check 1").endswith("mismatches=0")
        else:
            harness.wait_for(lambda: "valid=0" in c.cmd("state"),
                             what="the in-place instance to be marked invalid")
    # the next refit of version 2 installs everything
    g = SLOW.refit("slow", 2)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cls, 2)
    stop(cls)


def client_dies_midway():
    rng = random.Random(4)
    cls = slow_model("die", rng)
    r = SLOW.stub.TriggerRefit(pb.TriggerRefitRequest(model="die", version=1), timeout=5)
    wait_running(SLOW, r.refit_id)
    victim = cls["infer"][0]
    victim.p.kill()
    victim.p.wait()
    g = SLOW.wait_final(r.refit_id)
    # killed while its node's slice ran ("went away"), or before that slice
    # started (the node had already dropped it): both name the cause
    assert g.state == pb.FAILED and ("went away" in g.failure or
                                     "no librefit client registered" in g.failure), g
    # the daemons still serve: a new client registers and the refit runs
    others = [c for c in cls["infer"] if c is not victim]
    inst = victim.p.args[victim.p.args.index("--instance") + 1]
    lay = victim.p.args[victim.p.args.index("--layouts") + 1]
    node = int(victim.p.args[victim.p.args.index("--socket") + 1][-7])
    again = Client(SLOW, node, "die", "infer", lay, instance=inst,
                   install="double-buffer" if inst == "db" else "in-place")
    assert again.ok(), again.first
    g = SLOW.refit("die", 1)
    assert g.state == pb.COMMITTED, g.failure
    cls["infer"] = others + [again]
    expect_installed(cls, 1)
    stop(cls)


def no_epoch_no_connection():
    """Issue 12, item 4: before its first PrepareEpoch a node accepts no data
    connection, not even one for epoch 0 with an empty token."""
    cl = Cluster("z", 1)
    ep = cl.stub.ListMembers(pb.ListMembersRequest(), timeout=5).members[0].data_endpoint
    host, port = ep.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(handshake(0, b""))
    assert s.recv(1) == b"\x01", "epoch 0 with an empty token was accepted"
    s.close()


def dial_honours_abort():
    """Issue 12, item 4: a node dialing a peer that never answers the
    handshake stops when the refit is aborted (not at its slice deadline)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # accepts (the kernel does), never answers
    cl = Cluster("h", 2, coord_extra=(), extra=())
    # node h1 advertises the black hole as its data endpoint
    cl.nodes[1].terminate()
    cl.nodes[1].wait()
    cl.wait_members(1)
    cl.node_args[1] += ["--data-advertise", "127.0.0.1:%d" % hole.getsockname()[1]]
    cl.restart_node(1)
    cl.wait_members(2)
    rng = random.Random(5)
    train = [{"name": "w", "dtype": "fp32", "shape": [64], "mesh": [0],
              "placements": ["Replicate()"]}]
    inf = [{"name": "w", "dtype": "fp32", "shape": [64], "mesh": [RPN],
            "placements": ["Replicate()"]}]
    cls = start_model(cl, "hole", train, [("i0", inf)], rng, {"i0": "double-buffer"})
    r = cl.stub.TriggerRefit(pb.TriggerRefitRequest(model="hole", version=1), timeout=10)
    hole.settimeout(60)
    conn, _ = hole.accept()  # h0 dialed; its handshake arrives, no answer goes
    conn.settimeout(60)
    got = b""
    while len(got) < 220:  # HS_BYTES
        got += conn.recv(220 - len(got))
    cl.stub.AbortRefit(pb.AbortRefitRequest(refit_id=r.refit_id, reason="test"), timeout=5)
    g = cl.wait_final(r.refit_id, timeout=60)
    assert g.state == pb.ABORTED, g
    # h0 gives up the dial now, not at its slice deadline (600 s)
    assert conn.recv(1) == b"", "the dialing node kept waiting"
    conn.close()
    stop(cls)
    hole.close()


def instance_b_lost(cl, model, seed):
    """model, a [16, 4] weight trained on ranks 0-1, with double-buffered
    instances a (node 1) and b (node 2), refitted to version 1; then b's node
    is killed.  The clients, as start_model returns them."""
    rng = random.Random(seed)
    w = lambda ranks: [{"name": "w", "dtype": "fp32", "shape": [16, 4],  # noqa: E731
                        "mesh": ranks, "placements": ["Shard(0)"]}]
    cls = start_model(cl, model, w([0, 1]), [("a", w([RPN])), ("b", w([2 * RPN]))], rng,
                      {"a": "double-buffer", "b": "double-buffer"})
    g = cl.refit(model, 1)
    assert g.state == pb.COMMITTED, g.failure
    cl.nodes[2].kill()
    cl.nodes[2].wait()
    return cls


def instance_lease():
    """Issue 12, item 3: an instance whose node is gone is dropped after the
    grace period; the other replica goes on being updated."""
    cl = Cluster("g", 3, coord_extra=["--instance-grace-ms", "1000"])
    cls = instance_b_lost(cl, "lease", 34)
    harness.wait_for(lambda: instances_of(cl, "lease") == ["", "a"],
                     what="instance b to be dropped after the grace period")
    for c in cls["train"]:
        assert c.cmd("next 2").startswith("READY")
    g = cl.refit("lease", 2)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed({"infer": [c for c in cls["infer"] if "a" in c.p.args]}, 2)


def skip_unhealthy():
    """Issue 12, item 3: a refit installs on every healthy instance and names
    the ones it skipped; with the strict policy it fails naming them."""
    cl = Cluster("k", 3)
    cls = instance_b_lost(cl, "skip", 35)
    cl.wait_members(2)
    for c in cls["train"]:
        assert c.cmd("next 2").startswith("READY")
    g = cl.refit("skip", 2)
    assert g.state == pb.COMMITTED and list(g.skipped) == ["b"], g
    a = [c for c in cls["infer"] if "a" in c.p.args]
    expect_installed({"infer": a}, 2)
    cl.stub.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
        model="skip", catch_up=True, strict_instances=True)), timeout=5)
    for c in cls["train"]:
        assert c.cmd("next 3").startswith("READY")
    g = cl.refit("skip", 3)
    assert g.state == pb.FAILED and "strict" in g.failure and '"b"' in g.failure, g
    out = subprocess.run([f"{harness.BUILD}/bin/refitctl", "--coordinator", cl.addr,
                          "policy", "skip", "--strict-instances", "off"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out
    g = cl.refit("skip", 3)
    assert g.state == pb.COMMITTED and list(g.skipped) == ["b"], g
    expect_installed({"infer": a}, 3)


try:
    check("delta: two models, room for one's bases: the active one stays delta, the "
          "idle one's evicted bases go dense once, byte-exact", delta_eviction)
    check("gather-and-broadcast: relay staging held at once stays within the "
          "plan's bound", relay_staging_bounded)
    check("slow cluster starts", slow_cluster)
    check("abort midway: double buffer keeps v1, in-place marked invalid", abort_midway)
    check("a librefit client killed mid-refit fails it; daemon keeps serving",
          client_dies_midway)
    if harness.TRANSPORT == "tcp":
        check("delta: a node with room for some of its bases: only the messages it "
              "lacks go dense, byte-exact", delta_partial_room)
        check("no data connection before an epoch is prepared", no_epoch_no_connection)
        check("dialing a peer that never answers stops when the refit is aborted",
              dial_honours_abort)
        check("instance lease: a replica whose node is gone is dropped after the grace",
              instance_lease)
        check("a refit installs on the healthy instances and names the skipped ones; "
              "strict policy", skip_unhealthy)
finally:
    harness.stop_all()
    harness.check_exits()
    harness.report_emu_leaks()
harness.summary("dataplane-limits")
