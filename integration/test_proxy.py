"""Black-box integration tests for smockron-proxy.

Each test starts its own proxy (and, where the gate matters, a real
smockron-master) on fresh 127.0.0.1 ports, plus Python backends from
lib/backends.py, and talks to the proxy over raw sockets where the exact bytes
matter. The fixtures (start_proxy, gate_stack, prime, ...) are lib/testcase.py's
DaemonTestCase. Time bounds are asserted only where timing is the behaviour
(pacing, timeouts), in bands wide enough for a busy 2-core machine; latency
figures belong in bench/. Every wait polls against a deadline.

ZeroMQ slow joiners: a proxy connected to a real master only has a working
accounting -> master -> control loop once both connections and the
subscriptions are up. prime() proves it: every gate config has a first route
/__warm/ on domain WARM_DOMAIN (1 request per hour), and requests with fresh
X-Warm keys are sent until a DELAY_UNTIL reaches the proxy.

Elsewhere: HTTP/1.1 framing, malformed chunked bodies and the 1 GiB streaming
tests are in test_http1; a master killed under load, a held client that
disconnects and a backend killed and restarted are in test_system.

Run: cd integration && python3 -m unittest -v test_proxy
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.backends import ws_accept, ws_frame, ws_read_frame  # noqa: E402
from lib.config import proxy_toml  # noqa: E402
from lib.daemons import PROXY, ProxyProcess, binary, run_binary  # noqa: E402
from lib.http1 import PeerClosed, RawConn, fetch, request_bytes  # noqa: E402
from lib.metrics import HELD, metric  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import max_in_window, wait_until  # noqa: E402

REQUESTS = "smockron_proxy_requests_total"


# =============================================================================== helpers


def fire_concurrently(conns: list[RawConn], payloads: list[bytes], timeout: float = 10.0):
    """Sends payloads[i] on pre-opened conns[i] back to back, then reads every response.
    Returns (wall time of the first send, [(Response or exception, seconds after the sends)])."""
    t_wall = time.time()
    t0 = time.monotonic()
    for c, p in zip(conns, payloads):
        c.send(p)

    def read(c):
        try:
            r = c.read_response(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            r = e
        return r, time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(len(conns)) as ex:
        results = list(ex.map(read, conns))
    return t_wall, results


def header_values(echo: dict, name: str) -> list[str]:
    return [v for k, v in echo["headers"] if k.lower() == name.lower()]


# =============================================================================== 1-3, 12: the gate with a real master


class GateTest(DaemonTestCase):
    API_ROUTE = {"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key", "ip"]}

    def gate_stack_logged(self, *args, **kwargs):
        """gate_stack() with a JSON access log; returns (master, backend, proxy, log path)."""
        path = os.path.join(self.tmp, "access.log")
        return (*self.gate_stack(*args, **access_log_keys(path), **kwargs), path)

    def released(self, log_path: str, prefix: str, n: int) -> list[float]:
        """When the proxy let the n requests under `prefix` through (its access log:
        head time + held_ms; a busy backend's clock would add its own stalls), sorted."""
        entries = wait_until(lambda: len(es := [e for e in read_access_log(log_path) if e["forwarded"]
                                                and e["target"].startswith(prefix)]) == n and es, 5,
                             message=f"{n} access log lines under {prefix}")
        return sorted(e["t_out"] for e in entries)

    def assert_paced(self, released: list[float], interval: float) -> None:
        """Release times (sorted) of held requests: one interval apart, never together.
        Load-robust: over one second no more than the rate's share plus 2 (a release
        late by a stall shares its window with the next; requests released together
        would all share one), the median gap stays near the interval, and the span
        is that of paced releases (all released together would have none)."""
        gaps = [round(b - a, 3) for a, b in zip(released, released[1:])]
        self.assertLessEqual(max_in_window(released, 1.0), round(1.0 / interval) + 2,
                             f"released together, not paced: gaps {gaps}")
        median = sorted(gaps)[len(gaps) // 2]
        self.assertTrue(0.5 * interval <= median <= 2 * interval, f"median gap {median}, gaps {gaps}")
        span = released[-1] - released[0]
        self.assertGreaterEqual(span, 0.75 * (len(released) - 1) * interval, f"faster than the rate: gaps {gaps}")
        self.assertLessEqual(span, (len(released) - 1) * interval + 1.0, f"slower than the rate: gaps {gaps}")

    def decisions(self, proxy, domain: str = "api") -> dict:
        m = proxy.metrics()
        return {d: metric(m, REQUESTS, {"domain": domain, "decision": d}) or 0
                for d in ("accepted", "delayed", "rejected", "unidentified")}

    def test_burst_then_paced_delays_then_503_and_other_key_unaffected(self):
        interval = 0.2
        _, backend, proxy, log_path = self.gate_stack_logged({"api": {"rules": [("5/s", 3)]}}, [self.API_ROUTE],
                                                             max_delay="2s")
        n_concurrent = 16
        conns = [self.closing(RawConn(proxy.port, 10)) for _ in range(n_concurrent)]  # opened before the clock runs
        m0 = proxy.metrics()
        d0 = self.decisions(proxy)
        ctl0 = proxy.ctl()

        # The burst is answered at once: accepted, never held.
        for i in range(3):
            r, _ = fetch(proxy.port, f"/burst/{i}", key="alice")
            self.assertEqual(r.status, 200, r)
        d1 = self.decisions(proxy)
        self.assertEqual({k: d1[k] - d0[k] for k in d0}, {"accepted": 3, "delayed": 0, "rejected": 0,
                                                           "unidentified": 0}, "the burst passes unheld")
        self.wait_ctl(proxy, ctl0)  # the master's DELAY_UNTIL for alice is in the proxy's memory

        payloads = [request_bytes("GET", f"/held/{i}", [("X-API-Key", "alice")]) for i in range(n_concurrent)]
        box = {}

        def other_key():
            box["bob"] = fetch(proxy.port, "/bob", key="bob")

        bob = threading.Timer(0.05, other_key)
        bob.start()
        t_sent, results = fire_concurrently(conns, payloads, timeout=8)
        bob.join(5)

        errors = [r for r, _ in results if isinstance(r, Exception)]
        self.assertEqual(errors, [], "every held request gets an answer")
        ok = [(r, t) for r, t in results if r.status == 200]
        rejected = [(r, t) for r, t in results if r.status == 503]
        self.assertEqual(len(ok) + len(rejected), n_concurrent, [r for r, _ in results])
        self.assertGreaterEqual(len(rejected), 3, "beyond max_delay requests are refused")
        self.assertGreaterEqual(len(ok), 5, "up to max_delay requests are held, then served")
        for r, t in rejected:
            self.assertRegex(r.headers.get("retry-after", ""), r"^[0-9]+$", r)
            self.assertTrue(1 <= int(r.headers["retry-after"]) <= 3, r.headers)
            # Held until the end of max_delay (2 s) or beyond would be a hold, not a refusal.
            self.assertLess(t, 1.5, "a 503 is answered at once, not after a hold")

        # Held requests were released one interval apart; rejected ones never reached the backend.
        self.assertEqual(len(backend.requests(key="alice", target_prefix="/held/")), len(ok),
                         "exactly the 200s reached the backend")
        self.assertEqual(len(backend.requests(key="alice")), 3 + len(ok))
        arrivals = self.released(log_path, "/held/", len(ok))
        self.assert_paced(arrivals, interval)
        self.assertLess(arrivals[-1] - t_sent, 2.0 + 1.5, "nothing is held beyond max_delay")

        # Another key is not affected while alice's requests are held: bob (sent 50 ms
        # after them) was let through before alice's queue was.
        bob_r, _ = box["bob"]
        self.assertEqual(bob_r.status, 200, bob_r)
        self.assertEqual(len(backend.requests(key="bob")), 1)
        [bob_arrival] = self.released(log_path, "/bob", 1)
        self.assertLess(bob_arrival, arrivals[-1], "bob waited behind alice's held requests")

        m1 = proxy.metrics()

        def delta(name, labels):
            return (metric(m1, name, labels) or 0) - (metric(m0, name, labels) or 0)

        self.assertEqual(delta(REQUESTS, {"domain": "api", "decision": "rejected"}), len(rejected))
        self.assertEqual(delta("smockron_proxy_rejects_total", {"reason": "delay_too_long"}), len(rejected))
        self.assertEqual(delta(REQUESTS, {"domain": "api", "decision": "accepted"})
                         + delta(REQUESTS, {"domain": "api", "decision": "delayed"}), 3 + 1 + len(ok))
        # Every 200 of alice's was held, but perhaps the first (on a slow machine the
        # DELAY_UNTIL's time may already have passed when it arrived).
        self.assertGreaterEqual(delta(REQUESTS, {"domain": "api", "decision": "delayed"}), len(ok) - 1)
        self.assertEqual(delta(REQUESTS, {"domain": "api", "decision": "unidentified"}), 0)
        wait_until(lambda: proxy.metric(HELD) == 0, 5, message="held gauge back to 0")

    def test_held_requests_of_one_identifier_are_released_paced(self):
        interval = 0.2
        _, backend, proxy, log_path = self.gate_stack_logged({"api": {"rules": [("5/s", 3)]}}, [self.API_ROUTE],
                                                             max_delay="5s")
        conns = [self.closing(RawConn(proxy.port, 10)) for _ in range(4)]
        ctl0 = proxy.ctl()
        for i in range(3):
            self.assertEqual(fetch(proxy.port, f"/burst/{i}", key="pace")[0].status, 200)
        self.wait_ctl(proxy, ctl0)
        d0 = self.decisions(proxy)
        _, results = fire_concurrently(
            conns, [request_bytes("GET", f"/paced/{i}", [("X-API-Key", "pace")]) for i in range(4)])
        self.assertEqual([r.status if not isinstance(r, Exception) else r for r, _ in results], [200] * 4)
        d1 = self.decisions(proxy)
        self.assertGreaterEqual(d1["delayed"] - d0["delayed"], 3, "held, not passed (all but perhaps the first)")
        self.assertEqual(len(backend.requests(key="pace", target_prefix="/paced/")), 4)
        self.assert_paced(self.released(log_path, "/paced/", 4), interval)

    def test_x_forwarded_for_from_untrusted_peer_is_ignored_for_identification(self):
        # identify = ip, trusted_proxies empty: 127.0.0.1 is the identifier whatever XFF says.
        route = {"path": "/", "domain": "api", "upstream": "app", "identify": ["ip"]}
        # 2 per minute: the limit outlasts the test's steps by far on any machine.
        _, backend, proxy = self.gate_stack({"api": {"rules": [("2/min", 2)]}}, [route], max_delay="500ms")
        ctl0 = proxy.ctl()
        for i in range(2):
            r, _ = fetch(proxy.port, f"/xff/{i}", headers=[("X-Forwarded-For", "1.2.3.4")])
            self.assertEqual(r.status, 200, r)
            self.assertEqual(header_values(r.json(), "X-Forwarded-For"), ["1.2.3.4, 127.0.0.1"])
        self.wait_ctl(proxy, ctl0)
        for xff in ("1.2.3.4", "5.6.7.8", "9.9.9.9, 10.0.0.1", None):
            headers = [("X-Forwarded-For", xff)] if xff else []
            r, _ = fetch(proxy.port, "/xff/limited", headers=headers)
            self.assertEqual(r.status, 503, f"XFF {xff!r} must not escape the limit of 127.0.0.1: {r}")
            self.assertIn("retry-after", r.headers)
        self.assertEqual(backend.requests(target_prefix="/xff/limited"), [])


# =============================================================================== 4: fail-open


class FailOpenTest(DaemonTestCase):
    def test_no_master_reachable_everything_passes(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)  # accounting/control: ports where nothing listens
        for i in range(25):
            r, _ = fetch(proxy.port, f"/open/{i}", key="same-key")
            self.assertEqual(r.status, 200, r)
        ready = proxy.get("/readyz")
        self.assertEqual(ready.status, 200)
        self.assertIn("masters connected: 0/1", ready.body)
        self.assertIn("fail-open", ready.body)
        self.assertEqual(len(backend.requests(key="same-key")), 25)
        self.assertEqual(proxy.metric(REQUESTS, {"domain": "api", "decision": "accepted"}), 25, "none held")
        self.assertEqual(proxy.metric("smockron_proxy_control_dropped_updates_total"), 0)  # exported, nothing dropped
        # No master took them: counted as unsent, not as published.
        wait_until(lambda: proxy.metric("smockron_proxy_accounting_unsent_total") == 25, 5,
                   message="accounting without a master is counted as unsent")
        self.assertEqual(proxy.metric("smockron_proxy_accounting_messages_total"), 0)

    def test_healthcheck_probe(self):
        # `smockron-proxy --healthcheck` (the image's HEALTHCHECK) asks the running proxy's /livez.
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        probe = [binary(PROXY), "--healthcheck", "--config", proxy.config_path]
        self.assertEqual(subprocess.run(probe, capture_output=True, timeout=10).returncode, 0)
        proxy.stop()
        self.assertEqual(subprocess.run(probe, capture_output=True, timeout=10).returncode, 1)

class StuckMaster:
    """A master that completes the ZMTP 3.0 handshake as a SUB subscribed to
    everything, then never reads again (hung process, full disk, SIGSTOP...)."""

    GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
    READY_SUB = b"\x04\x19\x05READY\x0bSocket-Type\0\0\0\x03SUB"

    def __init__(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited: a small window
        self.listener.bind((HOST, 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        self.hello = b""  # what the proxy sent: its greeting and READY
        self.ready = threading.Event()
        self.conn = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.conn, _ = self.listener.accept()
        self.conn.sendall(self.GREETING + self.READY_SUB + b"\x00\x01\x01")  # subscribe to everything
        while len(self.hello) < 64 + 27:
            chunk = self.conn.recv(64 + 27 - len(self.hello))
            if not chunk:
                return
            self.hello += chunk
        self.ready.set()

    def close(self):
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()


class AccountingTest(DaemonTestCase):
    def test_a_master_that_stops_reading_costs_counted_drops_never_requests(self):
        stuck = self.closing(StuckMaster())
        # The upstream refuses (502 at once): the gate and its accounting run for every
        # request, and the test is not paced by a backend.
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{self.dead_port()}"]}},
                                 [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}],
                                 accounting=[f"tcp://{HOST}:{stuck.port}"], accounting_hwm=20)
        self.assertTrue(stuck.ready.wait(10), "the proxy never completed the ZMTP handshake")
        self.assertEqual(stuck.hello[:12], b"\xff" + b"\0" * 8 + b"\x7f\x03\x00", "a ZMTP 3.0 greeting")
        self.assertIn(b"Socket-Type\0\0\0\x03PUB", stuck.hello[64:])
        # 1 KiB identifiers: 6,000 messages (6 MiB) are more than the socket buffers
        # (4 MiB at most here) and the queue of 20 can hold. A request that waited for
        # accounting would wait for good (the master never reads): each must get its
        # 502 within fetch()'s timeout. (How fast they are is bench/'s business.)
        n = 6000
        for i in range(n):
            r, _ = fetch(proxy.port, f"/r/{i}", key=f"{i:04d}" + "k" * 1020)
            self.assertEqual(r.status, 502)
        counted = lambda: sum(proxy.metric(f"smockron_proxy_accounting_{k}_total") or 0  # noqa: E731
                              for k in ("messages", "dropped", "unsent"))
        wait_until(lambda: counted() == n, 5, message="every accounting message is counted exactly once")
        self.assertGreater(proxy.metric("smockron_proxy_accounting_dropped_total"), 0,
                           "a master that does not read must show as drops")
        self.assertGreaterEqual(proxy.metric("smockron_proxy_accounting_messages_total"), 20)
        # The master goes away: what its queue held is lost for it, and counted so.
        stuck.close()
        wait_until(lambda: (proxy.metric("smockron_proxy_accounting_lost_total") or 0) > 0, 5,
                   message="messages queued for a vanished master are counted as lost")
        self.assertLessEqual(proxy.metric("smockron_proxy_accounting_lost_total"), 20)  # at most one full queue
        self.assertEqual(counted(), n, "lost messages were already counted once")

    def test_a_master_that_accepts_and_never_answers_is_retried(self):
        silent = socket.socket()
        self.addCleanup(silent.close)
        silent.bind((HOST, 0))
        silent.listen(8)
        backend = self.start_backend()
        # Before the proxy exists: its first connect, and so its handshake deadline (5 s),
        # come after this whatever its start-up takes (when the test gets to accept() the
        # first connection tells nothing: it may have waited in the backlog).
        t_start = time.monotonic()
        self.simple_proxy(backend, accounting=[f"tcp://{HOST}:{silent.getsockname()[1]}"], threads=1)
        silent.settimeout(20)
        first, _ = silent.accept()
        self.addCleanup(first.close)
        second, _ = silent.accept()  # the proxy gave up on the handshake and came back
        self.addCleanup(second.close)
        self.assertGreaterEqual(time.monotonic() - t_start, 4.9, "retried before the handshake deadline (5 s)")


# =============================================================================== 5-6: routing and upstream failures


class UpstreamTest(DaemonTestCase):
    def test_no_route_is_404_and_never_forwarded(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, path="/api/")
        r, _ = fetch(proxy.port, "/other")
        self.assertEqual(r.status, 404)
        r, _ = fetch(proxy.port, "/api/yes")
        self.assertEqual(r.status, 200)
        self.assertEqual([e["target"] for e in backend.log()], ["/api/yes"])
        self.assertEqual(proxy.metric("smockron_proxy_no_route_total"), 1)

    def test_slow_upstream_is_504_while_others_are_served(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, upstream_timeout="2s")
        box = {}
        slow = threading.Thread(target=lambda: box.setdefault("slow", fetch(proxy.port, "/slow?s=5", timeout=7)))
        slow.start()
        wait_until(lambda: backend.requests(target_prefix="/slow"), 5, message="slow request at the backend")
        r, _ = fetch(proxy.port, "/fast")
        self.assertEqual(r.status, 200)
        self.assertNotIn("slow", box, "another client is served while the slow one waits")
        slow.join(7)
        r, elapsed = box["slow"]
        self.assertEqual(r.status, 504, r)
        # Not before upstream_timeout; before the backend would have answered (5 s).
        self.assertTrue(1.9 <= elapsed <= 4.5, f"504 after {elapsed:.3f}s (upstream_timeout 2s)")
        self.assertGreaterEqual(proxy.metric("smockron_proxy_upstream_errors_total", {"kind": "timeout"}), 1)


# =============================================================================== 7-8: hostile clients


class HostileClientTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.backend = self.start_backend()
        self.proxy = self.simple_proxy(self.backend, header_timeout="500ms", max_header_bytes="1KiB")

    def assert_still_serving(self):
        r, _ = fetch(self.proxy.port, "/still-ok")
        self.assertEqual(r.status, 200)

    def exchange(self, data: bytes, timeout: float = 2.0):
        """Sends data; returns the response, or None if the proxy closed without one."""
        with RawConn(self.proxy.port, timeout) as c:
            c.send(data)
            try:
                return c.read_response(timeout=timeout)
            except (PeerClosed, ConnectionResetError):
                return None

    def assert_refused(self, data: bytes, status: int = 400, marker: str | None = None):
        r = self.exchange(data)
        self.assertIsNotNone(r, "expected an error response, the connection was just closed")
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.headers.get("connection", "").lower(), "close", r)
        if marker:
            self.assertEqual(self.backend.requests(target_prefix=marker), [], "must not be forwarded")
        self.assert_still_serving()

    # ---- 7: slowloris
    def test_slowloris_gets_408_or_closed_while_others_are_served(self):
        c = self.closing(RawConn(self.proxy.port, 3))
        t0 = time.monotonic()
        c.send(b"GET /slowloris HTTP/1.1\r\nHost: x\r\n")
        served = False
        outcome = None
        while time.monotonic() - t0 < 5.0:
            try:
                c.send(b"X-Drip: 1\r\n")
            except OSError:
                outcome = "closed"
                break
            if c.wait_closed(0.1):
                outcome = "closed"
                break
            if not served and time.monotonic() - t0 > 0.2:
                self.assert_still_serving()  # another client, meanwhile
                served = True
        elapsed = time.monotonic() - t0
        self.assertIsNotNone(outcome, "slowloris connection still open after 5 s")
        self.assertTrue(served)
        # The drip (a header every 0.1 s) must not extend the head's deadline.
        self.assertTrue(0.4 <= elapsed <= 3.0, f"closed after {elapsed:.3f}s (header_timeout 500ms)")
        if c.buf:
            self.assertTrue(bytes(c.buf).startswith(b"HTTP/1.1 408"), bytes(c.buf))
        self.assertEqual(self.backend.requests(target_prefix="/slowloris"), [])

    def test_silent_connection_closed_after_header_timeout(self):
        c = self.closing(RawConn(self.proxy.port, 3))
        t0 = time.monotonic()
        self.assertTrue(c.wait_closed(5))
        self.assertTrue(0.4 <= time.monotonic() - t0 <= 3.0, "closed by header_timeout (500ms)")

    # ---- 8: limits
    def test_request_line_longer_than_read_buffer_is_414(self):
        self.assert_refused(request_bytes(target="/" + "a" * 6000), 414, "/aaa")

    def test_request_line_too_long_sent_with_its_headers_is_414(self):
        # Regression: a too-long request line sent together with its headers (a CRLF
        # later in the read buffer) used to get 431 instead of 414.
        self.assert_refused(request_bytes(target="/" + "a" * 1500, headers=[("X-A", "b")]), 414, "/aaa")

    def test_headers_too_large_is_431(self):
        self.assert_refused(request_bytes(target="/big-headers", headers=[(f"X-H{i}", "v" * 40) for i in range(40)]),
                            431, "/big-headers")

    # ---- 8: smuggling shapes
    def test_content_length_and_transfer_encoding_is_400(self):
        self.assert_refused(b"POST /smuggle-clte HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
                            400, "/smuggle")
        self.assertEqual(self.backend.requests(target_prefix="/smuggled"), [])

    def test_two_different_content_lengths_is_400(self):
        self.assert_refused(b"POST /smuggle-2cl HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n"
                            b"\r\nhello!", 400, "/smuggle")

    def test_whitespace_before_first_header_is_400(self):
        self.assert_refused(b"GET /leading-ws HTTP/1.1\r\n X-A: a\r\nHost: x\r\n\r\n", 400, "/leading-ws")

    def test_obs_fold_is_400(self):
        # Regression: Beast unfolds "X-A: a\r\n  b" into "X-A: a b"; the proxy used to
        # forward such requests. (RFC 9112 5.2 allows either; this product refuses.)
        self.assert_refused(b"GET /obs-fold HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  b\r\n\r\n", 400, "/obs-fold")

    def test_http10_with_transfer_encoding_is_400(self):
        # RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message means the framing is faulty.
        self.assert_refused(b"POST /te-10 HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"5\r\nhello\r\n0\r\n\r\n", 400, "/te-10")

    def test_transfer_encoding_without_final_chunked_is_400(self):
        # Regression (request smuggling): RFC 9112 6.3 requires 400 + close when a
        # request's Transfer-Encoding does not end in "chunked". The proxy used to treat
        # such a request as bodiless and forward the head with the header, so its body
        # ("GET /smuggled ...") became a second request at the backend.
        self.assert_refused(b"POST /te-gzip HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"
                            b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 400, "/te-gzip")
        self.assertEqual(self.backend.requests(target_prefix="/smuggled"), [])


# =============================================================================== 9: HTTP semantics


class HttpSemanticsTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.backend = self.start_backend()
        self.proxy = self.simple_proxy(self.backend)

    def conn(self) -> RawConn:
        return self.closing(RawConn(self.proxy.port))

    def test_keep_alive_connection_is_reused(self):
        c = self.conn()
        for i in range(5):
            c.send(request_bytes("GET", f"/ka/{i}"))
            r = c.read_response()
            self.assertEqual(r.status, 200)
            self.assertEqual(r.json()["target"], f"/ka/{i}")
            self.assertNotEqual(r.headers.get("connection", "").lower(), "close")
        self.assertFalse(c.wait_closed(0.1))
        self.assertEqual(self.proxy.metric("smockron_proxy_open_connections"), 1)

    def test_pipelined_requests_are_answered_in_order(self):
        c = self.conn()
        c.send(request_bytes("GET", "/pipe/1") + request_bytes("POST", "/pipe/2", body=b"hello")
               + request_bytes("HEAD", "/pipe/3") + request_bytes("GET", "/pipe/4"))
        r1 = c.read_response()
        r2 = c.read_response()
        r3 = c.read_response(head_request=True)
        r4 = c.read_response()
        self.assertEqual([r1.json()["target"], r2.json()["target"], r4.json()["target"]], ["/pipe/1", "/pipe/2", "/pipe/4"])
        self.assertEqual(r2.json()["body_bytes"], 5)
        self.assertEqual((r3.status, r3.body), (200, b""))

    def test_head_has_no_body_and_connection_stays_usable(self):
        c = self.conn()
        c.send(request_bytes("HEAD", "/head"))
        r = c.read_response(head_request=True)
        self.assertEqual(r.status, 200)
        self.assertGreater(int(r.headers["content-length"]), 0)
        c.send(request_bytes("GET", "/after-head"))
        r = c.read_response()
        self.assertEqual(r.json()["target"], "/after-head", "no stray body bytes between the two responses")

    def test_204_and_304_pass_without_body(self):
        c = self.conn()
        for code in (204, 304, 204):
            c.send(request_bytes("GET", f"/status/{code}"))
            r = c.read_response()
            self.assertEqual((r.status, r.body), (code, b""))
        c.send(request_bytes("GET", "/after"))
        self.assertEqual(c.read_response().json()["target"], "/after")

    def test_expect_100_continue(self):
        c = self.conn()
        c.send(request_bytes("POST", "/expect", [("Content-Length", "5"), ("Expect", "100-continue")]))
        interim = c.read_response(allow_interim=True, timeout=2)
        self.assertEqual(interim.status, 100, interim)
        c.send(b"hello")
        r = c.read_response()
        self.assertEqual(r.status, 200)
        echo = r.json()
        self.assertEqual(echo["body_bytes"], 5)
        self.assertEqual(header_values(echo, "Expect"), [], "the proxy answered the expectation itself")

    # Chunked bodies must be re-framed exactly: one last-chunk, nothing after it.
    # Regressions (both found by these tests):
    # 1. relay() with http::async_read_some: a read that yielded only framing (a chunk
    #    header) wrote a 0-byte buffer_body piece, which Beast serializes as "0\r\n\r\n"
    #    - the last-chunk - cutting the body short in both directions.
    # 2. When the final read carried only the terminator, an empty chunk was written
    #    *and* the last-chunk: the peer got "...0\r\n\r\n0\r\n\r\n", and the stray
    #    "0\r\n\r\n" was parsed as the next message on the keep-alive connection
    #    (upstream: the backend's error answer went to the next pooled request -> 502
    #    or a wrong response; downstream: garbage before the client's next response).
    def test_chunked_request_body_arriving_in_pieces_is_forwarded_intact(self):
        c = self.conn()
        c.send(request_bytes("POST", "/chunked-pieces", [("Transfer-Encoding", "chunked")]))
        for piece in (b"5\r\nhello\r\n", b"3\r\nabc\r\n", b"0\r\n\r\n"):
            time.sleep(0.03)  # shapes the packets (separate reads in the proxy); not a timing assertion
            c.send(piece)
        r = c.read_response()
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json()["body_bytes"], r.json()["body"]), (8, "helloabc"))
        # The next request travels on the same pooled upstream connection.
        for target in ("/after-chunked-1", "/after-chunked-2"):
            c.send(request_bytes("GET", target))
            r = c.read_response()
            self.assertEqual(r.status, 200, f"{target}: {r}")
            self.assertEqual(r.json()["target"], target)
        self.assertEqual([e.get("error") for e in self.backend.log() if e.get("error")], [])

    def test_chunked_request_body_sent_with_the_head_is_forwarded_intact(self):
        c = self.conn()
        c.send(request_bytes("POST", "/chunked-whole", [("Transfer-Encoding", "chunked")])
               + b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n")
        r = c.read_response()
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json()["body_bytes"], r.json()["body"]), (8, "helloabc"))
        c.send(request_bytes("GET", "/after-chunked"))
        r = c.read_response()
        self.assertEqual((r.status, r.json()["target"]), (200, "/after-chunked"))

    def test_content_length_body_in_pieces_is_forwarded_intact(self):
        c = self.conn()
        c.send(request_bytes("POST", "/cl-pieces", [("Content-Length", "8")]))
        for piece in (b"hel", b"lo", b"abc"):
            time.sleep(0.03)
            c.send(piece)
        r = c.read_response()
        self.assertEqual((r.json()["body_bytes"], r.json()["body"]), (8, "helloabc"))

    def test_chunked_response_is_relayed_intact(self):
        # The backend writes each chunk and the final "0\r\n\r\n" separately (regression 2
        # above, response direction: an extra "0\r\n\r\n" used to follow the body).
        c = self.conn()
        c.send(request_bytes("GET", "/chunks?n=3&gap=0.03"))
        r = c.read_response()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, b"part-0;part-1;part-2;")
        self.assertFalse(c.wait_closed(0.2))
        self.assertEqual(bytes(c.buf), b"", "stray bytes after the end of the chunked body")
        c.send(request_bytes("GET", "/after-chunks"))
        self.assertEqual(c.read_response().json()["target"], "/after-chunks")

    def test_hop_by_hop_headers_are_not_forwarded(self):
        r, _ = fetch(self.proxy.port, "/hop", headers=[
            ("Connection", "keep-alive, X-Foo"), ("X-Foo", "secret"), ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"), ("Upgrade", "h2c"), ("Proxy-Authorization", "Basic c2VjcmV0"),
            ("Proxy-Connection", "keep-alive"), ("X-End-To-End", "kept")])
        self.assertEqual(r.status, 200)
        names = {k.lower() for k, _ in r.json()["headers"]}
        for hop in ("connection", "x-foo", "keep-alive", "te", "upgrade", "proxy-authorization", "proxy-connection"):
            self.assertNotIn(hop, names, f"{hop} reached the backend")
        self.assertIn("x-end-to-end", names)

    def test_forwarded_headers_and_host(self):
        r, _ = fetch(self.proxy.port, "/fwd", host="Example.test:8443")
        echo = r.json()
        self.assertEqual(header_values(echo, "Host"), ["Example.test:8443"])
        self.assertEqual(header_values(echo, "X-Forwarded-For"), ["127.0.0.1"])
        self.assertEqual(header_values(echo, "X-Forwarded-Proto"), ["http"])
        self.assertEqual(header_values(echo, "X-Forwarded-Host"), ["Example.test:8443"])
        r, _ = fetch(self.proxy.port, "/fwd2", headers=[("X-Forwarded-For", "203.0.113.7")])
        self.assertEqual(header_values(r.json(), "X-Forwarded-For"), ["203.0.113.7, 127.0.0.1"])


