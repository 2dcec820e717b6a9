"""A gRPC server for the tests: grpcio (Debian's python3-grpcio) with generic
handlers on raw bytes (no protobuf), service smockron.test.Echo (Unary,
ServerStream, ClientStream, Bidi), recording every call it sees."""
from __future__ import annotations

import concurrent.futures
import hashlib
import sys
import threading

from lib.ports import HOST

_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)
import grpc  # noqa: E402  (Debian's python3-grpcio)

MIB = 1 << 20
SERVICE = "smockron.test.Echo"
UNARY = f"/{SERVICE}/Unary"
SERVER_STREAM = f"/{SERVICE}/ServerStream"
CLIENT_STREAM = f"/{SERVICE}/ClientStream"
BIDI = f"/{SERVICE}/Bidi"
#: Every call is made once (no retries, transparent or configured), never through an HTTP proxy.
CLIENT_OPTIONS = [("grpc.enable_retries", 0), ("grpc.enable_http_proxy", 0),
                  ("grpc.max_receive_message_length", 16 * MIB), ("grpc.max_send_message_length", 16 * MIB)]
CALL_TIMEOUT = 20.0  # seconds; every call has a deadline


def pattern(n: int, seed: int = 0) -> bytes:
    """n recognisable bytes."""
    block = bytes((i * 7 + seed) % 251 for i in range(4096))
    return (block * (n // len(block) + 1))[:n]


class EchoServer:
    """A grpcio server (generic handlers on bytes) on 127.0.0.1, recording the calls it sees."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None):
        self.lock = threading.Lock()
        self.calls: list[dict] = []
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16),
                                  options=[("grpc.max_receive_message_length", 16 * MIB),
                                           ("grpc.max_send_message_length", 16 * MIB)])
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(self.server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(self.client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(self.bidi),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        address = f"{HOST}:0"
        self.port = (self.server.add_secure_port(address, credentials) if credentials
                     else self.server.add_insecure_port(address))
        if not self.port:
            raise OSError("the gRPC server could not bind a port")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)

    def _record(self, method: str, context, first: bytes | None) -> dict:
        entry = {"method": method, "metadata": {k: v for k, v in context.invocation_metadata()},
                 "first": first[:64] if first is not None else None}
        with self.lock:
            self.calls.append(entry)
        return entry

    def seen(self, key: str | None = None, method: str | None = None) -> list[dict]:
        with self.lock:
            return [c for c in self.calls
                    if (key is None or c["metadata"].get("x-key") == key) and (method is None or c["method"] == method)]

    # ---- the methods
    def unary(self, request: bytes, context):
        self._record("Unary", context, request)
        if request.startswith(b"abort:"):
            context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        initial = [("x-initial", "unary")]
        if request.startswith(b"tokens:"):  # b"tokens:N": N units used, reported in x-tokens-used
            initial.append(("x-tokens-used", request[len(b"tokens:"):].decode()))
        context.send_initial_metadata(initial)
        context.set_trailing_metadata([("x-trailer", "unary")])
        return b"echo:" + request

    def server_stream(self, request: bytes, context):
        """request b"COUNT,SIZE": COUNT messages of SIZE bytes, message i filled with byte i."""
        self._record("ServerStream", context, request)
        count, size = (int(x) for x in request.split(b","))
        context.set_trailing_metadata([("x-trailer", "server-stream")])
        for i in range(count):
            yield bytes([i % 256]) * size

    def client_stream(self, request_iterator, context):
        """b"COUNT:BYTES:SHA256" of the messages received."""
        entry = self._record("ClientStream", context, None)
        n, total, h = 0, 0, hashlib.sha256()
        for m in request_iterator:
            if entry["first"] is None:
                entry["first"] = m[:64]
            n += 1
            total += len(m)
            h.update(m)
        context.set_trailing_metadata([("x-trailer", "client-stream")])
        return b"%d:%d:" % (n, total) + h.hexdigest().encode()

    def bidi(self, request_iterator, context):
        self._record("Bidi", context, None)
        for m in request_iterator:
            yield b"echo:" + m
