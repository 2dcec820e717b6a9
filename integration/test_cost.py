"""Limits in cost units with the real binaries: every cost source of a route
(a constant, a request field, the request body's size, a response field or
trailer), a response-charged route that limits the client's next request, a
quota exhausted and reset (a short fixed window), and a quota that survives a
master restart with the Redis store.

The master counts what it is charged in smockron_master_units_total{domain}:
that is what each test reads, so nothing depends on timing beyond polling
with deadlines.

Run: python3 integration/test_cost.py -v
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import RawConn, fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.redis_server import RedisServer  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import WaitTimeout, now_ms, wait_until  # noqa: E402

# A limit nothing in these tests reaches, so only the units count.
WIDE = {"rules": [("1000/s", 100_000)], "algorithm": "gcra"}


def units(master, domain: str) -> float:
    """The units the master charged the domain, less those it gave back (reservations corrected down)."""
    return ((master.metric("smockron_master_units_total", {"domain": domain}) or 0.0) -
            (master.metric("smockron_master_units_refunded_total", {"domain": domain}) or 0.0))


class CostSourcesTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        routes = [
            {"path": "/const/", "domain": "const", "upstream": "app", "identify": ["header:X-Key"], "cost": 5},
            {"path": "/hdr/", "domain": "hdr", "upstream": "app", "identify": ["header:X-Key"],
             "cost": "header:X-Cost", "cost_default": 2, "cost_max": 1000},
            {"path": "/bytes/", "domain": "bytes", "upstream": "app", "identify": ["header:X-Key"],
             "cost": "request_bytes"},
            {"path": "/tokens", "domain": "tokens", "upstream": "app", "identify": ["header:X-Key"],
             "cost": "response_header:X-Tokens-Used"},
        ]
        self.master, self.backend, self.proxy = self.gate_stack(
            {"const": WIDE, "hdr": WIDE, "bytes": WIDE, "tokens": WIDE}, routes)

    def wait_units(self, domain: str, expected: float):
        # A reservation and its correction arrive one after the other: the sum settles.
        try:
            wait_until(lambda: units(self.master, domain) == expected, 10, message=f"{domain}: {expected} units")
        except WaitTimeout:
            pass  # said below, with the figure
        self.assertEqual(units(self.master, domain), expected, domain)

    def fallback(self, reason: str) -> float:
        return self.proxy.metric("smockron_proxy_cost_fallback_total", {"reason": reason}) or 0.0

    def test_a_constant_cost(self):
        for _ in range(3):
            r, _ = fetch(self.proxy.port, "/const/x", headers=[("X-Key", "k")])
            self.assertEqual(r.status, 200)
        self.wait_units("const", 15)

    def test_a_request_field(self):
        for value in ("7", "40"):
            r, _ = fetch(self.proxy.port, "/hdr/x", headers=[("X-Key", "k"), ("X-Cost", value)])
            self.assertEqual(r.status, 200)
        self.wait_units("hdr", 47)
        # Missing, malformed, over cost_max: counted, and charged as cost_default or cost_max.
        fetch(self.proxy.port, "/hdr/x", headers=[("X-Key", "k")])
        fetch(self.proxy.port, "/hdr/x", headers=[("X-Key", "k"), ("X-Cost", "lots")])
        fetch(self.proxy.port, "/hdr/x", headers=[("X-Key", "k"), ("X-Cost", "5000")])
        self.wait_units("hdr", 47 + 2 + 2 + 1000)
        self.assertEqual(self.fallback("missing"), 1)
        self.assertEqual(self.fallback("malformed"), 1)
        self.assertEqual(self.fallback("over_max"), 1)

    def test_the_request_body_size(self):
        r, _ = fetch(self.proxy.port, "/bytes/up", method="POST", headers=[("X-Key", "k")], body=b"x" * 300)
        self.assertEqual(r.status, 200)
        self.wait_units("bytes", 300)
        # A chunked body: its size is known once relayed, and charged then.
        with RawConn(self.proxy.port) as c:
            c.send(b"POST /bytes/chunked HTTP/1.1\r\nHost: t\r\nX-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"200\r\n" + b"y" * 512 + b"\r\n64\r\n" + b"z" * 100 + b"\r\n0\r\n\r\n")
            self.assertEqual(c.read_response().status, 200)
        self.wait_units("bytes", 300 + 612)

    def test_a_response_field_or_trailer(self):
        r, _ = fetch(self.proxy.port, "/tokens?n=40", headers=[("X-Key", "k")])
        self.assertEqual(r.status, 200)
        self.wait_units("tokens", 40)
        r, _ = fetch(self.proxy.port, "/tokens?n=25&where=trailer", headers=[("X-Key", "k")])
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["tokens"], "25")
        self.wait_units("tokens", 65)
        # Over HTTP/2 (curl, prior knowledge): the same charge.
        p = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "20", "-o", os.devnull,
                            "-w", "%{http_version} %{http_code}", "-H", "X-Key: k",
                            f"http://{HOST}:{self.proxy.port}/tokens?n=9&where=trailer"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "2 200"), p.stderr)
        self.wait_units("tokens", 74)
        self.assertEqual(self.fallback("missing"), 0)


class ResponseChargedLimitTest(DaemonTestCase):
    def test_the_charge_moves_the_next_allowed_time(self):
        # 10 units/s, burst 10: a response reporting 100 units leaves 90 to pay
        # back (9 s); the client's next request is refused (max_delay 0) with a
        # Retry-After of that, while another client passes.
        master, _, proxy = self.gate_stack(
            {"llm": {"rules": [("10/s", 10)], "algorithm": "gcra"}},
            [{"path": "/tokens", "domain": "llm", "upstream": "app", "identify": ["header:X-Key"],
              "cost": "response_header:X-Tokens-Used", "max_delay": "0s"}])
        r, _ = fetch(proxy.port, "/tokens?n=100", headers=[("X-Key", "heavy")])
        self.assertEqual(r.status, 200, "admitted on its standing before the charge")
        box = {"passed": 0}

        def refused():
            # The client has its answer a moment before the proxy charges the
            # response's cost: a request sent in between still passes (1 unit).
            box["r"], _ = fetch(proxy.port, "/tokens?n=1", headers=[("X-Key", "heavy")])
            box["passed"] += box["r"].status == 200
            return box["r"].status == 503

        wait_until(refused, 10, message="the heavy client's next request refused")
        retry_after = int(box["r"].headers["retry-after"])
        self.assertGreaterEqual(retry_after, 7)
        self.assertLessEqual(retry_after, 10)
        r, _ = fetch(proxy.port, "/tokens?n=1", headers=[("X-Key", "light")])
        self.assertEqual(r.status, 200)
        expected = 100 + 1 + box["passed"]
        try:
            wait_until(lambda: units(master, "llm") == expected, 10, message="the master's units")
        except WaitTimeout:
            pass  # said below, with the figure
        self.assertEqual(units(master, "llm"), expected, "refusals are not charged")


class QuotaTest(DaemonTestCase):
    def test_a_quota_exhausted_then_reset(self):
        # 5 units per 10 s window (fixed, aligned to the epoch): a request of 5
        # exhausts it; the next is refused with a Retry-After at the window's
        # end, and passes again once it has come.
        master, _, proxy = self.gate_stack(
            {"q": {"rules": [{"quota": 5, "per": "10s"}]}},
            [{"path": "/q/", "domain": "q", "upstream": "app", "identify": ["header:X-Key"], "cost": "header:X-Cost",
              "max_delay": "1s", "ratelimit_headers": True}])
        # Once the domain's QUOTA has reached the proxy (a request of no units asks and uses nothing).
        wait_until(lambda: "ratelimit-policy" in fetch(proxy.port, "/q/probe", headers=[("X-Key", "k"),
                                                                                         ("X-Cost", "0")])[0].headers,
                   10, interval=0.05, message="the quota described in RateLimit-Policy")
        # Start early in a window, so that it does not end under the test's feet.
        wait_until(lambda: time.time() % 10 < 1, 11, interval=0.01, message="the start of a quota window")
        window_end = (int(time.time()) // 10 + 1) * 10
        r, _ = fetch(proxy.port, "/q/a", headers=[("X-Key", "k"), ("X-Cost", "5")])
        self.assertEqual(r.status, 200)
        # The quota is described (QUOTA beside POLICY), its units left are the master's to know.
        self.assertEqual(r.headers.get("ratelimit-policy"), '"q";q=5;w=10')
        self.assertNotIn("ratelimit", r.headers)
        box = {}

        def refused():
            box["r"], _ = fetch(proxy.port, "/q/b", headers=[("X-Key", "k"), ("X-Cost", "1")])
            return box["r"].status == 503

        wait_until(refused, 8, message="the exhausted quota refuses")
        self.assertLess(time.time(), window_end, "refused within the window")
        retry_after = int(box["r"].headers["retry-after"])
        self.assertLessEqual(retry_after, 10)
        self.assertGreaterEqual(time.time() + retry_after, window_end - 0.01)
        # Exhausted: known here, and said so, with the reset.
        self.assertEqual(box["r"].headers.get("ratelimit"), f'"q";r=0;t={retry_after}')
        status = json.loads(master.get("/status/q/k").body)
        # 5, and the requests sent before the master's DELAY_UNTIL arrived (the first round trip).
        self.assertGreaterEqual(status["quotas"][0]["used"], 5)
        self.assertEqual(status["quotas"][0]["reset_ms"], window_end * 1000)
        # The window ends: the quota is whole again.
        wait_until(lambda: fetch(proxy.port, "/q/c", headers=[("X-Key", "k"), ("X-Cost", "1")])[0].status == 200,
                   14, interval=0.1, message="the quota reset")


class QuotaPersistsTest(DaemonTestCase):
    def test_a_quota_survives_a_master_restart_with_redis(self):
        redis = RedisServer(self.tmp)
        self.addCleanup(redis.stop)
        redis.start()
        domains = {"month": {"rules": [("1000/s", 1000), {"quota": 1000, "per": "month"}]}}
        master = self.start_master(domains, store="redis", redis=f"redis://{HOST}:{redis.port}/0")
        gk = self.gatekeeper(master, ["month"])
        gk.accepted("month", "key", now_ms(), loginfo="cost=600")
        self.assertIsNone(gk.recv(0.3), "600 of 1000: not limited")
        gk.accepted("month", "key", now_ms(), loginfo="cost=400")
        c = gk.expect(3)
        reset_ms = json.loads(master.get("/status/month/key").body)["quotas"][0]["reset_ms"]
        self.assertEqual(c.next_ms, reset_ms, "limited until the month's end")
        master.wait_metric("smockron_master_redis_unwritten_states", predicate=lambda v: v == 0, timeout=5)
        master.wait_metric("smockron_master_redis_writes_total", predicate=lambda v: v >= 1, timeout=5)
        gk.close()
        master.kill()
        self.restart(master)
        gk = self.gatekeeper(master, ["month"])
        # A use of no units asks for a decision only: still exhausted after the restart.
        gk.accepted("month", "key", now_ms(), loginfo="cost=0")
        c = gk.expect(3)
        self.assertEqual((c.identifier, c.next_ms), ("key", reset_ms))
        self.assertEqual(json.loads(master.get("/status/month/key").body)["quotas"][0]["used"], 1000)


if __name__ == "__main__":
    unittest.main()
