"""What operators expect from a rate-limiting proxy (issue 16): the status of
limit rejections, per-route max_delay / max_held, shadow routes, exempt
clients and routes without a domain.

Run: cd integration && python3 -m unittest -v test_operator
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import fetch  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402

REQUESTS = "smockron_proxy_requests_total"


class RoutePolicyTest(DaemonTestCase):
    """Domain "api": 1 request per minute per X-API-Key, burst 1: a client stays over its
    limit for far longer than any test's steps take, on any machine."""

    def stack(self, routes):
        return self.gate_stack({"api": {"rules": [("1/min", 1)]}}, routes, max_delay="5s")

    def first_then_known(self, proxy, path: str, key: str) -> None:
        """One request of `key`, then wait until the master's DELAY_UNTIL for it is here."""
        applied0 = proxy.metric("smockron_proxy_control_messages_total") or 0
        self.assertEqual(fetch(proxy.port, path, key=key)[0].status, 200)
        proxy.wait_metric("smockron_proxy_control_messages_total", predicate=lambda v: v > applied0, timeout=10)

    def test_429_route_and_a_full_queue_is_503_whatever_the_status(self):
        _, backend, proxy = self.stack([
            {"path": "/limited", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "status": 429, "max_delay": "200ms", "ratelimit_headers": True, "explain": True},
            {"path": "/full", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "status": 429, "max_held": 0, "max_delay": "90s"},
        ])
        proxy.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v > 0, timeout=10)
        applied0 = proxy.metric("smockron_proxy_control_messages_total") or 0
        first, _ = fetch(proxy.port, "/limited/1", key="kate")
        self.assertEqual(first.status, 200)
        self.assertEqual(first.headers.get("ratelimit"), '"api";r=0;t=60', "with ratelimit_headers, on every response")
        self.assertEqual(first.headers.get("smockron-decision"), "accepted")
        proxy.wait_metric("smockron_proxy_control_messages_total", predicate=lambda v: v > applied0, timeout=10)
        r, _ = fetch(proxy.port, "/limited/2", key="kate")
        self.assertEqual((r.status, r.reason), (429, "Too Many Requests"), r)
        retry_after = int(r.headers.get("retry-after", "0"))
        self.assertGreaterEqual(retry_after, 1)
        # draft-ietf-httpapi-ratelimit-headers-10: the domain's rule, and nothing left until the retry.
        self.assertEqual(r.headers.get("ratelimit-policy"), '"api";q=1;w=60')
        self.assertEqual(r.headers.get("ratelimit"), f'"api";r=0;t={retry_after}')
        self.assertEqual(r.headers.get("smockron-decision"), "rejected;reason=delay_too_long")
        # Within the route's max_delay (90 s, the wait is under 60 s), but the route holds
        # none: the queue is full, 503.
        r, _ = fetch(proxy.port, "/full/1", key="kate")
        self.assertEqual(r.status, 503, r)
        self.assertGreaterEqual(int(r.headers.get("retry-after", "0")), 1)
        m = proxy.metrics()
        self.assertEqual(metric(m, "smockron_proxy_rejects_total", {"reason": "delay_too_long"}), 1)
        self.assertEqual(metric(m, "smockron_proxy_rejects_total", {"reason": "held_full"}), 1)
        self.assertEqual([e["target"] for e in backend.requests(key="kate")], ["/limited/1"])

    def test_a_shadow_route_never_holds_or_rejects_but_counts(self):
        _, backend, proxy = self.stack([
            {"path": "/shadow", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "mode": "shadow", "max_delay": "200ms"},
        ])
        self.first_then_known(proxy, "/shadow/0", "sam")
        for i in range(1, 5):
            r, elapsed = fetch(proxy.port, f"/shadow/{i}", key="sam")
            self.assertEqual(r.status, 200, r)
            self.assertLess(elapsed, 1.0, "never held")
        m = proxy.metrics()
        self.assertEqual(metric(m, REQUESTS, {"domain": "api", "decision": "accepted"}), 5)
        self.assertGreaterEqual(metric(m, "smockron_proxy_shadow_decisions_total",
                                       {"domain": "api", "decision": "rejected"}), 1)
        self.assertEqual(len(backend.requests(key="sam")), 5)

    def test_exempt_clients_and_routes_without_a_domain_pass_unlimited(self):
        _, backend, proxy = self.stack([
            {"path": "/healthz", "upstream": "app"},
            {"path": "/internal", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
             "exempt": ["127.0.0.0/8"]},
        ])
        for i in range(4):
            self.assertEqual(fetch(proxy.port, "/healthz", key="ivy")[0].status, 200)
            self.assertEqual(fetch(proxy.port, f"/internal/{i}", key="ivy")[0].status, 200)
        m = proxy.metrics()
        self.assertEqual(metric(m, REQUESTS, {"domain": "", "decision": "exempt"}), 4)
        self.assertEqual(metric(m, REQUESTS, {"domain": "api", "decision": "exempt"}), 4)
        self.assertEqual(len(backend.requests(key="ivy")), 8)



