"""The live status pages (GET / on each daemon's admin endpoint) in headless
Chromium (Debian's `chromium`): each page loads with no console message (no
error, no failed request), shows the numbers its daemon's JSON endpoints
give, and a screenshot of each is taken.

Chromium runs as the probe of this machine kind runs it (--headless,
--no-sandbox, no background networking, a fresh profile), with a virtual
time budget that lets the page's refreshes run; the DOM is dumped and read.
Screenshots go to $SMOCKRON_SCREENSHOT_DIR when set (kept), else to the
test's temporary directory.

Run: python3 integration/test_status_page.py -v
"""
from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import fetch  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0", "--window-size=1280,1200"]


class Cells(html.parser.HTMLParser):
    """Text of elements by id, and table cells with their row's and their own data-* attributes."""

    def __init__(self):
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.cells: list[dict] = []  # {"row": {...}, "cell": {...}, "text": "..."}
        self._stack: list[tuple[str, dict]] = []
        self._row: dict = {}
        self._open: list[list] = []  # [id or cell record, text parts]

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self._row = {k[5:]: v for k, v in a.items() if k.startswith("data-")}
        record = None
        if tag == "td":
            record = {"row": dict(self._row), "cell": {k[5:]: v for k, v in a.items() if k.startswith("data-")},
                      "text": ""}
            self.cells.append(record)
        self._open.append([a.get("id"), record, []])

    def handle_endtag(self, tag):
        if not self._open:
            return
        ident, record, parts = self._open.pop()
        text = "".join(parts).strip()
        if ident:
            self.by_id[ident] = text
        if record is not None:
            record["text"] = text
        if self._open:
            self._open[-1][2].append("".join(parts))

    def handle_data(self, data):
        if self._open:
            self._open[-1][2].append(data)


class StatusPageTest(DaemonTestCase):
    def chromium(self, url: str, name: str) -> tuple[Cells, str]:
        """The page's DOM after its first refreshes, and a screenshot; fails on any console message."""
        exe = shutil.which("chromium")
        if exe is None:
            raise AssertionError("chromium missing: scripts/install-deps.sh --test installs Debian's chromium")
        shots = os.environ.get("SMOCKRON_SCREENSHOT_DIR") or self.tmp
        os.makedirs(shots, exist_ok=True)
        shot = os.path.join(shots, f"status-{name}.png")
        common = [exe, *CHROMIUM_FLAGS, "--virtual-time-budget=5000"]
        dom = subprocess.run([*common, f"--user-data-dir={self.tmp}/chromium-{name}-dom", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(dom.returncode, 0, dom.stderr[-3000:])
        console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
        self.assertEqual(console, [], f"{name}: console messages")
        pic = subprocess.run([*common, f"--user-data-dir={self.tmp}/chromium-{name}-shot", f"--screenshot={shot}", url],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(pic.returncode, 0, pic.stderr[-3000:])
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", "a PNG screenshot")
        self.assertGreater(os.path.getsize(shot), 10_000)
        cells = Cells()
        cells.feed(dom.stdout)
        return cells, dom.stdout

    def test_both_pages_show_what_the_json_says(self):
        master, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/m", 2)]}},  # states outlive the test: the numbers hold still
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-Key"], "max_delay": "0s"}])
        # A limited client and a calm one.
        for _ in range(8):
            fetch(proxy.port, "/x", headers=[("X-Key", "hot")])
        fetch(proxy.port, "/x", headers=[("X-Key", "calm")])
        top = wait_until(lambda: (t := json.loads(master.get("/top?domain=api").body)["domains"][0]["top"])
                         and t[0]["identifier"] == "hot" and t, 10, message="/top lists hot")

        page, dom = self.chromium(f"http://127.0.0.1:{master.admin_port}/", "master")
        self.assertNotIn("not answering", page.by_id.get("error", ""))
        self.assertNotEqual(page.by_id.get("updated"), "never", "the page refreshed")
        status = json.loads(master.get("/status").body)
        api = next(d for d in status["domains"] if d["name"] == "api")
        tracked = [c for c in page.cells if c["row"].get("domain") == "api" and c["cell"].get("field") == "tracked"]
        self.assertEqual([c["text"] for c in tracked], [str(api["tracked_identifiers"])])
        self.assertEqual(page.by_id["store"], status["store"])
        hot = {c["cell"]["field"]: c["text"] for c in page.cells
               if c["row"].get("identifier") == "hot" and c["cell"].get("field")}
        top = json.loads(master.get("/top?domain=api").body)["domains"][0]["top"][0]
        self.assertEqual(hot, {"limited": str(top["limited"]), "uses": str(top["uses"]),
                               "refusals": str(top["refusals"])})

        page, dom = self.chromium(f"http://127.0.0.1:{proxy.admin_port}/", "proxy")
        self.assertNotIn("not answering", page.by_id.get("error", ""))
        status = json.loads(proxy.get("/status").body)
        self.assertEqual(page.by_id["masters"], f"{status['masters']['connected']}/{status['masters']['endpoints']}")
        self.assertEqual(page.by_id["held"], str(status["held_requests"]))
        self.assertEqual(page.by_id["max-held"], str(status["max_held"]))
        covered = [c["text"] for c in page.cells if c["row"].get("domain") == "api" and c["cell"].get("field") == "covered"]
        self.assertEqual(covered, ["yes"])
        ok = [c["text"] for c in page.cells if c["row"].get("upstream") == "app" and c["cell"].get("field") == "2xx"]
        served = proxy.metric("smockron_proxy_upstream_responses_total", {"upstream": "app", "code": "2xx"})
        self.assertEqual(ok, [str(int(served))])
        self.assertIn("/__warm/", dom, "the routes table")


    def test_the_master_page_shows_envoys_calls(self):
        from lib import envoy_stubs  # Debian's grpcio: only this test needs it
        rls_pb2, rls_pb2_grpc, rlqs_pb2, rlqs_pb2_grpc = envoy_stubs.load()
        import grpc

        master = self.start_master({"api": {"rules": [("1/h", 2)]}}, rls="127.0.0.1:0")
        channel = grpc.insecure_channel(f"127.0.0.1:{master.rls_port()}")
        self.addCleanup(channel.close)
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for domain in ("api", "api", "api", "elsewhere"):
            req = rls_pb2.RateLimitRequest(domain=domain)
            req.descriptors.add().entries.add(key="k", value="one")
            stub.ShouldRateLimit(req, timeout=5)
        report = rlqs_pb2.RateLimitQuotaUsageReports(domain="api")
        report.bucket_quota_usages.add().bucket_id.bucket["k"] = "two"
        answers = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel).StreamRateLimitQuotas(iter([report]), timeout=5)
        self.assertEqual(len(list(answers)), 1)
        wait_until(lambda: master.metric("smockron_master_rlqs_streams") == 0, 10, message="the stream ended")

        page, _ = self.chromium(f"http://127.0.0.1:{master.admin_port}/", "master-envoy")
        self.assertNotIn("not answering", page.by_id.get("error", ""))
        self.assertEqual(page.by_id["rls"], f"127.0.0.1:{master.rls_port()}")
        shown = {c["cell"]["field"]: c["text"] for c in page.cells if c["cell"].get("field", "").startswith(("rls", "rlqs"))}
        self.assertEqual(shown, {"rls-ok": "2", "rls-over_limit": "1", "rls-shadow_over_limit": "0",
                                 "rls-unknown_domain": "1", "rls-invalid_argument": "0", "rlqs-reports": "1",
                                 "rlqs-streams": "0", "rlqs-buckets": "0"})

if __name__ == "__main__":
    unittest.main()
