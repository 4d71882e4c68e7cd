#!/usr/bin/python3
"""Stress (not in make check): etcd over TLS (--client-cert-auth) stopped with
SIGTERM while calls are in flight.

Each round: one etcd member serving TLS only; COORDS coordinators leading /
standing by on it (lease TTL 1 s: a LeaseKeepAlive every ~330 ms); 16
threads of this script Putting 2 KB values through their own channel
(gRPC's retries off there, so this process survives what it measures); etcd
SIGTERMed 0.3 to 0.6 s in; 0.5 s later, whether each coordinator still runs.

Prints per round how many calls, this script's and the coordinators' (their
logs), etcd ended without a grpc-status ("UNKNOWN: No status received": the
answer gRPC 1.51's retry filter aborted on), and the coordinators that
exited other than 75 (a leader whose lease expired; before the fix:
optional.h:441 "this->engaged_", status -6).  Usage: stress_etcd_stop.py BUILD [ROUNDS] [COORDS]
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
COORDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
TMP = tempfile.mkdtemp(prefix="refit-etcdstop-")
sys.path.insert(0, TMP)
subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={TMP}",
                f"--grpc_python_out={TMP}", "etcd/etcd.proto", "etcd/kv.proto"], check=True)
import grpc  # noqa: E402
from etcd import etcd_pb2 as epb, etcd_pb2_grpc as epbg  # noqa: E402


def certs(d):
    """A CA; a server certificate for localhost; a client certificate."""
    os.makedirs(d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def ossl(*a):
        subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
         "-subj", "/CN=refit etcd stress CA")
    for name, ext in (("server", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        with open(f"{d}/{name}.ext", "w") as fh:
            fh.write(ext + "\n")
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext")
    return d


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def read(path):
    with open(path, "rb") as fh:
        return fh.read()


def one_round(c, rng, r):
    d = f"{TMP}/r{r}"
    cp, pp = port(), port()
    peer = f"http://127.0.0.1:{pp}"
    etcd = subprocess.Popen(
        ["etcd", "--name", "s", "--data-dir", f"{d}/data", "--listen-client-urls",
         f"https://127.0.0.1:{cp}", "--advertise-client-urls", f"https://localhost:{cp}",
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"s={peer}", "--cert-file", f"{c}/server.crt", "--key-file",
         f"{c}/server.key", "--client-cert-auth", "--trusted-ca-file", f"{c}/ca.crt",
         "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    creds = grpc.ssl_channel_credentials(read(f"{c}/ca.crt"), read(f"{c}/client.key"),
                                         read(f"{c}/client.crt"))
    ch = grpc.secure_channel(f"localhost:{cp}", creds, options=[("grpc.enable_retries", 0)])
    grpc.channel_ready_future(ch).result(timeout=20)
    log = open(f"{d}/coords.log", "w")
    coords = [subprocess.Popen(
        [f"{BUILD}/bin/refitd", "--role", "coordinator", "--listen", f"127.0.0.1:{port()}",
         "--state-store", "etcd", "--etcd-endpoints", f"localhost:{cp}", "--etcd-tls-ca",
         f"{c}/ca.crt", "--etcd-tls-cert", f"{c}/client.crt", "--etcd-tls-key",
         f"{c}/client.key", "--etcd-lease-ttl-ms", "1000", "--log-level", "info"],
        stderr=log) for _ in range(COORDS)]
    end = time.time() + 20
    while time.time() < end and "leading as" not in open(f"{d}/coords.log").read():
        time.sleep(0.05)
    kv, seen, stop = epbg.KVStub(ch), {}, threading.Event()

    def put(i):
        while not stop.is_set():
            try:
                kv.Put(epb.PutRequest(key=b"stress/%d" % i, value=os.urandom(2048)), timeout=2)
            except grpc.RpcError as e:
                k = f"{e.code().name}: {e.details()[:40]}"
                seen[k] = seen.get(k, 0) + 1
    threads = [threading.Thread(target=put, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.3, 0.6))
    etcd.send_signal(signal.SIGTERM)
    etcd.wait(timeout=30)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    ch.close()
    # 75: a leader whose lease etcd expired stops so (by design); else a crash
    died = [p.poll() for p in coords if p.poll() not in (None, 75)]
    for p in coords:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=20)
    nostatus = seen.get("UNKNOWN: No status received", 0)
    log.close()
    theirs = open(f"{d}/coords.log").read().count("No status received")
    print(f"round {r}: {nostatus} calls here and {theirs} of the coordinators' ended without "
          f"a status; coordinators crashed: {died or 'none'}", flush=True)
    if died:
        shutil.copy(f"{d}/coords.log", f"{TMP}/coords-r{r}.log")
    shutil.rmtree(d, ignore_errors=True)
    return nostatus, len(died)


def main():
    c = certs(f"{TMP}/tls")
    rng = random.Random(os.environ.get("REFIT_STRESS_SEED", "1"))
    tot_ns = tot_died = 0
    for r in range(ROUNDS):
        ns, died = one_round(c, rng, r)
        tot_ns += ns
        tot_died += died
    print(f"etcd-stop stress: {ROUNDS} rounds, {tot_ns} calls ended without a status, "
          f"{tot_died} of {ROUNDS * COORDS} coordinators crashed (logs: {TMP})")
    if tot_died == 0:
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if tot_died else 0


sys.exit(main())
