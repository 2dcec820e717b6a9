"""HTTP/2 (and neighbouring HTTP/1.1) defects, black box, with the real binaries:
one test per defect, each asserting the fixed behaviour.

- "MadeYouReset" (CVE-2025-8671): a client that never sends RST_STREAM but makes
  the server reset each stream it opens (HEADERS, then a WINDOW_UPDATE overflowing
  the stream's window: RST_STREAM(FLOW_CONTROL_ERROR) from the server) is bounded
  as Rapid Reset is: GOAWAY(ENHANCE_YOUR_CALM), counted as kind="rapid_reset".
- An HTTP/1.1 h2c upgrade (Upgrade: h2c, HTTP2-Settings) is not relayed: the
  backend sees a plain request (WebSocket upgrades are still relayed: test_proxy).
- Host spellings: "limited.example." (trailing dot, any case, with a port) routes
  as "limited.example", over HTTP/1.1 (Host) and HTTP/2 (:authority); a host with
  userinfo ("user@limited.example") is refused with 400.
- Held uploads do not starve the connection: bodies of held streams do not keep
  the connection's flow-control window, so an upload on an ungated route of the
  same connection goes through while they are held.
- Streams reset at once (HEADERS then RST_STREAM(CANCEL)) take no upstream
  connection: a stream takes one only when it is forwarded.
- h2c upstreams are counted as HTTP/1.1 ones are: the upstream response histogram
  and the access log's "upstream" for HTTP/1.1 and HTTP/2 clients alike, and
  upstream_errors_total{kind="no_server"} when no server of the upstream answers.

Every wait has a deadline; request counts are bounded; 127.0.0.1 only. The
backends that count connections or speak h2c live in this process (threads,
lib/h2_servers.py).

Run: cd integration && python3 -m unittest -v test_h2_defects
"""
from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.backends import _BLOCK  # noqa: E402
from lib.daemons import run  # noqa: E402
from lib.h2_servers import CountingBackend, H2cBackend  # noqa: E402
from lib.h2client import H2Client  # noqa: E402
from lib.h2frames import CANCEL, ENHANCE_YOUR_CALM, data_frame, ping_frame, rst_frame, window_update_frame  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.metrics import ABUSE, HELD, metric_sum  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402  (lib adds Debian's dist-packages to sys.path)
from lib.timing import wait_until  # noqa: E402

FLOW_CONTROL_ERROR = 0x3
MAX_WINDOW = 0x7FFFFFFF  # 2^31 - 1 (RFC 9113 6.9.1)
UPSTREAM_SECONDS = "smockron_proxy_upstream_response_seconds"
UPSTREAM_ERRORS = "smockron_proxy_upstream_errors_total"


def send_within_windows(c: H2Client, sid: int, data: bytes) -> int:
    """DATA frames (no END_STREAM) for as much of `data` as the server's windows allow
    right now, without waiting for any WINDOW_UPDATE. Returns the bytes sent."""
    st = c.streams[sid]
    sent = 0
    while sent < len(data):
        n = min(len(data) - sent, c.conn_send_window, st.send_window, c.peer_max_frame)
        if n <= 0:
            break
        c.send(data_frame(sid, data[sent:sent + n]))
        c.conn_send_window -= n
        st.send_window -= n
        sent += n
    return sent


# --------------------------------------------------------------------------- the tests


class H2DefectsTest(DaemonTestCase):
    LIMITED = {"path": "/limited", "domain": "api", "upstream": "app", "identify": ["header:X-Key"]}
    FREE = {"path": "/free", "upstream": "app"}

    def test_made_you_reset_is_bounded_as_rapid_reset(self):
        # The client sends no RST_STREAM: each stream's HEADERS (END_STREAM) is followed by a
        # WINDOW_UPDATE that overflows the stream's window, which the server must answer with
        # RST_STREAM(FLOW_CONTROL_ERROR). /slow keeps each response away until long after.
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, http2_reset_burst=10, http2_reset_rate=1)
        streams = 60
        with H2Client(proxy.port, timeout=20) as c:
            out = bytearray()
            sids = []
            for i in range(streams):
                sid = c.new_stream_id()
                c._stream(sid)
                sids.append(sid)
                out += c.header_frames(sid, [(":method", "GET"), (":scheme", "http"), (":authority", "t"),
                                             (":path", f"/slow?s=3&myr={i}")], end_stream=True)
                out += window_update_frame(sid, MAX_WINDOW)
            c.send(bytes(out), tolerate_close=True)
            # Until the GOAWAY, or the end of the connection, or every stream was reset and a
            # PING sent after that is answered (a server that ends the connection does not).
            c.wait(lambda: c.goaway or c.closed or all(c.streams[s].done for s in sids), 20,
                   "GOAWAY, or the end of every stream")
            if c.goaway is None and not c.closed:
                c.send(ping_frame(b"after-rs"), tolerate_close=True)
                c.wait(lambda: c.goaway or c.closed or c.ping_acks, 20, "GOAWAY, or the PING ACK")
            resets = [c.streams[s].reset for s in sids]
            # Each stream is reset for its window (or the connection ends first, its RST_STREAMs unsent).
            self.assertTrue(all(r in (None, FLOW_CONTROL_ERROR) for r in resets), resets)
            self.assertIsNotNone(c.goaway, f"no GOAWAY after the server reset {resets.count(FLOW_CONTROL_ERROR)} "
                                           f"of {streams} streams (http2_reset_burst = 10): {c.summary()}")
            self.assertEqual(c.goaway[1], ENHANCE_YOUR_CALM, c.goaway)
            c.wait_closed()
        proxy.wait_metric(ABUSE, {"kind": "rapid_reset"}, predicate=lambda v: v >= 1)
        forwarded = backend.requests(target_prefix="/slow")
        self.assertLessEqual(len(forwarded), 20, f"{len(forwarded)} of {streams} streams reached the backend")

    def test_an_h2c_upgrade_is_not_relayed(self):
        # The proxy offers no h2c upgrade (its HTTP/2 is ALPN or prior knowledge): relaying
        # one would open an ungated HTTP/2 tunnel to a backend that speaks it. The request goes
        # on as plain HTTP/1.1. (WebSocket upgrades still are relayed: test_proxy's
        # test_websocket_echo_through_the_proxy.)
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)  # a limited route (domain "api"), fail-open: no master
        r, _ = fetch(proxy.port, "/up/h2c", key="up", headers=[
            ("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"),
            ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")])
        self.assertEqual(r.status, 200, r)
        seen = backend.requests(target_prefix="/up/h2c")
        self.assertEqual(len(seen), 1, seen)
        names = [k.lower() for k, _ in seen[0]["headers"]]
        self.assertNotIn("upgrade", names, f"relayed to the backend: {seen[0]['headers']}")
        self.assertNotIn("http2-settings", names, f"relayed to the backend: {seen[0]['headers']}")

    def test_host_spellings_route_alike_and_userinfo_is_refused(self):
        lim, other = self.start_backend(), self.start_backend()
        proxy = self.start_proxy({"lim": {"servers": [f"{HOST}:{lim.port}"]},
                                  "other": {"servers": [f"{HOST}:{other.port}"]}},
                                 [{"host": "limited.example", "path": "/", "upstream": "lim"},
                                  {"path": "/", "upstream": "other"}])
        http1 = {"/hs/1/plain": ("limited.example", "lim"), "/hs/1/dot": ("limited.example.", "lim"),
                 "/hs/1/dot-case-port": ("LIMITED.example.:80", "lim"), "/hs/1/other": ("other.example", "other"),
                 "/hs/1/userinfo": ("user@limited.example", 400)}
        http2 = {"/hs/2/plain": ("limited.example", "lim"), "/hs/2/dot": ("limited.example.", "lim"),
                 "/hs/2/dot-case-port": ("LIMITED.Example.:8443", "lim"), "/hs/2/other": ("other.example", "other"),
                 "/hs/2/userinfo": ("user@limited.example", 400)}
        got = {}
        for target, (host, _) in http1.items():
            got[target] = fetch(proxy.port, target, host=host)[0].status
        with H2Client(proxy.port) as c:
            sids = {target: c.request(target, authority=host) for target, (host, _) in http2.items()}
            for target, sid in sids.items():
                st = c.response(sid)
                got[target] = st.status if st.reset is None else f"RST_STREAM {st.reset}"
        where = {e["target"]: "lim" for e in lim.requests(target_prefix="/hs/")}
        where.update({e["target"]: "other" for e in other.requests(target_prefix="/hs/")})
        # (host, status, backend) per target: 200 from the expected backend, or 400 and none.
        want = {t: (h, 200, b) if isinstance(b, str) else (h, b, None) for t, (h, b) in {**http1, **http2}.items()}
        have = {t: (want[t][0], got[t], where.get(t)) for t in want}
        self.assertEqual(have, want)

    def test_held_uploads_do_not_starve_the_connection(self):
        # 16 streams held ~60 s and more (1 per 60 s, paced), each with a body as large as its
        # window: together they take the connection's whole window as the client sees it.
        # An upload on an ungated route of the same connection must still go through.
        held_streams = 16
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/60s", 1)]}}, [self.LIMITED, self.FREE],
                                            max_delay="1h", body_timeout="30s")
        free_body = _BLOCK[:256 * 1024]
        with H2Client(proxy.port, timeout=30) as c:
            ctl0 = proxy.ctl()
            st = c.get("/limited/first", headers=[("x-key", "hu")])
            self.assertEqual(st.status, 200, st)
            self.wait_ctl(proxy, ctl0, timeout=10)
            held = [c.request(f"/limited/held-{i}", method="POST", end_stream=False,
                              headers=[("x-key", "hu"), ("content-length", str(64 * 1024))])
                    for i in range(held_streams)]
            proxy.wait_metric(HELD, predicate=lambda v: v == held_streams, timeout=10)
            # Any WINDOW_UPDATE of the proxy's start is in (a PING answered after it).
            c.ping(b"windows!")
            c.wait(lambda: c.ping_acks, what="the PING ACK")
            sent = [send_within_windows(c, sid, _BLOCK[:64 * 1024]) for sid in held]
            self.assertLess(c.conn_send_window, len(free_body),
                            f"the held bodies ({sum(sent)} bytes sent) did not take the connection's window: "
                            "this test proves nothing")
            free = c.request("/free/upload", method="POST", end_stream=False,
                             headers=[("content-length", str(len(free_body)))])
            c.send_data(free, free_body, end_stream=True, timeout=10)
            st = c.response(free, timeout=10)
            self.assertEqual(st.status, 200, st)
            self.assertEqual(st.json()["body_bytes"], len(free_body))
            self.assertEqual([sid for sid in held if c.streams[sid].done], [], "the held streams are still held")
            self.assertEqual(proxy.metric(HELD), held_streams)
            self.assertEqual(c.violations, [])
        self.assertEqual(backend.requests(target_prefix="/limited/held"), [])

    def test_streams_reset_at_once_take_no_upstream_connection(self):
        backend = CountingBackend()
        self.addCleanup(backend.close)
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, [{"path": "/", "upstream": "app"}],
                                 http2_reset_burst=1000)
        resets = 200
        with H2Client(proxy.port, timeout=20) as c:
            out = bytearray()
            for i in range(resets):
                sid = c.new_stream_id()
                c._stream(sid)
                out += c.header_frames(sid, [(":method", "GET"), (":scheme", "http"), (":authority", "t"),
                                             (":path", f"/rr/{i}")], end_stream=True)
                out += rst_frame(sid, CANCEL)
            c.send(bytes(out))
            # A request after them on the same connection: its upstream connection is made after
            # any of theirs was, and the backend accepts connections in order.
            st = c.get("/rr/after")
            self.assertEqual(st.status, 200, st)
            self.assertIsNone(c.goaway)
        with backend.lock:
            connections, targets = backend.connections, list(backend.targets)
        self.assertIn("/rr/after", targets)
        self.assertLessEqual(connections, 10, f"{connections} upstream connections for {resets} streams reset at once "
                                              f"({len(targets)} requests reached the backend)")

    def test_h2c_upstreams_are_counted_as_http1_upstreams(self):
        log = os.path.join(self.tmp, "access.log")
        h1 = self.start_backend()
        h2 = H2cBackend()
        self.addCleanup(h2.close)
        dead = self.dead_port()
        proxy = self.start_proxy({"h1app": {"servers": [f"{HOST}:{h1.port}"]},
                                  "h2app": {"servers": [f"{HOST}:{h2.port}"], "protocol": "h2c"},
                                  "dead": {"servers": [f"{HOST}:{dead}"], "protocol": "h2c"}},
                                 [{"path": "/drift/h1", "upstream": "h1app"},
                                  {"path": "/drift/h2", "upstream": "h2app"},
                                  {"path": "/drift/dead", "upstream": "dead"}],
                                 **access_log_keys(log))
        for up in ("h1", "h2"):
            for client, flag, version in (("c1", "--http1.1", "1.1"), ("c2", "--http2-prior-knowledge", "2")):
                p = run(["curl", "-sS", flag, "--max-time", "20", "-o", os.devnull,
                         "-w", "%{http_version} %{http_code}", f"http://127.0.0.1:{proxy.port}/drift/{up}/{client}"])
                self.assertEqual((p.returncode, p.stdout.strip()), (0, f"{version} 200"), p.stderr)
        self.assertEqual(sorted(e["target"] for e in h1.requests(target_prefix="/drift/")),
                         ["/drift/h1/c1", "/drift/h1/c2"])
        self.assertEqual(sorted(h2.paths), ["/drift/h2/c1", "/drift/h2/c2"])
        entries = wait_until(lambda: len(es := {e["target"]: e for e in read_access_log(log)}) >= 4 and es, 5,
                             message="four access log lines")
        self.assertEqual({t: e.get("upstream") or "" for t, e in entries.items()},
                         {"/drift/h1/c1": f"{HOST}:{h1.port}", "/drift/h1/c2": f"{HOST}:{h1.port}",
                          "/drift/h2/c1": f"{HOST}:{h2.port}", "/drift/h2/c2": f"{HOST}:{h2.port}"},
                         "every forwarded request names its upstream server")
        m = proxy.metrics()
        self.assertEqual({u: metric_sum(m, UPSTREAM_SECONDS + "_count", upstream=u) for u in ("h1app", "h2app")},
                         {"h1app": 2, "h2app": 2}, "upstream response times, HTTP/1.1 and HTTP/2 clients")

        # No server of the h2c upstream answers: 502 and no_server, from either kind of client.
        no_server0 = metric_sum(proxy.metrics(), UPSTREAM_ERRORS, kind="no_server")
        self.assertEqual(fetch(proxy.port, "/drift/dead/c1")[0].status, 502)
        with H2Client(proxy.port) as c:
            st = c.get("/drift/dead/c2")
            self.assertEqual(st.status, 502, st)
        wait_until(lambda: metric_sum(proxy.metrics(), UPSTREAM_ERRORS, kind="no_server") >= no_server0 + 2, 5,
                   message=f'{UPSTREAM_ERRORS}{{kind="no_server"}} counting both requests (from {no_server0})')


if __name__ == "__main__":
    unittest.main()
