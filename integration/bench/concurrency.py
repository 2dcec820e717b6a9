#!/usr/bin/env python3
"""Concurrency limits across gatekeepers: does the limit hold, how much of it
is used, and how long a request waits for a slot when demand moves.

Per G (gatekeepers): one smockron-master with a domain under
{ concurrency = N }, the test backend (lib/backends.py: /slow?s=S, counting
requests in flight per X-API-Key), and G smockron-proxy gatekeepers, each
reaching the master through delay_relay.py with a one-way delay D (both
streams). The peer, side by side in the same run: G nginx nodes with
`limit_conn` N per key, what nginx offers (a count per node).

Per (G, D), clients of one key send requests back to back (keep-alive):
- one: C clients through gatekeeper 0 only (a single gatekeeper holds the
  demand): throughput against the reference, N clients straight to the
  backend (the most N slots can carry; goal >= 0.90);
- spread: C clients, each request through a random gatekeeper: throughput;
- moves: N clients (demand exactly at the limit), each request through a
  random gatekeeper: any wait is a slot held elsewhere, so its p50 and p99
  are the cost of demand moving between gatekeepers;
- nginx: the spread load through the G nginx nodes (refused requests retried
  after 50 ms).
Every phase reads the most requests of the key the backend saw at once
(goal: never above N for smockron; nginx lets G x N through).

Then the tenants: a second domain with `shared = [ { concurrency = S } ]`
(--shared, 6) and three tenants through random gatekeepers, two heavy (5x
an equal share of S each, as concurrent clients) and a light one (0.1x: one
client busy a tenth of the time). Per 10 s window: requests served per
tenant, Jain's index of the heavy two (goal >= 0.99), served / capacity
(the reference's rate per slot x S; goal 0.98-1.03), the light one served
all it asked. The same three tenants on a third domain with
`shared = [ { rate = "R/s", burst = R } ]` (--shared-rate, 60) and a 5 s
share_window: the heavy ones as back-to-back clients (held by the
gatekeepers until their share allows), the light one paced at 0.1x an
equal share; served / capacity is against R x the window, counted after
15 s (the shares settle and the first round trip's over-use is paid back).

--smoke: G = 2, D = 0, C = 8, 3 s phases; exit 1 unless every phase ran and
smockron never let more than N through. Needs nginx for the peer (skipped,
and said, when absent).

Run: python3 integration/bench/concurrency.py [-g 3,10] [--delays 0,25,100]
"""
from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from lib.backends import BackendProcess  # noqa: E402
from lib.config import master_toml, proxy_toml  # noqa: E402
from lib.daemons import Daemon  # noqa: E402
from lib.ports import HOST, free_ports  # noqa: E402
from lib.timing import wait_until  # noqa: E402
from proxy_bench import nginx_conf  # noqa: E402

DOMAIN = "c"
KEY = "bench-key"
#: The shared-capacity domain (shared = [ { concurrency = --shared } ]), reached with this Host.
SHARED = "s"
SHARED_HOST = "shared.local"
#: The shared-rate domain (shared = [ { rate = "--shared-rate/s" } ]), reached with this Host.
RATED = "r"
RATED_HOST = "rate.local"


