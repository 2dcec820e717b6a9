"""HTTP/2 on the proxy's listeners (RFC 9113), black box, with the real binaries.

- Real clients: curl --http2 over TLS (ALPN h2), curl --http2-prior-knowledge on
  the plain listener, nghttp with several streams on one connection.
- Frame level (H2Client below: raw frames, hpack for the header blocks): the
  connection preface and the SETTINGS exchange, PING, flow control of a large
  response, request bodies with and without content-length, the request model
  (routing on :authority and :path, cookies joined, Host from :authority), the
  gate (a held stream does not hold the others; a held stream the client resets
  is never forwarded; refusals with Retry-After and RateLimit fields), and the
  abuse bounds: rapid reset, CONTINUATION flood, control-frame floods (PING,
  SETTINGS, PRIORITY, empty DATA, unearned WINDOW_UPDATE), oversized header
  lists and HPACK bombs (431), too many streams (REFUSED_STREAM), a stalled
  flow-control window (body_timeout).
- http2 = false, the access log's "protocol" and
  smockron_proxy_http_requests_total{protocol}.

Every wait has a deadline; rule periods are long so that a slow (sanitizer)
build on a busy machine changes nothing but the run time. The floods use small
bounds (burst 10, rate 1/s) so that a few dozen frames cross them.

H2Client is also used by test_grpc (trailers-only refusals seen on the wire).

Run: cd integration && python3 -m unittest -v test_http2
"""
from __future__ import annotations

import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from backends import _BLOCK, MIB, PeerClosed, RawConn  # noqa: E402
from harness import (  # noqa: E402  (harness adds Debian's dist-packages to sys.path)
    HELD,
    HOST,
    DaemonTestCase,
    WaitTimeout,
    access_log_keys,
    fetch,
    metric_sum,
    read_access_log,
    wait_until,
)

_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)
import hpack  # noqa: E402  (Debian's python3-hpack, with python3-h2)

from test_tls import TestCA  # noqa: E402

# --------------------------------------------------------------------------- RFC 9113 constants

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FRAME_NAMES = ["DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY",
               "WINDOW_UPDATE", "CONTINUATION"]
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
REFUSED_STREAM = 0x7
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535

