"""HTTP/2 on the proxy's listeners (RFC 9113), black box, with the real binaries.

- Real clients: curl --http2 over TLS (ALPN h2), curl --http2-prior-knowledge on
  the plain listener, nghttp with several streams on one connection.
- Frame level (lib/h2client.py's H2Client: raw frames, hpack for the header
  blocks): the connection preface and the SETTINGS exchange, PING, flow control
  of a large response, request bodies with and without content-length, the
  request model (routing on :authority and :path, cookies joined, Host from
  :authority), the gate (a held stream does not hold the others; a held stream
  the client resets is never forwarded; refusals with Retry-After and RateLimit
  fields).
- http2 = false, the access log's "protocol" and
  smockron_proxy_http_requests_total{protocol}; HTTP/2 upstreams (trailers, a
  stream the upstream refused unprocessed sent again).

The abuse bounds (floods, limits, stalled windows) are in test_http2_abuse.

Every wait has a deadline; rule periods are long so that a slow (sanitizer)
build on a busy machine changes nothing but the run time.

Run: cd integration && python3 -m unittest -v test_http2
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.backends import _BLOCK, MIB  # noqa: E402
from lib.daemons import run  # noqa: E402
from lib.h2_servers import RefusingUpstream  # noqa: E402
from lib.h2client import H2Client  # noqa: E402
from lib.h2frames import CANCEL, DEFAULT_WINDOW, PREFACE, SETTINGS_MAX_CONCURRENT_STREAMS, settings_frame  # noqa: E402
from lib.http1 import PeerClosed, RawConn, fetch  # noqa: E402
from lib.metrics import HELD, requests_by_protocol  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402  (lib adds Debian's dist-packages to sys.path)
from lib.timing import wait_until  # noqa: E402
from lib.tls_ca import TestCA  # noqa: E402

GONE = "smockron_proxy_held_client_disconnects_total"
POLICIES = "smockron_proxy_control_policies_total"


def header_values(echo: dict, name: str) -> list[str]:
    """A header's values as the backend (lib/backends.py echo) received it."""
    return [v for k, v in echo["headers"] if k.lower() == name.lower()]


# =============================================================================== real clients


