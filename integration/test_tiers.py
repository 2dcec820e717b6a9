"""Tiers with the real binaries (docs/configuration.md, `tiers` and a
route's `tier`): rule sets a request selects by name, so that a client's
limit follows its plan with no reload.

- a request's tier comes from a header a trusted peer sets, or from a
  verified JWT claim; its client is limited by that tier's rules, the
  others (no tier, an unknown one) by the domain's;
- a client whose plan changes is judged by the new tier from its next
  request: its gatekeeper at once, the master with that request's
  accounting message (one round trip), with no reload; /status shows the
  tier it is judged by;
- a tier's concurrency limit holds at the backend.

Rates are per minute, so that what passes depends on counts, not on how
fast the machine is; where the master's word decides, the test waits for
its DELAY_UNTIL to reach the proxy.

Run: cd integration && python3 -m unittest -v test_tiers
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

DOMAIN = "api"
SECRET = b"tier-test-secret"
TIERS = {"pro": [("1/min", 6)], "free": [("1/min", 1), ("10/h", 10)]}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256(claims: dict) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps(claims).encode())
    sig = hmac.new(SECRET, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(sig)}"


class TestTiers(DaemonTestCase):
    def stack(self, domain: dict, routes: list):
        self.master, self.backend, self.proxy = self.gate_stack(
            {DOMAIN: domain}, routes, jwt={"hs256_secret": SECRET.decode()})
        # The proxy has every tier (TIER, published beside the domain's POLICY).
        self.proxy.wait_metric("smockron_proxy_gate_tiers", predicate=lambda v: v >= len(domain["tiers"]),
                               timeout=10)

    def status_of(self, identifier: str) -> dict:
        with urllib.request.urlopen(f"http://{HOST}:{self.master.admin_port}/status/{DOMAIN}/{identifier}",
                                    timeout=5) as r:
            return json.loads(r.read())

    def burst(self, n: int, key: str, plan: str | None = None, path: str = "/", headers=()) -> list[int]:
        hdrs = list(headers) + ([("X-Plan", plan)] if plan is not None else [])
        return [fetch(self.proxy.port, path, key=key, headers=hdrs)[0].status for _ in range(n)]

    def test_the_tier_selects_the_rules_and_a_plan_change_needs_no_reload(self):
        self.stack({"rules": [("1/min", 2)], "tiers": TIERS},
                   [{"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"],
                     "tier": "header:X-Plan", "status": 429, "max_delay": "100ms"}])
        self.assertEqual(self.burst(4, "base"), [200, 200, 429, 429])  # no tier: the domain's burst of 2
        self.assertEqual(self.burst(8, "p", "pro"), [200] * 6 + [429] * 2)
        self.assertEqual(self.burst(3, "g", "gold"), [200, 200, 429])  # a tier the domain does not have
        self.assertEqual(self.burst(3, "x", "not a tier"), [200, 200, 429])
        self.assertEqual(self.proxy.metric("smockron_proxy_tier_invalid_total"), 3)
        self.assertNotIn("tier", self.status_of("base"))
        # "base" upgrades: its 2 uses are kept (same shape), 4 more fit pro's 6,
        # at once, with no reload. The master says wait with the 6th use.
        self.assertEqual(self.burst(4, "base", "pro"), [200] * 4)
        doc = wait_until(lambda: (lambda d: d if d.get("throttled") else None)(self.status_of("base")), 5,
                         message="the master judging base under pro, its 6 uses")
        self.assertEqual(doc["tier"], "pro")
        self.assertEqual(doc["rules"][0]["burst"], 6)
        self.assertEqual(doc["rules"][0]["used"], 6)
        # Its DELAY_UNTIL reaches the gatekeeper, which refuses from then on.
        wait_until(lambda: self.burst(1, "base", "pro") == [429], 5, message="base refused under pro")
        # ... and downgrades: free's other shape starts it afresh, under free's burst of 1.
        self.assertEqual(self.burst(2, "base", "free"), [200, 429])
        wait_until(lambda: self.status_of("base").get("tier") == "free", 5, message="base judged under free")
        # The accounting carried the tiers: the master counted every use it was told of.
        status = json.loads(urllib.request.urlopen(f"http://{HOST}:{self.master.admin_port}/status",
                                                   timeout=5).read())
        tiers = next(d for d in status["domains"] if d["name"] == DOMAIN)["tiers"]
        self.assertEqual(sorted(tiers), ["free", "pro"])

    def test_a_verified_jwt_claim_names_the_tier(self):
        self.stack({"rules": [("1/min", 1)], "tiers": TIERS},
                   [{"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["jwt:sub"], "tier": "jwt:plan",
                     "unidentified": "reject", "status": 429, "max_delay": "100ms"}])

        def burst(n: int, claims: dict) -> list[int]:
            return self.burst(n, "ignored", headers=[("Authorization", f"Bearer {hs256(claims)}")])

        self.assertEqual(burst(8, {"sub": "alice", "plan": "pro"}), [200] * 6 + [429] * 2)
        self.assertEqual(burst(2, {"sub": "bob"}), [200, 429])  # no plan claim: the domain's
        wait_until(lambda: self.status_of("alice").get("tier") == "pro", 5, message="alice judged under pro")

    def test_a_tiers_concurrency_limit_holds(self):
        self.stack({"rules": [{"concurrency": 1}], "tiers": {"pro": [{"concurrency": 3}]}},
                   [{"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"],
                     "tier": "header:X-Plan", "status": 429, "max_delay": "20s"}])
        self.proxy.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v >= 1, timeout=10)
        results: list = [None] * 12

        def run(i: int) -> None:
            key, plan = ("p", "pro") if i < 8 else ("b", None)
            hdrs = [("X-Plan", plan)] if plan else []
            results[i] = fetch(self.proxy.port, "/slow?s=0.3", key=key, headers=hdrs, timeout=60)[0].status

        threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(results, [200] * 12)
        seen = self.backend.inflight()["max"]
        self.assertLessEqual(seen["p"], 3, seen)
        self.assertGreaterEqual(seen["p"], 2, seen)  # more than the domain's 1
        self.assertEqual(seen["b"], 1, seen)


if __name__ == "__main__":
    unittest.main()
