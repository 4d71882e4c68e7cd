"""netns.py - an emulated network of Linux network namespaces for the
network fault suite (tests/integration/test_netfaults.py).

Every "host" is a network namespace with one link (eth0) to a bridge in the
root namespace.  The link is not a veth pair but two tap devices, one in
the host's namespace and one on the bridge, joined by a user-space relay
(`python3 netns.py relay`, one process for every link): the kernel here has
no netem (and no tc gact or fq for other tricks), so the relay is what
delays frames.  What it and the kernel do:

  delay      the relay holds every frame that goes INTO a namespace for
             delay +- jitter ms (uniform), keeping each link direction's
             order (a frame is never sent before the one read before it:
             no reordering, unlike netem's jitter).  A packet between two
             namespaces crosses one such direction, so its one-way delay is
             delay +- jitter; a round trip twice that.
  loss       nftables in the namespace: `numgen random mod 100 < P drop` on
             input (every packet arriving in the namespace from its link).
  partition  nftables in the namespace: drop everything in and out of eth0
             (a silent black hole: no RST, no ICMP), or only some traffic
             (Net.block: one destination address and tcp port).
  link down  `ip link set eth0 down|up` in the namespace.

Nothing here needs anything but ip (iproute2), nft (nftables) and Python;
every name starts with rnf<pid> (`PREFIX`), so several runs, and the
testbed's rtb* names, never collide.  Net.close() removes every namespace,
link and the relay; Net registers it with atexit and on SIGTERM/SIGINT/
SIGHUP, and Net() first removes what a killed earlier run (a pid no longer
alive) left behind.
"""
import atexit
import collections
import ctypes
import fcntl
import os
import random
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time

PREFIX = f"rnf{os.getpid() % 100000}"