class AccessLogTest(DaemonTestCase):
    def test_json_lines_with_the_real_status_client_and_bytes_reopened_on_sigusr1(self):
        path = os.path.join(self.tmp, "access.log")
        _, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/m", 1)]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"], "status": 429,
              "max_delay": "100ms"}],
            access_log=True, access_log_format="json", access_log_path=path, trusted_proxies=["127.0.0.1/32"])

        def lines(p=path):
            with open(p) as f:
                return [json.loads(line) for line in f if line.strip()]

        def for_key(key, p=path):
            return [e for e in lines(p) if e["identifier"] == key]

        applied0 = proxy.metric("smockron_proxy_control_messages_total") or 0
        r, _ = fetch(proxy.port, "/echo?x=1", method="POST", body=b"12345", key="lena",
                     headers=[("X-Forwarded-For", "198.51.100.9")])
        self.assertEqual(r.status, 200, r)
        proxy.wait_metric("smockron_proxy_control_messages_total", predicate=lambda v: v > applied0, timeout=10)
        self.assertEqual(fetch(proxy.port, "/again", key="lena")[0].status, 429)
        got = wait_until(lambda: for_key("lena") if len(for_key("lena")) >= 2 else None, 5, message="two lines")
        first, limited = got[0], got[1]
        self.assertEqual((first["method"], first["target"], first["status"]), ("POST", "/echo?x=1", 200))
        self.assertEqual((first["client"], first["peer"]), ("198.51.100.9", "127.0.0.1"))
        self.assertEqual(first["bytes_in"], 5)
        self.assertGreater(first["bytes_out"], 0)
        self.assertEqual(first["upstream"], f"127.0.0.1:{backend.port}")
        self.assertEqual((first["decision"], first["domain"]), ("accepted", "api"))
        self.assertEqual((limited["status"], limited["decision"], limited["upstream"]), (429, "rejected", ""))
        self.assertGreaterEqual(limited["duration_ms"], 0)
        # Log rotation: the file is moved, SIGUSR1, and new lines go to a new file.
        os.rename(path, path + ".1")
        proxy.signal(signal.SIGUSR1)
        wait_until(lambda: "reopening the access log" in proxy.log(), 5, message="SIGUSR1 handled")
        self.assertEqual(fetch(proxy.port, "/after", key="mia")[0].status, 200)
        wait_until(lambda: os.path.exists(path) and for_key("mia"), 5, message="a line in the new file")
        self.assertEqual(for_key("mia", path + ".1"), [])



METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_exposition(text: str) -> dict:
    """A strict reader of the Prometheus text format 0.0.4: raises AssertionError on
    anything a scraper could misread. Returns {family: (type, [(name, labels, value)])}."""
    families: dict = {}
    current = None
    seen_series = set()
    assert text.endswith("\n"), "the exposition ends with a newline"
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n}: {line!r}"
        assert line and line == line.strip(), where
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert METRIC_NAME.fullmatch(name), where
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert METRIC_NAME.fullmatch(name) and kind in ("counter", "gauge", "histogram", "summary", "untyped"), where
            assert name not in families, f"{where}: a family is declared once"
            families[name] = (kind, [])
            current = name
            continue
        assert not line.startswith("#"), where
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)", line)
        assert m, where
        name, labels_text, value = m.group(1), m.group(2) or "", m.group(3)
        assert current is not None, f"{where}: a sample before any TYPE"
        kind = families[current][0]
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        assert any(name == current + s for s in suffixes), f"{where}: not in family {current} (families are contiguous)"
        labels = {}
        if labels_text:
            body = labels_text[1:-1]
            pos = 0
            while pos < len(body):
                lm = LABEL.match(body, pos)
                assert lm, f"{where}: bad label at {pos}"
                assert lm.group(1) not in labels, f"{where}: repeated label"
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
                if pos < len(body):
                    assert body[pos] == ",", where
                    pos += 1
        v = float(value)
        assert not math.isnan(v), where
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen_series, f"{where}: duplicate series"
        seen_series.add(key)
        families[current][1].append((name, labels, v))
    for name, (kind, samples) in families.items():
        assert samples, f"{name}: declared without samples"
        if kind == "counter":
            assert name.endswith("_total"), f"{name}: a counter's name ends in _total"
            assert all(v >= 0 for _, _, v in samples), name
        if kind == "histogram":
            groups: dict = {}
            for sample_name, labels, v in samples:
                rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
                groups.setdefault(rest, {"buckets": [], "count": None, "sum": None})
                g = groups[rest]
                if sample_name.endswith("_bucket"):
                    g["buckets"].append((float(labels["le"]), v))
                elif sample_name.endswith("_count"):
                    g["count"] = v
                else:
                    g["sum"] = v
            for rest, g in groups.items():
                bounds = [b for b, _ in g["buckets"]]
                assert bounds == sorted(bounds) and bounds[-1] == math.inf, f"{name}{rest}: le ascending to +Inf"
                counts = [c for _, c in g["buckets"]]
                assert counts == sorted(counts), f"{name}{rest}: cumulative buckets"
                assert g["count"] == counts[-1] and g["sum"] is not None, f"{name}{rest}: _count is the +Inf bucket"
    return families


