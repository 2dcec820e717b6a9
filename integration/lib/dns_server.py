"""A small authoritative DNS server for tests, in the test's own process: one
thread serving UDP and TCP (2-byte length prefix) on the same 127.0.0.1 port,
with A/AAAA/SRV records and failure modes the test changes at any moment, and
a count of the queries it received (to see a client re-resolve).

Answers: AA set, the question echoed, the answers' owner a compression pointer
to the question (0xC00C), SRV targets uncompressed and their A/AAAA records in
the additional section. Unknown name: NXDOMAIN; known name without records of
the type: NOERROR and no answer (NODATA). A UDP answer larger than 512 bytes
(or the query's EDNS payload size) loses its additional section, then if still
too large is sent with TC set and no records, so the client retries over TCP.
Anything that is not one well-formed question is ignored, never answered.

    with DnsServer() as dns:
        dns.set_a("backend.test", ["127.0.0.1", "::1"], ttl=1)
        ... resolver configured with dns.address ("127.0.0.1:<port>") ...
        wait_until(lambda: dns.queries("backend.test", "A") >= 2)
"""
from __future__ import annotations

import ipaddress
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field

HOST = "127.0.0.1"

TYPE_A, TYPE_AAAA, TYPE_SRV, TYPE_OPT = 1, 28, 33, 41
TYPE_NAMES = {TYPE_A: "A", TYPE_AAAA: "AAAA", 5: "CNAME", 12: "PTR", 15: "MX", 16: "TXT",
              TYPE_SRV: "SRV", TYPE_OPT: "OPT", 255: "ANY"}
CLASS_IN = 1
RCODE_NOERROR, RCODE_SERVFAIL, RCODE_NXDOMAIN = 0, 2, 3
FAILURE_MODES = ("servfail", "drop")

_HEADER = struct.Struct("!HHHHHH")  # id, flags, qdcount, ancount, nscount, arcount
_FLAG_QR, _FLAG_AA, _FLAG_TC, _FLAG_RD = 0x8000, 0x0400, 0x0200, 0x0100
_UDP_PLAIN_LIMIT = 512      # RFC 1035 UDP size without EDNS
_UDP_MAX_LIMIT = 4096       # the most we send over UDP whatever the client advertises
_OUR_EDNS_SIZE = 1232       # advertised in our OPT record


class _Malformed(ValueError):
    """The datagram or TCP message is not a query we answer: it is dropped."""


def normalize(name: str) -> str:
    """The lookup key of a name: lower case, no trailing dot ("" is the root)."""
    return name.rstrip(".").lower()


def type_code(qtype: str | int) -> int:
    """The number of a type given by name ("AAAA" in any case, "TYPE65") or as a number."""
    if isinstance(qtype, int):
        return qtype
    upper = qtype.upper()
    for code, label in TYPE_NAMES.items():
        if label == upper:
            return code
    if upper.startswith("TYPE") and upper[4:].isdigit():
        return int(upper[4:])
    raise ValueError(f"unknown DNS type {qtype!r}")


def encode_name(name: str) -> bytes:
    """A name in uncompressed wire form ("" or "." is the root)."""
    out = bytearray()
    for label in name.rstrip(".").split(".") if name.strip(".") else []:
        raw = label.encode("ascii")
        if not 0 < len(raw) <= 63:
            raise ValueError(f"bad DNS label {label!r} in {name!r}")
        out += bytes([len(raw)]) + raw
    out += b"\0"
    if len(out) > 255:
        raise ValueError(f"DNS name too long: {name!r}")
    return bytes(out)


def parse_name(msg: bytes, offset: int) -> tuple[list[bytes], int]:
    """The labels of the name at `offset` (following compression pointers, with a
    bound on hops so a pointer loop is malformed) and the offset after it."""
    labels: list[bytes] = []
    end = None      # where the name ends in the message: after the first pointer
    hops = 0
    length = 0
    while True:
        if offset >= len(msg):
            raise _Malformed("name runs past the message")
        n = msg[offset]
        if n & 0xC0 == 0xC0:
            if offset + 1 >= len(msg):
                raise _Malformed("truncated pointer")
            if end is None:
                end = offset + 2
            hops += 1
            if hops > 64:
                raise _Malformed("compression pointer loop")
            offset = ((n & 0x3F) << 8) | msg[offset + 1]
            continue
        if n & 0xC0:
            raise _Malformed("reserved label type")
        offset += 1
        if n == 0:
            return labels, (end if end is not None else offset)
        if offset + n > len(msg):
            raise _Malformed("label runs past the message")
        labels.append(msg[offset:offset + n])
        length += n + 1
        if length > 255:
            raise _Malformed("name too long")
        offset += n


