"""A loopback OpenTelemetry collector for tests: an HTTP server in the test's
own process taking OTLP/HTTP JSON on POST /v1/traces, and checking every
request against the OTLP schema (lib/otlp_proto, compiled at test time by
Debian's protoc for Debian's python3-protobuf) the way OTLP/JSON differs from
protobuf's own JSON mapping: trace and span ids are lowercase hex (16 and 8
bytes, not all zeros), 64-bit integers may be strings, enums are numbers,
unknown fields are an error. A request that fails the check is answered 400
and kept in `invalid`; a valid one is answered 200 and its spans kept.

    with OtlpReceiver() as otlp:
        ... daemon with trace_endpoint = otlp.url ...
        wait_until(lambda: otlp.spans(name="smockron.hold"))
"""
from __future__ import annotations

import base64
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lib.envoy_stubs import compile_protos  # also puts Debian's python3-protobuf on sys.path

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "otlp_proto")
_HEX = re.compile(r"^[0-9a-f]*$")


def _messages():
    """The generated ExportTraceServiceRequest (compiled once per process)."""
    compile_protos(PROTO_DIR, "opentelemetry", grpc=False)
    from google.protobuf import json_format  # noqa: E402
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402
    return json_format, trace_service_pb2


def _id_to_base64(value, size: int, what: str) -> str:
    """An OTLP/JSON id (lowercase hex of `size` bytes) as protobuf's JSON bytes (base64)."""
    if not isinstance(value, str) or len(value) != 2 * size or not _HEX.match(value):
        raise ValueError(f"{what} {value!r} is not {size} bytes of lowercase hex")
    raw = bytes.fromhex(value)
    if raw == bytes(size):
        raise ValueError(f"{what} is all zeros (invalid)")
    return base64.b64encode(raw).decode()


def validate(body: bytes):
    """The ExportTraceServiceRequest `body` holds; ValueError when it is not a valid OTLP/JSON one."""
    json_format, pb = _messages()
    doc = json.loads(body)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                span["traceId"] = _id_to_base64(span.get("traceId"), 16, "traceId")
                span["spanId"] = _id_to_base64(span.get("spanId"), 8, "spanId")
                if "parentSpanId" in span:
                    span["parentSpanId"] = _id_to_base64(span["parentSpanId"], 8, "parentSpanId")
    request = pb.ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, request, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        raise ValueError(str(e)) from e
    return request


def attributes(span) -> dict:
    """A span's attributes as a dict of Python values."""
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


class OtlpReceiver:
    """POST /v1/traces on 127.0.0.1 (a port of its own); `fail` = True answers 503."""

    def __init__(self):
        _messages()  # compiled before the first request, not inside a handler
        self._lock = threading.Lock()
        self._spans: list = []  # (service.name, span)
        self.invalid: list[str] = []
        self.requests = 0
        self.fail = False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests += 1
                    fail = receiver.fail
                if fail:
                    return self._answer(503, b'{"message":"unavailable"}')
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/json":
                    with receiver._lock:
                        receiver.invalid.append(f"{self.path} {self.headers.get('Content-Type')}")
                    return self._answer(404, b"{}")
                try:
                    request = validate(body)
                except (ValueError, json.JSONDecodeError) as e:
                    with receiver._lock:
                        receiver.invalid.append(str(e))
                    return self._answer(400, json.dumps({"message": str(e)}).encode())
                with receiver._lock:
                    for rs in request.resource_spans:
                        service = {kv.key: kv.value.string_value for kv in rs.resource.attributes}.get("service.name")
                        for ss in rs.scope_spans:
                            receiver._spans += [(service, s) for s in ss.spans]
                self._answer(200, b"{}")

            def _answer(self, status: int, body: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def spans(self, name: str | None = None, service: str | None = None) -> list:
        with self._lock:
            return [s for svc, s in self._spans if (name is None or s.name == name)
                    and (service is None or svc == service)]
