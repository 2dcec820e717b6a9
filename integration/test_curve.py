"""Trusted links: CURVE on accounting and control between the real daemons, with
libzmq (pyzmq) on the other end both ways, and everything else refused before
it reaches the rules: no key, an unknown key, a wrong master key, a tampered
box, a replayed or reordered nonce, a flood of HELLOs. Keys are made by the
real `smockron-query keygen`.

Run: cd integration && python3 -m unittest -v test_curve
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.config import master_toml  # noqa: E402
from lib.daemons import run_binary  # noqa: E402
from lib.gatekeeper import FakeMaster, Gatekeeper  # noqa: E402
from lib.http1 import fetch, http_get  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import WaitTimeout, now_ms, wait_until  # noqa: E402

DISCONNECTS = "smockron_master_accounting_disconnects_total"
CONTROL_DISCONNECTS = "smockron_master_control_disconnects_total"
ACCOUNTED = "smockron_master_accounting_messages_total"


def tracked(master, identifier: str) -> bool:
    """Whether the master holds a state for api/identifier (something was charged)."""
    r = master.get(f"/status/api/{identifier}")
    return r.status == 200 and json.loads(r.body)["tracked"]


class Keys:
    """A keypair written by `smockron-query keygen PATH` (PATH.key, PATH.pub)."""

    def __init__(self, directory: str, name: str):
        self.path = os.path.join(directory, name)
        r = run_binary("smockron-query", "keygen", self.path)
        if r.returncode != 0:
            raise AssertionError(f"keygen failed: {r.stderr}")
        self.key_file, self.pub_file = self.path + ".key", self.path + ".pub"
        with open(self.pub_file, encoding="ascii") as f:
            self.public = f.read().strip().encode()
        with open(self.key_file, encoding="ascii") as f:
            self.secret = [line for line in f.read().splitlines() if line and not line.startswith("#")][0].encode()


class CurveCase(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.master_keys = Keys(self.tmp, "master")
        self.gk_keys = Keys(self.tmp, "gatekeeper")
        self.allowed = self.write_file("allowed.keys", "# the gatekeepers\n" + self.gk_keys.public.decode() + "  gk-1\n")

    def curve_master(self, domains=None, **keys):
        domains = domains or {"api": {"rules": [("2/s", 2)]}}
        return self.start_master(domains, curve_secret_key=self.master_keys.key_file,
                                 curve_allowed_keys=self.allowed, **keys)

    def curve_gatekeeper(self, master, keys: Keys | None = None, server: bytes | None = None,
                         handshake: bool = True) -> Gatekeeper:
        k = keys or self.gk_keys
        gk = self.closing(Gatekeeper(master.accounting, master.control, ["api"],
                                     curve=(k.public, k.secret, server or self.master_keys.public)))
        if handshake:
            gk.handshake(10)
        return gk

    def disconnects(self, master, reason: str) -> float:
        return master.metric(DISCONNECTS, {"reason": reason}) or 0

    def assert_refused(self, master, reason: str, gk: Gatekeeper, before: float) -> None:
        """The master closed the gatekeeper's connections for `reason`, and what it sent charged nothing."""
        accounted = master.metric(ACCOUNTED, {"domain": "api", "status": "ACCEPTED"}) or 0
        for i in range(3):
            gk.accepted("api", f"intruder-{i}", now_ms())
        master.wait_metric(DISCONNECTS, {"reason": reason}, predicate=lambda v: v > before, timeout=10)
        self.assertEqual(master.metric(ACCOUNTED, {"domain": "api", "status": "ACCEPTED"}) or 0, accounted, "nothing reached the rules")
        self.assertFalse(tracked(master, "intruder-0"), "no state for what it sent")


