"""No way around the gate: paths that a backend merges into a limited route are
limited with it, prefixes match on segment boundaries, and the backend receives
the path the routes matched.

Run: cd integration && python3 -m unittest -v test_gate_integrity
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import run_binary  # noqa: E402
from lib.gatekeeper import FakeMaster  # noqa: E402
from lib.http1 import RawConn, fetch, request_bytes  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

REQUESTS = "smockron_proxy_requests_total"


class PathNormalizationTest(DaemonTestCase):
    """A route `/api` limited to 1 request per minute per X-API-Key, and a
    catch-all route in another domain."""

    ROUTES = [
        {"path": "/api", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]},
        {"path": "/", "domain": "other", "upstream": "app", "identify": ["header:X-API-Key"]},
    ]

    def stack(self, **proxy_keys):
        return self.gate_stack({"api": {"rules": [("1/m", 1)]}, "other": {"rules": [("1000/s", 1000)]}},
                               self.ROUTES, max_delay="200ms", **proxy_keys)

    def decisions(self, proxy, domain):
        m = proxy.metrics()
        return sum(metric(m, REQUESTS, {"domain": domain, "decision": d}) or 0
                   for d in ("accepted", "delayed", "rejected", "unidentified"))

    def test_spellings_of_a_limited_path_share_its_limit(self):
        _, backend, proxy = self.stack()
        r, _ = fetch(proxy.port, "/api/a", key="alice")
        self.assertEqual(r.status, 200, r)
        for spelling in ("/%61pi/a", "//api/a", "/api//a", "/api/./a", "/x/../api/a", "/%2e/api/a", "/API/../api/a"):
            r, _ = fetch(proxy.port, spelling, key="alice")
            self.assertEqual(r.status, 503, f"{spelling} stepped around the limit: {r.status}")
        self.assertEqual(len(backend.requests(key="alice")), 1, "only the first reached the backend")

    def test_the_backend_receives_the_normalized_path_and_query(self):
        _, backend, proxy = self.stack()
        r, _ = fetch(proxy.port, "/%61pi//b/./c/../d?q=%2F..%2F&x=1", key="bob")
        self.assertEqual(r.status, 200, r)
        seen = backend.requests(key="bob")
        self.assertEqual([e["target"] for e in seen], ["/api/b/d?q=%2F..%2F&x=1"])

    def test_prefixes_match_on_segment_boundaries(self):
        _, backend, proxy = self.stack()
        api0, other0 = self.decisions(proxy, "api"), self.decisions(proxy, "other")
        for target in ("/apiary", "/api-docs", "/apix/y"):
            r, _ = fetch(proxy.port, target, key="carol")
            self.assertEqual(r.status, 200, r)
        for target in ("/api", "/api?x=1"):
            r, _ = fetch(proxy.port, target, key=f"dave{target}")
            self.assertEqual(r.status, 200, r)
        self.assertEqual(self.decisions(proxy, "other") - other0, 3, "/apiary & co. are not under /api")
        self.assertEqual(self.decisions(proxy, "api") - api0, 2)

    def test_what_cannot_be_normalized_safely_is_refused(self):
        _, backend, proxy = self.stack()
        for target in ("/api%2Fa", "/api%5ca", "/api/a%00", "/api/%zz", "/api\\a"):
            r, _ = fetch(proxy.port, target, key="erin")
            self.assertEqual(r.status, 400, f"{target}: {r.status}")
        self.assertEqual(backend.requests(key="erin"), [])
        r, _ = fetch(proxy.port, "/api/ok", key="erin")
        self.assertEqual(r.status, 200, "the proxy still serves")

    def test_escaped_slashes_can_be_kept_and_normalization_turned_off(self):
        _, backend, proxy = self.stack(escaped_slashes="keep", merge_slashes=False)
        r, _ = fetch(proxy.port, "/api/a%2fb", key="frank")
        self.assertEqual(r.status, 200, r)
        r, _ = fetch(proxy.port, "/other//x", key="frank")
        self.assertEqual(r.status, 200, r)
        self.assertEqual([e["target"] for e in backend.requests(key="frank")], ["/api/a%2Fb", "/other//x"])

    def test_path_parameters_cannot_step_around_a_route(self):
        # Tomcat, Jetty and Spring serve /api;x/a as /api/a: so do the routes.
        _, backend, proxy = self.stack()
        self.assertEqual(fetch(proxy.port, "/api/a", key="gina")[0].status, 200)
        for spelling in ("/api;x/a", "/api;/a", "/api;jsessionid=1", "/%61pi;v=1/a"):
            r, _ = fetch(proxy.port, spelling, key="gina")
            self.assertEqual(r.status, 503, f"{spelling} stepped around the limit: {r.status}")
        # A dot-segment behind parameters: Tomcat resolves "/api/..;/x" to "/x", Go and Node
        # serve it under /api. Forwarded as sent, the two would disagree: refused.
        for spelling in ("/api/..;/x", "/x/..;/api/a", "/api/%2e%2e;/x"):
            r, _ = fetch(proxy.port, spelling, key="gina")
            self.assertEqual(r.status, 400, f"{spelling}: {r.status}")
        self.assertEqual([e["target"] for e in backend.requests(key="gina")], ["/api/a"])
        # Forwarded as sent by default (normalized, parameters kept).
        self.assertEqual(fetch(proxy.port, "/api;v=1/b?q=1", key="hank")[0].status, 200)
        self.assertEqual([e["target"] for e in backend.requests(key="hank")], ["/api;v=1/b?q=1"])

    def test_path_parameters_stripped_or_refused(self):
        _, backend, proxy = self.stack(path_parameters="strip")
        self.assertEqual(fetch(proxy.port, "/api;v=1/b;c?q=;1", key="ivan")[0].status, 200)
        self.assertEqual([e["target"] for e in backend.requests(key="ivan")], ["/api/b?q=;1"], "the query as sent")
        _, backend, proxy = self.stack(path_parameters="reject")
        self.assertEqual(fetch(proxy.port, "/api;v=1/b", key="judy")[0].status, 400)
        self.assertEqual(fetch(proxy.port, "/api/b?q=;1", key="judy")[0].status, 200, "a ';' in the query is no parameter")
        self.assertEqual([e["target"] for e in backend.requests(key="judy")], ["/api/b?q=;1"])



class UnidentifiedTest(DaemonTestCase):
    """Routes limited 1 per minute per X-API-Key, one per unidentified action."""

    def test_each_action(self):
        routes = [
            {"path": "/shared", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]},
            {"path": "/reject", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "unidentified": "reject"},
            {"path": "/allow", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "unidentified": "allow"},
        ]
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/m", 1)]}}, routes, max_delay="200ms")
        # Dropping the header is no way around the limit: all such requests share one budget.
        self.assertEqual(fetch(proxy.port, "/shared/1")[0].status, 200)
        for i in range(3):
            self.assertEqual(fetch(proxy.port, f"/shared/{i + 2}")[0].status, 503)
        self.assertEqual(fetch(proxy.port, "/shared/x", key="alice")[0].status, 200, "identified clients are apart")
        r, _ = fetch(proxy.port, "/reject/1")
        self.assertEqual(r.status, 403, r)
        for i in range(3):
            self.assertEqual(fetch(proxy.port, f"/allow/{i}")[0].status, 200, "allow: unlimited")
        m = proxy.metrics()
        self.assertEqual(metric(m, "smockron_proxy_unidentified_total", {"action": "shared"}), 4)
        self.assertEqual(metric(m, "smockron_proxy_unidentified_total", {"action": "reject"}), 1)
        self.assertEqual(metric(m, "smockron_proxy_unidentified_total", {"action": "allow"}), 3)
        self.assertEqual(metric(m, "smockron_proxy_rejects_total", {"reason": "unidentified"}), 1)
        self.assertEqual([e["target"] for e in backend.requests(target_prefix="/reject")], [])


class AmbiguousIdentifierTest(DaemonTestCase):
    """One identifier per request, or none: a source that finds two values is
    refused with 400 (backends disagree about which one counts)."""

    def test_every_source_refuses_two_values(self):
        route = {"domain": "api", "upstream": "app"}
        routes = [dict(route, path="/header", identify=["header:X-Key", "ip"]),
                  dict(route, path="/query", identify=["query:key"]),
                  dict(route, path="/cookie", identify=["cookie:sid"]),
                  dict(route, path="/token", identify=["token"])]
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/m", 1)]}}, routes, max_delay="0s")
        cases = [
            ("/header/a", [("X-Key", "k1")], [("X-Key", "random"), ("X-Key", "k1")]),
            ("/query/a?key=q1", [], None),
            ("/cookie/a", [("Cookie", "sid=c1")], [("Cookie", "sid=random"), ("Cookie", "sid=c1")]),
            ("/token/a", [("Authorization", "Bearer t1")],
             [("Authorization", "Bearer random"), ("Authorization", "Bearer t1")]),
        ]
        for target, one, two in cases:
            self.assertEqual(fetch(proxy.port, target, headers=one)[0].status, 200, target)
            self.assertEqual(fetch(proxy.port, target, headers=one)[0].status, 503, f"{target}: limit spent")
            if two is not None:
                r, _ = fetch(proxy.port, target, headers=two)
                self.assertEqual(r.status, 400, f"{target} with two values: {r.status}")
        for target in ("/query/a?key=random&key=q1", "/query/a?key=q1&key=q1", "/cookie/a"):
            headers = [("Cookie", "sid=random; sid=c1")] if target.startswith("/cookie") else []
            self.assertEqual(fetch(proxy.port, target, headers=headers)[0].status, 400, target)
        self.assertEqual(metric(proxy.metrics(), "smockron_proxy_rejects_total", {"reason": "ambiguous_identifier"}),
                         6)
        # A comma inside one field line is one value.
        self.assertEqual(fetch(proxy.port, "/header/b", headers=[("X-Key", "k2, k1")])[0].status, 200)
        forwarded = [e["target"] for e in backend.requests()]
        self.assertEqual(sorted(t for t in forwarded if not t.startswith("/__warm/")),
                         ["/cookie/a", "/header/a", "/header/b", "/query/a?key=q1", "/token/a"])


class HeldClientLeavesTest(DaemonTestCase):
    """A held client that sent more than its head (a body, a pipelined request)
    and then leaves is seen leaving: dropped, its place freed, never forwarded."""

    GONE = "smockron_proxy_held_client_disconnects_total"

    def held(self, proxy, payload: bytes):
        """Sends `payload` on a fresh connection; returns it once the request is held."""
        held0 = proxy.metric("smockron_proxy_held_requests") or 0
        c = self.closing(RawConn(proxy.port, 10))
        c.send(payload)
        proxy.wait_metric("smockron_proxy_held_requests", predicate=lambda v: v > held0, timeout=5)
        return c

    def test_a_held_post_with_a_body_and_a_pipelined_request(self):
        _, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/4s", 1)]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}], max_delay="20s")
        applied0 = proxy.metric("smockron_proxy_control_messages_total") or 0
        self.assertEqual(fetch(proxy.port, "/first", key="gina")[0].status, 200)
        # Held only once the master's DELAY_UNTIL for gina is here (late on a slow machine).
        proxy.wait_metric("smockron_proxy_control_messages_total", predicate=lambda v: v > applied0, timeout=10)
        gone0 = proxy.metric(self.GONE) or 0
        post = request_bytes("POST", "/upload", [("X-API-Key", "gina")], b"x" * 5000)
        pipelined = (request_bytes("GET", "/held", [("X-API-Key", "gina")])
                     + request_bytes("GET", "/behind", [("X-API-Key", "gina")]))
        for n, payload in enumerate((post, pipelined), start=1):
            c = self.held(proxy, payload)
            c.close()
            proxy.wait_metric(self.GONE, predicate=lambda v: v == gone0 + n, timeout=5)
        proxy.wait_metric("smockron_proxy_held_requests", predicate=lambda v: v == 0, timeout=5)
        # One that stays with its body is forwarded with all of it.
        c = self.held(proxy, request_bytes("POST", "/kept", [("X-API-Key", "gina")], b"y" * 5000))
        r = c.read_response(timeout=25)
        self.assertEqual(r.status, 200, r)
        self.assertEqual([(e["target"], e["body_bytes"]) for e in backend.requests(key="gina")],
                         [("/first", 0), ("/kept", 5000)], "what left was never forwarded")


class ForwardingHeadersTest(DaemonTestCase):
    """Behind a trusted proxy (a TLS load balancer at 127.0.0.1)."""

    def test_the_chain_gets_the_peer_and_a_trusted_proxys_proto_and_host_are_kept(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend, trusted_proxies=["127.0.0.1/32"])
        r, _ = fetch(proxy.port, "/echo", headers=[("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-Proto", "https"),
                                                   ("X-Forwarded-Host", "shop.example")])
        self.assertEqual(r.status, 200, r)
        seen = {k.lower(): v for k, v in r.json()["headers"]}
        self.assertEqual(seen["x-forwarded-for"], "1.2.3.4, 127.0.0.1", "the peer is appended, not the client again")
        self.assertEqual(seen["x-forwarded-proto"], "https", "the load balancer terminated TLS")
        self.assertEqual(seen["x-forwarded-host"], "shop.example")

    def test_rfc_7239_forwarded_names_the_client_when_configured(self):
        fm = self.closing(FakeMaster())
        backend = self.start_backend()
        proxy = self.start_proxy(
            {"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["ip"]}],
            accounting=[fm.accounting], control=[fm.control], trusted_proxies=["127.0.0.1/32"],
            real_ip_header="Forwarded")
        self.wait_accounting(proxy, fake=fm)  # every worker's link subscribed: no message goes unsent
        # The client adds an X-Forwarded-For of its own: only Forwarded is believed.
        hdrs = [("Forwarded", 'for="[2001:db8:cafe::17]:4711";proto=https'), ("X-Forwarded-For", "6.6.6.6")]

        def accounted():
            r, _ = fetch(proxy.port, "/echo", headers=hdrs, host="shop.test")
            self.assertEqual(r.status, 200, r)
            self.last = r
            return fm.recv(0.2)

        m = wait_until(accounted, 10, message="an accounting message")
        self.assertEqual(m.identifier, "2001:db8:cafe::/64")
        seen = [(k.lower(), v) for k, v in self.last.json()["headers"]]
        self.assertEqual([v for k, v in seen if k == "forwarded"],
                         ['for="[2001:db8:cafe::17]:4711";proto=https', 'for=127.0.0.1;host="shop.test";proto=http'])

    def test_an_untrusted_peers_proto_and_host_are_replaced(self):
        backend = self.start_backend()
        proxy = self.simple_proxy(backend)
        r, _ = fetch(proxy.port, "/echo", headers=[("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "evil")],
                     host="shop.test")
        seen = {k.lower(): v for k, v in r.json()["headers"]}
        self.assertEqual((seen["x-forwarded-proto"], seen["x-forwarded-host"]), ("http", "shop.test"))


class ProxyProtocolTest(DaemonTestCase):
    """Behind an L4 balancer (AWS NLB, HAProxy) that names the client in a PROXY header."""

    V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"

    def test_the_client_named_by_the_header_is_the_peer(self):
        fm = self.closing(FakeMaster())
        backend = self.start_backend()
        proxy = self.start_proxy(
            {"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["ip"]}],
            accounting=[fm.accounting], control=[fm.control], proxy_protocol=True)
        self.wait_accounting(proxy, fake=fm)  # every worker's link subscribed: no message goes unsent

        def xff(header: bytes) -> str:
            c = self.closing(RawConn(proxy.port))
            c.send(header + request_bytes("GET", "/echo") + request_bytes("GET", "/echo"))
            first, second = c.read_response(), c.read_response()
            self.assertEqual((first.status, second.status), (200, 200), "keep-alive after the header")
            seen = {k.lower(): v for k, v in first.json()["headers"]}
            return seen["x-forwarded-for"]

        v1 = b"PROXY TCP4 192.0.2.10 127.0.0.1 56324 8080\r\n"
        self.assertEqual(xff(v1), "192.0.2.10")
        v2_inet6 = (self.V2_SIG + bytes([0x21, 0x21, 0, 36]) + bytes.fromhex("20010db8" + "00" * 11 + "07")
                    + bytes(16) + bytes([0x12, 0x34, 0x1f, 0x90]))
        self.assertEqual(xff(v2_inet6), "2001:db8::7")
        self.assertEqual(xff(self.V2_SIG + bytes([0x20, 0x00, 0, 0])), "127.0.0.1", "LOCAL keeps the socket's peer")
        # The header's client is the identifier the master sees (the SUB takes the
        # workers' links in turn, so another client's message may come first).
        m = wait_until(lambda: fm.recv(0.2), 5, message="an accounting message")
        while m.identifier != "192.0.2.10":
            m = wait_until(lambda: fm.recv(0.2), 5, message="the v1 client's accounting")

        # A connection without a valid header is closed unanswered, and counted.
        errors0 = proxy.metric("smockron_proxy_proxy_protocol_errors_total") or 0
        forwarded0 = len(backend.requests())
        for bad in (request_bytes("GET", "/echo"), b"PROXY TCP4 192.0.2.10 127.0.0.1 1\r\n",
                    self.V2_SIG + bytes([0x21, 0x11, 0xff, 0xff])):
            c = self.closing(RawConn(proxy.port))
            c.send(bad)
            self.assertTrue(c.wait_closed(5), bad)
        proxy.wait_metric("smockron_proxy_proxy_protocol_errors_total", predicate=lambda v: v == errors0 + 3)
        self.assertEqual(len(backend.requests()), forwarded0, "nothing of theirs was forwarded")


class ReloadReachesTheNextConnectionTest(DaemonTestCase):
    """A reload applies to the very next connection, on every worker: the
    PROXY header stage of a connection uses the generation in force when it
    was accepted (a worker that last served a connection before the reload
    must not run the new one's first stage with the old generation)."""

    CONNECTIONS = 6  # after each reload; every worker's first is among them

    def test_proxy_protocol_on_off_on(self):
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
                                 [{"path": "/", "upstream": "app"}], proxy_protocol=True, threads=2)
        header = b"PROXY TCP4 192.0.2.10 127.0.0.1 56324 8080\r\n"

        def forwarded_for(data: bytes):
            """The X-Forwarded-For the backend saw for one new connection sending `data`;
            None if the proxy answered otherwise or closed it unanswered."""
            c = self.closing(RawConn(proxy.port))
            c.send(data)
            try:
                r = c.read_response()
            except (ConnectionError, OSError):
                return None
            if r.status != 200:
                return None
            return {k.lower(): v for k, v in r.json()["headers"]}["x-forwarded-for"]

        def reload(on: bool, reloads: int):
            with open(proxy.config_path) as f:
                text = f.read()
            with open(proxy.config_path, "w") as f:
                f.write(text.replace(f"proxy_protocol = {str(not on).lower()}", f"proxy_protocol = {str(on).lower()}"))
            proxy.signal(signal.SIGHUP)
            wait_until(lambda: proxy.log().count("configuration reloaded") == reloads, 10,
                       message="the reload is installed")

        # Each worker serves a connection under the first generation.
        for _ in range(self.CONNECTIONS):
            self.assertEqual(forwarded_for(header + request_bytes("GET", "/echo")), "192.0.2.10")
        reload(False, 1)
        for i in range(self.CONNECTIONS):
            self.assertIsNone(forwarded_for(header + request_bytes("GET", "/echo")),
                              f"connection {i} after proxy_protocol was turned off: its own PROXY line is not honoured")
            self.assertEqual(forwarded_for(request_bytes("GET", "/echo")), "127.0.0.1")
        reload(True, 2)
        for i in range(self.CONNECTIONS):
            self.assertIsNone(forwarded_for(request_bytes("GET", "/echo")),
                              f"connection {i} after proxy_protocol was turned on: a header is required")
            self.assertEqual(forwarded_for(header + request_bytes("GET", "/echo")), "192.0.2.10")


