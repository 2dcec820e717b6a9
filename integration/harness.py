"""Reusable helpers and shared fixtures for Smockron's black-box integration tests.

Everything here talks to real binaries over 127.0.0.1 only:

- ports:      free_port(), free_ports(n), reserve_port(), bind_failed(log)
- time:       now_ms(), wait_until(predicate, timeout)   (deadline polling, never fixed sleeps;
              only a falsy value or a transient connection error means "not yet")
- processes:  Daemon (start with --config, stderr to a log file, stop by PID: SIGTERM, deadline, SIGKILL;
              kill(): SIGKILL by PID, a crash; start() again restarts on the same config),
              MasterProcess, ProxyProcess
- HTTP:       http_get(port, path), fetch(port, target) (raw bytes, one fresh connection)
- metrics:    parse_metrics(text), metric(text, name, labels)
- access log: access_log_keys(path), read_access_log(*paths) (JSON lines; times from the proxy's clock)
- config:     master_toml(...), proxy_toml(...), toml_value(...)
- ZeroMQ:     Gatekeeper (stand-in for smockron-proxy, talks to a real master),
              FakeMaster (stand-in for smockron-master, talks to a real proxy)
- unittest:   DaemonTestCase (temp dir per test, daemons stopped in cleanup, logs printed on failure;
              start_master / start_proxy / start_backend on fresh ports, retried when a port was
              taken meanwhile; gate_stack + prime: a proxy gated by a real master, ZeroMQ loop proven)

Binaries are taken from $SMOCKRON_BIN_DIR (default /work/main/build/bin).
"""
from __future__ import annotations

import collections
import datetime
import http.client
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

try:
    import zmq
except ImportError:  # pragma: no cover - depends on the machine's Python
    # Debian's python3-zmq lives in dist-packages, which a pyenv/venv Python of
    # the same minor version does not search by default. Appending (not
    # prepending) keeps the interpreter's own packages first.
    _dist = "/usr/lib/python3/dist-packages"
    if os.path.isdir(os.path.join(_dist, "zmq")) and _dist not in sys.path:
        sys.path.append(_dist)
    import zmq  # noqa: E402  (raises a clear ImportError if still missing)

from backends import BackendProcess, RawConn, request_bytes  # noqa: E402  (same directory)

HOST = "127.0.0.1"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN_DIR = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(REPO_ROOT, "build", "bin"))

#: Domain every master config rendered by master_toml() gets, used only by the
#: slow-joiner handshake. One request per hour makes every probe answer with a
#: DELAY_UNTIL, so a reply proves both directions of the ZeroMQ link are up.
PROBE_DOMAIN = "smockron-probe"

#: The proxy's counterpart: gate configs (DaemonTestCase.gate_stack) get a first route
#: WARM_ROUTE on WARM_DOMAIN (1 request per hour), so a request with a fresh X-Warm key
#: draws a DELAY_UNTIL: DaemonTestCase.prime() proves the proxy <-> master loop with it.
#: WARM_DOMAIN sorts after the test domains: its subscription is sent last.
WARM_DOMAIN = "zzwarm"
WARM_ROUTE = {"path": "/__warm/", "domain": WARM_DOMAIN, "upstream": "app", "identify": ["header:X-Warm"]}

PROXY = "smockron-proxy"
CTL = "smockron_proxy_control_messages_total"
HELD = "smockron_proxy_held_requests"


def binary(name: str) -> str:
    """Absolute path of a Smockron executable; fails the test (never skips) if it is missing."""
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        raise AssertionError(f"{path} is not built (build first, or set SMOCKRON_BIN_DIR)")
    return path