class CurveLinksTest(CurveCase):
    def test_a_proxy_and_a_master_with_keys_limit_through_both_links(self):
        master, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/h", 2)]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}],
            master_keys={"curve_secret_key": self.master_keys.key_file, "curve_allowed_keys": self.allowed},
            curve_secret_key=self.gk_keys.key_file, curve_master_key=self.master_keys.pub_file,
            max_delay="0s")
        # Over the burst on this proxy alone: refused after the master's DELAY_UNTIL came back over CURVE.
        codes = [fetch(proxy.port, "/x", key="curve-client")[0].status for _ in range(3)]
        self.assertEqual(codes[:2], [200, 200])
        wait_until(lambda: tracked(master, "curve-client"), 5, message="the master's state")
        wait_until(lambda: fetch(proxy.port, "/x", key="curve-client")[0].status in (429, 503), 5,
                   message="the master's DELAY_UNTIL over CURVE")
        self.assertEqual(self.disconnects(master, "mechanism"), 0)
        # The operator's view says so.
        self.assertEqual(json.loads(master.get("/status").body)["links"],
                         {"mechanism": "CURVE", "master_keys": 1, "gatekeeper_keys": 1})
        self.assertEqual(json.loads(proxy.get("/status").body)["masters"]["mechanism"], "CURVE")

    def test_a_libzmq_curve_gatekeeper_talks_to_the_master_both_ways(self):
        # pyzmq PUB -> our CURVE server (accounting); our CURVE server PUB -> pyzmq SUB (control).
        master = self.curve_master()
        gk = self.curve_gatekeeper(master)
        for _ in range(3):
            gk.accepted("api", "libzmq-client", now_ms())
        msg = gk.expect(5)
        self.assertEqual((msg.domain, msg.identifier), ("api", "libzmq-client"))

    def test_the_proxys_accounting_reaches_a_libzmq_curve_subscriber(self):
        # Our CURVE client (the proxy's accounting PUB) -> a pyzmq SUB that is a CURVE server.
        fm = self.closing(FakeMaster(curve_secret=self.master_keys.secret))
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}},
                                 [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}],
                                 accounting=[fm.accounting], control=[fm.control],
                                 curve_secret_key=self.gk_keys.key_file, curve_master_key=self.master_keys.public.decode())
        self.wait_accounting(proxy, fake=fm)
        self.assertEqual(fetch(proxy.port, "/x", key="seen-by-libzmq")[0].status, 200)
        m = wait_until(lambda: fm.recv(0.2), 5, message="the proxy's accounting through CURVE")
        self.assertEqual((m.domain, m.status, m.identifier), ("api", "ACCEPTED", "seen-by-libzmq"))
        # And the control link: libzmq CURVE client (the proxy's SUB) to the pyzmq CURVE PUB.
        wait_until(lambda: "masters connected: 1/1" in proxy.readyz(), 10, message="the control handshake")


class RefusedPeersTest(CurveCase):
    def test_a_plaintext_peer_is_refused(self):
        master = self.curve_master()
        accounted = master.metric(ACCOUNTED, {"domain": "api", "status": "ACCEPTED"}) or 0
        # libzmq reads our greeting as soon as its connection is up and, when
        # it comes before libzmq's own greeting has left, closes having sent
        # nothing (and does not connect again after a mechanism mismatch): the
        # master cannot tell that from any peer that came and went. Each try
        # is a new peer; one whose greeting left is counted as a mismatch.
        for attempt in range(10):
            before = self.disconnects(master, "mechanism")
            gk = self.closing(Gatekeeper(master.accounting, master.control, ["api"]))
            for i in range(3):
                gk.accepted("api", f"intruder-{i}", now_ms())
            try:
                master.wait_metric(DISCONNECTS, {"reason": "mechanism"}, predicate=lambda v: v > before, timeout=3)
                break
            except WaitTimeout:
                gk.close()
        else:
            self.fail("no plaintext peer was refused for its mechanism in 10 tries")
        self.assertEqual(master.metric(ACCOUNTED, {"domain": "api", "status": "ACCEPTED"}) or 0, accounted, "nothing reached the rules")
        self.assertFalse(tracked(master, "intruder-0"), "no state for what it sent")

    def test_an_unlisted_key_is_refused(self):
        master = self.curve_master()
        before = self.disconnects(master, "unknown_key")
        stranger = Keys(self.tmp, "stranger")
        gk = self.curve_gatekeeper(master, keys=stranger, handshake=False)
        self.assert_refused(master, "unknown_key", gk, before)
        # Its control SUB too: refused by the control endpoint, for the same reason.
        master.wait_metric(CONTROL_DISCONNECTS, {"reason": "unknown_key"}, predicate=lambda v: v > 0, timeout=10)
        self.assertIsNone(gk.recv(0.3), "no control either")

    def test_a_gatekeeper_with_the_wrong_master_key_is_refused(self):
        master = self.curve_master()
        before = self.disconnects(master, "bad_box")
        other = Keys(self.tmp, "not-the-master")
        gk = self.curve_gatekeeper(master, server=other.public, handshake=False)
        self.assert_refused(master, "bad_box", gk, before)
        master.wait_metric(CONTROL_DISCONNECTS, {"reason": "bad_box"}, predicate=lambda v: v > 0, timeout=10)

    def test_a_hello_flood_leaves_the_master_deciding(self):
        master = self.curve_master()
        gk = self.curve_gatekeeper(master)
        before = self.disconnects(master, "bad_box")
        greeting = b"\xff" + b"\0" * 8 + b"\x7f\x03\x00CURVE" + b"\0" * 15 + b"\0" + b"\0" * 31
        hello = b"\x04\xc8\x05HELLO\x01\x00" + os.urandom(192)
        stop = threading.Event()
        sent = [0]

        def flood():
            # Counted once the master closed the connection: it has then judged the HELLO.
            while not stop.is_set() and sent[0] < 300:
                try:
                    with socket.create_connection((HOST, master.accounting_port), timeout=10) as s:
                        s.sendall(greeting + hello)
                        while s.recv(1024):
                            pass
                    sent[0] += 1
                except OSError:
                    pass

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        try:
            wait_until(lambda: sent[0] >= 5, 30, message="the flood under way")
            for i in range(3):  # decisions for the gatekeeper with a key go on meanwhile
                gk.accepted("api", "during-flood", now_ms())
            self.assertEqual(gk.expect(10).identifier, "during-flood")
            wait_until(lambda: sent[0] >= 20, 30, message="20 bogus HELLOs judged")
        finally:
            stop.set()
            t.join(15)
        master.wait_metric(DISCONNECTS, {"reason": "bad_box"}, predicate=lambda v: v >= before + min(sent[0], 50),
                           timeout=10)


