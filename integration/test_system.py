"""Whole-system integration tests: a real smockron-master, real smockron-proxy
gatekeepers and real backend processes (lib/backends.py) on 127.0.0.1, with parts
of the system killed and restarted under load.

Scenarios (each test starts its own processes on fresh ports):

1. The master is killed (SIGKILL) while requests are held and others arrive:
   /readyz says fail-open, held requests still leave at their reserved times
   (the proxy keeps its control memory), other identifiers pass unheld,
   nothing hangs. The master is restarted on the same ports: a client far over
   its limit is limited again within a bound (the measured figure is
   printed). And a busy identifier the master was limiting passes freely once
   the master's last word has expired (no local pacing chained forever).
2. One of two gatekeepers is killed and restarted under load: its clients
   reconnect, and the hot identifier's admitted count at the (counting)
   backend stays within rate x time + burst + a small slack.
3. The backend is killed and restarted on the same port: 502 while it is
   down, normal service once it is back, without restarting the proxy. And a
   non-idempotent request in flight on a backend that dies is answered 502,
   never replayed on another server.
4. A client that disconnects while held frees its place at once: the held
   gauge goes back to 0, its request is never forwarded (not even after its
   reserved time), and the next request of the same identifier takes the
   freed place instead of queueing behind it.
5. (Found while writing 1.) DELAYED messages of one identifier that reach the
   master out of order - a proxy publishes from one socket per worker - are
   each charged at their own reserved time.

Reserved times come from the proxy itself: an AccountingTap is listed as a
second accounting endpoint of the proxy (its PUB connects to every endpoint)
and records every DELAYED message, whose frame 4 is the time the proxy
reserved for that held request.

These are the only tests of a killed master, a held client's disconnect and a
backend killed and restarted (test_proxy has the proxy-only behaviours).
Timing is asserted only where it is the behaviour, in bands wide enough for a
busy 2-core machine (tail latency is bench/'s business); every wait polls
against a deadline. Measured figures are written to stderr as "[measured] ..."
lines.

Run: cd integration && python3 -m unittest -v test_system
"""
from __future__ import annotations

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.backends import BackendProcess  # noqa: E402
from lib.config import WARM_DOMAIN, WARM_ROUTE  # noqa: E402
from lib.daemons import ProxyProcess  # noqa: E402
from lib.gatekeeper import FakeMaster  # noqa: E402
from lib.http1 import RawConn, fetch, request_bytes  # noqa: E402
from lib.metrics import HELD, metric_sum  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import WaitTimeout, now_ms, wait_until  # noqa: E402

REQUESTS = "smockron_proxy_requests_total"
GONE = "smockron_proxy_held_client_disconnects_total"
API_ROUTE = {"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"]}


def measured(text: str) -> None:
    sys.stderr.write(f"\n[measured] {text}\n")
    sys.stderr.flush()


class AccountingTap:
    """A second accounting endpoint for a proxy (its PUB connects to every endpoint
    listed): a SUB bound on a fresh port that records every accounting message the
    proxy publishes, in the background. DELAYED messages carry the reserved time of
    every held request (frame 4), exactly as the proxy decided it."""

    def __init__(self):
        self.fm = FakeMaster()  # only its SUB (accounting) side is used
        self.endpoint = self.fm.accounting
        self.lock = threading.Lock()
        self.messages = []  # (wall time received, Accounting)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            m = self.fm.recv(0.05)
            if m is not None:
                with self.lock:
                    self.messages.append((time.time(), m))

    def select(self, status: str | None = None, identifier: str | None = None, domain: str = "api") -> list:
        with self.lock:
            return [m for _, m in self.messages if m.domain == domain and (status is None or m.status == status)
                    and (identifier is None or m.identifier == identifier)]

    def reserved(self, identifier: str) -> list[float]:
        """Reserved (release) times of the held requests of identifier, wall-clock seconds, ascending."""
        return sorted(m.delayed_ms / 1000 for m in self.select("DELAYED", identifier))

    def wait_linked(self, proxy, timeout: float = 10.0) -> None:
        """Sends warm-up requests (fresh X-Warm keys) until one's accounting reaches the tap."""
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            n += 1
            key = f"tap-{n}"
            r = fetch(proxy.port, f"/__warm/tap/{n}", headers=[("X-Warm", key)])[0]
            if r.status != 200:
                raise AssertionError(f"warm-up request answered {r.status}")
            try:
                wait_until(lambda: self.select(identifier=key, domain=WARM_DOMAIN), min(0.25 * n, 1.0))
                return
            except WaitTimeout:
                continue
        raise WaitTimeout(f"no accounting reached the tap after {n} warm-up requests")

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.fm.close()


