"""A real redis-server for tests: started on a free 127.0.0.1 port with no
persistence, stopped by PID. Fails (never skips) when redis-server is missing:
scripts/install-deps.sh --test installs it."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

from lib.daemons import stop_process
from lib.ports import free_port

HOST = "127.0.0.1"


class RedisServer:
    """redis-server on `port`, or (port None) on a fresh port: redis-server cannot
    bind port 0 and report it, so a port taken between its choice and redis-server's
    bind is retried with a new one."""

    def __init__(self, workdir: str, port: int | None = None, extra_args=()):
        exe = shutil.which("redis-server")
        if not exe:
            raise AssertionError("redis-server is not installed (run scripts/install-deps.sh --test)")
        self.exe = exe
        self.workdir = workdir
        self.extra_args = [str(a) for a in extra_args]  # e.g. ("--replicaof", HOST, port)
        self.fixed_port = port
        self.port = port or 0
        self.proc: subprocess.Popen | None = None
        self.log_path = ""

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout: float = 10.0, attempts: int = 5) -> "RedisServer":
        for attempt in range(attempts):
            if not self.fixed_port:
                self.port = free_port()
            if self._start_once(timeout):
                return self
            # Exited on "Address already in use": a fresh port, or (a fixed port, e.g. a
            # restart) the same one a moment later.
            if attempt == attempts - 1:
                break
            if self.fixed_port:
                time.sleep(0.2)
        raise AssertionError(f"redis-server could not bind 127.0.0.1:{self.port} in {attempts} attempts; "
                             f"see {self.log_path}")

    def _start_once(self, timeout: float) -> bool:
        """True once this redis-server answers; False if it exited because the port was taken."""
        self.log_path = os.path.join(self.workdir, f"redis-{self.port}.log")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.exe, "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no",
                 "--dir", self.workdir, "--daemonize", "no", "--protected-mode", "no", *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        return self._wait_answering(timeout)

    def _wait_answering(self, timeout: float) -> bool:
        """True once this process answers PING; False if it exited because the port was taken."""
        name = os.path.basename(self.exe)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "Address already in use" in self._log():
                    return False
                raise AssertionError(f"{name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                # Our own server, not one that holds the port (then ours exits, above).
                if self.command("PING") == "PONG" and self.pid_answering() == self.proc.pid:
                    return True
            except (OSError, RuntimeError):  # RuntimeError: an error reply (e.g. LOADING)
                pass
            time.sleep(0.02)
        stop_process(self.proc)
        raise AssertionError(f"{name} on port {self.port} did not answer PING within {timeout}s; see {self.log_path}")

    def pid_answering(self) -> int | None:
        info = self.command("INFO", "server")
        m = re.search(rb"process_id:(\d+)", info or b"")
        return int(m.group(1)) if m else None

    def _log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

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
            s.sendall(encode_command(*args))
            reply = read_reply(s.makefile("rb"))
            if isinstance(reply, RedisError):
                raise reply
            return reply


class RedisSentinel(RedisServer):
    """A real redis-sentinel on a fresh 127.0.0.1 port, monitoring the primary
    `name` at HOST:`primary_port` (quorum 2, down after 1 s). Its config file is
    its own (Sentinel rewrites it)."""

    def __init__(self, workdir: str, name: str, primary_port: int):
        super().__init__(workdir)
        exe = shutil.which("redis-sentinel")
        if not exe:
            raise AssertionError("redis-sentinel is not installed (run scripts/install-deps.sh --test)")
        self.exe = exe
        self.name = name
        self.primary_port = primary_port

    def _start_once(self, timeout: float) -> bool:
        self.log_path = os.path.join(self.workdir, f"sentinel-{self.port}.log")
        conf = os.path.join(self.workdir, f"sentinel-{self.port}.conf")
        with open(conf, "w") as f:
            f.write(f"port {self.port}\nbind {HOST}\ndaemonize no\nprotected-mode no\ndir {self.workdir}\n"
                    f"sentinel monitor {self.name} {HOST} {self.primary_port} 2\n"
                    f"sentinel down-after-milliseconds {self.name} 1000\n"
                    f"sentinel failover-timeout {self.name} 5000\n"
                    f"sentinel parallel-syncs {self.name} 1\n")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([self.exe, conf], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        return self._wait_answering(timeout)

    def primary(self) -> tuple[str, int] | None:
        addr = self.command("SENTINEL", "get-master-addr-by-name", self.name)
        return (addr[0].decode(), int(addr[1])) if addr else None


class RedisError(RuntimeError):
    """An error reply. `message` is Redis's text as sent, e.g.
    "MOVED 3999 127.0.0.1:30001"; `kind` its first word ("MOVED", "ERR", ...)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def kind(self) -> str:
        return self.message.split(" ", 1)[0]

    @property
    def redirect(self) -> tuple[int, str, int] | None:
        """(slot, host, port) of a MOVED or ASK reply, else None."""
        m = re.fullmatch(r"(?:MOVED|ASK) (\d+) (\S*):(\d+)", self.message)
        return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def encode_command(*args) -> bytes:
    """A RESP array of bulk strings: bytes as they are, anything else as str() in UTF-8."""
    parts = [bytes(a) if isinstance(a, (bytes, bytearray, memoryview)) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def read_reply(f):
    """One RESP2 reply from the binary file `f`: simple string -> str, bulk ->
    bytes (None for nil), integer -> int, array -> list (None for a nil array),
    error -> a RedisError returned (not raised: inside an array it is an element)."""
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise OSError(f"connection closed in a reply (read {line!r})")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return RedisError(rest.decode("utf-8", "replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise OSError("connection closed in a bulk reply")
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    raise OSError(f"bad RESP line {line!r}")