class JwtWithoutKeyTest(DaemonTestCase):
    def test_a_jwt_source_without_a_key_is_a_configuration_error(self):
        path = self.write_file("jwt.toml", """
[proxy.upstreams.app]
servers = ["127.0.0.1:1"]
[[proxy.routes]]
path = "/"
domain = "api"
upstream = "app"
identify = ["jwt:sub"]
""")
        r = run_binary("smockron-proxy", "--config", path, "--check")
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("proxy.routes[0].identify: a jwt: source needs [proxy.jwt]", r.stdout + r.stderr)

    def test_check_reads_the_key_files(self):
        jwks = self.write_file("keys.json", '{"keys": [{"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"}]}')
        path = self.write_file("jwks.toml", f"""
[proxy.jwt]
jwks_file = "{jwks}"
""")
        r = run_binary("smockron-proxy", "--config", path, "--check")
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("proxy.jwt: JWKS file", r.stderr)
        self.assertIn("no RS256, ES256 or HS256 signing key", r.stderr)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_token(secret: bytes, claims: dict, kid: str) -> str:
    header = b64url(json.dumps({"alg": "HS256", "kid": kid}).encode())
    payload = b64url(json.dumps(claims).encode())
    sig = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(sig)}"


class JwksTest(DaemonTestCase):
    """Keys from a JSON Web Key Set, chosen by kid, rotated with SIGHUP; iss and aud checked."""

    def write_jwks(self, path: str, kid: str, secret: bytes) -> None:
        with open(path, "w") as f:
            json.dump({"keys": [{"kid": kid, "kty": "oct", "k": b64url(secret)},
                                {"kid": "enc", "kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"}]}, f)

    def test_tokens_verify_by_kid_and_a_rotated_set_is_read_on_sighup(self):
        jwks = self.write_file("keys.json", "")
        self.write_jwks(jwks, "2026-a", b"first-secret")
        backend = self.start_backend()
        proxy = self.start_proxy(
            {"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["jwt:sub"], "unidentified": "reject"}],
            jwt={"jwks_file": jwks, "issuer": "https://idp.test", "audience": "orders"})
        claims = {"sub": "alice", "iss": "https://idp.test", "aud": ["orders", "billing"]}

        def status(token: str) -> int:
            return fetch(proxy.port, "/x", headers=[("Authorization", f"Bearer {token}")])[0].status

        first = hs256_token(b"first-secret", claims, "2026-a")
        second = hs256_token(b"second-secret", claims, "2026-b")
        self.assertEqual(status(first), 200)
        self.assertEqual(status(second), 403, "a kid the set does not hold")
        self.assertEqual(status(hs256_token(b"first-secret", dict(claims, aud="billing"), "2026-a")), 403,
                         "a token meant for another service")
        self.assertEqual(status(hs256_token(b"first-secret", dict(claims, iss="https://evil.test"), "2026-a")), 403,
                         "a token of another issuer")
        # The identity provider rotates its key: the set is read again on SIGHUP.
        self.write_jwks(jwks, "2026-b", b"second-secret")
        proxy.signal(signal.SIGHUP)
        wait_until(lambda: status(second) == 200, 5, message="the rotated key in use")
        self.assertEqual(status(first), 403, "the retired key no longer verifies")
        # A broken set is a rejected reload; the keys in use stay.
        with open(jwks, "w") as f:
            f.write("{not json")
        proxy.signal(signal.SIGHUP)
        wait_until(lambda: "reload rejected" in proxy.log(), 5, message="reload rejected in the log")
        self.assertIn("keys.json", proxy.log())
        self.assertEqual(status(second), 200)


class CredentialHashingTest(DaemonTestCase):
    def test_a_credential_source_leaves_the_proxy_only_as_a_hash(self):
        fm = self.closing(FakeMaster())
        backend = self.start_backend()
        proxy = self.start_proxy(
            {"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
            [{"path": "/", "domain": "api", "upstream": "app",
              "identify": [{"source": "header:X-API-Key", "hash": True}, "ip"]}],
            accounting=[fm.accounting], control=[fm.control])
        self.wait_accounting(proxy, fake=fm)  # every worker's link subscribed: no message goes unsent
        secret = "live_4f9a2c7e"

        def accounted():
            self.assertEqual(fetch(proxy.port, "/x", key=secret)[0].status, 200)
            return fm.recv(0.2)

        m = wait_until(accounted, 10, message="an accounting message")
        self.assertEqual(m.identifier, "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:32])
        self.assertNotIn(secret.encode(), b"".join(m.frames))
        self.assertEqual(fetch(proxy.port, "/x")[0].status, 200)
        ip_msg = wait_until(lambda: fm.recv(0.2), 5, message="the next source's accounting")
        while ip_msg.identifier != "127.0.0.1":  # earlier requests' messages may still be queued
            ip_msg = wait_until(lambda: fm.recv(0.2), 5, message="the next source's accounting")

    def test_a_hashed_query_credential_is_never_logged_in_clear(self):
        backend = self.start_backend()
        log_path = os.path.join(self.tmp, "access.log")
        proxy = self.start_proxy(
            {"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
            [{"path": "/", "domain": "api", "upstream": "app",
              "identify": [{"source": "query:api_key", "hash": True}, "ip"]}],
            access_log=True, access_log_format="json", access_log_path=log_path)
        secret = "live_9b1e"
        for target in (f"/x?page=2&api_key={secret}", "/nowhere?api%5Fkey=live%5F9b1e"):
            self.assertEqual(fetch(proxy.port, target)[0].status, 200)
        hashed = "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:32]

        def lines():
            with open(log_path) as f:
                return [json.loads(line) for line in f if line.strip()]

        logged = wait_until(lambda: len(lines()) == 2 and lines(), 10, message="two access log lines")
        self.assertEqual([e["target"] for e in logged],
                         [f"/x?page=2&api_key={hashed}", f"/nowhere?api%5Fkey={hashed}"])
        self.assertEqual({e["identifier"] for e in logged}, {hashed})
        with open(log_path) as f:
            self.assertNotIn(secret, f.read())
        self.assertNotIn(secret, proxy.log())
        self.assertNotIn(secret, proxy.get("/status").body)


class Ipv6GroupingTest(DaemonTestCase):
    def test_addresses_of_one_ipv6_64_share_a_limit(self):
        route = {"path": "/", "domain": "api", "upstream": "app", "identify": ["ip"]}
        _, backend, proxy = self.gate_stack({"api": {"rules": [("1/m", 1)]}}, [route], max_delay="200ms",
                                            trusted_proxies=["127.0.0.1/32"])
        first, _ = fetch(proxy.port, "/v6/a", headers=[("X-Forwarded-For", "2001:db8:1:2::a")])
        self.assertEqual(first.status, 200, first)
        for addr in ("2001:db8:1:2::b", "2001:db8:1:2:ffff:ffff:ffff:ffff"):
            r, _ = fetch(proxy.port, "/v6/b", headers=[("X-Forwarded-For", addr)])
            self.assertEqual(r.status, 503, f"{addr} is in the same /64: {r.status}")
        r, _ = fetch(proxy.port, "/v6/c", headers=[("X-Forwarded-For", "2001:db8:1:3::a")])
        self.assertEqual(r.status, 200, "another /64 is another client")


class AllowListTest(DaemonTestCase):
    def test_the_master_refuses_accounting_from_outside_its_allow_list(self):
        # Anyone who reached the accounting port could publish uses for any
        # identifier and get that client throttled.
        master = self.start_master({"api": {"rules": [("1/m", 1)]}}, accounting_allow=["10.0.0.0/8"])
        gk = self.gatekeeper(master, ["api"], handshake=False)
        master.wait_metric("smockron_master_refused_connections_total", {"endpoint": "accounting"},
                           predicate=lambda v: v >= 1, timeout=5)
        gk.accepted("api", "victim", 0)
        self.assertEqual(master.metric("smockron_master_accounting_peers"), 0)
        self.assertEqual(master.metric("smockron_master_accounting_messages_total",
                                       {"domain": "api", "status": "ACCEPTED"}) or 0, 0)

    def test_the_master_refuses_control_subscribers_from_outside_its_allow_list(self):
        # DELAY_UNTIL names the identifiers being limited: not for everyone to read.
        master = self.start_master({"api": {"rules": [("1/m", 1)]}}, control_allow=["10.0.0.0/8"])
        self.gatekeeper(master, ["api"], handshake=False)
        master.wait_metric("smockron_master_refused_connections_total", {"endpoint": "control"},
                           predicate=lambda v: v >= 1, timeout=5)

    def test_an_allow_list_that_includes_the_peer_lets_it_in(self):
        master = self.start_master({"api": {"rules": [("1/m", 1)]}}, control_allow=["127.0.0.0/8"],
                                   accounting_allow=["127.0.0.1/32"])
        self.gatekeeper(master, ["api"])  # the handshake needs both directions: accounting in, control out
        self.assertEqual(master.metric("smockron_master_refused_connections_total", {"endpoint": "control"}) or 0, 0)


if __name__ == "__main__":
    unittest.main()
