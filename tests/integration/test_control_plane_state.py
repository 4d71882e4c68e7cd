#!/usr/bin/python3
"""The coordinator's state file and configuration, end to end: each check
starts coordinators of its own (real processes on loopback, called from
Python gRPC and refitctl): a state change durable or refused, the strict
state loader, an old state file loaded and written back the same, a
restart that keeps registrations, config files and flags, the unix
socket's lock.

Usage: test_control_plane_state.py BUILD_DIR.  The checks on one shared
coordinator: test_control_plane.py.  Prints "control-plane-state: N passed,
N failed" last; exit status 1 when anything failed.
"""
import json
import os
import signal
import socket
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
import protostubs  # noqa: E402  (this folder is first on sys.path)
TMP = protostubs.generate("refit-cs-")
import grpc  # noqa: E402
from refit.v1 import refit_pb2 as pb  # noqa: E402
from refit.v1 import refit_pb2_grpc as pbg  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (check, expect_error, free_port, infer_instance,  # noqa: E402
                     layout_to_proto, wait_for)

harness.init(BUILD, TMP)
train = json.load(open("config/examples/train-tp2pp2dp2.json"))["tensors"]
infer = json.load(open("config/examples/infer-tp4x2.json"))["tensors"]


def durable_or_refused():
    """Issue 12, item 6: a change that cannot be written to the state file
    is refused and not made; after a restart the coordinator shows what it
    acknowledged, nothing else."""
    d = os.path.join(TMP, "dur")
    sub = os.path.join(d, "sub")
    os.makedirs(sub)
    state = os.path.join(sub, "state.json")
    ca = f"127.0.0.1:{free_port()}"
    args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", ca,
            "--lease-ttl-ms", "60000", "--state-file", state]
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        ch = grpc.insecure_channel(ca)
        grpc.channel_ready_future(ch).result(timeout=10)
        st = pbg.CoordinatorStub(ch)
        j = st.Join(pb.JoinRequest(node_id="d0", host="127.0.0.1", ranks=[
            pb.RankInfo(rank=0), pb.RankInfo(rank=1), pb.RankInfo(rank=2)]), timeout=5)
        one = {"name": "w", "dtype": "fp32", "shape": [4], "mesh": [0],
               "placements": ["Replicate()"]}
        st.RegisterLayout(pb.RegisterLayoutRequest(member_id=j.member_id, model="d",
                                                   role=pb.TRAIN,
                                                   tensors=[layout_to_proto(one)]), timeout=5)
        one["mesh"] = [1]
        st.RegisterLayout(pb.RegisterLayoutRequest(member_id=j.member_id, model="d",
                                                   role=pb.INFER, instance="a",
                                                   tensors=[layout_to_proto(one)]), timeout=5)
        st.WeightsReady(pb.WeightsReadyRequest(member_id=j.member_id, model="d", version=1),
                        timeout=5)
        st.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model="d", retries=3, retry_backoff_ms=10, catch_up=True)), timeout=5)
        # the state file's directory becomes a file: every write fails (ENOTDIR)
        os.rename(sub, sub + ".away")
        open(sub, "w").close()
        U = grpc.StatusCode.UNAVAILABLE
        expect_error(lambda: st.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model="d", retries=0, catch_up=False)), timeout=5), U, "cannot be made durable")
        expect_error(lambda: st.WeightsReady(pb.WeightsReadyRequest(
            member_id=j.member_id, model="d", version=2), timeout=5), U, "WeightsReady")
        one["mesh"] = [2]
        expect_error(lambda: st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=j.member_id, model="d", role=pb.INFER, instance="b",
            tensors=[layout_to_proto(one)]), timeout=5), U, "RegisterLayout")
        expect_error(lambda: st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=j.member_id, model="new", role=pb.TRAIN,
            tensors=[layout_to_proto(one)]), timeout=5), U, "RegisterLayout")
        expect_error(lambda: st.UnregisterLayout(pb.UnregisterLayoutRequest(
            member_id=j.member_id, model="d", role=pb.INFER, instance="a"), timeout=5),
            U, "UnregisterLayout")
        expect_error(lambda: st.TriggerRefit(pb.TriggerRefitRequest(model="d"), timeout=5),
                     U, "TriggerRefit")
        g = st.GetModel(pb.GetModelRequest(model="d"), timeout=5)
        assert g.latest_version == 1 and g.policy.retries == 3 and g.policy.catch_up, g
        assert sorted(i.instance for i in g.instances) == ["", "a"], g
        assert [m.name for m in st.ListModels(pb.ListModelsRequest(), timeout=5).models] \
            == ["d"]
        assert not st.ListRefits(pb.ListRefitsRequest(), timeout=5).refits
        # writable again: the next change is made and survives a restart
        os.unlink(sub)
        os.rename(sub + ".away", sub)
        st.SetRefitPolicy(pb.SetRefitPolicyRequest(policy=pb.RefitPolicy(
            model="d", retries=5, retry_backoff_ms=10, catch_up=True)), timeout=5)
        ch.close()
        p.terminate()
        p.wait(timeout=10)
        p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        ch = grpc.insecure_channel(ca)
        grpc.channel_ready_future(ch).result(timeout=10)
        st = pbg.CoordinatorStub(ch)
        g = st.GetModel(pb.GetModelRequest(model="d"), timeout=5)
        assert g.latest_version == 1 and g.policy.retries == 5, g
        ch.close()
    finally:
        p.kill()
        p.wait()


