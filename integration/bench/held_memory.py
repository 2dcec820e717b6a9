#!/usr/bin/env python3
"""Memory cost of held requests: how much the proxy's RSS grows while N
(default 10,000) requests are held on their timers. Goal: < 100 MiB for 10k.

Each of N identifiers first sends one request (the burst of 1), so the master
publishes a DELAY_UNTIL about a minute ahead for it; then N connections each
send that identifier's second request, which the proxy holds. RSS is read from
/proc before and while they are held; then every client disconnects and the
held gauge must drop to 0 (disconnected clients free their places)."""
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
from harness import free_port, http_get, metric, metric_sum, one_box_toml, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--held", type=int, default=10_000)
    ap.add_argument("--bin", default=os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    args = ap.parse_args()
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
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", backend_port)).close() or True, 10)
        wait_until(lambda: http_get(padmin, "/readyz").status == 200, 10)
        wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_masters_connected") == 1, 10)
        # ZeroMQ drops what a PUB sends before its subscriber is connected: warm
        # the accounting path until the master has seen a message.
        warm = iter(range(1000))

        def master_saw_one():
            req = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/", headers={"X-API-Key": f"warm-{next(warm)}"})
            urllib.request.urlopen(req, timeout=5).read()
            return metric_sum(http_get(madmin, "/metrics").body, "smockron_master_accounting_messages_total") > 0
        wait_until(master_saw_one, 10, interval=0.1)
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
            assert b" 200 " in status, status
        conn.close()
        try:
            wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_control_entries") >= args.held, 30)
        except Exception:
            text = http_get(padmin, "/metrics").body + http_get(madmin, "/metrics").body
            print("\n".join(l for l in text.splitlines() if not l.startswith("#") and ("accounting" in l or "control" in l or "tracked" in l)))
            raise
        time.sleep(0.5)
        before = rss_kib(proxy_pid)
        # Phase 2: N held requests, one connection each.
        for i in range(args.held):
            s = socket.create_connection(("127.0.0.1", proxy_port))
            s.sendall(f"GET / HTTP/1.1\r\nHost: x\r\nX-API-Key: key-{i}\r\n\r\n".encode())
            socks.append(s)
        wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_held_requests") >= args.held, 60)
        during = rss_kib(proxy_pid)
        print(f"proxy RSS before: {before / 1024:.1f} MiB, with {args.held} held requests: {during / 1024:.1f} MiB, "
              f"delta {(during - before) / 1024:.1f} MiB ({(during - before) * 1024 / args.held:.0f} bytes per held request)")
        for s in socks:
            s.close()
        socks.clear()
        t0 = time.time()
        wait_until(lambda: metric(http_get(padmin, "/metrics").body, "smockron_proxy_held_requests") == 0, 30)
        print(f"all clients disconnected: held gauge back to 0 in {time.time() - t0:.2f} s, "
              f"forwarded none of them: {metric(http_get(padmin, '/metrics').body, 'smockron_proxy_held_client_disconnects_total'):.0f} drops counted")
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
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
