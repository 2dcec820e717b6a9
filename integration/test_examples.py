"""The configurations users copy from config/examples/ work as shipped: each
passes --check of both daemons, and config/examples/token-budget.toml, run
by the real binaries in front of scripts/demo_llm_backend.py, limits API keys
by the tokens the backend reports. Only the file's 127.0.0.1 ports are
rewritten (to free ones), and the test checks that nothing else changed.

What is asserted is what docs/cost.md walks through: a key whose calls
reported more than its 20,000 tokens per minute is refused (429, Retry-After,
RateLimit fields) while another key passes; a streamed call is charged from
its trailer; a key whose month is used up is refused until the 1st (UTC).
Every wait polls with a deadline; every process is stopped by PID.

Run: cd integration && python3 -m unittest -v test_examples
"""
from __future__ import annotations

import calendar
import glob
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import REPO_ROOT, MasterProcess, ProxyProcess, run_binary, stop_process  # noqa: E402
from lib.gatekeeper import Gatekeeper  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.ports import HOST, free_ports  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import now_ms, wait_until  # noqa: E402

EXAMPLES = os.path.join(REPO_ROOT, "config", "examples")
TOKEN_BUDGET = os.path.join(EXAMPLES, "token-budget.toml")
LLM_BACKEND = os.path.join(REPO_ROOT, "scripts", "demo_llm_backend.py")
ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def with_ports(text: str, ports: dict[int, int]) -> str:
    """The config with each 127.0.0.1 port p replaced by ports[p] (every one must be mapped)."""
    def sub(m):
        return f"127.0.0.1:{ports[int(m.group(1))]}"
    return ADDRESS.sub(sub, text)