class RealClientsTest(DaemonTestCase):
    def test_curl_negotiates_h2_over_tls_by_alpn(self):
        ca = TestCA(self.tmp)
        cert, key = ca.issue("server", "localhost", "DNS:localhost,IP:127.0.0.1")
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, [{"path": "/", "upstream": "app"}],
                                 tls_cert=cert, tls_key=key)
        out = os.path.join(self.tmp, "curl.out")
        p = run(["curl", "-sS", "-v", "--http2", "--max-time", "20", "--cacert", ca.cert,
                 "--resolve", f"localhost:{proxy.port}:127.0.0.1", "-o", out, "-w", "%{http_version} %{http_code}",
                 "-H", "X-Client: curl", f"https://localhost:{proxy.port}/tls/curl?q=1"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "2 200", p.stderr)
        self.assertIn("ALPN: server accepted h2", p.stderr)
        with open(out, "rb") as f:
            echo = json.loads(f.read())
        self.assertEqual(echo["target"], "/tls/curl?q=1")
        self.assertEqual(header_values(echo, "Host"), [f"localhost:{proxy.port}"], "Host from :authority")
        self.assertEqual(header_values(echo, "X-Client"), ["curl"])
        self.assertEqual(header_values(echo, "X-Forwarded-Proto"), ["https"])

        # The same listener still speaks HTTP/1.1 to a client that asks for it.
        p = run(["curl", "-sS", "--http1.1", "--max-time", "20", "--cacert", ca.cert,
                 "--resolve", f"localhost:{proxy.port}:127.0.0.1", "-o", os.devnull, "-w", "%{http_version} %{http_code}",
                 f"https://localhost:{proxy.port}/tls/http1"])
        self.assertEqual(p.stdout.strip(), "1.1 200", p.stderr)

        # ALPN as Python's ssl sees it: h2 first when offered, http/1.1 else.
        with H2Client(proxy.port, tls_ca=ca.cert, alpn=("h2", "http/1.1")) as c:
            self.assertEqual(c.alpn, "h2")
            st = c.get("/tls/raw", authority=f"localhost:{proxy.port}", scheme="https")
            self.assertEqual(st.status, 200, st)
        with H2Client(proxy.port, tls_ca=ca.cert, alpn=("http/1.1",), preface=False) as c:
            self.assertEqual(c.alpn, "http/1.1")
        self.assertEqual(len(backend.requests(target_prefix="/tls/")), 3)
        self.assertEqual(requests_by_protocol(proxy, "h2"), 2)
        self.assertGreaterEqual(requests_by_protocol(proxy, "http/1.1"), 1)

    def test_curl_with_prior_knowledge_on_the_plain_listener(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        out = os.path.join(self.tmp, "curl.out")
        p = run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "20", "-o", out,
                 "-w", "%{http_version} %{http_code}", f"http://127.0.0.1:{proxy.port}/pk/get"])
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "2 200"), p.stderr)
        with open(out, "rb") as f:
            echo = json.loads(f.read())
        self.assertEqual(header_values(echo, "Host"), [f"127.0.0.1:{proxy.port}"])
        self.assertEqual(header_values(echo, "X-Forwarded-Proto"), ["http"])

        # An upload larger than any initial window (the proxy must give credit back).
        body = os.path.join(self.tmp, "upload.bin")
        with open(body, "wb") as f:
            f.write(_BLOCK[:300_000])
        p = run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "20", "-o", out,
                 "-w", "%{http_version} %{http_code}", "--data-binary", f"@{body}",
                 f"http://127.0.0.1:{proxy.port}/pk/upload"])
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "2 200"), p.stderr)
        with open(out, "rb") as f:
            echo = json.loads(f.read())
        self.assertEqual((echo["method"], echo["body_bytes"]), ("POST", 300_000))

        # A 2 MiB download (flow control the other way).
        p = run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "30", "-o", out,
                 "-w", "%{http_version} %{http_code} %{size_download}",
                 f"http://127.0.0.1:{proxy.port}/stream?mib=2&mode=chunked"])
        self.assertEqual((p.returncode, p.stdout.strip()), (0, f"2 200 {2 * MIB}"), p.stderr)
        self.assertEqual(requests_by_protocol(proxy, "h2"), 3)

    def test_nghttp_several_streams_on_one_connection(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        uris = [f"http://127.0.0.1:{proxy.port}/ng/{i}" for i in range(4)]
        # nghttp speaks h2c with prior knowledge to http:// URIs; all URIs share one connection.
        p = run(["nghttp", "-nv", "-t", "20", "-H", "x-client: nghttp", *uris])
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr)
        statuses = re.findall(r"recv \(stream_id=(\d+)\) :status: (\d+)", p.stdout)
        self.assertEqual(len(statuses), 4, p.stdout[-3000:])
        self.assertEqual({s for _, s in statuses}, {"200"})
        self.assertEqual(len({sid for sid, _ in statuses}), 4, "four streams")
        self.assertEqual(len(re.findall(r"\] Connected\n", p.stdout)), 1, "one connection")
        seen = backend.requests(target_prefix="/ng/")
        self.assertEqual(sorted(e["target"] for e in seen), [f"/ng/{i}" for i in range(4)])
        for e in seen:
            self.assertEqual(header_values(e, "x-client"), ["nghttp"])
        self.assertEqual(requests_by_protocol(proxy, "h2"), 4)


# =============================================================================== frames: the request model


