"""Shared pieces of the end-to-end tests (test_dataplane.py, test_faults.py):
a coordinator and node daemons as real processes on loopback, refit-client
processes as librefit trainers and instances, random layouts.

init(build, tmp) first; the caller has put the generated refit_pb2 modules
on sys.path.

REFIT_TEST_TRANSPORT=nccl runs the node daemons with the nccl transport on
the CUDA + NCCL emulator (tests/emu, $(BUILD)/emu): each node daemon and
the librefit clients of its node get their own NCCL_HOSTID (a host of the
emulator) with EMU_DEVICES devices, the clients register GPU memory by
CUDA IPC handle (refit-client --cuda), and emu_leaks() reads the
emulator's counters that every process writes at exit.
"""
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

import grpc
from refit.v1 import refit_pb2 as pb
from refit.v1 import refit_pb2_grpc as pbg

BUILD = "build"
TMP = "/tmp"


TRANSPORT = os.environ.get("REFIT_TEST_TRANSPORT", "tcp")
# REFIT_TEST_GPU=1 (tests/gpu/run.sh): nccl on the real GPU and libraries,
# every node daemon its own NCCL_HOSTID on one device (NCCL's socket
# transport between them), REFIT_TEST_RPN ranks per node
GPU_REAL = os.environ.get("REFIT_TEST_GPU") == "1"
EMU_DEVICES = 4
EMU_LIB = None   # the emulator's libraries
EMU_DIR = None   # its shared-memory files, rendezvous and counters (per run)


def init(build, tmp):
    global BUILD, TMP, EMU_LIB, EMU_DIR
    BUILD, TMP = build, tmp
    if TRANSPORT == "nccl" and GPU_REAL:
        pass
    elif TRANSPORT == "nccl":
        EMU_LIB = os.environ.get("REFIT_EMU_LIB") or next(
            (d for d in (f"{build}/emu", f"{os.path.dirname(build.rstrip('/'))}/emu")
             if os.path.exists(f"{d}/libcudart.so.13")), None)
        if EMU_LIB is None:
            raise SystemExit(f"REFIT_TEST_TRANSPORT=nccl: no emulator under {build}/emu "
                             "(make emu)")
        EMU_LIB = os.path.abspath(EMU_LIB)
        EMU_DIR = f"{tmp}/emu"
        os.makedirs(f"{EMU_DIR}/counters", exist_ok=True)
    elif TRANSPORT != "tcp":
        raise SystemExit(f"REFIT_TEST_TRANSPORT={TRANSPORT}: tcp or nccl")


def use_tree_package():
    """Import the refit Python package from this tree (python/) over
    BUILD's librefit.so, after protostubs put the generated refit.v1
    modules on sys.path: those are a namespace package of their own
    (refit/v1 under TMP) and must not shadow it.  Returns the library's
    path (REFIT_LIBRARY is set to it)."""
    lib = os.path.abspath(f"{BUILD}/lib/librefit.so")
    os.environ["REFIT_LIBRARY"] = lib
    if TMP in sys.path:
        sys.path.remove(TMP)
    for m in [m for m in sys.modules if m == "refit" or m.startswith("refit.")]:
        if not m.startswith("refit.v1"):
            del sys.modules[m]
    sys.path.insert(0, os.path.abspath("python"))
    return lib


