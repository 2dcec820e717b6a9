"""The global limit holds when gatekeepers are far from the master.

One smockron-master and two smockron-proxy gatekeepers, each reaching the
master through its own delay relay path (bench/delay_relay.py, 60 ms one way,
both the accounting and the control stream), a counting backend, all on
127.0.0.1. A hot client sends at 10x its limit (20/s burst 5) spread over both
gatekeepers, open loop, for a few seconds, on a sliding-log and a GCRA domain
at once; a calm client on each domain sends at half its limit.

At 60 ms one way the round trip (120 ms) is longer than the rule's interval
(50 ms): with the spec's formula alone every DELAY_UNTIL arrived in the past and
the hot client passed unlimited. Now:
  - before the master's first DELAY_UNTIL can arrive, each gatekeeper admits at
    most burst + rate x elapsed on its own (the guard, from the POLICY the
    master sent when it subscribed): 24 unguarded, at most 16.8 here;
  - admitted (at the backend) within [t0, t0 + D) is burst + rate x D within a
    few requests: what gatekeepers admit before they hear from the master is
    charged and paid back;
  - no 1 s window holds more than rate + burst + G + hot rate x round trip;
  - the calm clients are never delayed or rejected.
And a silent master still means fail-open: once the master is gone and its
policy has gone stale, the hot client passes; unless the proxy is configured
fail_closed, which then refuses with 503 + Retry-After (FailClosedTest).

Run: cd integration && python3 -m unittest -v test_distance
"""
from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (  # noqa: E402
    HOST,
    WARM_DOMAIN,
    WARM_ROUTE,
    DaemonTestCase,
    ProxyProcess,
    fetch,
    free_ports,
    max_in_window,
    metric_sum,
    stop_process,
    wait_until,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ONE_WAY_MS = 60
RATE, BURST = 20, 5
HOT_FACTOR = 10
D = 4.0
G = 2
POLICY_FRESH_S = 3.5  # wire::policy_fresh_ms


async def one_request(port: int, target: str, key: str) -> int:
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return int(line.split()[1])
    except (OSError, asyncio.TimeoutError, IndexError, ValueError):
        return -1


async def open_loop(ports: list[int], clients: list[tuple[str, str, float]], duration: float) -> dict:
    """clients: (domain, key, rate/s). Every request leaves at its scheduled time,
    round robin over the gatekeepers; returns {key: [status, ...]}."""
    t0 = time.time() + 0.2
    sched = []
    for domain, key, rate in clients:
        n = int(duration * rate)
        sched += [(t0 + i / rate, domain, key, i) for i in range(n)]
    sched.sort()
    tasks = []
    for t, domain, key, i in sched:
        d = t - time.time()
        if d > 0:
            await asyncio.sleep(d)
        tasks.append((key, asyncio.ensure_future(one_request(ports[i % len(ports)], f"/{domain}/{key}/{i}", key))))
    out: dict[str, list[int]] = {}
    for key, task in tasks:
        out.setdefault(key, []).append(await task)
    return {"t0": t0, "status": out}


class DistanceTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.master = self.start_master({"sl": {"rules": [(f"{RATE}/s", BURST)]},
                                         "gc": {"rules": [(f"{RATE}/s", BURST)], "algorithm": "gcra"},
                                         WARM_DOMAIN: {"rules": [("1/h", 1)]}})
        self.backend = self.start_backend()
        relay_ports = self.start_relay()
        route = lambda d: {"path": f"/{d}/", "domain": d, "upstream": "app", "identify": ["header:X-API-Key"]}  # noqa: E731
        self.proxies = [
            self.start_proxy({"app": {"servers": [f"{HOST}:{self.backend.port}"]}},
                             [route("sl"), route("gc"), WARM_ROUTE],
                             accounting=[f"tcp://{HOST}:{relay_ports[i]}"],
                             control=[f"tcp://{HOST}:{relay_ports[G + i]}"], config_name=f"proxy-{i}.toml",
                             args=["--log-level", "info"], threads=1, max_delay="1s", access_log=True,
                             access_log_format="json", access_log_path=os.path.join(self.tmp, f"access-{i}.log"))
            for i in range(G)]
        for p in self.proxies:
            self.wait_connected(p)
            self.prime(p)
            # The master's rules (POLICY, every second) have reached the gatekeeper.
            wait_until(lambda p=p: (p.metric("smockron_proxy_control_policies_total") or 0) >= 2, 5,
                       message="POLICY reached the gatekeeper")

    def start_relay(self, attempts: int = 5) -> list[int]:
        """bench/delay_relay.py on 2 x G fresh ports: G to the master's accounting endpoint,
        then G to its control endpoint. It binds them all, then says "ready"; one taken
        meanwhile makes it exit instead, and it is tried again with new ports."""
        log = os.path.join(self.tmp, "delay_relay.stderr.log")
        self.log_files.append(("delay_relay", log))
        for _ in range(attempts):
            relay_ports = free_ports(2 * G)
            routes = [f"{relay_ports[i]}:{HOST}:{self.master.accounting_port}" for i in range(G)]
            routes += [f"{relay_ports[G + i]}:{HOST}:{self.master.control_port}" for i in range(G)]
            with open(log, "ab") as err:
                relay = subprocess.Popen([sys.executable, os.path.join(HERE, "bench", "delay_relay.py"),
                                          "--delay-ms", str(ONE_WAY_MS), *routes],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
            self.addCleanup(stop_process, relay)
            try:
                said = relay.stdout.readline() if select.select([relay.stdout], [], [], 10)[0] else b""
            finally:
                relay.stdout.close()  # "ready" is all it ever prints
            if said.strip() == b"ready":
                return relay_ports
            stop_process(relay)
            with open(log, "rb") as f:
                if b"Address already in use" not in f.read():
                    raise AssertionError(f"delay_relay.py did not start (said {said!r}); see {log}")
        raise AssertionError(f"delay_relay.py could not bind its ports in {attempts} attempts")

    def decisions(self, key: str) -> list[str]:
        out = []
        for i in range(len(self.proxies)):
            with open(os.path.join(self.tmp, f"access-{i}.log")) as f:
                for line in f:
                    e = json.loads(line)
                    if e["method"] == "GET" and f"/{key}/" in e["target"]:
                        out.append(e["decision"])
        return out

    def test_hot_client_is_limited_across_distant_gatekeepers(self):
        ports = [p.port for p in self.proxies]
        clients = [("sl", "hot-sl", HOT_FACTOR * RATE), ("gc", "hot-gc", HOT_FACTOR * RATE),
                   ("sl", "calm-sl", RATE / 2), ("gc", "calm-gc", RATE / 2)]
        res = asyncio.run(open_loop(ports, clients, D))
        time.sleep(1.2)  # held requests (max_delay 1 s) reach the backend
        t0 = res["t0"]
        ideal = BURST + RATE * D
        # The round trip as the protocol sees it: both relay legs, plus the proxy's accounting
        # batch (2 ms) and scheduling on a busy machine (a generous 20 ms in all).
        rtt = 2 * ONE_WAY_MS / 1000 + 0.02
        window_bound = RATE + BURST + G + HOT_FACTOR * RATE * rtt
        nominal_rtt = 2 * ONE_WAY_MS / 1000
        first_rtt_bound = G * (BURST + RATE * nominal_rtt) + G  # + G: one paced release per gatekeeper at the edge
        for key in ("hot-sl", "hot-gc"):
            with self.subTest(key=key):
                arrivals = sorted(e["t"] for e in self.backend.requests(key=key) if t0 <= e["t"] < t0 + D)
                first = sum(1 for t in arrivals if t < t0 + nominal_rtt)
                self.assertLessEqual(first, first_rtt_bound, "the first round trip is not bounded by the gatekeepers")
                sys.stderr.write(f"\n[measured] {key}: first round trip {first} (bound {first_rtt_bound:g}); "
                                 f"admitted {len(arrivals)} in {D:g} s (ideal {ideal:g}, bound "
                                 f"{ideal + G + (G - 1) * (nominal_rtt * RATE + 1):.1f}, "
                                 f"{len(arrivals) / ideal:.3f}); max in 1 s {max_in_window(arrivals, 1.0)} "
                                 f"(bound {window_bound:g}); one-way delay {ONE_WAY_MS} ms\n")
                # Upper: the ideal, plus one use per gatekeeper (a release racing the window's end),
                # plus what is still owed when the window closes: slots two gatekeepers reserved
                # inside the last round trip (both charged, the second paid back after the end).
                owed = (G - 1) * (nominal_rtt * RATE + 1)
                self.assertLessEqual(len(arrivals), ideal + G + owed)
                # Lower: the limit does not over-throttle (held releases on a busy machine may run late).
                self.assertGreaterEqual(len(arrivals), 0.85 * ideal)
                self.assertLessEqual(max_in_window(arrivals, 1.0), window_bound)
                self.assertTrue(all(s in (200, 503) for s in res["status"][key]), res["status"][key])
        for key in ("calm-sl", "calm-gc"):
            with self.subTest(key=key):
                self.assertEqual(set(res["status"][key]), {200})
                decisions = self.decisions(key)
                self.assertEqual(len(decisions), len(res["status"][key]))
                self.assertEqual(set(decisions), {"accepted"}, "a client under its limit was held")
        text = self.master.metrics()
        self.assertGreater(metric_sum(text, "smockron_master_control_messages_total"), 0)

    def test_silent_master_means_fail_open(self):
        self.master.kill()
        # The last POLICY goes stale; the gatekeepers' own bound goes with it.
        time.sleep(POLICY_FRESH_S + 0.3)
        ports = [p.port for p in self.proxies]
        res = asyncio.run(open_loop(ports, [("sl", "after-sl", HOT_FACTOR * RATE)], 1.0))
        self.assertEqual(set(res["status"]["after-sl"]), {200})
        self.assertEqual(set(self.decisions("after-sl")), {"accepted"})


class FailClosedTest(DaemonTestCase):
    """fail_closed: a route whose domain no master covers (none reachable, or the
    last POLICY older than 3.5 s) is refused with 503 + Retry-After, not passed."""

    def start_fail_closed_proxy(self, accounting: str, control: str) -> ProxyProcess:
        if not hasattr(self, "backend"):
            self.backend = self.start_backend()
        route = {"path": "/", "domain": "open", "upstream": "app", "identify": ["header:X-API-Key"]}
        return self.start_proxy({"app": {"servers": [f"{HOST}:{self.backend.port}"]}}, [route],
                                accounting=[accounting], control=[control],
                                config_name=f"proxy-{len(self.daemons)}.toml", threads=1, fail_closed=True)

    def test_refused_without_a_master_and_served_with_one(self):
        # "open" has no rules: only its (empty) POLICY tells the proxy a master covers it.
        master = self.start_master({"open": {"rules": []}})
        proxy = self.start_fail_closed_proxy(master.accounting, master.control)
        wait_until(lambda: fetch(proxy.port, "/", key="k")[0].status == 200, 10,
                   message="served once the master's POLICY arrived")
        master.kill()
        t_kill = time.monotonic()
        wait_until(lambda: fetch(proxy.port, "/", key="k")[0].status == 503, POLICY_FRESH_S + 5,
                   message="refused once the POLICY went stale")
        self.assertGreaterEqual(time.monotonic() - t_kill, POLICY_FRESH_S - 0.5)
        r, _ = fetch(proxy.port, "/", key="k")
        self.assertEqual(r.status, 503)
        self.assertEqual(r.headers.get("retry-after"), "1")
        self.assertIn("fail_closed", proxy.readyz())
        self.assertGreaterEqual(metric_sum(proxy.metrics(), "smockron_proxy_rejects_total", reason="no_master"), 1)
        # A proxy that never reached a master refuses from the start.
        lonely = self.start_fail_closed_proxy(self.dead_endpoint(), self.dead_endpoint())
        self.assertEqual(fetch(lonely.port, "/", key="k")[0].status, 503)


if __name__ == "__main__":
    unittest.main()