class Cluster:
    """Master, backend, G gatekeepers behind a delay relay, G nginx nodes."""

    def __init__(self, g: int, args, tmp: str):
        self.g, self.args, self.tmp = g, args, tmp
        self.procs: list = []
        acc, ctl, madmin, *rest = free_ports(3 + 6 * g)
        self.acc, self.ctl, self.madmin = acc, ctl, madmin
        self.listen, self.padmin = rest[:g], rest[g:2 * g]
        self.relay_acc, self.relay_ctl = rest[2 * g:3 * g], rest[3 * g:4 * g]
        self.nginx_ports = rest[4 * g:5 * g]
        self.settings = os.path.join(tmp, f"relay-g{g}.txt")

    def start(self):
        a, tmp = self.args, self.tmp
        self.backend = BackendProcess(workdir=tmp).start()
        self.procs.append(self.backend)
        self.set_delay(0, first=True)
        routes = [f"{self.relay_acc[i]}:{HOST}:{self.acc}" for i in range(self.g)]
        routes += [f"{self.relay_ctl[i]}:{HOST}:{self.ctl}" for i in range(self.g)]
        log = open(os.path.join(tmp, f"relay-g{self.g}.log"), "ab")
        self.relay = subprocess.Popen([sys.executable, os.path.join(HERE, "delay_relay.py"), "--settings",
                                       self.settings, *routes], stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs.append(self.relay)
        if self.relay.stdout.readline().strip() != "ready":
            raise RuntimeError("delay relay did not start")
        mconf = os.path.join(tmp, f"master-g{self.g}.toml")
        with open(mconf, "w") as f:
            f.write(master_toml(self.acc, self.ctl, self.madmin,
                                {DOMAIN: {"rules": [{"concurrency": a.limit}]},
                                 SHARED: {"rules": [], "shared": [{"concurrency": a.shared}]},
                                 RATED: {"rules": [], "shared": [{"rate": f"{a.shared_rate}/s", "burst": a.shared_rate}],
                                         "share_window": "5s"}}, probe=False))
        self.master = Daemon("smockron-master", mconf, tmp, args=["--log-level", "warn"], admin_port=self.madmin)
        self.procs.append(self.master)
        self.master.start(ready_timeout=15)
        self.proxies = []
        route = {"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"],
                 "max_delay": "60s"}
        shared_route = dict(route, host=SHARED_HOST, domain=SHARED)
        rated_route = dict(route, host=RATED_HOST, domain=RATED)
        for i in range(self.g):
            conf = os.path.join(tmp, f"proxy-g{self.g}-{i}.toml")
            with open(conf, "w") as f:
                f.write(proxy_toml(self.listen[i], self.padmin[i],
                                   {"app": {"servers": [f"{HOST}:{self.backend.port}"], "keepalive": 256}},
                                   [shared_route, rated_route, route],
                                   [f"tcp://{HOST}:{self.relay_acc[i]}"], [f"tcp://{HOST}:{self.relay_ctl[i]}"],
                                   threads=1, max_held=100000))
            p = Daemon("smockron-proxy", conf, tmp, args=["--log-level", "warn"], admin_port=self.padmin[i])
            self.procs.append(p)
            self.proxies.append(p)
            p.start(ready_timeout=15)
        for p in self.proxies:
            p.wait_metric("smockron_proxy_accounting_links_subscribed", predicate=lambda v: v >= 1, timeout=15)
            p.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v >= 1, timeout=15)
        self.nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if self.nginx:
            for i, port in enumerate(self.nginx_ports):
                prefix = os.path.join(tmp, f"nginx-g{self.g}-{i}")
                os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
                conf = nginx_conf(prefix, f"""
  limit_conn_zone $http_x_api_key zone=perkey:1m;
  limit_conn_status 429;
  upstream app {{ server {HOST}:{self.backend.port}; keepalive 64; }}
  server {{ listen {HOST}:{port};
    location / {{ limit_conn perkey {a.limit}; proxy_pass http://app; proxy_http_version 1.1;
      proxy_set_header Connection ""; }} }}""")
                proc = subprocess.Popen([self.nginx, "-c", conf, "-p", prefix], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                self.procs.append(proc)
            for port in self.nginx_ports:
                wait_until(lambda port=port: _status(port, "/__ping") == 200, 10, message=f"nginx on {port}")

    def set_delay(self, delay_ms: float, first: bool = False):
        with open(self.settings + ".tmp", "w") as f:
            f.write(f"{delay_ms} 0\n")
        os.replace(self.settings + ".tmp", self.settings)
        if not first:
            self.relay.send_signal(signal.SIGHUP)
            time.sleep(0.1 + 2 * delay_ms / 1000)

    def stop(self):
        for p in reversed(self.procs):
            try:
                if isinstance(p, subprocess.Popen):
                    p.terminate()
                    p.wait(5)
                else:
                    p.stop()
            except Exception:  # noqa: BLE001 - stopping what is left
                pass


def _status(port: int, path: str) -> int:
    c = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def load(ports: list[int], clients: int, seconds: float, service: float) -> dict:
    """`clients` threads, each sending back to back to a random port of `ports` for `seconds`."""
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    done, refused, waits = [0], [0], []

    def client():
        conns: dict[int, http.client.HTTPConnection] = {}
        rng = random.Random()
        while time.monotonic() < stop:
            port = rng.choice(ports)
            c = conns.get(port) or conns.setdefault(port, http.client.HTTPConnection(HOST, port, timeout=120))
            t0 = time.monotonic()
            try:
                c.request("GET", f"/slow?s={service}", headers={"X-API-Key": KEY})
                r = c.getresponse()
                r.read()
            except (OSError, http.client.HTTPException):
                conns.pop(port).close()
                continue
            with lock:
                if r.status == 200:
                    done[0] += 1
                    waits.append(time.monotonic() - t0 - service)
                else:
                    refused[0] += 1
            if r.status != 200:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)
    elapsed = time.monotonic() - t0
    waits.sort()
    pick = (lambda q: waits[min(len(waits) - 1, int(q * len(waits)))]) if waits else (lambda q: float("nan"))
    return {"done": done[0], "refused": refused[0], "rate": done[0] / elapsed, "p50": pick(0.5), "p99": pick(0.99)}


