"""Exact admission with the real binaries (docs/configuration.md, `admission`;
docs/architecture.md, "Exact admission"):

- three gatekeepers, each 50 ms from the master (bench/delay_relay.py on both
  streams), and a fresh client that sends its requests to all three at once:
  no more than the burst reaches the backend, over HTTP/1.1 and HTTP/2 alike
  (without exact admission each gatekeeper lets the burst through before the
  master can speak: the round trip is what this closes); the others are
  refused with the route's status and a Retry-After;
- a client under its limit is served (one round trip later), and what went is
  settled at the master (no GO left open);
- a master that stops answering leaves requests waiting at most control_fresh,
  then they go (fail-open), counted;
- a request the master refuses gives its units back to the gatekeeper's own
  count (the guard), which would otherwise hold the client past the time the
  master named, and carries the RateLimit fields and the `explain` field as
  the gate's own refusals do.

Run: cd integration && python3 -m unittest -v test_exact
"""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.config import WARM_DOMAIN, WARM_ROUTE  # noqa: E402
from lib.h2client import H2Client  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

G = 3
ONE_WAY_MS = 50
BURST = 6
RATE = "6/min"  # one unit back every 10 s: within a test, the burst is all there is


class ExactAdmissionTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.master = self.start_master({
            "x": {"rules": [(RATE, BURST)], "algorithm": "gcra", "admission": "exact"},
            "xs": {"rules": [(RATE, BURST)], "admission": "exact"},  # the sliding log
            WARM_DOMAIN: {"rules": [("1/h", 1)]}})
        self.backend = self.start_backend()
        relay = self.start_relay(self.master, G, ONE_WAY_MS)
        routes = [WARM_ROUTE] + [
            {"path": f"/{d}/", "domain": d, "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
             "max_delay": "1s"} for d in ("x", "xs")]
        self.proxies = []
        for i in range(G):
            p = self.start_proxy({"app": {"servers": [f"{HOST}:{self.backend.port}"]}}, routes,
                                 accounting=[f"tcp://{HOST}:{relay[i]}"], control=[f"tcp://{HOST}:{relay[G + i]}"],
                                 config_name=f"proxy-{i}.toml", threads=2)
            self.proxies.append(p)
        for i, p in enumerate(self.proxies):
            self.wait_connected(p)
            self.wait_accounting(p)
            self.prime(p, key_prefix=f"warm-{i}-")
            # Both domains' EXACT heard (published with their POLICY).
            p.wait_metric("smockron_proxy_control_exact_total", predicate=lambda v: v >= 2, timeout=10)

    def served(self, key: str) -> int:
        return sum(1 for e in self.backend.log() if e["key"] == key)

    def burst_everywhere(self, path: str, key: str, per_proxy: int, h2: bool) -> list[tuple[int, str | None]]:
        """`per_proxy` requests of `key` to every gatekeeper at once; (status, Retry-After) of each."""
        out: list = []
        lock = threading.Lock()

        def h1(port: int):
            r, _ = fetch(port, path, key=key, timeout=10)
            with lock:
                out.append((r.status, r.headers.get("retry-after")))

        def h2_all(port: int):
            with H2Client(port, timeout=10.0) as c:
                sids = [c.request(path, headers=[("x-api-key", key)]) for _ in range(per_proxy)]
                got = [c.response(sid) for sid in sids]
            with lock:
                out.extend((st.status, st.header("retry-after")) for st in got)

        threads = []
        for p in self.proxies:
            if h2:
                threads.append(threading.Thread(target=h2_all, args=(p.port,)))
            else:
                threads += [threading.Thread(target=h1, args=(p.port,)) for _ in range(per_proxy)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(len(out), per_proxy * G, out)
        return out

    def check_burst_holds(self, path: str, key: str, h2: bool):
        out = self.burst_everywhere(path, key, 4, h2)
        ok = [o for o in out if o[0] == 200]
        refused = [o for o in out if o[0] != 200]
        # The burst at most, whoever asked; and everything the master let go reached the backend.
        self.assertLessEqual(len(ok), BURST, out)
        self.assertGreaterEqual(len(ok), 1, out)
        self.assertEqual(self.served(key), len(ok))
        for status, retry in refused:
            self.assertEqual(status, 429, out)
            self.assertIsNotNone(retry, out)
            self.assertGreaterEqual(int(retry), 1)
        # What went is settled: no GO stays open at the master.
        wait_until(lambda: self.master.metric("smockron_master_asks_open_units") == 0, 10,
                   message="every GO settled by its accounting")
        return ok

    def test_the_burst_holds_across_distant_gatekeepers_http1(self):
        self.check_burst_holds("/x/a", "fresh-1", h2=False)
        self.check_burst_holds("/xs/a", "fresh-2", h2=False)

    def test_the_burst_holds_across_distant_gatekeepers_http2(self):
        self.check_burst_holds("/x/a", "fresh-3", h2=True)

    def test_a_client_under_its_limit_is_served(self):
        for p in self.proxies:
            t0 = time.monotonic()
            r, _ = fetch(p.port, "/x/calm", key="calm", timeout=10)
            self.assertEqual(r.status, 200)
            # One round trip to the master (100 ms here) and no hold.
            self.assertGreaterEqual(time.monotonic() - t0, 2 * ONE_WAY_MS / 1000)
        self.assertEqual(self.served("calm"), G)
        self.assertGreaterEqual(self.master.metric("smockron_master_asks_total", {"verdict": "go"}), G)
        wait_until(lambda: (self.master.metric("smockron_master_asks_settled_total") or 0) >= G, 10,
                   message="the GOs settled")

    def test_a_silent_master_means_the_request_goes(self):
        os.kill(self.master.proc.pid, signal.SIGSTOP)
        try:
            r, elapsed = fetch(self.proxies[0].port, "/x/alone", key="alone", timeout=15)
        finally:
            os.kill(self.master.proc.pid, signal.SIGCONT)
        self.assertEqual(r.status, 200)
        self.assertGreaterEqual(elapsed, 1.5)  # control_fresh (2 s) without an answer
        self.assertEqual(self.proxies[0].metric("smockron_proxy_exact_unanswered_total"), 1)


class ExactRefusalTest(DaemonTestCase):
    # Five rules: a gatekeeper is told the first four (POLICY carries at most
    # four), so its own count (the guard) allows 12 units with one back every
    # 10 s, while the master also holds the client to 6 with one back a
    # second. The master alone refuses the second request below.
    RULES = [("6/min", 12), ("1000/s", 1000), ("1000/s", 1000), ("1000/s", 1000), ("1/s", 6)]

    def test_a_refused_request_gives_its_units_back_to_the_gatekeeper(self):
        master, backend, proxy = self.gate_stack(
            {"x": {"rules": self.RULES, "algorithm": "gcra", "admission": "exact"}},
            [{"path": "/x/", "domain": "x", "upstream": "app", "identify": ["header:X-API-Key"],
              "cost": "header:X-Cost", "status": 429, "max_delay": "100ms", "ratelimit_headers": True,
              "explain": True}])
        proxy.wait_metric("smockron_proxy_control_exact_total", predicate=lambda v: v >= 1, timeout=10)

        def send(cost: int):
            r, _ = fetch(proxy.port, "/x/a", key="k", headers=[("X-Cost", str(cost))], timeout=10)
            return r.status, r.headers.get("ratelimit") or ""

        def left(field: str) -> int:
            """What the guard's policy "x-1" says is left (RateLimit: "x-1";r=N;...)."""
            m = re.search(r'"x-1";r=(\d+)', field)
            self.assertIsNotNone(m, field)
            return int(m.group(1))

        status, field = send(2)
        self.assertEqual((status, left(field)), (200, 10))
        # The guard has room (7 of 12); the master's 1/s rule has none for 1 s,
        # beyond max_delay: refused, and the gate's count of the 5 units given back.
        r, _ = fetch(proxy.port, "/x/a", key="k", headers=[("X-Cost", "5")], timeout=10)
        self.assertEqual(r.status, 429)
        self.assertEqual(proxy.metric("smockron_proxy_rejects_total", {"reason": "delay_too_long"}), 1)
        # The master's refusal tells the client its standing as the gate's own refusals do:
        # a limit at r=0 until no sooner than Retry-After, and why (explain).
        retry = int(r.headers.get("retry-after") or "0")
        self.assertGreaterEqual(retry, 1, r.headers)
        zeros = [int(t) for t in re.findall(r";r=0;t=(\d+)", r.headers.get("ratelimit") or "")]
        self.assertTrue(zeros and max(zeros) >= retry, f"RateLimit {r.headers.get('ratelimit')!r}, Retry-After {retry}")
        self.assertEqual(r.headers.get("smockron-decision"), "rejected;reason=delay_too_long")
        # Once the master's second has passed it lets 1 more go. The guard then
        # has 3 used of 12 (9 left, 10 if a unit came back meanwhile); had it
        # kept the refused 5 it would say 4 or less.
        status, field = wait_until(lambda: (lambda x: x if x[0] == 200 else None)(send(1)), 20, interval=0.3,
                                   message="the master never let the third request go")
        self.assertGreaterEqual(left(field), 9, field)
        self.assertEqual(sum(1 for e in backend.log() if e["key"] == "k"), 2)
    def test_a_refusal_by_the_master_tells_the_client_its_standing_over_both_protocols(self):
        # The fifth rule, 6 an hour, is the master's alone: with 5 units used the
        # gatekeeper's own count has room for 2 more and the master does not hold the
        # client (one unit is left: no DELAY_UNTIL), so only its answer to the ASK refuses.
        rules = self.RULES[:4] + [("1/h", 6)]
        master, backend, proxy = self.gate_stack(
            {"y": {"rules": rules, "algorithm": "gcra", "admission": "exact"}},
            [{"path": "/y/", "domain": "y", "upstream": "app", "identify": ["header:X-API-Key"],
              "cost": "header:X-Cost", "status": 429, "max_delay": "1s", "explain": True}])
        proxy.wait_metric("smockron_proxy_control_exact_total", predicate=lambda v: v >= 1, timeout=10)
        for key in ("k1", "k2"):  # one client a protocol: a second refusal would be the gate's, from the first
            r, _ = fetch(proxy.port, "/y/a", key=key, headers=[("X-Cost", "5")], timeout=10)
            self.assertEqual(r.status, 200)
        # (An ASK beside a GO still open is told to ask again: the GOs settle first.)
        wait_until(lambda: (master.metric("smockron_master_asks_settled_total") or 0) >= 2, 10,
                   message="the GOs settled by their accounting")

        def check(status: int, retry: str | None, ratelimit: str | None, decision: str | None):
            self.assertEqual(status, 429)
            self.assertGreater(int(retry or "0"), 3000, "an hour's unit, told as Retry-After")
            zeros = [int(t) for t in re.findall(r";r=0;t=(\d+)", ratelimit or "")]
            self.assertTrue(zeros and max(zeros) >= int(retry), f"RateLimit {ratelimit!r}, Retry-After {retry}")
            self.assertEqual(decision, "rejected;reason=delay_too_long")

        r, _ = fetch(proxy.port, "/y/a", key="k1", headers=[("X-Cost", "2")], timeout=10)
        check(r.status, r.headers.get("retry-after"), r.headers.get("ratelimit"), r.headers.get("smockron-decision"))
        with H2Client(proxy.port, timeout=10.0) as c:
            st = c.get("/y/a", headers=[("x-api-key", "k2"), ("x-cost", "2")])
        check(st.status, st.header("retry-after"), st.header("ratelimit"), st.header("smockron-decision"))
        self.assertEqual(sorted(e["key"] for e in backend.log() if e["key"] in ("k1", "k2")), ["k1", "k2"],
                         "a refused request was forwarded")
        self.assertEqual(master.metric("smockron_master_asks_total", {"verdict": "wait"}), 2,
                         "both refusals were the master's answer")


if __name__ == "__main__":
    unittest.main()
