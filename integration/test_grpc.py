"""gRPC through the proxy, black box: grpcio (Debian's python3-grpcio) on both sides.

The server is an in-process grpcio server (lib/grpc_echo.py) with generic
handlers on raw bytes (no protobuf): service smockron.test.Echo, methods Unary,
ServerStream, ClientStream and Bidi, on an insecure 127.0.0.1 port of its own
choosing (or with TLS for the "h2" upstream). It records every call it sees (method,
metadata, the first bytes of the first message), which is how the tests tell
that a refused, held-then-cancelled or timed-out call never reached it.

The proxy's upstream speaks h2c (or h2 over TLS); the client is a grpcio
channel to the proxy's listener (prior knowledge in the clear, ALPN h2 over
TLS), with grpcio's retries off so that every call is made exactly once.

Covered: the four call kinds with metadata and trailers, server errors,
~1 MiB messages, gRPC over the TLS listener and to an h2 upstream, metadata as
the identifier, refusals as trailers-only responses (RESOURCE_EXHAUSTED by
default, the route's grpc_status = 14 UNAVAILABLE, grpc-message,
grpc-retry-pushback-ms; HTTP 200 on the wire), a deadline shorter than the
hold refused at once, a held call that waits and passes, a held call cancelled
by the client never forwarded, exact admission (each call asks the master
first), and the proxy's own answers (no route:
UNIMPLEMENTED; upstream unavailable: UNAVAILABLE).

Run: cd integration && python3 -m unittest -v test_grpc
"""
from __future__ import annotations

import hashlib
import os
import queue
import re
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.config import WARM_DOMAIN, WARM_ROUTE  # noqa: E402
from lib.grpc_echo import (  # noqa: E402
    BIDI,
    CALL_TIMEOUT,
    CLIENT_OPTIONS,
    CLIENT_STREAM,
    MIB,
    SERVER_STREAM,
    SERVICE,
    UNARY,
    EchoServer,
    pattern,
)
from lib.h2client import H2Client  # noqa: E402
from lib.h2frames import grpc_message  # noqa: E402
from lib.metrics import HELD, metric, metric_sum, requests_by_protocol  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402  (lib adds Debian's dist-packages to sys.path)
from lib.timing import wait_until  # noqa: E402
from lib.tls_ca import TestCA  # noqa: E402

_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)
import grpc  # noqa: E402  (Debian's python3-grpcio)

GONE = "smockron_proxy_held_client_disconnects_total"
REQUESTS = "smockron_proxy_requests_total"


