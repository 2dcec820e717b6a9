"""Black-box integration tests for smockron-master.

Each test starts its own master on fresh 127.0.0.1 ports and talks to it
through ZeroMQ (a Gatekeeper stand-in) and its admin HTTP endpoint.

Exact timestamps: the master evaluates with its own wall clock as "now". Tests
that assert exact DELAY_UNTIL values send timestamps a few seconds in the
future (BASE_AHEAD_MS, well inside max_clock_skew) so that the history, not the
master's clock, decides: with rate 10/s (interval 100 ms) and burst 2, two
ACCEPTED at `base` give DELAY_UNTIL base+100 exactly.

Run: python3 -m unittest discover -s integration -p 'test_*.py' -v
  or python3 integration/test_master.py -v
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.config import PROBE_DOMAIN, master_toml  # noqa: E402
from lib.daemons import MasterProcess, run_binary  # noqa: E402
from lib.metrics import metric, metric_sum  # noqa: E402
from lib.ports import free_ports  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import now_ms, wait_until  # noqa: E402

MASTER = "smockron-master"
BASE_AHEAD_MS = 5000  # timestamps this far ahead of the master's clock keep "now" out of the results

DOMAINS = {
    # interval 100 ms, window 200 ms
    "api": {"rules": [("10/s", 2)], "algorithm": "sliding-log"},
    # interval 5000 ms; GCRA next = TAT - (burst-1)*interval, independent of "now"
    "gcra": {"rules": [("1/5s", 2)], "algorithm": "gcra"},
    # two rules: 10/s burst 2 and 1/s burst 3 (the slower one dominates once both are full)
    "multi": {"rules": [("10/s", 2), ("1/s", 3)]},
    # no rules at all: never throttles
    "open": {"rules": []},
}


def future_base() -> int:
    return now_ms() + BASE_AHEAD_MS


class MasterCase(DaemonTestCase):
    def delay(self, msg, domain, identifier, next_ms, interval_ms):
        """Asserts msg is DELAY_UNTIL(domain, identifier, next_ms, interval_ms), with readable output."""
        self.assertIsNotNone(msg, "expected a DELAY_UNTIL, got nothing")
        self.assertEqual(len(msg.frames), 5, f"frames: {msg.frames!r}")
        got = (msg.domain, msg.command, msg.identifier, msg.next_ms, msg.interval_ms)
        self.assertEqual(got, (domain, "DELAY_UNTIL", identifier, next_ms, interval_ms),
                         f"(next relative to the expected value: {(msg.next_ms or 0) - next_ms:+d} ms)")

    def assert_quiet(self, gk, quiet=0.2):
        """Nothing else is queued. The caller has already received a later message on the same
        socket, so anything published earlier would already be here; `quiet` only bounds the check."""
        self.assertEqual(gk.drain(quiet), [])


# =============================================================================== CLI


class CliTest(DaemonTestCase):
    def test_version(self):
        r = run_binary(MASTER, "--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.strip(), r"^smockron-master \d+\.\d+\.\d+\S*$")

    def test_help(self):
        r = run_binary(MASTER, "--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--config", "--check", "--log-level", "--version"):
            self.assertIn(flag, r.stdout)

    def test_unknown_argument_exits_2_with_usage(self):
        r = run_binary(MASTER, "--bogus")
        self.assertEqual(r.returncode, 2)
        self.assertIn('unknown argument "--bogus"', r.stderr)
        self.assertIn("usage:", r.stderr)

    def test_check_good_config(self):
        acc, ctl, adm = free_ports(3)
        path = self.write_file("good.toml", master_toml(acc, ctl, adm, DOMAINS, max_identifiers=100,
                                                        sweep_interval="50ms", max_clock_skew="10s"))
        r = run_binary(MASTER, "--config", path, "--check")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{path}: configuration OK", r.stdout)
        self.assertEqual(r.stderr, "")

    def test_check_embedded_defaults(self):
        r = run_binary(MASTER, "--check")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configuration OK", r.stdout)

    def test_check_bad_config_lists_every_error(self):
        text = (
            '[master]\n'
            'accounting = "tcp://127.0.0.1:1"\n'
            'contrl = "tcp://127.0.0.1:2"\n'
            'max_identifiers = 0\n'
            '\n'
            '[master.domains.api]\n'
            'rules = [ { rate = "10/parsec", burst = 2 }, { rate = "5/s", burst = 0, extra = 1 } ]\n'
            'algorithm = "fast"\n'
            '\n'
            '[master.domains.ok]\n'
            'rules = [ { rate = "abc", burst = 1 } ]\n'
        )
        path = self.write_file("bad.toml", text)
        lines = text.splitlines()

        def at(line_no, needle):
            return f"{path}:{line_no}:{lines[line_no - 1].index(needle) + 1}: "

        expected = [
            at(3, "contrl") + "master.contrl: unknown key",
            at(4, "0") + "master.max_identifiers: must be between 1 and",
            at(7, '"10/parsec"') + 'master.domains.api.rules[0].rate: invalid rate "10/parsec"',
            at(7, "0, extra") + "master.domains.api.rules[1].burst: must be between 1 and",
            at(7, "extra") + "master.domains.api.rules[1].extra: unknown key",
            at(8, '"fast"') + 'master.domains.api.algorithm: unknown algorithm "fast"',
            at(11, '"abc"') + 'master.domains.ok.rules[0].rate: invalid rate "abc"',
        ]
        r = run_binary(MASTER, "--config", path, "--check")
        self.assertNotEqual(r.returncode, 0)
        err_lines = r.stderr.splitlines()
        for e in expected:
            self.assertTrue(any(l.startswith(e) for l in err_lines), f"missing error {e!r} in:\n{r.stderr}")
        self.assertIn(f"{len(expected)} configuration error(s)", r.stderr)
        self.assertEqual(len([l for l in err_lines if l.startswith(path + ":")]), len(expected), r.stderr)
        self.assertNotIn("configuration OK", r.stdout)

    def test_check_toml_syntax_error(self):
        path = self.write_file("syntax.toml", '[master]\naccounting = "tcp://127.0.0.1:1\n')
        r = run_binary(MASTER, "--config", path, "--check")
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr, re.escape(path) + r":2:\d+: ")

    def test_check_without_master_table(self):
        path = self.write_file("empty.toml", "# nothing here\n")
        r = run_binary(MASTER, "--config", path, "--check")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("[master]", r.stderr)

    def test_missing_config_file(self):
        r = run_binary(MASTER, "--config", os.path.join(self.tmp, "nope.toml"), "--check")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("nope.toml", r.stderr)

    def test_start_with_bad_config_refuses_to_run(self):
        acc, ctl, adm = free_ports(3)
        text = master_toml(acc, ctl, adm, {"api": {"rules": [("10/s", 0)]}})
        path = self.write_file("bad.toml", text)
        r = run_binary(MASTER, "--config", path)  # bounded by run_binary's timeout
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("master.domains.api.rules[0].burst", r.stderr)

    def test_unknown_log_level(self):
        acc, ctl, adm = free_ports(3)
        path = self.write_file("good.toml", master_toml(acc, ctl, adm, DOMAINS))
        r = run_binary(MASTER, "--config", path, "--log-level", "loud")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown log level", r.stderr)


# =============================================================================== rate logic on the wire


class RateLogicTest(MasterCase):
    def setUp(self):
        super().setUp()
        self.master = self.start_master(DOMAINS)
        self.gk = self.gatekeeper(self.master, ["api", "gcra", "multi", "open"])

    def test_sliding_log_burst_then_delayed_timestamps(self):
        gk, base = self.gk, future_base()
        gk.accepted("api", "alice", base)      # 1 of 2: nothing
        gk.accepted("api", "alice", base)      # history full: max(now, base) + 100
        self.delay(gk.expect(), "api", "alice", base + 100, 100)
        # The gatekeeper held a request and released it at base+100: the delayed
        # timestamp (not the received one) enters the history.
        gk.delayed("api", "alice", base, base + 100)
        self.delay(gk.expect(), "api", "alice", base + 200, 100)
        # A request released much later: its delayed timestamp base+700 counts, so
        # next = base+800 (with the received timestamp it would be base+400).
        gk.delayed("api", "alice", base + 5, base + 700)
        self.delay(gk.expect(), "api", "alice", base + 800, 100)
        gk.accepted("api", "alice", base + 800)
        self.delay(gk.expect(), "api", "alice", base + 900, 100)
        self.assert_quiet(gk)

    def test_sliding_log_duplicate_delayed_each_take_a_slot(self):
        """Two gatekeepers release held requests at the same DELAY_UNTIL instant and
        both report DELAYED with the same timestamp: each is counted at the next
        free slot, so the next allowed time advances one interval per request."""
        gk1 = self.gk
        gk2 = self.gatekeeper(self.master, ["api"])
        base = future_base()
        gk1.accepted("api", "bob", base)
        gk1.accepted("api", "bob", base)
        for gk in (gk1, gk2):
            self.delay(gk.expect(), "api", "bob", base + 100, 100)
        gk1.delayed("api", "bob", base + 1, base + 100)
        gk2.delayed("api", "bob", base + 2, base + 100)
        for gk in (gk1, gk2):  # whichever arrived first, the answers are +200 then +300
            self.delay(gk.expect(), "api", "bob", base + 200, 100)
            self.delay(gk.expect(), "api", "bob", base + 300, 100)
        gk2.delayed("api", "bob", base + 3, base + 100)
        for gk in (gk1, gk2):
            self.delay(gk.expect(), "api", "bob", base + 400, 100)
        self.assert_quiet(gk1)
        self.assert_quiet(gk2, 0)

    def test_gcra_exact(self):
        gk = self.gk
        t0 = now_ms()  # GCRA's answer does not depend on "now": TAT - (burst-1)*interval
        gk.accepted("gcra", "carol", t0)  # TAT t0+5000, next t0 <= now: nothing published
        gk.accepted("gcra", "carol", t0)  # TAT t0+10000, next t0+5000
        self.delay(gk.expect(), "gcra", "carol", t0 + 5000, 5000)
        gk.accepted("gcra", "carol", t0)  # TAT t0+15000
        self.delay(gk.expect(), "gcra", "carol", t0 + 10000, 5000)
        # Two DELAYED released at the same instant each advance the TAT by one interval.
        gk.delayed("gcra", "carol", t0, t0 + 5000)
        self.delay(gk.expect(), "gcra", "carol", t0 + 15000, 5000)
        gk.delayed("gcra", "carol", t0, t0 + 5000)
        self.delay(gk.expect(), "gcra", "carol", t0 + 20000, 5000)
        # A REJECTED request does not move the TAT; the master repeats the current answer.
        gk.rejected("gcra", "carol", t0)
        self.delay(gk.expect(), "gcra", "carol", t0 + 20000, 5000)
        self.assert_quiet(gk)

    def test_two_rules_slower_dominates(self):
        gk, base = self.gk, future_base()
        gk.accepted("multi", "dave", base)
        gk.accepted("multi", "dave", base)     # 10/s burst 2 full; 1/s burst 3 not yet
        self.delay(gk.expect(), "multi", "dave", base + 100, 100)
        # A third, accepted before the gatekeeper heard, is over 10/s burst 2: charged at
        # b+100 (not forgotten), and then 1/s burst 3 is full too: b+100 vs b+1100.
        gk.accepted("multi", "dave", base)
        self.delay(gk.expect(), "multi", "dave", base + 1100, 1000)
        gk.delayed("multi", "dave", base, base + 1100)   # history [b, b, b+100, b+1100]
        self.delay(gk.expect(), "multi", "dave", base + 2100, 1000)
        gk.accepted("multi", "dave", base + 2100)        # on time: its own time, as the spec says
        self.delay(gk.expect(), "multi", "dave", base + 3100, 1000)
        self.assert_quiet(gk)
        # Each DELAY_UNTIL was followed by a LIMIT naming the rule that set it.
        self.assertEqual([(f[1], f[2], int(f[3]), f[4]) for f in gk.limits],
                         [(b"LIMIT", b"dave", base + 100, b"rule:0")] +
                         [(b"LIMIT", b"dave", base + t, b"rule:1") for t in (1100, 2100, 3100)])

    def test_nothing_published_under_the_limit(self):
        gk, base = self.gk, future_base()
        gk.accepted("api", "calm", base)            # 1 of burst 2
        for _ in range(3):
            gk.rejected("api", "calm", base)        # REJECTED never enters the history
        gk.rejected("api", "stranger", base)        # unknown identifier, REJECTED: nothing
        gk.accepted("multi", "calm", base)          # 1 of 2 / 1 of 3
        gk.accepted("gcra", "calm", now_ms())       # GCRA, first request: next <= now
        for _ in range(5):
            gk.accepted("open", "calm", base)       # a domain without rules never throttles
        old = now_ms() - 1000
        gk.accepted("api", "old", old)              # already outside the 200 ms window: not recorded
        gk.accepted("api", "old", old)
        # A later throttled message on the same socket: it must be the first to arrive.
        gk.accepted("api", "marker", base)
        gk.accepted("api", "marker", base)
        self.delay(gk.expect(), "api", "marker", base + 100, 100)
        self.assert_quiet(gk)
        # "calm" really has one use recorded: one more ACCEPTED fills the burst.
        gk.accepted("api", "calm", base)
        self.delay(gk.expect(), "api", "calm", base + 100, 100)

    def test_loginfo_frame_accepted(self):
        gk, base = self.gk, future_base()
        gk.accepted("api", "erin", base, loginfo="UA: curl/8")
        gk.accepted("api", "erin", base, loginfo="")  # an empty 6th frame is still well-formed
        self.delay(gk.expect(), "api", "erin", base + 100, 100)
        text = self.master.metrics()
        self.assertEqual(metric_sum(text, "smockron_master_decode_errors_total"), 0)

    def test_identifier_bytes_are_opaque(self):
        gk, base = self.gk, future_base()
        ident = "ünïcödé key with spaces/\"quotes\""
        gk.accepted("api", ident, base)
        gk.accepted("api", ident, base)
        self.delay(gk.expect(), "api", ident, base + 100, 100)
        longest = "y" * 1024  # the largest identifier the wire allows
        gk.accepted("api", longest, base)
        gk.accepted("api", longest, base)
        self.delay(gk.expect(), "api", longest, base + 100, 100)


class ClockSkewTest(MasterCase):
    def test_future_timestamps_are_clamped_to_max_clock_skew(self):
        master = self.start_master(DOMAINS, max_clock_skew="10s")
        gk = self.gatekeeper(master, ["api"])
        before = now_ms()
        gk.accepted("api", "fast-clock", before + 3_600_000)  # an hour ahead
        gk.accepted("api", "fast-clock", before + 3_600_000)
        msg = gk.expect()
        after = now_ms()
        self.assertEqual((msg.domain, msg.identifier, msg.interval_ms), ("api", "fast-clock", 100))
        # Clamped to master-now + 10 s, then + interval.
        self.assertGreaterEqual(msg.next_ms, before + 10_000 + 100)
        self.assertLessEqual(msg.next_ms, after + 10_000 + 100 + 1)  # +1: next is rounded up to the ms


# =============================================================================== bad input


class MalformedTrafficTest(MasterCase):
    def test_malformed_messages_are_counted_and_survived(self):
        master = self.start_master(DOMAINS)
        gk = self.gatekeeper(master, ["api"])
        base = future_base()
        ts = str(base + 50).encode()  # if any of these were recorded, "victim" would answer base+150
        v = b"victim"
        cases = [
            ([b"api\0", b"ACCEPTED", v], "frame_count"),
            ([b"api\0"], "frame_count"),
            ([b"api\0", b"ACCEPTED", v, ts, b"", b"log", b"extra"], "frame_count"),
            ([b"api\0", b"ACCEPTED", v, ts, b""] + [b"x"] * 15, "frame_count"),  # 20 frames
            ([b"api\0junk", b"ACCEPTED", v, ts, b""], "domain_not_terminated"),
            ([b"api\0x\0", b"ACCEPTED", v, ts, b""], "domain_contains_null"),
            ([b"api\0", b"ALLOWED", v, ts, b""], "unknown_status"),
            ([b"api\0", b"accepted", v, ts, b""], "unknown_status"),
            ([b"api\0", b"ACCEPTED", v, b"12a4", b""], "timestamp_not_numeric"),
            ([b"api\0", b"ACCEPTED", v, b"-" + ts, b""], "timestamp_not_numeric"),
            ([b"api\0", b"ACCEPTED", v, b"", b""], "timestamp_empty"),
            ([b"api\0", b"ACCEPTED", v, b"9" * 16, b""], "timestamp_out_of_range"),
            ([b"api\0", b"ACCEPTED", v, b"253402300800000", b""], "timestamp_out_of_range"),
            ([b"api\0", b"DELAYED", v, ts, b""], "delayed_missing"),
            ([b"api\0", b"DELAYED", v, ts, b"soon"], "timestamp_not_numeric"),
            ([b"api\0", b"ACCEPTED", v, ts, ts], "delayed_unexpected"),
            ([b"api\0", b"ACCEPTED", b"", ts, b""], "identifier_empty"),
            ([b"api\0", b"ACCEPTED", b"x" * 1025, ts, b""], "frame_too_large"),
            ([b"api\0", b"ACCEPTED", v, ts, b"", b"L" * 4097], "frame_too_large"),
        ]
        for frames, _ in cases:
            gk.send(frames)
        gk.accepted("api", "victim", base)
        gk.accepted("api", "victim", base)
        self.delay(gk.expect(), "api", "victim", base + 100, 100)
        self.assert_quiet(gk)

        expected = {}
        for _, reason in cases:
            expected[reason] = expected.get(reason, 0) + 1
        text = master.metrics()
        for reason in ("frame_count", "frame_too_large", "domain_not_terminated", "domain_empty",
                       "domain_contains_null", "identifier_empty", "unknown_status", "unknown_command",
                       "timestamp_empty", "timestamp_not_numeric", "timestamp_out_of_range", "delayed_missing",
                       "delayed_unexpected", "interval_invalid"):
            with self.subTest(reason=reason):
                self.assertEqual(metric(text, "smockron_master_decode_errors_total", {"reason": reason}),
                                 expected.get(reason, 0))
        self.assertEqual(metric(text, "smockron_master_accounting_messages_total",
                                {"domain": "api", "status": "ACCEPTED"}), 2)
        self.assertEqual(metric(text, "smockron_master_accounting_messages_total",
                                {"domain": "api", "status": "DELAYED"}), 0)
        self.assertTrue(master.alive())
        self.assertEqual(master.get("/livez").status, 200)
        self.assertIn("malformed accounting message", master.log())

        # Still fully working afterwards.
        base2 = future_base()
        gk.accepted("api", "after", base2)
        gk.accepted("api", "after", base2)
        self.delay(gk.expect(), "api", "after", base2 + 100, 100)

    def test_accounting_connections_that_break_the_protocol_are_closed_and_counted(self):
        master = self.start_master(DOMAINS)
        gk = self.gatekeeper(master, ["api"])

        def greeting(major=3, mechanism=b"NULL"):
            return b"\xff" + b"\0" * 8 + b"\x7f" + bytes([major, 1]) + mechanism.ljust(20, b"\0") + b"\0" * 32

        ready_req = b"\x04\x19\x05READY\x0bSocket-Type\0\0\0\x03REQ"
        cases = [
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "greeting"),   # not ZeroMQ at all
            (greeting(major=2)[:12], "greeting"),                     # ZeroMQ 3.x (ZMTP 2.0)
            (greeting(mechanism=b"CURVE"), "mechanism"),
            (greeting() + ready_req, "handshake"),                     # a socket type that cannot publish
        ]
        for data, reason in cases:
            with self.subTest(reason=reason), socket.create_connection(("127.0.0.1", master.accounting_port), 5) as s:
                s.sendall(data)
                deadline = time.monotonic() + 5
                closed = False
                while time.monotonic() < deadline and not closed:
                    try:
                        closed = s.recv(4096) == b""
                    except ConnectionResetError:
                        closed = True
                self.assertTrue(closed, f"the master kept a {reason} breaker connected")
        text = master.metrics()
        for reason, n in (("greeting", 2), ("mechanism", 1), ("handshake", 1)):
            self.assertEqual(metric(text, "smockron_master_accounting_disconnects_total", {"reason": reason}), n, reason)
        self.assertEqual(metric(text, "smockron_master_accounting_peers"), 1)
        self.assertIn("accounting connection closed", master.log())
        # The real gatekeeper was never disturbed.
        base = future_base()
        for _ in range(2):
            gk.accepted("api", "after-breakers", base)
        self.delay(gk.expect(), "api", "after-breakers", base + 100, 100)
        self.assertTrue(master.alive())

    def test_unknown_domains_are_filtered(self):
        master = self.start_master(DOMAINS)
        # Subscribe to the foreign domains too, so a stray DELAY_UNTIL for them would be seen.
        others = ["other", "ap", "apix", "API", "api-2"]
        gk = self.gatekeeper(master, ["api", *others])
        base = future_base()
        for d in others:
            for _ in range(3):
                gk.accepted(d, "mallory", base)
        gk.accepted("api", "mallory", base)
        gk.accepted("api", "mallory", base)
        # Only now is api's burst full: the foreign domains did not share its history.
        self.delay(gk.expect(), "api", "mallory", base + 100, 100)
        self.assert_quiet(gk)
        text = master.metrics()
        for d in others:
            self.assertEqual(metric_sum(text, "smockron_master_accounting_messages_total", domain=d), 0, d)
        self.assertEqual(metric(text, "smockron_master_unknown_domain_total"), 0)
        self.assertTrue(master.alive())


# =============================================================================== admin endpoint


class AdminTest(MasterCase):
    def setUp(self):
        super().setUp()
        self.master = self.start_master(DOMAINS, max_identifiers=5000)

    def test_health_endpoints(self):
        m = self.master
        live, ready = m.get("/livez"), m.get("/readyz")
        self.assertEqual(live.status, 200)
        self.assertEqual(ready.status, 200)
        self.assertEqual(m.get("/nope").status, 404)
        metrics = m.get("/metrics")
        self.assertEqual(metrics.status, 200)
        self.assertTrue(metrics.headers.get("content-type", "").startswith("text/plain"), metrics.headers)
        self.assertEqual(m.get("/metrics?format=text").status, 200)  # query strings are ignored

    def test_admin_survives_idle_and_odd_clients(self):
        m = self.master
        # A client that connects and never sends anything must not block others.
        idle = socket.create_connection(("127.0.0.1", m.admin_port), timeout=2)
        self.addCleanup(idle.close)
        garbage = socket.create_connection(("127.0.0.1", m.admin_port), timeout=2)
        self.addCleanup(garbage.close)
        garbage.sendall(b"\x00\x01 not http at all\r\n\r\n")
        self.assertEqual(m.get("/livez").status, 200)
        conn = http.client.HTTPConnection("127.0.0.1", m.admin_port, timeout=2)
        self.addCleanup(conn.close)
        conn.request("POST", "/metrics")
        self.assertEqual(conn.getresponse().status, 405)
        self.assertEqual(m.get("/readyz").status, 200)
        self.assertTrue(m.alive())
    def test_admin_answers_request_with_body(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.master.admin_port, timeout=2)
        self.addCleanup(conn.close)
        conn.request("POST", "/metrics", body=b"x")  # Content-Length: 1
        self.assertIn(conn.getresponse().status, (400, 405, 413))

    def test_status_json(self):
        gk = self.gatekeeper(self.master, ["api"])
        base = future_base()
        for i in range(3):
            gk.accepted("api", f"user-{i}", base)
        gk.accepted("multi", "user-0", base)
        st = wait_until(lambda: self._status_when(lambda s: s["api"]["tracked_identifiers"] == 3
                                                  and s["multi"]["tracked_identifiers"] == 1),
                        message="/status tracked_identifiers")
        self.assertEqual(sorted(st), sorted([*DOMAINS, PROBE_DOMAIN]))
        self.assertEqual(st["api"]["algorithm"], "sliding-log")
        self.assertEqual(st["api"]["rules"], [{"rate": "10/s", "burst": 2}])
        self.assertEqual(st["gcra"]["algorithm"], "gcra")
        self.assertEqual(st["gcra"]["rules"], [{"rate": "1/5s", "burst": 2}])
        self.assertEqual(st["multi"]["rules"], [{"rate": "10/s", "burst": 2}, {"rate": "1/s", "burst": 3}])
        self.assertEqual(st["open"]["rules"], [])
        self.assertEqual(st["gcra"]["tracked_identifiers"], 0)
        doc = json.loads(self.master.get("/status").body)
        self.assertEqual(doc["max_identifiers"], 5000)
        self.assertEqual(doc["store"], "memory")
        r = self.master.get("/status")
        self.assertIn("json", r.headers.get("content-type", ""))

    def _status_when(self, pred):
        doc = json.loads(self.master.get("/status").body)
        by_name = {d["name"]: d for d in doc["domains"]}
        return by_name if pred(by_name) else None

    def test_metrics_accounting_counters(self):
        m = self.master
        gk = self.gatekeeper(m, ["api", "gcra"])
        base = future_base()
        for i in range(3):
            gk.accepted("api", f"a{i}", base)
        for i in range(2):
            gk.delayed("api", f"d{i}", base, base + 10)
        for i in range(4):
            gk.rejected("api", f"r{i}", base)
        gk.rejected("gcra", "r", base)
        gk.accepted("api", "marker", base)
        gk.accepted("api", "marker", base)
        self.delay(gk.expect(), "api", "marker", base + 100, 100)
        text = m.metrics()

        def count(domain, status):
            return metric(text, "smockron_master_accounting_messages_total", {"domain": domain, "status": status})

        self.assertEqual(count("api", "ACCEPTED"), 5)
        self.assertEqual(count("api", "DELAYED"), 2)
        self.assertEqual(count("api", "REJECTED"), 4)
        self.assertEqual(count("gcra", "REJECTED"), 1)
        self.assertEqual(count("gcra", "ACCEPTED"), 0)
        self.assertEqual(count("multi", "ACCEPTED"), 0)
        probes = count(PROBE_DOMAIN, "ACCEPTED")
        self.assertGreaterEqual(probes, 1)
        # Every probe (burst 1) and the marker produced exactly one DELAY_UNTIL each.
        self.assertEqual(metric(text, "smockron_master_control_messages_total"), probes + 1)
        self.assertEqual(metric(text, "smockron_master_control_dropped_total"), 0)
        # The latency histogram may sample; it must at least be consistent.
        hist_count = metric(text, "smockron_master_processing_seconds_count")
        self.assertIsNotNone(hist_count)
        self.assertEqual(metric(text, "smockron_master_processing_seconds_bucket", {"le": "+Inf"}), hist_count)
        self.assertLessEqual(hist_count, probes + 12)
        # Rejected requests for unknown identifiers are not tracked.
        self.assertEqual(metric(text, "smockron_master_domain_tracked_identifiers", {"domain": "api"}), 3 + 2 + 1)
        self.assertEqual(metric(text, "smockron_master_domain_tracked_identifiers", {"domain": "gcra"}), 0)


# =============================================================================== lifecycle


class ReloadTest(MasterCase):
    def test_sighup_reload_applies_new_rules_and_keeps_old_on_error(self):
        m = self.start_master(DOMAINS)
        gk = self.gatekeeper(m, ["api", "extra"])
        base = future_base()
        # Old rule, burst 2: the second request is throttled.
        gk.accepted("api", "x", base)
        gk.accepted("api", "x", base + 10)
        self.delay(gk.expect(), "api", "x", base + 110, 100)

        new_domains = dict(DOMAINS, api={"rules": [("10/s", 3)]}, extra={"rules": [("1/h", 1)]})
        self.write_file("master.toml", master_toml(m.accounting_port, m.control_port, m.admin_port, new_domains))
        m.signal(signal.SIGHUP)
        m.wait_metric("smockron_master_reloads_total", predicate=lambda v: v == 1)
        st = {d["name"]: d for d in json.loads(m.get("/status").body)["domains"]}
        self.assertEqual(st["api"]["rules"], [{"rate": "10/s", "burst": 3}])
        self.assertIn("extra", st)

        # Same algorithm and rule count: "x" keeps its history [b, b+10] and is now at 2 of 3.
        gk.accepted("api", "x", base + 20)
        self.delay(gk.expect(), "api", "x", base + 120, 100)
        # New burst 3 for a fresh identifier: two requests pass, the third is throttled.
        gk.accepted("api", "y", base)
        gk.accepted("api", "y", base + 10)
        gk.accepted("api", "y", base + 20)
        self.delay(gk.expect(), "api", "y", base + 120, 100)  # with burst 2 it would be base+110 first
        self.assert_quiet(gk)

        # The new domain is subscribed: its messages now reach the master (the
        # subscription travels to our PUB asynchronously, so retry, bounded).
        # Success is the answer to the message just sent, so no answer is left pending.
        # "Not yet" is no answer within 0.2 s; an answer for another domain is a
        # failure (wait_until lets the assertion through).
        def extra_answers():
            ident = f"e-{time.monotonic_ns()}"
            gk.accepted("extra", ident, now_ms())
            deadline = time.monotonic() + 0.2
            while (msg := gk.recv(max(0.0, deadline - time.monotonic()))) is not None:
                self.assertEqual(msg.domain, "extra", msg)
                if msg.identifier == ident:
                    return True
            return False

        wait_until(extra_answers, timeout=5, interval=0, message="DELAY_UNTIL for the reloaded domain")

        # An invalid config is rejected as a whole: old rules stay, the process lives on.
        bad = master_toml(m.accounting_port, m.control_port, m.admin_port,
                          dict(new_domains, api={"rules": [("10/s", 0)]}), typo_key=1)
        self.write_file("master.toml", bad)
        m.signal(signal.SIGHUP)
        m.wait_metric("smockron_master_reload_failures_total", predicate=lambda v: v == 1)
        self.assertEqual(m.metric("smockron_master_reloads_total"), 1)
        self.assertTrue(m.alive())
        self.assertEqual(m.get("/livez").status, 200)
        log = wait_until(lambda: "reload rejected" in m.log() and m.log(), message="reload error in the log")
        self.assertIn("master.domains.api.rules[0].burst", log)
        self.assertIn("master.typo_key", log)
        base = future_base()
        gk.accepted("api", "z", base)
        gk.accepted("api", "z", base + 10)
        gk.accepted("api", "z", base + 20)
        self.delay(gk.expect(), "api", "z", base + 120, 100)  # still burst 3
        self.assert_quiet(gk)
        st = {d["name"]: d for d in json.loads(m.get("/status").body)["domains"]}
        self.assertEqual(st["api"]["rules"], [{"rate": "10/s", "burst": 3}])


class ReloadDomainsTest(MasterCase):
    def test_sighup_adds_removes_domains_and_resets_incompatible_state(self):
        m = self.start_master(DOMAINS)
        gk = self.gatekeeper(m, ["api", "gcra", "multi"])
        base = future_base()
        gk.accepted("multi", "k", base)
        gk.accepted("multi", "k", base)
        self.delay(gk.expect(), "multi", "k", base + 100, 100)
        gk.accepted("api", "w", base)                       # api history [base]
        t0 = now_ms()
        gk.accepted("gcra", "g", t0)
        gk.accepted("gcra", "g", t0)
        self.delay(gk.expect(), "gcra", "g", t0 + 5000, 5000)

        # api switches to GCRA (its old state is meaningless and must be dropped),
        # gcra is removed, and two domains sorting before the others shift every index.
        new_domains = {k: v for k, v in DOMAINS.items() if k != "gcra"}
        new_domains.update(api={"rules": [("10/s", 2)], "algorithm": "gcra"},
                           aaa={"rules": [("1/h", 1)]}, abc={"rules": [("1/h", 1)]})
        self.write_file("master.toml", master_toml(m.accounting_port, m.control_port, m.admin_port, new_domains))
        m.signal(signal.SIGHUP)
        m.wait_metric("smockron_master_reloads_total", predicate=lambda v: v == 1)
        doc = json.loads(m.get("/status").body)
        self.assertEqual([d["name"] for d in doc["domains"]], sorted([*new_domains, PROBE_DOMAIN]))

        # multi kept its history [b, b] across the index shift: a third request, over the
        # 10/s burst 2, is charged at b+100 and fills 1/s burst 3. A fresh history would
        # have taken it at b without a DELAY_UNTIL.
        gk.accepted("multi", "k", base)
        self.delay(gk.expect(), "multi", "k", base + 1100, 1000)
        # api is GCRA now with a fresh state: TAT = b2+100, next = b2. Had the sliding-log
        # history [base] been kept as a TAT, the answer would be base.
        b2 = base - 2500
        gk.accepted("api", "w", b2)
        self.delay(gk.expect(), "api", "w", b2, 100)
        # The removed domain no longer answers (filtered, or counted as unknown while
        # the unsubscription travels); a later message on the socket proves it.
        gk.accepted("gcra", "g", t0)
        gk.accepted("gcra", "g2", t0)
        gk.accepted("gcra", "g2", t0)
        gk.accepted("multi", "marker", base)
        gk.accepted("multi", "marker", base)
        self.delay(gk.expect(), "multi", "marker", base + 100, 100)
        self.assert_quiet(gk)
        text = m.metrics()
        self.assertEqual(metric(text, "smockron_master_domain_tracked_identifiers", {"domain": "gcra"}), 0)
        self.assertEqual(metric(text, "smockron_master_accounting_messages_total",
                                {"domain": "gcra", "status": "ACCEPTED"}), 2)
        self.assertTrue(m.alive())
    def test_sighup_applies_new_max_identifiers(self):
        m = self.start_master(DOMAINS, max_identifiers=1000, sweep_interval="50ms")
        gk = self.gatekeeper(m, ["api"])
        self.write_file("master.toml", master_toml(m.accounting_port, m.control_port, m.admin_port, DOMAINS,
                                                   max_identifiers=100, sweep_interval="50ms"))
        m.signal(signal.SIGHUP)
        m.wait_metric("smockron_master_reloads_total", predicate=lambda v: v == 1)
        self.assertEqual(json.loads(m.get("/status").body)["max_identifiers"], 100)
        base = future_base()
        for i in range(300):
            gk.accepted("api", f"id-{i}", base)
        gk.accepted("api", "marker", base)
        gk.accepted("api", "marker", base)
        self.delay(gk.expect(), "api", "marker", base + 100, 100)
        self.assertLessEqual(m.metric("smockron_master_tracked_identifiers"), 100)


class CapacityTest(MasterCase):
    def test_max_identifiers_evicts_least_recently_used(self):
        m = self.start_master(DOMAINS, max_identifiers=100, sweep_interval="50ms")
        gk = self.gatekeeper(m, ["api"])
        base = future_base()  # future timestamps: nothing can expire during the test
        for i in range(500):
            gk.accepted("api", f"id-{i}", base)
        gk.accepted("api", "marker", base)
        gk.accepted("api", "marker", base)
        self.delay(gk.expect(10), "api", "marker", base + 100, 100)  # all 500 processed

        m.wait_metric("smockron_master_evictions_total", predicate=lambda v: v >= 400)
        text = m.metrics()
        probes = metric(text, "smockron_master_accounting_messages_total",
                        {"domain": PROBE_DOMAIN, "status": "ACCEPTED"})
        # Every new identifier beyond the cap evicts exactly one: probes + 500 + marker - 100.
        self.assertEqual(metric(text, "smockron_master_evictions_total"), probes + 501 - 100)
        self.assertEqual(metric(text, "smockron_master_tracked_identifiers"), 100)
        self.assertEqual(metric(text, "smockron_master_expirations_total"), 0)
        # Least recently used went first: id-0 is forgotten (one request is no
        # longer a full burst) while id-499 still has its first request.
        gk.accepted("api", "id-0", base)
        gk.accepted("api", "id-499", base)
        self.delay(gk.expect(), "api", "id-499", base + 100, 100)
        self.assert_quiet(gk)
        m.wait_metric("smockron_master_tracked_identifiers", predicate=lambda v: v == 100)
        self.assertTrue(m.alive())

    def test_idle_identifiers_expire(self):
        # The probe domain's entry (window 1 h) is the least recently used one: it
        # must not keep the sweep from reaching the expired entries behind it.
        m = self.start_master(DOMAINS, sweep_interval="50ms")
        gk = self.gatekeeper(m, ["api"])
        t = now_ms()
        gk.accepted("api", "brief-1", t)
        gk.accepted("api", "brief-2", t)
        gk.accepted("api", "marker", t + BASE_AHEAD_MS)  # stays tracked for the whole test
        gk.accepted("api", "marker", t + BASE_AHEAD_MS)
        self.delay(gk.expect(), "api", "marker", t + BASE_AHEAD_MS + 100, 100)
        # (Kept 2 s past their window for uses reported late: limiter.hpp k_late_us.)
        m.wait_metric("smockron_master_expirations_total", predicate=lambda v: v >= 2, timeout=8)
        text = m.metrics()
        self.assertEqual(metric(text, "smockron_master_domain_tracked_identifiers", {"domain": "api"}), 1)  # marker
        # Every probe of the handshake that reached the master (each under an identifier of
        # its own, how many depends on how soon the link was up) is still tracked: none expired.
        probes = metric(text, "smockron_master_accounting_messages_total",
                        {"domain": PROBE_DOMAIN, "status": "ACCEPTED"})
        self.assertGreaterEqual(probes, 1)
        self.assertEqual(metric(text, "smockron_master_domain_tracked_identifiers", {"domain": PROBE_DOMAIN}), probes)
        # An expired identifier starts afresh.
        t = now_ms() + BASE_AHEAD_MS
        gk.accepted("api", "brief-1", t)
        gk.accepted("api", "brief-1", t)
        self.delay(gk.expect(), "api", "brief-1", t + 100, 100)

    def test_a_use_reported_late_is_charged_on_top_of_the_uses_before_it(self):
        # GCRA 1000 units/s, burst 10: 400 units 500 ms ago (arrival time 100 ms ago: the state
        # no longer matters now). Once the sweeps have passed it, a use of 4,700 units timed
        # 450 ms ago arrives: it is charged after the 400 (next allowed time +4,591 ms), not
        # from its own time, as it was when the state had been swept (+4,241 ms). (Seconds of
        # room: a slow machine still sees the DELAY_UNTIL before that time.)
        m = self.start_master({"units": {"rules": [("1000/s", 10)], "algorithm": "gcra"}}, sweep_interval="50ms")
        gk = self.gatekeeper(m, ["units"])
        n = now_ms()
        gk.accepted("units", "late", n - 500, "cost=400")
        time.sleep(0.3)  # six sweeps
        gk.accepted("units", "late", n - 450, "cost=4700")
        self.delay(gk.expect(), "units", "late", n - 100 + 4700 - 9, 1)


class ShutdownTest(MasterCase):
    def _stop_with(self, sig):
        m = self.start_master(DOMAINS)
        gk = self.gatekeeper(m, ["api"])
        base = future_base()
        gk.accepted("api", "s", base)
        gk.accepted("api", "s", base)
        self.delay(gk.expect(), "api", "s", base + 100, 100)
        started = time.monotonic()
        m.signal(sig)
        self.assertEqual(m.wait(timeout=5), 0, m.log())
        self.assertLess(time.monotonic() - started, 5)
        self.assertIn("stopped", m.log())
        return m

    def test_sigterm_exits_zero(self):
        self._stop_with(signal.SIGTERM)

    def test_sigint_exits_zero(self):
        self._stop_with(signal.SIGINT)

    # Regression: the loop once blocked in zmq poll for a whole sweep_interval
    # before looking at the stop/reload flags and its heartbeat. The bounds (3 s)
    # leave a busy machine room and stay well under sweep_interval (10 s).
    def test_signals_do_not_wait_for_sweep_interval(self):
        m = self.start_master(DOMAINS, sweep_interval="10s")
        self.addCleanup(m.stop, 0.5)  # runs before the default stop
        gk = self.gatekeeper(m, ["api"])
        base = future_base()
        gk.accepted("api", "s", base)
        gk.accepted("api", "s", base)
        self.delay(gk.expect(), "api", "s", base + 100, 100)  # the loop has just started a new wait
        m.signal(signal.SIGHUP)
        m.wait_metric("smockron_master_reloads_total", predicate=lambda v: v == 1, timeout=3)
        m.signal(signal.SIGTERM)
        self.assertEqual(m.wait(timeout=3), 0)
    def test_livez_stays_ok_when_idle_with_long_sweep_interval(self):
        m = self.start_master(DOMAINS, sweep_interval="7s")
        self.addCleanup(m.stop, 0.5)  # runs before the default stop
        self.gatekeeper(m, ["api"])  # handshake traffic, then silence
        deadline = time.monotonic() + 5.8
        while time.monotonic() < deadline:
            r = m.get("/livez")
            self.assertEqual((r.status, r.body), (200, "ok\n"))
            time.sleep(0.2)

    def test_port_in_use_fails_cleanly(self):
        first = self.start_master(DOMAINS)
        acc, ctl, adm = free_ports(3)
        for name, ports in (("accounting", (first.accounting_port, ctl, adm)),
                            ("admin", (acc, ctl, first.admin_port))):
            with self.subTest(port=name):
                path = self.write_file(f"clash-{name}.toml", master_toml(*ports, DOMAINS))
                second = self.track(MasterProcess(self.tmp, *ports, path))
                second.start(wait_ready=False)  # /readyz may be the first master's: check the exit instead
                self.assertNotEqual(second.wait(timeout=5), 0)
                # The error names the address that is taken, and nothing of the library's sources.
                taken = first.accounting_port if name == "accounting" else first.admin_port
                self.assertIn("cannot", second.log())
                self.assertIn(f"127.0.0.1:{taken}", second.log())
                self.assertIn("Address already in use", second.log())
                self.assertNotIn("/usr/include", second.log())
        self.assertTrue(first.alive())
        self.assertEqual(first.get("/readyz").status, 200)


if __name__ == "__main__":
    unittest.main()
