"""HTTP/1.1 clients for the tests, loopback only: RawConn and request_bytes
(exact bytes on one connection, a strict response reader), fetch (one request
on a fresh connection) and http_get (http.client, for admin endpoints)."""
from __future__ import annotations

import collections
import http.client
import json
import socket
import time

from lib.ports import HOST, OwnsSocket

HttpResponse = collections.namedtuple("HttpResponse", "status headers body")


def http_get(port: int, path: str, timeout: float = 2.0, host: str = HOST, headers: dict | None = None) -> HttpResponse:
    """GET http://127.0.0.1:port/path. Raises OSError on connection problems."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError("integration tests only talk to the loopback interface")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
        return HttpResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()


class Response:
    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes, raw_head: bytes):
        self.status = status
        self.reason = reason
        self.header_list = headers
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body
        self.raw_head = raw_head

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<Response {self.status} {self.headers} body={self.body[:200]!r}>"


class PeerClosed(ConnectionError):
    pass


class RawConn(OwnsSocket):
    """One client TCP connection with exact control over the bytes sent."""

    def __init__(self, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.timeout = timeout

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline passed")
        self.sock.settimeout(left)
        data = self.sock.recv(1 << 20)
        if not data:
            raise PeerClosed("connection closed by peer")
        self.buf += data

    def read_until(self, marker: bytes, deadline: float) -> bytes:
        while (i := self.buf.find(marker)) < 0:
            self._fill(deadline)
        out = bytes(self.buf[: i + len(marker)])
        del self.buf[: i + len(marker)]
        return out

    def read_exact(self, n: int, deadline: float | None = None) -> bytes:
        deadline = deadline or time.monotonic() + self.timeout
        while len(self.buf) < n:
            self._fill(deadline)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_discard(self, n: int, deadline: float) -> int:
        """Reads and drops n bytes without keeping them (large bodies)."""
        got = min(n, len(self.buf))
        del self.buf[:got]
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            self.sock.settimeout(left)
            data = self.sock.recv(min(n - got, 1 << 20))
            if not data:
                raise PeerClosed("connection closed by peer")
            extra = len(data) - (n - got)
            if extra > 0:
                self.buf += data[len(data) - extra:]
            got += min(len(data), n - got)
        return got

    def read_head(self, timeout: float | None = None) -> tuple[int, str, list[tuple[str, str]], bytes]:
        deadline = time.monotonic() + (timeout or self.timeout)
        raw = self.read_until(b"\r\n\r\n", deadline)
        lines = raw[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.append((k.strip(), v.strip()))
        return status, reason, headers, raw

    def read_response(self, head_request: bool = False, timeout: float | None = None, keep_body: bool = True,
                      allow_interim: bool = False) -> Response:
        """The next response. 1xx are skipped unless allow_interim. Bodies by
        Content-Length, chunked, or until EOF (kept, or only counted: body = b'' and
        headers['x-body-bytes'] set when keep_body is False)."""
        timeout = timeout or self.timeout
        deadline = time.monotonic() + timeout
        while True:
            status, reason, headers, raw = self.read_head(deadline - time.monotonic())
            if 100 <= status < 200 and status != 101 and not allow_interim:
                continue
            break
        h = {k.lower(): v for k, v in headers}
        body = bytearray()
        count = 0
        if head_request or status in (204, 304) or 100 <= status < 200:
            pass
        elif "chunked" in h.get("transfer-encoding", "").lower():
            while True:
                line = self.read_until(b"\r\n", deadline)
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.read_until(b"\r\n", deadline) != b"\r\n":
                        pass
                    break
                if keep_body:
                    body += self.read_exact(size, deadline)
                else:
                    self.read_discard(size, deadline)
                count += size
                self.read_exact(2, deadline)
        elif "content-length" in h:
            n = int(h["content-length"])
            if keep_body:
                body += self.read_exact(n, deadline)
            else:
                self.read_discard(n, deadline)
            count = n
        else:
            while True:
                try:
                    self._fill(deadline)
                except PeerClosed:
                    break
            body += self.buf
            count = len(self.buf)
            self.buf.clear()
        if not keep_body:
            headers = headers + [("X-Body-Bytes", str(count))]
        return Response(status, reason, headers, bytes(body), raw)

    def wait_closed(self, timeout: float) -> bool:
        """True if the peer closes (EOF or reset) within timeout; data received meanwhile is buffered."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except PeerClosed:
                return True
            except ConnectionResetError:
                return True
            except (socket.timeout, TimeoutError):
                return False


def request_bytes(method: str = "GET", target: str = "/", headers=None, body: bytes = b"",
                  host: str = "test.local", version: str = "HTTP/1.1") -> bytes:
    """A request as exact bytes. headers: list of (name, value); Host first unless host is None;
    Content-Length is added for a non-empty body unless one is given."""
    lines = [f"{method} {target} {version}"]
    hdrs = list(headers or [])
    if host is not None:
        lines.append(f"Host: {host}")
    if body and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in hdrs):
        hdrs.append(("Content-Length", str(len(body))))
    lines += [f"{k}: {v}" for k, v in hdrs]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def fetch(port: int, target: str = "/", headers=(), method: str = "GET", body: bytes = b"", key: str | None = None,
          timeout: float = 5.0, host: str = "test.local"):
    """One request on a fresh connection (X-API-Key: key if given): (Response, elapsed seconds)."""
    hdrs = list(headers)
    if key is not None:
        hdrs.append(("X-API-Key", key))
    t0 = time.monotonic()
    with RawConn(port, timeout) as c:
        c.send(request_bytes(method, target, hdrs, body, host))
        r = c.read_response(head_request=method == "HEAD", timeout=timeout)
    return r, time.monotonic() - t0
