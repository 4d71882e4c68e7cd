"""A peer that ends each gRPC call without a status, and the check that
refitd survives it.

The peer speaks just enough HTTP/2 over plain TCP: its SETTINGS, the
acknowledgements, and for each request stream one HEADERS frame that ends
the stream (":status 200", "content-type: application/grpc") and carries
no grpc-status.  etcd serving TLS ends the calls in flight without a status
when it stops (stress_etcd_stop.py counts them; the frames it sends may
differ, the missing status is the same).  gRPC 1.51's retry filter, on by default,
dereferenced that missing status and aborted the process (optional.h:441
"this->engaged_"; grpc/grpc#34683); refit's channels turn gRPC's retries off,
so the call fails UNKNOWN "No status received" and the caller goes on.
"""
import socket
import struct
import threading

import harness
from harness import spawn, wait_for

# HPACK: ":status 200" (static index 8); content-type (static 31), literal
# value, not indexed
_HEADERS = b"\x88" + b"\x0f\x10" + bytes([16]) + b"application/grpc"
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4


def _frame(kind, flags, stream, payload=b""):
    return (struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) +
            struct.pack(">I", stream) + payload)


class NoStatusPeer:
    """Listens on 127.0.0.1 (a port of its own); .answered counts the calls
    ended without a status."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.answered = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = bytearray()

        def need(n):
            while len(buf) < n:
                got = conn.recv(65536)
                if not got:
                    raise EOFError
                buf.extend(got)
        try:
            need(24)  # the client's preface
            del buf[:24]
            conn.sendall(_frame(4, 0, 0))
            while True:
                need(9)
                size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                stream = struct.unpack(">I", buf[5:9])[0] & 0x7fffffff
                need(9 + size)
                payload = bytes(buf[9:9 + size])
                del buf[:9 + size]
                if kind == 4 and not flags & _ACK:  # SETTINGS
                    conn.sendall(_frame(4, _ACK, 0))
                elif kind == 6 and not flags & _ACK:  # PING
                    conn.sendall(_frame(6, _ACK, 0, payload))
                elif kind == 1 and stream:  # a call's HEADERS: end it, no status
                    self.answered += 1
                    conn.sendall(_frame(1, _END_HEADERS | _END_STREAM, stream, _HEADERS))
        except (EOFError, OSError):
            pass
        conn.close()

    def close(self):
        self.sock.close()


def survives_no_status(build):
    """A coordinator whose etcd, and a node whose coordinator, end every call
    without a status: each logs that call failed (LeaseGrant, Join: UNKNOWN
    "No status received"), is still running, and stops with 0 on SIGTERM."""
    etcd, coord = NoStatusPeer(), NoStatusPeer()
    log = f"{harness.TMP}/nostatus.log"
    with open(log, "w") as fh:
        procs = [spawn([f"{build}/bin/refitd", "--role", "coordinator", "--listen",
                        "127.0.0.1:0", "--state-store", "etcd", "--etcd-endpoints",
                        etcd.addr, "--log-level", "warn"], stderr=fh),
                 spawn([f"{build}/bin/refitd", "--role", "node", "--listen", "127.0.0.1:0",
                        "--coordinator", coord.addr, "--node-id", "nostatus", "--ranks",
                        "0-0", "--local-socket", f"{harness.TMP}/nostatus.sock",
                        "--log-level", "warn"], stderr=fh)]

    def failed(who, call):
        with open(log) as fh:
            return [ln for ln in fh if who in ln and f"{call}: UNKNOWN: No status received"
                    in ln]
    try:
        for who, call in (("coordinator: election: etcd", "LeaseGrant"),
                          ("node=nostatus", "Join")):
            wait_for(lambda: failed(who, call) or any(p.poll() is not None for p in procs),
                     30, f"{who}: {call} failed, no status")
        for p in procs:
            assert p.poll() is None, f"{p.args[1:3]} exited {p.returncode} (see {log})"
        assert etcd.answered >= 1 and coord.answered >= 1, (etcd.answered, coord.answered)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        codes = [p.wait(timeout=20) for p in procs]
        for p in procs:   # checked here; a tcp node: no emulator counters to read
            harness.PROCS.remove(p)
        etcd.close()
        coord.close()
    assert codes == [0, 0], (codes, log)
