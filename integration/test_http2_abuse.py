"""HTTP/2 abuse bounds on the proxy's listeners, black box, with the real binaries:
rapid reset, CONTINUATION flood, control-frame floods (PING, SETTINGS, PRIORITY,
empty DATA, unearned WINDOW_UPDATE), oversized header lists and HPACK bombs
(431), too many streams, a response stalled by a closed window (body_timeout).

The floods use small bounds (burst 10, rate 1/s) so that a few dozen frames
cross them; every wait has a deadline. The client is lib/h2client.py's H2Client.

Run: cd integration && python3 -m unittest -v test_http2_abuse
"""
from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.h2client import H2Client  # noqa: E402
from lib.h2frames import (  # noqa: E402
    CANCEL,
    DEFAULT_WINDOW,
    ENHANCE_YOUR_CALM,
    PROTOCOL_ERROR,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    data_frame,
    ping_frame,
    priority_frame,
    rst_frame,
    settings_frame,
    window_update_frame,
)
from lib.metrics import ABUSE, metric_sum  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402  (lib adds Debian's dist-packages to sys.path)

TOO_LARGE = "smockron_proxy_header_too_large_total"


def abuse(proxy, kind: str) -> float:
    return metric_sum(proxy.metrics(), ABUSE, kind=kind)


# =============================================================================== abuse bounds


class AbuseTest(DaemonTestCase):
    def test_rapid_reset(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, http2_reset_burst=10, http2_reset_rate=1)

        def open_and_reset(c: H2Client, n: int) -> None:
            # Each stream stays open (no END_STREAM: a body would follow) until reset.
            out = bytearray()
            for _ in range(n):
                sid = c.new_stream_id()
                c._stream(sid)
                out += c.header_frames(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "t"),
                                             (":path", f"/rr/{sid}")], end_stream=False)
                out += rst_frame(sid, CANCEL)
            c.send(bytes(out), tolerate_close=True)

        with H2Client(proxy.port) as c:  # within the burst: nothing happens
            open_and_reset(c, 5)
            st = c.get("/rr/after")
            self.assertEqual(st.status, 200, st)
            self.assertIsNone(c.goaway)
        self.assertEqual(abuse(proxy, "rapid_reset"), 0)
        with H2Client(proxy.port) as c:
            open_and_reset(c, 40)
            c.wait(lambda: c.goaway, what="GOAWAY")
            self.assertEqual(c.goaway[1], ENHANCE_YOUR_CALM, c.goaway)
            c.wait_closed()
        proxy.wait_metric(ABUSE, {"kind": "rapid_reset"}, predicate=lambda v: v >= 1)

    def test_continuation_flood(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, http2_max_continuations=8)
        pad = [("x-pad", "p" * 400)]
        with H2Client(proxy.port) as c:
            # Eight CONTINUATION frames are allowed.
            st = c.response(c.request("/cont/8", headers=pad, continuations=8))
            self.assertEqual(st.status, 200, st)
            self.assertIsNone(c.goaway)
            # A ninth in one header block closes the connection.
            c.send(c.header_frames(c.new_stream_id(), [(":method", "GET"), (":scheme", "http"), (":authority", "t"),
                                                        (":path", "/cont/9")] + pad, True, continuations=9),
                   tolerate_close=True)
            c.wait(lambda: c.goaway, what="GOAWAY")
            c.wait_closed()
        proxy.wait_metric(ABUSE, {"kind": "continuation_flood"}, predicate=lambda v: v >= 1)
        self.assertEqual(backend.requests(target_prefix="/cont/9"), [])

    def test_control_frame_floods(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, http2_control_burst=10, http2_control_rate=1)
        # Within the burst (our SETTINGS, the ACK of the proxy's, five PINGs): answered.
        with H2Client(proxy.port) as c:
            for i in range(5):
                c.ping(b"ping-%03d" % i)
            c.wait(lambda: len(c.ping_acks) == 5, what="five PING ACKs")
            self.assertEqual(c.get("/calm").status, 200)
            self.assertIsNone(c.goaway)
        self.assertEqual(abuse(proxy, "control_flood"), 0)

        def empty_data(c: H2Client) -> bytes:
            sid = c.request("/flood/data", method="POST", end_stream=False)
            return b"".join(data_frame(sid) for _ in range(40))

        floods = {
            "PING": lambda c: b"".join(ping_frame(b"flood%03d" % i) for i in range(40)),
            "SETTINGS": lambda c: b"".join(settings_frame([(SETTINGS_ENABLE_PUSH, 0)]) for _ in range(40)),
            "PRIORITY": lambda c: b"".join(priority_frame(101 + 2 * i) for i in range(40)),
            "empty DATA": empty_data,
            # No DATA came from the proxy on this connection: none of these was earned.
            "WINDOW_UPDATE": lambda c: b"".join(window_update_frame(0, 1) for _ in range(40)),
        }
        for name, make in floods.items():
            with self.subTest(flood=name):
                before = abuse(proxy, "control_flood")
                with H2Client(proxy.port) as c:
                    c.send(make(c), tolerate_close=True)
                    c.wait(lambda: c.goaway, what=f"GOAWAY after a {name} flood")
                    self.assertEqual(c.goaway[1], ENHANCE_YOUR_CALM, c.goaway)
                    c.wait_closed()
                proxy.wait_metric(ABUSE, {"kind": "control_flood"}, predicate=lambda v, b=before: v >= b + 1)

    def test_oversized_header_list_and_hpack_bomb_get_431(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, max_header_bytes=4096)
        with H2Client(proxy.port) as c:
            st = c.get("/hl/big", headers=[("x-big", "a" * 5000)])
            self.assertEqual(st.status, 431, st)
            self.assertEqual(c.get("/hl/ok").status, 200, "the connection goes on")
            # An entry of ~3 KB in the HPACK dynamic table (a request under the limit)...
            self.assertEqual(c.get("/hl/seed", headers=[("x-bomb", "b" * 3000)]).status, 200)
            # ...then a header block of a few bytes that names it twenty times: ~60 KB decoded.
            bomb = [(":method", "GET"), (":scheme", "http"), (":authority", "test.local"), (":path", "/hl/bomb")]
            bomb += [("x-bomb", "b" * 3000)] * 20
            sid = c.new_stream_id()
            wire = c.header_frames(sid, bomb, end_stream=True)
            if c.server_settings.get(SETTINGS_HEADER_TABLE_SIZE, 4096) >= 4096:
                self.assertLess(len(wire), 200, "the bomb is small on the wire")
            c.send(wire)
            st = c.response(sid)
            self.assertEqual(st.status, 431, st)
            self.assertEqual(c.get("/hl/after").status, 200, "HPACK state still in step")
            self.assertIsNone(c.goaway)
        self.assertEqual(abuse(proxy, "header_list"), 2)
        self.assertGreaterEqual(proxy.metric(TOO_LARGE) or 0, 2)
        self.assertEqual(sorted(e["target"] for e in backend.requests(target_prefix="/hl/")),
                         ["/hl/after", "/hl/ok", "/hl/seed"])

    def test_streams_beyond_the_limit_are_refused(self):
        # SETTINGS_MAX_CONCURRENT_STREAMS = 2. Streams within it are served; a third stream
        # from a client that acknowledged the limit ends the connection: nghttp2 treats it
        # as a connection error (GOAWAY PROTOCOL_ERROR), which RFC 9113 5.4 allows for any
        # stream error; a client that ignores a limit it acknowledged is not one to keep.
        # (Before the acknowledgement, the stream alone is refused: REFUSED_STREAM.)
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, http2_max_concurrent_streams=2)
        with H2Client(proxy.port) as c:
            self.assertEqual(c.server_settings.get(SETTINGS_MAX_CONCURRENT_STREAMS), 2)
            self.assertEqual(c.get("/ms/first").status, 200)
            # Two streams held open by bodies still to come, then a third.
            c.request("/ms/a", method="POST", headers=[("content-length", "5")], end_stream=False)
            c.request("/ms/b", method="POST", headers=[("content-length", "5")], end_stream=False)
            c.request("/ms/third")
            c.wait(lambda: c.goaway, what="GOAWAY for a stream over the acknowledged limit")
            self.assertEqual(c.goaway[1], PROTOCOL_ERROR, c.goaway)
        proxy.wait_metric(ABUSE, {"kind": "too_many_streams"}, predicate=lambda v: v >= 1)
        self.assertEqual(backend.requests(target_prefix="/ms/third"), [])

    def test_a_response_stalled_by_a_closed_window_is_reset(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, body_timeout="1s")
        with H2Client(proxy.port, auto_window=False, timeout=30) as c:
            sid = c.request("/stream?mib=1")
            st = c.streams[sid]
            c.wait(lambda: st.data_bytes >= DEFAULT_WINDOW or st.done, what="the first window's worth of DATA")
            # The window never opens: after body_timeout the proxy gives up on the stream.
            c.wait(lambda: st.done, 30, "the stalled stream's reset")
            self.assertIsNotNone(st.reset, st)
            self.assertFalse(st.ended, "a 1 MiB body cannot have been completed through 64 KiB of window")
            self.assertEqual(c.violations, [])
            # A stream reset, not the connection (the spec says the response "is reset").
            # The connection's window is given back first: the stalled stream used it up.
            self.assertIsNone(c.goaway)
            c.window(0, st.data_bytes)
            self.assertEqual(c.get("/after-stall").status, 200)
        proxy.wait_metric(ABUSE, {"kind": "stalled_window"}, predicate=lambda v: v >= 1)


if __name__ == "__main__":
    unittest.main()
