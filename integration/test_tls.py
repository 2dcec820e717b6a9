"""TLS (issue 17) with the real binaries: the listener (certificates, SNI,
ALPN, X-Forwarded-Proto, reload on SIGHUP without dropping connections, a
client that does not speak TLS), and upstreams over HTTPS (verification by
CA and name, SNI, a client certificate for a server that asks for one).

Certificates come from a test CA made with the openssl command line for each
test; every server and client is on 127.0.0.1.

Run: cd integration && python3 -m unittest -v test_tls
"""
from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import PROXY, binary  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402
from lib.tls_ca import TestCA  # noqa: E402


def tls_connection(port: int, ca: str, sni: str = "localhost", alpn=("http/1.1",)) -> http.client.HTTPConnection:
    """An HTTP/1.1 keep-alive connection over TLS to 127.0.0.1:port, verified against `ca` for `sni`."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(list(alpn))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.sock = ctx.wrap_socket(raw, server_hostname=sni)
    return conn


def get(conn: http.client.HTTPConnection, path: str, headers: dict | None = None):
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def common_name(conn: http.client.HTTPConnection) -> str:
    cert = conn.sock.getpeercert()
    return next(v for rdn in cert["subject"] for k, v in rdn if k == "commonName")


class TlsListenerTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.ca = TestCA(self.tmp)
        self.cert, self.key = self.ca.issue("server", "localhost", "DNS:localhost,IP:127.0.0.1")

    def proxy(self, backend, **keys):
        keys.setdefault("threads", 2)  # reload tests check every worker's first connection
        return self.start_proxy({"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
                                [{"path": "/", "upstream": "app"}], tls_cert=self.cert, tls_key=self.key, **keys)

    def test_https_keep_alive_alpn_and_forwarded_proto(self):
        backend = self.start_backend()
        proxy = self.proxy(backend)
        h2 = tls_connection(proxy.port, self.ca.cert, alpn=("h2", "http/1.1"))
        self.assertEqual(h2.sock.selected_alpn_protocol(), "h2", "HTTP/2 first when offered (http2 = true)")
        h2.close()
        conn = tls_connection(proxy.port, self.ca.cert, alpn=("http/1.1",))
        self.assertEqual(conn.sock.selected_alpn_protocol(), "http/1.1")
        self.assertIn(conn.sock.version(), ("TLSv1.2", "TLSv1.3"))
        for i in range(3):  # one TLS session, three requests
            status, _, _ = get(conn, f"/ka/{i}", {"X-Forwarded-Proto": "http"})
            self.assertEqual(status, 200)
        conn.close()
        seen = backend.requests(target_prefix="/ka/")
        self.assertEqual(len(seen), 3)
        for e in seen:
            protos = [v for k, v in e["headers"] if k.lower() == "x-forwarded-proto"]
            self.assertEqual(protos, ["https"], "set by the proxy; the client's own is not believed")

        # A client offering only protocols the proxy does not speak goes on without ALPN (HTTP/1.1 then).
        conn = tls_connection(proxy.port, self.ca.cert, alpn=("spdy/3",))
        self.assertIsNone(conn.sock.selected_alpn_protocol())
        self.assertEqual(get(conn, "/spdy-only")[0], 200)
        conn.close()

        # TLS 1.1 is refused; plain HTTP to the TLS port is closed unanswered.
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.load_verify_locations(self.ca.cert)
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
        with self.assertRaises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
                old.wrap_socket(raw, server_hostname="localhost")
        with self.assertRaises(ConnectionError, msg="plain HTTP on the TLS listener gets no response"):
            fetch(proxy.port, "/plain")
        proxy.wait_metric("smockron_proxy_tls_handshake_errors_total", predicate=lambda v: v >= 2, timeout=5)
        self.assertEqual(backend.requests(target_prefix="/plain"), [])

    def test_tls_behind_a_proxy_protocol_header(self):
        # A load balancer (AWS NLB, HAProxy) sends the PROXY header in clear, then the client's TLS.
        backend = self.start_backend()
        proxy = self.proxy(backend, proxy_protocol=True)
        raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        raw.sendall(b"PROXY TCP4 203.0.113.7 127.0.0.1 51000 443\r\n")
        ctx = ssl.create_default_context(cafile=self.ca.cert)
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        conn.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.assertEqual(get(conn, "/behind-lb")[0], 200)
        conn.close()
        [seen] = backend.requests(target_prefix="/behind-lb")
        xff = [v for k, v in seen["headers"] if k.lower() == "x-forwarded-for"]
        self.assertEqual(xff, ["203.0.113.7"], "the client the header names, over TLS")

        # The header and the ClientHello in one segment: the bytes read behind the
        # header are the handshake's start.
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            with self.assertRaises(ssl.SSLWantReadError):
                tls.do_handshake()
            raw.sendall(b"PROXY TCP4 203.0.113.8 127.0.0.1 51001 443\r\n" + outgoing.read())
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    raw.sendall(outgoing.read())
                    incoming.write(raw.recv(65536))
            raw.sendall(outgoing.read())
            tls.write(b"GET /coalesced HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw.sendall(outgoing.read())
            response = b""
            while b"\r\n\r\n" not in response:
                try:
                    response += tls.read(65536)
                except ssl.SSLWantReadError:
                    data = raw.recv(65536)
                    if not data:
                        break
                    incoming.write(data)
        self.assertTrue(response.startswith(b"HTTP/1.1 200"), response[:80])
        [seen] = backend.requests(target_prefix="/coalesced")
        self.assertIn(["X-Forwarded-For", "203.0.113.8"], [[k, v] for k, v in seen["headers"]])

    def test_a_request_held_on_a_tls_connection(self):
        # The master's rule (1 per 3 s, burst 1; the gate's own guard from its POLICY
        # too) holds the second request of one TLS keep-alive connection for about 3 s;
        # held, the client is watched through the TLS session (conn_io.cpp hold()), and
        # the request then goes on. The hold is long on purpose: sending /second, seeing
        # it held and sending /third all fit in it many times over on a slow machine.
        master = self.start_master({"api": {"rules": [("1/3s", 1)]}})
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"127.0.0.1:{backend.port}"]}},
                                 [{"path": "/", "domain": "api", "upstream": "app",
                                   "identify": ["header:X-API-Key"], "explain": True}],
                                 accounting=[master.accounting], control=[master.control],
                                 tls_cert=self.cert, tls_key=self.key, max_delay="10s")
        proxy.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v > 0, timeout=10)
        conn = tls_connection(proxy.port, self.ca.cert)
        conn.sock.settimeout(20)  # the answers below come after the hold
        status, headers, _ = get(conn, "/first", {"X-API-Key": "tina"})
        self.assertEqual((status, headers.get("smockron-decision")), (200, "accepted"))
        # Pipelined: the third request arrives while the second is held, and is read
        # (decrypted) into the held request's early bytes, then served after it.
        conn.sock.sendall(b"GET /second HTTP/1.1\r\nHost: x\r\nX-API-Key: tina\r\n\r\n")
        proxy.wait_metric("smockron_proxy_held_requests", predicate=lambda v: v == 1, timeout=5)
        conn.sock.sendall(b"GET /third HTTP/1.1\r\nHost: x\r\nX-API-Key: tom\r\n\r\n")
        # The premise: /third was sent while /second was still held (else hold() had nothing to read).
        self.assertEqual(proxy.metric("smockron_proxy_held_requests"), 1, "the hold ended before /third was sent")
        answers = []
        for _ in range(2):
            r = http.client.HTTPResponse(conn.sock)
            r.begin()
            r.read()
            answers.append((r.status, r.getheader("Smockron-Decision", "")))
        conn.close()
        self.assertEqual(answers[0][0], 200)
        self.assertRegex(answers[0][1], r"^delayed;held_ms=\d+$")
        # Really held (for most of the 3 s interval), not passed after a scheduling tick.
        self.assertGreater(int(answers[0][1].split("=")[1]), 1000)
        self.assertEqual(answers[1], (200, "accepted"), "the pipelined request, after the hold")
        self.assertEqual([e["target"] for e in backend.requests(target_prefix="/")], ["/first", "/second", "/third"])

    def test_sni_chooses_the_certificate(self):
        other, other_key = self.ca.issue("other", "other.test", "DNS:other.test,DNS:*.wild.test")
        backend = self.start_backend()
        proxy = self.proxy(backend, tls_sni=[{"cert": other, "key": other_key}])
        # (SNI, the certificate served, whether it is valid for that name)
        for sni, cn, valid in (("localhost", "localhost", True), ("a.wild.test", "other.test", True),
                               ("other.test", "other.test", True), ("unknown.test", "localhost", False)):
            ctx = ssl.create_default_context(cafile=self.ca.cert)
            ctx.check_hostname = valid  # a name no certificate covers gets the default one
            raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
            conn.sock = ctx.wrap_socket(raw, server_hostname=sni)
            self.assertEqual(common_name(conn), cn, sni)
            self.assertEqual(get(conn, f"/sni/{sni}")[0], 200)
            conn.close()

    def test_certificates_reload_on_sighup_without_dropping_connections(self):
        backend = self.start_backend()
        proxy = self.proxy(backend)
        before = tls_connection(proxy.port, self.ca.cert)
        self.assertEqual(get(before, "/before")[0], 200)
        self.assertEqual(common_name(before), "localhost")

        # Rotated in place (same paths), as certbot or a secret mount does.
        new_cert, new_key = self.ca.issue("rotated", "localhost", "DNS:localhost,IP:127.0.0.1")
        os.replace(new_cert, self.cert)
        os.replace(new_key, self.key)
        proxy.signal(signal.SIGHUP)

        def serial(conn) -> str:
            return conn.sock.getpeercert()["serialNumber"]

        old_serial = serial(before)
        wait_until(lambda: "configuration reloaded" in proxy.log(), 10, message="the reload is installed")
        # The very first connections after it (every worker's first among them) get the new certificate.
        for i in range(6):
            conn = tls_connection(proxy.port, self.ca.cert)
            self.assertNotEqual(serial(conn), old_serial, f"connection {i} after the reload")
            conn.close()
        self.assertEqual(get(before, "/after-reload")[0], 200, "the open connection goes on")
        before.close()

        # A broken file rejects the reload: the certificate in use stays.
        with open(self.key, "w") as f:
            f.write("not a key\n")
        proxy.signal(signal.SIGHUP)
        wait_until(lambda: "reload rejected" in proxy.log(), 10)
        self.assertIn("cannot load key", proxy.log())
        conn = tls_connection(proxy.port, self.ca.cert)
        self.assertEqual(get(conn, "/still")[0], 200)
        conn.close()

    def test_check_loads_the_certificate(self):
        bad = os.path.join(self.tmp, "bad.pem")
        with open(bad, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
        _, other_key = self.ca.issue("other", "other.test", "DNS:other.test")
        for cert, key, expected in ((bad, self.key, "cannot load certificate"),
                                    (self.cert, other_key, "key values mismatch")):
            path = self.write_file("check.toml", f'[proxy]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
            r = subprocess.run([binary(PROXY), "--config", path, "--check"], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(expected, r.stdout + r.stderr)
        path = self.write_file("check.toml", f'[proxy]\ntls_cert = "{self.cert}"\ntls_key = "{self.key}"\n')
        r = subprocess.run([binary(PROXY), "--config", path, "--check"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class TlsUpstreamTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.ca = TestCA(self.tmp)
        # clientAuth too: the test reads the backend's request log over TLS with it (lib/backends.py).
        self.cert, self.key = self.ca.issue("backend", "backend.test", "DNS:backend.test,IP:127.0.0.1",
                                            "serverAuth,clientAuth")

    def test_https_upstreams_verified_by_ca_and_name(self):
        backend = self.start_backend(tls=(self.cert, self.key))
        os.makedirs(os.path.join(self.tmp, "other-ca"))
        wrong_ca = TestCA(os.path.join(self.tmp, "other-ca"))
        server = f"127.0.0.1:{backend.port}"
        proxy = self.start_proxy(
            {"ip": {"servers": [server], "tls": True, "tls_ca": self.ca.cert},
             "named": {"servers": [server], "tls": True, "tls_ca": self.ca.cert, "tls_server_name": "backend.test"},
             "wrong_name": {"servers": [server], "tls": True, "tls_ca": self.ca.cert,
                            "tls_server_name": "other.test"},
             "wrong_ca": {"servers": [server], "tls": True, "tls_ca": wrong_ca.cert},
             "unverified": {"servers": [server], "tls": True, "tls_verify": False},
             "plain": {"servers": [server]}},
            [{"path": f"/{name}", "upstream": name}
             for name in ("ip", "named", "wrong_name", "wrong_ca", "unverified", "plain")])
        for name in ("ip", "named", "unverified"):
            for i in range(3):  # the TLS connection is pooled and reused
                r, _ = fetch(proxy.port, f"/{name}/{i}")
                self.assertEqual(r.status, 200, (name, r))
        for name in ("wrong_name", "wrong_ca"):
            r, _ = fetch(proxy.port, f"/{name}/x")
            self.assertEqual(r.status, 502, (name, r))
        self.assertIn("certificate verify failed", proxy.log())
        self.assertGreaterEqual(proxy.metric("smockron_proxy_upstream_errors_total", {"kind": "tls"}), 2)
        r, _ = fetch(proxy.port, "/plain/x")
        self.assertIn(r.status if r else 0, (0, 400, 502), "plain HTTP to an HTTPS server does not pass")
        self.assertEqual(len(backend.requests(target_prefix="/ip/")), 3)
        self.assertEqual(len(backend.requests(target_prefix="/named/")), 3)
        self.assertEqual(backend.requests(target_prefix="/wrong"), [])

    def test_client_certificate_for_a_server_that_asks(self):
        client_cert, client_key = self.ca.issue("client", "smockron-proxy", "DNS:smockron-proxy", "clientAuth")
        backend = self.start_backend(tls=(self.cert, self.key, self.ca.cert))  # client certificates required
        server = f"127.0.0.1:{backend.port}"
        proxy = self.start_proxy(
            {"with": {"servers": [server], "tls": True, "tls_ca": self.ca.cert,
                      "tls_client_cert": client_cert, "tls_client_key": client_key},
             "without": {"servers": [server], "tls": True, "tls_ca": self.ca.cert}},
            [{"path": "/with", "upstream": "with"}, {"path": "/without", "upstream": "without"}])
        r, _ = fetch(proxy.port, "/with/1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual([e["client_cert"] for e in backend.requests(target_prefix="/with")], ["smockron-proxy"])
        r, _ = fetch(proxy.port, "/without/1")
        self.assertEqual(r.status, 502, r)
        self.assertEqual(backend.requests(target_prefix="/without"), [])


if __name__ == "__main__":
    unittest.main()
