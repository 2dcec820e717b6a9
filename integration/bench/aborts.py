#!/usr/bin/env python3
"""Clients that abort under a concurrency limit: no slot stays taken.

One smockron-master with a domain under { concurrency = 4 } (concurrency.py's
cluster: the test backend, G gatekeepers behind delay_relay.py at one-way
D), and --aborts requests of one key that their clients abandon: half over
HTTP/1.1 (the connection closed 0-5 ms after the request was sent), half over
HTTP/2 (RST_STREAM 0-5 ms after the request, on --h2-connections
connections), through random gatekeepers, while the key's slots are busy
with /slow?s=0.5 requests. Most are aborted while they wait for a slot, the
others at the backend. Then: how long until every gatekeeper counts nothing
in flight or waiting, how long until the master counts no slot leased (a
gatekeeper keeps idle slots 2 s), the most of the key the backend saw at
once (4, plus requests abandoned at the backend: their slot is freed when
the client goes, while the backend still works on them until it answers),
and whether 4 fresh requests of the key then all go at once.

--smoke: 200 aborts, G = 2; exit 1 unless everything came back to 0.

Run: python3 integration/bench/aborts.py [--aborts 10000] [-g 3] [--delay 0]
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from concurrency import KEY, Cluster  # noqa: E402
from lib.h2client import H2Client  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402


def abort_http1(ports: list[int], n: int, rng: random.Random) -> int:
    done = 0
    for _ in range(n):
        s = socket.create_connection((HOST, rng.choice(ports)), timeout=5)
        s.sendall(f"GET /slow?s=0.5 HTTP/1.1\r\nHost: bench.local\r\nX-API-Key: {KEY}\r\n\r\n".encode())
        time.sleep(rng.random() * 0.005)
        s.close()
        done += 1
    return done


def abort_http2(port: int, n: int, rng: random.Random) -> int:
    done = 0
    with H2Client(port) as c:
        for _ in range(n):
            sid = c.request("/slow?s=0.5", headers=[("x-api-key", KEY)])
            time.sleep(rng.random() * 0.005)
            c.rst(sid)
            done += 1
    return done


def wait_zero(read, timeout: float) -> float | None:
    """Seconds until read() is 0, or None past `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if read() == 0:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aborts", type=int, default=10000, help="requests aborted, half HTTP/1.1, half HTTP/2")
    ap.add_argument("-g", type=int, default=3, help="gatekeepers")
    ap.add_argument("--delay", type=float, default=0.0, help="one-way delay to the master in ms")
    ap.add_argument("--h2-connections", type=int, default=10, help="HTTP/2 connections the resets are spread over")
    ap.add_argument("--smoke", action="store_true", help="200 aborts, G = 2; checks only")
    args = ap.parse_args()
    if args.smoke:
        args.aborts, args.g = 200, 2
    # What concurrency.py's cluster reads of its arguments.
    args.limit, args.shared, args.shared_rate = 4, 6, 60
    tmp = tempfile.mkdtemp(prefix="smockron-aborts-")
    cluster = Cluster(args.g, args, tmp)
    ok = True
    try:
        cluster.start()
        cluster.set_delay(args.delay)
        cluster.backend.reset()
        # The key's slots busy the whole time: 4 clients of /slow?s=0.5 back to back.
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                fetch(cluster.listen[0], "/slow?s=0.5", key=KEY, timeout=60)

        busy_threads = [threading.Thread(target=busy, daemon=True) for _ in range(4)]
        for t in busy_threads:
            t.start()
        h1, h2 = args.aborts // 2, args.aborts - args.aborts // 2
        per_thread = max(1, h1 // 8)
        counts: list[int] = []
        t0 = time.monotonic()
        jobs = [threading.Thread(target=lambda k=k: counts.append(abort_http1(cluster.listen, min(per_thread, h1 - k),
                                                                               random.Random(k))))
                for k in range(0, h1, per_thread)]
        per_conn = max(1, h2 // args.h2_connections)
        jobs += [threading.Thread(target=lambda k=k: counts.append(
            abort_http2(cluster.listen[k // per_conn % len(cluster.listen)], min(per_conn, h2 - k), random.Random(-k - 1))))
            for k in range(0, h2, per_conn)]
        for t in jobs:
            t.start()
        for t in jobs:
            t.join(600)
        aborted_in = time.monotonic() - t0
        stop.set()
        for t in busy_threads:
            t.join(60)
        gauges = ("smockron_proxy_concurrency_in_flight", "smockron_proxy_concurrency_waiting")
        proxies_zero = wait_zero(lambda: sum(p.metric(g) or 0 for p in cluster.proxies for g in gauges), 30)
        master_zero = wait_zero(lambda: cluster.master.metric("smockron_master_lease_slots_held") or 0, 30)
        most = cluster.backend.inflight()["max"].get(KEY, 0)
        # Four fresh requests at once: every one of the N slots is free.
        results: list = []
        t1 = time.monotonic()
        fresh = [threading.Thread(target=lambda i=i: results.append(
            fetch(cluster.listen[i % len(cluster.listen)], "/slow?s=0.2", key=KEY, timeout=30)[0].status))
            for i in range(4)]
        for t in fresh:
            t.start()
        for t in fresh:
            t.join(30)
        fresh_s = time.monotonic() - t1
        print(f"aborts: {sum(counts)} aborted ({h1} HTTP/1.1, {h2} HTTP/2) through {args.g} gatekeepers at "
              f"{args.delay:g} ms one-way in {aborted_in:.1f} s")
        print(f"in flight and waiting at the gatekeepers back to 0 in: "
              f"{'%.2f s' % proxies_zero if proxies_zero is not None else 'NEVER (30 s)'}")
        print(f"slots leased at the master back to 0 in: "
              f"{'%.2f s' % master_zero if master_zero is not None else 'NEVER (30 s)'} (idle slots linger 2 s)")
        # A request abandoned at the backend frees its slot at once (the rule: the client went),
        # while the backend, which notices a closed connection only when it answers, still works on it.
        print(f"most of the key at the backend at once: {most} (limit 4, plus abandoned requests the backend "
              f"was still working on)")
        print(f"4 fresh requests: {sorted(results)} in {fresh_s:.2f} s (0.2 s each: all at once)")
        ok = (sum(counts) == args.aborts and proxies_zero is not None and master_zero is not None
              and results == [200] * 4 and fresh_s < 1.0)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("no slot left taken:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