class SystemCase(DaemonTestCase):
    def start_gate_proxy(self, name: str, master, backend: BackendProcess, routes: list, upstream_keys=None,
                         tap: AccountingTap | None = None, **proxy_keys) -> ProxyProcess:
        """A proxy with its own config file `name`.toml (several proxies, and restarts,
        each keep theirs): routes WARM_ROUTE + `routes` to `backend`, connected to
        `master` (and publishing accounting to `tap` too), primed: the ZeroMQ loop works
        both ways."""
        upstreams = {"app": {"servers": [f"{HOST}:{backend.port}"], **(upstream_keys or {})}}
        accounting = [master.accounting] + ([tap.endpoint] if tap else [])
        p = self.start_proxy(upstreams, [WARM_ROUTE] + routes, accounting, [master.control],
                             config_name=f"{name}.toml", **proxy_keys)
        self.wait_connected(p)
        self.wait_accounting(p, masters=2 if tap else 1)
        self.prime(p)
        if tap:
            tap.wait_linked(p)
        return p

    def system(self, domains: dict, routes: list, proxies: int = 1, upstream_keys=None, tap: bool = False,
               **proxy_keys):
        """A master with `domains` (+ WARM_DOMAIN), one backend, `proxies` primed proxies
        (the first one also publishing to an AccountingTap when `tap`).
        Returns (master, backend, [proxies], tap or None)."""
        all_domains = dict(domains)
        all_domains[WARM_DOMAIN] = {"rules": [("1/h", 1)]}
        master = self.start_master(all_domains)
        backend = self.start_backend()
        acc_tap = self.closing(AccountingTap()) if tap else None
        ps = [self.start_gate_proxy(f"proxy-{i}", master, backend, routes, upstream_keys,
                                    tap=acc_tap if i == 0 else None, **proxy_keys)
              for i in range(proxies)]
        return master, backend, ps, acc_tap

    def hold_requests(self, proxy: ProxyProcess, key: str, n: int, prefix: str) -> list[RawConn]:
        """Sends n requests of `key` on n connections (responses not read) and waits
        until all n are held."""
        held0 = proxy.metric(HELD) or 0
        conns = [self.closing(RawConn(proxy.port, 10)) for _ in range(n)]
        for i, c in enumerate(conns):
            c.send(request_bytes("GET", f"{prefix}{i}", [("X-API-Key", key)]))
        proxy.wait_metric(HELD, predicate=lambda v: v == held0 + n, timeout=5)
        return conns


# =============================================================================== 1: master killed, restarted