class RelayedTest(CurveCase):
    """A relay between the proxy and the master sees every byte: it can read
    nothing, and a box it changes, replays or reorders is refused."""

    def relayed_stack(self, mangle=None, burst: int = 1000, relay_control: bool = False):
        master = self.curve_master({"api": {"rules": [("1/h", burst)]}})
        relay = self.closing(Relay(master.accounting_port, mangle))
        control = master.control
        if relay_control:
            self.control_relay = self.closing(Relay(master.control_port))
            control = f"tcp://{HOST}:{self.control_relay.port}"
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}},
                                 [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}],
                                 accounting=[f"tcp://{HOST}:{relay.port}"], control=[control],
                                 curve_secret_key=self.gk_keys.key_file, curve_master_key=self.master_keys.pub_file,
                                 threads=1, max_delay="0s")
        self.wait_accounting(proxy)
        return master, relay, proxy

    def test_identifiers_never_cross_the_wire_in_clear(self):
        # Both links through relays that record both directions: the accounting
        # (ACCEPTED, and the master's subscriptions) and the control (the
        # DELAY_UNTIL naming the identifier, POLICY).
        master, relay, proxy = self.relayed_stack(burst=3, relay_control=True)
        secret_id = "tenant-7f3a9c-unique-identifier"
        for _ in range(3):
            self.assertEqual(fetch(proxy.port, "/x", key=secret_id)[0].status, 200)
        wait_until(lambda: tracked(master, secret_id), 5, message="the accounting arrived")
        wait_until(lambda: fetch(proxy.port, "/x", key=secret_id)[0].status in (429, 503), 10,
                   message="the master's DELAY_UNTIL for it came back through the control relay")
        for name, wire, least in (("accounting", relay.captured(), 500), ("control", self.control_relay.captured(), 200)):
            self.assertGreater(len(wire), least, name)
            for needle in (secret_id.encode(), b"ACCEPTED", b"DELAY_UNTIL", b"POLICY", b"api\0"):
                self.assertNotIn(needle, wire, f"{needle!r} visible on the {name} link")
        self.assertGreater(len(self.control_relay.captured(from_client=False)), 0, "the master's side was recorded")

    def mangled(self, mangle, reason: str):
        master, relay, proxy = self.relayed_stack(mangle)
        before = self.disconnects(master, reason)
        n = 0

        def refused():
            nonlocal n
            n += 1
            fetch(proxy.port, "/x", key=f"k{n}")
            return self.disconnects(master, reason) > before

        wait_until(refused, 10, message=f"a disconnect for {reason}")
        self.assertFalse(tracked(master, "k1"), "the mangled message was not charged")

    def test_a_tampered_box_is_refused(self):
        def flip(frame: bytes, index: int) -> list[bytes]:
            if index == 0:  # the first MESSAGE: one bit of its box flipped
                return [frame[:-1] + bytes([frame[-1] ^ 1])]
            return [frame]
        self.mangled(flip, "bad_box")

    def test_a_replayed_message_is_refused(self):
        self.mangled(lambda frame, index: [frame, frame] if index == 0 else [frame], "nonce")

    def test_reordered_messages_are_refused(self):
        held = []

        def swap(frame: bytes, index: int) -> list[bytes]:
            if index == 0:
                held.append(frame)
                return []
            if index == 1:
                return [frame, held[0]]
            return [frame]
        self.mangled(swap, "nonce")


