"""Who is limited now, with the real master: GET /top on its admin endpoint
and `smockron-query top`, fed by a stand-in gatekeeper's accounting messages.
The heavy-hitters summary keeps a bounded number of identifiers per domain
(top_identifiers) whatever the number of identifiers limited.

Run: python3 integration/test_top.py -v
"""
from __future__ import annotations

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import run_binary  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import now_ms, wait_until  # noqa: E402


class TopTest(DaemonTestCase):
    def top(self, master, query: str = "") -> dict:
        r = master.get("/top" + query)
        self.assertEqual(r.status, 200, r.body)
        return json.loads(r.body)

    def test_the_identifiers_limited_most(self):
        master = self.start_master({"api": {"rules": [("1/s", 2)]}, "other": {"rules": [("1/s", 2)]}})
        gk = self.gatekeeper(master, ["api", "other"])
        t = now_ms()
        # "hot": 3 uses (the second fills its burst, the third is over it: each
        # draws a DELAY_UNTIL, so both count as limited) and 12 refusals;
        # "warm": 1 use and 4 refusals; 200 others, one use each, never limited.
        for i in range(3):
            gk.accepted("api", "hot", t + i)
        for i in range(12):
            gk.rejected("api", "hot", t + 3 + i)
        gk.accepted("api", "warm", t)
        for i in range(4):
            gk.rejected("api", "warm", t + 1 + i)
        for i in range(200):
            gk.accepted("api", f"calm-{i}", t)

        def settled():
            doc = self.top(master, "?domain=api&n=5")
            top = doc["domains"][0]["top"]
            return len(top) == 2 and top[0]["limited"] == 14 and top[1]["limited"] == 4 and doc

        doc = wait_until(settled, 10, message="/top lists hot and warm")
        self.assertEqual(doc["window_s"], 60)
        hot, warm = doc["domains"][0]["top"]
        self.assertEqual(hot["identifier"], "hot")
        self.assertEqual(hot["error"], 0)
        self.assertTrue(hot["throttled"])
        self.assertGreater(hot["throttled_until_ms"], doc["now_ms"])
        self.assertEqual((hot["uses"], hot["refusals"]), (3, 12))
        self.assertEqual(warm["identifier"], "warm")
        self.assertEqual((warm["uses"], warm["refusals"]), (1, 4))
        # Every domain, and n.
        doc = self.top(master)
        self.assertEqual([d["domain"] for d in doc["domains"]][:2], ["api", "other"])
        self.assertEqual(len(self.top(master, "?domain=api&n=1")["domains"][0]["top"]), 1)
        self.assertEqual(master.get("/top?domain=nope").status, 404)
        self.assertEqual(master.get("/top?n=x").status, 400)
        self.assertEqual(master.get("/top?what=1").status, 400)

        # The command line: the same answer as a table.
        p = run_binary("smockron-query", "--admin", f"127.0.0.1:{master.admin_port}", "top", "api", "5")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertIn("who is limited now", lines[0])
        self.assertTrue(lines[1].startswith("DOMAIN"))
        self.assertEqual(lines[2].split()[:5], ["api", "hot", "14", "3", "12"])
        self.assertIn("s more", lines[2])
        self.assertEqual(lines[3].split()[:5], ["api", "warm", "4", "1", "4"])
        p = run_binary("smockron-query", "--admin", f"127.0.0.1:{master.admin_port}", "top", "nope")
        self.assertEqual(p.returncode, 2)
        self.assertIn("404", p.stderr)
        p = run_binary("smockron-query", "--admin", f"127.0.0.1:{self.dead_port()}", "--timeout", "300", "top")
        self.assertEqual(p.returncode, 2)

    def test_memory_is_bounded_whatever_the_number_of_identifiers(self):
        # 5 counters: 2,000 identifiers limited once each, one limited 1,000
        # times among them (a third of all: more than 1/5, so Space-Saving
        # keeps it, first, with a count at least its true one and at most
        # `error` above it); at most 5 are listed.
        master = self.start_master({"api": {"rules": [("1/h", 1)]}}, top_identifiers=5)
        gk = self.gatekeeper(master, ["api"])
        t = now_ms()
        for i in range(2000):
            gk.rejected("api", f"one-{i}", t)
            if i % 2 == 0:
                gk.rejected("api", "heavy", t)

        def heavy_first():
            top = self.top(master, "?domain=api&n=50")["domains"][0]["top"]
            return (top and top[0]["identifier"] == "heavy" and top[0]["limited"] >= 1000
                    and top[0]["limited"] - top[0]["error"] <= 1000 and top)

        try:
            top = wait_until(heavy_first, 10, message="the heavy identifier first")
        except AssertionError:
            print(master.get("/top?domain=api&n=50").body, file=sys.stderr)
            raise
        self.assertLessEqual(len(top), 5)
        master.wait_metric("smockron_master_accounting_messages_total", {"domain": "api", "status": "REJECTED"},
                           predicate=lambda v: v == 3000)
        self.assertLessEqual(len(self.top(master, "?domain=api&n=50")["domains"][0]["top"]), 5)


if __name__ == "__main__":
    unittest.main()
