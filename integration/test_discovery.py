"""Masters found by DNS (issue 37), with the real binaries and a DNS server
the test runs on loopback (lib/dns_server.py): a proxy whose accounting and
control endpoints are SRV names connects to the masters an answer lists,
uses a master added to the name and drops one removed from it while requests
flow (the others' links untouched, nothing of theirs lost); a sharded master
that restarts at a new address keeps its share (a share is keyed by its
configured name); a dns+tcp:// name is asked again at its TTL (within the
configured bounds), and a lookup that fails or comes back empty keeps the
masters of the last good answer.

Run: cd integration && python3 -m unittest -v test_discovery
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.dns_server import DnsServer  # noqa: E402
from lib.http1 import fetch  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import wait_until  # noqa: E402
from test_shards import owner  # noqa: E402

DOMAIN = "api"
ROUTE = {"path": "/", "domain": DOMAIN, "upstream": "app", "identify": ["header:X-API-Key"]}


def received(master) -> float:
    """Accounting messages of DOMAIN the master has taken in."""
    return metric(master.metrics(), "smockron_master_accounting_messages_total",
                  {"domain": DOMAIN, "status": "ACCEPTED"}) or 0


class DiscoveryCase(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.dns = DnsServer().start()
        self.addCleanup(self.dns.stop)
        self.backend = self.start_backend()

    def master(self, name: str):
        return self.start_master({DOMAIN: {"rules": [("100000/s", 100000)]}}, config_name=f"{name}.toml")

    def publish(self, name: str, masters: list, ttl: int = 1) -> None:
        """SRV records: _acc._tcp.NAME and _ctl._tcp.NAME list each master (target mI.NAME on 127.0.0.1)."""
        for i, m in enumerate(masters):
            self.dns.set_a(f"m{i}-{m.accounting_port}.{name}", ["127.0.0.1"], ttl=60)
        self.dns.set_srv(f"_acc._tcp.{name}",
                         [(0, 0, m.accounting_port, f"m{i}-{m.accounting_port}.{name}") for i, m in enumerate(masters)],
                         ttl=ttl)
        self.dns.set_srv(f"_ctl._tcp.{name}",
                         [(0, 0, m.control_port, f"m{i}-{m.accounting_port}.{name}") for i, m in enumerate(masters)],
                         ttl=ttl)

    def proxy(self, accounting: list, control: list, **keys):
        return self.start_proxy({"app": {"servers": [f"127.0.0.1:{self.backend.port}"]}}, [ROUTE],
                                accounting=accounting, control=control, dns_servers=[self.dns.address], **keys)

    def links(self, proxy, masters: int) -> None:
        """Until the control socket has `masters` masters and every worker's accounting link to each is subscribed."""
        self.wait_connected(proxy, f"{masters}/{masters}", timeout=15)
        self.wait_accounting(proxy, masters, timeout=15)

    def workers(self, proxy) -> int:
        return int(re.search(r"\((\d+) worker threads?\)", proxy.log()).group(1))

    def disconnects(self, proxy) -> float:
        text = proxy.metrics()
        return sum(v for line in text.splitlines() if line.startswith("smockron_proxy_accounting_disconnects_total{")
                   for v in [float(line.rsplit(" ", 1)[1])])