class FrameLevelTest(DaemonTestCase):
    def test_preface_settings_ping_and_one_request(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        with H2Client(proxy.port) as c:
            self.assertEqual(c.frames[0][:2], ("SETTINGS", 0), "the server's preface is a SETTINGS frame")
            self.assertEqual(c.server_settings.get(SETTINGS_MAX_CONCURRENT_STREAMS), 128, c.server_settings)
            self.assertGreaterEqual(c.settings_acks, 1, "our SETTINGS acknowledged")
            c.ping(b"smockron")
            c.wait(lambda: c.ping_acks, what="the PING ACK")
            self.assertEqual(c.ping_acks, [b"smockron"])

            st = c.get("/one?x=1", headers=[("x-api-key", "k1"), ("cookie", "a=1"), ("cookie", "b=2"),
                                            ("accept", "application/json")], authority="h2.example:8443")
            self.assertEqual(st.status, 200, st)
            self.assertIsNone(st.reset)
            names = [k for k, _ in st.headers]
            self.assertEqual(names, [k.lower() for k in names], "field names are lower case in HTTP/2")
            for hop in ("connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection"):
                self.assertNotIn(hop, names, "connection-specific fields are not sent in HTTP/2 (RFC 9113 8.2.2)")
            self.assertEqual(st.header("content-type"), "application/json")
            echo = st.json()
            self.assertEqual((echo["method"], echo["target"]), ("GET", "/one?x=1"))
            self.assertEqual(header_values(echo, "Host"), ["h2.example:8443"], "Host from :authority")
            self.assertEqual(header_values(echo, "Cookie"), ["a=1; b=2"], "cookie fields joined (RFC 9113 8.2.3)")
            self.assertEqual(header_values(echo, "X-API-Key"), ["k1"])
            self.assertEqual([k for k, _ in echo["headers"] if k.startswith(":")], [], "no pseudo-header upstream")
            self.assertEqual(c.violations, [])
            self.assertIsNone(c.goaway)

    def test_a_complete_answer_to_an_unfinished_request_ends_the_stream(self):
        # RFC 9113 8.1: the proxy answers (404: no route) before the client finished its body,
        # then RST_STREAM(NO_ERROR): the client may stop, and the stream does not stay open.
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, [{"path": "/api", "upstream": "app"}])
        with H2Client(proxy.port) as c:
            sid = c.request("/elsewhere", method="POST", headers=[("content-length", "100")], end_stream=False)
            st = c.response(sid)
            self.assertEqual(st.status, 404, st)
            c.wait(lambda: st.reset is not None, what="RST_STREAM after the answer")
            self.assertEqual(st.reset, 0, st)  # NO_ERROR
            self.assertEqual(c.get("/api/after").status, 200)  # the connection goes on

    def test_routing_on_authority_and_path(self):
        one, two = self.start_backend(), self.start_backend()
        proxy = self.start_proxy({"one": {"servers": [f"{HOST}:{one.port}"]}, "two": {"servers": [f"{HOST}:{two.port}"]}},
                                 [{"host": "one.test", "path": "/", "upstream": "one"},
                                  {"host": "two.test", "path": "/two", "upstream": "two"}])
        with H2Client(proxy.port) as c:
            cases = [("one.test", "/a", 200), ("ONE.test:8080", "/b", 200), ("two.test", "/two/c", 200),
                     ("two.test", "/elsewhere", 404), ("three.test", "/a", 404)]
            sids = [c.request(path, authority=auth) for auth, path, _ in cases]  # all in flight at once
            for sid, (auth, path, status) in zip(sids, cases):
                self.assertEqual(c.response(sid).status, status, (auth, path))
        self.assertEqual(sorted(e["target"] for e in one.requests()), ["/a", "/b"])
        self.assertEqual([e["target"] for e in two.requests()], ["/two/c"])

    def test_flow_control_of_a_large_response(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        with H2Client(proxy.port, auto_window=False, timeout=20) as c:
            sid = c.request("/stream?mib=1&mode=length")
            st = c.streams[sid]
            # The initial windows (65,535 bytes on the stream and the connection) fill up,
            # and then nothing more comes until the client gives credit (any DATA beyond the
            # window would be in c.violations).
            c.wait(lambda: st.data_bytes >= DEFAULT_WINDOW, what="the first window's worth of DATA")
            self.assertFalse(st.done, st)
            self.assertEqual(st.status, 200)
            self.assertIn(st.header("content-length"), (None, str(MIB)))
            while not st.done:
                c.window(0, 128 * 1024)
                c.window(sid, 128 * 1024)
                target = min(MIB, st.data_bytes + 128 * 1024)
                c.wait(lambda: st.data_bytes >= target or st.done, what=f"DATA up to {target}")
            self.assertEqual(c.violations, [], "DATA only within the window the client gave")
            self.assertTrue(st.ended and st.reset is None, st)
            self.assertEqual(len(st.data), MIB)
            self.assertTrue(bytes(st.data) == _BLOCK, "the body arrives intact")

        # A chunked upstream body of 4 MiB, the client opening windows as it reads.
        with H2Client(proxy.port, timeout=30) as c:
            st = c.get("/stream?mib=4&mode=chunked")
            self.assertEqual((st.status, st.reset, len(st.data)), (200, None, 4 * MIB))
            self.assertIsNone(st.header("transfer-encoding"))
            self.assertTrue(bytes(st.data[:MIB]) == _BLOCK and bytes(st.data[-MIB:]) == _BLOCK)
            self.assertEqual(c.violations, [])

    def test_request_bodies_with_and_without_content_length(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        with H2Client(proxy.port, timeout=20) as c:
            big = (_BLOCK * 2)[:300_000]  # more than the proxy's initial window
            st = c.get("/upload/cl", method="POST", headers=[("content-length", str(len(big)))], body=big)
            self.assertEqual(st.status, 200, st)
            self.assertEqual(st.json()["body_bytes"], len(big))
            st = c.get("/upload/small", method="POST", headers=[("content-type", "text/plain")], body=b"hello h2")
            echo = st.json()
            self.assertEqual((st.status, echo["body"]), (200, "hello h2"))
            # No content-length: the body is known only at END_STREAM (several DATA frames).
            sid = c.request("/upload/nocl", method="PUT", end_stream=False)
            for i in range(5):
                c.send_data(sid, bytes([65 + i]) * 20_000, end_stream=False)
            c.send_data(sid, b"end", end_stream=True)
            st = c.response(sid)
            self.assertEqual(st.status, 200, st)
            self.assertEqual(st.json()["body_bytes"], 100_003)
            # END_STREAM on HEADERS: no body at all.
            st = c.get("/upload/none", method="POST")
            self.assertEqual((st.status, st.json()["body_bytes"]), (200, 0))
            self.assertEqual(c.violations, [])
        seen = {e["target"]: e for e in backend.requests(target_prefix="/upload/")}
        self.assertEqual(seen["/upload/cl"]["body_bytes"], 300_000)
        self.assertEqual(header_values(seen["/upload/cl"], "Content-Length"), ["300000"])
        self.assertEqual(seen["/upload/nocl"]["body_bytes"], 100_003)
        self.assertTrue(seen["/upload/nocl"]["complete"])
        self.assertEqual(seen["/upload/small"]["body"], "hello h2")


# =============================================================================== the gate over HTTP/2


class GateOverHttp2Test(DaemonTestCase):
    LIMITED = {"path": "/limited", "domain": "api", "upstream": "app", "identify": ["header:X-Key"], "explain": True}
    FREE = {"path": "/free", "upstream": "app"}

    def accept_first(self, proxy, c: H2Client, key: str) -> None:
        """One accepted request of `key` over `c`, then the master's DELAY_UNTIL for it is here."""
        ctl0 = proxy.ctl()
        st = c.get(f"/limited/first-{key}", headers=[("x-key", key)])
        self.assertEqual((st.status, st.header("smockron-decision")), (200, "accepted"), st)
        self.wait_ctl(proxy, ctl0, timeout=10)

    def test_a_held_stream_does_not_hold_the_connection(self):
        log = os.path.join(self.tmp, "access.log")
        # 1 per 8 s, held up to 30 s: the second request of "hk" is held ~8 s, long enough
        # for a free request on the same connection to go first on any machine.
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/8s", 1)]}}, [self.LIMITED, self.FREE],
                                            max_delay="30s", **access_log_keys(log))
        with H2Client(proxy.port, timeout=40) as c:
            self.accept_first(proxy, c, "hk")
            held = c.request("/limited/held", headers=[("x-key", "hk")])
            proxy.wait_metric(HELD, predicate=lambda v: v == 1, timeout=10)
            free = c.get("/free/go")
            self.assertEqual(free.status, 200, free)
            self.assertFalse(c.streams[held].done, "the free stream finished while the other was held")
            st = c.response(held, timeout=40)
            self.assertEqual(st.status, 200, st)
            self.assertRegex(st.header("smockron-decision") or "", r"^delayed;held_ms=\d+$")
            self.assertLess(free.done_seq, st.done_seq)
            self.assertIsNone(c.goaway)
        order = [e["target"] for e in backend.requests() if e["target"].startswith(("/free/", "/limited/held"))]
        self.assertEqual(order, ["/free/go", "/limited/held"])
        entries = wait_until(lambda: (es := {e["target"]: e for e in read_access_log(log)}) and
                             "/limited/held" in es and "/free/go" in es and es, 5, message="access log lines")
        self.assertEqual(entries["/limited/held"]["protocol"], "HTTP/2")
        self.assertEqual(entries["/free/go"]["protocol"], "HTTP/2")
        self.assertGreater(float(entries["/limited/held"]["held_ms"]), 1000)

    def test_held_streams_with_request_bodies(self):
        # Two clients each held ~8 s with a body: a small one (sent whole while the stream
        # is held) and one larger than the initial window (the proxy may hold back credit
        # while the stream is held; the body must go on once it is released).
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/8s", 1)]}}, [self.LIMITED], max_delay="30s")
        small, large = b"s" * 3000, _BLOCK[:200_000]  # the backend keeps bodies up to 4 KiB
        with H2Client(proxy.port, timeout=40) as c:
            self.accept_first(proxy, c, "b1")
            self.accept_first(proxy, c, "b2")
            s1 = c.request("/limited/small", method="POST", headers=[("x-key", "b1"),
                                                                       ("content-length", str(len(small)))], body=small)
            proxy.wait_metric(HELD, predicate=lambda v: v == 1, timeout=10)
            s2 = c.request("/limited/large", method="POST", headers=[("x-key", "b2")], body=large)
            for sid, n in ((s1, len(small)), (s2, len(large))):
                st = c.response(sid, timeout=40)
                self.assertEqual(st.status, 200, st)
                self.assertRegex(st.header("smockron-decision") or "", r"^delayed;held_ms=\d+$")
                self.assertEqual(st.json()["body_bytes"], n)
            self.assertEqual(c.violations, [])
        seen = {e["target"]: e for e in backend.requests(target_prefix="/limited/")}
        self.assertEqual(seen["/limited/small"]["body"], small.decode())
        self.assertEqual(seen["/limited/large"]["body_bytes"], len(large))

    def test_a_held_stream_reset_by_the_client_is_never_forwarded(self):
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/8s", 1)]}}, [self.LIMITED, self.FREE],
                                            max_delay="30s")
        gone0 = proxy.metric(GONE) or 0
        with H2Client(proxy.port, timeout=40) as c:
            self.accept_first(proxy, c, "rk")
            held = c.request("/limited/reset-me", headers=[("x-key", "rk")])
            proxy.wait_metric(HELD, predicate=lambda v: v == 1, timeout=10)
            c.rst(held, CANCEL)
            proxy.wait_metric(GONE, predicate=lambda v: v >= gone0 + 1, timeout=10)
            proxy.wait_metric(HELD, predicate=lambda v: v == 0, timeout=10)
            # The connection goes on: a free stream, then the same client again, held into
            # the place the reset stream left (its release proves that place's time passed).
            self.assertEqual(c.get("/free/after-reset").status, 200)
            st = c.get("/limited/after", headers=[("x-key", "rk")], timeout=40)
            self.assertEqual(st.status, 200, st)
            self.assertIsNone(c.goaway)
        self.assertEqual(backend.requests(target_prefix="/limited/reset-me"), [], "the reset stream was forwarded")
        self.assertEqual(len(backend.requests(target_prefix="/limited/after")), 1)

    def test_refusal_with_retry_after_and_ratelimit_fields(self):
        routes = [dict(self.LIMITED, path="/limited503", ratelimit_headers=True),
                  dict(self.LIMITED, path="/limited429", status=429, ratelimit_headers=True), self.FREE]
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/h", 1)]}}, routes, max_delay="0s")
        proxy.wait_metric(POLICIES, predicate=lambda v: v > 0, timeout=10)
        with H2Client(proxy.port) as c:
            ctl0 = proxy.ctl()
            st = c.get("/limited503/1", headers=[("x-key", "rl")])
            self.assertEqual(st.status, 200, st)
            self.assertEqual(st.header("ratelimit-policy"), '"api";q=1;w=3600')
            self.wait_ctl(proxy, ctl0, timeout=10)
            for path, status in (("/limited503/2", 503), ("/limited429/3", 429)):
                st = c.get(path, headers=[("x-key", "rl")])
                self.assertEqual(st.status, status, st)
                retry_after = int(st.header("retry-after") or "0")
                self.assertGreaterEqual(retry_after, 1, st)
                self.assertEqual(st.header("ratelimit-policy"), '"api";q=1;w=3600')
                self.assertEqual(st.header("ratelimit"), f'"api";r=0;t={retry_after}')
                self.assertEqual(st.header("smockron-decision"), "rejected;reason=delay_too_long")
            # Another identifier, and the connection, go on.
            self.assertEqual(c.get("/limited503/other", headers=[("x-key", "other")]).status, 200)
            self.assertEqual(c.get("/free/x").status, 200)
            self.assertIsNone(c.goaway)
        self.assertEqual([e["target"] for e in backend.requests(target_prefix="/limited")],
                         ["/limited503/1", "/limited503/other"])


