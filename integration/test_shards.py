"""A domain split across masters by identifier (issue 18), with the real
binaries: three smockron-master processes own the same domain, and a proxy
with [[proxy.shards]] sends each identifier's accounting only to the master
that owns it on the consistent-hash ring. Each master sees only its share,
the limit per identifier holds, a killed master is fail-open for its share
only (the others keep limiting), and once restarted it takes its share back.

Run: cd integration && python3 -m unittest -v test_shards
"""
from __future__ import annotations

import bisect
import itertools
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import fetch  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import WaitTimeout, wait_until  # noqa: E402

MASK = (1 << 64) - 1


def stable_hash(s: str) -> int:
    """smockron::stable_hash (shared/protocol/hash_ring.cpp): FNV-1a 64, then splitmix64's finalizer."""
    h = 14695981039346656037
    for b in s.encode():
        h = ((h ^ b) * 1099511628211) & MASK
    h ^= h >> 30
    h = (h * 0xbf58476d1ce4e5b9) & MASK
    h ^= h >> 27
    h = (h * 0x94d049bb133111eb) & MASK
    return h ^ (h >> 31)


def owner(shares: list[str], key: str, vnodes: int = 160) -> int:
    """smockron::hash_ring::owner, for the test to know where each identifier goes."""
    points = sorted((stable_hash(f"{name}#{v}"), name, i) for i, name in enumerate(shares) for v in range(vnodes))
    at = bisect.bisect_left(points, (stable_hash(key), "", -1))
    return points[at % len(points)][2]


class ShardedMastersTest(DaemonTestCase):
    def test_each_master_has_its_share_the_limit_holds_and_a_dead_master_fails_open_for_its_share(self):
        domains = {"api": {"rules": [("1/m", 2)]}}
        masters = [self.start_master(domains, config_name=f"master{i}.toml") for i in range(3)]
        backend = self.start_backend()
        accounting = [m.accounting for m in masters]
        proxy = self.start_proxy({"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
                                 [{"path": "/", "domain": "api", "upstream": "app",
                                   "identify": ["header:X-API-Key"], "max_delay": "100ms"}],
                                 accounting=accounting, control=[m.control for m in masters],
                                 shards=[{"domain": "api", "masters": accounting}])
        self.wait_connected(proxy, "3/3")
        proxy.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v >= 3, timeout=10)

        def received(m) -> float:
            return metric(m.metrics(), "smockron_master_accounting_messages_total",
                          {"domain": "api", "status": "ACCEPTED"}) or 0

        def counted() -> float:
            """Accounting messages the proxy has dealt with: each once, as published, dropped or unsent."""
            text = proxy.metrics()
            return sum(metric(text, f"smockron_proxy_accounting_{k}_total") or 0
                       for k in ("messages", "dropped", "unsent"))

        # The control links are up (above); so must the accounting links be, to each master,
        # or a message is "unsent" and never arrives. Warm-up identifiers owned by each master
        # in turn, fresh ones, until that master counts one.
        warm = (f"warm-{n}" for n in itertools.count())
        sent = 0
        for i, m in enumerate(masters):
            deadline = time.monotonic() + 10
            while True:
                self.assertLess(time.monotonic(), deadline, f"no accounting reached master {i}")
                before = received(m)
                k = next(w for w in warm if owner(accounting, w) == i)
                self.assertEqual(fetch(proxy.port, f"/warm/{k}", key=k)[0].status, 200)
                sent += 1
                try:
                    wait_until(lambda: received(m) > before, 0.5)
                    break
                except WaitTimeout:
                    continue
        # Every warm-up message has been published (and then delivered) or dropped unsent:
        # none is still on its way to be counted among the shares below.
        wait_until(lambda: counted() == sent
                   and sum(received(m) for m in masters) == proxy.metric("smockron_proxy_accounting_messages_total"),
                   10, message="the warm-up's accounting settled")
        base = [received(m) for m in masters]

        # 90 identifiers, one request each: every master gets about a third, and only its own.
        ids = [f"user-{i}" for i in range(90)]
        owners = {k: owner(accounting, k) for k in ids}
        for k in ids:
            self.assertEqual(fetch(proxy.port, f"/one/{k}", key=k)[0].status, 200)

        share = [sum(1 for k in ids if owners[k] == i) for i in range(3)]
        expected = [b + n for b, n in zip(base, share)]
        wait_until(lambda: [received(m) for m in masters] == expected, 10,
                   message=f"each master receives exactly its share {share} (after the warm-up's {base})")
        for k in ids[:15]:
            for i, m in enumerate(masters):
                tracked = json.loads(m.get(f"/status/api/{k}").body)["tracked"]
                self.assertEqual(tracked, i == owners[k], f"{k}: master {i}")
        print(f"\nshares of 90 identifiers over 3 masters: {share}", file=sys.stderr)

        # The limit per identifier holds (burst 2 per minute): the owner's DELAY_UNTIL reaches the proxy.
        hot = "hot-0"
        ctl = proxy.ctl()
        self.assertEqual([fetch(proxy.port, f"/hot/{i}", key=hot)[0].status for i in range(2)], [200, 200])
        self.wait_ctl(proxy, ctl)
        self.assertEqual(fetch(proxy.port, "/hot/2", key=hot)[0].status, 503)

        # One master dies: its share fails open (its accounting goes nowhere, counted as unsent),
        # the other shares are still accounted and limited.
        dead = owners["user-0"]
        masters[dead].signal(signal.SIGKILL)
        masters[dead].wait(10)
        self.wait_connected(proxy, "2/3")
        unsent = proxy.metric("smockron_proxy_accounting_unsent_total") or 0
        live_id = next(k for k in ids if owners[k] != dead)
        live = owners[live_id]
        before = received(masters[live])
        dead_id = next(f"after-{i}" for i in range(1000) if owner(accounting, f"after-{i}") == dead)
        ctl = proxy.ctl()
        self.assertEqual(fetch(proxy.port, "/after/dead", key=dead_id)[0].status, 200)
        self.assertEqual(fetch(proxy.port, "/after/live", key=live_id)[0].status, 200)  # its second use: burst used up
        proxy.wait_metric("smockron_proxy_accounting_unsent_total", predicate=lambda v: v >= unsent + 1, timeout=10)
        wait_until(lambda: received(masters[live]) == before + 1, 10, message="the live share is still accounted")
        self.wait_ctl(proxy, ctl)  # the live owner's DELAY_UNTIL
        self.assertEqual(fetch(proxy.port, "/after/live3", key=live_id)[0].status, 503, "the live share is limited")

        # Restarted, it takes its share back.
        masters[dead] = self.restart(masters[dead])
        self.wait_connected(proxy, "3/3", timeout=15)
        back = next(f"back-{i}" for i in range(1000) if owner(accounting, f"back-{i}") == dead)

        def accounted_again():
            fetch(proxy.port, "/back", key=back)
            return json.loads(masters[dead].get(f"/status/api/{back}").body)["tracked"]

        wait_until(accounted_again, 15, interval=0.2, message="the restarted master receives its share again")


if __name__ == "__main__":
    unittest.main()