# =============================================================================== 11: WebSocket


class WebSocketTest(DaemonTestCase):
    def test_websocket_echo_through_the_proxy(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        c = self.closing(RawConn(proxy.port, 3))
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        c.send(request_bytes("GET", "/ws", [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                            ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Version", "13"),
                                            ("X-API-Key", "ws-client")]))
        status, _, headers, _ = c.read_head()
        h = {k.lower(): v for k, v in headers}
        self.assertEqual(status, 101, headers)
        self.assertEqual(h.get("upgrade", "").lower(), "websocket")
        self.assertEqual(h.get("sec-websocket-accept"), ws_accept(key))
        for i, msg in enumerate([b"hello", "h\u00e9llo \u2713".encode(), b"x" * 300, b"y" * 70000]):
            opcode = 1 if i < 3 else 2
            c.send(ws_frame(opcode, msg, mask=True))
            got_op, payload, masked = ws_read_frame(c.read_exact)
            self.assertEqual((got_op, payload, masked), (opcode, msg, False))
        c.send(ws_frame(8, b"\x03\xe8", mask=True))
        got_op, payload, _ = ws_read_frame(c.read_exact)
        self.assertEqual((got_op, payload), (8, b"\x03\xe8"))
        self.assertTrue(c.wait_closed(2))
        self.assertEqual(proxy.metric("smockron_proxy_requests_total", {"domain": "api", "decision": "accepted"}), 1)


# =============================================================================== 13: signals


class SignalTest(DaemonTestCase):
    def reload_routes(self, proxy: ProxyProcess, old: str, new: str, extra: str = "") -> None:
        with open(proxy.config_path) as f:
            config = f.read()
        with open(proxy.config_path, "w") as f:
            f.write(config.replace(f'path = "{old}"', f'path = "{new}"{extra}'))
        proxy.signal(signal.SIGHUP)

    def test_sighup_reloads_routes_without_dropping_keep_alive_connections(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, path="/api/")
        ka = self.closing(RawConn(proxy.port))

        def on_ka(target):
            ka.send(request_bytes("GET", target))
            return ka.read_response().status

        self.assertEqual(on_ka("/api/1"), 200)
        self.assertEqual(on_ka("/v2/1"), 404)
        self.reload_routes(proxy, "/api/", "/v2/")
        wait_until(lambda: fetch(proxy.port, "/v2/probe")[0].status == 200, 5, message="new route active")
        # The connection opened before the reload is still open and follows the new routes.
        self.assertEqual(on_ka("/v2/2"), 200)
        self.assertEqual(on_ka("/api/2"), 404)
        self.assertEqual(on_ka("/v2/3"), 200)

        # A broken config is rejected and the running one stays.
        self.reload_routes(proxy, "/v2/", "/v3/", "\nbogus_key = 1")
        wait_until(lambda: "reload rejected" in proxy.log(), 5, message="reload rejected in the log")
        self.assertEqual(on_ka("/v2/4"), 200)
        self.assertEqual(fetch(proxy.port, "/v3/x")[0].status, 404)
        self.assertTrue(proxy.alive())
        self.assertFalse(ka.wait_closed(0.05))

    def test_first_request_on_idle_keep_alive_after_sighup_uses_new_routes(self):
        # Regression: session() used to take its runtime snapshot before waiting idle
        # for the next request, so the first request after a reload on a keep-alive
        # connection was routed with the old configuration.
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, path="/api/")
        ka = self.closing(RawConn(proxy.port))
        ka.send(request_bytes("GET", "/api/1"))
        self.assertEqual(ka.read_response().status, 200)
        self.reload_routes(proxy, "/api/", "/v2/")
        wait_until(lambda: fetch(proxy.port, "/v2/probe")[0].status == 200, 5, message="new route active")
        ka.send(request_bytes("GET", "/v2/x"))
        self.assertEqual(ka.read_response().status, 200)

    def test_sigterm_drains_a_held_request_and_exits_0(self):
        route = {"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}
        _, backend, proxy = self.gate_stack({"api": {"rules": [("2/3s", 1)]}}, [route], max_delay="5s",
                                            grace_period="5s")
        ctl0 = proxy.ctl()
        self.assertEqual(fetch(proxy.port, "/first", key="erin")[0].status, 200)
        self.wait_ctl(proxy, ctl0)
        c = self.closing(RawConn(proxy.port, 5))
        c.send(request_bytes("GET", "/held-during-shutdown", [("X-API-Key", "erin")]))
        proxy.wait_metric(HELD, predicate=lambda v: v == 1, timeout=5)
        t0 = time.monotonic()
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: proxy.get("/readyz").status == 503, 5, message="/readyz says draining")

        def refused():
            try:
                socket.create_connection((HOST, proxy.port), timeout=0.5).close()
                return False
            except ConnectionRefusedError:
                return True

        wait_until(refused, 5, message="listener closed while draining")
        r = c.read_response(timeout=4)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["target"], "/held-during-shutdown")
        self.assertEqual(proxy.wait(5), 0)
        self.assertLess(time.monotonic() - t0, 5.0 + 1.0, "exited within the grace period")


