#!/usr/bin/python3
"""The emulated-topology testbed (`make testbed`).

"Nodes" are Linux network namespaces joined by veth pairs to a bridge; each
node's link is rate-limited with tc (token bucket, both directions), ranks
inside a node share it and copy among themselves in memory (the NVLink
stand-in: unlimited).  Every node runs its own refitd (tcp backend); the
coordinator and the librefit clients run in the root namespace (clients
reach their node daemon through its unix socket).

A scaled-down MoE model (Megatron-style training layout: 8 ranks on 2
nodes, TP2 x EP4 with an uneven expert count; inference: 4 replicas of TP4,
one per node) is refit at several sizes, reshard and gather-and-broadcast
in the same run, each mode --repeat times in a row (default 3: the first
refit, then the steady state, reported as the median of the later ones;
the nodes keep their data-plane buffers across refits of an epoch).  For
each: wall time, achieved bandwidth as a fraction of the link limit (the cost model's lower bound for these links), the speed-up,
and the cost model's prediction, nominal and calibrated: the calibration
first measures the link's payload rate (one pair, 128 MiB), one
connection's cost (that refit's session open) and the host's pack and
unpack rates (bench-dataplane), and gives all four to the cost model.
Writes build/testbed/results.json and, when gnuplot is there,
build/testbed/time-vs-bytes.png; with --links, how busy every link was per
refit (and build/testbed/links-*.txt, a 100 ms timeline).

Usage: testbed.py BUILD_DIR [--rate-mbit N] [--sizes MiB,MiB,...] [--repeat N]
                  [--chunk SIZE] [--scenarios tp4x4,tp8x2] [--links] [--cc ALGO]
Needs root, ip and tc; prints a skip line and exits 0 otherwise.  Removes
every namespace, link and process it made, also after a failure.
"""
import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("build", nargs="?", default="build")
ap.add_argument("--rate-mbit", type=int, default=1000)
ap.add_argument("--sizes", default="64,128,256")
ap.add_argument("--chunk", default="4MiB")
ap.add_argument("--repeat", type=int, default=3,
                help="refits per mode and size: the first, then the steady state")
ap.add_argument("--scenarios", default="tp4x4,tp8x2",
                help="which inference layouts to run (comma-separated names)")
ap.add_argument("--cc", default="",
                help="TCP congestion control in the nodes' namespaces (default: the "
                     "kernel's default, printed)")
ap.add_argument("--links", action="store_true",
                help="sample every node's link counters during each refit and print "
                     "how busy each link was")
A = ap.parse_args()
BUILD = A.build
TAG = f"rtb{os.getpid() % 100000}"
TMP = tempfile.mkdtemp(prefix="refit-testbed-")
OUT = os.path.join(BUILD, "testbed")
NODES = 6            # train0, train1, infer0..3
RPN = 4              # ranks per node
PROCS = []
MADE = {"ns": [], "links": []}


def sh(*args, ns=None, check=True):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def skip(why):
    print(f"testbed: skipped: {why}")
    sys.exit(0)


def cleanup():
    for p in reversed(PROCS):
        if p.poll() is None:
            p.terminate()
    for p in PROCS:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    for ns in MADE["ns"]:
        sh("ip", "netns", "del", ns, check=False)
    for link in MADE["links"]:
        sh("ip", "link", "del", link, check=False)
    shutil.rmtree(TMP, ignore_errors=True)


def on_signal(sig, frame):
    cleanup()
    sys.exit(1)


# ---- the network ------------------------------------------------------------------

