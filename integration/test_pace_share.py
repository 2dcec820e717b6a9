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
  the dead proxy's messages would take to age out of the count.

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


if __name__ == "__main__":
    unittest.main()