def tenants(cluster: Cluster, args, rated: bool = False) -> dict:
    """Three tenants on a shared domain, through random gatekeepers: two heavy (5x an equal share
    each) and a light one (0.1x). Shared concurrency (--shared): the heavy ones as concurrent
    clients, the light one a client busy a tenth of the time. Shared rate (`rated`,
    --shared-rate): the heavy ones as back-to-back clients (held until their share allows), the
    light one paced. Requests served per tenant in each 10 s window (--seconds for shorter runs)."""
    if rated:
        equal = args.shared_rate / 3
        heavy_clients, path, host = 4, "/", RATED_HOST
        light_gap = 1 / (0.1 * equal)
    else:
        equal = args.shared / 3
        heavy_clients, path, host = max(1, round(5 * equal)), f"/slow?s={args.service}", SHARED_HOST
        light_gap = args.service / (0.1 * equal) - args.service  # one request, then idle: 0.1 x equal busy
    window = min(10.0, args.seconds)
    windows = max(1, round(args.tenant_seconds / window))
    # The rated domain's shares settle first, outside the windows counted: a
    # share window, and the payback of what the gatekeepers let through in
    # the first round trip (each up to the shared burst and rate x RTT per
    # tenant, charged in full).
    settle = (6.0 if args.smoke else 15.0) if rated else 0.0
    t0 = time.monotonic() + settle
    stop = t0 + windows * window
    counts = {name: [0] * windows for name in ("heavy-a", "heavy-b", "light")}
    lock = threading.Lock()

    def client(name: str, gap: float):
        conns: dict[int, http.client.HTTPConnection] = {}
        rng = random.Random()
        next_at = time.monotonic()
        while time.monotonic() < stop:
            port = rng.choice(cluster.listen)
            c = conns.get(port) or conns.setdefault(port, http.client.HTTPConnection(HOST, port, timeout=120))
            try:
                c.request("GET", path, headers={"X-API-Key": name, "Host": host})
                r = c.getresponse()
                r.read()
            except (OSError, http.client.HTTPException):
                conns.pop(port).close()
                continue
            w = int((time.monotonic() - t0) / window) if time.monotonic() >= t0 else -1
            if r.status == 200 and 0 <= w < windows:
                with lock:
                    counts[name][w] += 1
            if gap > 0 and rated:
                next_at += gap  # paced: a request every `gap` whatever the answer took
                time.sleep(max(0.0, next_at - time.monotonic()))
            elif gap > 0:
                time.sleep(gap)  # busy one request, then idle

    cluster.backend.reset()
    threads = [threading.Thread(target=client, args=(n, 0.0), daemon=True)
               for n in ("heavy-a", "heavy-b") for _ in range(heavy_clients)]
    threads.append(threading.Thread(target=client, args=("light", light_gap), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(settle + windows * window + 180)
    jain = [(a + b) ** 2 / (2 * (a * a + b * b)) if a + b else 0.0
            for a, b in zip(counts["heavy-a"], counts["heavy-b"])]
    per_window = [sum(counts[n][w] for n in counts) for w in range(windows)]
    return {"counts": counts, "jain_min": min(jain), "served": per_window, "window": window,
            "light_wanted": window / (light_gap if rated else args.service + light_gap),
            "max": cluster.backend.inflight()["max"].get("*", 0)}


def phase(cluster: Cluster, ports: list[int], args, clients: int | None = None) -> dict:
    cluster.backend.reset()
    out = load(ports, clients or args.clients, args.seconds, args.service)
    out["max"] = cluster.backend.inflight()["max"].get(KEY, 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-g", default="3,10", help="gatekeeper counts, comma-separated")
    ap.add_argument("--delays", default="0,25,100", help="one-way delays in ms to the master, comma-separated")
    ap.add_argument("--limit", type=int, default=4, help="the concurrency rule's N")
    ap.add_argument("--clients", type=int, default=30, help="concurrent clients of the one key")
    ap.add_argument("--service", type=float, default=0.2, help="the backend's service time in seconds")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    ap.add_argument("--shared", type=int, default=6, help="the shared domain's concurrency (the tenants' phase)")
    ap.add_argument("--shared-rate", type=int, default=60, help="the shared-rate domain's requests a second")
    ap.add_argument("--tenant-seconds", type=float, default=20.0, help="length of the tenants' phase")
    ap.add_argument("--smoke", action="store_true", help="G = 2, D = 0, 8 clients, 3 s phases; checks only")
    args = ap.parse_args()
    if args.smoke:
        args.g, args.delays, args.clients, args.seconds, args.tenant_seconds = "2", "0", 8, 3.0, 3.0
    print(f"concurrency = {args.limit}, {args.clients} clients of one key (moves: {args.limit}), service "
          f"{args.service * 1000:.0f} ms, {args.seconds:g} s per phase")
    print(f"{'G':>3} {'one-way':>8} | {'ref req/s':>9} | {'one: req/s':>10} {'/ref':>5} {'max':>3} | "
          f"{'spread: req/s':>13} {'/ref':>5} {'max':>3} | {'moves: wait p50':>15} {'p99':>7} {'max':>3} | "
          f"{'nginx: req/s':>12} {'refused':>7} {'max':>3}")
    ok = True
    for g in [int(x) for x in args.g.split(",")]:
        tmp = tempfile.mkdtemp(prefix=f"smockron-concurrency-g{g}-")
        cluster = Cluster(g, args, tmp)
        try:
            cluster.start()
            # The reference and the peer talk to no master: the same at every distance.
            ref = phase(cluster, [cluster.backend.port], args, clients=args.limit)
            ng = phase(cluster, cluster.nginx_ports, args) if cluster.nginx else None
            for d in [float(x) for x in args.delays.split(",")]:
                cluster.set_delay(d)
                one = phase(cluster, [cluster.listen[0]], args)
                spread = phase(cluster, cluster.listen, args)
                moves = phase(cluster, cluster.listen, args, clients=args.limit)
                ok = ok and all(p["max"] <= args.limit and p["done"] > 0 for p in (one, spread, moves))
                peer = f"{ng['rate']:12.1f} {ng['refused']:7d} {ng['max']:3d}" if ng else f"{'(no nginx)':>24}"
                print(f"{g:>3} {d:>6.0f}ms | {ref['rate']:9.1f} | {one['rate']:10.1f} {one['rate'] / ref['rate']:5.2f} "
                      f"{one['max']:3d} | {spread['rate']:13.1f} {spread['rate'] / ref['rate']:5.2f} "
                      f"{spread['max']:3d} | {moves['p50'] * 1000:13.0f}ms {moves['p99'] * 1000:5.0f}ms "
                      f"{moves['max']:3d} | {peer}", flush=True)
                t = tenants(cluster, args)
                capacity = ref["rate"] / args.limit * args.shared * t["window"]  # what S slots serve in a window
                ok = ok and t["max"] <= args.shared and min(t["counts"]["light"]) > 0
                c = t["counts"]
                print(f"    tenants (shared {args.shared}, {t['window']:g} s windows): heavy-a {c['heavy-a']} "
                      f"heavy-b {c['heavy-b']} light {c['light']} (wants ~{t['light_wanted']:.0f}); "
                      f"Jain(heavy) min {t['jain_min']:.3f}; served/capacity "
                      f"{min(t['served']) / capacity:.3f}-{max(t['served']) / capacity:.3f}; max {t['max']}",
                      flush=True)
                t = tenants(cluster, args, rated=True)
                capacity = args.shared_rate * t["window"]
                ok = ok and min(t["counts"]["light"]) > 0
                c = t["counts"]
                print(f"    rate tenants (shared {args.shared_rate}/s, {t['window']:g} s windows): heavy-a "
                      f"{c['heavy-a']} heavy-b {c['heavy-b']} light {c['light']} (wants ~{t['light_wanted']:.0f}); "
                      f"Jain(heavy) min {t['jain_min']:.3f}; served/capacity "
                      f"{min(t['served']) / capacity:.3f}-{max(t['served']) / capacity:.3f}", flush=True)
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    print("limit held (smockron never above N):", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