def build_net(rate):
    br = f"{TAG}br"
    sh("ip", "link", "add", br, "type", "bridge")
    MADE["links"].append(br)
    sh("ip", "addr", "add", "10.77.0.1/24", "dev", br)
    sh("ip", "link", "set", br, "up")
    ips = []
    for k in range(NODES):
        ns, host, peer = f"{TAG}n{k}", f"{TAG}h{k}", f"{TAG}p{k}"
        sh("ip", "netns", "add", ns)
        MADE["ns"].append(ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
        MADE["links"].append(host)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "link", "set", host, "master", br)
        sh("ip", "link", "set", host, "up")
        ip = f"10.77.0.{10 + k}"
        sh("ip", "addr", "add", f"{ip}/24", "dev", peer, ns=ns)
        sh("ip", "link", "set", peer, "up", ns=ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        if A.cc:
            sh("sysctl", "-q", f"net.ipv4.tcp_congestion_control={A.cc}", ns=ns)
        # the node's NIC: rate-limited both ways (upload in the namespace,
        # download on the bridge side)
        tbf = ["tbf", "rate", f"{rate}mbit", "burst", "512kb", "latency", "100ms"]
        sh("tc", "qdisc", "add", "dev", peer, "root", *tbf, ns=ns)
        sh("tc", "qdisc", "add", "dev", host, "root", *tbf)
        ips.append(ip)
    return ips


# ---- daemons and clients ------------------------------------------------------------

NAMES = ["train0", "train1", "infer0", "infer1", "infer2", "infer3"]


def start(ips):
    log = open(os.path.join(TMP, "daemons.log"), "w")
    coord = "10.77.0.1:7700"
    # beyond loopback: the daemons share a cluster join token (mode 0600)
    token = os.path.join(TMP, "join.token")
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (os.urandom(16).hex() + "\n").encode())
    os.close(fd)
    PROCS.append(subprocess.Popen(
        [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", coord,
         "--log-level", "warn", "--heartbeat-ms", "500", "--nic", "node",
         "--join-token-file", token], stderr=log))
    for k, ip in enumerate(ips):
        PROCS.append(subprocess.Popen(
            ["ip", "netns", "exec", f"{TAG}n{k}", f"{BUILD}/bin/refitd", "--role", "node",
             "--node-id", NAMES[k], "--ranks", f"{k * RPN}-{k * RPN + RPN - 1}",
             "--listen", f"{ip}:7701", "--coordinator", coord,
             "--data-listen", f"{ip}:0", "--local-socket", f"{TMP}/{NAMES[k]}.sock",
             "--heartbeat-ms", "500", "--log-level", "warn", "--join-token-file", token],
            stderr=log))
    for _ in range(200):
        out = ctl("members").stdout
        if f"{NODES} members" in out:
            return
        time.sleep(0.1)
    raise RuntimeError("testbed: the nodes did not join: " + open(log.name).read()[-2000:])


def ctl(*args):
    return subprocess.run([f"{BUILD}/bin/refitctl", "--coordinator", "10.77.0.1:7700"] +
                          list(args), capture_output=True, text=True, timeout=900)


def client(node, model, role, layouts, inst=""):
    args = [f"{BUILD}/bin/refit-client", "--socket", f"{TMP}/{NAMES[node]}.sock",
            "--model", model, "--role", role, "--layouts", layouts,
            "--timeout-ms", "900000"]
    if inst:
        args += ["--instance", inst, "--install", "double-buffer"]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         bufsize=1)
    PROCS.append(p)
    line = p.stdout.readline()
    if not line.startswith(("READY", "REGISTERED")):
        raise RuntimeError(f"client on {NAMES[node]}: {line}")
    return p