@dataclass
class _Records:
    """What one name holds: addresses (packed) and SRV records, one TTL per set."""
    a: list[bytes] = field(default_factory=list)
    a_ttl: int = 0
    aaaa: list[bytes] = field(default_factory=list)
    aaaa_ttl: int = 0
    srv: list[tuple[int, int, int, str]] = field(default_factory=list)
    srv_ttl: int = 0


@dataclass
class _Query:
    id: int
    flags: int
    labels: list[bytes]      # as received: the echoed question keeps the client's case
    qtype: int
    qclass: int
    edns_size: int | None    # the OPT record's payload size, None without EDNS

    @property
    def name(self) -> str:
        # bytes.lower(): DNS case folding is ASCII only.
        return normalize(b".".join(self.labels).lower().decode("latin-1"))


def _parse_query(msg: bytes) -> _Query:
    if len(msg) < _HEADER.size:
        raise _Malformed("short header")
    qid, flags, qd, an, ns, ar = _HEADER.unpack_from(msg)
    if flags & _FLAG_QR or (flags >> 11) & 0xF != 0 or qd != 1:
        raise _Malformed("not a one-question standard query")
    labels, off = parse_name(msg, _HEADER.size)
    if off + 4 > len(msg):
        raise _Malformed("truncated question")
    qtype, qclass = struct.unpack_from("!HH", msg, off)
    return _Query(qid, flags, labels, qtype, qclass, _edns_size(msg, off + 4, an + ns, ar))


def _edns_size(msg: bytes, off: int, skip: int, additional: int) -> int | None:
    """The payload size of an OPT record in the additional section; None if there is
    none or the sections do not parse (EDNS is optional: the query is still answered)."""
    try:
        for i in range(skip + additional):
            _, off = parse_name(msg, off)
            rtype, rclass, _, rdlen = struct.unpack_from("!HHIH", msg, off)
            off += 10 + rdlen
            if off > len(msg):
                return None
            if i >= skip and rtype == TYPE_OPT:
                return rclass
    except (_Malformed, struct.error):
        return None
    return None


def _rr(owner: bytes, rtype: int, ttl: int, rdata: bytes) -> bytes:
    return owner + struct.pack("!HHIH", rtype, CLASS_IN, ttl, len(rdata)) + rdata


def _check_ttl(ttl: int) -> int:
    if not 0 <= ttl <= 0x7FFFFFFF:
        raise ValueError(f"TTL out of range: {ttl}")
    return ttl