# =============================================================================== 14: --check


class CheckTest(DaemonTestCase):
    def render(self, **proxy_keys) -> str:
        return proxy_toml(8080, 9106, {"app": {"servers": [f"{HOST}:9000"]}},
                          [{"path": "/", "domain": "api", "upstream": "app"}],
                          [f"tcp://{HOST}:10004"], [f"tcp://{HOST}:10005"], **proxy_keys)

    def test_check_accepts_a_good_config(self):
        path = self.write_file("good.toml", self.render(trusted_proxies=["10.0.0.0/8"], max_header_bytes="16KiB"))
        res = run_binary(PROXY, "--config", path, "--check")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("configuration OK", res.stdout)

    def test_check_reports_unknown_key_and_bad_cidr_with_locations(self):
        text = self.render(trusted_proxies=["10.0.0.0/33"], max_dealy="5s")
        path = self.write_file("bad.toml", text)
        res = run_binary(PROXY, "--config", path, "--check")
        self.assertNotEqual(res.returncode, 0)
        lines = text.splitlines()
        cidr_line = next(i for i, l in enumerate(lines, 1) if l.startswith("trusted_proxies"))
        typo_line = next(i for i, l in enumerate(lines, 1) if l.startswith("max_dealy"))
        loc = re.escape(path)
        self.assertRegex(res.stderr, rf"(?m)^{loc}:{cidr_line}:\d+: proxy\.trusted_proxies\[0\]: .*CIDR")
        self.assertRegex(res.stderr, rf"(?m)^{loc}:{typo_line}:\d+: proxy\.max_dealy: unknown key")


if __name__ == "__main__":
    unittest.main()