def strict_state_loader():
    """Issue 12, item 10: a damaged state file is refused, naming the field,
    not read as zeros (a generation of 0 would let epochs go back)."""
    good = json.load(open(os.path.join(TMP, "dur", "sub", "state.json")))
    assert good["models"][0]["instances"], good

    def variant(fn):
        d = json.loads(json.dumps(good))
        fn(d)
        return d
    cases = [
        (variant(lambda d: d.update(generation="1")), '"generation" must be a whole number'),
        (variant(lambda d: d.update(generation=0)), "generation 0 is outside"),
        (variant(lambda d: d.update(generation=1.5)), '"generation" must be a whole number'),
        (variant(lambda d: d["models"][0].update(latest_version=-1)),
         'model "d": "latest_version" must be a whole number'),
        (variant(lambda d: d["models"][0].update(retries="3")), '"retries" must be'),
        (variant(lambda d: d["models"][0].update(catch_up=1)), '"catch_up" must be'),
        (variant(lambda d: d["models"][0]["instances"].append(
            d["models"][0]["instances"][-1])), "listed twice"),
        (variant(lambda d: d["models"].append(d["models"][0])), 'model "d": listed twice'),
    ]
    bad = os.path.join(TMP, "bad-state.json")
    for doc, msg in cases:
        with open(bad, "w") as f:
            json.dump(doc, f)
        out = subprocess.run([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                              f"127.0.0.1:{free_port()}", "--state-file", bad],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and msg in out.stderr, (msg, out)


def old_state_file():
    """A state file written by the coordinator before its layouts were built
    as a tree (data/state-v1-main.json: refitd at commit 984c45b, a trainer,
    two inference instances with every conversion form, names with quotes
    and UTF-8, one committed refit) loads, and is written back byte for
    byte, but for the generation bumped at start."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                       "state-v1-main.json")
    old = open(src, encoding="utf-8").read()
    gen = json.loads(old)["generation"]
    path = os.path.join(TMP, "old-state.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(old)
    port = free_port()
    proc = subprocess.Popen([f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                             f"127.0.0.1:{port}", "--state-file", path],
                            stderr=subprocess.PIPE, text=True)
    try:
        # written back at start, with the next generation
        wait_for(lambda: json.loads(open(path, encoding="utf-8").read())["generation"] ==
                 gen + 1, what="the state file written back")
        new = open(path, encoding="utf-8").read()
        want = old.replace(f'"generation":{gen},', f'"generation":{gen + 1},', 1)
        assert want != old and new == want, (old, new)
        out = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", f"127.0.0.1:{port}",
                              "--json", "models"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and '"gm"' in out.stdout, out
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()


def config_files():
    refitd = f"{BUILD}/bin/refitd"
    out = subprocess.run([refitd, "--check-config", "config/coordinator.json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out
    eff = json.loads(out.stdout)
    assert eff["lease_ttl_ms"] == 10000 and eff["max_msg_bytes"] == 64 << 20, eff
    out = subprocess.run([refitd, "--check-config", "config/node.json"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["transport"] == "nccl", out
    bad = os.path.join(TMP, "bad.json")
    cases = [
        ('{"role": "coordinator", "lease_ttl": 5}',
         'unknown key "lease_ttl" (did you mean "lease_ttl_ms"?)'),
        ('{"transport": "rdma"}', '"rdma" is not one of tcp|nccl'),
        ('{"staging_bytes": "lots"}', '"lots" is not a size'),
        ('{"heartbeat_ms": 5000, "lease_ttl_ms": 4000}',
         "heartbeat_ms 5000 must be shorter than lease_ttl_ms 4000"),
        ('{"tls_cert": "/x.pem"}', "tls_cert and tls_key go together"),
        ('{"listen": ', "not a JSON object"),
        ('{"role": "node", "ranks": "0-3", "gpu_devices": "0,1"}',
         'must list one CUDA device per rank of "ranks" (4)'),
        # issue 12, item 10
        ('{"role": "coordinator", "staging_bytes": "1MiB"}',
         "staging_bytes 1048576 is smaller than the chunk size 4194304"),
        ('{"role": "coordinator", "listen": "127.0.0.1:99999"}',
         'config key "listen": port 99999 is outside 0 to 65535'),
        ('{"role": "node", "ranks": "0-3", "data_listen": "127.0.0.1:65536"}',
         'config key "data_listen": port 65536 is outside'),
        ('{"role": "node", "ranks": "0-3", "coordinator": "127.0.0.1:0"}',
         'config key "coordinator": port 0 is outside 1 to 65535'),
        ('{"role": "coordinator", "lease_ttl_ms": 5000, "lease_ttl_ms": 9000}',
         'config key "lease_ttl_ms" appears twice'),
        ('{"role": "node", "ranks": "0-3", "node_id": ""}', 'config key "node_id" is empty'),
        ('{"role": "node", "ranks": "0-3,2-5"}', 'lists rank 2 twice'),
    ]
    for text, msg in cases:
        with open(bad, "w") as f:
            f.write(text)
        out = subprocess.run([refitd, "--check-config", bad], capture_output=True, text=True)
        assert out.returncode == 2 and msg in out.stderr, (text, out)
    out = subprocess.run([refitd, "--config", "config/coordinator.json",
                          "--check-config", "config/coordinator.json", "--lease-ttl-ms", "7000"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["lease_ttl_ms"] == 7000, out
    out = subprocess.run([refitd, "--role", "node"], capture_output=True, text=True)
    assert out.returncode == 2 and 'the node role needs "ranks"' in out.stderr, out
    # the GPU libraries: keys, and a set path that does not load is an error
    out = subprocess.run([refitd, "--check-config", "config/node.json", "--cuda-library",
                          "/opt/x/libcudart.so.13", "--gpu-devices", "0-7"],
                         capture_output=True, text=True)
    eff = json.loads(out.stdout) if out.returncode == 0 else {}
    assert eff.get("cuda_library") == "/opt/x/libcudart.so.13", out
    out = subprocess.run([refitd, "--role", "node", "--ranks", "0", "--transport", "nccl",
                          "--listen", "127.0.0.1:0", "--coordinator", "127.0.0.1:1",
                          "--cuda-library", "/nonexistent/libcudart.so.13"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and ('cannot load the CUDA runtime (libcudart) from '
                                    '"/nonexistent/libcudart.so.13" (set by cuda_library)'
                                    in out.stderr or "built without the CUDA" in out.stderr), out


def unix_socket_lock():
    sock = os.path.join(TMP, "coord.sock")
    a = subprocess.Popen([f"{BUILD}/bin/refitd", "--role", "coordinator",
                          "--listen", f"unix:{sock}"], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.exists(sock), what=f"{sock} to exist")
        b = subprocess.run([f"{BUILD}/bin/refitd", "--role", "coordinator",
                            "--listen", f"unix:{sock}"], capture_output=True, text=True,
                           timeout=10)
        assert b.returncode == 1 and "in use by another process" in b.stderr, b
        ctl = subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", f"unix:{sock}",
                              "members"], capture_output=True, text=True)
        assert ctl.returncode == 0 and "0 members" in ctl.stdout, ctl
    finally:
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=10) == 0


def restart_keeps_registrations():
    """SIGKILL a coordinator with a state file; the restarted one still has
    every model, instance, digest and version, and higher epochs."""
    state = os.path.join(TMP, "state", "coord.state")
    os.makedirs(os.path.dirname(state), exist_ok=True)
    p2 = free_port()
    a2 = f"127.0.0.1:{p2}"
    args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", a2,
            "--state-file", state]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    # a "node" that accepts connections and never answers: a refit waits on it
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    mute_ep = f"127.0.0.1:{mute.getsockname()[1]}"
    try:
        ch = grpc.insecure_channel(a2)
        grpc.channel_ready_future(ch).result(timeout=10)
        st = pbg.CoordinatorStub(ch)
        j = st.Join(pb.JoinRequest(node_id="n0", rpc_endpoint=mute_ep,
                                   ranks=[pb.RankInfo(rank=r) for r in range(16)]),
                    timeout=5)
        r = st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=j.member_id, model="m", role=pb.TRAIN,
            tensors=[layout_to_proto(t) for t in train]), timeout=5)
        st.RegisterLayout(pb.RegisterLayoutRequest(
            member_id=j.member_id, model="m", role=pb.INFER, instance="i0",
            tensors=[infer_instance(t, [8, 9, 10, 11]) for t in infer]), timeout=5)
        st.WeightsReady(pb.WeightsReadyRequest(member_id=j.member_id, model="m",
                                               version=3), timeout=5)
        before = st.GetModel(pb.GetModelRequest(model="m"), timeout=5)
        rf = st.TriggerRefit(pb.TriggerRefitRequest(model="m", idempotency_key="x"),
                             timeout=5)
        wait_for(lambda: st.GetRefit(pb.GetRefitRequest(refit_id=rf.refit_id),
                                     timeout=5).state == pb.PREPARING,
                 what="the refit to be PREPARING")
        assert st.GetRefit(pb.GetRefitRequest(refit_id=rf.refit_id),
                           timeout=5).state == pb.PREPARING
        ch.close()
        proc.kill()  # no chance to flush anything
        proc.wait()
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        ch = grpc.insecure_channel(a2)
        grpc.channel_ready_future(ch).result(timeout=10)
        st = pbg.CoordinatorStub(ch)
        after = st.GetModel(pb.GetModelRequest(model="m"), timeout=5)
        assert after.latest_version == 3, after
        assert sorted((i.instance, i.layout_digest) for i in before.instances) == \
            sorted((i.instance, i.layout_digest) for i in after.instances)
        assert any(i.layout_digest == r.layout_digest for i in after.instances)
        lost = st.GetRefit(pb.GetRefitRequest(refit_id=rf.refit_id), timeout=5)
        assert lost.state == pb.FAILED, lost
        assert "coordinator restarted while the refit was PREPARING" in lost.failure, lost
        again = st.TriggerRefit(pb.TriggerRefitRequest(model="m", idempotency_key="x"),
                                timeout=5)
        assert again.existing and again.refit_id == rf.refit_id
        expect_error(lambda: st.Heartbeat(pb.HeartbeatRequest(member_id=j.member_id),
                                          timeout=5), grpc.StatusCode.NOT_FOUND,
                     "join again")
        j2 = st.Join(pb.JoinRequest(node_id="n0", ranks=[pb.RankInfo(rank=r)
                                                         for r in range(16)]), timeout=5)
        assert j2.epoch > j.epoch and j2.member_id > j.member_id, (j, j2)
        e = st.ExplainPlan(pb.ExplainPlanRequest(model="m"), timeout=10)
        assert "reshard speed-up" in e.table
        with open(state, "w") as f:
            f.write('{"version": 7}')
        ch.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        mute.close()
    bad = subprocess.run(args, capture_output=True, text=True, timeout=10)
    assert bad.returncode == 1 and "not a version-1 refit state file" in bad.stderr, bad


try:
    for name, fn in [("durable or refused", durable_or_refused),
                     ("strict state loader", strict_state_loader),
                     ("old state file loads, written back the same", old_state_file),
                     ("config files", config_files),
                     ("unix socket lock", unix_socket_lock),
                     ("restart keeps registrations", restart_keeps_registrations)]:
        check(name, fn)
finally:
    harness.stop_all()
harness.summary("control-plane-state")