class RotationTest(CurveCase):
    def test_a_reload_adds_and_removes_gatekeepers(self):
        master = self.curve_master()
        gk = self.curve_gatekeeper(master)
        second = Keys(self.tmp, "second")
        # Removed from the list: its connection is closed, and it cannot come back.
        before = self.disconnects(master, "unknown_key")
        with open(self.allowed, "w", encoding="ascii") as f:
            f.write(second.public.decode() + "\n")
        master.signal(signal.SIGHUP)
        master.wait_metric(DISCONNECTS, {"reason": "unknown_key"}, predicate=lambda v: v > before, timeout=10)
        self.curve_gatekeeper(master, keys=second)  # the added one is in
        with self.assertRaises(WaitTimeout):
            gk.handshake(1.5)

    def test_a_master_key_rotated_by_two_reloads_loses_nothing(self):
        domains = {"api": {"rules": [("1/h", 3)]}}
        nxt = Keys(self.tmp, "master-next")
        master = self.curve_master(domains)
        old_gk = self.curve_gatekeeper(master)  # on the current key, soon the previous one
        connections = master.metric("smockron_master_accounting_connections_total")
        accepted = master.metric(ACCOUNTED, {"domain": "api", "status": "ACCEPTED"}) or 0

        def reload(*secret_keys):
            n = master.metric("smockron_master_reloads_total") or 0
            self.write_file("master.toml", master_toml(master.accounting_port, master.control_port, master.admin_port,
                                                       domains, curve_secret_key=list(secret_keys),
                                                       curve_allowed_keys=self.allowed))
            master.signal(signal.SIGHUP)
            master.wait_metric("smockron_master_reloads_total", predicate=lambda v: v > n)

        def throttled(gk, identifier: str) -> None:
            """`identifier`'s DELAY_UNTIL comes back to `gk` (what others caused is skipped)."""
            wait_until(lambda: (m := gk.recv(0.5)) is not None and m.identifier == identifier, 10,
                       message=f"{identifier}'s DELAY_UNTIL")

        # The next key added: the connection made with the previous one goes on through the reload.
        for _ in range(2):
            old_gk.accepted("api", "across-the-reload", now_ms())
        reload(nxt.key_file, self.master_keys.key_file)
        for _ in range(2):
            old_gk.accepted("api", "across-the-reload", now_ms())
        throttled(old_gk, "across-the-reload")  # the 4th over a burst of 3: all four charged
        master.wait_metric(ACCOUNTED, {"domain": "api", "status": "ACCEPTED"}, predicate=lambda v: v >= accepted + 4)
        self.assertEqual(master.metric("smockron_master_accounting_connections_total"), connections,
                         "the reload kept the connection")
        new_gk = self.curve_gatekeeper(master, server=nxt.public)

        # The previous key retired: its connections closed, and a gatekeeper holding only that
        # key is refused when it connects again; the one on the next key goes on.
        bad_box = self.disconnects(master, "bad_box")
        reload(nxt.key_file)
        master.wait_metric(DISCONNECTS, {"reason": "bad_box"}, predicate=lambda v: v > bad_box, timeout=10)
        self.assertEqual(self.disconnects(master, "unknown_key"), 0, "a retired master key is not an unknown key")
        for _ in range(4):
            new_gk.accepted("api", "after-the-rotation", now_ms())
        throttled(new_gk, "after-the-rotation")
        self.assertEqual(json.loads(master.get("/status").body)["links"]["master_keys"], 1)

    def test_two_master_keys_overlap_during_a_rotation(self):
        new = Keys(self.tmp, "master-next")
        master = self.start_master({"api": {"rules": [("2/s", 2)]}},
                                   curve_secret_key=[new.key_file, self.master_keys.key_file],
                                   curve_allowed_keys=self.allowed)
        self.curve_gatekeeper(master, server=self.master_keys.public)  # still on the previous key
        self.curve_gatekeeper(master, server=new.public)  # already on the next one