class MetricsFormatTest(DaemonTestCase):
    def test_both_daemons_expose_valid_prometheus_text(self):
        master, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/m", 1)]}},
            [{"path": "/", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
              "max_delay": "100ms"}])
        for key in ("a", "a", "b", 'q"uote\\'):
            fetch(proxy.port, "/x", key=key)
        proxy_families = parse_exposition(self.scrape(proxy.admin_port))
        master_families = parse_exposition(self.scrape(master.admin_port))
        for families, daemon in ((proxy_families, "proxy"), (master_families, "master")):
            kind, samples = families["smockron_build_info"]
            self.assertEqual(kind, "gauge")
            self.assertEqual([(s[1]["daemon"], s[2]) for s in samples], [(daemon, 1.0)])
        kind, samples = proxy_families["smockron_proxy_upstream_responses_total"]
        self.assertEqual(kind, "counter")
        ok = [v for _, labels, v in samples if labels == {"upstream": "app", "code": "2xx"}]
        self.assertGreaterEqual(ok[0], 2)
        kind, samples = proxy_families["smockron_proxy_upstream_response_seconds"]
        self.assertEqual(kind, "histogram")
        self.assertIn("smockron_proxy_control_dropped_updates_total", proxy_families)

    def test_the_reader_is_strict(self):
        good = "# TYPE x_total counter\nx_total{a=\"1\"} 2\n"
        parse_exposition(good)
        for bad in ("# TYPE x counter\nx 1\n",                                   # a counter without _total
                    good + "x_total{a=\"1\"} 3\n",                                # a duplicate series
                    "x_total 1\n",                                               # no TYPE
                    "# TYPE x_total counter\nx_total{a=1} 2\n",                  # unquoted label value
                    "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
                    "# TYPE g gauge\ng 1",                                       # no final newline
                    "# TYPE g gauge\n# TYPE h gauge\ng 1\nh 1\n"):            # samples outside their family
            with self.assertRaises(AssertionError, msg=bad):
                parse_exposition(bad)

    def scrape(self, port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()



class IntrospectionTest(DaemonTestCase):
    """"Why is this client limited?": the master's /status/DOMAIN/IDENTIFIER."""

    def get(self, port: int, path: str):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def test_an_identifiers_rules_uses_and_throttle(self):
        master = self.start_master({"api": {"rules": [("1/m", 1), ("100/h", 10)]}})
        gk = self.gatekeeper(master, ["api"])
        now_ms = int(time.time() * 1000)
        gk.accepted("api", "2001:db8::/64", now_ms)
        control = gk.expect()  # its DELAY_UNTIL: the master has applied it
        status, body = self.get(master.admin_port, "/status/api/2001%3Adb8%3A%3A%2F64")
        self.assertEqual(status, 200, body)
        doc = json.loads(body)
        self.assertEqual((doc["domain"], doc["identifier"], doc["algorithm"]), ("api", "2001:db8::/64", "sliding-log"))
        # Each rule, and the units its window holds now (the one use).
        self.assertEqual(doc["rules"], [{"interval_ms": 60000.0, "burst": 1, "used": 1.0},
                                        {"interval_ms": 36000.0, "burst": 10, "used": 1.0}])
        self.assertEqual(doc["quotas"], [])
        self.assertTrue(doc["tracked"])
        self.assertEqual(doc["uses_ms"], [now_ms])
        self.assertTrue(doc["throttled"])
        # As the master evaluates it now: its DELAY_UNTIL then, moved by the time since (the spec's max(now, last)).
        self.assertGreaterEqual(doc["next_allowed_ms"], control.next_ms)
        self.assertLessEqual(doc["next_allowed_ms"], control.next_ms + 2000)
        status, body = self.get(master.admin_port, "/status/api/nobody")
        self.assertEqual((status, json.loads(body)["tracked"], json.loads(body)["throttled"]), (200, False, False))
        self.assertEqual(self.get(master.admin_port, "/status/nope/x")[0], 404)
        self.assertEqual(self.get(master.admin_port, "/status/api")[0], 400)
        self.assertEqual(self.get(master.admin_port, "/status/api/%zz")[0], 400)


    def test_the_proxy_status(self):
        _, _, proxy = self.gate_stack(
            {"api": {"rules": [("10/s", 20)]}},
            [{"path": "/api", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key", "ip"],
              "mode": "shadow", "status": 429},
             {"path": "/healthz", "upstream": "app"}])
        proxy.wait_metric("smockron_proxy_control_policies_total", predicate=lambda v: v > 0, timeout=10)
        status, body = self.get(proxy.admin_port, "/status")
        self.assertEqual(status, 200, body)
        doc = json.loads(body)
        self.assertEqual(doc["masters"], {"connected": 1, "endpoints": 1, "mechanism": "NULL"})
        self.assertEqual(doc["held_requests"], 0)
        api = next(d for d in doc["domains"] if d["name"] == "api")
        # How long ago the master published the domain's POLICY (it does every second).
        self.assertLessEqual(0, api.pop("policy_age_ms"))
        self.assertEqual(api, {"name": "api", "covered_by_a_master": True, "rules": [{"burst": 20, "window_s": 2}]})
        self.assertEqual(doc["max_held"], 10000)
        routes = {r["path"]: r for r in doc["routes"]}
        self.assertEqual(routes["/api"]["mode"], "shadow")
        self.assertEqual(routes["/api"]["status"], 429)
        self.assertEqual(routes["/api"]["identify"], ["header:X-API-Key", "ip"])
        self.assertEqual(routes["/healthz"]["domain"], "")



class OverrideTest(DaemonTestCase):
    """Per-identifier overrides in the master: one API key with limits of its own,
    another with none; shown in /status, carried to the gatekeepers (POLICY naming
    the identifier) and dropped there when a reload removes them."""

    def get(self, port: int, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return json.loads(r.read().decode())

    def test_an_override_gives_one_identifier_its_own_limit(self):
        master, backend, proxy = self.gate_stack(
            {"api": {"rules": [("1/2s", 2)], "overrides": {"vip": [("2/s", 20)], "internal": []}}},
            [{"path": "/api", "domain": "api", "upstream": "app", "identify": ["header:X-API-Key"],
              "status": 429, "max_delay": "100ms", "ratelimit_headers": True}])
        proxy.wait_metric("smockron_proxy_gate_overrides", predicate=lambda v: v == 2, timeout=10)
        self.assertEqual(self.get(proxy.admin_port, "/status")["identifier_overrides"], 2)
        # The domain's burst of 2, then over it (held past max_delay: 429).
        plain = [fetch(proxy.port, f"/api/plain/{i}", key="plain")[0] for i in range(3)]
        self.assertEqual([r.status for r in plain], [200, 200, 429])
        self.assertEqual(plain[2].headers.get("ratelimit-policy"), '"api";q=2;w=4')
        # vip: 15 back to back, within its own burst of 20: none held, none refused.
        for i in range(15):
            r, _ = fetch(proxy.port, f"/api/vip/{i}", key="vip")
            self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers.get("ratelimit-policy"), '"api";q=20;w=10')
        # 5 or more of its 20 left, depending on how fast the 15 went (it replenishes at 2/s).
        remaining = re.fullmatch(r'"api";r=(\d+);t=\d+', r.headers.get("ratelimit", ""))
        self.assertTrue(remaining and 5 <= int(remaining.group(1)) <= 20, r.headers.get("ratelimit"))
        # internal: no rules, no limit.
        for i in range(30):
            r, _ = fetch(proxy.port, f"/api/internal/{i}", key="internal")
            self.assertEqual(r.status, 200, r)
        self.assertIsNone(r.headers.get("ratelimit-policy"))
        self.assertEqual(len(backend.requests(key="vip")), 15)
        self.assertEqual(len(backend.requests(key="internal")), 30)

        # The master applies them too (once the accounting has arrived), and shows them.
        doc = wait_until(lambda: (d := self.get(master.admin_port, "/status/api/vip")) and len(d["uses_ms"]) == 15
                         and d, 10, interval=0.1, message="the master has vip's 15 uses")
        self.assertEqual((doc["override"], doc["rules"], doc["throttled"]),
                         (True, [{"interval_ms": 500.0, "burst": 20, "used": 15.0}], False))
        self.assertFalse(self.get(master.admin_port, "/status/api/plain")["override"])
        self.assertTrue(self.get(master.admin_port, "/status/api/internal")["throttled"] is False)
        api = next(d for d in self.get(master.admin_port, "/status")["domains"] if d["name"] == "api")
        self.assertEqual(api["overrides"], [{"identifier": "vip", "rules": [{"rate": "2/s", "burst": 20}],
                                             "source": "file"},
                                            {"identifier": "internal", "rules": [], "source": "file"}])

        # A reload without the overrides: the gatekeeper lets them go once the
        # master stops refreshing them (3.5 s), and vip has the domain's rules.
        with open(master.config_path) as f:
            text = f.read()
        self.assertIn("overrides = ", text)
        self.write_file(os.path.basename(master.config_path),
                        "\n".join(l for l in text.splitlines() if not l.startswith("overrides = ")) + "\n")
        master.signal(signal.SIGHUP)
        master.wait_metric("smockron_master_reloads_total", predicate=lambda v: v >= 1, timeout=10)
        self.assertEqual(self.get(master.admin_port, "/status/api/vip")["override"], False)
        wait_until(lambda: fetch(proxy.port, "/api/vip/after", key="vip")[0].headers.get("ratelimit-policy")
                   == '"api";q=2;w=4', 15, interval=0.2, message="vip back under the domain's rules at the gatekeeper")
        proxy.wait_metric("smockron_proxy_gate_overrides", predicate=lambda v: v == 0, timeout=15)


class UpstreamByNameTest(DaemonTestCase):
    """An upstream given by name stands for every address it resolves to, and
    follows the name when its address changes (resolve_interval), without a
    reload. The name lives in a hosts file of the test's own, bind-mounted over
    /etc/hosts in a private mount namespace around the proxy alone (unshare -m):
    nothing of the machine's changes. The two addresses are 127.0.0.1 and
    127.0.0.2, both loopback."""

    NAME = "app.smockron.test"

    def setUp(self):
        super().setUp()
        probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            self.skipTest(f"needs a private mount namespace (unshare --mount: {probe.stderr.strip()})")

    def hosts(self, *addresses: str) -> None:
        # Rewritten in place (same inode): the bind mount shows the new text.
        with open(self.hosts_path, "w") as f:
            f.write("".join(f"{a} {self.NAME}\n" for a in addresses))

    def test_a_name_follows_its_addresses(self):
        b = self.start_backend(host="127.0.0.1")
        a = self.start_backend(b.port, host="127.0.0.2")  # the same port on the other address
        self.hosts_path = os.path.join(self.tmp, "hosts")
        self.hosts("127.0.0.2")
        prefix = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', self.hosts_path]
        proxy = self.start_proxy({"app": {"servers": [f"{self.NAME}:{b.port}"]}},
                                 [{"path": "/", "upstream": "app"}], resolve_interval="200ms", prefix=prefix)
        for i in range(3):
            self.assertEqual(fetch(proxy.port, f"/first/{i}")[0].status, 200)
        self.assertEqual((len(a.requests()), len(b.requests())), (3, 0))

        # The service moves: requests follow within a few resolve intervals, no reload.
        self.hosts("127.0.0.1")
        n = iter(range(10_000))
        wait_until(lambda: fetch(proxy.port, f"/moving/{next(n)}")[0].status == 200 and b.requests(), 10,
                   interval=0.05, message="a request reaches the new address")
        a_before = len(a.requests())
        for i in range(5):
            self.assertEqual(fetch(proxy.port, f"/moved/{i}")[0].status, 200)
        self.assertEqual(len(a.requests()), a_before, "nothing goes to the old address any more")

        # Two addresses: both serve (round robin).
        self.hosts("127.0.0.1", "127.0.0.2")
        wait_until(lambda: fetch(proxy.port, f"/both/{next(n)}")[0].status == 200 and len(a.requests()) > a_before,
                   10, interval=0.05, message="both addresses serve")


class SignalsTest(DaemonTestCase):
    def test_sigusr1_reopens_logs_and_stops_no_daemon(self):
        master, _, proxy = self.gate_stack({"api": {"rules": [("10/s", 10)]}},
                                           [{"path": "/", "domain": "api", "upstream": "app"}])
        for daemon in (master, proxy):
            daemon.signal(signal.SIGUSR1)
        wait_until(lambda: "SIGUSR1" in master.log() and "SIGUSR1" in proxy.log(), 5, message="both handled it")
        self.assertTrue(master.alive() and proxy.alive(), "log rotation must not stop a daemon")
        self.assertEqual(fetch(proxy.port, "/x")[0].status, 200)

if __name__ == "__main__":
    unittest.main()
