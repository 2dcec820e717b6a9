"""ZeroMQ stand-ins speaking Smockron's wire protocol: Gatekeeper (in place of
smockron-proxy, against a real master) and FakeMaster (in place of
smockron-master, against a real proxy), and the control message parser."""
from __future__ import annotations

import collections
import itertools
import os
import time
import uuid

import zmq  # (lib/__init__.py makes Debian's python3-zmq importable)

from lib.config import PROBE_DOMAIN
from lib.ports import HOST
from lib.timing import WaitTimeout, now_ms

Control = collections.namedtuple("Control", "domain command identifier next_ms interval_ms frames")
Accounting = collections.namedtuple("Accounting", "domain status identifier received_ms delayed_ms loginfo frames")


def _b(x) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode()


def parse_control(frames: list[bytes]) -> Control:
    """Parses [domain\\0, command, identifier, next_ms, (interval_ms)] without being lenient."""
    domain = frames[0][:-1].decode("utf-8", "replace") if frames and frames[0].endswith(b"\0") else None
    command = frames[1].decode() if len(frames) > 1 else None
    identifier = frames[2] if len(frames) > 2 else None
    next_ms = int(frames[3]) if len(frames) > 3 and frames[3].isdigit() else None
    interval_ms = int(frames[4]) if len(frames) > 4 and frames[4].isdigit() else None
    return Control(domain, command, identifier.decode("utf-8", "replace") if identifier is not None else None,
                   next_ms, interval_ms, frames)


class Gatekeeper:
    """Stand-in for a gatekeeper: PUB connected to the master's accounting endpoint,
    SUB connected to its control endpoint and subscribed to domain + "\\0".

    Call handshake() before relying on delivery (ZeroMQ's slow-joiner problem:
    a PUB drops what it sends before the peer's subscription arrives).
    """

    _ids = itertools.count()

    def __init__(self, accounting: str, control: str, domains, probe_domain: str = PROBE_DOMAIN,
                 curve: tuple[bytes, bytes, bytes] | None = None):
        """`curve`: (our public key, our secret key, the master's public key), Z85: both links speak CURVE."""
        self.ctx = zmq.Context()
        self.uid = f"{os.getpid()}-{next(Gatekeeper._ids)}-{uuid.uuid4().hex[:6]}"
        self.probe_domain = probe_domain
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.policies: list[list[bytes]] = []  # POLICY and QUOTA messages seen (recv skips them)
        self.limits: list[list[bytes]] = []  # LIMIT messages seen (recv skips them)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 100_000)
        if curve:
            for sock in (self.pub, self.sub):
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
        # Test domains first, probe last: subscriptions travel in order, so once a
        # probe reply arrives every earlier subscription is in place too.
        for d in list(domains):
            self.subscribe(d)
        if probe_domain:
            self.subscribe(probe_domain)
        self.sub.connect(control)
        self.pub.connect(accounting)
        self.closed = False

    def subscribe(self, domain) -> None:
        self.sub.setsockopt(zmq.SUBSCRIBE, _b(domain) + b"\0")

    # ---- sending
    def send(self, frames) -> None:
        """Sends raw frames (bytes/str/int each) as one multipart message."""
        self.pub.send_multipart([_b(f) for f in frames])

    def account(self, domain, status, identifier, received_ms, delayed_ms=None, loginfo=None) -> None:
        """A well-formed accounting message."""
        frames = [_b(domain) + b"\0", _b(status), _b(identifier), _b(received_ms),
                  b"" if delayed_ms is None else _b(delayed_ms)]
        if loginfo is not None:
            frames.append(_b(loginfo))
        self.send(frames)

    def accepted(self, domain, identifier, received_ms, loginfo=None):
        self.account(domain, "ACCEPTED", identifier, received_ms, None, loginfo)

    def delayed(self, domain, identifier, received_ms, delayed_ms, loginfo=None):
        self.account(domain, "DELAYED", identifier, received_ms, delayed_ms, loginfo)

    def rejected(self, domain, identifier, received_ms, loginfo=None):
        self.account(domain, "REJECTED", identifier, received_ms, None, loginfo)

    # ---- receiving
    def _recv_raw(self, timeout: float) -> list[bytes] | None:
        if self.sub.poll(max(0, int(timeout * 1000))):
            return self.sub.recv_multipart()
        return None

    def recv(self, timeout: float = 5.0) -> Control | None:
        """Next control message that is not a handshake probe reply, or None after `timeout` s."""
        deadline = time.monotonic() + timeout
        probe_topic = _b(self.probe_domain) + b"\0" if self.probe_domain else None
        while True:
            frames = self._recv_raw(deadline - time.monotonic())
            if frames is None:
                return None
            if probe_topic is not None and frames[0] == probe_topic:
                continue
            if len(frames) > 1 and frames[1] in (b"POLICY", b"QUOTA"):
                self.policies.append(frames)  # the master's periodic rules (and quotas) broadcast
                continue
            if len(frames) > 1 and frames[1] == b"LIMIT":
                self.limits.append(frames)  # which limit set the DELAY_UNTIL before it
                continue
            return parse_control(frames)

    def expect(self, timeout: float = 5.0) -> Control:
        msg = self.recv(timeout)
        if msg is None:
            raise WaitTimeout(f"no control message within {timeout}s")
        return msg

    def drain(self, quiet: float = 0.0) -> list[Control]:
        """Everything already queued (waiting up to `quiet` s for each next one)."""
        out = []
        while (m := self.recv(quiet)) is not None:
            out.append(m)
        return out

    def handshake(self, timeout: float = 10.0) -> int:
        """Sends probes on PROBE_DOMAIN until the master's DELAY_UNTIL for one of
        this gatekeeper's own probes comes back: the accounting path, the master's
        subscription and our control subscriptions are then all established.
        Bounded by `timeout`; returns the number of probes sent."""
        if not self.probe_domain:
            raise ValueError("handshake needs a probe domain configured on the master")
        topic = _b(self.probe_domain) + b"\0"
        prefix = f"probe-{self.uid}-".encode()
        deadline = time.monotonic() + timeout
        for n in itertools.count(1):
            now = time.monotonic()
            if now >= deadline:
                raise WaitTimeout(f"ZeroMQ handshake with the master failed after {n - 1} probes in {timeout}s")
            self.accepted(self.probe_domain, f"probe-{self.uid}-{n}", now_ms())
            wait_end = min(deadline, now + min(0.02 * (2 ** min(n, 5)), 0.5))  # 40ms .. 0.5s backoff
            while (left := wait_end - time.monotonic()) > 0:
                frames = self._recv_raw(left)
                if frames is None:
                    break
                if frames[0] == topic and len(frames) > 2 and frames[2].startswith(prefix):
                    return n
        raise AssertionError("unreachable")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pub.close(0)
            self.sub.close(0)
            self.ctx.term()


