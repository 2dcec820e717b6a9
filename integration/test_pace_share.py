"""Pace share with the real binaries (docs/configuration.md, `pace_share`;
docs/architecture.md): the interval a held client's DELAY_UNTIL carries is
the rule's times the gatekeepers that report the client, so that each paces
its share.

- two proxies of two workers each (four accounting connections), a client
  held at both: the master's DELAY_UNTIL for it says up to 200 ms (10/s,
  two gatekeepers; a little less while one has reserved more than the
  other), never more (it counts gatekeepers, which name themselves on their
  connections, not the connections);
- the same client at one proxy only says 100 ms, the rule's interval;
- once a proxy is killed (its connections close), the DELAY_UNTILs for a
  client the two held say 100 ms again at once, not after the two windows
  the dead proxy's messages would take to age out of the count;
- with the master's defaults (pace share on), two gatekeepers with three
  closed-loop connections each of one client far over its limit get the
  whole rate, under GCRA and under an exactly logged rule, which is not
  shared: its next allowed time never goes back to a slot a share left
  free, and shared it got 0.75 of the rate in half the runs.

A pyzmq SUB on the master's control endpoint reads the DELAY_UNTILs.

Run: cd integration && python3 -m unittest -v test_pace_share
"""
from __future__ import annotations

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.config import WARM_DOMAIN, WARM_ROUTE  # noqa: E402
from lib.gatekeeper import Gatekeeper  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.metrics import HELD  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

DOMAIN = "paced"
WAVE = 6  # requests to each proxy at once, each on its own connection (so on either worker)


class PaceShareTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.master = self.start_master({DOMAIN: {"rules": [("10/s", 2)], "algorithm": "gcra"},
                                         WARM_DOMAIN: {"rules": [("1/h", 1)]}}, pace_share=True)
        self.backend = self.start_backend()
        routes = [WARM_ROUTE, {"path": "/p/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"],
                               "max_delay": "3s"}]
        self.proxies = []
        for i in range(2):
            p = self.start_proxy({"app": {"servers": [f"{HOST}:{self.backend.port}"]}}, routes,
                                 accounting=[self.master.accounting], control=[self.master.control],
                                 config_name=f"proxy-{i}.toml", threads=2)
            self.wait_connected(p)
            self.wait_accounting(p)
            self.prime(p, key_prefix=f"warm-{i}-")
            self.proxies.append(p)
        self.sniffer = Gatekeeper(self.master.accounting, self.master.control, [DOMAIN])
        self.addCleanup(self.sniffer.close)
        self.sniffer.handshake()

    def wave(self, key: str, proxies) -> None:
        """WAVE requests of `key` to each of `proxies` at once; waits for their answers."""
        threads = [threading.Thread(target=fetch, args=(p.port, "/p/x"), kwargs={"key": key, "timeout": 10})
                   for p in proxies for _ in range(WAVE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)

    def intervals(self, key: str, proxies, enough, deadline_s: float = 20.0) -> set[int]:
        """Sends waves (three at least, so that both workers of a proxy take part) until the
        intervals of the DELAY_UNTILs for `key` are `enough` (bounded); every interval seen."""
        seen: set[int] = set()
        deadline = time.monotonic() + deadline_s
        waves = 0
        while (not enough(seen) or waves < 3) and time.monotonic() < deadline:
            waves += 1
            self.wave(key, proxies)
            for m in self.sniffer.drain(0.2):
                if m.command == "DELAY_UNTIL" and m.identifier == key and m.interval_ms is not None:
                    seen.add(m.interval_ms)
        return seen

    def test_a_client_held_at_two_gatekeepers_is_paced_at_half_the_rate_at_each(self):
        # The effective number of gatekeepers is 2 when both reserve alike, a
        # little less when one has reserved more: 150 ms and more is two
        # gatekeepers counted; over 200 would be their four connections.
        seen = self.intervals("both", self.proxies, lambda s: any(v > 150 for v in s))
        self.assertTrue(any(v > 150 for v in seen), f"two gatekeepers not counted: {sorted(seen)}")
        self.assertLessEqual(max(seen), 200, f"connections counted as gatekeepers: {sorted(seen)}")

    def test_a_gatekeeper_killed_no_longer_counts_once_its_connections_close(self):
        seen = self.intervals("both", self.proxies, lambda s: any(v > 150 for v in s))
        self.assertTrue(any(v > 150 for v in seen), f"two gatekeepers not counted: {sorted(seen)}")
        # Killed while it holds a wave (its holds just reported): without forgetting
        # it, the master would count it for a second or two yet.
        def held_request():
            try:
                fetch(self.proxies[1].port, "/p/x", key="both", timeout=10)
            except OSError:
                pass  # the proxy was killed under it
        wave = [threading.Thread(target=held_request) for _ in range(WAVE)]
        for t in wave:
            t.start()
        wait_until(lambda: (self.proxies[1].metric(HELD) or 0) > 0, 10, message="a request held at proxy 1")
        peers = self.master.metric("smockron_master_accounting_peers")
        self.proxies[1].kill()
        for t in wave:
            t.join(15)
        self.master.wait_metric("smockron_master_accounting_peers", predicate=lambda v: v <= peers - 2, timeout=10)
        # The master has taken the closes in: a DELAY_UNTIL it publishes from
        # now on counts proxy 0 alone. A marker of the sniffer's own, held
        # (burst 2), orders the control stream: what follows its DELAY_UNTIL
        # was published after the closes, whatever was still on the way.
        deadline = time.monotonic() + 10
        marked = False
        n = 0
        while not marked and time.monotonic() < deadline:
            n += 1
            self.sniffer.accepted(DOMAIN, "marker", int(time.time() * 1000))
            for m in self.sniffer.drain(0.05 if n > 2 else 0):
                marked = marked or (m.command == "DELAY_UNTIL" and m.identifier == "marker")
        self.assertTrue(marked, "no DELAY_UNTIL for the marker")
        after = self.intervals("both", self.proxies[:1], lambda s: bool(s), deadline_s=5.0)
        self.assertEqual(after, {100}, "the killed gatekeeper still counted")

    def test_a_client_held_at_one_gatekeeper_is_paced_at_the_rule(self):
        seen = self.intervals("one", self.proxies[:1], lambda s: bool(s), deadline_s=5.0)
        self.assertEqual(seen, {100})


class ClosedLoopTest(DaemonTestCase):
    """The master's defaults, two gatekeepers, three connections each sending
    their next request of one client once the last is answered (a refusal: 20 ms
    later): the rate is delivered, whichever algorithm."""
    RATE, BURST = 10, 5
    CONNECTIONS = 3  # per gatekeeper
    WARMUP, WINDOW = 1.0, 3.0  # s

    def admitted(self, algorithm: str | None) -> tuple[int, float]:
        """(requests forwarded within the window, the window in s)."""
        domain = {"rules": [(f"{self.RATE}/s", self.BURST)], **({"algorithm": algorithm} if algorithm else {})}
        master = self.start_master({DOMAIN: domain, WARM_DOMAIN: {"rules": [("1/h", 1)]}})
        backend = self.start_backend()
        log = os.path.join(self.tmp, "access.log")
        routes = [WARM_ROUTE, {"path": "/p/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"],
                               "max_delay": "1s"}]
        proxies = []
        for i in range(2):
            p = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, routes,
                                 accounting=[master.accounting], control=[master.control],
                                 config_name=f"proxy-{i}.toml", **access_log_keys(log))
            self.wait_connected(p)
            self.wait_accounting(p)
            self.prime(p, key_prefix=f"warm-{i}-")
            proxies.append(p)
        stop = threading.Event()
        self.addCleanup(stop.set)  # (also when this test fails before it stops them)
        lock = threading.Lock()
        answered = set()  # the targets answered 200

        def connection(port: int, name: str):
            n = 0
            while not stop.is_set():
                n += 1
                target = f"/p/{name}/{n}"
                try:
                    status = fetch(port, target, key="hot", timeout=5)[0].status
                except OSError:
                    status = 0
                if status == 200:
                    with lock:
                        answered.add(target)
                else:
                    time.sleep(0.02)

        threads = [threading.Thread(target=connection, args=(p.port, f"{i}-{c}"), daemon=True)
                   for i, p in enumerate(proxies) for c in range(self.CONNECTIONS)]
        t0 = time.time()
        for t in threads:
            t.start()
        # Counted from once the burst is spent and both gatekeepers hold the client.
        wait_until(lambda: time.time() > t0 + self.WARMUP + self.WINDOW, self.WARMUP + self.WINDOW + 2)
        stop.set()
        for t in threads:
            t.join(10)
        self.assertFalse(any(t.is_alive() for t in threads), "a connection hangs")
        w0, w1 = t0 + self.WARMUP, t0 + self.WARMUP + self.WINDOW

        def logged():
            lg = read_access_log(log)
            return answered <= {e["target"] for e in lg} and lg

        lines = wait_until(logged, 5, message="a log line for every request answered")
        forwarded = [e for e in lines if e["target"].startswith("/p/") and e["forwarded"] and w0 < e["t_out"] <= w1]
        return len(forwarded), w1 - w0

    def check(self, algorithm: str | None) -> None:
        n, window = self.admitted(algorithm)
        sys.stderr.write(f"\n[measured] {algorithm or 'sliding log'}: {n} forwarded in {window:.2f} s "
                         f"(rate x time {self.RATE * window:.1f})\n")
        # A share's lost slots cost a quarter (30 of 40 in 4 s); the bound leaves
        # room for a slow machine's answers, and the upper one for the window's edges.
        self.assertGreaterEqual(n, 0.85 * self.RATE * window, "slots left unused")
        self.assertLessEqual(n, self.RATE * window + self.BURST, "over the limit")

    def test_gcra_delivers_the_rate(self):
        self.check("gcra")

    def test_an_exactly_logged_rule_delivers_the_rate(self):
        self.check(None)


if __name__ == "__main__":
    unittest.main()
