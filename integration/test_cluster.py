"""Black-box integration tests for Smockron's scale-out by configuration
(DESIGN.md, "Scale-out"): several real gatekeepers (smockron-proxy) connected
to several real masters (smockron-master), no router, no failover step.

- Redundancy: two masters own the same domain; both proxies publish their
  accounting to both and subscribe to both. A hot identifier is driven well
  over its limit through both proxies and one master is SIGKILLed mid-run:
  what the proxies let through of that identifier (their access logs' times,
  not a busy backend's) stays within rate x elapsed + burst (+ a small
  slack) before, around and after the kill, and the
  surviving master keeps the limit enforced (held requests and 503s keep
  coming; no fail-open gap).
- Sharding: master A owns domain "a", master B owns domain "b"; the proxies
  route /a/ and /b/ to them and connect to both masters. Both limits hold,
  and each master receives exactly its own domain's accounting messages (the
  other domain's never even arrive: ZeroMQ filters them on the proxy's PUB).

Every process runs on fresh 127.0.0.1 ports; every wait polls against a
deadline (the only sleeps are the load phases themselves). Each test takes
about 8 s. The figures (admitted vs rate x elapsed + burst per phase) are
printed to stderr.

Run: cd integration && python3 -m unittest -v test_cluster
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.access_log import access_log_keys, read_access_log  # noqa: E402
from lib.daemons import MasterProcess, ProxyProcess  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.metrics import metric, metric_sum, parse_metrics  # noqa: E402
from lib.ports import HOST  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import WaitTimeout, wait_until  # noqa: E402

ACC = "smockron_master_accounting_messages_total"
M_CTL = "smockron_master_control_messages_total"
UNKNOWN = "smockron_master_unknown_domain_total"
P_REQ = "smockron_proxy_requests_total"


def warm_route(domain: str) -> dict:
    """A route used only to prove the ZeroMQ links are up (see ClusterCase.prime_links)."""
    return {"path": f"/__{domain}/", "domain": domain, "upstream": "app", "identify": ["header:X-Warm"]}


WARM_RULES = {"rules": [("1/h", 1)]}  # every fresh key's first request yields a DELAY_UNTIL


# =============================================================================== load generator


class Load:
    """Client threads that each send one request at a time (fresh connection,
    header X-API-Key) through a proxy until stopped. A 503 is followed by a
    short pause so that rejected clients do not spin; a held request simply
    takes its time. Every answer is recorded with wall-clock send/finish times."""

    def __init__(self, targets: list[tuple[int, str]], key: str, threads_per_target: int,
                 pause_after_503: float = 0.05, timeout: float = 5.0):
        self.targets = targets
        self.key = key
        self.per_target = threads_per_target
        self.pause = pause_after_503
        self.timeout = timeout
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.results: list[tuple[str, float, float, object]] = []  # (path prefix, sent, done, status or exc)
        self.threads: list[threading.Thread] = []

    def _run(self, port: int, prefix: str, tid: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            sent = time.time()
            try:
                r, _ = fetch(port, f"{prefix}{tid}-{n}", key=self.key, timeout=self.timeout)
                status = r.status
            except Exception as e:  # noqa: BLE001 - reported by the test
                status = e
            done = time.time()
            with self.lock:
                self.results.append((prefix, sent, done, status))
            if status != 200:
                self.stop_event.wait(self.pause)

    def start(self) -> "Load":
        for port, prefix in self.targets:
            for i in range(self.per_target):
                t = threading.Thread(target=self._run, args=(port, prefix, i), daemon=True)
                t.start()
                self.threads.append(t)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in self.threads if t.is_alive()]
        if alive:
            raise AssertionError(f"{len(alive)} load threads still running {timeout}s after stop")

    def snapshot(self, prefix: str | None = None) -> list[tuple[str, float, float, object]]:
        with self.lock:
            return [r for r in self.results if prefix is None or r[0] == prefix]


def count_in(times: list[float], a: float, b: float) -> int:
    return sum(1 for t in times if a <= t < b)


# =============================================================================== base class


class ClusterCase(DaemonTestCase):
    def start_named_master(self, name: str, domains: dict) -> MasterProcess:
        """A master whose config file is named after it (two masters share the temp dir)."""
        return self.start_master(domains, config_name=f"master-{name}.toml", probe=False)

    def start_named_proxy(self, name: str, backend, routes: list, masters: list[MasterProcess],
                          **proxy_keys) -> ProxyProcess:
        """A proxy (one worker thread: one accounting PUB, so one priming request proves
        its links) whose accounting and control lists name every master, with a JSON
        access log (its path in .access_log_path)."""
        path = os.path.join(self.tmp, f"access-{name}.log")
        p = self.start_proxy({"app": {"servers": [f"{HOST}:{backend.port}"]}}, routes,
                             [m.accounting for m in masters], [m.control for m in masters],
                             config_name=f"proxy-{name}.toml", threads=1, **access_log_keys(path), **proxy_keys)
        p.access_log_path = path
        return p

    def logged(self, proxies: list[ProxyProcess], prefixes: tuple[str, ...], results: list) -> list[dict]:
        """The proxies' access log entries of the load's requests (targets under `prefixes`),
        once there is one for every request the load got an answer to. Their times are the
        proxies' own: when a request reached a proxy ("t_head"), when it was let through to
        the backend ("t_out"); a busy backend or test process cannot move them."""
        answered = sum(1 for r in results if r[0] in prefixes and isinstance(r[3], int))

        def entries():
            log = [e for e in read_access_log(*(p.access_log_path for p in proxies))
                   if e["target"].startswith(prefixes)]
            return log if len(log) >= answered else None

        return wait_until(entries, 10, message=f"the access log lines of {answered} answered requests")

    def prime_links(self, proxy: ProxyProcess, warm: list[tuple[str, list[MasterProcess]]], timeout: float = 10.0) -> None:
        """For each (warm domain, masters owning it): sends requests with fresh X-Warm keys
        until one of them was counted by every owning master AND the proxy received one
        DELAY_UNTIL from each of them. Then the proxy's accounting PUB reaches those
        masters (their subscriptions arrived) and its control SUB hears them."""
        n = 0
        for domain, owners in warm:
            deadline = time.monotonic() + timeout
            while True:
                if time.monotonic() >= deadline:
                    raise WaitTimeout(f"ZeroMQ links for {domain} not up after {timeout}s (proxy {proxy.port})")
                n += 1
                ctl0 = proxy.ctl()
                acc0 = [m.metric(ACC, {"domain": domain, "status": "ACCEPTED"}) or 0 for m in owners]
                r, _ = fetch(proxy.port, f"/__{domain}/{n}", headers=[("X-Warm", f"warm-{proxy.port}-{n}")])
                self.assertEqual(r.status, 200, r)

                def linked():
                    acc = [m.metric(ACC, {"domain": domain, "status": "ACCEPTED"}) or 0 for m in owners]
                    return all(a > b for a, b in zip(acc, acc0)) and proxy.ctl() >= ctl0 + len(owners)

                try:
                    wait_until(linked, min(0.1 * n, 0.5))
                    break
                except WaitTimeout:
                    continue
        time.sleep(0.05)  # let a late reply to an earlier probe land before the test counts messages

    def load(self, *args, **kwargs) -> Load:
        ld = Load(*args, **kwargs)
        self.addCleanup(lambda: (ld.stop_event.set(), [t.join(10) for t in ld.threads]))
        return ld.start()


# =============================================================================== redundancy


class RedundancyTest(ClusterCase):
    RATE = 10.0         # requests per second for the hot identifier
    BURST = 5
    MAX_DELAY = 0.5     # s; longer waits are refused with 503
    STARTUP = 1.0       # s of load on the fresh identifier before the measured phases
    BEFORE = 3.0        # s of measured load before the kill
    AFTER = 4.0         # s of load after the kill
    THREADS = 6         # client threads per proxy (offered load ~100 req/s, 10x the limit)
    STEADY_SLACK = 4    # requests over rate x elapsed in a window where the identifier stays saturated

    def slack(self, seconds: float) -> float:
        """Allowed excess over rate x elapsed + burst: release-timer jitter of the two
        gatekeepers and the one-hop lag of the master's view (a few requests)."""
        return 3 + 0.1 * self.RATE * seconds

    def run_kill(self, victim: str) -> None:
        domains = {"api": {"rules": [(f"{int(self.RATE)}/s", self.BURST)]}, "zzwarm": WARM_RULES}
        masters = {"A": self.start_named_master("a", domains), "B": self.start_named_master("b", domains)}
        ma, mb = masters["A"], masters["B"]
        backend = self.start_backend()
        routes = [warm_route("zzwarm"), {"path": "/", "domain": "api", "upstream": "app",
                                         "identify": ["header:X-API-Key"]}]
        proxies = [self.start_named_proxy(f"p{i}", backend, routes, [ma, mb],
                                          max_delay=f"{int(self.MAX_DELAY * 1000)}ms") for i in (1, 2)]
        for p in proxies:
            self.wait_connected(p, "2/2")
            self.prime_links(p, [("zzwarm", [ma, mb])])

        other = "B" if victim == "A" else "A"
        killed, survivor = masters[victim], masters[other]
        ctl_start = {k: m.metric(M_CTL) for k, m in masters.items()}

        t_load = time.time()
        load = self.load([(p.port, f"/hot/p{i}-") for i, p in enumerate(proxies, 1)], "hot", self.THREADS)
        t_meas = t_load + self.STARTUP
        tk = t_meas + self.BEFORE
        time.sleep(max(0.0, tk - time.time()))  # the load runs meanwhile; what it got is asserted below
        ctl_before_kill = {k: m.metric(M_CTL) for k, m in masters.items()}
        prx_ctl_kill = [p.ctl() for p in proxies]
        tk = time.time()
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(5)
        for p in proxies:
            self.wait_connected(p, "1/2", timeout=5)
        time.sleep(max(0.0, tk + self.AFTER - time.time()))
        t_stop = time.time()
        load.stop()
        t_end = time.time()  # every held request has been answered

        results = load.snapshot()
        errors = [r for r in results if not isinstance(r[3], int)]
        self.assertEqual(errors, [], "every client request gets an answer")
        ok = [r for r in results if r[3] == 200]
        self.assertEqual(len(backend.requests(key="hot")), len(ok), "exactly the 200s reached the backend")
        log = self.logged(proxies, ("/hot/",), results)
        # Admitted when the proxies let them through (not when a busy backend noted them).
        arrivals = sorted(e["t_out"] for e in log if e["forwarded"])
        self.assertEqual(len(arrivals), len(ok), "the proxies forwarded exactly the 200s")

        # Both masters were limiting before the kill (so the kill removes a working master).
        for k, m in masters.items():
            self.assertGreater(ctl_before_kill[k], ctl_start[k], f"master {k} published DELAY_UNTIL before the kill")

        r, b = self.RATE, self.BURST
        clients = 2 * self.THREADS
        # (name, from, to, saturated). A saturated window starts after the burst was spent and
        # the identifier never goes idle in it, so no burst can be admitted in it again: a
        # fail-open gap at the kill shows there long before it would exceed a whole burst.
        # The start-up window is the exception: until the first DELAY_UNTIL reaches them (one
        # accounting -> master -> control round trip), the gatekeepers accept a fresh
        # identifier's concurrent requests, and both then pace their held requests from the
        # same DELAY_UNTIL; the master's slot accounting repays it afterwards.
        phases = [
            ("start-up (fresh identifier)", t_load, t_meas, False),
            ("before kill", t_meas, tk, True),
            ("around kill (-1 s, +2 s)", tk - 1.0, tk + 2.0, True),
            ("after kill", tk, t_stop, True),
            ("after kill, incl. drain", tk, t_end, True),
            ("after start-up, to the end", t_meas, t_end, True),
            ("whole run", t_load, t_end, False),
        ]
        lines = [f"redundancy, SIGKILL master {victim}: {r:g}/s burst {b}, 2 proxies x {self.THREADS} clients, "
                 f"max_delay {self.MAX_DELAY:g}s"]
        failures = []
        for name, a, z, saturated in phases:
            got = count_in(arrivals, a, z)
            ideal = r * (z - a) + b
            bound = ideal + self.slack(z - a)
            if a <= t_load:
                bound += clients  # each client's first request may race the first DELAY_UNTIL
            sent = [e for e in log if a <= e["t_head"] < z]
            n503 = sum(1 for e in sent if e["status"] == 503)
            held = sum(1 for e in sent if e["decision"] == "delayed" and e["forwarded"])
            steady = f"steady bound {r * (z - a) + self.STEADY_SLACK:5.1f}" if saturated else ""
            lines.append(f"  {name:28s} {z - a:5.2f}s  admitted {got:3d}  rate*t+burst {ideal:5.1f}  "
                         f"bound {bound:5.1f}  {steady:18s}  | sent {len(sent):4d}  held {held:3d}  503 {n503:4d}")
            if got > bound:
                failures.append(f"{name}: admitted {got} > {bound:.1f}")
            if saturated and got > r * (z - a) + self.STEADY_SLACK:
                failures.append(f"{name}: admitted {got} > rate x {z - a:.2f}s + {self.STEADY_SLACK} while saturated")
        sys.stderr.write("\n" + "\n".join(lines) + "\n")
        self.assertEqual(failures, [], "\n".join(lines))

        # Not fail-open after the kill: the surviving master keeps sending DELAY_UNTIL, the
        # proxies keep receiving them, and clients keep being held and refused.
        after = [e for e in log if tk + 0.5 <= e["t_head"] < t_stop]
        self.assertGreater(sum(1 for e in after if e["status"] == 503), 10, "503s keep coming after the kill")
        self.assertGreater(sum(1 for e in after if e["decision"] == "delayed" and e["forwarded"]), 5,
                           "requests keep being held after the kill")
        self.assertGreater(survivor.metric(M_CTL), ctl_before_kill[other] + 10, "the surviving master keeps publishing")
        for p, c in zip(proxies, prx_ctl_kill):
            self.assertGreater(p.ctl(), c + 10, f"proxy {p.port} keeps receiving DELAY_UNTIL")
        # And the surviving master does not over-restrict: the hot identifier always has
        # requests waiting, so it is admitted at about the configured rate.
        self.assertGreaterEqual(count_in(arrivals, tk, t_stop), 0.6 * r * (t_stop - tk),
                                "the surviving master still admits at the rate")
        self.assertTrue(survivor.alive())

    def test_kill_master_a_limit_holds(self):
        self.run_kill("A")

    def test_kill_master_b_limit_holds(self):
        self.run_kill("B")


