"""The HTTP/1.1 test backend of smockron-proxy's integration tests (a process of its
own) and BackendProcess, which runs it; the raw-socket clients are in lib/http1.py.

Backend (python stdlib only, run as its own process so that its timing does not
depend on the test process's GIL):

    python3 lib/backends.py [PORT]    # serves on 127.0.0.1:PORT (default 0: any free port)
                                      # until SIGTERM; prints "ready PORT" once listening

Every request's arrival (wall clock, taken when the head has been parsed), its
method, target, headers and body size are logged; GET /__log on the backend
(directly, not through the proxy) returns the log as JSON, /__reset clears it.
What a request gets depends on its path:

    /ws                  WebSocket echo (RFC 6455 handshake, unmasked server frames)
    /slow?s=S            sleeps S seconds, then answers like /echo; GET /__inflight returns
                         {"now": {key: n}, "max": {key: n}}: /slow requests per X-API-Key
                         (and "*": all keys together) in progress now and at most at once
                         since the last /__reset
    /status/NNN          answers NNN (204 and 304 without a body)
    /stream?mib=N&mode=chunked|length   N MiB generated on the fly
    /chunks?n=N&gap=S    a chunked response of N chunks "part-<i>;", each its own
                         write, S seconds apart (exercises chunk-by-chunk relaying);
                         &trailers=1 ends it with CHUNK_TRAILERS after the last-chunk;
                         &framing=close sends the parts with neither Content-Length nor
                         Transfer-Encoding and closes the connection after the last one
    /keepalive-then-close answers like /echo (keep-alive, Content-Length), then closes
    /tokens?n=N&where=header|trailer   answers like /echo, reporting N units used in
                         X-Tokens-Used: in the head, or as a trailer of a chunked body
    /upload, anything else (/echo...)   reads the whole body (Content-Length or
                         chunked), answers JSON {method, target, headers, body_bytes,
                         body, raw_body, trailers}; body is the text (latin-1) of bodies
                         up to 4 KiB, else null; raw_body the bytes as received (chunk
                         framing and trailers included) when up to 4 KiB, else null;
                         trailers the raw trailer lines of a chunked body ("" if none)

Test side: BackendProcess (start/stop by PID, log access) and the WebSocket
frame helpers (clients' too). Only the standard library: this file runs as a script.
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import select
import signal
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"
MIB = 1 << 20
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_BLOCK = bytes(range(256)) * 4096  # 1 MiB of a recognisable pattern
#: Trailer section /chunks?trailers=1 sends after its last-chunk (exact bytes).
CHUNK_TRAILERS = b"X-Checksum: abc\r\nX-Trailer-Two: 2\r\n"


# =============================================================================== WebSocket frames


def ws_accept(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def ws_frame(opcode: int, payload: bytes, mask: bool) -> bytes:
    """One final frame. Clients must mask (RFC 6455 5.3), servers must not."""
    head = bytearray([0x80 | opcode])
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        head.append(mbit | n)
    elif n < 65536:
        head.append(mbit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(mbit | 127)
        head += struct.pack("!Q", n)
    if not mask:
        return bytes(head) + payload
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes(head) + key + masked


def ws_read_frame(read_exact) -> tuple[int, bytes, bool]:
    """(opcode, payload, was_masked) of the next frame; read_exact(n) returns exactly n bytes."""
    b0, b1 = read_exact(2)
    opcode = b0 & 0x0F
    masked = bool(b1 & 0x80)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", read_exact(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", read_exact(8))[0]
    key = read_exact(4) if masked else None
    payload = read_exact(n) if n else b""
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return opcode, payload, masked


# =============================================================================== the backend server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "smockron-test-backend"
    # The head and the body are separate writes: without TCP_NODELAY the body
    # waits for the peer's delayed ACK (~40 ms), which would be every response's.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet
        pass

    # Every method goes through one dispatcher.
    def do_GET(self):
        self._dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    # ---- helpers
    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json", extra=()):
        self.send_response(status)
        for k, v in extra:
            self.send_header(k, v)
        if status not in (204, 304) and not (100 <= status < 200):
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and status not in (204, 304):
            self.wfile.write(body)

    def _client_cert(self):
        """The common name of the TLS client's certificate (a TLS backend asking for one), else None."""
        getpeercert = getattr(self.connection, "getpeercert", None)
        cert = getpeercert() if getpeercert else None
        if not cert:
            return None
        return next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), None)

    def _read_body(self) -> tuple[int, bytes, bytes | None, bytes]:
        """Reads the request body; returns its size, its first KEEP bytes, the raw bytes
        received (chunk framing and trailers included; None beyond KEEP) and the raw
        trailer lines of a chunked body."""
        te = self.headers.get("Transfer-Encoding", "")
        total = 0
        kept = bytearray()
        KEEP = 4096
        if "chunked" in te.lower():
            raw = bytearray()
            trailers = bytearray()

            def keep_raw(b: bytes) -> None:
                if len(raw) <= KEEP:
                    raw.extend(b)

            while True:
                line = self.rfile.readline(65537)
                keep_raw(line)
                if not line:
                    raise ConnectionError("EOF in chunk size")
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while True:
                        t = self.rfile.readline(65537)
                        keep_raw(t)
                        if t in (b"\r\n", b"\n", b""):
                            break
                        trailers += t
                    return total, bytes(kept), (bytes(raw) if len(raw) <= KEEP else None), bytes(trailers)
                while size:
                    got = self.rfile.read(min(size, MIB))
                    if not got:
                        raise ConnectionError("EOF in chunk")
                    keep_raw(got)
                    size -= len(got)
                    total += len(got)
                    if len(kept) < KEEP:
                        kept += got[: KEEP - len(kept)]
                crlf = self.rfile.readline(3)
                keep_raw(crlf)
                if crlf not in (b"\r\n", b"\n"):
                    raise ConnectionError("chunk data not followed by CRLF")
        n = int(self.headers.get("Content-Length") or 0)
        while total < n:
            got = self.rfile.read(min(n - total, MIB))
            if not got:
                raise ConnectionError("EOF in body")
            total += len(got)
            if len(kept) < KEEP:
                kept += got[: KEEP - len(kept)]
        return total, bytes(kept), (bytes(kept) if total <= KEEP else None), b""

    def _echo(self, entry):
        body = json.dumps({"method": self.command, "target": self.path, "headers": entry["headers"],
                           "body_bytes": entry["body_bytes"], "body": entry["body"],
                           "raw_body": entry["raw_body"], "trailers": entry["trailers"]}).encode()
        self._send(200, body)

    # ---- dispatch
    def _dispatch(self):
        arrived = time.time()
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        srv = self.server
        if url.path == "/__log":
            with srv.lock:
                body = json.dumps(srv.log).encode()
            return self._send(200, body)
        if url.path == "/__reset":
            with srv.lock:
                srv.log.clear()
                srv.max_inflight.clear()
            return self._send(200, b"{}")
        if url.path == "/__inflight":
            with srv.lock:
                body = json.dumps({"now": srv.inflight, "max": srv.max_inflight}).encode()
            return self._send(200, body)
        if url.path == "/__ping":
            return self._send(200, b"{}")
        entry = {"t": arrived, "method": self.command, "target": self.path,
                 "headers": [[k, v] for k, v in self.headers.items()],
                 "key": self.headers.get("X-API-Key"), "complete": False, "body_bytes": 0, "body": None,
                 "raw_body": None, "trailers": "", "client_cert": self._client_cert()}
        with srv.lock:
            srv.log.append(entry)
        try:
            size, kept, raw, trailers = self._read_body()
        except (ConnectionError, ValueError) as e:
            entry["error"] = repr(e)
            self.close_connection = True
            return
        entry["body_bytes"] = size
        entry["body"] = kept.decode("latin-1") if size <= len(kept) else None
        entry["raw_body"] = raw.decode("latin-1") if raw is not None else None
        entry["trailers"] = trailers.decode("latin-1")
        entry["complete"] = True

        if url.path == "/ws":
            return self._websocket()
        if url.path == "/slow":
            key = entry["key"] or ""
            with srv.lock:
                for k in (key, "*"):  # "*": every key together
                    srv.inflight[k] = srv.inflight.get(k, 0) + 1
                    srv.max_inflight[k] = max(srv.max_inflight.get(k, 0), srv.inflight[k])
            try:
                time.sleep(float(query.get("s", "2")))
            finally:
                with srv.lock:
                    srv.inflight[key] -= 1
                    srv.inflight["*"] -= 1
            return self._echo(entry)
        if url.path.startswith("/status/"):
            code = int(url.path.split("/")[2])
            return self._send(code, b"" if code in (204, 304) else b"status\n", "text/plain",
                              extra=[("ETag", '"v1"')] if code == 304 else [])
        if url.path == "/stream":
            return self._stream(int(query.get("mib", "1")), query.get("mode", "length"))
        if url.path == "/early-hints-then-close":
            # An interim response, then the connection ends without a final one.
            self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        if url.path == "/keepalive-then-close":
            # A complete keep-alive response (no Connection: close), then the
            # connection closes at once: the end of stream follows the data.
            self._echo(entry)
            self.close_connection = True
            return
        if url.path == "/tokens":
            used = query.get("n", "1")
            if query.get("where", "header") == "header":
                body = json.dumps({"tokens": used}).encode()
                return self._send(200, body, extra=[("X-Tokens-Used", used)])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Tokens-Used")
            self.end_headers()
            body = json.dumps({"tokens": used}).encode()
            self.wfile.write(b"%x\r\n%s\r\n0\r\nX-Tokens-Used: %s\r\n\r\n" % (len(body), body, used.encode()))
            return
        if url.path == "/chunks":
            return self._chunks(int(query.get("n", "3")), float(query.get("gap", "0.05")),
                                query.get("trailers") == "1", query.get("framing", "chunked"))
        return self._echo(entry)

    def _chunks(self, n: int, gap: float, trailers: bool = False, framing: str = "chunked"):
        close = framing == "close"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if close:  # the body ends where the connection does (RFC 9112 6.3, last rule)
            self.close_connection = True
        else:
            self.send_header("Transfer-Encoding", "chunked")
            if trailers:
                self.send_header("Trailer", "X-Checksum, X-Trailer-Two")
        self.end_headers()
        self.wfile.flush()
        for i in range(n):
            time.sleep(gap)
            part = f"part-{i};".encode()
            self.wfile.write(part if close else b"%x\r\n" % len(part) + part + b"\r\n")
        if close:
            return
        time.sleep(gap)
        self.wfile.write(b"0\r\n" + (CHUNK_TRAILERS if trailers else b"") + b"\r\n")

    def _stream(self, mib: int, mode: str):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if mode == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(mib * MIB))
        self.end_headers()
        if self.command == "HEAD":
            return
        for _ in range(mib):
            if mode == "chunked":
                self.wfile.write(b"%x\r\n" % len(_BLOCK) + _BLOCK + b"\r\n")
            else:
                self.wfile.write(_BLOCK)
        if mode == "chunked":
            self.wfile.write(b"0\r\n\r\n")

    def _websocket(self):
        key = self.headers.get("Sec-WebSocket-Key")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key:
            return self._send(400, b'{"error":"not a websocket request"}')
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", ws_accept(key))
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True

        def read_exact(n):
            data = self.rfile.read(n)
            if len(data) != n:
                raise ConnectionError("EOF")
            return data

        try:
            while True:
                opcode, payload, masked = ws_read_frame(read_exact)
                if not masked:  # RFC 6455: a server must close on an unmasked client frame
                    self.wfile.write(ws_frame(8, struct.pack("!H", 1002), mask=False))
                    return
                if opcode == 8:
                    self.wfile.write(ws_frame(8, payload[:2], mask=False))
                    return
                if opcode == 9:
                    self.wfile.write(ws_frame(10, payload, mask=False))
                elif opcode in (1, 2):
                    self.wfile.write(ws_frame(opcode, payload, mask=False))
        except (ConnectionError, OSError):
            return


class BackendServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, port: int, host: str = HOST):
        super().__init__((host, port), _Handler)
        self.lock = threading.Lock()
        self.log: list[dict] = []
        self.inflight: dict[str, int] = {}
        self.max_inflight: dict[str, int] = {}


def main(argv):
    port = int(argv[1]) if len(argv) > 1 else 0  # 0: any free port, reported on stdout
    srv = BackendServer(port, argv[2] if len(argv) > 2 else HOST)
    if len(argv) > 4:  # TLS: CERT KEY [CLIENT_CA: client certificates required]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(argv[3], argv[4])
        ctx.set_alpn_protocols(["http/1.1"])
        if len(argv) > 5:
            ctx.load_verify_locations(argv[5])
            ctx.verify_mode = ssl.CERT_REQUIRED
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stdout.write(f"ready {srv.server_address[1]}\n")
    sys.stdout.flush()
    srv.serve_forever(poll_interval=0.05)


# =============================================================================== test side


class BackendProcess:
    """One backend process on 127.0.0.1, stopped by PID.

    Without a port it binds port 0 itself and reports the port it got ("ready PORT"
    on stdout, read once at start-up): no window in which another process could take
    it. With a port (a restart on the same port) it binds that one. Its stderr goes to
    `workdir`/backend-<name>.stderr.log (inherited without a workdir), never to a pipe."""

    _ids = 0

    def __init__(self, port: int | None = None, workdir: str | None = None, host: str = HOST, tls=()):
        self.port = port
        self.tls = list(tls)  # (cert, key) or (cert, key, client_ca): HTTPS, client certificates required with a CA
        self.host = host  # another loopback address (127.0.0.2) only where a test needs two
        BackendProcess._ids += 1
        self.name = f"{os.getpid()}-{BackendProcess._ids}"
        self.log_path = os.path.join(workdir, f"backend-{self.name}.stderr.log") if workdir else None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "BackendProcess":
        """Starts the process (again, after stop() or kill(): on the same port) and waits
        until it listens."""
        err = open(self.log_path, "ab") if self.log_path else None
        try:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(self.port or 0), self.host,
                                          *self.tls],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        finally:
            if err is not None:
                err.close()
        try:
            line = self._read_line(self.proc.stdout.fileno(), time.monotonic() + timeout)
        finally:
            self.proc.stdout.close()  # nothing else is ever written to it
        if not line.startswith(b"ready "):
            code = self.proc.poll()
            self.stop()
            raise OSError(f"backend (port {self.port or 'any'}) did not start (exit {code}, said {line!r}): "
                          f"{self.stderr_tail()}")
        self.port = int(line.split()[1])
        return self

    def _read_line(self, fd: int, deadline: float) -> bytes:
        """The first line written on fd, b"" at EOF, whatever came when the deadline passed."""
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            data = os.read(fd, 256)
            if not data:
                break
            buf += data
        return buf

    def stderr_tail(self, n: int = 2000) -> str:
        if not self.log_path:
            return "(stderr inherited)"
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass

    close = stop

    def kill(self) -> None:
        """SIGKILL by PID (a crash). start() again serves on the same port."""
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)

    def _get(self, path: str, timeout: float = 2.0):
        if self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if len(self.tls) > 2:
                ctx.load_cert_chain(*self.tls[:2])  # the backend asks for a client certificate: its own will do
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def log(self) -> list[dict]:
        status, body = self._get("/__log")
        assert status == 200, status
        return json.loads(body)

    def reset(self) -> None:
        self._get("/__reset")

    def inflight(self) -> dict:
        """{"now": {key: n}, "max": {key: n}}: /slow requests in progress per X-API-Key, now and at most."""
        status, body = self._get("/__inflight")
        assert status == 200, status
        return json.loads(body)

    def requests(self, key: str | None = None, target_prefix: str | None = None) -> list[dict]:
        out = self.log()
        if key is not None:
            out = [e for e in out if e["key"] == key]
        if target_prefix is not None:
            out = [e for e in out if e["target"].startswith(target_prefix)]
        return out


if __name__ == "__main__":
    main(sys.argv)