def cmd(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline()


# ---- the model ----------------------------------------------------------------------

def moe(layers, H=1024, F=2048, E=10, Fe=512, V=16000):
    """(name, shape, kind) of a small MoE: kind says how it is sharded."""
    t = [("embed", [V, H], "row"), ("head", [V, H], "row"), ("norm", [H], "rep")]
    for i in range(layers):
        p = f"layers.{i}."
        t += [(p + "qkv", [3 * H, H], "row"), (p + "o", [H, H], "col"),
              (p + "ln1", [H], "rep"), (p + "ln2", [H], "rep"),
              (p + "router", [E, H], "rep"),
              (p + "experts.w13", [E, 2 * Fe, H], "exp_row"),
              (p + "experts.w2", [E, H, Fe], "exp_col"),
              (p + "shared.w13", [2 * F, H], "row"), (p + "shared.w2", [H, F], "col")]
    return t


def bytes_of(tensors):
    n = 0
    for _, shape, _ in tensors:
        k = 2
        for d in shape:
            k *= d
        n += k
    return n


def train_layout(tensors):
    """8 ranks on train0/train1: mesh (EP4 x TP2); dense weights replicated over
    EP, experts split over EP (10 experts on 4 ranks: uneven)."""
    mesh = [[0, 1], [2, 3], [4, 5], [6, 7]]
    out = []
    for name, shape, kind in tensors:
        pl = {"row": ["Replicate()", "Shard(0)"], "col": ["Replicate()", "Shard(1)"],
              "rep": ["Replicate()", "Replicate()"],
              "exp_row": ["Shard(0)", "Shard(1)"], "exp_col": ["Shard(0)", "Shard(2)"]}[kind]
        out.append({"name": name, "dtype": "bf16", "shape": shape, "mesh": mesh,
                    "placements": pl})
    return out


def infer_layout(tensors, ranks):
    """One replica: TP4 over its node's ranks (vLLM style, experts TP-sharded)."""
    out = []
    for name, shape, kind in tensors:
        pl = {"row": "Shard(0)", "col": "Shard(1)", "rep": "Replicate()",
              "exp_row": "Shard(1)", "exp_col": "Shard(2)"}[kind]
        out.append({"name": name, "dtype": "bf16", "shape": shape, "mesh": ranks,
                    "placements": [pl]})
    return out


def write(path, tensors):
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f)
    return path