# =============================================================================== http2 = false, access log, counters


class SwitchAndCountersTest(DaemonTestCase):
    def test_http2_false(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, http2=False)
        # The preface is no HTTP/1.1 request: 400, or the connection closed.
        with RawConn(proxy.port, 5) as raw:
            raw.send(PREFACE + settings_frame())
            got = b""
            deadline = time.monotonic() + 5
            try:
                while b"\r\n\r\n" not in raw.buf:
                    raw._fill(deadline)
            except (PeerClosed, ConnectionResetError):
                pass
            got = bytes(raw.buf)
        self.assertTrue(got == b"" or got.startswith(b"HTTP/1.1 400"), f"answered {got[:100]!r}")
        self.assertEqual(fetch(proxy.port, "/still-http1")[0].status, 200)

        ca = TestCA(self.tmp)
        cert, key = ca.issue("server", "localhost", "DNS:localhost,IP:127.0.0.1")
        tls = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, [{"path": "/", "upstream": "app"}],
                               config_name="tls.toml", tls_cert=cert, tls_key=key, http2=False)
        with H2Client(tls.port, tls_ca=ca.cert, alpn=("h2", "http/1.1"), preface=False) as c:
            self.assertEqual(c.alpn, "http/1.1", "h2 is not offered")
        p = run(["curl", "-sS", "--http2", "--max-time", "20", "--cacert", ca.cert,
                 "--resolve", f"localhost:{tls.port}:127.0.0.1", "-o", os.devnull, "-w", "%{http_version} %{http_code}",
                 f"https://localhost:{tls.port}/tls-http1"])
        self.assertEqual(p.stdout.strip(), "1.1 200", p.stderr)
        self.assertEqual(requests_by_protocol(proxy, "h2") + requests_by_protocol(tls, "h2"), 0)
        self.assertEqual(backend.requests(target_prefix="/tls-http1")[0]["target"], "/tls-http1")

    def test_access_log_protocol_and_requests_by_protocol(self):
        log = os.path.join(self.tmp, "access.log")
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, **access_log_keys(log))
        for i in range(2):
            self.assertEqual(fetch(proxy.port, f"/p1/{i}")[0].status, 200)
        with H2Client(proxy.port) as c:
            sids = [c.request(f"/p2/{i}") for i in range(3)]
            self.assertEqual([c.response(s).status for s in sids], [200] * 3)
        entries = wait_until(lambda: len(es := [e for e in read_access_log(log) if e["target"].startswith("/p")]) == 5
                             and es, 5, message="five access log lines")
        protocols = {e["target"]: e["protocol"] for e in entries}
        self.assertEqual(protocols, {"/p1/0": "HTTP/1.1", "/p1/1": "HTTP/1.1",
                                     "/p2/0": "HTTP/2", "/p2/1": "HTTP/2", "/p2/2": "HTTP/2"})
        self.assertEqual(requests_by_protocol(proxy, "h2"), 3)
        # (>=: whether the admin endpoint's own requests count is not the question here.)
        self.assertGreaterEqual(requests_by_protocol(proxy, "http/1.1"), 2)