ABUSE = "smockron_proxy_http2_abuse_total"
HTTP_REQUESTS = "smockron_proxy_http_requests_total"
GONE = "smockron_proxy_held_client_disconnects_total"
TOO_LARGE = "smockron_proxy_header_too_large_total"
POLICIES = "smockron_proxy_control_policies_total"


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame as bytes, whatever it says (invalid ones included)."""
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream_id & 0x7FFFFFFF) \
        + bytes(payload)


def settings_frame(pairs=(), ack: bool = False) -> bytes:
    return frame(SETTINGS, FLAG_ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def ping_frame(opaque: bytes = b"\0" * 8, ack: bool = False) -> bytes:
    return frame(PING, FLAG_ACK if ack else 0, 0, opaque)


def rst_frame(stream_id: int, code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def priority_frame(stream_id: int, depends_on: int = 0, weight: int = 15) -> bytes:
    return frame(PRIORITY, 0, stream_id, struct.pack(">IB", depends_on, weight))


def data_frame(stream_id: int, data: bytes = b"", end_stream: bool = False) -> bytes:
    return frame(DATA, FLAG_END_STREAM if end_stream else 0, stream_id, data)


def grpc_message(payload: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\0" + struct.pack(">I", len(payload)) + payload


# --------------------------------------------------------------------------- the frame-level client


class Stream:
    """What a client stream received."""

    def __init__(self, sid: int, send_window: int, recv_window: int):
        self.id = sid
        self.headers: list[tuple[str, str]] | None = None  # the final response head
        self.headers_end_stream = False  # that head ended the stream (gRPC trailers-only)
        self.informational: list[list[tuple[str, str]]] = []
        self.trailers: list[tuple[str, str]] | None = None
        self.data = bytearray()
        self.data_bytes = 0  # flow-controlled bytes received (padding included)
        self.data_frames = 0
        self.ended = False  # END_STREAM received
        self.reset: int | None = None  # RST_STREAM error code received
        self.done_seq: int | None = None  # order among the client's streams that ended
        self.send_window = send_window
        self.recv_window = recv_window
        self.unacked = 0  # received, not yet given back by a WINDOW_UPDATE

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    @property
    def status(self) -> int | None:
        v = self.header(":status")
        return int(v) if v is not None else None

    def header(self, name: str) -> str | None:
        for k, v in self.headers or ():
            if k == name:
                return v
        return None

    def header_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers or () if k == name]

    def trailer(self, name: str) -> str | None:
        for k, v in self.trailers or ():
            if k == name:
                return v
        return None

    def json(self):
        return json.loads(bytes(self.data))

    def __repr__(self):
        return (f"<Stream {self.id} headers={self.headers} trailers={self.trailers} data={bytes(self.data[:200])!r}"
                f" ({self.data_bytes} B) ended={self.ended} reset={self.reset}>")


class H2Client:
    """One HTTP/2 client connection with exact control over the frames sent.

    Plain (prior knowledge) or TLS (ALPN; `alpn` is what is offered, `self.alpn` what
    was chosen). The client preface and a SETTINGS frame are sent at once; with
    `handshake` the constructor waits for the server's SETTINGS and its ACK of ours.

    Received frames are parsed as they come (pump/wait): the server's SETTINGS and
    PINGs are acknowledged, header blocks decoded (hpack), streams' heads, data,
    trailers and resets recorded, GOAWAY and the connection's end noted. Flow control:
    what the server may send is tracked, and any DATA beyond the window the client
    gave is recorded in `violations`; with auto_window the client gives back what it
    received (a WINDOW_UPDATE once half a default window is consumed, on the
    connection and on the stream, as real clients do); without, only window() does.
    Request bodies honour the server's windows (send_data waits for WINDOW_UPDATEs).
    """

    def __init__(self, port: int, *, tls_ca: str | None = None, sni: str = "localhost", alpn=("h2",),
                 timeout: float = 10.0, settings=((SETTINGS_ENABLE_PUSH, 0),), auto_window: bool = True,
                 handshake: bool = True, preface: bool = True):
        self.timeout = timeout
        sock = socket.create_connection((HOST, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.alpn = None
        if tls_ca is not None:
            ctx = ssl.create_default_context(cafile=tls_ca)
            ctx.set_alpn_protocols(list(alpn))
            try:
                sock = ctx.wrap_socket(sock, server_hostname=sni)
            except BaseException:
                sock.close()
                raise
            self.alpn = sock.selected_alpn_protocol()
        self.sock = sock
        self.buf = bytearray()
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.dec.max_header_list_size = 1 << 20
        self.streams: dict[int, Stream] = {}
        self.next_id = 1
        self.frames: list[tuple[str, int, int, int]] = []  # (type, flags, stream, length) received, in order
        self.server_settings: dict[int, int] = {}
        self.server_settings_frames = 0
        self.settings_acks = 0
        self.ping_acks: list[bytes] = []
        self.goaway: tuple[int, int, bytes] | None = None  # (last stream id, error code, debug data)
        self.closed = False
        self.close_error: str | None = None
        self.send_failed: str | None = None
        self.violations: list[str] = []
        self.auto_window = auto_window
        self.auto_ack = True
        self.window_threshold = DEFAULT_WINDOW // 2
        self.conn_send_window = DEFAULT_WINDOW
        self.conn_recv_window = DEFAULT_WINDOW
        self.conn_unacked = 0
        self.local_settings = dict(settings)
        self.local_initial_window = DEFAULT_WINDOW  # ours applies once acknowledged
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.window_updates_sent = 0
        self._block: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self._done_seq = 0
        if preface:
            self.send(PREFACE + settings_frame(settings))
            if handshake:
                self.handshake()

    # ---- lifetime
    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- sending
    def send(self, data: bytes, tolerate_close: bool = False) -> None:
        """Writes bytes; with tolerate_close a connection the server already closed is
        noted (send_failed) instead of raised: a flood may be cut off midway."""
        try:
            self.sock.sendall(data)
        except OSError as e:
            if not tolerate_close or isinstance(e, (TimeoutError, socket.timeout)):
                raise
            self.send_failed = repr(e)

    def _stream(self, sid: int) -> Stream:
        st = self.streams.get(sid)
        if st is None:
            st = self.streams[sid] = Stream(sid, self.peer_initial_window, self.local_initial_window)
        return st

    def new_stream_id(self) -> int:
        sid = self.next_id
        self.next_id += 2
        return sid

    def header_frames(self, sid: int, headers, end_stream: bool, continuations: int = 0) -> bytes:
        """HEADERS (+ CONTINUATION) frames for one header block: split by the server's
        largest frame, and into 1 + `continuations` frames at least."""
        block = self.enc.encode(list(headers))
        pieces = max(1 + continuations, -(-len(block) // self.peer_max_frame))
        if len(block) < pieces:
            raise ValueError(f"a header block of {len(block)} bytes cannot fill {pieces} frames")
        size = -(-len(block) // pieces)
        parts = [block[i * size:(i + 1) * size] for i in range(pieces)]
        parts = [p for p in parts if p] or [b""]
        while len(parts) < pieces:  # the split left the last frames empty: take a byte for each
            big = max(range(len(parts)), key=lambda i: len(parts[i]))
            parts.insert(big + 1, parts[big][-1:])
            parts[big] = parts[big][:-1]
        out = bytearray()
        for i, p in enumerate(parts):
            flags = FLAG_END_HEADERS if i == len(parts) - 1 else 0
            if i == 0:
                out += frame(HEADERS, flags | (FLAG_END_STREAM if end_stream else 0), sid, p)
            else:
                out += frame(CONTINUATION, flags, sid, p)
        return bytes(out)

    def request(self, path: str, method: str = "GET", headers=(), body: bytes | None = None, end_stream: bool = True,
                authority: str | None = "test.local", scheme: str = "http", continuations: int = 0,
                sid: int | None = None) -> int:
        """Opens a stream: its head (and body, honouring flow control). end_stream=False
        leaves the stream open for send_data(). Returns the stream id."""
        sid = sid or self.new_stream_id()
        self._stream(sid)
        hdrs = [(":method", method), (":scheme", scheme)]
        if authority is not None:
            hdrs.append((":authority", authority))
        hdrs.append((":path", path))
        hdrs += list(headers)
        self.send(self.header_frames(sid, hdrs, end_stream and body is None, continuations))
        if body is not None:
            self.send_data(sid, body, end_stream=end_stream)
        return sid

    def send_data(self, sid: int, data: bytes, end_stream: bool = True, timeout: float | None = None) -> None:
        """DATA frames within the server's windows (connection and stream), waiting for
        its WINDOW_UPDATEs as needed."""
        st = self._stream(sid)
        if not data:
            self.send(data_frame(sid, b"", end_stream))
            return
        view = memoryview(data)
        pos = 0
        while pos < len(data):
            n = min(len(data) - pos, self.conn_send_window, st.send_window, self.peer_max_frame)
            if n <= 0:
                self.wait(lambda: (self.conn_send_window > 0 and st.send_window > 0) or st.done,
                          timeout or self.timeout, f"a send window on stream {sid}")
                if st.done:
                    raise AssertionError(f"stream {sid} ended while its body was being sent: {st}")
                continue
            last = pos + n == len(data)
            self.send(data_frame(sid, view[pos:pos + n], end_stream and last))
            self.conn_send_window -= n
            st.send_window -= n
            pos += n

    def rst(self, sid: int, code: int = CANCEL) -> None:
        self.send(rst_frame(sid, code))

    def ping(self, opaque: bytes = b"smockron") -> None:
        self.send(ping_frame(opaque))

    def window(self, sid: int, increment: int) -> None:
        """Opens the window of stream `sid` (0: the connection) by `increment`."""
        self.send(window_update_frame(sid, increment))
        self.window_updates_sent += 1
        if sid == 0:
            self.conn_recv_window += increment
            self.conn_unacked = max(0, self.conn_unacked - increment)
        else:
            st = self._stream(sid)
            st.recv_window += increment
            st.unacked = max(0, st.unacked - increment)

    # ---- receiving
    def pump(self, deadline: float) -> bool:
        """Reads what arrives before `deadline` (one read) and handles its frames.
        False if nothing came; the connection's end sets `closed`."""
        if self.closed:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 20)
        except (TimeoutError, socket.timeout):
            return False
        except ssl.SSLWantReadError:
            return False
        except OSError as e:  # reset, TLS alert or EOF without close_notify
            self.closed = True
            self.close_error = repr(e)
            return True
        if not data:
            self.closed = True
            return True
        self.buf += data
        self._parse()
        return True

    def wait(self, predicate, timeout: float | None = None, what: str = "a condition"):
        """Handles frames until predicate() is true (returned). The connection closing
        first, or the deadline passing, fails with what was received."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            v = predicate()
            if v:
                return v
            if self.closed:
                raise AssertionError(f"the connection closed while waiting for {what} ({self.close_error}); "
                                     f"GOAWAY {self.goaway}; {self.summary()}")
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"timed out waiting for {what}; GOAWAY {self.goaway}; {self.summary()}")
            self.pump(deadline)

    def wait_closed(self, timeout: float | None = None) -> None:
        """Until the server has closed the connection (frames before it are handled)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while not self.closed:
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"the connection is still open; GOAWAY {self.goaway}; {self.summary()}")
            self.pump(deadline)

    def response(self, sid: int, timeout: float | None = None) -> Stream:
        st = self._stream(sid)
        self.wait(lambda: st.done, timeout, f"the end of stream {sid}")
        return st

    def get(self, path: str, timeout: float | None = None, **kw) -> Stream:
        return self.response(self.request(path, **kw), timeout)

    def handshake(self, timeout: float | None = None) -> None:
        self.wait(lambda: self.server_settings_frames > 0 and self.settings_acks > 0, timeout,
                  "the server's SETTINGS and its ACK of ours")

    def summary(self) -> str:
        frames = ", ".join(f"{t}[{s}]{'+' + hex(f) if f else ''}({n})" for t, f, s, n in self.frames[-30:])
        return f"last frames received: {frames}; streams: {list(self.streams.values())[-4:]}"

    # ---- frame handling
    def _parse(self) -> None:
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[0:3], "big")
            if len(self.buf) < 9 + length:
                return
            ftype, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.buf[9:9 + length])
            del self.buf[:9 + length]
            self.frames.append((FRAME_NAMES[ftype] if ftype < len(FRAME_NAMES) else f"type{ftype}", flags, sid,
                                length))
            self._on_frame(ftype, flags, sid, payload)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & FLAG_PADDED:
            pad = payload[0]
            return payload[1:len(payload) - pad]
        return payload

    def _finish(self, st: Stream) -> None:
        if st.done_seq is None:
            self._done_seq += 1
            st.done_seq = self._done_seq

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block is not None and ftype != CONTINUATION:
            self.violations.append(f"{FRAME_NAMES[ftype] if ftype < 10 else ftype} inside a header block")
        if ftype == DATA:
            st = self._stream(sid)
            n = len(payload)
            self.conn_recv_window -= n
            st.recv_window -= n
            if self.conn_recv_window < 0 or st.recv_window < 0:
                self.violations.append(f"DATA beyond the window on stream {sid}: connection {self.conn_recv_window},"
                                       f" stream {st.recv_window}")
            body = self._unpad(flags, payload)
            st.data += body
            st.data_bytes += n
            st.data_frames += 1
            if flags & FLAG_END_STREAM:
                st.ended = True
                self._finish(st)
            self.conn_unacked += n
            st.unacked += n
            if self.auto_window:
                if st.unacked >= self.window_threshold and not st.done:
                    self.window(sid, st.unacked)
                if self.conn_unacked >= self.window_threshold:
                    self.window(0, self.conn_unacked)
        elif ftype in (HEADERS, PUSH_PROMISE):
            if ftype == PUSH_PROMISE:
                self.violations.append("PUSH_PROMISE although SETTINGS_ENABLE_PUSH = 0")
                payload = self._unpad(flags, payload)[4:]
            else:
                payload = self._unpad(flags, payload)
                if flags & FLAG_PRIORITY:
                    payload = payload[5:]
            self._block = (sid, flags, bytearray(payload))
            if flags & FLAG_END_HEADERS:
                self._end_block()
        elif ftype == CONTINUATION:
            if self._block is None or self._block[0] != sid:
                self.violations.append(f"CONTINUATION on stream {sid} outside a header block")
                return
            self._block[2].extend(payload)
            if flags & FLAG_END_HEADERS:
                self._end_block()
        elif ftype == RST_STREAM:
            st = self._stream(sid)
            st.reset = struct.unpack(">I", payload[:4])[0]
            self._finish(st)
        elif ftype == SETTINGS:
            if flags & FLAG_ACK:
                self.settings_acks += 1
                if SETTINGS_INITIAL_WINDOW_SIZE in self.local_settings:
                    self.local_initial_window = self.local_settings[SETTINGS_INITIAL_WINDOW_SIZE]
                return
            self.server_settings_frames += 1
            for i in range(0, len(payload) - 5, 6):
                k, v = struct.unpack(">HI", payload[i:i + 6])
                self.server_settings[k] = v
                if k == SETTINGS_HEADER_TABLE_SIZE:
                    self.enc.header_table_size = v
                elif k == SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = v - self.peer_initial_window
                    self.peer_initial_window = v
                    for st in self.streams.values():
                        st.send_window += delta
                elif k == SETTINGS_MAX_FRAME_SIZE:
                    self.peer_max_frame = v
            if self.auto_ack:
                self.send(settings_frame(ack=True), tolerate_close=True)
        elif ftype == PING:
            if flags & FLAG_ACK:
                self.ping_acks.append(payload)
            elif self.auto_ack:
                self.send(ping_frame(payload, ack=True), tolerate_close=True)
        elif ftype == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            self.goaway = (last & 0x7FFFFFFF, code, payload[8:])
        elif ftype == WINDOW_UPDATE:
            inc = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            if sid == 0:
                self.conn_send_window += inc
            else:
                self._stream(sid).send_window += inc

    def _end_block(self) -> None:
        sid, flags, block = self._block
        self._block = None
        headers = [(k if isinstance(k, str) else k.decode(), v if isinstance(v, str) else v.decode("latin-1"))
                   for k, v in self.dec.decode(bytes(block))]
        st = self._stream(sid)
        status = next((v for k, v in headers if k == ":status"), None)
        if st.headers is None and status is not None and status.startswith("1"):
            st.informational.append(headers)
        elif st.headers is None:
            st.headers = headers
            st.headers_end_stream = bool(flags & FLAG_END_STREAM)
        else:
            st.trailers = headers
        if flags & FLAG_END_STREAM:
            st.ended = True
            self._finish(st)


