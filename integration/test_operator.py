"""What operators expect from a rate-limiting proxy (issue 16): the status of
limit rejections, per-route max_delay / max_held, shadow routes, exempt
clients and routes without a domain.

Run: cd integration && python3 -m unittest -v test_operator
"""
from __future__ import annotations

import json
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import DaemonTestCase, fetch, metric, wait_until  # noqa: E402

REQUESTS = "smockron_proxy_requests_total"


class RoutePolicyTest(DaemonTestCase):
    """Domain "api": 1 request per 2 s per X-API-Key, burst 1."""

    def stack(self, routes):
        return self.gate_stack({"api": {"rules": [("1/2s", 1)]}}, routes, max_delay="5s")

    def first_then_known(self, proxy, path: str, key: str) -> None:
        """One request of `key`, then wait until the master's DELAY_UNTIL for it is here."""
        applied0 = proxy.metric("smockron_proxy_control_messages_total") or 0
        self.assertEqual(fetch(proxy.port, path, key=key)[0].status, 200)
        proxy.wait_metric("smockron_proxy_control_messages_total", predicate=lambda v: v > applied0, timeout=10)

    def test_429_route_and_a_full_queue_is_503_whatever_the_status(self):
        _, backend, proxy = self.stack([
            {"path": "/limited", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "status": 429, "max_delay": "200ms"},
            {"path": "/full", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "status": 429, "max_held": 0},
        ])
        self.first_then_known(proxy, "/limited/1", "kate")
        r, _ = fetch(proxy.port, "/limited/2", key="kate")
        self.assertEqual((r.status, r.reason), (429, "Too Many Requests"), r)
        self.assertGreaterEqual(int(r.headers.get("retry-after", "0")), 1)
        # Within max_delay (5 s here), but the route holds none: the queue is full, 503.
        r, _ = fetch(proxy.port, "/full/1", key="kate")
        self.assertEqual(r.status, 503, r)
        self.assertGreaterEqual(int(r.headers.get("retry-after", "0")), 1)
        m = proxy.metrics()
        self.assertEqual(metric(m, "smockron_proxy_rejects_total", {"reason": "delay_too_long"}), 1)
        self.assertEqual(metric(m, "smockron_proxy_rejects_total", {"reason": "held_full"}), 1)
        self.assertEqual([e["target"] for e in backend.requests(key="kate")], ["/limited/1"])

    def test_a_shadow_route_never_holds_or_rejects_but_counts(self):
        _, backend, proxy = self.stack([
            {"path": "/shadow", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "mode": "shadow", "max_delay": "200ms"},
        ])
        self.first_then_known(proxy, "/shadow/0", "sam")
        for i in range(1, 5):
            r, elapsed = fetch(proxy.port, f"/shadow/{i}", key="sam")
            self.assertEqual(r.status, 200, r)
            self.assertLess(elapsed, 1.0, "never held")
        m = proxy.metrics()
        self.assertEqual(metric(m, REQUESTS, {"domain": "api", "decision": "accepted"}), 5)
        self.assertGreaterEqual(metric(m, "smockron_proxy_shadow_decisions_total",
                                       {"domain": "api", "decision": "rejected"}), 1)
        self.assertEqual(len(backend.requests(key="sam")), 5)

    def test_exempt_clients_and_routes_without_a_domain_pass_unlimited(self):
        _, backend, proxy = self.stack([
            {"path": "/healthz", "upstream": "app"},
            {"path": "/internal", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "exempt": ["127.0.0.0/8"]},
        ])
        for i in range(4):
            self.assertEqual(fetch(proxy.port, "/healthz", key="ivy")[0].status, 200)
            self.assertEqual(fetch(proxy.port, f"/internal/{i}", key="ivy")[0].status, 200)
        m = proxy.metrics()
        self.assertEqual(metric(m, REQUESTS, {"domain": "", "decision": "exempt"}), 4)
        self.assertEqual(metric(m, REQUESTS, {"domain": "api", "decision": "exempt"}), 4)
        self.assertEqual(len(backend.requests(key="ivy")), 8)



class AccessLogTest(DaemonTestCase):
    def test_json_lines_with_the_real_status_client_and_bytes_reopened_on_sigusr1(self):
        path = os.path.join(self.tmp, "access.log")
        _, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/m", 1)]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
              "max_delay": "100ms"}],
            access_log=True, access_log_format="json", access_log_path=path, trusted_proxies=["127.0.0.1/32"])

        def lines(p=path):
            with open(p) as f:
                return [json.loads(line) for line in f if line.strip()]

        def for_key(key, p=path):
            return [e for e in lines(p) if e["identifier"] == key]

        applied0 = proxy.metric("smockron_proxy_control_messages_total") or 0
        r, _ = fetch(proxy.port, "/echo?x=1", method="POST", body=b"12345", key="lena",
                     headers=[("X-Forwarded-For", "198.51.100.9")])
        self.assertEqual(r.status, 200, r)
        proxy.wait_metric("smockron_proxy_control_messages_total", predicate=lambda v: v > applied0, timeout=10)
        self.assertEqual(fetch(proxy.port, "/again", key="lena")[0].status, 429)
        got = wait_until(lambda: for_key("lena") if len(for_key("lena")) >= 2 else None, 5, message="two lines")
        first, limited = got[0], got[1]
        self.assertEqual((first["method"], first["target"], first["status"]), ("POST", "/echo?x=1", 200))
        self.assertEqual((first["client"], first["peer"]), ("198.51.100.9", "127.0.0.1"))
        self.assertEqual(first["bytes_in"], 5)
        self.assertGreater(first["bytes_out"], 0)
        self.assertEqual(first["upstream"], f"127.0.0.1:{backend.port}")
        self.assertEqual((first["decision"], first["domain"]), ("accepted", "api"))
        self.assertEqual((limited["status"], limited["decision"], limited["upstream"]), (429, "rejected", ""))
        self.assertGreaterEqual(limited["duration_ms"], 0)
        # Log rotation: the file is moved, SIGUSR1, and new lines go to a new file.
        os.rename(path, path + ".1")
        proxy.signal(signal.SIGUSR1)
        wait_until(lambda: "reopening the access log" in proxy.log(), 5, message="SIGUSR1 handled")
        self.assertEqual(fetch(proxy.port, "/after", key="mia")[0].status, 200)
        wait_until(lambda: os.path.exists(path) and for_key("mia"), 5, message="a line in the new file")
        self.assertEqual(for_key("mia", path + ".1"), [])


if __name__ == "__main__":
    unittest.main()