class Http2UpstreamTest(DaemonTestCase):
    def test_trailers_of_an_http1_upstream_reach_the_http2_client(self):
        # A chunked HTTP/1.1 response's trailer section becomes HTTP/2 trailers (names lower-cased).
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, [{"path": "/", "upstream": "app"}])
        with H2Client(proxy.port) as c:
            st = c.get("/chunks?n=3&gap=0&trailers=1", timeout=20)
            self.assertEqual(st.status, 200, st)
            self.assertEqual(bytes(st.data), b"part-0;part-1;part-2;")
            self.assertEqual(st.trailers, [("x-checksum", "abc"), ("x-trailer-two", "2")], st)

    def test_a_stream_the_upstream_refused_unprocessed_is_sent_again(self):
        up = RefusingUpstream()
        self.addCleanup(up.close)
        proxy = self.start_proxy({"h2": {"servers": [f"{HOST}:{up.port}"], "protocol": "h2c"}},
                                 [{"path": "/", "upstream": "h2"}])
        with H2Client(proxy.port) as c:
            st = c.get("/once", timeout=20)
            self.assertEqual(st.status, 200, st)
            self.assertEqual(bytes(st.data), b"served")
        self.assertEqual(up.streams, 2, "refused once, sent again, served")


if __name__ == "__main__":
    unittest.main()