def header_values(echo: dict, name: str) -> list[str]:
    """A header's values as the backend (backends.py echo) received it."""
    return [v for k, v in echo["headers"] if k.lower() == name.lower()]


def abuse(proxy, kind: str) -> float:
    return metric_sum(proxy.metrics(), ABUSE, kind=kind)


def requests_by_protocol(proxy, protocol: str) -> float:
    return metric_sum(proxy.metrics(), HTTP_REQUESTS, protocol=protocol)


def run(cmd: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


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


if __name__ == "__main__":
    unittest.main()


class RefusingUpstream:
    """An h2c server (python3-h2) on 127.0.0.1 that answers its first stream with
    RST_STREAM(REFUSED_STREAM), as a server going away does with streams it did not
    process (RFC 9113 8.7), and 200 "served" to every later one. Counts the streams."""

    def __init__(self):
        import threading

        import h2.config
        import h2.connection
        import h2.events
        self._h2 = (h2.config, h2.connection, h2.events)
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.streams = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        cfg, conn_mod, events = self._h2
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                s, _ = self.sock.accept()
            except OSError:
                continue
            s.settimeout(0.2)
            conn = conn_mod.H2Connection(cfg.H2Configuration(client_side=False, header_encoding="utf-8"))
            conn.initiate_connection()
            s.sendall(conn.data_to_send())
            while not self.stop:
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    break
                if not data:
                    break
                for ev in conn.receive_data(data):
                    if isinstance(ev, events.RequestReceived):
                        self.streams += 1
                        if self.streams == 1:
                            conn.reset_stream(ev.stream_id, error_code=REFUSED_STREAM)
                        else:
                            conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", "6")])
                            conn.send_data(ev.stream_id, b"served", end_stream=True)
                s.sendall(conn.data_to_send())
            s.close()

    def close(self):
        self.stop = True
        self.thread.join(5)
        self.sock.close()


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