class GrpcCase(DaemonTestCase):
    def start_echo(self, credentials=None) -> EchoServer:
        server = EchoServer(credentials)
        self.addCleanup(server.stop)
        return server

    def channel(self, port: int, root_ca: str | None = None) -> grpc.Channel:
        """A channel to the proxy: in the clear, or over TLS verified against root_ca for "localhost"."""
        if root_ca is None:
            ch = grpc.insecure_channel(f"{HOST}:{port}", options=CLIENT_OPTIONS)
        else:
            with open(root_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            ch = grpc.secure_channel(f"{HOST}:{port}", creds,
                                     options=CLIENT_OPTIONS + [("grpc.ssl_target_name_override", "localhost")])
        self.addCleanup(ch.close)
        return ch

    def grpc_proxy(self, routes=None, extra_upstreams=None, **proxy_keys):
        """An echo server and a proxy (no master: fail-open) routing everything to it over h2c."""
        echo = self.start_echo()
        upstreams = {"grpc": {"servers": [f"{HOST}:{echo.port}"], "protocol": "h2c"}, **(extra_upstreams or {})}
        proxy = self.start_proxy(upstreams, routes or [{"path": "/", "upstream": "grpc"}], **proxy_keys)
        return echo, proxy

    def grpc_stack(self, domains: dict, routes: list, **proxy_keys):
        """gate_stack() with an echo server as upstream "grpc" (h2c) besides the warm-up
        backend "app": a real master with `domains`, the ZeroMQ loop primed.
        Returns (echo, master, proxy)."""
        echo = self.start_echo()
        master = self.start_master({**domains, WARM_DOMAIN: {"rules": [("1/h", 1)]}})
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]},
                                  "grpc": {"servers": [f"{HOST}:{echo.port}"], "protocol": "h2c"}},
                                 [WARM_ROUTE] + routes, accounting=[master.accounting], control=[master.control],
                                 **proxy_keys)
        self.wait_connected(proxy)
        self.prime(proxy)
        return echo, master, proxy

    def accept_first(self, proxy, unary, key: str) -> None:
        """One accepted call of `key`, then the master's DELAY_UNTIL for it is here."""
        ctl0 = proxy.ctl()
        self.assertEqual(unary(b"first", metadata=[("x-key", key)], timeout=CALL_TIMEOUT), b"echo:first")
        self.wait_ctl(proxy, ctl0, timeout=10)

    def assert_refused(self, err: grpc.RpcError, code: grpc.StatusCode) -> int:
        """A refusal: the status, a message, and the pushback (ms, > 0), which is returned."""
        self.assertEqual(err.code(), code, err)
        self.assertTrue(err.details(), "a grpc-message says why")
        trailers = dict(err.trailing_metadata() or ())
        self.assertIn("grpc-retry-pushback-ms", trailers, trailers)
        pushback = int(trailers["grpc-retry-pushback-ms"])
        self.assertGreater(pushback, 0)
        # Not in the gRPC spec, but where the refusal carries the RateLimit fields too, their
        # t (whole seconds until the quota is whole again, docs/cost.md) is no earlier than
        # the pushback (when the next call fits); for a burst of one they are the same time,
        # as Retry-After and t are over HTTP/1.1 (test_retry_after, test_operator).
        m = re.search(r";t=(\d+)", trailers.get("ratelimit", ""))
        if m:
            self.assertGreaterEqual(int(m.group(1)), pushback / 1000 - 1.0,
                                    f"RateLimit {trailers['ratelimit']!r} vs grpc-retry-pushback-ms {pushback}")
        return pushback


def raw_grpc_call(port: int, path: str, key: str | None = None, message: bytes = b"raw"):
    """One unary gRPC call over a raw HTTP/2 connection: the Stream as received."""
    headers = [("content-type", "application/grpc"), ("te", "trailers")]
    if key is not None:
        headers.append(("x-key", key))
    with H2Client(port) as c:
        return c.get(path, method="POST", headers=headers, body=grpc_message(message), authority=f"{HOST}:{port}")


# =============================================================================== through the proxy


