"""H2Client: one HTTP/2 client connection (prior knowledge or TLS with ALPN) with
exact control over the frames sent (lib/h2frames.py), header blocks by hpack,
and what every stream received (Stream); flow control tracked both ways."""
from __future__ import annotations

import json
import socket
import ssl
import struct
import sys
import time

from lib.h2frames import (
    CANCEL,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    FLAG_ACK,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FLAG_PADDED,
    FLAG_PRIORITY,
    FRAME_NAMES,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    WINDOW_UPDATE,
    data_frame,
    frame,
    ping_frame,
    rst_frame,
    settings_frame,
    window_update_frame,
)
from lib.ports import HOST, OwnsSocket
from lib.timing import WaitTimeout

_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)
import hpack  # noqa: E402  (Debian's python3-hpack, with python3-h2)


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


class H2Client(OwnsSocket):
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