class AdminTokenTest(CurveCase):
    def test_what_names_identifiers_needs_the_token_and_scrapers_do_not(self):
        token = "t0ken-of-the-operators-2026"
        master = self.curve_master(admin_token_file=self.write_file("admin.token", token + "\n"))
        gk = self.curve_gatekeeper(master)
        for _ in range(3):
            gk.accepted("api", "someone", now_ms())
        gk.expect(5)
        bearer = {"Authorization": f"Bearer {token}"}
        for path in ("/status/api/someone", "/top"):
            self.assertEqual(http_get(master.admin_port, path).status, 401, path)
            self.assertEqual(http_get(master.admin_port, path, headers={"Authorization": "Bearer wrong"}).status, 401)
            r = http_get(master.admin_port, path, headers=bearer)
            self.assertEqual(r.status, 200, path)
            self.assertIn("someone", r.body)
        for path in ("/metrics", "/livez", "/readyz", "/status", "/"):
            self.assertEqual(http_get(master.admin_port, path).status, 200, path)
        self.assertNotIn("someone", http_get(master.admin_port, "/status").body)


class CheckWarnsTest(CurveCase):
    def test_check_warns_of_plaintext_off_this_host_and_of_an_open_secret_key(self):
        plain = self.write_file("plain.toml", '[master]\naccounting = "tcp://0.0.0.0:10004"\n'
                                              '[master.domains.api]\nrules = []\n')
        r = run_binary("smockron-master", "--check", "--config", plain)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: [master] accounting tcp://0.0.0.0:10004 is not loopback or IPC", r.stderr)
        os.chmod(self.master_keys.key_file, 0o644)
        keyed = self.write_file("keyed.toml", f'[master]\naccounting = "tcp://0.0.0.0:10004"\n'
                                              f'curve_secret_key = "{self.master_keys.key_file}"\n'
                                              f'curve_allowed_keys = "{self.allowed}"\n'
                                              '[master.domains.api]\nrules = []\n')
        r = run_binary("smockron-master", "--check", "--config", keyed)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("is not loopback", r.stderr, "keys given: no plaintext warning")
        self.assertIn("is readable by its group or others", r.stderr)
        os.chmod(self.master_keys.key_file, 0o600)
        self.assertNotIn("warning", run_binary("smockron-master", "--check", "--config", keyed).stderr)


class Relay:
    """A TCP relay from a port of its own to `port`: records what each side
    sends, and after the CURVE handshake passes each MESSAGE frame the client
    sends through `mangle(frame_bytes, index)`, which returns the frames to
    send instead."""

    def __init__(self, port: int, mangle=None):
        self.target = port
        self.mangle = mangle
        self.listener = socket.socket()
        self.listener.bind((HOST, 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sent = {True: bytearray(), False: bytearray()}  # by from_client
        self.closed = False
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def captured(self, from_client: bool | None = None) -> bytes:
        """What the client sent (True), the server (False), or both (None)."""
        with self.lock:
            if from_client is None:
                return bytes(self.sent[True] + self.sent[False])
            return bytes(self.sent[from_client])

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection((HOST, self.target))
            except OSError:
                return
            self.socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()

    def _pipe(self, src, dst, from_client: bool):
        buf = b""
        greeted = False
        messages = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not from_client or self.mangle is None:
                    with self.lock:
                        self.sent[from_client] += data
                    dst.sendall(data)
                    continue
                buf += data
                out = b""
                if not greeted:
                    if len(buf) < 64:
                        continue
                    out, buf, greeted = buf[:64], buf[64:], True
                while len(buf) >= 2:
                    flags = buf[0]
                    if flags & 0x02:
                        if len(buf) < 9:
                            break
                        size, header = int.from_bytes(buf[1:9], "big"), 9
                    else:
                        size, header = buf[1], 2
                    if len(buf) < header + size:
                        break
                    frame, buf = buf[:header + size], buf[header + size:]
                    if frame[header:header + 8] == b"\x07MESSAGE":
                        for f in self.mangle(frame, messages):
                            out += f
                        messages += 1
                    else:
                        out += frame
                with self.lock:
                    self.sent[True] += out
                dst.sendall(out)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.closed = True
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


if __name__ == "__main__":
    unittest.main()
