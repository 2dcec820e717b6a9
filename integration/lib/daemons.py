"""The Smockron daemons as processes: binary() from $SMOCKRON_BIN_DIR (default
build/bin), Daemon / MasterProcess / ProxyProcess (started with --config, stderr
to a log file, stopped by PID), and bounded runs of short-lived commands."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid

from lib.gatekeeper import Gatekeeper
from lib.http1 import HttpResponse, http_get
from lib.metrics import CTL, metric
from lib.ports import HOST
from lib.timing import WaitTimeout, wait_until

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(REPO_ROOT, "build", "bin"))
PROXY = "smockron-proxy"


def binary(name: str) -> str:
    """Absolute path of a Smockron executable; fails the test (never skips) if it is missing."""
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        raise AssertionError(f"{path} is not built (build first, or set SMOCKRON_BIN_DIR)")
    return path


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` s; reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class DaemonExited(AssertionError):
    pass


class Daemon:
    """One daemon process started with --config, its stderr in a log file.

    Stopped by PID only (never by name): SIGTERM, wait up to a deadline, then SIGKILL.
    """

    def __init__(self, name: str, config_path: str, workdir: str, args=(), admin_port: int | None = None,
                 prefix=()):
        self.name = name
        self.config_path = config_path
        self.workdir = workdir
        self.args = list(args)
        self.prefix = list(prefix)  # a command that execs the rest (same PID): e.g. unshare
        self.admin_port = admin_port
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        self.log_path = os.path.join(workdir, f"{tag}.stderr.log")
        self.stdout_path = os.path.join(workdir, f"{tag}.stdout.log")
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, ready_timeout: float = 10.0, wait_ready: bool = True) -> "Daemon":
        """Starts the process; with an admin port (and wait_ready), waits until /readyz answers 200."""
        cmd = [*self.prefix, binary(self.name), "--config", self.config_path, *self.args]
        with open(self.log_path, "ab") as err, open(self.stdout_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=self.workdir)
        if wait_ready and self.admin_port is not None:
            self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise DaemonExited(f"{self.name} exited with {self.proc.returncode} during start-up:\n{self.log()}")
            try:
                return http_get(self.admin_port, "/readyz", timeout=1.0).status == 200
            except OSError:
                return False

        deadline = time.monotonic() + timeout
        while True:
            if ready():  # DaemonExited propagates at once
                return
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"{self.name} not ready on 127.0.0.1:{self.admin_port} after {timeout}s:\n{self.log()}")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        """Waits for exit; raises WaitTimeout if still running after `timeout`."""
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WaitTimeout(f"{self.name} (pid {self.proc.pid}) still running after {timeout}s") from None
        return self.returncode

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.returncode = self.proc.returncode
        return self.returncode

    def kill(self, timeout: float = 5.0) -> int | None:
        """SIGKILL by PID (a crash: no drain, no cleanup) and reap it. Returns the exit code.
        The daemon can be started again with start() (same config, same ports)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=timeout)
        self.returncode = self.proc.returncode
        return self.returncode

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def get(self, path: str, timeout: float = 2.0) -> HttpResponse:
        return http_get(self.admin_port, path, timeout=timeout)

    def metrics(self) -> str:
        r = self.get("/metrics")
        if r.status != 200:
            raise AssertionError(f"/metrics answered {r.status}")
        return r.body

    def metric(self, name: str, labels: dict | None = None) -> float | None:
        return metric(self.metrics(), name, labels)

    def wait_metric(self, name: str, labels: dict | None = None, predicate=None, timeout: float = 5.0) -> float:
        """Polls /metrics until predicate(value) holds (default: value is present and > 0)."""
        pred = predicate or (lambda v: v > 0)
        box = {}

        def check():
            v = self.metric(name, labels)
            box["v"] = v
            return v is not None and pred(v)

        try:
            wait_until(check, timeout)
        except WaitTimeout as e:
            error = f"; last error: {e.__cause__!r}" if e.__cause__ is not None else ""
            raise WaitTimeout(f"timed out after {timeout}s waiting for {name}{labels or ''} "
                              f"to satisfy the predicate; last value {box.get('v')!r}{error}") from e.__cause__
        return box["v"]


def run_binary(name: str, *args, timeout: float = 10.0, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs a short-lived command (--version, --check) to completion, bounded in time."""
    return subprocess.run([binary(name), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


class MasterProcess(Daemon):
    """A smockron-master with its three loopback ports."""

    def __init__(self, workdir: str, accounting_port: int, control_port: int, admin_port: int, config_path: str,
                 args=()):
        super().__init__("smockron-master", config_path, workdir, args=args, admin_port=admin_port)
        self.accounting_port = accounting_port
        self.control_port = control_port
        self.accounting = f"tcp://{HOST}:{accounting_port}"
        self.control = f"tcp://{HOST}:{control_port}"

    def query_port(self) -> int:
        """The UDP query endpoint's port as bound (the master logs it; "query = 127.0.0.1:0" picks one)."""
        return self._logged_port(r"query=udp:[^ ]*:(\d+)", "query")

    def rls_port(self) -> int:
        """The port of Envoy's rate limit services as bound ("rls = 127.0.0.1:0" picks one; the master logs it)."""
        return self._logged_port(r" rls=[^ ]*:(\d+)", "rls")

    def _logged_port(self, pattern: str, what: str, timeout: float = 10.0) -> int:
        """The port in the master's start-up line (waited for: the line may land after the caller looked)."""
        try:
            m = wait_until(lambda: re.search(pattern, self.log()), timeout)
        except WaitTimeout:
            raise AssertionError(f"the master names no {what} endpoint in its log:\n{self.log()}") from None
        return int(m.group(1))

    def gatekeeper(self, domains, handshake: bool = True, timeout: float = 10.0) -> "Gatekeeper":
        gk = Gatekeeper(self.accounting, self.control, domains)
        if handshake:
            try:
                gk.handshake(timeout)
            except BaseException:
                gk.close()
                raise
        return gk


class ProxyProcess(Daemon):
    """A smockron-proxy: `port` is its listener, `admin_port` its admin endpoint."""

    def __init__(self, workdir: str, config_path: str, port: int, admin_port: int, args=(), prefix=()):
        super().__init__(PROXY, config_path, workdir, args=args, admin_port=admin_port, prefix=prefix)
        self.port = port

    def readyz(self) -> str:
        return self.get("/readyz").body

    def ctl(self) -> float:
        """Control messages (DELAY_UNTIL) received so far."""
        return self.metric(CTL) or 0.0

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")


def run(cmd: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Runs a peer program (curl, nghttp, ...) to completion, bounded in time; output as text."""
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
