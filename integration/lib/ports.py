"""Loopback ports for the daemons and servers a test starts: fresh ones, one held
so that connections to it are refused, and telling a bind failure from a log."""
from __future__ import annotations

import re
import socket

HOST = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports on 127.0.0.1 that were free a moment ago.

    All sockets are held open together so the n ports are distinct, then closed:
    another process may take a port before the daemon configured with it binds
    it. Whatever binds such a port must retry with fresh ones on a bind failure
    (DaemonTestCase.start_daemon, RedisServer.start, ...); a child that can bind
    port 0 and report its port (BackendProcess) needs none of this, and a port
    that must merely refuse connections is better held by reserve_port().
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def reserve_port() -> socket.socket:
    """A socket bound to a fresh 127.0.0.1 port that never listens. While it is
    open nobody else can bind the port (nor get it as an ephemeral port) and
    connections to it are refused: a dead endpoint for as long as a test needs."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((HOST, 0))
    except BaseException:
        s.close()
        raise
    return s


_BIND_FAILURE_RE = re.compile(r"cannot bind|bind: |bind\(\)|Address already in use", re.IGNORECASE)


def bind_failed(log: str) -> bool:
    """Whether a process's log says it could not bind an address (a port taken
    between free_ports() and the bind)."""
    return bool(_BIND_FAILURE_RE.search(log))


class OwnsSocket:
    """A client holding one socket in `self.sock`: closed once, as a context manager too."""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
