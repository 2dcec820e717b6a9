"""Upstream servers that run in the test's own process (threads, 127.0.0.1): an
HTTP/1.1 server counting connections, h2c servers (python3-h2): one answering
every stream, one refusing its first stream unprocessed."""
from __future__ import annotations

import socket
import threading
import urllib.parse

from lib.h2frames import REFUSED_STREAM
from lib.ports import HOST


class _ThreadedServer:
    """A listening socket on 127.0.0.1, one thread accepting, one thread per connection
    (serve(sock) in a subclass). Counts the TCP connections it accepted."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(1024)  # a burst of connects is accepted, not dropped (SYN retries)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.connections = 0
        self._clients: list[socket.socket] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.1)
        while not self.stopped:
            try:
                s, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self._clients.append(s)
            threading.Thread(target=self._serve_guarded, args=(s,), daemon=True).start()

    def _serve_guarded(self, s: socket.socket):
        try:
            s.settimeout(0.2)
            self.serve(s)
        except OSError:
            pass
        finally:
            try:
                s.close()
            except OSError:
                pass

    def recv(self, s: socket.socket) -> bytes | None:
        """The next bytes; None when the peer or the server is done; b"" means "nothing yet"."""
        while not self.stopped:
            try:
                data = s.recv(65536)
            except (TimeoutError, socket.timeout):
                return b""
            return data or None
        return None

    def serve(self, s: socket.socket) -> None:
        raise NotImplementedError

    def close(self):
        self.stopped = True
        self.thread.join(5)
        self.sock.close()
        with self.lock:
            clients = list(self._clients)
        for s in clients:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class CountingBackend(_ThreadedServer):
    """An HTTP/1.1 server that counts the TCP connections it accepts (`connections`)
    and the requests it reads (`targets`), answering each 200 "counted" (keep-alive;
    request bodies by Content-Length only)."""

    def __init__(self):
        self.targets: list[str] = []
        super().__init__()

    def serve(self, s):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = self.recv(s)
                if data is None:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            while len(buf) < length:
                data = self.recv(s)
                if data is None:
                    return
                buf += data
            buf = buf[length:]
            with self.lock:
                self.targets.append(lines[0].split(" ")[1] if " " in lines[0] else lines[0])
            s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\n\r\ncounted")


class H2cBackend(_ThreadedServer):
    """An h2c server (python3-h2, prior knowledge) answering every stream 200 with the
    body "h2c <path>" once the request has ended. Records the paths it served (`paths`)
    and each request's head (`requests`: {"path", "headers"}). A path /tokens?n=N is
    answered with x-tokens-used: N too (a backend reporting the units used, as
    lib/backends.py's /tokens does)."""

    def __init__(self):
        import h2.config
        import h2.connection
        import h2.events
        self._h2 = (h2.config, h2.connection, h2.events)
        self.paths: list[str] = []
        self.requests: list[dict] = []
        super().__init__()

    def serve(self, s):
        cfg, conn_mod, events = self._h2
        conn = conn_mod.H2Connection(cfg.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        s.sendall(conn.data_to_send())
        pending: dict[int, list[tuple[str, str]]] = {}
        while True:
            data = self.recv(s)
            if data is None:
                return
            if not data:
                continue
            for ev in conn.receive_data(data):
                if isinstance(ev, events.RequestReceived):
                    pending[ev.stream_id] = list(ev.headers)
                elif isinstance(ev, events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if isinstance(ev, events.StreamEnded) and ev.stream_id in pending:
                    headers = pending.pop(ev.stream_id)
                    path = dict(headers).get(":path", "")
                    with self.lock:
                        self.paths.append(path)
                        self.requests.append({"path": path, "headers": headers})
                    body = f"h2c {path}".encode()
                    extra = []
                    url = urllib.parse.urlsplit(path)
                    if url.path == "/tokens":
                        extra.append(("x-tokens-used", dict(urllib.parse.parse_qsl(url.query)).get("n", "1")))
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "text/plain"),
                                                     ("content-length", str(len(body)))] + extra)
                    conn.send_data(ev.stream_id, body, end_stream=True)
            s.sendall(conn.data_to_send())


class RefusingUpstream:
    """An h2c server (python3-h2) on 127.0.0.1 that answers its first stream with
    RST_STREAM(REFUSED_STREAM), as a server going away does with streams it did not
    process (RFC 9113 8.7), and 200 "served" to every later one. Counts the streams."""

    def __init__(self):
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