class _TcpConn:
    """One TCP client: bytes read but not yet a whole message, bytes not yet sent."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()


class DnsServer:
    """An authoritative DNS server on UDP and TCP 127.0.0.1:`port` (chosen by the OS),
    served by one background thread. Records and failure modes may be changed from
    the test thread at any time; the next query sees them."""

    def __init__(self, host: str = HOST):
        self.host = host
        self.port: int | None = None
        self._lock = threading.Lock()
        self._records: dict[str, _Records] = {}
        self._failing: dict[str, str] = {}
        self._counts: dict[tuple[str, int], int] = {}
        #: Datagrams / TCP messages dropped as malformed (a count, for tests of the tests).
        self.malformed = 0
        #: Unexpected exceptions in the serving thread (bugs here, never the client's
        #: fault): kept instead of killing the thread, so a test can assert it is empty.
        self.errors: list[BaseException] = []
        self._udp: socket.socket | None = None
        self._tcp: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._conns: dict[socket.socket, _TcpConn] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None

    # --- records (any thread) ---------------------------------------------------

    def set_a(self, name: str, addresses: list[str], ttl: int = 60) -> None:
        """The addresses of `name`, replacing its previous ones: IPv4 ones answer A
        queries, IPv6 ones AAAA queries (an empty list keeps the name: NODATA)."""
        v4, v6 = [], []
        for text in addresses:
            addr = ipaddress.ip_address(text)   # ValueError here, in the test thread
            (v4 if addr.version == 4 else v6).append(addr.packed)
        _check_ttl(ttl)
        with self._lock:
            rec = self._records.setdefault(normalize(name), _Records())
            rec.a, rec.a_ttl, rec.aaaa, rec.aaaa_ttl = v4, ttl, v6, ttl

    def set_srv(self, name: str, records: list[tuple[int, int, int, str]], ttl: int = 60) -> None:
        """The SRV records (priority, weight, port, target) of `name`, replacing its
        previous ones; the targets' A/AAAA records go in the additional section."""
        checked = []
        for priority, weight, port, target in records:
            for value in (priority, weight, port):
                if not 0 <= value <= 0xFFFF:
                    raise ValueError(f"SRV field out of range: {value}")
            encode_name(target)                  # a bad target fails here, not in the thread
            checked.append((priority, weight, port, target))
        _check_ttl(ttl)
        with self._lock:
            rec = self._records.setdefault(normalize(name), _Records())
            rec.srv, rec.srv_ttl = checked, ttl

    def remove(self, name: str) -> None:
        """Forgets every record of `name`: NXDOMAIN from now on (a failure mode set by
        set_failing() is separate and stays)."""
        with self._lock:
            self._records.pop(normalize(name), None)

    def set_failing(self, name: str, mode: str | None) -> None:
        """Queries for `name` (whatever their type) get SERVFAIL ("servfail"), no answer
        at all ("drop"), or (None) the records again."""
        if mode is not None and mode not in FAILURE_MODES:
            raise ValueError(f"failure mode must be one of {FAILURE_MODES} or None, not {mode!r}")
        with self._lock:
            if mode is None:
                self._failing.pop(normalize(name), None)
            else:
                self._failing[normalize(name)] = mode

    def queries(self, name: str | None = None, qtype: str | int | None = None) -> int:
        """How many well-formed queries arrived (UDP and TCP, answered or not), for one
        name and/or one type ("A", "AAAA", "SRV", ... or a number)."""
        key_name = None if name is None else normalize(name)
        key_type = None if qtype is None else type_code(qtype)
        with self._lock:
            return sum(n for (qn, qt), n in self._counts.items()
                       if (key_name is None or qn == key_name) and (key_type is None or qt == key_type))

    def reset_queries(self) -> None:
        with self._lock:
            self._counts.clear()

    @property
    def address(self) -> str:
        """"127.0.0.1:<port>", the form resolvers take as a server."""
        return f"{self.host}:{self.port}"

    # --- lifecycle ----------------------------------------------------------------

    def start(self, attempts: int = 20) -> "DnsServer":
        """Binds UDP on a port the OS picks and TCP on the same number (another one
        if that TCP port is taken), then serves in a daemon thread."""
        if self._thread is not None:
            return self
        for _ in range(attempts):
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind((self.host, 0))
            port = udp.getsockname()[1]
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                tcp.bind((self.host, port))
                tcp.listen(64)
            except OSError:
                tcp.close()
                udp.close()
                continue
            break
        else:
            raise AssertionError(f"no port free for both UDP and TCP on {self.host} in {attempts} attempts")
        udp.setblocking(False)
        tcp.setblocking(False)
        self._udp, self._tcp, self.port = udp, tcp, port
        # stop() writes a byte here so the selector wakes at once, not on a timeout.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name=f"dns-{port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stops the thread (joined for at most `timeout` s) and closes every socket."""
        if self._thread is None:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout)
        self._thread = None
        for s in [self._udp, self._tcp, self._wake_r, self._wake_w, *self._conns]:
            try:
                s.close()
            except OSError:
                pass
        self._conns.clear()

    def __enter__(self) -> "DnsServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- serving thread -----------------------------------------------------------

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._udp, selectors.EVENT_READ, "udp")
        sel.register(self._tcp, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stopping:
                # The timeout only bounds the wait should the wake-up byte be lost.
                for key, events in sel.select(timeout=0.2):
                    try:
                        self._dispatch(sel, key, events)
                    except Exception as e:  # never let one message end the server
                        self.errors.append(e)
        finally:
            sel.close()

    def _dispatch(self, sel: selectors.BaseSelector, key: selectors.SelectorKey, events: int) -> None:
        if key.data == "wake":
            return
        if key.data == "udp":
            try:
                msg, peer = self._udp.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. ICMP port unreachable from an earlier answer's client
            query = self._decode(msg)
            if query is not None:
                answer = self._answer(query, udp_limit=self._udp_limit(query))
                if answer is not None:
                    self._udp.sendto(answer, peer)
            return
        if key.data == "accept":
            try:
                sock, _ = self._tcp.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._conns[sock] = conn = _TcpConn(sock)
            sel.register(sock, selectors.EVENT_READ, conn)
            return
        conn: _TcpConn = key.data
        if events & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                self._close_conn(sel, conn)
                return
            if data:
                conn.inbuf += data
                self._tcp_messages(conn)
        self._flush(sel, conn)

    def _tcp_messages(self, conn: _TcpConn) -> None:
        """Answers every whole length-prefixed message in the connection's buffer."""
        while len(conn.inbuf) >= 2:
            length = int.from_bytes(conn.inbuf[:2], "big")
            if len(conn.inbuf) < 2 + length:
                return
            msg = bytes(conn.inbuf[2:2 + length])
            del conn.inbuf[:2 + length]
            query = self._decode(msg)
            if query is not None:
                answer = self._answer(query, udp_limit=None)
                if answer is not None:
                    conn.outbuf += len(answer).to_bytes(2, "big") + answer

    def _flush(self, sel: selectors.BaseSelector, conn: _TcpConn) -> None:
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close_conn(sel, conn)
                return
        # Wait for writability only while something is left to send.
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if sel.get_key(conn.sock).events != want:
            sel.modify(conn.sock, want, conn)

    def _close_conn(self, sel: selectors.BaseSelector, conn: _TcpConn) -> None:
        try:
            sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._conns.pop(conn.sock, None)
        conn.sock.close()

    def _decode(self, msg: bytes) -> _Query | None:
        """The query in `msg`, counted; None (and counted as malformed) if there is none."""
        try:
            query = _parse_query(msg)
        except (_Malformed, struct.error):
            self.malformed += 1
            return None
        with self._lock:
            key = (query.name, query.qtype)
            self._counts[key] = self._counts.get(key, 0) + 1
        return query

    @staticmethod
    def _udp_limit(query: _Query) -> int:
        if query.edns_size is None:
            return _UDP_PLAIN_LIMIT
        return max(_UDP_PLAIN_LIMIT, min(query.edns_size, _UDP_MAX_LIMIT))

    def _answer(self, query: _Query, udp_limit: int | None) -> bytes | None:
        """The answer's bytes, or None to send nothing (the "drop" failure mode)."""
        name = query.name
        answers: list[bytes] = []
        additional: list[bytes] = []
        with self._lock:
            mode = self._failing.get(name)
            rec = self._records.get(name)
            if mode == "drop":
                return None
            if mode == "servfail":
                rcode = RCODE_SERVFAIL
            elif rec is None:
                rcode = RCODE_NXDOMAIN
            else:
                rcode = RCODE_NOERROR
                if query.qclass in (CLASS_IN, 255):
                    answers, additional = self._records_for(rec, query.qtype)
        # Owner names point at the question's name, which always starts at offset 12.
        question = b"".join(bytes([len(l)]) + l for l in query.labels) + b"\0"
        question += struct.pack("!HH", query.qtype, query.qclass)
        opt = b""
        if query.edns_size is not None:
            opt = b"\0" + struct.pack("!HHIH", TYPE_OPT, _OUR_EDNS_SIZE, 0, 0)
        flags = _FLAG_QR | _FLAG_AA | (query.flags & _FLAG_RD) | rcode

        def build(ans: list[bytes], add: list[bytes], extra_flags: int = 0) -> bytes:
            header = _HEADER.pack(query.id, flags | extra_flags, 1, len(ans), 0,
                                  len(add) + (1 if opt else 0))
            return header + question + b"".join(ans) + b"".join(add) + opt

        out = build(answers, additional)
        if udp_limit is not None and len(out) > udp_limit:
            # Additional records may go silently (RFC 2181 9); answers only with TC.
            out = build(answers, [])
            if len(out) > udp_limit:
                out = build([], [], _FLAG_TC)
        return out

    def _records_for(self, rec: _Records, qtype: int) -> tuple[list[bytes], list[bytes]]:
        """Answer and additional records of one name for one type (lock held)."""
        owner = b"\xc0\x0c"
        answers: list[bytes] = []
        additional: list[bytes] = []
        if qtype in (TYPE_A, 255):
            answers += [_rr(owner, TYPE_A, rec.a_ttl, a) for a in rec.a]
        if qtype in (TYPE_AAAA, 255):
            answers += [_rr(owner, TYPE_AAAA, rec.aaaa_ttl, a) for a in rec.aaaa]
        if qtype in (TYPE_SRV, 255):
            seen: set[str] = set()
            for priority, weight, port, target in rec.srv:
                rdata = struct.pack("!HHH", priority, weight, port) + encode_name(target)
                answers.append(_rr(owner, TYPE_SRV, rec.srv_ttl, rdata))
                key = normalize(target)
                target_rec = self._records.get(key)
                if key in seen or target_rec is None:
                    continue
                seen.add(key)
                target_owner = encode_name(target)
                additional += [_rr(target_owner, TYPE_A, target_rec.a_ttl, a) for a in target_rec.a]
                additional += [_rr(target_owner, TYPE_AAAA, target_rec.aaaa_ttl, a) for a in target_rec.aaaa]
        return answers, additional
