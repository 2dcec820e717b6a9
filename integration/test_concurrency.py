"""Concurrency rules with the real binaries (docs/configuration.md, `concurrency`;
docs/architecture.md, "Concurrency leases"):

- at most N requests of one identifier reach the backend at once, through
  one gatekeeper or three, HTTP/1.1 and HTTP/2 alike; the others wait their
  turn and all are served; another identifier is not held by them;
- a request that finds no slot within max_delay is refused with the route's
  status and Retry-After, never forwarded;
- clients that leave (while waiting, or while at the backend) leave no slot
  taken: the proxy's slots in flight fall back to 0, and the next request goes;
- a gatekeeper killed with SIGKILL while holding slots: the master frees
  them when its connection closes, and another gatekeeper gets them;
- a shared limit (all identifiers together) is never exceeded, and every
  identifier under it is served, the light one too.

The backend counts /slow requests in progress per X-API-Key (lib/backends.py,
/__inflight); everything else is read from responses and metrics, polled
with deadlines.

Run: cd integration && python3 -m unittest -v test_concurrency
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.config import WARM_DOMAIN, WARM_ROUTE  # noqa: E402
from lib.h2client import H2Client  # noqa: E402
from lib.http1 import fetch, request_bytes  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

DOMAIN = "c"


def route(**keys) -> dict:
    return {"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
            "max_delay": "20s", **keys}


class ConcurrencyTestCase(DaemonTestCase):
    def stack(self, limit: int, gatekeepers: int = 1, shared: int | None = None, rate=None, **route_keys):
        """A master with DOMAIN under { concurrency = limit } (0: none), with `rate` ((rate, burst))
        beside it and, with `shared`, a shared { concurrency = shared }; a backend, and `gatekeepers`
        proxies."""
        domain = {"rules": ([rate] if rate else []) + ([{"concurrency": limit}] if limit else []),
                  "algorithm": "gcra"}
        if shared is not None:
            domain["shared"] = [{"concurrency": shared}]
        self.master = self.start_master({DOMAIN: domain, WARM_DOMAIN: {"rules": [("1/h", 1)]}})
        self.backend = self.start_backend()
        self.proxies = []
        for i in range(gatekeepers):
            p = self.start_proxy({"app": {"servers": [f"{HOST}:{self.backend.port}"]}},
                                 [WARM_ROUTE, route(**route_keys)], accounting=[self.master.accounting],
                                 control=[self.master.control], config_name=f"proxy{i}.toml", threads=2)
            self.wait_connected(p)
            self.wait_accounting(p)
            self.prime(p)
            self.proxies.append(p)
        # Every proxy has heard the domain's CONCURRENCY (published with its POLICY).
        for p in self.proxies:
            p.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v >= 1, timeout=10)
        return self.proxies

    def many(self, jobs) -> list:
        """Runs each job (a callable) on its own thread; their results, in order."""
        out = [None] * len(jobs)

        def run(i, job):
            try:
                out[i] = job()
            except Exception as e:  # noqa: BLE001 - reported by the caller's assertions
                out[i] = e

        threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out

    def idle(self, timeout: float = 10.0) -> None:
        """Until no proxy has a request in flight or waiting under the rule."""
        for p in self.proxies:
            p.wait_metric("smockron_proxy_concurrency_in_flight", predicate=lambda v: v == 0, timeout=timeout)
            p.wait_metric("smockron_proxy_concurrency_waiting", predicate=lambda v: v == 0, timeout=timeout)


class TestConcurrency(ConcurrencyTestCase):
    def test_three_gatekeepers_never_let_more_than_the_limit_through(self):
        proxies = self.stack(4, gatekeepers=3)
        jobs = [lambda p=proxies[i % 3]: fetch(p.port, "/slow?s=0.3", key="k", timeout=60)[0] for i in range(30)]
        jobs += [lambda: fetch(proxies[0].port, "/slow?s=0.3", key="other", timeout=60)[0] for _ in range(6)]
        results = self.many(jobs)
        self.assertEqual([getattr(r, "status", r) for r in results], [200] * 36)
        seen = self.backend.inflight()["max"]
        self.assertLessEqual(seen["k"], 4, seen)
        self.assertGreaterEqual(seen["k"], 2, seen)  # not one at a time
        self.assertLessEqual(seen["other"], 4, seen)
        self.assertEqual(len(self.backend.requests(key="k")), 30)
        self.assertGreater(sum(p.metric("smockron_proxy_concurrency_waits_total") for p in proxies), 0)
        self.idle()
        # Idle slots go back to the master within the linger (2 s) and a tick.
        self.master.wait_metric("smockron_master_lease_slots_held", predicate=lambda v: v == 0, timeout=10)

    def test_http2_streams_share_the_limit(self):
        (proxy,) = self.stack(2)
        with H2Client(proxy.port) as c:
            sids = [c.request("/slow?s=0.3", headers=[("x-api-key", "k")]) for _ in range(8)]
            statuses = []
            for sid in sids:
                st = c.response(sid, timeout=30)
                c.wait(lambda st=st: st.ended, timeout=30, what=f"stream {sid} ends")
                statuses.append(dict(st.headers)[":status"])
        self.assertEqual(statuses, ["200"] * 8)
        self.assertLessEqual(self.backend.inflight()["max"]["k"], 2)
        self.idle()

    def test_no_slot_within_max_delay_is_refused_and_never_forwarded(self):
        (proxy,) = self.stack(1, max_delay="1s")
        first = threading.Thread(target=fetch, args=(proxy.port, "/slow?s=4"), kwargs={"key": "k", "timeout": 30})
        first.start()
        wait_until(lambda: self.backend.inflight()["now"].get("k") == 1, 10)
        r, elapsed = fetch(proxy.port, "/slow?s=0", key="k", timeout=30)
        self.assertEqual(r.status, 429)
        self.assertEqual(r.headers.get("retry-after"), "1")
        self.assertIn(b"concurrency limit", r.body)
        # The fields name the limit that refused it (draft RateLimit fields, quota unit concurrent-requests).
        self.assertEqual(r.headers.get("ratelimit-policy"), '"c-concurrency";q=1;qu="concurrent-requests"')
        self.assertEqual(r.headers.get("ratelimit"), '"c-concurrency";r=0;t=1')
        self.assertGreaterEqual(elapsed, 0.9)
        self.assertEqual(len(self.backend.requests(key="k", target_prefix="/slow?s=0")), 0)
        self.assertEqual(proxy.metric("smockron_proxy_rejects_total", {"reason": "concurrency"}), 1)
        first.join(30)

    def test_clients_that_leave_leave_no_slot_taken(self):
        (proxy,) = self.stack(2)
        # HTTP/1.1: ten clients send and close at once (two at the backend, eight waiting).
        socks = []
        for _ in range(10):
            s = socket.create_connection((HOST, proxy.port))
            s.sendall(request_bytes("GET", "/slow?s=1", [("X-API-Key", "k")]))
            socks.append(s)
        wait_until(lambda: self.backend.inflight()["now"].get("k") == 2, 10)
        proxy.wait_metric("smockron_proxy_concurrency_waiting", predicate=lambda v: v == 8, timeout=10)
        for s in socks:
            s.close()
        # HTTP/2: streams reset by the client, waiting and at the backend.
        with H2Client(proxy.port) as c:
            sids = [c.request("/slow?s=1", headers=[("x-api-key", "k")]) for _ in range(6)]
            proxy.wait_metric("smockron_proxy_concurrency_waiting", predicate=lambda v: v >= 4, timeout=10)
            for sid in sids:
                c.rst(sid)
            c.ping()
        self.idle()
        r, elapsed = fetch(proxy.port, "/slow?s=0", key="k", timeout=10)
        self.assertEqual(r.status, 200)
        self.assertLess(elapsed, 8.0)  # no slot left taken (one would wait max_delay, 20 s)

    def test_a_killed_gatekeepers_slots_are_freed(self):
        a, b = self.stack(2, gatekeepers=2)
        holders = [threading.Thread(target=lambda: self.swallow(fetch, a.port, "/slow?s=20", key="k", timeout=30))
                   for _ in range(2)]
        for t in holders:
            t.start()
        wait_until(lambda: self.backend.inflight()["now"].get("k") == 2, 10)
        a.kill()  # SIGKILL: its connections close, the master frees its slots
        t0 = time.monotonic()
        r, _ = fetch(b.port, "/slow?s=0", key="k", timeout=20)
        self.assertEqual(r.status, 200)
        self.assertLess(time.monotonic() - t0, 15.0)  # freed at the close, not at max_delay (20 s)
        self.assertGreaterEqual(self.master.metric("smockron_master_lease_slots_released_total"), 2)

    def test_a_request_held_by_its_rate_then_waits_for_a_slot(self):
        # 5/s burst 1 and one slot: the second request is held 200 ms by the rate, then waits for the
        # first (500 ms at the backend) to end; both are served, over HTTP/1.1 and HTTP/2.
        (proxy,) = self.stack(1, rate=("5/s", 1), max_delay="5s")
        first = threading.Thread(target=fetch, args=(proxy.port, "/slow?s=0.5"), kwargs={"key": "h1", "timeout": 30})
        first.start()
        wait_until(lambda: self.backend.inflight()["now"].get("h1") == 1, 10)
        r, elapsed = fetch(proxy.port, "/slow?s=0", key="h1", timeout=30)
        first.join(30)
        self.assertEqual(r.status, 200, r)
        with H2Client(proxy.port) as c:
            sids = [c.request(path, headers=[("x-api-key", "h2")]) for path in ("/slow?s=0.5", "/slow?s=0")]
            for sid in sids:
                st = c.response(sid, timeout=30)
                c.wait(lambda st=st: st.ended, timeout=30, what=f"stream {sid} ends")
                self.assertEqual(dict(st.headers)[":status"], "200")
        self.assertEqual(self.backend.inflight()["max"]["h2"], 1)

    def test_a_shared_limit_is_split_among_the_identifiers(self):
        a, b = self.stack(0, gatekeepers=2, shared=4)
        jobs = []
        for key in ("heavy-1", "heavy-2"):
            jobs += [lambda key=key, i=i: [fetch((a, b)[i % 2].port, "/slow?s=0.2", key=key, timeout=60)[0].status
                                           for _ in range(4)] for i in range(6)]
        jobs += [lambda: [fetch(a.port, "/slow?s=0.2", key="light", timeout=60)[0].status for _ in range(4)]]
        results = self.many(jobs)
        self.assertEqual(results, [[200] * 4] * len(jobs))
        seen = self.backend.inflight()["max"]
        self.assertLessEqual(seen["*"], 4, seen)  # the pool, all identifiers together
        self.assertGreaterEqual(seen["*"], 2, seen)
        self.idle()
        self.master.wait_metric("smockron_master_lease_slots_held", predicate=lambda v: v == 0, timeout=10)

    @staticmethod
    def swallow(f, *args, **kw):
        try:
            f(*args, **kw)
        except OSError:
            pass


if __name__ == "__main__":
    unittest.main()