class MasterFailureTest(SystemCase):
    # Rule 1/s, burst 1. One interval is the room for the steps between the first hold
    # and the kill (several polled waits): ample on a busy machine, where half a second was not.
    INTERVAL = 1.0
    N_HELD = 4
    # The proxy holds at most 0.75..1 x max_delay ahead: 4.5 s or more reaches the N_HELD
    # slots (up to 4 s ahead) and the late request's slot behind them.
    MAX_DELAY = 6.0
    # s from "master ready again" to "a client over its limit is limited again": a recovery
    # time of the whole system (reconnects, resubscription, a round trip), printed as measured;
    # the bound only tells "recovers" from "stays fail-open", with room for a busy machine.
    ENFORCE_BOUND = 5.0

    def decisions(self, proxy: ProxyProcess) -> dict:
        m = proxy.metrics()
        return {d: metric_sum(m, REQUESTS, domain="api", decision=d) for d in ("accepted", "delayed", "rejected")}

    def test_master_killed_while_requests_held_then_restarted(self):
        access_log = os.path.join(self.tmp, "access.log")
        master, backend, (proxy,), tap = self.system({"api": {"rules": [("1/s", 1)]}}, [API_ROUTE], tap=True,
                                                     max_delay=f"{self.MAX_DELAY:g}s", **access_log_keys(access_log))
        # hot uses its burst; the master's DELAY_UNTIL reaches the proxy; N requests are held.
        ctl0 = proxy.ctl()
        self.assertEqual(fetch(proxy.port, "/burst", key="hot")[0].status, 200)
        self.wait_ctl(proxy, ctl0)
        conns = self.hold_requests(proxy, "hot", self.N_HELD, "/held/")
        # Their reserved times, as the proxy published them (DELAYED, frame 4).
        reserved = wait_until(lambda: len(r := tap.reserved("hot")) == self.N_HELD and r, 5,
                              message="a DELAYED message for every held request")

        master.kill()
        t_kill = time.time()
        self.assertLess(t_kill, reserved[1], "master killed before (most of) the held requests were due")
        wait_until(lambda: "masters connected: 0/1" in proxy.readyz(), 5, message="proxy notices the master is gone")
        noticed = time.time() - t_kill
        self.assertIn("fail-open", proxy.readyz())

        # Master gone: other identifiers pass, unheld, while hot's requests are held.
        d0 = self.decisions(proxy)
        for i in range(6):
            r, _ = fetch(proxy.port, f"/fresh/{i}", key=f"fresh-{i}")
            self.assertEqual(r.status, 200, r)
        d1 = self.decisions(proxy)
        self.assertEqual({k: d1[k] - d0[k] for k in d0}, {"accepted": 6, "delayed": 0, "rejected": 0},
                         "fresh identifiers with the master gone")

        # A late request of hot is still answered (held per the memory, or refused),
        # never left hanging.
        box = {}

        def late_hot():
            box["late"] = fetch(proxy.port, "/late-hot", key="hot", timeout=self.MAX_DELAY + 4)

        late = threading.Thread(target=late_hot)
        late.start()

        # Held requests are answered, each forwarded at (about) its reserved time.
        results = [c.read_response(timeout=self.N_HELD * self.INTERVAL + 5) for c in conns]
        self.assertEqual([r.status for r in results], [200] * self.N_HELD, results)
        self.assertEqual(len(backend.requests(key="hot", target_prefix="/held/")), self.N_HELD)
        # When the proxy let each go (its access log: head time + held_ms), matched in order
        # with the reserved times; only those due after the kill tell how the proxy keeps
        # its memory without a master (one due before it was released with the master alive).
        held = wait_until(lambda: len(h := [e for e in read_access_log(access_log)
                                            if e["target"].startswith("/held/") and e["forwarded"]])
                          == self.N_HELD and h, 5, message="the held requests' access log lines")
        released = sorted(e["t_out"] for e in held)
        offsets = [round(a - r, 3) for a, r in zip(released, reserved) if r > t_kill]
        gaps = [round(b - a, 3) for a, b in zip(reserved, reserved[1:])]
        measured(f"held requests reserved {gaps} s apart, released at reserved time + {offsets} s "
                 f"(those due after the kill; master killed {reserved[0] - t_kill:.3f}s before the first was due)")
        for g in gaps:
            self.assertGreaterEqual(g, self.INTERVAL - 0.01, f"reserved times not paced: {gaps}")
        # Never early; on time, not an interval late (the median: one arrival delayed by
        # a busy machine does not make the proxy late).
        self.assertGreaterEqual(min(offsets), -0.03, f"forwarded before its reserved time: {offsets}")
        self.assertLess(sorted(offsets)[len(offsets) // 2], 0.5 * self.INTERVAL,
                        f"arrival - reserved time: {offsets}")
        self.assertLess(max(offsets), 2 * self.INTERVAL, f"arrival - reserved time: {offsets}")

        late.join(self.MAX_DELAY + 5)
        self.assertFalse(late.is_alive(), "a request of hot sent while the master was gone hangs")
        r, elapsed = box["late"]
        r_late = r
        self.assertIn(r.status, (200, 503), r)
        self.assertLess(elapsed, self.MAX_DELAY + 1.5, f"answered within max_delay ({self.MAX_DELAY:g} s)")
        if r.status == 200:
            t_late = backend.requests(target_prefix="/late-hot")[0]["t"]
            self.assertGreaterEqual(t_late, reserved[-1] - 0.03, "the late request did not jump the queue")

        # The master comes back on the same ports (memory store: it starts empty).
        t_restart = time.monotonic()
        self.restart(master)
        t_back = time.monotonic()
        # A client far over its limit (1/s, burst 1), sending back to back: limited again
        # (its request held or refused, as the proxy's decision counters tell)?
        def limited() -> float:
            d = self.decisions(proxy)
            return d["delayed"] + d["rejected"]

        limited0 = limited()
        t_enforced = None
        passed = 0
        deadline = t_back + self.ENFORCE_BOUND + 3.0  # measure beyond the bound, assert below
        while time.monotonic() < deadline:
            t_sent = time.monotonic()
            try:
                r, _ = fetch(proxy.port, "/over", key="over", timeout=1.0)
                self.assertIn(r.status, (200, 503), r)
            except OSError:
                pass  # held (for seconds, perhaps): counted as delayed when the hold began
            if limited() > limited0:
                t_enforced = t_sent - t_back
                break
            passed += 1
            time.sleep(0.01)
        figure = f"{t_enforced:.3f}s" if t_enforced is not None else f"not within {deadline - t_back:.1f}s"
        measured(f"limit enforced again {figure} after the restarted master was ready (master down "
                 f"{time.time() - t_kill:.1f}s in all: noticed by the proxy after {noticed:.2f}s, restarted in "
                 f"{t_back - t_restart:.1f}s; the late request "
                 f"{r_late.status} after {elapsed:.2f}s; {passed} requests of 'over' passed meanwhile)")
        self.assertIsNotNone(t_enforced, "limits never enforced again after the master restart")
        self.assertLessEqual(t_enforced, self.ENFORCE_BOUND)
        self.assertIn("masters connected: 1/1", proxy.readyz())

    def test_master_killed_a_busy_identifier_is_released(self):
        # Regression: local pacing (local_next_us = release + interval) used to chain
        # forever without a master, limiting a busy identifier at the master's last
        # rate indefinitely while /readyz said "fail-open".
        master, _, (proxy,), _ = self.system({"api": {"rules": [("1/3s", 1)]}}, [API_ROUTE], max_delay="500ms")
        ctl0 = proxy.ctl()
        self.assertEqual(fetch(proxy.port, "/a", key="carol")[0].status, 200)
        self.wait_ctl(proxy, ctl0)
        # The master limits while alive: /b is refused (503) or, if it came more than
        # 2.5 s after /a on a slow machine, held - either way not accepted as free.
        d0 = self.decisions(proxy)
        r, _ = fetch(proxy.port, "/b", key="carol")
        d1 = self.decisions(proxy)
        self.assertIn(r.status, (200, 503), r)
        self.assertEqual(d1["delayed"] + d1["rejected"] - d0["delayed"] - d0["rejected"], 1,
                         f"the master limits while alive: /b answered {r.status}, decisions {d0} -> {d1}")
        master.kill()
        wait_until(lambda: "masters connected: 0/1" in proxy.readyz(), 5, message="proxy notices the master is gone")
        self.assertIn("fail-open", proxy.readyz())
        # carol keeps sending; once the master's last word (next 3 s after /a, or 6 s if
        # /b was held) has passed, her requests pass freely: accepted, neither held nor refused.
        passed = 0
        tried = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and passed < 5:
            d0 = self.decisions(proxy)
            r, _ = fetch(proxy.port, "/carol", key="carol")
            d1 = self.decisions(proxy)
            free = r.status == 200 and d1["accepted"] - d0["accepted"] == 1
            tried.append((r.status, "accepted" if free else "limited"))
            passed = passed + 1 if free else 0
            time.sleep(0.05)
        self.assertEqual(passed, 5, f"carol's requests never pass freely after the master died: {tried[-20:]}")


# =============================================================================== 2: a gatekeeper restarted


class GatekeeperRestartTest(SystemCase):
    RATE, BURST = 10, 5
    CLIENTS_PER_PROXY = 3
    WARMUP = 1.0

    def test_gatekeeper_restarted_under_load_limit_holds_globally(self):
        # One access log for both gatekeepers (a line is one append: they never interleave).
        access_log = os.path.join(self.tmp, "access.log")
        master, backend, (a, b), _ = self.system({"api": {"rules": [(f"{self.RATE}/s", self.BURST)]}}, [API_ROUTE],
                                                 proxies=2, max_delay="1s", **access_log_keys(access_log))
        stop = threading.Event()
        lock = threading.Lock()
        outcomes = []  # (wall time answered, proxy name, status or exception name, target)
        proxies = {"a": a, "b": b}

        def client(name: str, idx: int):
            n = 0
            while not stop.is_set():
                n += 1
                target = f"/via-{name}/{idx}/{n}"
                try:
                    r, _ = fetch(proxies[name].port, target, key="hot", timeout=3)
                    res = r.status
                except OSError as e:  # the gatekeeper is down: reconnect (after a short pause)
                    res = type(e).__name__
                with lock:
                    outcomes.append((time.time(), name, res, target))
                if res != 200:
                    time.sleep(0.02)

        threads = [threading.Thread(target=client, args=(name, i), daemon=True)
                   for name in ("a", "b") for i in range(self.CLIENTS_PER_PROXY)]
        t_start = time.time()
        for t in threads:
            t.start()
        try:
            # Counting starts once the load is established: both gatekeepers admitted
            # freely for their first moments (empty memories), which is not what this measures.
            wait_until(lambda: time.time() > t_start + self.WARMUP, 3)
            t_w0 = time.time()
            wait_until(lambda: time.time() > t_w0 + 0.5, 3)
            # What b holds when it dies never leaves, yet the master charged those slots.
            lost = b.metric(HELD) or 0
            b.kill()
            t_killed = time.time()
            self.restart(b)
            t_restarted = time.time()
            # Until its links to the master are up, the restarted gatekeeper is fail-open by
            # design (no master: admit): its clients pass freely, as many as they can send.
            # Linked: the master's POLICY (its own guard) and DELAY_UNTIL have reached it, and
            # its accounting reaches the master. How long that takes is the machine's business.
            wait_until(lambda: "masters connected: 1/1" in b.readyz()
                       and (b.metric("smockron_proxy_control_policies_total") or 0) > 0
                       and b.ctl() > 0 and (b.metric("smockron_proxy_accounting_messages_total") or 0) > 0,
                       10, message="the restarted gatekeeper's links to the master")
            t_linked = time.time()
            wait_until(lambda: time.time() > t_linked + 2.0, 4)
        finally:
            t_end = time.time()
            stop.set()
            for t in threads:
                t.join(5)
        self.assertFalse(any(t.is_alive() for t in threads), "a client hangs")

        hot = sorted((e for e in backend.requests(key="hot") if t_w0 <= e["t"] <= t_end), key=lambda e: e["t"])
        window = t_end - t_w0
        allowed = self.RATE * window + self.BURST
        # Slack: once linked, the restarted gatekeeper starts with an empty memory and admits
        # its clients' requests until the master's first DELAY_UNTIL for hot reaches it - a
        # couple per client; and two gatekeepers may release together at one DELAY_UNTIL
        # instant (the master charges that, but the window may end before it is paid back).
        slack = 2 * self.CLIENTS_PER_PROXY + 2
        via_b_after = [e["t"] for e in hot if e["target"].startswith("/via-b/") and e["t"] > t_killed]
        # What b admitted before it was linked: fail-open, unaccounted, allowed on top.
        unlinked = [t for t in via_b_after if t <= t_linked]
        bound = allowed + slack + len(unlinked)
        measured(f"hot admitted {len(hot)} in {window:.2f}s (rate x time + burst = {allowed:.1f}, bound "
                 f"{bound:.1f}; {lost:g} held by b when it was killed); the restarted gatekeeper (down "
                 f"{t_restarted - t_killed:.2f}s, linked {t_linked - t_restarted:.2f}s after it was ready) "
                 f"admitted {len(unlinked)} before it was linked, {len(via_b_after)} in all")
        self.assertLessEqual(len(hot), bound,
                             f"the limit did not hold across the gatekeeper restart ({len(unlinked)} admitted by the "
                             f"restarted gatekeeper before it was linked); arrivals a/b + s after the "
                             f"window start, b killed at {t_killed - t_w0:.3f}: "
                             + " ".join(f"{e['target'][5]}{e['t'] - t_w0:.3f}" for e in hot))
        # Demand is far above the limit: the configured rate is still delivered (no
        # gatekeeper stuck on stale delays after the restart), but for the slots of the
        # requests b held when it was killed (charged, never used).
        self.assertGreaterEqual(len(hot), 0.8 * (self.RATE * window - lost), f"{lost:g} held by b when killed")
        # The restarted gatekeeper's clients reconnected and were served again.
        b_after = [s for t, name, s, _ in outcomes if name == "b" and t > t_restarted]
        self.assertIn(200, b_after, f"no client of the restarted gatekeeper was served: {b_after[:20]}")
        self.assertTrue(via_b_after, "nothing reached the backend through the restarted gatekeeper")
        self.assertTrue(a.alive() and b.alive())
        # The restarted gatekeeper limits again: from 0.5 s after it was linked, both
        # gatekeepers together stay at the rate. Their own release times (access logs),
        # not a busy backend's, so the window's edge does not move arrivals into it.
        answered = {target for t, _, s, target in outcomes if t > t_linked and s in (200, 503)}

        def logged():
            lg = read_access_log(access_log)
            return answered <= {e["target"] for e in lg} and lg

        log = wait_until(logged, 5, message="a log line for every request answered after the restarted gatekeeper "
                                            "was linked")
        late = [e["t_out"] for e in log if e["target"].startswith("/via-") and e["forwarded"]
                and t_linked + 0.5 < e["t_out"] <= t_end]
        measured(f"from 0.5 s after the restarted gatekeeper was linked: {len(late)} admitted in "
                 f"{t_end - t_linked - 0.5:.2f}s (rate x time {self.RATE * (t_end - t_linked - 0.5):.1f}, bound + 3)")
        self.assertLessEqual(len(late), self.RATE * (t_end - t_linked - 0.5) + 3)


# =============================================================================== 3: backend killed, restarted


class BackendFailureTest(SystemCase):
    def test_backend_killed_and_restarted_502_then_200_without_proxy_restart(self):
        master, backend, (proxy,), _ = self.system(
            {"api": {"rules": [("1000/s", 1000)]}}, [API_ROUTE], upstream_keys={"fail_timeout": "200ms"},
            connect_timeout="500ms")
        pid = proxy.pid
        for i in range(5):  # pooled keep-alive upstream connections exist
            self.assertEqual(fetch(proxy.port, f"/before/{i}", key="k")[0].status, 200)
        # One request in flight at the backend when it dies.
        box = {}
        slow = threading.Thread(target=lambda: box.setdefault("slow", fetch(proxy.port, "/slow?s=8", key="k",
                                                                                timeout=9)))
        slow.start()
        wait_until(lambda: backend.requests(target_prefix="/slow"), 5, message="slow request at the backend")

        backend.kill()
        t_kill = time.monotonic()
        slow.join(9)
        r, _ = box["slow"]
        self.assertEqual(r.status, 502, r)
        # Not left waiting for an answer that cannot come (the backend would have taken 8 s).
        self.assertLess(time.monotonic() - t_kill, 4.0, "the in-flight request got its 502 promptly")
        for i in range(5):
            r, _ = fetch(proxy.port, f"/down/{i}", key="k")
            self.assertEqual(r.status, 502, r)

        backend.start()  # same port
        t_up = time.monotonic()
        wait_until(lambda: fetch(proxy.port, "/probe", key="k")[0].status == 200, 5, interval=0.05,
                   message="200 once the backend is back")
        recovered = time.monotonic() - t_up
        measured(f"first 200 {recovered:.3f}s after the backend was back (fail_timeout 200ms)")
        for i in range(10):
            r, _ = fetch(proxy.port, f"/after/{i}", key="k")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["target"], f"/after/{i}")
        self.assertEqual(len(backend.requests(target_prefix="/after/")), 10)
        self.assertEqual(proxy.pid, pid)
        self.assertTrue(proxy.alive(), "the proxy was not restarted")
        m = proxy.metrics()
        measured("upstream errors " + str({k: metric_sum(m, "smockron_proxy_upstream_errors_total", kind=k)
                                           for k in ("connect", "reset", "timeout", "no_server")}))
        # The in-flight GET fails as a reset, or (retried once on a fresh connection, as
        # an idempotent request may be) as a refused connect; the five later ones as connects.
        self.assertGreaterEqual(metric_sum(m, "smockron_proxy_upstream_errors_total", kind="connect"), 5)
        self.assertGreaterEqual(metric_sum(m, "smockron_proxy_upstream_errors_total", kind="connect")
                                + metric_sum(m, "smockron_proxy_upstream_errors_total", kind="reset"), 6)

    def test_backend_killed_mid_request_non_idempotent_request_is_not_replayed(self):
        # Two servers. A bodiless POST reaches one of them, which dies while handling it:
        # the proxy cannot know whether it took effect, so it must answer 502 and never
        # send it again to the other server (RFC 9110 9.2.2: a proxy MUST NOT
        # automatically retry non-idempotent requests).
        all_domains = {"api": {"rules": [("1000/s", 1000)]}, WARM_DOMAIN: {"rules": [("1/h", 1)]}}
        master = self.start_master(all_domains)
        b1, b2 = self.start_backend(), self.start_backend()
        proxy = self.start_proxy({"app": {"servers": [f"{HOST}:{b1.port}", f"{HOST}:{b2.port}"],
                                          "fail_timeout": "200ms"}}, [WARM_ROUTE, API_ROUTE],
                                 accounting=[master.accounting], control=[master.control], threads=1)
        for i in range(4):  # pooled keep-alive connections to both servers
            self.assertEqual(fetch(proxy.port, f"/before/{i}", key="k")[0].status, 200)
        box = {}
        post = threading.Thread(target=lambda: box.setdefault(
            "r", fetch(proxy.port, "/slow?s=4", method="POST", key="k", timeout=8)))
        post.start()
        victim = wait_until(lambda: next((b for b in (b1, b2) if b.requests(target_prefix="/slow")), None), 5,
                            message="the POST at a backend")
        other = b2 if victim is b1 else b1
        victim.kill()
        post.join(8)
        r, elapsed = box["r"]
        replayed = [(e["method"], e["target"]) for e in other.requests(target_prefix="/slow")]
        measured(f"POST in flight when its backend died: {r.status} after {elapsed:.2f}s; "
                 f"the other backend received {replayed}")
        self.assertEqual(replayed, [], "the proxy replayed a non-idempotent request on another server")
        self.assertEqual(r.status, 502, r)