def host_env(host):
    """The environment of a node daemon or client on emulated host `host`."""
    if TRANSPORT != "nccl":
        return None
    env = dict(os.environ)
    if GPU_REAL:
        env.update({"NCCL_HOSTID": host, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
        return env
    env.update({"NCCL_HOSTID": host, "REFIT_EMU_DEVICES": str(EMU_DEVICES),
                "REFIT_EMU_DIR": EMU_DIR, "REFIT_EMU_COUNTERS": "1",
                "REFIT_CUDA_LIBRARY": f"{EMU_LIB}/libcudart.so.13",
                "REFIT_NCCL_LIBRARY": f"{EMU_LIB}/libnccl.so.2",
                "REFIT_GPU_KERNELS_LIBRARY": f"{EMU_LIB}/libcudart.so.13"})
    return env


def gpu_devices():
    """The devices of a node's ranks: identity on the emulator, all on
    device 0 on one real GPU (one rank per node there)."""
    return ",".join("0" if GPU_REAL else str(i) for i in range(RPN))


def emu_counters():
    """{pid: counters} of every process that has exited (nccl runs)."""
    out = {}
    for f in glob.glob(f"{EMU_DIR}/counters/*.json") if EMU_DIR else []:
        with open(f) as fh:
            try:
                c = json.load(fh)
            except ValueError:
                continue
        out[c["pid"]] = c
    return out


def emu_leaks():
    """What the processes that stopped gracefully (exit 0) left behind:
    communicators, unique ids, IPC mappings, allocations.  Returns
    (problems, summary)."""
    cs = emu_counters()
    graceful = {p.pid: p for p in PROCS if p.returncode == 0}
    problems, seen = [], 0
    tot = {"comms_live": 0, "ids_unconsumed": 0, "ipc_open": 0, "alloc_live": 0,
           "streams_live": 0}
    for pid, p in graceful.items():
        c = cs.get(pid)
        if c is None:
            if p.args[0].endswith(("refitd",)) and "node" in p.args:
                problems.append(f"pid {pid} ({' '.join(p.args[:6])}): no counters written")
            continue
        seen += 1
        alloc = sum(c.get("alloc_live", []))
        for k, v in (("comms_live", c.get("comms_live", 0)),
                     ("ids_unconsumed", c.get("ids_unconsumed", 0)),
                     ("ipc_open", c.get("ipc_open", 0)), ("alloc_live", alloc),
                     ("streams_live", c.get("streams_live", 0))):
            tot[k] += v
            if v:
                problems.append(f"pid {pid} ({' '.join(p.args[:8])}): {k}={v}")
        if c.get("sticky"):
            problems.append(f"pid {pid}: sticky CUDA error: {c['sticky']}")
    summary = (f"emulator counters of {seen} gracefully stopped processes: "
               + ", ".join(f"{k} {v}" for k, v in tot.items()))
    return problems, summary


counts = {"passed": 0, "failed": 0}
PROCS = []
NODES = 6
RPN = int(os.environ.get("REFIT_TEST_RPN", "4"))  # ranks per node
DTYPES = ["bf16", "fp32", "u8", "fp64", "fp16"]
# versions a client steps to change this many elements per million
# (refit-client --sparse): a refit after a committed one of the same plan
# goes as delta (docs/delta.md)
SPARSE = 5000


def check_exits():
    """After stop_all: one failure when a process exited other than with 0
    (stopped), -9 (killed on purpose) or -15 (stopped mid-call): a sanitizer
    abort or a crash."""
    bad = [(p.args[0], p.args[1:3], p.returncode) for p in PROCS
           if p.returncode not in (0, -9, -15)]
    if bad:
        counts["failed"] += 1
        print(f"FAIL processes exited badly (see {TMP}/*.log): {bad}")


def tidy_tmp(tmp, failed):
    """Remove the suite's temporary folder (logs, sockets, files) when nothing
    failed; keep it and say where it is otherwise, or when REFIT_KEEP_TMP is set."""
    if not tmp or not os.path.basename(tmp.rstrip("/")).startswith("refit-"):
        return
    if failed or os.environ.get("REFIT_KEEP_TMP"):
        print(f"     logs and files kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def summary(suite):
    """The suite's last line, "SUITE: N passed, N failed"; exits 1 when any failed.
    The temporary folder given to init goes when nothing failed (tidy_tmp)."""
    tidy_tmp(TMP, counts["failed"])
    print(f"{suite}: {counts['passed']} passed, {counts['failed']} failed")
    sys.exit(1 if counts["failed"] else 0)


def proc_status(pid):
    """(threads, RSS in KiB) of a process, from /proc/PID/status."""
    th = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                th = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return th, rss


def scrape_metrics(port):
    """{(sample name, frozenset(labels)): value} of a daemon's /metrics."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape_plain(port):
    """{name: value} of a daemon's unlabelled samples."""
    return {k[0]: v for k, v in scrape_metrics(port).items() if not k[1]}


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORT_RNG = random.Random()


def free_port():
    """A loopback port free now, below the kernel's ephemeral range: a port
    from bind(0) is in that range, where any outgoing connection (a gRPC
    channel, a data dial) may take it before the daemon binds it (seen as
    "cannot listen ... address in use")."""
    hi = min(_ephemeral_low(), 65536)
    lo = 10000 if hi > 12000 else 1024
    for _ in range(200):
        port = _PORT_RNG.randrange(lo, hi)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        return port
    raise AssertionError(f"no free loopback port in {lo}..{hi - 1}")


def check(name, fn):
    only = os.environ.get("REFIT_ONLY")  # while working: run the checks named so
    if only and not any(w in name for w in only.split("|")):
        return
    t0 = time.time()
    try:
        fn()
        counts["passed"] += 1
        print(f"ok   {name} ({time.time() - t0:.1f} s)")
    except Exception:  # noqa: BLE001 - report every failure and go on
        counts["failed"] += 1
        print(f"FAIL {name}")
        traceback.print_exc()


def wait_for(fn, timeout=30, what="the condition", every=0.02):
    """Poll fn() until it returns something true (returned) or raises nothing
    but timeout seconds have passed (AssertionError naming what).  gRPC
    errors from fn count as "not yet".  The deadline is generous: the
    machine may be busy; nothing here measures speed."""
    end = time.time() + timeout
    last = None
    while True:
        try:
            v = fn()
            if v:
                return v
            last = v
        except grpc.RpcError as e:
            last = e
        if time.time() > end:
            raise AssertionError(f"waited {timeout} s for {what}; last: {last!r}")
        time.sleep(every)


def refit_final(stub, rid, timeout, rpc_timeout=10, every=0.02):
    """Poll refit rid on the coordinator stub until it is final (returned);
    AssertionError after timeout seconds.  gRPC errors are raised."""
    end = time.time() + timeout
    while time.time() < end:
        g = stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=rpc_timeout)
        if g.state in (pb.COMMITTED, pb.FAILED, pb.ABORTED):
            return g
        time.sleep(every)
    raise AssertionError(f"refit {rid} did not finish within {timeout} s")


def wait_running(cl, rid):
    """Poll refit rid on cluster cl until it is RUNNING; its GetRefit answer."""
    return wait_for(
        lambda: (lambda g: g if g.state == pb.RUNNING else None)(
            cl.stub.GetRefit(pb.GetRefitRequest(refit_id=rid), timeout=5)),
        what=f"refit {rid} to run", every=0.005)


def instances_of(cl, model):
    """The instances of model the coordinator of cl shows, sorted ("" first)."""
    return sorted(i.instance for i in cl.stub.GetModel(pb.GetModelRequest(model=model),
                                                       timeout=5).instances)


def handshake(epoch, token, refit=1, node="intruder"):
    """A data connection's handshake as a node sends it (dataplane/wire.h)."""
    return (0x32544652).to_bytes(4, "little") + len(token).to_bytes(4, "little") + \
        epoch.to_bytes(8, "little") + refit.to_bytes(8, "little") + (0).to_bytes(4, "little") + \
        token.ljust(64, b"\0") + node.encode().ljust(128, b"\0")


def layout_to_proto(t):
    """A layout JSON object (DTensor form) as a TensorLayout message."""
    mesh, shape = t["mesh"], []
    m = mesh
    while isinstance(m, list):
        shape.append(len(m))
        m = m[0]
    flat = []

    def walk(x):
        if isinstance(x, list):
            for y in x:
                walk(y)
        else:
            flat.append(x)
    walk(mesh)
    return pb.TensorLayout(name=t["name"], dtype=t["dtype"], shape=t["shape"],
                           mesh_shape=shape, mesh_ranks=flat,
                           placements=t["placements"])


def infer_instance(t, ranks):
    return pb.TensorLayout(name=t["name"], dtype=t["dtype"], shape=t["shape"],
                           mesh_shape=[len(ranks)], mesh_ranks=ranks,
                           placements=[t["placements"][1]])


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    PROCS.append(p)
    return p


class Cluster:
    """A coordinator and n node daemons; node k serves ranks k*RPN..."""

    def __init__(self, name, n, extra=(), coord_extra=(), lease_ms=3000, node_extra=None,
                 env=None, node_env=None, channel=None):
        """node_extra(k): more arguments for node k; env: the environment of
        every daemon (None: this one's); node_env(k): more variables for node k;
        channel(addr): the test's channel to the coordinator (None: plain)."""
        self.name, self.n = name, n
        if TRANSPORT == "nccl":  # info: the tests read what the transport logs
            extra = ["--transport", "nccl", "--gpu-devices", gpu_devices()] + \
                list(extra) + ["--log-level", "info"]
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log = open(f"{TMP}/{name}.log", "w")
        self.coord_args = [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen",
                           self.addr, "--heartbeat-ms", str(max(50, lease_ms // 10)),
                           "--lease-ttl-ms", str(lease_ms), "--log-level", "warn"] + \
            list(coord_extra)
        self.coord = spawn(self.coord_args, stderr=self.log, env=env)
        self.node_args = []
        self.nodes = []
        for k in range(n):
            np_ = free_port()
            ranks = f"{k * RPN}-{k * RPN + RPN - 1}"
            self.node_args.append(
                [f"{BUILD}/bin/refitd", "--role", "node", "--listen",
                 f"127.0.0.1:{np_}", "--coordinator", self.addr, "--node-id",
                 f"{name}{k}", "--ranks", ranks, "--heartbeat-ms", "300",
                 "--local-socket", self.sock(k), "--log-level", "warn"] + list(extra) +
                list(node_extra(k) if node_extra else ()))
            nenv = host_env(self.host(k)) or env
            if node_env:
                nenv = dict(nenv or os.environ, **node_env(k))
            self.nodes.append(spawn(self.node_args[k], stderr=self.log, env=nenv))
        self.ch = (channel or grpc.insecure_channel)(self.addr)
        grpc.channel_ready_future(self.ch).result(timeout=10)
        self.stub = pbg.CoordinatorStub(self.ch)
        self.wait_members(n)

    def wait_members(self, n, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            try:
                mem = self.stub.ListMembers(pb.ListMembersRequest(), timeout=5)
                if len(mem.members) == n:
                    return mem
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: {n} nodes did not join")

    def restart_node(self, k):
        """Start node k again (after it was killed), same address and socket."""
        self.nodes[k] = spawn(self.node_args[k], stderr=self.log,
                              env=host_env(self.host(k)))
        return self.nodes[k]

    def host(self, k):
        """Node k's host (NCCL_HOSTID) on the emulator."""
        return f"{self.name}{k}"

    def restart_coord(self, spawned=False):
        if not spawned:
            self.coord = spawn(self.coord_args, stderr=self.log)
        self.ch.close()
        self.ch = grpc.insecure_channel(self.addr, options=[
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500)])
        self.stub = pbg.CoordinatorStub(self.ch)
        end = time.time() + 30
        while True:
            try:
                self.stub.ListMembers(pb.ListMembersRequest(), timeout=0.3)
                return
            except grpc.RpcError:
                if time.time() > end:
                    raise
                time.sleep(0.05)

    def sock(self, k):
        return f"{TMP}/{self.name}{k}.local"

    def node_of(self, rank):
        return rank // RPN

    def refit(self, model, version, mode=pb.RESHARD, verify=False, corrupt=0,
              timeout=120):
        r = self.stub.TriggerRefit(pb.TriggerRefitRequest(
            model=model, version=version, mode=mode, verify=verify,
            test_corrupt_msg=corrupt), timeout=10)
        return self.wait_final(r.refit_id, timeout)

    def wait_final(self, rid, timeout=120):
        return refit_final(self.stub, rid, timeout)


class Client:
    """One refit-client process, driven over its stdin/stdout."""

    def __init__(self, cl, node, model, role, layouts, instance="", install=None,
                 pad=0, version=1, istride=1, extra=(), visible=None, wait=True):
        """visible (nccl on the emulator): the client runs with
        CUDA_VISIBLE_DEVICES = visible, its ranks on the devices of the node's
        ranks as it numbers them.  wait=False: return once started, its first
        line (registered or not) read at the first use of first or ok()."""
        args = [f"{BUILD}/bin/refit-client", "--socket", cl.sock(node), "--model", model,
                "--role", role, "--layouts", layouts, "--timeout-ms", "30000"] + list(extra)
        env = host_env(cl.host(node)) if TRANSPORT == "nccl" else None
        if TRANSPORT == "nccl" and visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in visible)
            args += ["--cuda", "--gpu-devices",
                     ",".join(str(visible.index(d)) for d in range(RPN))]
        elif TRANSPORT == "nccl":
            args += ["--cuda", "--gpu-devices", gpu_devices()]
        if istride != 1:
            args += ["--istride", str(istride)]
        if instance:
            args += ["--instance", instance]
        if install:
            args += ["--install", install]
        if pad:
            args += ["--pad", str(pad)]
        if version != 1:
            args += ["--version", str(version)]
        self.p = spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, bufsize=1, env=env)
        self._first = None
        if wait:
            self._first = self.p.stdout.readline().strip()

    @property
    def first(self):
        if self._first is None:
            self._first = self.p.stdout.readline().strip()
        return self._first

    def ok(self):
        return self.first.startswith(("READY", "REGISTERED"))

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        assert out, f"client died: {self.p.stderr.read()}"
        return out

    def close(self, wait=True):
        """Tell the client to quit (once), and wait for it unless wait is False."""
        if self.p.poll() is None:
            try:
                if not self.p.stdin.closed:
                    self.p.stdin.write("quit\n")
                    self.p.stdin.close()
            except BrokenPipeError:
                pass
            if not wait:
                return
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()


# ---- memory passed to a node (memfds over its memory socket) -------------------

SEALS = 0x0002 | 0x0004 | 0x0001  # F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL


def memfd(name, size, seals=SEALS):
    import fcntl
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def mem_pass(sock, segs):
    """Pass {name: fd} over the node's memory socket (sock + ".mem").
    Returns (the connection, keep it open; the key); raises MemRefused."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(sock + ".mem")
    key = 0
    for name, fd in segs.items():
        socket.send_fds(s, [name.encode()], [fd])
        r = s.recv(1024)
        if r[:1] != b"\0":
            s.close()
            raise MemRefused(r[1:].decode(errors="replace"))
        key = int.from_bytes(r[1:9], "little")
    return s, key


class MemRefused(Exception):
    pass


# ---- random layouts ----------------------------------------------------------

def dtensor(name, dt, shape, ranks, rng, strided=True):
    """A DTensor layout over a 1-D or 2-D mesh of the given ranks."""
    n = len(ranks)
    if n >= 4 and n % 2 == 0 and rng.random() < 0.5:
        mesh = [ranks[:n // 2], ranks[n // 2:]]
        ndm = 2
    else:
        mesh = list(ranks)
        ndm = 1
    pl = []
    for _ in range(ndm):
        c = rng.random()
        d = rng.randrange(len(shape))
        if c < 0.3:
            pl.append("Replicate()")
        elif c < 0.85 or not strided:
            pl.append(f"Shard({d})")
        else:
            pl.append(f"_StridedShard(dim={d}, split_factor=2)")
    if ndm == 2 and pl[1].startswith("_Strided"):
        pl[1] = "Replicate()"  # strided shards come before the shard they pair with
    return {"name": name, "dtype": dt, "shape": shape, "mesh": mesh, "placements": pl}


def explicit(name, dt, shape, ranks, rng, cover=True):
    """Boxes along dim 0, uneven, some ranks holding several, maybe replicated."""
    cuts = sorted(set([0, shape[0]] + [rng.randrange(1, shape[0]) for _ in range(
        rng.randrange(0, 4))] if shape[0] > 1 else [0, shape[0]]))
    shards = []
    for a, b in zip(cuts, cuts[1:]):
        for r in rng.sample(ranks, min(len(ranks), rng.choice([1, 1, 2]))):
            shards.append({"rank": r, "offset": [a] + [0] * (len(shape) - 1),
                           "size": [b - a] + shape[1:]})
    return {"name": name, "dtype": dt, "shape": shape, "shards": shards}


def rand_pair(i, rng, total_ranks):
    """(trainer layouts, [(instance, layouts)]) for pair i."""
    kind = i % 5
    if kind == 3:
        specs = [([rng.randrange(1, 9)], rng.choice(DTYPES)) for _ in range(40)]
    elif kind == 4:
        specs = [([512, 2048 + rng.randrange(64)], "fp32")]  # ~4 MiB: chunked
    else:
        specs = [([rng.randrange(1, 40) for _ in range(rng.randrange(1, 4))],
                  rng.choice(DTYPES)) for _ in range(rng.randrange(1, 7))]
    all_r = list(range(total_ranks))
    tr = sorted(rng.sample(all_r, rng.randrange(1, 9)))
    ninst = rng.choice([1, 2])
    free = list(all_r)
    rng.shuffle(free)
    insts = []
    for k in range(ninst):
        n = rng.randrange(1, 7)
        insts.append(sorted(free[:n]))
        free = free[n:]
    train, infs = [], [[] for _ in insts]
    for t, (shape, dt) in enumerate(specs):
        name = f"t{t}"
        use_explicit = rng.random() < 0.3
        train.append(explicit(name, dt, shape, tr, rng) if use_explicit
                     else dtensor(name, dt, shape, tr, rng))
        for k, ir in enumerate(insts):
            infs[k].append(explicit(name, dt, shape, ir, rng) if rng.random() < 0.3
                           else dtensor(name, dt, shape, ir, rng))
    return train, [(f"i{k}", infs[k]) for k in range(len(insts))]


def write(path, tensors):
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f)
    return path


def ranks_of(tensors):
    rs = set()
    for t in tensors:
        if "mesh" in t:
            m = t["mesh"]
            for x in (m if isinstance(m[0], int) else [y for row in m for y in row]):
                rs.add(x)
        else:
            rs.update(s["rank"] for s in t["shards"])
    return rs


def start_model(cl, model, train, insts, rng, installs=None, extra=()):
    """Clients for a model on every node its ranks touch; returns them, each
    registered.  They start at once and register in any order, as a job's
    processes do.  extra: more arguments for every client (--sparse PPM)."""
    tp = write(f"{TMP}/{model}-train.json", train)
    clients = {"train": [], "infer": []}
    what = []
    for node in sorted({cl.node_of(r) for r in ranks_of(train)}):
        clients["train"].append(Client(cl, node, model, "train", tp, extra=extra,
                                       wait=False))
        what.append(f"trainer on node {node}")
    for k, (iname, tensors) in enumerate(insts):
        ip = write(f"{TMP}/{model}-{iname}.json", tensors)
        for node in sorted({cl.node_of(r) for r in ranks_of(tensors)}):
            inst = (installs or {}).get(iname) or rng.choice(["double-buffer", "in-place"])
            clients["infer"].append(Client(cl, node, model, "infer", ip, instance=iname,
                                           install=inst, pad=rng.choice([0, 0, 3]),
                                           istride=rng.choice([1, 1, 1, 2]), extra=extra,
                                           wait=False))
            what.append(f"{iname} on node {node}")
    for c, w in zip(clients["train"] + clients["infer"], what):
        assert c.ok(), f"{model}: {w}: {c.first} {c.p.stderr.read()}"
    return clients


def expect_installed(clients, version):
    for c in clients["infer"]:
        out = c.cmd(f"wait {version} 20000")
        assert out.startswith(f"INSTALLED {version} ") and "mismatches=0" in out, out


def reshard_layouts(rpn, count=3, shape=(64, 32)):
    """count fp32 tensors w0..: the trainer on ranks 0..rpn-1 sharded on dim 0,
    one instance i0 on ranks rpn..2*rpn-1 sharded on dim 1 (a real reshard)."""
    def lay(ranks, place):
        return [{"name": f"w{k}", "dtype": "fp32", "shape": list(shape), "mesh": ranks,
                 "placements": [place]} for k in range(count)]
    return (lay(list(range(rpn)), "Shard(0)"),
            [("i0", lay(list(range(rpn, 2 * rpn)), "Shard(1)"))])


def step_and_refit(cl, model, version, name="lm", timeout=120):
    """The trainer (model["clients"]) steps to version (after 1), the refit of
    model name commits and every instance installs it byte-exact; records
    model["version"] and returns the refit."""
    cs = model["clients"]
    if version > 1:
        out = cs["train"][0].cmd(f"next {version}")
        assert out.startswith("READY"), out
    g = cl.refit(name, version, timeout=timeout)
    assert g.state == pb.COMMITTED, g.failure
    expect_installed(cs, version)
    model["version"] = version
    return g


def stop(clients):
    """Every client told to quit first, then each waited for."""
    for c in clients["train"] + clients["infer"]:
        c.close(wait=False)
    for c in clients["train"] + clients["infer"]:
        c.close()




def node_spawn_args(cl, node_id, ranks):
    """An extra node daemon for cluster cl (same transport as its nodes)."""
    args = [f"{BUILD}/bin/refitd", "--role", "node", "--listen",
            f"127.0.0.1:{free_port()}", "--coordinator", cl.addr, "--node-id", node_id,
            "--ranks", ranks, "--heartbeat-ms", "100", "--local-socket",
            f"{TMP}/{node_id}.local", "--log-level", "warn"]
    if TRANSPORT == "nccl":
        n = int(ranks.split("-")[1]) - int(ranks.split("-")[0]) + 1 if "-" in ranks else 1
        args += ["--transport", "nccl", "--log-level", "info", "--gpu-devices",
                 ",".join("0" if GPU_REAL else str(i) for i in range(n))]
    return args


def report_emu_leaks():
    """After a suite on the emulator: count a failure per leak found."""
    if TRANSPORT != "nccl" or GPU_REAL:
        return
    problems, summary = emu_leaks()
    print(f"     {summary}")
    if problems:
        counts["failed"] += 1
        print("FAIL the emulator's counters show leaks:\n     " + "\n     ".join(problems))
    else:
        counts["passed"] += 1
        print("ok   no leaked communicators, unique ids, IPC mappings, allocations or "
              "streams in gracefully stopped processes")


def stop_all():
    """SIGTERM every process started here (reverse order), then wait."""
    for p in reversed(PROCS):
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.send_signal(signal.SIGTERM)
    for p in PROCS:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def expect_error(fn, code, text):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"{e.code()} != {code}: {e.details()}"
        assert text in e.details(), f"{text!r} not in {e.details()!r}"
        return e.details()
    raise AssertionError(f"no error, expected {code}")


def make_tiny_llama(d, py, env):
    """A tiny bf16 Llama (random weights, seed 0) and a word-level tokenizer
    saved in d, made by py (a venv's python with transformers) under env."""
    code = f"""
import torch, transformers
from tokenizers import Tokenizer, models, pre_tokenizers
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=1024, tie_word_embeddings=False, torch_dtype="bfloat16")
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained({d!r})
vocab = {{f"t{{i}}": i for i in range(512)}}
tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
tk.pre_tokenizer = pre_tokenizers.Whitespace()
transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", bos_token="t1",
    eos_token="t2").save_pretrained({d!r})
"""
    subprocess.run([py, "-c", code], check=True, env=env, capture_output=True)
