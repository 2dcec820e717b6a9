"""A real redis-server for tests: started on a free 127.0.0.1 port with no
persistence, stopped by PID. Fails (never skips) when redis-server is missing:
scripts/install-deps.sh --test installs it."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

from harness import stop_process

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, workdir: str, port: int | None = None):
        exe = shutil.which("redis-server")
        if not exe:
            raise AssertionError("redis-server is not installed (run scripts/install-deps.sh --test)")
        self.exe = exe
        self.workdir = workdir
        self.port = port or _free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(workdir, f"redis-{self.port}.log")

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no",
             "--dir", self.workdir, "--daemonize", "no", "--protected-mode", "no"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if self.command("PING") == "PONG":
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"redis-server on port {self.port} did not answer PING within {timeout}s")

    def kill(self) -> None:
        """SIGKILL: Redis dies with everything it held (no persistence)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)

    close = stop

    # A minimal RESP client: enough for GET/PTTL/KEYS/DEBUG in assertions,
    # binary-safe (the store's keys contain \0).
    def command(self, *args, timeout: float = 5.0):
        with socket.create_connection((HOST, self.port), timeout=timeout) as s:
            parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
            s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
            f = s.makefile("rb")
            return _read_reply(f)


def _read_reply(f):
    line = f.readline()
    if not line:
        raise OSError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise OSError(f"bad RESP line {line!r}")
