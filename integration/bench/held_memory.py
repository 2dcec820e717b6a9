#!/usr/bin/env python3
"""Memory cost of held requests: how much the proxy's RSS grows while N
(default 10,000) requests are held on their timers. Goal: < 100 MiB for 10k.

Each of N identifiers first sends one request (the burst of 1), so the master
publishes a DELAY_UNTIL about a minute ahead for it; then N connections each
send that identifier's second request, which the proxy holds. RSS is read from
/proc before and while they are held; then every client disconnects and the
held gauge must drop to 0 (disconnected clients free their places).

--h2: the held requests are HTTP/2 streams, --connections (default 100) of
them sharing the held streams; the RSS before is taken with those
connections open (SETTINGS exchanged), so the figure is what a held stream
costs beyond its connection. Goal: <= 2 KiB.

--max-kib-per-held X: exit 1 if the RSS growth per held request exceeds X KiB.
--smoke: 300 held requests (unless --held says otherwise), and exit 1 unless
every check saw what it checks: each first request answered 200, the master's
DELAY_UNTIL for every identifier in the proxy, every second request held, and
every one of them dropped (none forwarded) when its client disconnected. Any
failure to run exits 1 with a message."""
import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib.config import one_box_toml  # noqa: E402
from lib.http1 import http_get  # noqa: E402
from lib.metrics import metric, metric_sum  # noqa: E402
from lib.ports import free_port  # noqa: E402
from lib.timing import wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class H2Client:
    """An HTTP/2 connection with prior knowledge (python3-h2), its SETTINGS exchanged."""

    def __init__(self, port):
        dist = "/usr/lib/python3/dist-packages"
        if dist not in sys.path:
            sys.path.append(dist)
        import h2.config
        import h2.connection
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.sock.settimeout(10)
        self.conn.receive_data(self.sock.recv(65536))  # the proxy's SETTINGS
        self.sock.sendall(self.conn.data_to_send())

    def get(self, key):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/"),
                                     ("x-api-key", key)], end_stream=True)
        self.sock.sendall(self.conn.data_to_send())


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--held", type=int, default=None, help="held requests (default 10000; smoke 300)")
    ap.add_argument("--max-kib-per-held", type=float, default=None, metavar="X",
                    help="exit 1 if RSS growth per held request is above X KiB")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run (300 held unless --held) that exits 1 unless every check saw what it checks")
    ap.add_argument("--h2", action="store_true", help="hold HTTP/2 streams, --connections of them per run")
    ap.add_argument("--connections", type=int, default=100, help="HTTP/2 connections the held streams share")
    ap.add_argument("--bin", default=os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    args = ap.parse_args()
    if args.held is None:
        args.held = 300 if args.smoke else 10_000
    if args.held < 1:
        ap.error("--held must be at least 1")
    for name in ("smockron-master", "smockron-proxy"):
        if not os.access(os.path.join(args.bin, name), os.X_OK):
            sys.exit(f"held_memory.py: {os.path.join(args.bin, name)} is not built (or pass --bin)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.held + 100:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is too small for {args.held} connections")
    tmp = tempfile.mkdtemp(prefix="smockron-held-")
    backend_port, proxy_port, padmin, madmin, acct, ctrl = (free_port() for _ in range(6))
    conf = os.path.join(tmp, "smockron.toml")
    with open(conf, "w") as f:
        f.write(one_box_toml(domain="mem", rule='{ rate = "1/min", burst = 1 }', backend_port=backend_port,
                             proxy_port=proxy_port, proxy_admin=padmin, master_admin=madmin, accounting=acct,
                             control=ctrl, proxy_extra=f'max_delay = "120s"\nmax_held = {args.held * 2}'))
    log = open(os.path.join(tmp, "log"), "w")
    procs = [
        subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "demo_backend.py"), str(backend_port)], stdout=log, stderr=log),
        subprocess.Popen([os.path.join(args.bin, "smockron-master"), "--config", conf, "--log-level", "warn"], stdout=log, stderr=log),
        subprocess.Popen([os.path.join(args.bin, "smockron-proxy"), "--config", conf, "--log-level", "warn"], stdout=log, stderr=log),
    ]
    proxy_pid = procs[2].pid
    socks = []
    problems = []
    failed_to_run = False
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", backend_port)).close() or True, 10,
                   message="the backend listening")
        wait_until(lambda: http_get(padmin, "/readyz").status == 200, 10, message="the proxy ready (/readyz)")
        wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_masters_connected") == 1, 10,
                   message="the proxy connected to the master")
        # ZeroMQ drops what a PUB sends before its subscriber is connected: warm
        # the accounting path until the master has seen a message.
        warm = iter(range(1000))

        def master_saw_one():
            req = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/", headers={"X-API-Key": f"warm-{next(warm)}"})
            urllib.request.urlopen(req, timeout=5).read()
            return metric_sum(http_get(madmin, "/metrics").body, "smockron_master_accounting_messages_total") > 0
        wait_until(master_saw_one, 10, interval=0.1, message="the master counting the proxy's accounting")
        # Phase 1: each identifier's first request passes and earns a DELAY_UNTIL.
        conn = socket.create_connection(("127.0.0.1", proxy_port))
        f = conn.makefile("rb")
        for i in range(args.held):
            conn.sendall(f"GET / HTTP/1.1\r\nHost: x\r\nX-API-Key: key-{i}\r\n\r\n".encode())
            status = f.readline()
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            f.read(length)
            if b" 200 " not in status:
                raise RuntimeError(f"phase 1: key-{i}'s first request was answered {status!r}, not 200")
        conn.close()
        try:
            wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_control_entries") >= args.held, 30,
                       message=f"the master's DELAY_UNTIL for all {args.held} identifiers in the proxy")
        except Exception:
            text = http_get(padmin, "/metrics").body + http_get(madmin, "/metrics").body
            print("\n".join(l for l in text.splitlines() if not l.startswith("#") and ("accounting" in l or "control" in l or "tracked" in l)))
            raise
        time.sleep(0.5)
        if args.h2:
            h2conns = [H2Client(proxy_port) for _ in range(min(args.connections, args.held))]
            socks.extend(c.sock for c in h2conns)
            time.sleep(0.5)
        before = rss_kib(proxy_pid)
        # Phase 2: N held requests, one connection each (or HTTP/2 streams over --connections).
        for i in range(args.held):
            if args.h2:
                h2conns[i % len(h2conns)].get(f"key-{i}")
                continue
            s = socket.create_connection(("127.0.0.1", proxy_port))
            s.sendall(f"GET / HTTP/1.1\r\nHost: x\r\nX-API-Key: key-{i}\r\n\r\n".encode())
            socks.append(s)
        wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_held_requests") >= args.held, 60,
                   message=f"{args.held} requests held")
        during = rss_kib(proxy_pid)
        per_held_kib = (during - before) / args.held
        kind = f"HTTP/2 streams on {len(h2conns)} connections" if args.h2 else "requests"
        print(f"proxy RSS before: {before / 1024:.1f} MiB, with {args.held} held {kind}: {during / 1024:.1f} MiB, "
              f"delta {(during - before) / 1024:.1f} MiB ({(during - before) * 1024 / args.held:.0f} bytes per held request)")
        if args.max_kib_per_held is not None:
            ok = per_held_kib <= args.max_kib_per_held
            print(f"RSS growth per held request {per_held_kib:.2f} KiB, bound {args.max_kib_per_held:g} KiB: "
                  f"{'PASS' if ok else 'FAIL'}")
            if not ok:
                problems.append(f"RSS grew {per_held_kib:.2f} KiB per held request, above --max-kib-per-held "
                                f"{args.max_kib_per_held:g}")
        for s in socks:
            s.close()
        socks.clear()
        t0 = time.time()
        wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_held_requests") == 0, 30,
                   message="the held gauge back to 0 after every client disconnected")
        drops = metric(http_get(padmin, '/metrics').body, 'smockron_proxy_held_client_disconnects_total') or 0
        print(f"all clients disconnected: held gauge back to 0 in {time.time() - t0:.2f} s, "
              f"forwarded none of them: {drops:.0f} drops counted")
        if args.smoke and drops != args.held:
            problems.append(f"{drops:.0f} held requests counted as dropped on disconnect, not {args.held}")
    except Exception as e:  # noqa: BLE001  (a benchmark that cannot run says why and exits 1)
        problems.append(f"could not run: {type(e).__name__}: {e}")
        failed_to_run = True
    finally:
        for s in socks:
            s.close()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        if failed_to_run:
            with open(os.path.join(tmp, "log"), errors="replace") as f:
                tail = f.read()[-3000:].strip()
            if tail:
                print(f"--- master, proxy and backend log ---\n{tail}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print(f"held_memory.py: FAIL: {p}", file=sys.stderr)
    if problems:
        return 1
    if args.smoke:
        print(f"smoke: OK: {args.held} {'HTTP/2 streams' if args.h2 else 'requests'} held and all dropped on disconnect")
    return 0


if __name__ == "__main__":
    sys.exit(main())
