#!/usr/bin/env python3
"""A tiny demo backend for the quick start: answers every request with 200
and a line saying what it saw. Usage: demo_backend.py [PORT] (default 9000)."""
import http.server
import socket
import sys
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body leave in separate writes: without TCP_NODELAY, Nagle
        # plus the peer's delayed ACK adds ~40 ms to every keep-alive response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = (f"demo backend: {self.command} {self.path} at {time.strftime('%H:%M:%S')}"
                f" (X-Forwarded-For: {self.headers.get('X-Forwarded-For', '-')})\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()