def topology(rate, name="topology", host=None):
    """The cost model's picture of this testbed: one NIC per node, shared;
    rate in Mbit/s (nominal, or calibrated); host: the measured pack_gbps,
    unpack_gbps and connection_us (calibrated), else not modelled."""
    ranks = [{"rank": r, "node": NAMES[r // RPN]} for r in range(NODES * RPN)]
    path = os.path.join(TMP, f"{name}.json")
    topo = {"ranks": ranks, "nic": "node", "network_gbps": rate / 1000,
            "nvlink_gbps": 400, "latency_us": {"network": 50, "nvlink": 5}}
    topo.update(host or {})
    with open(path, "w") as f:
        json.dump(topo, f)
    return path


UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def secs(text, label):
    m = re.search(label + r"\s+([0-9.]+) (ns|us|ms|s)\b", text)
    return float(m.group(1)) * UNIT[m.group(2)] if m else None


def predict(src, dst, topo, mode):
    out = subprocess.run([f"{BUILD}/bin/refit-plan", "plan", "--src", src, "--dst", dst,
                          "--topology", topo, "--mode", mode, "--chunk-bytes", A.chunk,
                          "--no-validate"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    m = re.search(r"time:\s+([0-9.]+) (ns|us|ms|s) modelled, lower bound ([0-9.]+) "
                  r"(ns|us|ms|s)", out.stdout)
    return float(m.group(1)) * UNIT[m.group(2)], float(m.group(3)) * UNIT[m.group(4)]


class Links:
    """Samples every node's link counters (the bridge side of its veth: tx is
    what the node downloads, rx what it uploads) every 10 ms while a refit
    runs; report() says, per node and direction, the MiB moved and the
    share of the refit's busy period the link ran at >= 90 % of its rate."""

    def __init__(self):
        self.samples, self.stop = [], threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    @staticmethod
    def read():
        out = []
        for k in range(NODES):
            d = f"/sys/class/net/{TAG}h{k}/statistics/"
            out.append((int(open(d + "tx_bytes").read()), int(open(d + "rx_bytes").read())))
        return out

    @staticmethod
    def cpu():
        """(busy, total) jiffies of the whole machine."""
        f = [int(v) for v in open("/proc/stat").readline().split()[1:]]
        return sum(f) - f[3] - f[4], sum(f)

    def run(self):
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.read(), self.cpu()))
            time.sleep(0.01)

    def report(self):
        self.stop.set()
        self.t.join()
        s = self.samples
        if len(s) < 3:
            return ""
        full = A.rate_mbit * 1e6 / 8
        # the busy period: from the first to the last interval any link moved data
        moving = [i for i in range(1, len(s)) if any(
            s[i][1][k][d] - s[i - 1][1][k][d] > full * (s[i][0] - s[i - 1][0]) * 0.05
            for k in range(NODES) for d in (0, 1))]
        if not moving:
            return ""
        a, b = moving[0], moving[-1]
        span = s[b][0] - s[a - 1][0]
        cols = []
        for k in range(NODES):
            for d, what in ((1, "up"), (0, "down")):
                moved = s[b][1][k][d] - s[a - 1][1][k][d]
                busy = sum(s[i][0] - s[i - 1][0] for i in range(a, b + 1)
                           if s[i][1][k][d] - s[i - 1][1][k][d] >=
                           0.9 * full * (s[i][0] - s[i - 1][0]))
                if moved > 1 << 20:
                    cols.append(f"{NAMES[k]} {what} {moved / 2**20:.0f}M "
                                f"{moved / full / span * 100:.0f}%/{busy / span * 100:.0f}%")
        self.timeline = []   # per 100 ms of the busy period: each link's rate, % of nominal
        t, i = s[a - 1][0], a - 1
        while i < b:
            j = i
            while j < b and s[j][0] - t < 0.1:
                j += 1
            dt = s[j][0] - s[i][0]
            self.timeline.append([round(s[i][0] - s[a - 1][0], 2)] + [
                round((s[j][1][k][d] - s[i][1][k][d]) / full / dt * 100)
                for k in range(NODES) for d in (1, 0)])
            t, i = s[j][0], j
        busy, total = (s[b][2][i] - s[a - 1][2][i] for i in (0, 1))
        return f"{'':9} links over {span:.2f}s (MiB, mean rate/time at >=90%; CPU " \
            f"{busy / max(total, 1) * 100:.0f}% busy): " + ", ".join(cols)


def refit(model, version, mode):
    links = Links() if A.links else None
    out = ctl("--json", "trigger", model, "--version", str(version), "--mode", mode, "--wait")
    if links:
        print(links.report())
        with open(os.path.join(OUT, f"links-{model}-v{version}.txt"), "w") as f:
            f.write("t_s " + " ".join(f"{n}_up {n}_down" for n in NAMES) + "\n")
            for row in getattr(links, "timeline", []):
                f.write(" ".join(str(v) for v in row) + "\n")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["state"] != "COMMITTED":
        raise RuntimeError(f"refit {model} v{version} {mode}: {r['failure']}")
    data = max((s["micros"] for s in r["stages"]), default=0) / 1e6
    return r, data, (r["finished_unix_ms"] - r["created_unix_ms"]) / 1e3


# inference layouts: replicas of TP4 on one node each (a replica per
# domain), or of TP8 over two nodes (each node needs half the model)
SCENARIOS = [
    {"name": "tp4x4", "what": "4 replicas of TP4, one node (domain) each",
     "insts": [list(range(8 + 4 * k, 12 + 4 * k)) for k in range(4)]},
    {"name": "tp8x2", "what": "2 replicas of TP8, each over two nodes",
     "insts": [list(range(8 + 8 * k, 16 + 8 * k)) for k in range(2)]},
]


def calibrate():
    """One node pair, one large tensor: the link's payload rate (Mbit/s)
    the cost model is then given.  Stage fill and latency stay modelled."""
    t = [{"name": "w", "dtype": "bf16", "shape": [8192, 8192], "mesh": [0],
          "placements": ["Replicate()"]}]
    i = [{"name": "w", "dtype": "bf16", "shape": [8192, 8192], "mesh": [8],
          "placements": ["Replicate()"]}]
    tr = client(0, "calib", "train", write(os.path.join(TMP, "calib-t.json"), t))
    inf = client(2, "calib", "infer", write(os.path.join(TMP, "calib-i.json"), i), "c")
    r, data, _ = refit("calib", 1, "reshard")
    assert "mismatches=0" in cmd(inf, "wait 1 900000")
    for p in (tr, inf):
        p.stdin.close()
        p.wait(timeout=30)
    rate = r["bytes"] * 8 / data / 1e6
    print(f"calibration: one pair, {r['bytes'] / 2**20:.0f} MiB in {data:.2f} s: "
          f"{rate:.0f} Mbit/s of payload on a {A.rate_mbit} Mbit/s link "
          f"({rate / A.rate_mbit * 100:.1f} %)")
    # the connection: opening that refit's one data session (dial, handshake,
    # the receiver taking it), as the node measured it
    conn_us = r["comm_micros"]
    # host copies: the executor's box copies, the slowest case of bench-dataplane
    # (strided rows), on this machine under this load
    out = subprocess.run([f"{BUILD}/bin/bench-dataplane"], capture_output=True, text=True,
                         timeout=600)
    rates = [(float(m.group(1)), float(m.group(2))) for m in re.finditer(
        r"MiB\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+\s", out.stdout)]
    if out.returncode != 0 or not rates:
        raise RuntimeError(f"bench-dataplane: {out.stderr or out.stdout}")
    host = {"pack_gbps": min(p for p, _ in rates) * 8,
            "unpack_gbps": min(u for _, u in rates) * 8, "connection_us": conn_us}
    print(f"calibration: host copies pack {host['pack_gbps'] / 8:.1f} GB/s, unpack "
          f"{host['unpack_gbps'] / 8:.1f} GB/s (bench-dataplane, slowest case); "
          f"one connection {conn_us / 1e3:.1f} ms (that refit's session open)")
    return rate, host


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def steady(rows, mode):
    """The steady-state time of a mode: the median of its refits after the
    first (the first alone when --repeat is 1)."""
    ts = [r["measured_s"] for r in rows if r["mode"] == mode and r["run"] > 1]
    return median(ts) if ts else [r["measured_s"] for r in rows if r["mode"] == mode][0]


def summarize(rows):
    """One line per (scenario, size, mode): the first refit and the steady
    state (median of the later ones), each against the link limit, and the
    calibrated cost model against the steady state."""
    out = []
    keys = []
    for r in rows:
        k = (r["scenario"], r["model_mib"], r["mode"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in rows if (r["scenario"], r["model_mib"], r["mode"]) == k]
        first = [r for r in rs if r["run"] == 1][0]
        st = steady(rs, k[2])
        out.append({"scenario": k[0], "model_mib": k[1], "mode": k[2],
                    "net_bytes": first["net_bytes"], "runs": len(rs),
                    "first_s": first["measured_s"], "steady_s": st,
                    "bound_s": first["bound_s"], "modelled_s": first["modelled_s"],
                    "calibrated_s": first["calibrated_s"]})
    return out


def print_summary(summ):
    print(f"\nfirst refit vs steady state (median of refits 2..{A.repeat} of each mode; "
          "the limit is the cost model's lower bound)")
    print(f"{'scenario':>8} {'model':>6} {'mode':>9} {'net MiB':>8} {'first':>7} "
          f"{'of lim.':>7} {'steady':>7} {'of lim.':>7} {'calib.':>7} {'err':>5}")
    for x in summ:
        print(f"{x['scenario']:>8} {x['model_mib']:5.0f}M {x['mode']:>9} "
              f"{x['net_bytes'] / 2**20:8.0f} {x['first_s']:6.2f}s "
              f"{x['bound_s'] / x['first_s'] * 100:6.0f}% {x['steady_s']:6.2f}s "
              f"{x['bound_s'] / x['steady_s'] * 100:6.0f}% {x['calibrated_s']:6.2f}s "
              f"{(x['calibrated_s'] - x['steady_s']) / x['steady_s'] * 100:+4.0f}%")


def run_case(sc, size, topo, ctopo):
    layers = 1
    while bytes_of(moe(layers + 1)) <= size << 20:
        layers += 1
    tensors = moe(layers)
    name = f"{sc['name']}-{size}"
    src = write(os.path.join(TMP, f"{name}-train.json"), train_layout(tensors))
    insts = [write(os.path.join(TMP, f"{name}-i{k}.json"), infer_layout(tensors, ranks))
             for k, ranks in enumerate(sc["insts"])]
    # the composed destination, for the cost model: replicas as a 2-D mesh
    dst = write(os.path.join(TMP, f"{name}-dst.json"),
                [{"name": t["name"], "dtype": "bf16", "shape": t["shape"],
                  "mesh": sc["insts"], "placements": ["Replicate()", t["placements"][0]]}
                 for t in json.load(open(insts[0]))["tensors"]])
    trainers = [client(0, name, "train", src), client(1, name, "train", src)]
    infer = [client(node, name, "infer", insts[k], f"i{k}")
             for k, ranks in enumerate(sc["insts"])
             for node in sorted({r // RPN for r in ranks})]
    rows = []
    v = 1
    for mode in ("reshard", "broadcast"):
        pred, bound = predict(src, dst, topo, mode)
        cpred, _ = predict(src, dst, ctopo, mode)
        for run in range(1, A.repeat + 1):
            if v > 1:
                for p in trainers:
                    assert cmd(p, f"next {v}").startswith("READY")
            r, data, e2e = refit(name, v, mode)
            for p in infer:
                out = cmd(p, f"wait {v} 900000")
                assert "mismatches=0" in out, out
            row = {"scenario": sc["name"], "model_mib": bytes_of(tensors) / 2**20,
                   "layers": layers, "mode": mode, "run": run, "net_bytes": r["bytes"],
                   "measured_s": data, "e2e_s": e2e, "bound_s": bound, "modelled_s": pred,
                   "calibrated_s": cpred}
            rows.append(row)
            print(f"{row['model_mib']:8.0f}M {mode:>9} {run:3d} {r['bytes'] / 2**20:8.0f} "
                  f"{data:8.2f}s {e2e:7.2f}s {bound:7.2f}s {bound / data * 100:7.0f}% "
                  f"{pred:7.2f}s {(pred - data) / data * 100:+5.0f}% "
                  f"{cpred:7.2f}s {(cpred - data) / data * 100:+5.0f}%", flush=True)
            v += 1
    for p in trainers + infer:
        p.stdin.close()
        p.wait(timeout=30)
    a = {x["mode"]: steady(rows, x["mode"]) for x in rows}
    print(f"{'':9} broadcast / reshard (steady): x{a['broadcast'] / a['reshard']:.2f}"
          f" measured, x{rows[-1]['modelled_s'] / rows[0]['modelled_s']:.2f} modelled")
    return rows


def main():
    if os.geteuid() != 0:
        skip("needs root (network namespaces, tc)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            skip(f"{tool} is not installed (iproute2)")
    if sh("ip", "netns", "list", check=False).returncode != 0:
        skip("network namespaces are not available here")
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    os.makedirs(OUT, exist_ok=True)
    ips = build_net(A.rate_mbit)
    start(ips)
    cc = sh("sysctl", "-n", "net.ipv4.tcp_congestion_control", ns=f"{TAG}n0").stdout.strip()
    print(f"testbed: {NODES} nodes in network namespaces, {RPN} ranks each, links "
          f"{A.rate_mbit} Mbit/s per node each way (tc tbf), chunk {A.chunk}, "
          f"TCP congestion control {cc}")
    topo = topology(A.rate_mbit)
    cal, host = calibrate()
    ctopo = topology(cal, "calibrated", host)
    rows = []
    if A.repeat < 1:
        raise SystemExit(f"testbed: --repeat {A.repeat}: needs at least 1")
    print(f"{'model':>9} {'mode':>9} {'run':>3} {'net MiB':>8} {'measured':>9} {'e2e':>8} "
          f"{'limit':>8} {'of limit':>8} {'model':>8} {'err':>6} {'calib.':>8} {'err':>6}")
    for sc in [x for x in SCENARIOS if x["name"] in A.scenarios.split(",")]:
        print(f"-- {sc['name']}: {sc['what']}")
        for size in [int(x) for x in A.sizes.split(",")]:
            rows += run_case(sc, size, topo, ctopo)
    summ = summarize(rows)
    print_summary(summ)
    res = {"rate_mbit": A.rate_mbit, "calibrated_mbit": cal, "calibrated_host": host,
           "ranks_per_node": RPN,
           "repeat": A.repeat, "rows": rows, "summary": summ}
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(summ)


def plot(rows):
    if shutil.which("gnuplot") is None:
        print("testbed: gnuplot not installed: no plot (apt-get install gnuplot-nox)")
        return
    dat = os.path.join(OUT, "time-vs-bytes.dat")
    names = [sc["name"] for sc in SCENARIOS if any(r["scenario"] == sc["name"] for r in rows)]
    with open(dat, "w") as f:
        for name in names:  # one gnuplot data block per scenario
            f.write(f"# {name}: model_MiB reshard_s broadcast_s limit_s "
                    "reshard_model_s broadcast_model_s (calibrated cost model) "
                    "reshard_first_s (reshard_s, broadcast_s: steady state)\n")
            for size in sorted({r["model_mib"] for r in rows if r["scenario"] == name}):
                a = {r["mode"]: r for r in rows
                     if r["model_mib"] == size and r["scenario"] == name}
                f.write(f"{size:.1f} {a['reshard']['steady_s']:.4f} "
                        f"{a['broadcast']['steady_s']:.4f} {a['reshard']['bound_s']:.4f} "
                        f"{a['reshard']['calibrated_s']:.4f} "
                        f"{a['broadcast']['calibrated_s']:.4f} "
                        f"{a['reshard']['first_s']:.4f}\n")
            f.write("\n\n")
    png = os.path.join(OUT, "time-vs-bytes.png")
    plots = []
    for i, name in enumerate(names):
        plots += [f"'{dat}' index {i} u 1:3 w lp lw 2 t '{name}: gather-and-broadcast (steady)'",
                  f"'{dat}' index {i} u 1:2 w lp lw 2 t '{name}: reshard (steady)'",
                  f"'{dat}' index {i} u 1:7 w p pt 6 t '{name}: reshard, first refit'",
                  f"'{dat}' index {i} u 1:5 w l dt 2 t '{name}: reshard, calibrated cost model'",
                  f"'{dat}' index {i} u 1:4 w l lw 1 t '{name}: link limit'"]
    script = f"""
set terminal pngcairo size 900,550 noenhanced
set output '{png}'
set title 'refit on the emulated testbed: 2 training nodes -> 4 inference nodes, {A.rate_mbit} Mbit/s per node'
set xlabel 'model size (MiB)'
set ylabel 'time moving data (s)'
set key left top
set grid
plot {", ".join(plots)}
"""
    r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if r.returncode != 0:
        r = subprocess.run(["gnuplot"], input=script.replace("pngcairo", "png"),
                           capture_output=True, text=True)
    print(f"testbed: plot {png}" if r.returncode == 0 else f"testbed: gnuplot: {r.stderr}")


if __name__ == "__main__":
    main()