def sh(*args, ns=None, check=True, input=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {(r.stderr or r.stdout).strip()}")
    return r


def why_not():
    """None when namespaces, taps and nftables can be used here; else why not
    (the suite skips only for no root and no namespaces)."""
    if os.geteuid() != 0:
        return "skip", "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "skip", "ip (iproute2) is not installed"
    probe = f"{PREFIX}probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "skip", f"network namespaces are not available here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if shutil.which("nft") is None:
        return "fail", "nft is not installed (nftables: scripts/deps.sh installs it)"
    if not os.path.exists("/dev/net/tun"):
        return "fail", "/dev/net/tun is missing (the delay relay needs tap devices)"
    return None


def remove_stale():
    """Remove namespaces and links of earlier runs whose process is gone
    (a run killed by SIGKILL cannot clean up after itself)."""
    def dead(name):
        m = re.match(r"rnf(\d+)", name)
        if not m or m.group(0) == PREFIX:
            return False
        pid = int(m.group(1))
        # PREFIX keeps pid % 100000: a live process with that remainder may own it
        return not any(p.isdigit() and int(p) % 100000 == pid for p in os.listdir("/proc"))
    out = sh("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("rnf") and dead(name):
            # what that run started in it (refitd) is still running there
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
    out = sh("ip", "-o", "link", "show", check=False).stdout
    for line in out.splitlines():
        m = re.match(r"\d+: (rnf[0-9a-z]+)[@:]", line)
        if m and dead(m.group(1)):
            sh("ip", "link", "del", m.group(1), check=False)


def free_subnet():
    """A 10.x.y.0/24 no address or route here overlaps (tried from one
    derived from the pid, so concurrent runs differ)."""
    import ipaddress
    used = []
    for cmd in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        for w in sh(*cmd, check=False).stdout.split():
            try:
                used.append(ipaddress.ip_network(w, strict=False))
            except ValueError:
                pass
    used = [u for u in used if u.prefixlen > 0]   # not the default route
    for k in range(2000):
        x = (os.getpid() + 7919 * k) % 62500
        net = ipaddress.ip_network(f"10.{1 + x // 250}.{x % 250}.0/24")
        if not any(net.overlaps(u) for u in used):
            return str(net.network_address).rsplit(".", 1)[0]
    raise RuntimeError("no free 10.x.y.0/24 here")


class Net:
    """A bridge (SUBNET.1 in the root namespace) and hosts added with add()."""

    def __init__(self, subnet=None, mtu=9000, before_close=None):
        """before_close(): stops what runs in the namespaces (called first by
        close(), also on a signal)."""
        remove_stale()
        self.before_close = before_close
        self.subnet = subnet or free_subnet()
        self.mtu = mtu
        self.br = f"{PREFIX}br"
        self.hosts = {}      # name -> (namespace, address, root-side tap)
        self.made_ns, self.made_links = [], []
        self.relay = None
        self.closed = False
        atexit.register(self.close)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        sh("ip", "link", "add", self.br, "type", "bridge")
        self.made_links.append(self.br)
        sh("ip", "link", "set", self.br, "mtu", str(mtu))
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.br)
        sh("ip", "link", "set", self.br, "up")
        self.relay = subprocess.Popen([sys.executable, os.path.abspath(__file__), "relay"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, bufsize=1)
        self._cmd("hello")

    def _on_signal(self, sig, frame):
        """Clean up and exit at once: an exception raised here could be
        replaced by another one in a finally block and the run go on."""
        self.close()
        print(f"FAIL interrupted by signal {sig}: processes, namespaces and links removed",
              flush=True)
        os._exit(128 + sig)

    def _cmd(self, line):
        self.relay.stdin.write(line + "\n")
        self.relay.stdin.flush()
        out = self.relay.stdout.readline().strip()
        if not out.startswith("ok"):
            raise RuntimeError(f"relay: {line}: {out or 'it died'}")
        return out

    def ns(self, name):
        return self.hosts[name][0]

    def addr(self, name):
        return self.hosts[name][1]

    def add(self, name, host_id):
        """A host: namespace PREFIX-name, address SUBNET.host_id on eth0."""
        ns, rootif = f"{PREFIX}-{name}", f"{PREFIX}t{host_id}"
        ip = f"{self.subnet}.{host_id}"
        sh("ip", "netns", "add", ns)
        self.made_ns.append(ns)
        self.made_links.append(rootif)   # goes with the relay; deleted again to be sure
        self._cmd(f"cable {name} /run/netns/{ns} eth0 {rootif}")
        for a in (["link", "set", "lo", "up"],
                  ["link", "set", "eth0", "mtu", str(self.mtu)],
                  ["addr", "add", f"{ip}/24", "dev", "eth0"],
                  ["link", "set", "eth0", "up"]):
            sh("ip", "-n", ns, *a)
        sh("sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", ns=ns, check=False)
        sh("sysctl", "-q", "-w", f"net.ipv6.conf.{rootif}.disable_ipv6=1", check=False)
        sh("ip", "link", "set", rootif, "mtu", str(self.mtu))
        sh("ip", "link", "set", rootif, "master", self.br)
        sh("ip", "link", "set", rootif, "up")
        # the rule chains every host has, empty (accept) until a fault fills them
        sh("nft", "-f", "-", ns=ns, input="""
table inet rnf {
  chain loss_in { type filter hook input priority -20; policy accept; }
  chain part_in { type filter hook input priority -10; policy accept; }
  chain part_out { type filter hook output priority -10; policy accept; }
}
""")
        self.hosts[name] = (ns, ip, rootif)
        return ip

    def popen(self, name, args, **kw):
        """Start args inside host name's namespace (`ip netns exec` execs it:
        the Popen's pid is the program's)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(name)] + list(args), **kw)

    # ---- faults ---------------------------------------------------------------

    def delay(self, name, ms, jitter_ms=0.0):
        """Frames into host name are held ms +- jitter_ms (0: none)."""
        self._cmd(f"delay {name} {ms} {jitter_ms}")

    def loss(self, name, percent):
        """Drop percent % of the packets arriving in host name (0: none)."""
        ns = self.ns(name)
        sh("nft", "flush", "chain", "inet", "rnf", "loss_in", ns=ns)
        if percent:
            sh("nft", "add", "rule", "inet", "rnf", "loss_in", "iifname", "eth0", "numgen",
               "random", "mod", "100", "<", str(int(percent)), "counter", "drop", ns=ns)

    def partition(self, name):
        """Host name's link becomes a black hole both ways (the link stays up)."""
        ns = self.ns(name)
        sh("nft", "-f", "-", ns=ns, input="""
flush chain inet rnf part_in
flush chain inet rnf part_out
add rule inet rnf part_in iifname "eth0" drop
add rule inet rnf part_out oifname "eth0" drop
""")

    def block(self, name, daddr, dport):
        """Host name cannot reach daddr:dport (tcp; its packets there are
        dropped); everything else goes on."""
        sh("nft", "add", "rule", "inet", "rnf", "part_out", "ip", "daddr", daddr, "tcp",
           "dport", str(dport), "drop", ns=self.ns(name))

    def heal(self, name):
        """Undo partition() and block() of host name."""
        ns = self.ns(name)
        sh("nft", "flush", "chain", "inet", "rnf", "part_in", ns=ns)
        sh("nft", "flush", "chain", "inet", "rnf", "part_out", ns=ns)

    def link(self, name, up):
        sh("ip", "-n", self.ns(name), "link", "set", "eth0", "up" if up else "down")

    def rules(self, name):
        return sh("nft", "list", "table", "inet", "rnf", ns=self.ns(name)).stdout

    def stats(self):
        """{link: frames relayed into the namespace, out of it, dropped}."""
        out = self._cmd("stats")
        return {k: tuple(int(x) for x in v.split("/"))
                for k, v in (w.split("=") for w in out.split()[1:])}

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self.before_close:
            try:
                self.before_close()
            except Exception as e:  # noqa: BLE001 - go on removing the network
                print(f"netns: stopping the processes: {e!r}", file=sys.stderr)
        if self.relay and self.relay.poll() is None:
            try:
                self.relay.stdin.write("quit\n")
                self.relay.stdin.flush()
                self.relay.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.relay.kill()
                self.relay.wait()
        for ns in self.made_ns:
            sh("ip", "netns", "del", ns, check=False)
        for link in self.made_links:
            if os.path.exists(f"/sys/class/net/{link}"):
                sh("ip", "link", "del", link, check=False)


# ---- the relay (its own process) ----------------------------------------------------

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
QUEUE_MAX = 20000    # frames held per direction; more are dropped (a full buffer)


def open_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


class Direction:
    """Frames read from src, written to dst after the delay, in order."""

    def __init__(self, src, dst):
        self.src, self.dst = src, dst
        self.ms, self.jitter = 0.0, 0.0
        self.q = collections.deque()
        self.last = 0.0
        self.moved = self.dropped = 0

    def push(self, frame, now):
        if self.ms <= 0 and not self.q:
            self.send(frame)
            return
        if len(self.q) >= QUEUE_MAX:
            self.dropped += 1
            return
        due = now + (self.ms + random.uniform(-self.jitter, self.jitter)) / 1000
        self.last = max(due, self.last)
        self.q.append((self.last, frame))

    def send(self, frame):
        try:
            os.write(self.dst, frame)
            self.moved += 1
        except OSError:   # the other side is down (link down), or its queue full
            self.dropped += 1

    def flush(self, now):
        while self.q and self.q[0][0] <= now:
            self.send(self.q.popleft()[1])
        return self.q[0][0] if self.q else None


def relay_main():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, None)
    links = {}     # name -> (into the namespace, out of it)
    inbuf = b""
    while True:
        dues = [d for d in (x.flush(time.monotonic()) for pair in links.values()
                            for x in pair) if d is not None]
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
        for key, _ in sel.select(timeout):
            d = key.data
            if d is None:
                chunk = os.read(sys.stdin.fileno(), 4096)
                if not chunk:
                    return
                inbuf += chunk
                while b"\n" in inbuf:
                    line, inbuf = inbuf.split(b"\n", 1)
                    w = line.decode().split()
                    if not w:
                        continue
                    try:
                        if w[0] == "quit":
                            return
                        elif w[0] == "hello":
                            ans = "ok"
                        elif w[0] == "cable":    # cable NAME NSPATH NSIF ROOTIF
                            nsfd = os.open(w[2], os.O_RDONLY)
                            if libc.setns(nsfd, CLONE_NEWNET) != 0:
                                raise OSError(ctypes.get_errno(), "setns")
                            try:
                                inner = open_tap(w[3])
                            finally:
                                libc.setns(home, CLONE_NEWNET)
                                os.close(nsfd)
                            outer = open_tap(w[4])
                            into, out = Direction(outer, inner), Direction(inner, outer)
                            links[w[1]] = (into, out)
                            sel.register(outer, selectors.EVENT_READ, into)
                            sel.register(inner, selectors.EVENT_READ, out)
                            ans = "ok"
                        elif w[0] == "delay":    # delay NAME MS JITTER
                            x = links[w[1]][0]
                            x.ms, x.jitter = float(w[2]), float(w[3])
                            ans = "ok"
                        elif w[0] == "stats":
                            ans = "ok " + " ".join(
                                f"{n}={a.moved}/{b.moved}/{a.dropped + b.dropped}"
                                for n, (a, b) in links.items())
                        else:
                            ans = f"error: unknown command {w[0]}"
                    except (OSError, KeyError, IndexError, ValueError) as e:
                        ans = f"error: {e}"
                    sys.stdout.write(ans + "\n")
                    sys.stdout.flush()
                continue
            now = time.monotonic()
            for _ in range(64):   # what the tap has now, a bounded batch
                try:
                    frame = os.read(d.src, 65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if not frame:
                    break
                d.push(frame, now)


if __name__ == "__main__" and sys.argv[1:] == ["relay"]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the test stops it (quit, or its pipe)
    try:
        relay_main()
    except BrokenPipeError:
        pass