class GrpcPassThroughTest(GrpcCase):
    def test_four_call_kinds_metadata_trailers_and_errors(self):
        echo, proxy = self.grpc_proxy()
        ch = self.channel(proxy.port)
        md = [("x-key", "k1"), ("x-custom", "custom-value")]

        resp, call = ch.unary_unary(UNARY).with_call(b"hello", metadata=md, timeout=CALL_TIMEOUT)
        self.assertEqual(resp, b"echo:hello")
        self.assertEqual(call.code(), grpc.StatusCode.OK)
        self.assertIn(("x-initial", "unary"), tuple(call.initial_metadata()))
        self.assertIn(("x-trailer", "unary"), tuple(call.trailing_metadata()), "trailers pass end to end")

        it = ch.unary_stream(SERVER_STREAM)(b"5,1000", metadata=md, timeout=CALL_TIMEOUT)
        msgs = list(it)
        self.assertEqual(msgs, [bytes([i]) * 1000 for i in range(5)])
        self.assertIn(("x-trailer", "server-stream"), tuple(it.trailing_metadata()))

        parts = [b"a" * 10, b"b" * 20, b"c" * 30]
        resp, call = ch.stream_unary(CLIENT_STREAM).with_call(iter(parts), metadata=md, timeout=CALL_TIMEOUT)
        self.assertEqual(resp, b"3:60:" + hashlib.sha256(b"".join(parts)).hexdigest().encode())
        self.assertIn(("x-trailer", "client-stream"), tuple(call.trailing_metadata()))

        # Bidi: every message answered (lock step is test_bidi_in_lock_step).
        responses = ch.stream_stream(BIDI)(iter([b"m0", b"m1", b"m2"]), metadata=md, timeout=CALL_TIMEOUT)
        self.assertEqual(list(responses), [b"echo:m0", b"echo:m1", b"echo:m2"])
        self.assertEqual(responses.code(), grpc.StatusCode.OK)

        # A server's error status (in its trailers) reaches the client as it was.
        with self.assertRaises(grpc.RpcError) as cm:
            ch.unary_unary(UNARY)(b"abort:x", metadata=md, timeout=CALL_TIMEOUT)
        self.assertEqual((cm.exception.code(), cm.exception.details()), (grpc.StatusCode.NOT_FOUND, "no such thing"))

        seen = echo.seen(key="k1")
        self.assertEqual([c["method"] for c in seen], ["Unary", "ServerStream", "ClientStream", "Bidi", "Unary"])
        for c in seen:
            self.assertEqual(c["metadata"].get("x-custom"), "custom-value", "metadata reaches the server")
        self.assertGreaterEqual(requests_by_protocol(proxy, "h2"), 5)

    def test_bidi_in_lock_step(self):
        # Each message is sent only after the answer to the previous one came back: the
        # request's DATA must still be forwarded once the upstream's response has begun
        # (and neither direction may be held back until its end).
        echo, proxy = self.grpc_proxy()
        ch = self.channel(proxy.port)
        q: queue.Queue = queue.Queue()

        def requests():
            while True:
                try:
                    m = q.get(timeout=CALL_TIMEOUT)
                except queue.Empty:
                    return
                if m is None:
                    return
                yield m

        responses = ch.stream_stream(BIDI)(requests(), metadata=[("x-key", "lock")], timeout=CALL_TIMEOUT)
        answers = []
        try:
            for i in range(3):
                q.put(b"ping-%d" % i)
                answers.append(next(responses))
        except grpc.RpcError as e:
            self.fail(f"after the answers {answers}: {e.code()} {e.details()}")
        finally:
            q.put(None)
        self.assertEqual(answers, [b"echo:ping-%d" % i for i in range(3)])
        self.assertEqual(list(responses), [])
        self.assertEqual(responses.code(), grpc.StatusCode.OK)
        self.assertEqual(len(echo.seen(method="Bidi")), 1)

    def test_messages_of_a_mebibyte(self):
        echo, proxy = self.grpc_proxy()
        ch = self.channel(proxy.port)
        big = pattern(MIB + 17)
        self.assertTrue(ch.unary_unary(UNARY)(big, timeout=CALL_TIMEOUT) == b"echo:" + big, "1 MiB each way")
        parts = [pattern(MIB, seed=i) for i in range(4)]
        resp = ch.stream_unary(CLIENT_STREAM)(iter(parts), timeout=CALL_TIMEOUT)
        self.assertEqual(resp, b"4:%d:" % (4 * MIB) + hashlib.sha256(b"".join(parts)).hexdigest().encode())
        msgs = list(ch.unary_stream(SERVER_STREAM)(b"4,%d" % MIB, timeout=CALL_TIMEOUT))
        self.assertEqual([len(m) for m in msgs], [MIB] * 4)
        self.assertTrue(all(m == bytes([i]) * MIB for i, m in enumerate(msgs)))
        self.assertEqual(len(echo.seen()), 3)

    def test_an_http1_client_reaches_the_http2_upstream_with_trailers(self):
        # curl over HTTP/1.1 (no gRPC client speaks it, but any HTTP/1.1 client may reach an h2c
        # upstream): the request body goes up as DATA, the response comes back chunked with the
        # upstream's trailers (grpc-status) in the last chunk.
        echo, proxy = self.grpc_proxy()
        body = os.path.join(self.tmp, "msg.bin")
        with open(body, "wb") as f:
            f.write(b"\x00" + struct.pack(">I", 5) + b"hello")
        heads = os.path.join(self.tmp, "heads.txt")
        out = os.path.join(self.tmp, "out.bin")
        p = subprocess.run(["curl", "-sS", "--http1.1", "--max-time", "20", "-H", "content-type: application/grpc",
                            "-H", "te: trailers", "--data-binary", f"@{body}", "-D", heads, "-o", out,
                            f"http://{HOST}:{proxy.port}{UNARY}"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(heads) as f:
            text = f.read().lower()
        self.assertIn("http/1.1 200", text)
        self.assertIn("transfer-encoding: chunked", text)
        self.assertIn("grpc-status: 0", text, "the upstream's trailers, in the last chunk")
        self.assertIn("x-trailer: unary", text)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"\x00" + struct.pack(">I", 10) + b"echo:hello")
        self.assertEqual(len(echo.seen()), 1)

    def test_many_calls_on_one_upstream_connection(self):
        # 300 calls with 1 KB answers share one upstream connection: the bytes of each answer
        # give the upstream connection's window back (a leak would freeze it after 64 KiB).
        echo, proxy = self.grpc_proxy()
        unary = self.channel(proxy.port).unary_unary(UNARY)
        for i in range(300):
            self.assertEqual(unary(b"%04d" % i + b"x" * 1000, timeout=CALL_TIMEOUT)[:9], b"echo:%04d" % i)
        self.assertEqual(len(echo.seen()), 300)

    def test_grpc_over_the_tls_listener_and_to_an_h2_upstream(self):
        ca = TestCA(self.tmp)
        cert, key = ca.issue("server", "localhost", "DNS:localhost,IP:127.0.0.1")
        with open(cert, "rb") as f, open(key, "rb") as k:
            server_creds = grpc.ssl_server_credentials([(k.read(), f.read())])
        tls_echo = self.start_echo(server_creds)
        plain_echo = self.start_echo()
        # protocol = "h2" is HTTP/2 over TLS (ALPN h2): tls is implied, tls_ca verifies the
        # server (its certificate names IP:127.0.0.1).
        proxy = self.start_proxy({"plain": {"servers": [f"{HOST}:{plain_echo.port}"], "protocol": "h2c"},
                                  "secure": {"servers": [f"{HOST}:{tls_echo.port}"], "protocol": "h2",
                                             "tls_ca": ca.cert}},
                                 [{"host": "secure.test", "path": "/", "upstream": "secure"},
                                  {"path": "/", "upstream": "plain"}],
                                 tls_cert=cert, tls_key=key)
        ch = self.channel(proxy.port, root_ca=ca.cert)  # grpc-core insists on ALPN h2
        self.assertEqual(ch.unary_unary(UNARY)(b"over-tls", timeout=CALL_TIMEOUT), b"echo:over-tls")
        self.assertEqual([c["first"] for c in plain_echo.seen()], [b"over-tls"])
        # The :authority picks the route to the TLS upstream.
        with open(ca.cert, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        ch2 = grpc.secure_channel(f"{HOST}:{proxy.port}", creds,
                                  options=CLIENT_OPTIONS + [("grpc.ssl_target_name_override", "localhost"),
                                                            ("grpc.default_authority", "secure.test")])
        self.addCleanup(ch2.close)
        msgs = list(ch2.unary_stream(SERVER_STREAM)(b"3,70000", timeout=CALL_TIMEOUT))
        self.assertEqual([len(m) for m in msgs], [70000] * 3)
        self.assertEqual([c["method"] for c in tls_echo.seen()], ["ServerStream"])


# =============================================================================== the gate


class GrpcGateTest(GrpcCase):
    LIMITED = {"path": f"/{SERVICE}/", "domain": "api", "upstream": "grpc", "identify": ["header:x-key"]}

    def test_metadata_identifies_and_refusals_are_trailers_only(self):
        # Unary: grpc_status 14 (UNAVAILABLE); the other methods: the default, 8.
        routes = [dict(self.LIMITED, path=UNARY, grpc_status=14), self.LIMITED]
        echo, _, proxy = self.grpc_stack({"api": {"rules": [("1/h", 1)]}}, routes, max_delay="0s")
        ch = self.channel(proxy.port)
        unary = ch.unary_unary(UNARY)
        self.accept_first(proxy, unary, "alice")

        with self.assertRaises(grpc.RpcError) as cm:
            unary(b"second", metadata=[("x-key", "alice")], timeout=CALL_TIMEOUT)
        self.assert_refused(cm.exception, grpc.StatusCode.UNAVAILABLE)
        with self.assertRaises(grpc.RpcError) as cm:
            list(ch.unary_stream(SERVER_STREAM)(b"1,10", metadata=[("x-key", "alice")], timeout=CALL_TIMEOUT))
        self.assert_refused(cm.exception, grpc.StatusCode.RESOURCE_EXHAUSTED)
        # The identifier is the metadata: another key is not limited by alice's use.
        self.assertEqual(unary(b"bob", metadata=[("x-key", "bob")], timeout=CALL_TIMEOUT), b"echo:bob")

        # On the wire: HTTP 200 and one HEADERS frame that ends the stream (trailers-only).
        st = raw_grpc_call(proxy.port, SERVER_STREAM, key="alice")
        self.assertEqual(st.status, 200, st)
        self.assertTrue(st.headers_end_stream, f"not trailers-only: {st}")
        self.assertEqual(st.data_bytes, 0)
        self.assertEqual(st.header("grpc-status"), "8")
        self.assertTrue(st.header("grpc-message"))
        self.assertGreater(int(st.header("grpc-retry-pushback-ms") or "0"), 0)
        self.assertTrue((st.header("content-type") or "").startswith("application/grpc"), st)

        self.assertEqual([c["first"] for c in echo.seen(key="alice")], [b"first"], "refused calls were forwarded")
        self.assertEqual(len(echo.seen(key="bob")), 1)
        self.assertEqual(metric(proxy.metrics(), REQUESTS, {"domain": "api", "decision": "rejected"}), 3)

    def test_a_deadline_shorter_than_the_hold_is_refused_at_once(self):
        # The second call of "dana" would be held about 20 s (max_delay 60 s allows it), but
        # its deadline is 8 s: refused at once, not held until the deadline passes (which
        # grpcio would report as DEADLINE_EXCEEDED).
        echo, _, proxy = self.grpc_stack({"api": {"rules": [("1/20s", 1)]}}, [self.LIMITED], max_delay="60s")
        unary = self.channel(proxy.port).unary_unary(UNARY)
        self.accept_first(proxy, unary, "dana")
        with self.assertRaises(grpc.RpcError) as cm:
            unary(b"short-deadline", metadata=[("x-key", "dana")], timeout=8)
        self.assert_refused(cm.exception, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual([c["first"] for c in echo.seen(key="dana")], [b"first"])
        # A refusal (under whatever reason); which decision smockron_proxy_requests_total
        # files it under is not specified, so it is not checked here.
        self.assertEqual(metric_sum(proxy.metrics(), "smockron_proxy_rejects_total"), 1)
        self.assertEqual(proxy.metric(HELD), 0)

    def test_a_held_call_with_time_to_wait_passes(self):
        echo, _, proxy = self.grpc_stack({"api": {"rules": [("1/8s", 1)]}}, [self.LIMITED], max_delay="30s")
        ch = self.channel(proxy.port)
        unary = ch.unary_unary(UNARY)
        self.accept_first(proxy, unary, "erin")
        resp, call = unary.with_call(b"held", metadata=[("x-key", "erin")], timeout=30)
        self.assertEqual(resp, b"echo:held")
        self.assertIn(("x-trailer", "unary"), tuple(call.trailing_metadata()))
        self.assertEqual([c["first"] for c in echo.seen(key="erin")], [b"first", b"held"])
        self.assertEqual(metric(proxy.metrics(), REQUESTS, {"domain": "api", "decision": "delayed"}), 1)

    def test_a_held_call_cancelled_by_the_client_never_reaches_the_server(self):
        echo, _, proxy = self.grpc_stack({"api": {"rules": [("1/8s", 1)]}}, [self.LIMITED], max_delay="30s")
        unary = self.channel(proxy.port).unary_unary(UNARY)
        gone0 = proxy.metric(GONE) or 0
        self.accept_first(proxy, unary, "carol")
        future = unary.future(b"cancel-me", metadata=[("x-key", "carol")], timeout=30)
        proxy.wait_metric(HELD, predicate=lambda v: v == 1, timeout=10)
        self.assertTrue(future.cancel(), "the call was still in progress")
        proxy.wait_metric(GONE, predicate=lambda v: v >= gone0 + 1, timeout=10)
        proxy.wait_metric(HELD, predicate=lambda v: v == 0, timeout=10)
        # The next call of carol is held into the place the cancelled one left: once it has
        # passed, the cancelled call's time has passed too.
        self.assertEqual(unary(b"after", metadata=[("x-key", "carol")], timeout=30), b"echo:after")
        self.assertEqual([c["first"] for c in echo.seen(key="carol")], [b"first", b"after"],
                         "the cancelled call reached the server")

    def test_exact_admission_asks_the_master_for_every_call(self):
        """admission = "exact" over gRPC (HTTP/2 on both sides, an h2c upstream): each call asks
        the master first (ASK) and goes on its GO; a call only the master refuses (by its fifth
        rule, which POLICY does not carry to the gatekeeper) is answered trailers-only with
        RESOURCE_EXHAUSTED, a pushback and the RateLimit fields, and never forwarded."""
        rules = [("6/min", 12), ("1000/s", 1000), ("1000/s", 1000), ("1000/s", 1000), ("1/h", 3)]
        echo, master, proxy = self.grpc_stack(
            {"api": {"rules": rules, "algorithm": "gcra", "admission": "exact"}},
            [dict(self.LIMITED, cost="header:x-cost")], max_delay="1s")
        proxy.wait_metric("smockron_proxy_control_exact_total", predicate=lambda v: v >= 1, timeout=10)
        unary = self.channel(proxy.port).unary_unary(UNARY)
        for m in (b"m0", b"m1"):
            self.assertEqual(unary(m, metadata=[("x-key", "fay"), ("x-cost", "1")], timeout=CALL_TIMEOUT),
                             b"echo:" + m)
        # Two of the hour's three used: the master does not hold the client (no DELAY_UNTIL),
        # so only its answer to the next call's ASK can refuse it. (The GOs settled first: an
        # ASK beside an open GO is told to ask again.)
        wait_until(lambda: (master.metric("smockron_master_asks_settled_total") or 0) >= 2, 10,
                   message="the GOs settled by the calls' accounting")
        with self.assertRaises(grpc.RpcError) as cm:
            unary(b"over", metadata=[("x-key", "fay"), ("x-cost", "2")], timeout=CALL_TIMEOUT)
        self.assertGreater(self.assert_refused(cm.exception, grpc.StatusCode.RESOURCE_EXHAUSTED), 3_000_000,
                           "an hour's unit, as the pushback")
        self.assertIn(";r=0;", dict(cm.exception.trailing_metadata() or ()).get("ratelimit", ""))
        self.assertEqual([c["first"] for c in echo.seen(key="fay")], [b"m0", b"m1"])
        self.assertEqual(master.metric("smockron_master_asks_total", {"verdict": "go"}), 2)
        self.assertEqual(master.metric("smockron_master_asks_total", {"verdict": "wait"}), 1,
                         "the refusal was the master's answer")
        self.assertEqual(metric(proxy.metrics(), REQUESTS, {"domain": "api", "decision": "rejected"}), 1)

# =============================================================================== the proxy's own answers


class GrpcProxyAnswersTest(GrpcCase):
    def test_no_route_is_unimplemented_and_a_dead_upstream_unavailable(self):
        dead = self.dead_port()
        echo, proxy = self.grpc_proxy(
            routes=[{"path": f"/{SERVICE}/", "upstream": "grpc"}, {"path": "/dead.Service/", "upstream": "dead"}],
            extra_upstreams={"dead": {"servers": [f"{HOST}:{dead}"], "protocol": "h2c"}})
        ch = self.channel(proxy.port)
        self.assertEqual(ch.unary_unary(UNARY)(b"ok", timeout=CALL_TIMEOUT), b"echo:ok")
        with self.assertRaises(grpc.RpcError) as cm:
            ch.unary_unary("/other.Service/Method")(b"x", timeout=CALL_TIMEOUT)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED, cm.exception)
        with self.assertRaises(grpc.RpcError) as cm:
            ch.unary_unary("/dead.Service/Method")(b"x", timeout=CALL_TIMEOUT)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception)

        for path, status in (("/other.Service/Method", "12"), ("/dead.Service/Method", "14")):
            st = raw_grpc_call(proxy.port, path)
            self.assertEqual((st.status, st.header("grpc-status")), (200, status), st)
            self.assertTrue(st.headers_end_stream, f"not trailers-only: {st}")
        self.assertEqual(len(echo.seen()), 1)
        wait_until(lambda: metric_sum(proxy.metrics(), "smockron_proxy_http_requests_total", protocol="h2") >= 5, 5)


if __name__ == "__main__":
    unittest.main()