# =============================================================================== sharding


class ShardingTest(ClusterCase):
    RATES = {"a": (4.0, 2), "b": (8.0, 4)}  # different rules, so each master's own rules are seen
    STARTUP = 1.0   # s on the fresh identifier, not measured (see RedundancyTest)
    SECONDS = 4.0   # s measured
    THREADS = 4     # client threads per proxy and domain

    def test_each_master_enforces_and_sees_only_its_domain(self):
        ra, ba = self.RATES["a"]
        rb, bb = self.RATES["b"]
        ma = self.start_named_master("a", {"a": {"rules": [(f"{int(ra)}/s", ba)]}, "zzwarma": WARM_RULES})
        mb = self.start_named_master("b", {"b": {"rules": [(f"{int(rb)}/s", bb)]}, "zzwarmb": WARM_RULES})
        backend = self.start_backend()
        routes = [warm_route("zzwarma"), warm_route("zzwarmb"),
                  {"path": "/a/", "domain": "a", "upstream": "app", "identify": ["header:X-API-Key"]},
                  {"path": "/b/", "domain": "b", "upstream": "app", "identify": ["header:X-API-Key"]}]
        proxies = [self.start_named_proxy(f"p{i}", backend, routes, [ma, mb], max_delay="500ms") for i in (1, 2)]
        for p in proxies:
            self.wait_connected(p, "2/2")
            self.prime_links(p, [("zzwarma", [ma]), ("zzwarmb", [mb])])

        # The same identifier in both domains, through both proxies: two independent limits.
        targets = [(p.port, prefix) for p in proxies for prefix in ("/a/", "/b/")]
        t_load = time.time()
        load = self.load(targets, "k", self.THREADS)
        t_meas = t_load + self.STARTUP
        time.sleep(max(0.0, t_meas + self.SECONDS - time.time()))
        t_stop = time.time()
        load.stop()
        t_end = time.time()

        results = load.snapshot()
        self.assertEqual([r for r in results if not isinstance(r[3], int)], [], "every request gets an answer")
        log = self.logged(proxies, ("/a/", "/b/"), results)
        lines = [f"sharding: a {ra:g}/s burst {ba} on master A, b {rb:g}/s burst {bb} on master B, "
                 f"2 proxies x 2 domains x {self.THREADS} clients"]
        failures = []
        for d, (rate, burst) in self.RATES.items():
            n200 = sum(1 for x in results if x[0] == f"/{d}/" and x[3] == 200)
            self.assertEqual(len(backend.requests(key="k", target_prefix=f"/{d}/")), n200, d)
            sent = [e for e in log if e["target"].startswith(f"/{d}/")]
            # Admitted when the proxies let them through (not when a busy backend noted them).
            arrivals = sorted(e["t_out"] for e in sent if e["forwarded"])
            self.assertEqual(len(arrivals), n200, d)
            for name, a, z, extra in (("start-up", t_load, t_meas, 2 * self.THREADS), ("measured", t_meas, t_end, 0)):
                got = count_in(arrivals, a, z)
                ideal = rate * (z - a) + burst
                bound = ideal + 3 + 0.1 * rate * (z - a) + extra
                w = [e for e in sent if a <= e["t_head"] < z]
                n503 = sum(1 for e in w if e["status"] == 503)
                held = sum(1 for e in w if e["decision"] == "delayed" and e["forwarded"])
                lines.append(f"  domain {d} {name:9s} {z - a:5.2f}s  admitted {got:3d}  rate*t+burst {ideal:5.1f}  "
                             f"bound {bound:5.1f}  | sent {len(w):4d}  held {held:3d}  503 {n503:4d}")
                if got > bound:
                    failures.append(f"domain {d} {name}: admitted {got} > {bound:.1f}")
            # Limited by its own rule (not the other domain's, not over-restricted), and actively:
            if count_in(arrivals, t_meas, t_stop) < 0.6 * rate * (t_stop - t_meas):
                failures.append(f"domain {d}: admitted less than 0.6 x its rate")
            late = [e for e in sent if e["t_head"] >= t_meas]
            if (sum(1 for e in late if e["status"] == 503) <= 10
                    or sum(1 for e in late if e["decision"] == "delayed" and e["forwarded"]) <= 3):
                failures.append(f"domain {d}: too few refusals or held requests")
        sys.stderr.write("\n" + "\n".join(lines) + "\n")
        self.assertEqual(failures, [], "\n".join(lines))

        # Each master received exactly the accounting of its own domains, from both proxies;
        # the other master's domains never arrived (not even as "unknown domain").
        own = {"A": (ma, ["a", "zzwarma"]), "B": (mb, ["b", "zzwarmb"])}
        foreign = {"A": ["b", "zzwarmb"], "B": ["a", "zzwarma"]}

        def proxy_total(domain):
            return sum(metric_sum(p.metrics(), P_REQ, domain=domain) for p in proxies)

        for name, (m, (domain, warm)) in own.items():
            # Proxies count a request when they publish its accounting; wait only for delivery.
            # (Warm-up requests sent before the links were up are lost by design: only > 0.)
            want = proxy_total(domain)
            self.assertGreater(want, 0, domain)
            wait_until(lambda: metric_sum(m.metrics(), ACC, domain=domain) == want, 5,
                       message=f"master {name} counted every {domain} message ({want})")
            self.assertGreater(metric_sum(m.metrics(), ACC, domain=warm), 0, warm)
            text = m.metrics()
            self.assertEqual(metric(text, UNKNOWN), 0, f"master {name}: foreign domains never arrive")
            self.assertEqual(sum(v for n, _, v in parse_metrics(text) if n.startswith("smockron_master_decode_errors")),
                             0, f"master {name}: no malformed messages")
            for d in foreign[name]:
                self.assertEqual(metric_sum(text, ACC, domain=d), 0, f"master {name} saw domain {d}")
            self.assertGreater(metric(text, M_CTL), 0, f"master {name} published DELAY_UNTIL")
        for p in proxies:
            self.assertEqual(p.metric("smockron_proxy_accounting_dropped_total"), 0)


if __name__ == "__main__":
    unittest.main()
