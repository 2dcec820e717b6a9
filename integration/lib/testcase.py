"""DaemonTestCase: the unittest base of the integration tests. A temp dir per
test, daemons and backends on fresh ports cleaned up (logs printed on failure),
and a proxy gated by a real master with the ZeroMQ loop primed (gate_stack)."""
from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from lib.backends import BackendProcess
from lib.config import WARM_DOMAIN, WARM_ROUTE, master_toml, proxy_toml
from lib.daemons import Daemon, DaemonExited, MasterProcess, ProxyProcess, stop_process
from lib.gatekeeper import FakeMaster, Gatekeeper
from lib.http1 import fetch
from lib.ports import HOST, bind_failed, free_ports, reserve_port
from lib.timing import WaitTimeout, wait_until


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
        """A lib/backends.py process; without `port` it binds a port of its own choosing (no
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
        self.wait_accounting(proxy)
        self.prime(proxy)
        return master, backend, proxy

    def start_relay(self, master: MasterProcess, gatekeepers: int, one_way_ms: int, attempts: int = 5) -> list[int]:
        """bench/delay_relay.py (`one_way_ms` each way) on 2 x `gatekeepers` fresh ports:
        `gatekeepers` to the master's accounting endpoint, then as many to its control
        endpoint. It binds them all, then says "ready"; one taken meanwhile makes it exit
        instead, and it is tried again with new ports."""
        log = os.path.join(self.tmp, "delay_relay.stderr.log")
        self.log_files.append(("delay_relay", log))
        g = gatekeepers
        relay_script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                                    "delay_relay.py")
        for _ in range(attempts):
            relay_ports = free_ports(2 * g)
            routes = [f"{relay_ports[i]}:{HOST}:{master.accounting_port}" for i in range(g)]
            routes += [f"{relay_ports[g + i]}:{HOST}:{master.control_port}" for i in range(g)]
            with open(log, "ab") as err:
                relay = subprocess.Popen([sys.executable, relay_script, "--delay-ms", str(one_way_ms), *routes],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
            self.addCleanup(stop_process, relay)
            try:
                said = relay.stdout.readline() if select.select([relay.stdout], [], [], 10)[0] else b""
            finally:
                relay.stdout.close()  # "ready" is all it ever prints
            if said.strip() == b"ready":
                return relay_ports
            stop_process(relay)
            with open(log, "rb") as f:
                if b"Address already in use" not in f.read():
                    raise AssertionError(f"delay_relay.py did not start (said {said!r}); see {log}")
        raise AssertionError(f"delay_relay.py could not bind its ports in {attempts} attempts")

    def wait_connected(self, proxy: ProxyProcess, masters: str = "1/1", timeout: float = 10.0) -> None:
        wait_until(lambda: f"masters connected: {masters}" in proxy.readyz(), timeout,
                   message=f"proxy {proxy.port}: masters connected: {masters}")

    def wait_accounting(self, proxy: ProxyProcess, masters: int = 1, timeout: float = 10.0,
                        fake: FakeMaster | None = None) -> None:
        """Until every worker's accounting link to each of `masters` has the master's
        subscriptions: a message sent before would be counted unsent, not charged.
        A `fake` master is pumped meanwhile (its SUB subscribes only when called into)."""
        workers = int(wait_until(lambda: re.search(r"\((\d+) worker threads?\)", proxy.log()), timeout,
                                 message="the proxy's worker count in its log").group(1))

        def all_subscribed(v: float) -> bool:
            if fake:
                fake.pump()
            return v >= workers * masters

        proxy.wait_metric("smockron_proxy_accounting_links_subscribed", predicate=all_subscribed, timeout=timeout)

    def prime(self, proxy: ProxyProcess, timeout: float = 10.0, key_prefix: str = "warm-") -> None:
        """Sends warm-up requests (one fresh X-Warm key each, route WARM_ROUTE) until a
        DELAY_UNTIL reaches the proxy: accounting PUB, master subscription and control
        subscriptions are then all up (ZeroMQ's slow joiners). Gatekeepers of one master
        each take their own `key_prefix` (the DELAY_UNTIL of one's key reaches them all)."""
        base = proxy.ctl()
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            n += 1
            r, _ = fetch(proxy.port, f"/__warm/{n}", headers=[("X-Warm", f"{key_prefix}{n}")])
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