def unpack_batch(topic: bytes, records: bytes) -> list[list[bytes]]:
    """The messages of a BATCH (shared/protocol/wire_batch.hpp): per record a frame
    count, then each frame as a 2-byte big-endian length and its bytes."""
    out, at = [], 0
    while at < len(records):
        count, at = records[at], at + 1
        frames = [topic]
        for _ in range(count):
            n = int.from_bytes(records[at:at + 2], "big")
            frames.append(records[at + 2:at + 2 + n])
            at += 2 + n
        out.append(frames)
    return out


class FakeMaster:
    """Stand-in for smockron-master, for testing a real gatekeeper (proxy):
    SUB bound to the accounting endpoint (subscribed to everything) and PUB
    bound to the control endpoint."""

    def __init__(self, accounting_port: int | None = None, control_port: int | None = None,
                 curve_secret: bytes | None = None):
        """`curve_secret` (Z85): both sockets are CURVE servers with that key (any client key is accepted)."""
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if curve_secret:
            for sock in (self.sub, self.pub):
                sock.curve_secretkey = curve_secret
                sock.curve_server = True
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.accounting_port = accounting_port or self.sub.bind_to_random_port(f"tcp://{HOST}")
        if accounting_port:
            self.sub.bind(f"tcp://{HOST}:{accounting_port}")
        self.control_port = control_port or self.pub.bind_to_random_port(f"tcp://{HOST}")
        if control_port:
            self.pub.bind(f"tcp://{HOST}:{control_port}")
        self.accounting = f"tcp://{HOST}:{self.accounting_port}"
        self.control = f"tcp://{HOST}:{self.control_port}"
        self.unpacked = collections.deque()
        self.closed = False

    def pump(self) -> None:
        """Lets libzmq attach new connections to the sockets: a SUB sends its
        subscriptions (and a PUB learns a subscriber's) only when the
        application calls into it, so a gatekeeper's messages go unsent until then."""
        self.sub.getsockopt(zmq.EVENTS)
        self.pub.getsockopt(zmq.EVENTS)

    def recv_raw(self, timeout: float = 5.0) -> list[bytes] | None:
        """The next accounting message (a CURVE gatekeeper's BATCH is unpacked into its messages)."""
        if self.unpacked:
            return self.unpacked.popleft()
        if self.sub.poll(max(0, int(timeout * 1000))):
            frames = self.sub.recv_multipart()
            if len(frames) == 3 and frames[1] == b"BATCH":
                self.unpacked.extend(unpack_batch(frames[0], frames[2]))
                return self.unpacked.popleft()
            return frames
        return None

    def recv(self, timeout: float = 5.0) -> Accounting | None:
        f = self.recv_raw(timeout)
        if f is None:
            return None
        dec = lambda i: f[i].decode("utf-8", "replace") if len(f) > i else None  # noqa: E731
        return Accounting(f[0][:-1].decode() if f[0].endswith(b"\0") else None, dec(1), dec(2),
                          int(f[3]) if len(f) > 3 and f[3].isdigit() else None,
                          int(f[4]) if len(f) > 4 and f[4].isdigit() else None, dec(5), f)

    def delay_until(self, domain, identifier, next_ms, interval_ms=None) -> None:
        frames = [_b(domain) + b"\0", b"DELAY_UNTIL", _b(identifier), _b(next_ms)]
        if interval_ms is not None:
            frames.append(_b(interval_ms))
        self.pub.send_multipart(frames)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sub.close(0)
            self.pub.close(0)
            self.ctx.term()
