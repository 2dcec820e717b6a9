"""The master's UDP query endpoint (issue 18) with the real binaries: the UDP
rate limiter's protocol (its examples, request IDs, what is ignored), one
limit shared by HTTP and UDP uses of an identifier, the allow list, and the
smockron-query command.

Run: cd integration && python3 -m unittest -v test_query
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import binary  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402


class UdpClient:
    def __init__(self, port: int):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(("127.0.0.1", port))

    def ask(self, datagram: bytes, timeout: float = 2.0) -> bytes | None:
        """The answer, or None when none comes within `timeout` (an ignored request)."""
        self.sock.settimeout(timeout)
        self.sock.send(datagram)
        try:
            return self.sock.recv(4096)
        except socket.timeout:
            return None

    def close(self) -> None:
        self.sock.close()


class QueryProtocolTest(DaemonTestCase):
    def master(self, domains, **keys):
        m = self.start_master(domains, query="127.0.0.1:0", **keys)
        return m, self.closing(UdpClient(m.query_port()))

    def test_the_protocols_examples_and_what_is_ignored(self):
        # The spec's examples: limit 22 per 20 s.
        m, udp = self.master({"ws": {"rules": [("22/20s", 22)]}})
        self.assertEqual(udp.ask(b"472 over_limit ws ip=74.11.99.155"), b"472 ok N 1.0 22.0 20")
        self.assertEqual(udp.ask(b"over_limit ws ip=74.11.99.155\n"), b"ok N 2.0 22.0 20", "no ID, no ID back")
        answers = [udp.ask(b"%d over_limit ws ip=4.14.989.98" % i) for i in range(22)]
        self.assertEqual(answers[-1], b"21 ok N 22.0 22.0 20")
        self.assertEqual(udp.ask(b"1332 over_limit ws ip=4.14.989.98"), b"1332 ok Y 22.0 22.0 20")
        self.assertEqual(udp.ask(b"78229 get_stats ws ip=4.14.989.98"),
                         b"78229 n_req=23 n_over=1 last_max_rate=22 key=ws ip=4.14.989.98")
        self.assertEqual(udp.ask(b"get_stats ws nobody"), b"n_req=0 n_over=0 last_max_rate=0 key=ws nobody")
        size = udp.ask(b"5 get_size")
        self.assertRegex(size, rb"^5 size=\d+ keys=2$")
        # Ignored: no answer at all.
        for bad in (b"frobnicate ws x", b"12", b"over_limit ws", b"get_size now", b"over_limit nope x",
                    b"over_limit ws a\x00b", b"x" * 3000):
            self.assertIsNone(udp.ask(bad, timeout=0.3), bad[:40])
        self.assertEqual(udp.ask(b"6 get_size")[:2], b"6 ", "still serving")
        text = m.metrics()
        for reason, n in (("unknown_command", 1), ("malformed", 4), ("unknown_domain", 1), ("too_large", 1)):
            self.assertEqual(metric(text, "smockron_master_query_ignored_total", {"reason": reason}), n, reason)
        self.assertEqual(metric(text, "smockron_master_queries_total", {"command": "over_limit"}), 25)

    def test_http_and_udp_uses_of_an_identifier_share_one_limit(self):
        master, backend, proxy = self.gate_stack({"api": {"rules": [("1/m", 3)]}},
                                                 [{"path": "/", "domain": "api", "upstream": "app",
                                                   "identify": ["header:X-API-Key"], "max_delay": "100ms"}],
                                                 master_keys={"query": "127.0.0.1:0"})
        udp = self.closing(UdpClient(master.query_port()))
        for i in range(2):
            self.assertEqual(fetch(proxy.port, f"/h/{i}", key="alice")[0].status, 200)
        master.wait_metric("smockron_master_accounting_messages_total", {"domain": "api", "status": "ACCEPTED"},
                           predicate=lambda v: v >= 2, timeout=10)
        before = proxy.ctl()
        self.assertEqual(udp.ask(b"1 over_limit api alice"), b"1 ok N 3.0 3.0 180", "the third use of 3")
        self.assertEqual(udp.ask(b"2 over_limit api alice"), b"2 ok Y 3.0 3.0 180")
        # The UDP use left alice throttled: the gatekeeper heard it and holds her HTTP requests.
        self.wait_ctl(proxy, before)
        r, _ = fetch(proxy.port, "/h/after", key="alice")
        self.assertEqual(r.status, 503, r)
        self.assertEqual(fetch(proxy.port, "/h/bob", key="bob")[0].status, 200, "others are apart")
        # The refused request's REJECTED accounting reaches the master a moment later (batched).
        wait_until(lambda: udp.ask(b"3 get_stats api alice") == b"3 n_req=5 n_over=2 last_max_rate=3 key=api alice",
                   10, interval=0.05, message="the HTTP refusal counted in alice's stats")

    def test_the_allow_list_covers_the_endpoint(self):
        m, udp = self.master({"ws": {"rules": [("1/s", 1)]}}, query_allow=["10.0.0.0/8"])
        self.assertIsNone(udp.ask(b"1 over_limit ws x", timeout=0.3))
        m.wait_metric("smockron_master_query_ignored_total", {"reason": "refused"}, predicate=lambda v: v == 1)

    def test_the_smockron_query_command(self):
        m, _ = self.master({"ws": {"rules": [("1/m", 1)]}})
        server = f"127.0.0.1:{m.query_port()}"

        def run(*args):
            return subprocess.run([binary("smockron-query"), "--server", server, *args], capture_output=True,
                                  text=True, timeout=10)

        r = run("over_limit", "ws", "carol")
        self.assertEqual((r.returncode, r.stdout), (0, "ok N 1.0 1.0 60\n"))
        r = run("over_limit", "ws", "carol")
        self.assertEqual((r.returncode, r.stdout), (1, "ok Y 1.0 1.0 60\n"), "over the limit: exit 1")
        r = run("get_stats", "ws", "carol")
        self.assertEqual((r.returncode, r.stdout), (0, "n_req=2 n_over=1 last_max_rate=1 key=ws carol\n"))
        r = run("--timeout", "200", "over_limit", "other", "carol")
        self.assertEqual(r.returncode, 2, "an unknown domain is ignored: no answer")
        self.assertIn("no answer", r.stderr)
        self.assertEqual(run("over_limit", "ws").returncode, 64)


if __name__ == "__main__":
    unittest.main()