# =============================================================================== 4: held client disconnects


class HeldDisconnectTest(SystemCase):
    INTERVAL = 2.0  # rule 1/2s, burst 1: room for the steps between A's hold and its reserved time

    def test_held_client_disconnect_frees_its_place_and_is_never_forwarded(self):
        master, backend, (proxy,), tap = self.system({"api": {"rules": [("1/2s", 1)]}}, [API_ROUTE], tap=True,
                                                     max_delay="5s", max_held=1)
        gone0 = proxy.metric(GONE) or 0
        ctl0 = proxy.ctl()
        self.assertEqual(fetch(proxy.port, "/first", key="dave")[0].status, 200)
        self.wait_ctl(proxy, ctl0)

        # A is held (the only held place: max_held = 1), then goes away.
        (a,) = self.hold_requests(proxy, "dave", 1, "/gone/")
        (reserved_a,) = wait_until(lambda: tap.reserved("dave"), 5, message="A's DELAYED")
        a.close()
        proxy.wait_metric(GONE, predicate=lambda v: v == gone0 + 1, timeout=5)
        proxy.wait_metric(HELD, predicate=lambda v: v == 0, timeout=5)
        # Noticed at once, not when A's time came.
        self.assertLess(time.time(), reserved_a - 0.3, "A's departure noticed well before its time")

        # B, same identifier, arrives after A left: it takes the freed place (held, not
        # refused for lack of held places, and released at A's time, not one interval later).
        t_b = time.time()
        r, _ = fetch(proxy.port, "/next", key="dave", timeout=self.INTERVAL + 5)
        self.assertEqual(r.status, 200, r)
        t_b_arrival = backend.requests(target_prefix="/next")[0]["t"]
        measured(f"B sent {reserved_a - t_b:.3f}s before A's reserved time, forwarded at A's reserved time "
                 f"{t_b_arrival - reserved_a:+.3f}s (interval {self.INTERVAL}s)")
        self.assertEqual(proxy.metric(HELD), 0)
        self.assertEqual(proxy.metric("smockron_proxy_rejects_total", {"reason": "held_full"}) or 0, 0,
                         "A's held place was not given back (max_held = 1)")
        self.assertGreaterEqual(t_b_arrival, reserved_a - 0.03, "B was held until the reserved place")
        self.assertLess(t_b_arrival, reserved_a + 0.5 * self.INTERVAL,
                        "B was pushed behind the dropped request instead of taking its place")

        # Past A's release time: A's request never reaches the backend.
        wait_until(lambda: time.time() > reserved_a + 0.5, 5)
        self.assertEqual(backend.requests(target_prefix="/gone/"), [], "A's request was forwarded")
        self.assertEqual([e["target"] for e in backend.requests(key="dave")], ["/first", "/next"])


# =============================================================================== accounting order


class AccountingOrderTest(SystemCase):
    """Found by the tests above: a proxy publishes accounting from one ZeroMQ socket per
    worker thread, so the DELAYED messages of one identifier's held requests (reserved
    R1, R2, R3, one interval apart) can reach the master as R1, R3, R2. Each reserved
    slot was free; the master must charge each at its own time, as it does in order."""

    def test_delayed_accounting_out_of_order_is_charged_at_its_own_time(self):
        master = self.start_master({"api": {"rules": [("2/s", 1)]}})  # interval 500 ms
        gk = self.gatekeeper(master, ["api"])
        base = now_ms() + 2000  # ahead of the master's clock: the history alone decides
        gk.accepted("api", "x", base)
        self.assertEqual(gk.expect(2).next_ms, base + 500)
        nexts = []
        for reserved in (500, 1500, 1000):  # R1, R3, R2
            gk.delayed("api", "x", base, base + reserved)
            nexts.append(gk.expect(2).next_ms - base)
        self.assertEqual(nexts[-1], 2000, f"DELAY_UNTIL after DELAYED R1, R3, R2: base + {nexts} ms "
                                          "(R2's free slot charged one interval later)")


if __name__ == "__main__":
    unittest.main()
