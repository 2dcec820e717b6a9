"""smockron-master with store = "redis" on a Redis Cluster (issue 37): three
primaries and three replicas of Debian's redis-server, started by the test on
127.0.0.1 (lib/redis_cluster.py), and the master's own cluster client
(master/store/redis_cluster.hpp).

Each state lives on the primary of its slot under the hash tag
{domain\\0identifier}, spread over the primaries; a killed master reads every
primary back. A primary SIGKILLed while decisions flow: no decision waits
(each answered within the bound), the master follows the promoted replica,
and everything it holds -- what the dead primary had, and what was decided
while there was none -- is back in the cluster, which a restarted master
then reads.

Run: cd integration && python3 -m unittest -v test_redis_cluster
"""
from __future__ import annotations

import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.redis_cluster import RedisCluster  # noqa: E402
from lib.timing import wait_until  # noqa: E402
from test_redis import DOMAINS, RedisTestCase  # noqa: E402


def cluster_key(domain: str, identifier: str) -> bytes:
    """The state's key in a cluster: the hash tag keeps an identifier's keys in one slot."""
    return b"smockron:{" + domain.encode() + b"\0" + identifier.encode() + b"}"


class RedisClusterTest(RedisTestCase):
    def start_cluster(self) -> RedisCluster:
        c = RedisCluster(self.tmp)
        self.addCleanup(c.stop)
        c.start()
        for port, path in c.log_paths().items():
            self.log_files.append((f"redis-server {port} (cluster)", path))
        return c

    def stored(self, cluster: RedisCluster) -> dict[bytes, bytes | None]:
        """The states in the cluster, but the test fixture's probe domain's."""
        return {k: v for k, v in cluster.keys_everywhere("smockron:*").items()
                if not k.startswith(b"smockron:{smockron-probe\0")}

    def test_states_live_on_the_primary_of_their_slot_and_a_killed_master_reads_them_back(self):
        cluster = self.start_cluster()
        m = self.master(cluster.url)
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 1, timeout=10)
        self.assertIn("redis cluster (3 primaries): connected", m.get("/readyz").body)
        gk = self.closing(m.gatekeeper(["api", "g"]))
        ids = [f"user-{i}" for i in range(24)]
        for i in ids:
            self.fill(gk, "api", i)
        self.fill(gk, "g", "alice")
        self.wait_written(m)

        stored = self.stored(cluster)
        self.assertEqual(set(stored), {cluster_key("api", i) for i in ids} | {cluster_key("g", "alice")})
        homes = set()
        for i in ids:
            k = cluster_key("api", i)
            home = cluster.node_for_key(k)
            homes.add(home)
            # On the primary of its slot: it answers the GET itself (no MOVED).
            self.assertTrue(cluster.command(home, "GET", k).startswith(b"sliding-log:"), i)
        self.assertEqual(len(homes), 3, "24 identifiers spread over the 3 primaries")
        self.assertTrue(stored[cluster_key("g", "alice")].startswith(b"gcra:"))

        m = self.restart_master(m, signal.SIGKILL)
        m.wait_metric("smockron_master_redis_loaded_total", predicate=lambda v: v >= len(ids) + 1, timeout=10)
        gk.close()
        gk = self.closing(m.gatekeeper(["api", "g"]))
        for i in (ids[0], ids[-1]):
            self.assert_limited(gk, "api", i)
        self.assert_limited(gk, "g", "alice")
        self.assert_free(gk, "api", "newcomer")

    def test_a_primary_failover_under_load_never_stalls_a_decision_and_the_state_comes_back(self):
        cluster = self.start_cluster()
        # A window of 3 minutes: every identifier below is still limited after the
        # failover and a restart. redis_timeout 5 s: a decision that waited for
        # Redis would take up to that, which the bound on the slowest tells apart.
        m = self.start_master({"api": {"rules": [("1/min", 3)]}}, store="redis", redis=cluster.url,
                              redis_timeout="5s")
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 1, timeout=10)
        gk = self.closing(m.gatekeeper(["api"]))
        before = [f"before-{i}" for i in range(12)]
        for i in before:
            self.fill(gk, "api", i)
        self.wait_written(m)

        victim = cluster.node_for_key(cluster_key("api", before[0]))
        on_victim = [i for i in before if cluster.node_for_key(cluster_key("api", i)) == victim]
        connects = m.metric("smockron_master_redis_connects_total")
        self.assertEqual(connects, 1, "connected once, and no reconnect while the cluster is whole")
        cluster.kill_primary(victim)
        killed = time.monotonic()
        worst, n = 0.0, 0
        # Decisions every 50 ms until the master has its connection to the cluster back.
        while True:
            t = time.monotonic()
            self.fill(gk, "api", f"during-{n}")
            worst = max(worst, time.monotonic() - t)
            n += 1
            if m.metric("smockron_master_redis_up") == 1 and m.metric("smockron_master_redis_connects_total") > connects:
                break  # it lost the cluster (a write to the dead primary failed) and is back
            self.assertLess(time.monotonic() - killed, 60, f"the master never came back: {m.get('/readyz').body}")
            time.sleep(0.05)
        reconnected = time.monotonic() - killed
        promoted = cluster.wait_failover(victim)
        # Everything the master holds is written again: what only the dead primary had, and what
        # was decided while its slots had no primary.
        expected = {cluster_key("api", i) for i in before + [f"during-{k}" for k in range(n)]}
        wait_until(lambda: expected <= set(self.stored(cluster)), 20, message="every state back in the cluster")
        restored = time.monotonic() - killed
        self.assertLess(worst, 2.5, f"a decision took {worst:.3f}s during the failover (redis_timeout 5s)")
        self.assertIn(promoted, cluster.primaries())
        print(f"\ncluster failover: master reconnected {reconnected:.2f}s after the primary's kill, every state "
              f"back {restored:.2f}s after; {n} decisions meanwhile, the slowest {worst * 1000:.1f} ms; "
              f"{len(on_victim)} of 12 earlier identifiers lived on the killed primary", file=sys.stderr)

        self.wait_written(m)  # the last uses too (a key may be there at an earlier version)
        m = self.restart_master(m, signal.SIGKILL)
        m.wait_metric("smockron_master_redis_loaded_total", predicate=lambda v: v >= len(expected), timeout=10)
        gk.close()
        gk = self.closing(m.gatekeeper(["api"]))
        for identifier in [*on_victim[:2], "during-0", f"during-{n - 1}"]:
            self.assert_limited(gk, "api", identifier)


if __name__ == "__main__":
    unittest.main()
