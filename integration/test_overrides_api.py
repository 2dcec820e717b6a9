"""The master's override API with the real binaries (docs/operations.md,
"Per-tenant limits without a reload"): one identifier's rules set, read and
deleted at run time on the admin endpoint, behind a bearer token.

- off without admin_token_file (404), and every request needs the token
  (401 without it or with another);
- PUT takes effect at once: a client limited to 1/min gets its own
  100/s through the proxy as soon as the proxy has the override's POLICY,
  with no reload; bad rules are refused with the configuration's message;
- a reload (SIGHUP) keeps it, /status shows it (source "api");
- DELETE gives the client the domain's rules back.

Run: cd integration && python3 -m unittest -v test_overrides_api
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

TOKEN = "s3cret-token-for-tests-0123456789"
DOMAIN = "api"
ROUTE = {"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
         "max_delay": "1s"}


def call(port: int, method: str, path: str, body: str | None = None, token: str | None = TOKEN):
    c = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        c.request(method, path, body=body.encode() if body is not None else None, headers=headers)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


class TestOverridesApi(DaemonTestCase):
    def stack(self, token: bool = True):
        keys = {}
        if token:
            keys["admin_token_file"] = self.write_file("token", TOKEN + "\n")
        self.master, self.backend, self.proxy = self.gate_stack(
            {DOMAIN: {"rules": [("1/min", 1)], "algorithm": "gcra"}}, [ROUTE], master_keys=keys)
        return self.master.admin_port

    def burst(self, key: str, n: int) -> list[int]:
        return [fetch(self.proxy.port, "/", key=key)[0].status for _ in range(n)]

    def test_off_without_a_token_file(self):
        port = self.stack(token=False)
        self.assertEqual(call(port, "GET", "/overrides")[0], 404)
        self.assertEqual(call(port, "PUT", f"/overrides/{DOMAIN}/vip", 'rules = []')[0], 404)

    def test_set_read_reload_and_delete(self):
        port = self.stack()
        self.assertEqual(self.burst("vip", 2), [200, 429])  # the domain's 1/min
        # Every call needs the token.
        self.assertEqual(call(port, "GET", "/overrides", token=None)[0], 401)
        self.assertEqual(call(port, "GET", "/overrides", token="another-token-of-enough-length")[0], 401)
        # Bad rules and unknown domains are refused.
        status, body = call(port, "PUT", f"/overrides/{DOMAIN}/vip", 'rules = [ { rate = "100/s", burst = 0 } ]')
        self.assertEqual(status, 400, body)
        self.assertIn("burst", json.loads(body)["error"])
        self.assertEqual(call(port, "PUT", "/overrides/nope/vip", "rules = []")[0], 404)
        # Set: in force at once, no reload.
        before = self.proxy.metric("smockron_proxy_control_policies_total")
        status, body = call(port, "PUT", f"/overrides/{DOMAIN}/vip", 'rules = [ { rate = "100/s", burst = 100 } ]')
        self.assertEqual(status, 201, body)
        self.proxy.wait_metric("smockron_proxy_gate_overrides", predicate=lambda v: v >= 1, timeout=5)
        self.assertGreater(self.proxy.metric("smockron_proxy_control_policies_total"), before)
        self.assertEqual(self.burst("vip", 5), [200] * 5)
        self.assertEqual(self.burst("other", 2), [200, 429])  # the others keep the domain's rules
        status, body = call(port, "GET", f"/overrides/{DOMAIN}/vip")
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["rules"], 'rules = [ { rate = "100/s", burst = 100 } ]')
        self.assertEqual(len(json.loads(call(port, "GET", "/overrides")[1])["overrides"]), 1)
        # A reload keeps it; /status shows where it came from.
        reloads = self.master.metric("smockron_master_reloads_total") or 0
        self.master.signal(signal.SIGHUP)
        self.master.wait_metric("smockron_master_reloads_total", predicate=lambda v: v > reloads, timeout=5)
        overrides = json.loads(self.master.get("/status").body)["domains"]
        api = [o for d in overrides if d["name"] == DOMAIN for o in d["overrides"]]
        self.assertEqual([(o["identifier"], o["source"]) for o in api], [("vip", "api")])
        self.assertEqual(self.burst("vip", 3), [200] * 3)
        # Delete: the domain's rules again.
        self.assertEqual(call(port, "DELETE", f"/overrides/{DOMAIN}/vip")[0], 200)
        self.assertEqual(call(port, "DELETE", f"/overrides/{DOMAIN}/vip")[0], 404)
        wait_until(lambda: 429 in self.burst("vip", 2), 5, message="vip limited by the domain's rules again")


if __name__ == "__main__":
    unittest.main()
