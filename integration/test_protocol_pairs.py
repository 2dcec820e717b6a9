"""The same behaviour over every pair of client and upstream protocol, black box,
with the real binaries: HTTP/1.1 and HTTP/2 clients (raw HTTP/1.1 bytes,
lib/h2client.py's H2Client with prior knowledge), HTTP/1.1 and h2c upstreams
(lib/backends.py, lib/h2_servers.py's H2cBackend), and gRPC (grpcio) to an h2c
gRPC server (lib/grpc_echo.py):

    h1>h1  h1>h2c  h2>h1  h2>h2c  grpc>h2c

One stack per test: a master, one proxy whose routes pick the upstream and the
domain by host ("h2c.hold.test", "grpc.refuse.test", ...), the three upstreams.
Per pair, each test checks one thing:

1. a forwarded request: status and body as the upstream sent them;
2. a request held (rate 1 per 8 s, burst 1: an identifier's second request
   waits; decision "delayed", held_ms > 0, answered 200) and one refused
   (1 per hour, max_delay 0: 503 with Retry-After and the RateLimit fields;
   gRPC: RESOURCE_EXHAUSTED with grpc-retry-pushback-ms), never forwarded;
3. the access log's record: protocol, status, upstream server, domain,
   identifier, decision;
4. smockron_proxy_upstream_response_seconds_count{upstream} and
   smockron_proxy_http_requests_total{protocol}: one more per request;
5. cost = "response_header:X-Tokens-Used": the units the upstream reports are
   charged (smockron_master_units_total{domain}, as test_cost reads it).

Every identifier is used by one pair and one check only; rule periods are long
(8 s, an hour) and every wait has a deadline, so timing decides no outcome.
127.0.0.1 only; a handful of requests per pair.

Run: cd integration && python3 -m unittest -v test_protocol_pairs
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.config import WARM_DOMAIN, WARM_ROUTE  # noqa: E402
from lib.grpc_echo import CLIENT_OPTIONS, SERVICE, UNARY, EchoServer  # noqa: E402
from lib.h2_servers import H2cBackend  # noqa: E402
from lib.h2client import H2Client  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.metrics import HTTP_REQUESTS, UPSTREAM_SECONDS, metric_sum  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402  (lib adds Debian's dist-packages to sys.path)
from lib.timing import wait_until  # noqa: E402

_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)
import grpc  # noqa: E402  (Debian's python3-grpcio)

#: client>upstream. The client: h1 (HTTP/1.1), h2 (HTTP/2, prior knowledge), grpc (grpcio);
#: the upstream: h1 (HTTP/1.1) or h2c. gRPC needs a gRPC server: the h2c one of lib/grpc_echo.py.
PAIRS = ("h1>h1", "h1>h2c", "h2>h1", "h2>h2c", "grpc>h2c")
#: The proxy's names for the protocol a client came in with: (access log, metric label).
PROTOCOL = {"h1": ("HTTP/1.1", "http/1.1"), "h2": ("HTTP/2", "h2"), "grpc": ("HTTP/2", "h2")}

HOLD_PERIOD_S = 8
#: A limit nothing here reaches: only the decision "accepted" and the units count.
WIDE = {"rules": [("1000/s", 100_000)], "algorithm": "gcra"}
DOMAINS = {
    "fwd": WIDE,
    "hold": {"rules": [(f"1/{HOLD_PERIOD_S}s", 1)]},
    "refuse": {"rules": [("1/h", 1)]},
    "cost": WIDE,
}
#: Route keys per domain (besides host, path, domain, upstream and identify).
ROUTE_KEYS = {
    "fwd": {},
    "hold": {"max_delay": "30s"},
    "refuse": {"max_delay": "0s", "ratelimit_headers": True},
    "cost": {"cost": "response_header:X-Tokens-Used"},
}
UNITS = "smockron_master_units_total"
CTL_TIMEOUT = 10.0
CALL_TIMEOUT = 30.0  # every request and call: longer than any hold here

Reply = collections.namedtuple("Reply", "status headers body")  # gRPC: status is the grpc.StatusCode


def ident(pair: str, check: str) -> str:
    """The identifier of one pair in one check: used by nothing else."""
    return f"{check}-{pair.replace('>', '-')}"


class ProtocolPairsTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.log = os.path.join(self.tmp, "access.log")
        self.h1 = self.start_backend()
        self.h2c = self.closing(H2cBackend())
        self.echo = EchoServer()
        self.addCleanup(self.echo.stop)
        self.master = self.start_master({**DOMAINS, WARM_DOMAIN: {"rules": [("1/h", 1)]}})
        routes = [WARM_ROUTE]
        for domain, keys in ROUTE_KEYS.items():
            for up in ("h1", "h2c"):
                routes.append({"host": f"{up}.{domain}.test", "path": "/", "domain": domain, "upstream": up,
                               "identify": ["header:X-API-Key"], **keys})
            routes.append({"host": f"grpc.{domain}.test", "path": f"/{SERVICE}/", "domain": domain,
                           "upstream": "grpc", "identify": ["header:x-key"], **keys})
        self.proxy = self.start_proxy(
            {"app": {"servers": [f"{HOST}:{self.h1.port}"]},  # the warm-up route's
             "h1": {"servers": [f"{HOST}:{self.h1.port}"]},
             "h2c": {"servers": [f"{HOST}:{self.h2c.port}"], "protocol": "h2c"},
             "grpc": {"servers": [f"{HOST}:{self.echo.port}"], "protocol": "h2c"}},
            routes, accounting=[self.master.accounting], control=[self.master.control], **access_log_keys(self.log))
        self.wait_connected(self.proxy)
        self.prime(self.proxy)
        self.channels: dict[str, grpc.Channel] = {}

    # ---- one request of a pair, whatever its protocols
    def channel(self, authority: str) -> grpc.Channel:
        if authority not in self.channels:
            ch = grpc.insecure_channel(f"{HOST}:{self.proxy.port}",
                                       options=CLIENT_OPTIONS + [("grpc.default_authority", authority)])
            self.addCleanup(ch.close)
            self.channels[authority] = ch
        return self.channels[authority]

    def send(self, pair: str, domain: str, key: str, tokens: int | None = None) -> Reply:
        """One request of `pair` on the route of `domain` with identifier `key`; with
        `tokens`, the upstream reports that many units used (X-Tokens-Used)."""
        client, up = pair.split(">")
        host = f"{up}.{domain}.test"
        path = f"/tokens?n={tokens}" if tokens is not None else f"/{domain}/{key}"
        if client == "h1":
            r, _ = fetch(self.proxy.port, path, headers=[("X-API-Key", key)], host=host, timeout=CALL_TIMEOUT)
            return Reply(r.status, r.headers, r.body)
        if client == "h2":
            with H2Client(self.proxy.port, timeout=CALL_TIMEOUT) as c:
                st = c.get(path, headers=[("x-api-key", key)], authority=host)
            self.assertIsNone(st.reset, f"{pair}: the stream was reset: {st}")
            return Reply(st.status, dict(st.headers + (st.trailers or [])), bytes(st.data))
        message = b"tokens:%d" % tokens if tokens is not None else f"{domain}:{key}".encode()
        unary = self.channel(f"grpc.{domain}.test").unary_unary(UNARY)
        try:
            resp, call = unary.with_call(message, metadata=[("x-key", key)], timeout=CALL_TIMEOUT)
        except grpc.RpcError as e:
            return Reply(e.code(), dict(e.trailing_metadata() or ()), (e.details() or "").encode())
        return Reply(call.code(), dict(tuple(call.initial_metadata()) + tuple(call.trailing_metadata())), resp)

    def assert_forwarded(self, pair: str, domain: str, key: str, reply: Reply) -> None:
        """A 200 (gRPC: OK) whose body is what the pair's upstream answers to send(pair, domain, key)."""
        client, up = pair.split(">")
        if client == "grpc":
            self.assertEqual((reply.status, reply.body), (grpc.StatusCode.OK, f"echo:{domain}:{key}".encode()),
                             f"{pair}: {reply}")
            return
        path = f"/{domain}/{key}"
        self.assertEqual(reply.status, 200, f"{pair}: {reply}")
        if up == "h2c":
            self.assertEqual(reply.body, f"h2c {path}".encode(), f"{pair}: the h2c upstream's body")
        else:
            echo = json.loads(reply.body)
            self.assertEqual((echo["method"], echo["target"]), ("GET", path), f"{pair}: the HTTP/1.1 upstream's echo")
            self.assertEqual([v for k, v in echo["headers"] if k.lower() == "x-api-key"], [key], pair)

    def forwarded_count(self, pair: str, key: str) -> int:
        """How many requests of identifier `key` the pair's upstream received."""
        client, up = pair.split(">")
        if client == "grpc":
            return len(self.echo.seen(key=key))
        if up == "h2c":
            with self.h2c.lock:
                return sum(1 for r in self.h2c.requests if dict(r["headers"]).get("x-api-key") == key)
        return len(self.h1.requests(key=key))

    def accept_first(self, pair: str, domain: str, key: str) -> None:
        """One accepted request of `key`, then the master's DELAY_UNTIL for it is here."""
        ctl0 = self.proxy.ctl()
        self.assert_forwarded(pair, domain, key, self.send(pair, domain, key))
        self.wait_ctl(self.proxy, ctl0, timeout=CTL_TIMEOUT)

    def log_entries(self, key: str, n: int) -> list[dict]:
        """The access log's records of identifier `key`, once there are n."""
        return wait_until(lambda: len(es := [e for e in read_access_log(self.log) if e["identifier"] == key]) >= n
                          and es, 5, message=f"{n} access log record(s) of {key}")

    def upstream_server(self, pair: str) -> str:
        up = "grpc" if pair.startswith("grpc") else pair.split(">")[1]
        return f"{HOST}:{ {'h1': self.h1.port, 'h2c': self.h2c.port, 'grpc': self.echo.port}[up] }"

    # ---- 1
    def test_forwarded_status_and_body(self):
        for pair in PAIRS:
            with self.subTest(pair=pair):
                key = ident(pair, "fwd")
                self.assert_forwarded(pair, "fwd", key, self.send(pair, "fwd", key))
                self.assertEqual(self.forwarded_count(pair, key), 1, f"{pair}: forwarded once")

    # ---- 2
    def test_held_then_answered(self):
        # Each pair's first request is accepted; its second waits for the rest of the 8 s.
        # The five second requests are held together.
        for pair in PAIRS:
            self.accept_first(pair, "hold", ident(pair, "hold"))
        with concurrent.futures.ThreadPoolExecutor(len(PAIRS)) as pool:
            futures = {pair: pool.submit(self.send, pair, "hold", ident(pair, "hold")) for pair in PAIRS}
            replies = {pair: f.result(CALL_TIMEOUT + 5) for pair, f in futures.items()}
        for pair in PAIRS:
            with self.subTest(pair=pair):
                key = ident(pair, "hold")
                self.assert_forwarded(pair, "hold", key, replies[pair])
                first, held = self.log_entries(key, 2)[:2]
                self.assertEqual(first["decision"], "accepted", f"{pair}: {first}")
                self.assertEqual((held["decision"], held["status"]), ("delayed", 200), f"{pair}: {held}")
                self.assertGreater(float(held["held_ms"]), 0, f"{pair}: {held}")
                self.assertEqual(self.forwarded_count(pair, key), 2, pair)

    def test_refused_with_retry_after_and_ratelimit_fields(self):
        self.proxy.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v > 0, timeout=10)
        for pair in PAIRS:
            with self.subTest(pair=pair):
                key = ident(pair, "refuse")
                self.accept_first(pair, "refuse", key)
                r = self.send(pair, "refuse", key)
                if pair.startswith("grpc"):
                    self.assertEqual(r.status, grpc.StatusCode.RESOURCE_EXHAUSTED, f"{pair}: {r}")
                    pushback = int(r.headers.get("grpc-retry-pushback-ms") or "0")
                    self.assertGreater(pushback, 0, f"{pair}: grpc-retry-pushback-ms in {r.headers}")
                    m = re.search(r";t=(\d+)", r.headers.get("ratelimit", ""))
                    if m:  # where RateLimit comes too, it names the pushback's time
                        self.assertLessEqual(abs(int(m.group(1)) - pushback / 1000), 1.0, f"{pair}: {r.headers}")
                    status = 200  # a trailers-only response: HTTP 200 on the wire, as configuration.md says
                else:
                    self.assertEqual(r.status, 503, f"{pair}: {r}")
                    retry_after = int(r.headers.get("retry-after") or "0")
                    self.assertGreaterEqual(retry_after, 1, f"{pair}: Retry-After in {r.headers}")
                    self.assertEqual(r.headers.get("ratelimit-policy"), '"refuse";q=1;w=3600', f"{pair}: {r.headers}")
                    self.assertEqual(r.headers.get("ratelimit"), f'"refuse";r=0;t={retry_after}', f"{pair}: {r.headers}")
                    status = 503
                self.assertEqual(self.forwarded_count(pair, key), 1, f"{pair}: the refused request was forwarded")
                refused = self.log_entries(key, 2)[1]
                self.assertEqual((refused["decision"], refused["upstream"]), ("rejected", ""), f"{pair}: {refused}")
                self.assertEqual(refused["status"], status,
                                 f"{pair}: the access log's status of a refusal is not the status the client got "
                                 f"on the wire ({status}): {refused}")

    # ---- 3
    def test_access_log_fields(self):
        for pair in PAIRS:
            with self.subTest(pair=pair):
                key = ident(pair, "log")
                self.assert_forwarded(pair, "fwd", key, self.send(pair, "fwd", key))
                entries = self.log_entries(key, 1)
                self.assertEqual(len(entries), 1, f"{pair}: {entries}")
                e = entries[0]
                got = {k: e.get(k) for k in ("protocol", "status", "upstream", "domain", "identifier", "decision")}
                want = {"protocol": PROTOCOL[pair.split(">")[0]][0], "status": 200,
                        "upstream": self.upstream_server(pair), "domain": "fwd", "identifier": key,
                        "decision": "accepted"}
                self.assertEqual(got, want, f"{pair}: {e}")

    # ---- 4
    def test_upstream_and_protocol_metrics(self):
        def counts(pair: str) -> tuple[float, float]:
            client, up = pair.split(">")
            m = self.proxy.metrics()
            return (metric_sum(m, UPSTREAM_SECONDS + "_count", upstream="grpc" if client == "grpc" else up),
                    metric_sum(m, HTTP_REQUESTS, protocol=PROTOCOL[client][1]))

        for pair in PAIRS:
            with self.subTest(pair=pair):
                key = ident(pair, "metrics")
                before = counts(pair)
                self.assert_forwarded(pair, "fwd", key, self.send(pair, "fwd", key))
                want = (before[0] + 1, before[1] + 1)
                try:
                    wait_until(lambda: all(v >= w for v, w in zip(counts(pair), want)), 5, message=f"{pair}: the counts after one request")
                except AssertionError:
                    pass  # reported below, with the values
                self.assertEqual(counts(pair), want,
                                 f"{pair}: (upstream response count, requests by protocol) before {before}")

    # ---- 5
    def test_cost_from_a_response_field(self):
        def units() -> float:
            return self.master.metric(UNITS, {"domain": "cost"}) or 0.0

        for n, pair in enumerate(PAIRS, start=11):  # 11, 12, ... units: each pair its own amount
            with self.subTest(pair=pair):
                key = ident(pair, "cost")
                before = units()
                r = self.send(pair, "cost", key, tokens=n)
                self.assertIn(r.status, (200, grpc.StatusCode.OK), f"{pair}: {r}")
                self.assertEqual(r.headers.get("x-tokens-used"), str(n), f"{pair}: the upstream's report, relayed")
                try:
                    self.master.wait_metric(UNITS, {"domain": "cost"}, predicate=lambda v: v >= before + n,
                                            timeout=10)
                except AssertionError:
                    pass  # reported below, with the value
                self.assertEqual(units(), before + n, f"{pair}: units charged for a report of {n} (from {before})")
                entries = self.log_entries(key, 1)
                self.assertEqual((entries[0]["domain"], entries[0]["decision"]), ("cost", "accepted"), pair)


if __name__ == "__main__":
    unittest.main()