class SrvMastersTest(DiscoveryCase):
    def test_a_master_added_to_or_removed_from_the_name_is_used_or_dropped_under_load(self):
        m0, m1 = self.master("m0"), self.master("m1")
        self.publish("masters.test", [m0])
        proxy = self.proxy(["srv+tcp://_acc._tcp.masters.test"], ["srv+tcp://_ctl._tcp.masters.test"])
        self.links(proxy, 1)

        # Requests flow the whole time (bounded), one fresh identifier each.
        stop = threading.Event()
        statuses: list[int] = []

        def load():
            for n in range(5000):
                if stop.is_set():
                    return
                statuses.append(fetch(proxy.port, f"/load/{n}", key=f"load-{n}")[0].status)

        worker = threading.Thread(target=load)
        worker.start()
        self.addCleanup(worker.join)
        self.addCleanup(stop.set)
        wait_until(lambda: received(m0) > 10, 10, message="accounting reaches the first master under load")

        t0 = time.monotonic()
        self.publish("masters.test", [m0, m1])
        self.links(proxy, 2)
        added = time.monotonic() - t0
        wait_until(lambda: received(m1) > 10, 10, message="accounting reaches the added master")

        t0 = time.monotonic()
        before_removal = received(m1)
        self.publish("masters.test", [m1])
        wait_until(lambda: "masters connected: 1/1" in proxy.readyz(), 15, message="the removed master dropped")
        proxy.wait_metric("smockron_proxy_accounting_links_subscribed",
                          predicate=lambda v: v == self.workers(proxy), timeout=15)
        removed = time.monotonic() - t0
        wait_until(lambda: received(m1) > before_removal + 10, 10, message="accounting still reaches the master left")
        stop.set()
        worker.join(timeout=30)
        self.assertFalse(worker.is_alive())
        self.assertTrue(statuses and all(s == 200 for s in statuses), set(statuses))

        # The master left takes every request from now on, and m0 none of them.
        keys = [f"after-{n}" for n in range(50)]
        for k in keys:
            self.assertEqual(fetch(proxy.port, f"/after/{k}", key=k)[0].status, 200)

        def tracked(master, k: str) -> bool:
            return json.loads(master.get(f"/status/{DOMAIN}/{k}").body)["tracked"]

        wait_until(lambda: all(tracked(m1, k) for k in keys), 10, message="every request after the removal reaches m1")
        self.assertFalse(any(tracked(m0, k) for k in keys))
        # No link was ever broken: adding and removing masters left the others' connections alone.
        self.assertEqual(self.disconnects(proxy), 0)
        self.assertGreaterEqual(proxy.metric("smockron_proxy_dns_master_changes_total"), 4)  # acc and ctl, twice
        print(f"\n{len(statuses)} requests under load; master added in use after {added:.2f} s, "
              f"removed out of use after {removed:.2f} s (TTL 1 s)", file=sys.stderr)

    def test_a_sharded_master_restarting_at_a_new_address_keeps_its_share(self):
        m0, m1 = self.master("m0"), self.master("m1")
        self.publish("s0.test", [m0])
        self.publish("s1.test", [m1])
        shares = ["srv+tcp://_acc._tcp.s0.test", "srv+tcp://_acc._tcp.s1.test"]
        proxy = self.proxy(shares, ["srv+tcp://_ctl._tcp.s0.test", "srv+tcp://_ctl._tcp.s1.test"],
                           shards=[{"domain": DOMAIN, "masters": shares}])
        self.links(proxy, 2)

        def round_of(prefix: str, masters: list) -> list[int]:
            ids = [f"{prefix}-{i}" for i in range(40)]
            base = [received(m) for m in masters]
            for k in ids:
                self.assertEqual(fetch(proxy.port, f"/{k}", key=k)[0].status, 200)
            share = [sum(1 for k in ids if owner(shares, k) == i) for i in range(2)]
            expected = [b + n for b, n in zip(base, share)]
            wait_until(lambda: [received(m) for m in masters] == expected, 10,
                       message=f"each master receives exactly its share {share}")
            return share

        first = round_of("user", [m0, m1])
        # Master 0 restarts elsewhere (new ports): its name now points there.
        m0.stop()
        m0b = self.master("m0b")
        self.publish("s0.test", [m0b])
        # The name now stands for m0b (the control endpoint, as /status shows it), and its links are up.
        wait_until(lambda: json.loads(proxy.get("/status").body)["masters"]["discovered"].get(
            "srv+tcp://_ctl._tcp.s0.test") == [m0b.control], 15, message="s0's name answered with m0b")
        self.links(proxy, 2)
        again = round_of("user", [m0b, m1])
        self.assertEqual(first, again)
        self.assertTrue(all(first), first)


class AddressNameTest(DiscoveryCase):
    def test_a_name_is_asked_again_at_its_ttl_and_failures_or_empty_answers_keep_the_masters(self):
        m = self.master("m")
        self.dns.set_a("acc.test", ["127.0.0.1", "::1"], ttl=3600)  # dual-stack: one master (its IPv4 address)
        self.dns.set_a("ctl.test", ["127.0.0.1"], ttl=3600)
        proxy = self.proxy([f"dns+tcp://acc.test:{m.accounting_port}"], [f"dns+tcp://ctl.test:{m.control_port}"],
                           dns_min_ttl="200ms", dns_max_ttl="500ms")
        self.links(proxy, 1)
        self.assertEqual(proxy.metric("smockron_proxy_dns_masters"), 2)
        status = json.loads(proxy.get("/status").body)["masters"]
        self.assertEqual(status["discovered"], {f"dns+tcp://ctl.test:{m.control_port}": [m.control]}, status)

        # A TTL of an hour is used for dns_max_ttl at most: the name is asked again and again.
        asked = self.dns.queries("acc.test")
        wait_until(lambda: self.dns.queries("acc.test") >= asked + 3, 10, message="acc.test asked again")

        def still_used(reason: str):
            proxy.wait_metric("smockron_proxy_dns_lookups_total", {"result": reason}, timeout=15)
            self.assertIn("masters connected: 1/1", proxy.readyz())
            self.assertEqual(proxy.metric("smockron_proxy_dns_masters"), 2)
            base = received(m)
            self.assertEqual(fetch(proxy.port, f"/{reason}", key=reason)[0].status, 200)
            wait_until(lambda: received(m) == base + 1, 10, message=f"accounting still reaches the master ({reason})")

        self.dns.set_failing("acc.test", "servfail")
        still_used("failed")
        self.dns.set_failing("acc.test", None)
        self.dns.set_a("acc.test", [], ttl=1)  # the name, with no address (NODATA)
        still_used("empty")
        self.dns.remove("acc.test")  # no such name (NXDOMAIN)
        asked = self.dns.queries("acc.test")
        wait_until(lambda: self.dns.queries("acc.test") >= asked + 2, 10, message="acc.test asked while gone")
        still_used("empty")
        self.assertIn("keeping the 1 master(s) of the last answer", proxy.log())


if __name__ == "__main__":
    unittest.main()