# --------------------------------------------------------------------------- ports and time


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` s; reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def max_in_window(ts: list[float], w: float) -> int:
    """Largest number of (sorted) times in any half-open window [t, t+w)."""
    best, j = 0, 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= w:
            j += 1
        best = max(best, i - j + 1)
    return best


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


def now_ms() -> int:
    """Wall clock in ms since the epoch (the clock the daemons use)."""
    return time.time_ns() // 1_000_000


class WaitTimeout(AssertionError):
    """A bounded wait ran out; an AssertionError so unittest reports a failure."""


#: What wait_until() treats as "not yet" besides a falsy value: connection-level
#: errors while a daemon or backend starts, restarts or goes away (refused, reset,
#: timed out: all OSError, urllib.error.URLError included) and a half-written HTTP
#: answer. Anything else - an AssertionError above all - is a failure.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02, message: str = "",
               retry_on: tuple[type[BaseException], ...] = TRANSIENT_ERRORS):
    """Polls predicate() until it returns something truthy, which is returned.

    A falsy value means "not yet", and so does an exception of a type in
    `retry_on` (by default TRANSIENT_ERRORS: e.g. connection refused while a daemon
    starts). Every other exception propagates at once: an assertion inside a
    predicate fails the test, it is never taken for "not yet". On timeout the
    last value and the last transient error are reported.
    """
    deadline = time.monotonic() + timeout
    last_exc = None
    last_value = None
    while True:
        try:
            last_value = predicate()
            if last_value:
                return last_value
        except retry_on as e:
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f"; last value: {last_value!r}"
            if last_exc is not None:
                detail += f"; last error: {last_exc!r}"
            raise WaitTimeout(f"timed out after {timeout}s waiting for {message or predicate}{detail}") from last_exc
        time.sleep(interval)


# --------------------------------------------------------------------------- the proxy's access log


def access_log_keys(path: str) -> dict:
    """[proxy] keys for a JSON access log written to `path` (start_proxy, gate_stack ...)."""
    return {"access_log": True, "access_log_format": "json", "access_log_path": path}


def _epoch_seconds(rfc3339: str) -> float:
    """ "2026-11-23T17:41:15.123Z" (the access log's UTC time, milliseconds) as seconds since the epoch."""
    dt = datetime.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.replace(tzinfo=datetime.timezone.utc).timestamp()


def read_access_log(*paths: str) -> list[dict]:
    """The entries of JSON access logs (several proxies' merged; a missing file has none;
    only complete lines), sorted by "t_out". Each entry gets, from the proxy's own clock
    (so neither a busy test process nor a Python backend can skew them; wall clock,
    seconds since the epoch, comparable with time.time()):
      "t_head": when the request head was complete, which is when the gate decided
                (millisecond resolution);
      "t_out":  when the gate let the request go: t_head + held_ms;
      "forwarded": whether it went to an upstream (not refused, not gone while held)."""
    out = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        for line in text.split("\n")[:-1]:  # the last piece is empty or a line still being written
            if not line.strip():
                continue
            e = json.loads(line)
            e["t_head"] = _epoch_seconds(e["time"])
            e["t_out"] = e["t_head"] + float(e["held_ms"]) / 1000.0
            e["forwarded"] = bool(e.get("upstream"))
            out.append(e)
    out.sort(key=lambda e: e["t_out"])
    return out


# --------------------------------------------------------------------------- HTTP and metrics

HttpResponse = collections.namedtuple("HttpResponse", "status headers body")


def http_get(port: int, path: str, timeout: float = 2.0, host: str = HOST, headers: dict | None = None) -> HttpResponse:
    """GET http://127.0.0.1:port/path. Raises OSError on connection problems."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError("integration tests only talk to the loopback interface")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
        return HttpResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape_label(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def _parse_labels(text: str) -> dict:
    labels = {}
    pos = 0
    while pos < len(text):
        m = _LABEL_RE.match(text, pos)
        if not m:
            raise ValueError(f"bad label set {{{text}}}")
        labels[m.group(1)] = _unescape_label(m.group(2))
        pos = m.end()
    return labels


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """Parses Prometheus text exposition into (name, labels, value) samples."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise ValueError(f"unparsable metrics line: {line!r}")
        value = m.group(4)
        samples.append((m.group(1), _parse_labels(m.group(3) or ""), float(value.replace("Inf", "inf"))))
    return samples


def metric(text: str, name: str, labels: dict | None = None) -> float | None:
    """Value of the sample `name` whose label set is exactly `labels` (None/{} = no labels); None if absent."""
    want = dict(labels or {})
    for n, l, v in parse_metrics(text):
        if n == name and l == want:
            return v
    return None


def metric_sum(text: str, name: str, **match) -> float:
    """Sum of every sample of `name` whose labels include `match` (0 when none)."""
    return sum(v for n, l, v in parse_metrics(text) if n == name and all(l.get(k) == x for k, x in match.items()))


# --------------------------------------------------------------------------- config


def toml_value(v) -> str:
    """A Python value as TOML (strings, ints, floats, bools, lists, dicts as inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string of printable text is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot render {v!r} as TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def master_toml(accounting_port: int, control_port: int, admin_port: int, domains: dict,
                probe: bool = True, **master_keys) -> str:
    """A [master] config.

    domains: {name: {"rules": [("10/s", 2), {"quota": 100, "per": "day"}, ...], "algorithm": "gcra",
                     "overrides": {identifier: [("100/s", 20), ...]}}} (algorithm and overrides optional).
    master_keys: extra [master] keys, e.g. max_identifiers=100, sweep_interval="50ms".
    probe: add PROBE_DOMAIN (rate 1/h, burst 1) for Gatekeeper.handshake().
    """
    lines = [
        "[master]",
        f'accounting = "tcp://{HOST}:{accounting_port}"',
        f'control = "tcp://{HOST}:{control_port}"',
        f'admin = "{HOST}:{admin_port}"',
    ]
    for k, v in master_keys.items():
        lines.append(f"{k} = {toml_value(v)}")
    all_domains = dict(domains)
    if probe:
        all_domains.setdefault(PROBE_DOMAIN, {"rules": [("1/h", 1)]})
    for name, d in all_domains.items():
        lines.append("")
        lines.append(f"[master.domains.{_toml_key(name)}]")
        rules = [r if isinstance(r, dict) else {"rate": r[0], "burst": r[1]} for r in d.get("rules", [])]
        lines.append(f"rules = {toml_value(rules)}")
        if "algorithm" in d:
            lines.append(f'algorithm = {toml_value(d["algorithm"])}')
        if "overrides" in d:
            overrides = [{"identifier": ident, "rules": [{"rate": r, "burst": b} for r, b in rules]}
                         for ident, rules in d["overrides"].items()]
            lines.append(f"overrides = {toml_value(overrides)}")
    return "\n".join(lines) + "\n"


def proxy_toml(listen_port: int, admin_port: int, upstreams: dict, routes: list, accounting: list, control: list,
               **proxy_keys) -> str:
    """A [proxy] config. upstreams: {name: {"servers": [...], "fail_timeout": "200ms"}};
    routes: [{"path": "/", "domain": "api", "upstream": "app", "identify": [...]}]."""
    lines = [
        "[proxy]",
        f'listen = "{HOST}:{listen_port}"',
        f'admin = "{HOST}:{admin_port}"',
        f"accounting = {toml_value(accounting)}",
        f"control = {toml_value(control)}",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in proxy_keys.items()]
    for name, u in upstreams.items():
        lines += ["", f"[proxy.upstreams.{name}]"] + [f"{k} = {toml_value(v)}" for k, v in u.items()]
    for r in routes:
        lines += ["", "[[proxy.routes]]"] + [f"{k} = {toml_value(v)}" for k, v in r.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- processes


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
        m = re.search(r"query=udp:[^ ]*:(\d+)", self.log())
        if not m:
            raise AssertionError(f"the master names no query endpoint in its log:\n{self.log()}")
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


def fetch(port: int, target: str = "/", headers=(), method: str = "GET", body: bytes = b"", key: str | None = None,
          timeout: float = 5.0, host: str = "test.local"):
    """One request on a fresh connection (X-API-Key: key if given): (Response, elapsed seconds)."""
    hdrs = list(headers)
    if key is not None:
        hdrs.append(("X-API-Key", key))
    t0 = time.monotonic()
    with RawConn(port, timeout) as c:
        c.send(request_bytes(method, target, hdrs, body, host))
        r = c.read_response(head_request=method == "HEAD", timeout=timeout)
    return r, time.monotonic() - t0


# --------------------------------------------------------------------------- ZeroMQ stand-ins

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

    def __init__(self, accounting: str, control: str, domains, probe_domain: str = PROBE_DOMAIN):
        self.ctx = zmq.Context()
        self.uid = f"{os.getpid()}-{next(Gatekeeper._ids)}-{uuid.uuid4().hex[:6]}"
        self.probe_domain = probe_domain
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.policies: list[list[bytes]] = []  # POLICY and QUOTA messages seen (recv skips them)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 100_000)
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


class FakeMaster:
    """Stand-in for smockron-master, for testing a real gatekeeper (proxy):
    SUB bound to the accounting endpoint (subscribed to everything) and PUB
    bound to the control endpoint."""

    def __init__(self, accounting_port: int | None = None, control_port: int | None = None):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.accounting_port = accounting_port or self.sub.bind_to_random_port(f"tcp://{HOST}")
        if accounting_port:
            self.sub.bind(f"tcp://{HOST}:{accounting_port}")
        self.control_port = control_port or self.pub.bind_to_random_port(f"tcp://{HOST}")
        if control_port:
            self.pub.bind(f"tcp://{HOST}:{control_port}")
        self.accounting = f"tcp://{HOST}:{self.accounting_port}"
        self.control = f"tcp://{HOST}:{self.control_port}"
        self.closed = False

    def recv_raw(self, timeout: float = 5.0) -> list[bytes] | None:
        if self.sub.poll(max(0, int(timeout * 1000))):
            return self.sub.recv_multipart()
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


# --------------------------------------------------------------------------- unittest base


class DaemonTestCase(unittest.TestCase):
    """A temp dir per test; daemons, backends and sockets cleaned up even when setUp
    fails; daemon and backend logs printed to stderr when the test fails (set
    SMOCKRON_KEEP_TMP=1 to keep the dir). The fixtures every test file shares:
    masters, proxies (alone, or gated by a real master and primed), backends."""

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="smockron-it-")
        self.daemons: list[Daemon] = []
        self.log_files: list[tuple[str, str]] = []  # (title, path): other logs printed on failure
        self.addCleanup(self._cleanup_tmp)

    def _failed(self) -> bool:
        """Whether this test has failed so far. (Not outcome.success: unittest resets it
        to True around every cleanup, so a cleanup never saw a failure.)"""
        result = getattr(getattr(self, "_outcome", None), "result", None)
        reported = list(getattr(result, "errors", [])) + list(getattr(result, "failures", []))
        return any(test is self or getattr(test, "test_case", None) is self for test, _ in reported)

    def _cleanup_tmp(self):
        if self._failed():
            for d in self.daemons:
                sys.stderr.write(f"\n----- {d.name} (pid {d.proc.pid if d.proc else '-'}) log {d.log_path} -----\n")
                sys.stderr.write(d.log()[-20000:])
            printed = set()
            for title, path in self.log_files:
                if path in printed:
                    continue
                printed.add(path)
                try:
                    with open(path, "rb") as f:
                        text = f.read().decode("utf-8", "replace")
                except OSError:
                    continue
                if text:
                    sys.stderr.write(f"\n----- {title} log {path} -----\n{text[-20000:]}")
        if os.environ.get("SMOCKRON_KEEP_TMP"):
            sys.stderr.write(f"\nkept {self.tmp}\n")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def write_file(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def track(self, daemon: Daemon) -> Daemon:
        self.daemons.append(daemon)
        self.addCleanup(daemon.stop)
        return daemon

    def closing(self, obj):
        """Registers obj.close() as a cleanup and returns obj."""
        self.addCleanup(obj.close)
        return obj

    def dead_port(self) -> int:
        """A port nothing listens on (connections refused) for the whole test: held by
        reserve_port() until cleanup, so no other process can take it meanwhile."""
        return self.closing(reserve_port()).getsockname()[1]

    def dead_endpoint(self) -> str:
        return f"tcp://{HOST}:{self.dead_port()}"

    # ---- daemons on fresh ports
    def start_daemon(self, make, attempts: int = 5, **start_args) -> Daemon:
        """make() writes a config with fresh ports and returns an unstarted Daemon for it;
        the daemon is tracked and started (waiting for /readyz). A port taken by another
        process between free_ports() and the daemon's bind makes the daemon exit with a
        bind error: then it is tried again with fresh ports, up to `attempts` times."""
        last = None
        for _ in range(attempts):
            d = self.track(make())
            try:
                return d.start(**start_args)
            except DaemonExited as e:
                if not bind_failed(d.log()):
                    raise
                last = e
        raise last

    def restart(self, daemon: Daemon, ready_timeout: float = 10.0, attempts: int = 20) -> Daemon:
        """Starts a stopped (or killed) daemon again with the same config, so the same
        ports. A port the dead process held may take a moment to be free again:
        retried on bind errors (another process may also have taken it: then it fails)."""
        for attempt in range(attempts):
            try:
                return daemon.start(ready_timeout=ready_timeout)
            except DaemonExited:
                if attempt == attempts - 1 or not bind_failed(daemon.log()):
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def start_master(self, domains: dict, config_name: str = "master.toml", attempts: int = 5, args=(),
                     **master_keys) -> MasterProcess:
        """Writes a config with fresh ports (plus the probe domain unless probe=False) and
        starts a master, retrying with new ports if one was taken meanwhile."""
        def make():
            acc, ctl, adm = free_ports(3)
            path = self.write_file(config_name, master_toml(acc, ctl, adm, domains, **master_keys))
            return MasterProcess(self.tmp, acc, ctl, adm, path, args=args)

        return self.start_daemon(make, attempts)

    def gatekeeper(self, master: MasterProcess, domains, handshake: bool = True) -> Gatekeeper:
        return self.closing(master.gatekeeper(domains, handshake=handshake))

    def start_backend(self, port: int | None = None, host: str = HOST, tls=()) -> BackendProcess:
        """A backends.py process; without `port` it binds a port of its own choosing (no
        race). Stopped in cleanup; its stderr goes to a log file printed on failure.
        tls: (cert, key) or (cert, key, client_ca) for HTTPS."""
        b = BackendProcess(port, workdir=self.tmp, host=host, tls=tls)
        self.log_files.append((f"backend {b.name}", b.log_path))
        self.addCleanup(b.stop)
        return b.start()

    def start_proxy(self, upstreams: dict, routes: list, accounting=None, control=None,
                    config_name: str = "proxy.toml", args=(), attempts: int = 5, prefix=(),
                    **proxy_keys) -> ProxyProcess:
        """A proxy on fresh ports (config file `config_name`: several proxies, and
        restarts, each keep theirs), started and ready. Without master endpoints,
        accounting/control point at dead ports (fail-open)."""
        accounting = accounting or [self.dead_endpoint()]
        control = control or [self.dead_endpoint()]

        def make():
            port, admin = free_ports(2)
            path = self.write_file(config_name, proxy_toml(port, admin, upstreams, routes, accounting, control,
                                                           **proxy_keys))
            return ProxyProcess(self.tmp, path, port, admin, args=args, prefix=prefix)

        return self.start_daemon(make, attempts)

    def simple_proxy(self, backend: BackendProcess, path: str = "/", identify=("header:X-API-Key", "ip"),
                     **proxy_keys) -> ProxyProcess:
        """A proxy with one route (domain "api") to one backend, no master (fail-open)."""
        return self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}},
                                [{"path": path, "domain": "api", "upstream": "app", "identify": list(identify)}],
                                **proxy_keys)

    # ---- proxy + real master
    def gate_stack(self, domains: dict, routes: list, master_keys: dict | None = None, **proxy_keys):
        """A real master with `domains` (+ WARM_DOMAIN, and `master_keys`), a backend,
        and a proxy whose routes are WARM_ROUTE + `routes` (upstream "app"); the ZeroMQ
        loop is primed. Returns (master, backend, proxy)."""
        all_domains = dict(domains)
        all_domains[WARM_DOMAIN] = {"rules": [("1/h", 1)]}
        master = self.start_master(all_domains, **(master_keys or {}))
        backend = self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, [WARM_ROUTE] + routes,
                                 accounting=[master.accounting], control=[master.control], **proxy_keys)
        self.wait_connected(proxy)
        self.prime(proxy)
        return master, backend, proxy

    def wait_connected(self, proxy: ProxyProcess, masters: str = "1/1", timeout: float = 10.0) -> None:
        wait_until(lambda: f"masters connected: {masters}" in proxy.readyz(), timeout,
                   message=f"proxy {proxy.port}: masters connected: {masters}")

    def prime(self, proxy: ProxyProcess, timeout: float = 10.0) -> None:
        """Sends warm-up requests (one fresh X-Warm key each, route WARM_ROUTE) until a
        DELAY_UNTIL reaches the proxy: accounting PUB, master subscription and control
        subscriptions are then all up (ZeroMQ's slow joiners)."""
        base = proxy.ctl()
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            n += 1
            r, _ = fetch(proxy.port, f"/__warm/{n}", headers=[("X-Warm", f"warm-{n}")])
            self.assertEqual(r.status, 200, r)
            try:
                wait_until(lambda: proxy.ctl() > base, min(0.25 * n, 1.0))
                # Let any late reply to an earlier probe land before tests count messages.
                time.sleep(0.05)
                return
            except WaitTimeout:
                continue
        raise WaitTimeout(f"no DELAY_UNTIL reached the proxy after {n} warm-up requests")

    def wait_ctl(self, proxy: ProxyProcess, base: float, n: int = 1, timeout: float = 5.0) -> float:
        """Waits until the proxy has received n control messages more than `base`."""
        return wait_until(lambda: (v := proxy.ctl()) >= base + n and v, timeout,
                          message=f"{n} control message(s) after {base}")


def one_box_toml(*, domain: str, rule: str, backend_port: int, proxy_port: int, proxy_admin: int,
                 master_admin: int, accounting: int, control: int, identify: str = '"header:X-API-Key"',
                 proxy_extra: str = "", upstream_extra: str = "") -> str:
    """A single file driving one master (one domain, one rule) and one proxy
    (one worker, one route to one backend) on 127.0.0.1, as the benchmarks use."""
    return f"""[master]
accounting = "tcp://127.0.0.1:{accounting}"
control = "tcp://127.0.0.1:{control}"
admin = "127.0.0.1:{master_admin}"
[master.domains.{domain}]
rules = [ {rule} ]

[proxy]
listen = "127.0.0.1:{proxy_port}"
admin = "127.0.0.1:{proxy_admin}"
threads = 1
accounting = ["tcp://127.0.0.1:{accounting}"]
control = ["tcp://127.0.0.1:{control}"]
{proxy_extra}
[proxy.upstreams.app]
servers = ["127.0.0.1:{backend_port}"]
{upstream_extra}
[[proxy.routes]]
path = "/"
domain = "{domain}"
upstream = "app"
identify = [{identify}]
"""