def without_ports(value):
    """The parsed config with every 127.0.0.1 port blanked out (to compare two files but for their ports)."""
    if isinstance(value, dict):
        return {k: without_ports(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_ports(v) for v in value]
    if isinstance(value, str):
        return ADDRESS.sub("127.0.0.1:PORT", value)
    return value


def hashed(key: str) -> str:
    """The identifier the gate derives from a hashed credential (`token`)."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:32]


def completion(prompt: str, max_tokens: int, stream: bool = False) -> bytes:
    return json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": stream}).encode()


def seconds_to_next_month(now: float) -> float:
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) - now


class ExamplesCheckTest(unittest.TestCase):
    def test_every_example_passes_check(self):
        configs = sorted(glob.glob(os.path.join(EXAMPLES, "*.toml")))
        self.assertIn(TOKEN_BUDGET, configs)
        for path in configs:
            text = read(path)
            for daemon in ("master", "proxy"):
                if f"[{daemon}]" not in text:
                    continue
                r = run_binary(f"smockron-{daemon}", "--check", "--config", path)
                self.assertEqual(r.returncode, 0, f"{daemon} --check {path}: {r.stdout}{r.stderr}")
                self.assertIn("configuration OK", r.stdout + r.stderr)


class TokenBudgetExampleTest(DaemonTestCase):
    """config/examples/token-budget.toml: 20,000 tokens per minute (GCRA, burst
    20,000) and 1,000,000 per month per API key (bearer token, hashed), charged
    from X-Tokens-Used; 429 beyond max_delay = 2s."""

    def setUp(self):
        super().setUp()
        self.text = read(TOKEN_BUDGET)
        shipped = tomllib.loads(self.text)
        port = lambda address: int(address.rsplit(":", 1)[1])  # noqa: E731
        m, p = shipped["master"], shipped["proxy"]
        self.roles = {
            "accounting": port(m["accounting"]), "control": port(m["control"]), "master_admin": port(m["admin"]),
            "listen": port(p["listen"]), "proxy_admin": port(p["admin"]),
            "backend": port(p["upstreams"]["llm"]["servers"][0]),
        }
        self.assertEqual(sorted(self.roles.values()), sorted({int(x) for x in ADDRESS.findall(self.text)}),
                         "every 127.0.0.1 address of the example is one of these")
        self.ports = {}  # shipped port -> the port this test uses
        self.backend_port = self.start_llm_backend()
        self.ports[self.roles["backend"]] = self.backend_port
        self.master = self.start_daemon(self.make_master)
        self.proxy = self.start_daemon(self.make_proxy)
        self.wait_connected(self.proxy)
        # Control is connected; accounting too, from every worker (a message sent
        # before a worker's link is up would be counted unsent, not charged).
        self.wait_accounting(self.proxy)
        self.addCleanup(self.assert_nothing_unsent)
        self.charged = 0  # tokens of the calls the proxy let through (what the master must count)

    # ---- the stack, as shipped but for its ports
    def write_config(self, name: str, ports: dict) -> str:
        text = with_ports(self.text, ports)
        self.assertEqual(without_ports(tomllib.loads(text)), without_ports(tomllib.loads(self.text)),
                         "only ports are rewritten")
        return self.write_file(name, text)

    def make_master(self) -> MasterProcess:
        acc, ctl, adm, listen, padm = free_ports(5)
        r = self.roles
        self.ports.update({r["accounting"]: acc, r["control"]: ctl, r["master_admin"]: adm})
        # The proxy's ports in the master's copy are placeholders: the master only validates them.
        path = self.write_config("master.toml", {**self.ports, r["listen"]: listen, r["proxy_admin"]: padm})
        return MasterProcess(self.tmp, acc, ctl, adm, path)

    def make_proxy(self) -> ProxyProcess:
        listen, adm = free_ports(2)
        self.ports.update({self.roles["listen"]: listen, self.roles["proxy_admin"]: adm})
        return ProxyProcess(self.tmp, self.write_config("proxy.toml", self.ports), listen, adm)

    def start_llm_backend(self, attempts: int = 5) -> int:
        """scripts/demo_llm_backend.py on a free port (another one if that was taken meanwhile)."""
        log_path = os.path.join(self.tmp, "demo-llm-backend.log")
        self.log_files.append(("demo_llm_backend.py", log_path))
        for _ in range(attempts):
            port = free_ports(1)[0]
            with open(log_path, "ab") as log:
                proc = subprocess.Popen([sys.executable, LLM_BACKEND, str(port)], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log)
            self.addCleanup(stop_process, proc)

            def listening():
                if proc.poll() is not None:
                    return "exited"
                with socket.create_connection((HOST, port), timeout=1):
                    return "up"

            if wait_until(listening, 10, message=f"demo_llm_backend.py on port {port}") == "up":
                return port
        raise AssertionError(f"demo_llm_backend.py did not start:\n{read(log_path)}")

    def assert_nothing_unsent(self):
        if self.proxy.alive():
            self.assertEqual(self.proxy.metric("smockron_proxy_accounting_unsent_total") or 0, 0)

    # ---- calls
    def call(self, key: str, prompt: str, max_tokens: int, stream: bool = False):
        r, _ = fetch(self.proxy.port, "/v1/completions", method="POST",
                     headers=[("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")],
                     body=completion(prompt, max_tokens, stream), timeout=20)
        if r.status == 200 and not stream:
            self.charged += int(r.headers["x-tokens-used"])
        return r

    def wait_policy(self):
        """Until the master's POLICY and QUOTA have reached the proxy: RateLimit-Policy on a response."""
        box = {}

        def described():
            box["r"] = self.call("warm-up-key", "hi", 1)
            return box["r"].status == 200 and "ratelimit-policy" in box["r"].headers

        wait_until(described, 10, interval=0.05, message="RateLimit-Policy on the example's responses")
        return box["r"]

    def status(self, key: str) -> dict:
        r = self.master.get("/status/llm/" + urllib.parse.quote(hashed(key), safe=""))
        self.assertEqual(r.status, 200, r.body)
        return json.loads(r.body)

    def assert_policy(self, r):
        # Both rules, in units: the minute's 20,000 and the month's 1,000,000 (w: this month's seconds).
        self.assertRegex(r.headers.get("ratelimit-policy", ""), r'^"llm-1";q=20000;w=60, "llm-2";q=1000000;w=\d+$')

    # ---- the walk-through of docs/cost.md
    def test_a_key_over_its_minute_is_refused_while_another_passes(self):
        self.assert_policy(self.wait_policy())
        # Each call reserves its max_tokens (read from the JSON body) when
        # admitted, and the 4 tokens of its prompt are charged when it ends:
        # three calls of 6,000 fit in the minute's 20,000.
        for n in range(3):
            r = self.call("alice-key", "Write a long story", 6000)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.headers["x-tokens-used"], "6004")
            if n == 0:  # the standing once its reservation is charged: 20,000 - 6,000, back in 18 s
                self.assertEqual(r.headers.get("ratelimit"), '"llm-1";r=14000;t=18')
            self.assert_policy(r)
        # The fourth does not fit (about 2,000 left): the 4,000 more it needs
        # take 12 s, beyond max_delay: refused at once, never forwarded.
        no = self.call("alice-key", "Write a long story", 6000)
        self.assertEqual(no.status, 429, no)
        retry_after = int(no.headers["retry-after"])
        self.assertGreaterEqual(retry_after, 11, "not before 6,000 fit again")
        self.assertLessEqual(retry_after, 13, "as soon as they do")
        self.assert_policy(no)
        m = re.fullmatch(r'"llm-1";r=0;t=(\d+)', no.headers.get("ratelimit", ""))
        self.assertIsNotNone(m, no.headers)
        self.assertGreaterEqual(int(m.group(1)), retry_after)
        self.assertNotIn("x-tokens-used", no.headers, "refused by the gate: the backend never saw it")
        # A call that can never fit (more than the minute's budget): refused at once, no Retry-After.
        never = self.call("carol-key", "Everything", 25000)
        self.assertEqual(never.status, 429, never)
        self.assertNotIn("retry-after", never.headers)
        self.assertEqual(self.proxy.metric("smockron_proxy_rejects_total", {"reason": "cost_over_limit"}), 1)
        # Another key has its own budget.
        ok = self.call("bob-key", "hi", 1)
        self.assertEqual(ok.status, 200, ok)
        self.assertEqual(ok.headers.get("ratelimit"), '"llm-1";r=19999;t=1')
        # The master charged exactly what the backend reported for the calls let
        # through (reservations corrected: charged, less what was given back),
        # refusals nothing; alice never went past her minute.
        def net():
            return ((self.master.metric("smockron_master_units_total", {"domain": "llm"}) or 0) -
                    (self.master.metric("smockron_master_units_refunded_total", {"domain": "llm"}) or 0))

        wait_until(lambda: net() >= self.charged, 10, message="the master's units reach what was charged")
        self.assertEqual(net(), self.charged)
        self.assertLessEqual(self.status("alice-key")["quotas"][0]["used"], 20000)
        self.assertEqual(self.proxy.metric("smockron_proxy_cost_fallback_total", {"reason": "missing"}), 0)
        self.assertGreaterEqual(self.proxy.metric("smockron_proxy_rejects_total", {"reason": "delay_too_long"}) or 0, 1)

    def test_a_stream_is_charged_from_its_trailer(self):
        self.wait_policy()
        r = self.call("carol-key", "Stream me", 2500, stream=True)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers.get("content-type"), "text/event-stream")
        self.assertNotIn("x-tokens-used", r.headers, "known only at the end: a trailer")
        self.assertIn(b'"total_tokens": 2502', r.body)
        wait_until(lambda: self.status("carol-key")["quotas"][0]["used"] == 2502, 10,
                   message="carol's 2,502 tokens charged from the trailer")
        self.assertEqual(self.proxy.metric("smockron_proxy_cost_fallback_total", {"reason": "missing"}), 0)

    def test_a_key_whose_month_is_used_up_is_refused_until_the_first(self):
        if seconds_to_next_month(time.time()) < 300:
            self.skipTest("the month ends within 5 minutes: its reset would race the test")
        # 999,999 tokens of this month already used, reported as another gatekeeper
        # would (accounting with cost=N) until the master counts them.
        gk = self.closing(Gatekeeper(self.master.accounting, self.master.control, ["llm"], probe_domain=None))
        ident = hashed("dave-key")

        def counted():
            gk.accepted("llm", ident, now_ms(), loginfo="cost=1")
            return self.status("dave-key")["quotas"][0]["used"] >= 1

        wait_until(counted, 10, interval=0.1, message="the master counts dave's use")
        used = self.status("dave-key")["quotas"][0]["used"]
        gk.accepted("llm", ident, now_ms(), loginfo=f"cost={1_000_000 - used}")
        wait_until(lambda: self.status("dave-key")["quotas"][0]["used"] >= 1_000_000, 10,
                   message="dave's month used up")
        box = {}

        def refused():
            # A first refusal may be the gate's own (the rate rule's debt, charged
            # locally) before the master's DELAY_UNTIL to the month's end is in: the
            # month shows as exhausted (r=0) only then, so wait for that one.
            box["r"] = self.call("dave-key", "hi", 1)
            box["t"] = time.time()
            return box["r"].status == 429 and '"llm-2";r=0' in box["r"].headers.get("ratelimit", "")

        wait_until(refused, 10, message="dave refused")
        no = box["r"]
        retry_after = int(no.headers["retry-after"])
        until_first = seconds_to_next_month(box["t"])
        self.assertGreaterEqual(retry_after, until_first - 1, "refused until the 1st, 00:00 UTC")
        self.assertLessEqual(retry_after, until_first + 2)
        m = re.search(r'"llm-2";r=0;t=(\d+)$', no.headers.get("ratelimit", ""))
        self.assertIsNotNone(m, no.headers)
        self.assertLessEqual(abs(int(m.group(1)) - retry_after), 1, "the month's units are back at the reset")
        reset_ms = self.status("dave-key")["quotas"][0]["reset_ms"]
        self.assertAlmostEqual(reset_ms / 1000, box["t"] + until_first, delta=1)
        self.assertEqual(self.call("erin-key", "hi", 1).status, 200, "another key's month is its own")


if __name__ == "__main__":
    unittest.main()
