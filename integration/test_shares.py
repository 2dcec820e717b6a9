"""A shared rate split max-min with the real binaries (docs/configuration.md,
`shared` and `share_window`): two heavy tenants and a light one under a
domain-wide rate.

- the light tenant gets all it asks for, never refused;
- the heavy ones split the rest evenly, and the total stays near the rate;
- /status/DOMAIN/IDENTIFIER shows each one's share and whether it wants more;
- a refusal names the limit that refused it in its RateLimit field (the
  master's LIMIT message): the client's share, or one rule of several.

The heavy tenants are sequential clients that send again as soon as they
are answered (held requests wait their turn at the gatekeeper, as the
master's DELAY_UNTIL says); their shares are read over the last seconds of
a bounded run, with tolerances wide enough for a loaded machine.

Run: cd integration && python3 -m unittest -v test_shares
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import unittest
import urllib.request

import urllib3  # Debian's python3-urllib3: a real client reads the fields

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.h2client import H2Client  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

DOMAIN = "api"
RATE = 20  # units a second, all tenants together
RUN_S = 8.0
MEASURE_S = 4.0  # the last seconds of the run


class TestSharedRate(DaemonTestCase):
    def test_two_heavy_tenants_split_what_the_light_one_leaves(self):
        self.master, self.backend, self.proxy = self.gate_stack(
            {DOMAIN: {"rules": [], "shared": [{"rate": f"{RATE}/s", "burst": RATE}], "share_window": "2s"}},
            [{"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
              "max_delay": "5s"}])
        start = time.monotonic()
        statuses: dict[str, list[int]] = {"a": [], "b": [], "light": []}

        def heavy(key: str) -> None:
            while time.monotonic() - start < RUN_S:
                statuses[key].append(fetch(self.proxy.port, "/", key=key, timeout=10)[0].status)

        def light() -> None:
            n = 0
            while time.monotonic() - start < RUN_S:
                statuses["light"].append(fetch(self.proxy.port, "/", key="light", timeout=10)[0].status)
                n += 1
                time.sleep(max(0.0, start + n * 0.5 - time.monotonic()))  # 2 a second

        threads = [threading.Thread(target=heavy, args=(k,)) for k in ("a", "b")]
        threads.append(threading.Thread(target=light))
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertTrue(all(s == 200 for s in statuses["light"]), statuses["light"])
        # The heavy ones may be refused (held too long by their share, or by the
        # gatekeeper's own bound before the master speaks): only what is served counts.
        self.assertGreater(statuses["a"].count(200), 0)
        self.assertGreater(statuses["b"].count(200), 0)

        # What reached the backend in the last MEASURE_S seconds of the run.
        log = self.backend.requests(target_prefix="/")
        end = max(e["t"] for e in log if e["key"] in ("a", "b"))
        got = {k: sum(1 for e in log if e["key"] == k and e["t"] > end - MEASURE_S) / MEASURE_S
               for k in ("a", "b", "light")}
        a, b, light_rate = got["a"], got["b"], got["light"]
        self.assertGreaterEqual(light_rate, 1.5, got)  # all it asks for (2 a second)
        jain = (a + b) ** 2 / (2 * (a * a + b * b))
        self.assertGreaterEqual(jain, 0.95, got)
        total = a + b + light_rate
        self.assertGreaterEqual(total, 0.8 * RATE, got)
        self.assertLessEqual(total, 1.2 * RATE, got)

        def share(key: str) -> dict:
            with urllib.request.urlopen(f"http://{HOST}:{self.master.admin_port}/status/{DOMAIN}/{key}",
                                        timeout=5) as r:
                return json.loads(r.read())["share"]

        heavy_share = share("a")
        self.assertTrue(heavy_share["wants_more"], heavy_share)
        self.assertGreater(heavy_share["rate_per_s"], 0.3 * RATE, heavy_share)
        self.assertLess(heavy_share["rate_per_s"], 0.6 * RATE, heavy_share)
        self.assertFalse(share("light")["wants_more"])



class TestRefusalsNameTheirLimit(DaemonTestCase):
    """Refused at once (max_delay 0), a client reads from the RateLimit field
    which limit refused it: only that one is at r=0, the others say what they
    have left (without LIMIT, every limit would be at zero)."""

    def setUp(self):
        super().setUp()
        self.master, self.backend, self.proxy = self.gate_stack(
            {"pool": {"rules": [("1000/s", 1000)], "shared": [{"rate": "5/s", "burst": 5}], "share_window": "2s"},
             "two": {"rules": [("100/s", 50), ("1/m", 2)]}},
            [{"path": path, "domain": domain, "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
              "max_delay": "0s", "ratelimit_headers": True} for path, domain in (("/pool", "pool"), ("/two", "two"))])
        self.http = urllib3.PoolManager(retries=False, timeout=5.0)
        self.addCleanup(self.http.clear)  # its kept connections

    def refusal_naming(self, path: str, key: str, wanted, h2: bool = False):
        """Sends (HTTP/1.1 by urllib3, or HTTP/2 with prior knowledge) until a
        refusal whose RateLimit lines satisfy `wanted` (a few dozen requests at
        most: the master names the limit within a round trip). Returns
        (its RateLimit lines, its RateLimit-Policy lines, its Retry-After)."""
        sent = []

        def one():
            if len(sent) >= 200:
                raise AssertionError(f"no refusal naming the limit in {len(sent)} requests: {sent[-3:]}")
            if h2:
                with H2Client(self.proxy.port, timeout=5.0) as c:
                    st = c.get(path, headers=[("x-api-key", key)], authority="test.local")
                got = (st.status, st.header_all("ratelimit"), st.header_all("ratelimit-policy"),
                       st.header("retry-after"))
            else:
                r = self.http.request("GET", f"http://{HOST}:{self.proxy.port}{path}", headers={"X-API-Key": key})
                got = (r.status, r.headers.getlist("RateLimit"), r.headers.getlist("RateLimit-Policy"),
                       r.headers.get("Retry-After"))
            sent.append(got)
            return got[1:] if got[0] == 429 and wanted(", ".join(got[1])) else None

        return wait_until(one, 15, interval=0.01, message=f"a refusal on {path} naming its limit")

    def test_a_refusal_by_the_share_names_the_share(self):
        for h2, key in ((False, "a"), (True, "b")):  # the fields are written once for both protocols
            fields, policies, retry_after = self.refusal_naming("/pool", key, lambda f: '"pool-share";r=0;t=' in f,
                                                                h2=h2)
            policies = ", ".join(policies)
            self.assertRegex(policies, r'"pool-share";q=[1-5];w=[12]\b', "its part of the shared burst and window")
            self.assertIn('"pool-1";q=1000;w=1', policies, "the rule still described")
            self.assertRegex(", ".join(fields), r'"pool-1";r=(9\d\d|1000);t=\d+',
                             "the rule is far from its limit: not what refused it")
            self.assertGreaterEqual(int(retry_after), 1)

    def test_a_refusal_by_one_rule_of_two_names_that_rule(self):
        for h2, key in ((False, "a"), (True, "b")):
            fields, policies, _ = self.refusal_naming(
                "/two", key, lambda f: '"two-2";r=0;t=' in f and '"two-1";r=0' not in f, h2=h2)
            fields = ", ".join(fields)
            self.assertRegex(fields, r'"two-1";r=(4\d|50);t=\d+, "two-2";r=0;t=([3-9]\d|1[0-2]\d)\b', fields)
            self.assertEqual(", ".join(policies), '"two-1";q=50;w=1, "two-2";q=2;w=120')

if __name__ == "__main__":
    unittest.main()
