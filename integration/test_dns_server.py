"""lib/dns_server.py's DnsServer against real clients: queries built here byte by
byte and sent over UDP and TCP (and dig, when installed). Needs none of the
project's binaries.

Run: python3 integration/test_dns_server.py -v
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.dns_server import DnsServer  # noqa: E402
from lib.ports import HOST  # noqa: E402

A, AAAA, SRV, OPT, TXT = 1, 28, 33, 41, 16
NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3
QR, AA, TC, RD = 0x8000, 0x0400, 0x0200, 0x0100
TIMEOUT = 0.5   # a dropped query is a timeout of this long: keep it short


def wire_name(name: str) -> bytes:
    return b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split(".")) + b"\0"


def build_query(name: str, qtype: int, qid: int = 0x1234, edns_size: int | None = None) -> bytes:
    """A one-question query with RD set, with an OPT record when edns_size is given."""
    msg = struct.pack("!HHHHHH", qid, RD, 1, 0, 0, 1 if edns_size else 0)
    msg += wire_name(name) + struct.pack("!HH", qtype, 1)
    if edns_size:
        msg += b"\0" + struct.pack("!HHIH", OPT, edns_size, 0, 0)
    return msg


def read_name(msg: bytes, off: int) -> tuple[str, int]:
    """The name at off (compression pointers followed) and the offset after it."""
    labels, end = [], None
    for _ in range(128):
        n = msg[off]
        if n & 0xC0 == 0xC0:
            end = off + 2 if end is None else end
            off = ((n & 0x3F) << 8) | msg[off + 1]
            continue
        if n == 0:
            return ".".join(labels), (off + 1 if end is None else end)
        labels.append(msg[off + 1:off + 1 + n].decode())
        off += 1 + n
    raise AssertionError("pointer loop in the answer")


class Answer:
    """A parsed response: header fields, the question, records as
    (name, type, ttl, value) with value an address string, an SRV tuple or raw bytes."""

    def __init__(self, raw: bytes):
        self.raw = raw
        self.id, self.flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", raw)
        self.rcode = self.flags & 0xF
        self.answer_offset = 0
        off = 12
        self.question = []
        for _ in range(qd):
            name, off = read_name(raw, off)
            self.question.append((name, *struct.unpack_from("!HH", raw, off)))
            off += 4
        self.answer_offset = off
        self.answers, off = self._records(off, an)
        self.authority, off = self._records(off, ns)
        self.additional, off = self._records(off, ar)
        assert off == len(raw), f"{len(raw) - off} bytes after the last record"

    def _records(self, off: int, count: int):
        out = []
        for _ in range(count):
            name, off = read_name(self.raw, off)
            rtype, _, ttl, rdlen = struct.unpack_from("!HHIH", self.raw, off)
            off += 10
            rdata = self.raw[off:off + rdlen]
            if rtype in (A, AAAA):
                value = str(ipaddress.ip_address(rdata))
            elif rtype == SRV:
                value = struct.unpack_from("!HHH", rdata) + (read_name(self.raw, off + 6)[0],)
            else:
                value = rdata
            out.append((name, rtype, ttl, value))
            off += rdlen
        return out, off


def udp_exchange(port: int, msg: bytes, timeout: float = TIMEOUT) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(msg, (HOST, port))
        return s.recv(65535)


def tcp_exchange(port: int, msg: bytes, timeout: float = TIMEOUT) -> bytes:
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(struct.pack("!H", len(msg)) + msg)
        buf = b""
        while len(buf) < 2 or len(buf) < 2 + struct.unpack_from("!H", buf)[0]:
            data = s.recv(65535)
            if not data:
                raise ConnectionError("closed before a whole answer")
            buf += data
        return buf[2:2 + struct.unpack_from("!H", buf)[0]]


class DnsServerTest(unittest.TestCase):
    def setUp(self):
        self.dns = DnsServer().start()
        self.addCleanup(self.dns.stop)

    def tearDown(self):
        self.assertEqual(self.dns.errors, [], "exceptions in the server thread")

    def ask(self, name: str, qtype: int, tcp: bool = False, **kw) -> Answer:
        exchange = tcp_exchange if tcp else udp_exchange
        qid = kw.pop("qid", 0x1234)
        answer = Answer(exchange(self.dns.port, build_query(name, qtype, qid=qid, **kw)))
        self.assertEqual(answer.id, qid)
        self.assertTrue(answer.flags & QR and answer.flags & AA, hex(answer.flags))
        self.assertEqual(answer.question, [(name.rstrip("."), qtype, 1)])
        return answer

    def test_a_and_aaaa_over_udp_and_tcp(self):
        self.dns.set_a("svc.test", ["127.0.0.1", "::1", "127.0.0.2"], ttl=30)
        for tcp in (False, True):
            with self.subTest(tcp=tcp):
                a = self.ask("svc.test", A, tcp=tcp, qid=7 + tcp)
                self.assertEqual(a.rcode, NOERROR)
                self.assertTrue(a.flags & RD, "RD is copied from the query")
                self.assertEqual(a.answers, [("svc.test", A, 30, "127.0.0.1"), ("svc.test", A, 30, "127.0.0.2")])
                # The owner name is a pointer to the question's name.
                self.assertEqual(a.raw[a.answer_offset:a.answer_offset + 2], b"\xc0\x0c")
                aaaa = self.ask("svc.test", AAAA, tcp=tcp)
                self.assertEqual(aaaa.answers, [("svc.test", AAAA, 30, "::1")])

    def test_srv_with_targets_in_additional(self):
        self.dns.set_srv("_api._tcp.svc.test", [(10, 5, 8080, "a.test"), (20, 0, 8081, "B.test."),
                                                (30, 0, 8082, "unknown.test")], ttl=60)
        self.dns.set_a("a.test", ["127.0.0.1", "::1"], ttl=5)
        self.dns.set_a("b.test", ["127.0.0.2"], ttl=7)
        a = self.ask("_api._tcp.svc.test", SRV)
        self.assertEqual(a.rcode, NOERROR)
        self.assertEqual(a.answers, [("_api._tcp.svc.test", SRV, 60, (10, 5, 8080, "a.test")),
                                     ("_api._tcp.svc.test", SRV, 60, (20, 0, 8081, "B.test")),
                                     ("_api._tcp.svc.test", SRV, 60, (30, 0, 8082, "unknown.test"))])
        self.assertEqual(sorted(a.additional), sorted([("a.test", A, 5, "127.0.0.1"), ("a.test", AAAA, 5, "::1"),
                                                       ("B.test", A, 7, "127.0.0.2")]))
        # Targets are written uncompressed.
        self.assertIn(b"\x01a\x04test\x00", a.raw)
        self.assertIn(b"\x07unknown\x04test\x00", a.raw)

    def test_nxdomain_nodata_and_remove(self):
        self.dns.set_a("v4only.test", ["127.0.0.1"], ttl=1)
        self.assertEqual(self.ask("nothing.test", A).rcode, NXDOMAIN)
        for qtype in (AAAA, SRV, TXT):
            nodata = self.ask("v4only.test", qtype)
            self.assertEqual((nodata.rcode, nodata.answers), (NOERROR, []))
        self.dns.set_a("empty.test", [], ttl=1)
        self.assertEqual((self.ask("empty.test", A).rcode, self.ask("empty.test", A).answers), (NOERROR, []))
        self.dns.remove("V4ONLY.test.")
        self.assertEqual(self.ask("v4only.test", A).rcode, NXDOMAIN)
        self.assertEqual(self.ask("v4only.test", A, tcp=True).rcode, NXDOMAIN)

    def test_servfail_and_drop(self):
        self.dns.set_a("flaky.test", ["127.0.0.1"], ttl=1)
        self.dns.set_failing("flaky.test", "servfail")
        for tcp in (False, True):
            a = self.ask("flaky.test", A, tcp=tcp)
            self.assertEqual((a.rcode, a.answers), (SERVFAIL, []))
        self.dns.set_failing("FLAKY.test", "drop")
        with self.assertRaises(socket.timeout):
            udp_exchange(self.dns.port, build_query("flaky.test", A))
        with self.assertRaises(socket.timeout):
            tcp_exchange(self.dns.port, build_query("flaky.test", A))
        self.dns.set_failing("flaky.test", None)
        self.assertEqual(self.ask("flaky.test", A).answers, [("flaky.test", A, 1, "127.0.0.1")])
        self.assertEqual(self.dns.queries("flaky.test", "A"), 5, "failed and dropped queries count too")
        with self.assertRaises(ValueError):
            self.dns.set_failing("flaky.test", "refuse")

    def test_names_are_case_insensitive(self):
        self.dns.set_a("MiXeD.Test.", ["10.1.2.3"], ttl=9)
        a = self.ask("mixed.TEST", A)     # the question is echoed in the client's case
        self.assertEqual(a.answers, [("mixed.TEST", A, 9, "10.1.2.3")])
        self.assertEqual(self.ask("mixed.test.", A).rcode, NOERROR)
        self.assertEqual(self.dns.queries("MIXED.test."), 2)

    def test_records_change_between_queries_and_queries_are_counted(self):
        self.dns.set_a("moving.test", ["127.0.0.1"], ttl=1)
        self.assertEqual(self.ask("moving.test", A).answers[0][3], "127.0.0.1")
        self.dns.set_a("moving.test", ["127.0.0.9"], ttl=2)
        self.assertEqual(self.ask("moving.test", A).answers, [("moving.test", A, 2, "127.0.0.9")])
        self.ask("moving.test", AAAA, tcp=True)
        self.ask("other.test", SRV)
        self.assertEqual(self.dns.queries("moving.test", "A"), 2)
        self.assertEqual(self.dns.queries("moving.test", "aaaa"), 1)
        self.assertEqual(self.dns.queries("moving.test"), 3)
        self.assertEqual(self.dns.queries(qtype="SRV"), 1)
        self.assertEqual(self.dns.queries(qtype=1), 2)
        self.assertEqual(self.dns.queries(), 4)
        self.dns.reset_queries()
        self.assertEqual(self.dns.queries(), 0)

    def test_garbage_does_not_stop_the_server(self):
        self.dns.set_a("ok.test", ["127.0.0.1"], ttl=1)
        header = struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0)
        garbage = [
            b"",
            b"\xff" * 5,
            os.urandom(64),
            header + b"\x05ab",                              # label past the end
            header + b"\xc0\x0c\0\x01\0\x01",                # pointer to itself
            header + b"\x02ok\x04test\0\0\x01",              # no class
            struct.pack("!HHHHHH", 1, QR, 1, 0, 0, 0) + wire_name("ok.test") + b"\0\x01\0\x01",  # a response
            struct.pack("!HHHHHH", 1, 0, 2, 0, 0, 0) + wire_name("ok.test") + b"\0\x01\0\x01",   # 2 questions
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for g in garbage:
                s.sendto(g, (HOST, self.dns.port))
        with socket.create_connection((HOST, self.dns.port), timeout=TIMEOUT) as s:
            s.sendall(b"\0\x03abc")                         # framed garbage, then a real query
            q = build_query("ok.test", A, qid=99)
            s.sendall(struct.pack("!H", len(q)) + q)
            with s.makefile("rb") as f:
                length = struct.unpack("!H", f.read(2))[0]
                self.assertEqual(Answer(f.read(length)).answers, [("ok.test", A, 1, "127.0.0.1")])
        self.assertEqual(self.ask("ok.test", A).answers, [("ok.test", A, 1, "127.0.0.1")])
        self.assertEqual(self.dns.queries(), 2, "garbage is not counted as queries")
        self.assertGreaterEqual(self.dns.malformed, len(garbage))

    def test_compressed_question_and_edns(self):
        self.dns.set_a("www.example.test", ["127.0.0.5"], ttl=3)
        # The question's name ends in a pointer to "example.test" after the question.
        tail_offset = 12 + 4 + 2 + 4
        msg = struct.pack("!HHHHHH", 5, 0, 1, 0, 0, 0) + b"\x03www" + struct.pack("!H", 0xC000 | tail_offset)
        msg += struct.pack("!HH", A, 1) + wire_name("example.test")
        a = Answer(udp_exchange(self.dns.port, msg))
        self.assertEqual((a.rcode, a.question), (NOERROR, [("www.example.test", A, 1)]))
        self.assertEqual(a.answers, [("www.example.test", A, 3, "127.0.0.5")])
        # An OPT record is accepted, and answered with one.
        e = self.ask("www.example.test", A, edns_size=1232)
        self.assertEqual(e.answers, [("www.example.test", A, 3, "127.0.0.5")])
        self.assertEqual([r[1] for r in e.additional], [OPT])

    def test_large_answer_is_truncated_over_udp_only(self):
        many = [f"127.0.1.{i}" for i in range(1, 41)]       # 40 * 16 bytes > 512
        self.dns.set_a("big.test", many, ttl=1)
        udp = self.ask("big.test", A)
        self.assertTrue(udp.flags & TC)
        self.assertEqual(udp.answers, [])
        tcp = self.ask("big.test", A, tcp=True)
        self.assertFalse(tcp.flags & TC)
        self.assertEqual([r[3] for r in tcp.answers], many)
        edns = self.ask("big.test", A, edns_size=4096)
        self.assertEqual((edns.flags & TC, len(edns.answers)), (0, 40))

    def test_stop_is_quick_and_closes_the_port(self):
        self.dns.set_a("x.test", ["127.0.0.1"], ttl=1)
        with socket.create_connection((HOST, self.dns.port), timeout=TIMEOUT):   # an idle TCP client
            start = time.monotonic()
            self.dns.stop()
            self.assertLess(time.monotonic() - start, 1.0)
        with self.assertRaises(OSError):      # refused or timed out
            tcp_exchange(self.dns.port, build_query("x.test", A))
        with DnsServer() as again:
            again.set_a("x.test", ["127.0.0.1"], ttl=1)
            self.assertEqual(Answer(udp_exchange(again.port, build_query("x.test", A))).rcode, NOERROR)
            self.assertEqual(again.address, f"{HOST}:{again.port}")

    def test_with_dig(self):
        dig = shutil.which("dig")
        if not dig:
            self.skipTest("dig is not installed")
        self.dns.set_a("dig.test", ["127.0.0.1", "::1"], ttl=11)
        self.dns.set_srv("_s._tcp.dig.test", [(1, 2, 3, "dig.test")], ttl=12)

        def dig_short(name: str, qtype: str, *extra: str) -> list[str]:
            out = subprocess.run([dig, f"@{HOST}", "-p", str(self.dns.port), "+short", "+time=1", "+tries=1",
                                  *extra, name, qtype], capture_output=True, text=True, timeout=5)
            return out.stdout.split("\n")[:-1]

        self.assertEqual(dig_short("dig.test", "A"), ["127.0.0.1"])
        self.assertEqual(dig_short("DIG.test", "AAAA", "+tcp"), ["::1"])
        self.assertEqual(dig_short("_s._tcp.dig.test", "SRV"), ["1 2 3 dig.test."])


if __name__ == "__main__":
    unittest.main()
