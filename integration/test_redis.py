"""smockron-master with store = "redis" against a real redis-server started by
each test on 127.0.0.1 (no persistence: killing Redis loses what it held).

A Gatekeeper stand-in sends accounting over ZeroMQ; exactness comes from the
spec's logic: with burst 3 at 1/10s a fresh identifier's first request is
never throttled, so a DELAY_UNTIL for the first request after a restart proves
the master came back with the history it had.

Run: python3 integration/test_redis.py -v
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.daemons import MasterProcess  # noqa: E402
from lib.gatekeeper import zmq  # noqa: E402
from lib.ports import HOST, reserve_port  # noqa: E402
from lib.redis_server import RedisSentinel, RedisServer  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402
from lib.timing import now_ms, wait_until  # noqa: E402

DOMAINS = {
    "api": {"rules": [("1/10s", 3)]},                      # sliding log, window 30 s
    "g": {"rules": [("1/10s", 3)], "algorithm": "gcra"},   # GCRA, same limit
}


def key(domain: str, identifier: str) -> bytes:
    return b"smockron:" + domain.encode() + b"\0" + identifier.encode()


class RedisTestCase(DaemonTestCase):
    """Fixtures for a master with a Redis store (no tests of its own)."""

    def start_redis(self, port: int | None = None, extra_args=()) -> RedisServer:
        """A redis-server on a fresh port, or on `port` (again, after a kill)."""
        r = RedisServer(self.tmp, port, extra_args=extra_args)
        self.addCleanup(r.stop)
        r.start()
        self.log_files.append((f"redis-server {r.port}", r.log_path))
        return r

    def master(self, redis_url: str, **keys) -> MasterProcess:
        return self.start_master(DOMAINS, store="redis", redis=redis_url, **keys)

    def restart_master(self, m: MasterProcess, sig=signal.SIGKILL) -> MasterProcess:
        """Stops the master with `sig` and starts it again on the same config and ports."""
        m.signal(sig)
        m.wait(10)
        return self.restart(m)

    def fill(self, gk, domain: str, identifier: str, n: int = 3):
        """n requests now: the last one fills the burst and must be answered."""
        t = now_ms()
        for i in range(n):
            gk.accepted(domain, identifier, t + i)
        c = gk.expect(3)
        self.assertEqual((c.domain, c.identifier), (domain, identifier))
        return c

    def assert_limited(self, gk, domain: str, identifier: str, timeout: float = 3.0):
        """One request for an identifier whose burst is used up is answered with DELAY_UNTIL."""
        gk.accepted(domain, identifier, now_ms())
        c = gk.recv(timeout)
        self.assertIsNotNone(c, f"{domain}/{identifier} was not limited: its history was lost")
        self.assertEqual((c.domain, c.identifier), (domain, identifier))
        self.assertGreater(c.next_ms, now_ms() + 5000)
        return c

    def assert_free(self, gk, domain: str, identifier: str):
        gk.accepted(domain, identifier, now_ms())
        self.assertIsNone(gk.recv(0.3), f"{domain}/{identifier} is new and must not be limited")

    def wait_written(self, m: MasterProcess, timeout: float = 5.0):
        m.wait_metric("smockron_master_redis_writes_total", predicate=lambda v: v >= 1, timeout=timeout)
        m.wait_metric("smockron_master_redis_unwritten_states", predicate=lambda v: v == 0, timeout=timeout)



class RedisStoreTest(RedisTestCase):
    def test_state_survives_a_master_kill_and_key_layout(self):
        r = self.start_redis()
        m = self.master(r.url)
        gk = self.closing(m.gatekeeper(["api", "g"]))
        filled = now_ms()  # the uses are timed from here on
        before = {d: self.fill(gk, d, "alice").next_ms for d in ("api", "g")}
        self.wait_written(m)

        v = r.command("GET", key("api", "alice"))
        self.assertIsNotNone(v, "sliding-log state not in Redis under the documented key")
        self.assertTrue(v.startswith(b"sliding-log:"), v)
        self.assertEqual(len(v[len(b"sliding-log:"):].split(b",")), 3)
        self.assertTrue(r.command("GET", key("g", "alice")).startswith(b"gcra:"))
        ttl = r.command("PTTL", key("api", "alice"))
        # The last use + the 30 s window + 2 s for uses reported late, counted from now
        # (however long the steps above took).
        least = 32_000 - (now_ms() - filled) - 5
        self.assertTrue(least < ttl <= 33_000,
                        f"PTTL {ttl} (at least {least}): keys expire 2 s after the 30 s window has passed")

        m = self.restart_master(m, signal.SIGKILL)
        self.assertGreaterEqual(m.wait_metric("smockron_master_redis_loaded_total", predicate=lambda v: v >= 2), 2)
        gk.close()
        gk = self.closing(m.gatekeeper(["api", "g"]))
        for d in ("api", "g"):
            after = self.assert_limited(gk, d, "alice")
            self.assertGreaterEqual(after.next_ms, before[d], d)
        self.assert_free(gk, "api", "bob")

    def test_a_tiers_state_is_kept_in_redis_for_the_tiers_window(self):
        # The tier's window (3 per minute: 3 min) is six times the domain's
        # (30 s): its key must live that long, or a restart forgets the client.
        r = self.start_redis()
        m = self.start_master({"t": {"rules": [("1/10s", 3)], "tiers": {"pro": [("1/min", 3)]}}},
                              store="redis", redis=r.url)
        gk = self.closing(m.gatekeeper(["t"]))
        t = now_ms()
        for i in range(3):
            gk.accepted("t", "dave", t + i, loginfo="tier=pro")
        gk.expect(3)
        self.wait_written(m)
        ttl = r.command("PTTL", key("t", "dave"))
        self.assertGreater(ttl, 150_000, f"PTTL {ttl}: the tier's 3 min window, not the domain's 30 s")
        self.assertLessEqual(ttl, 183_000)
        self.assertTrue(r.command("GET", key("t", "dave")).endswith(b"|pro"), "the record names its tier")
        # Read back, a state is judged by its tier: one whose uses were a
        # minute ago is over the domain's 30 s window but inside the tier's.
        us = (now_ms() - 60_000) * 1000
        r.command("SET", key("t", "erin"), f"sliding-log:{us},{us + 1000},{us + 2000}|pro", "PX", 200_000)
        m = self.restart_master(m, signal.SIGKILL)
        m.wait_metric("smockron_master_redis_loaded_total", predicate=lambda v: v >= 2)
        gk.close()
        gk = self.closing(m.gatekeeper(["t"]))
        gk.accepted("t", "erin", now_ms(), loginfo="tier=pro")
        c = gk.recv(3.0)
        self.assertIsNotNone(c, "erin's tier state was not read back as the tier's")
        self.assertEqual(c.identifier, "erin")

    def test_state_survives_a_graceful_restart_with_writes_flushed_at_exit(self):
        r = self.start_redis()
        m = self.master(r.url)
        gk = self.closing(m.gatekeeper(["api"]))
        self.fill(gk, "api", "carol")
        m = self.restart_master(m, signal.SIGTERM)  # no wait for the write-behind: shutdown flushes it
        gk.close()
        gk = self.closing(m.gatekeeper(["api"]))
        self.assert_limited(gk, "api", "carol")

    def test_redis_killed_mid_run_master_keeps_deciding_then_catches_up(self):
        r = self.start_redis()
        m = self.master(r.url)
        gk = self.closing(m.gatekeeper(["api"]))
        self.fill(gk, "api", "before")
        self.wait_written(m)

        r.kill()
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 0, timeout=5)
        ready = m.get("/readyz")
        self.assertEqual(ready.status, 200, "the master still decides from memory: it stays ready")
        self.assertIn("unreachable", ready.body)
        # Decisions do not wait for Redis.
        t = time.monotonic()
        self.fill(gk, "api", "during")
        self.assertLess(time.monotonic() - t, 2.0)
        self.assertTrue(m.alive())

        r = self.start_redis(r.port)  # back, and empty
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 1, timeout=10)
        wait_until(lambda: r.command("GET", key("api", "during")) is not None
                   and r.command("GET", key("api", "before")) is not None, timeout=10,
                   message="states decided while Redis was down (and before) rewritten once it returned")
        self.assertIn("connected", m.get("/readyz").body)

        m = self.restart_master(m, signal.SIGKILL)
        gk.close()
        gk = self.closing(m.gatekeeper(["api"]))
        self.assert_limited(gk, "api", "during")
        self.assert_limited(gk, "api", "before")

    def test_redis_unreachable_at_start_master_serves_then_writes_when_it_appears(self):
        hold = reserve_port()  # refuses connections, and nobody else can take the port meanwhile
        self.addCleanup(hold.close)
        port = hold.getsockname()[1]
        m = self.master(f"redis://127.0.0.1:{port}/0", redis_timeout="200ms")
        self.assertIn("unreachable", m.get("/readyz").body)
        gk = self.closing(m.gatekeeper(["api"]))
        self.fill(gk, "api", "early")
        self.assertGreaterEqual(m.metric("smockron_master_redis_unwritten_states"), 1)
        hold.close()  # given up only now, to the redis-server started at once
        r = self.start_redis(port)
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 1, timeout=10)
        wait_until(lambda: r.command("GET", key("api", "early")) is not None, timeout=10)

    def test_accounting_that_arrives_while_states_load_is_held_then_processed(self):
        r = self.start_redis()
        os.kill(r.proc.pid, signal.SIGSTOP)  # connects, never answers: loading lasts until SIGCONT below
        self.addCleanup(lambda: os.kill(r.proc.pid, signal.SIGCONT))
        # redis_timeout far longer than the steps up to the "still loading" check take on
        # any machine; the test ends the loading itself (SIGCONT), it does not wait that long.
        m = self.start_master(DOMAINS, store="redis", redis=r.url, redis_timeout="30s")
        # Redis answers again before the master is stopped, or its shutdown flush waits
        # redis_timeout for nothing (cleanups run last-registered first).
        self.addCleanup(lambda: os.kill(r.proc.pid, signal.SIGCONT))
        # An XPUB shows when the master's subscription arrived: from then on
        # nothing it publishes is dropped on the gatekeeper's side.
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pub = ctx.socket(zmq.XPUB)
        pub.connect(m.accounting)
        self.assertTrue(pub.poll(5000), "the master never subscribed while loading")
        subscriptions = set()
        while pub.poll(0):
            subscriptions.add(pub.recv())
        wait_until(lambda: (pub.poll(10) and subscriptions.add(pub.recv())) or b"\x01api\0" in subscriptions,
                   timeout=5, message="subscription to api while loading")
        t = now_ms()
        for i in range(3):
            pub.send_multipart([b"api\0", b"ACCEPTED", b"held", str(t + i).encode(), b""])
        # And a BATCH of two (what a gatekeeper sends on a CURVE link), unpacked when it is processed.
        records = b""
        for i in range(2):
            frames = [b"ACCEPTED", b"held-in-a-batch", str(t + i).encode(), b""]
            records += bytes([len(frames)]) + b"".join(len(f).to_bytes(2, "big") + f for f in frames)
        pub.send_multipart([b"api\0", b"BATCH", records])
        accepted = {"domain": "api", "status": "ACCEPTED"}
        self.assertEqual(m.metric("smockron_master_accounting_messages_total", accepted) or 0, 0,
                         "the master is still loading its states (Redis stopped, redis_timeout 30s)")
        self.assertNotIn("serving after", m.log(), "the master is still loading its states")
        os.kill(r.proc.pid, signal.SIGCONT)  # Redis answers: the loading completes
        m.wait_metric("smockron_master_accounting_messages_total", accepted, predicate=lambda v: v == 5, timeout=30)
        self.assertEqual(m.metric("smockron_master_accounting_dropped_total"), 0)
        self.assertIn("4 accounting message(s) held meanwhile", m.log())

    def test_a_hung_redis_never_stalls_decisions(self):
        # A decision that waited for Redis would wait redis_timeout (5 s): the bound
        # below (2.5 s, half of it) tells the two apart with room for a busy machine.
        r = self.start_redis()
        m = self.master(r.url, redis_timeout="5s")
        gk = self.closing(m.gatekeeper(["api"]))
        self.fill(gk, "api", "x0")
        self.wait_written(m)
        os.kill(r.proc.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
        try:
            worst = 0.0
            for i in range(1, 6):
                t = time.monotonic()
                self.fill(gk, "api", f"x{i}")
                worst = max(worst, time.monotonic() - t)
                time.sleep(0.2)  # let write-behind batches pile onto the hung connection
            self.assertLess(worst, 2.5, f"a decision took {worst:.3f}s while Redis was hung (redis_timeout 5s)")
            m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 0, timeout=15)
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 1, timeout=10)
        wait_until(lambda: all(r.command("GET", key("api", f"x{i}")) is not None for i in range(6)), timeout=10,
                   message="states decided while Redis hung are written once it answers again")

    def test_restored_state_is_folded_into_new_uses(self):
        # Redis holds a history written by a previous master; a request that reaches
        # the new master before... or after loading must count against it. Here the
        # history is planted directly in the documented layout.
        r = self.start_redis()
        t = now_ms() * 1000
        r.command("SET", key("api", "planted"), f"sliding-log:{t - 2000},{t - 1000},{t}", "PX", 30_000)
        r.command("SET", key("api", "garbage"), "not-a-state", "PX", 30_000)
        r.command("SET", key("nosuch", "x"), f"sliding-log:{t}", "PX", 30_000)
        m = self.master(r.url)
        m.wait_metric("smockron_master_redis_loaded_total", predicate=lambda v: v >= 2)
        self.assertGreaterEqual(m.metric("smockron_master_redis_restore_skipped_total"), 1)  # unknown domain
        gk = self.closing(m.gatekeeper(["api"]))
        self.assert_limited(gk, "api", "planted")
        self.assert_free(gk, "api", "garbage")
        self.assertTrue(m.alive())


    def test_open_reservations_survive_a_master_kill_and_die_with_their_gatekeeper(self):
        """A use reported at an estimate (reserve=N) is charged at once and held
        open until its correction. The book is kept in Redis: after a kill -9,
        the restarted master closes one by its correction (on the gatekeeper's
        new connection) and gives back one whose gatekeeper died, at
        reservation_timeout from when it was first received."""
        r = self.start_redis()
        m = self.master(r.url, reservation_timeout="10s")
        gk = self.closing(m.gatekeeper(["api"]))
        t = now_ms()
        gk.accepted("api", "alice", t, loginfo="reserve=3")  # the whole burst: alice is limited now
        gk.accepted("api", "bob", t, loginfo="reserve=3")
        self.assertEqual(gk.expect(3).identifier, "alice")
        self.assertEqual(gk.expect(3).identifier, "bob")
        wait_until(lambda: len(r.command("KEYS", "smockron-resv:*")) == 2, 5,
                   message="the two open reservations were not written to Redis")
        self.wait_written(m)
        m = self.restart_master(m, signal.SIGKILL)
        gk.close()  # alice's gatekeeper is gone for good
        m.wait_metric("smockron_master_reservations_open", predicate=lambda v: v == 2)
        gk2 = self.closing(m.gatekeeper(["api"]))
        gk2.rejected("api", "bob", t, loginfo="adjust=-2")  # bob's gatekeeper, reconnected: it cost 1
        m.wait_metric("smockron_master_reservations_open", predicate=lambda v: v == 1)
        self.assertEqual(m.metric("smockron_master_reservations_released_total", {"reason": "timeout"}), 0)
        # Alice's is given back at its timeout (10 s after it was first received).
        m.wait_metric("smockron_master_reservations_released_total", {"reason": "timeout"},
                      predicate=lambda v: v == 1, timeout=20)
        self.assertEqual(m.metric("smockron_master_reservations_open"), 0)
        wait_until(lambda: r.command("KEYS", "smockron-resv:*") == [], 5, message="closed reservations left in Redis")
        self.assert_free(gk2, "api", "alice")  # 3 units at 1/10 s would have kept her waiting 30 s

    def test_overrides_set_through_the_api_survive_a_master_kill(self):
        r = self.start_redis()
        token = "a-token-for-the-override-api"
        m = self.master(r.url, admin_token_file=self.write_file("token", token))
        auth = {"Authorization": f"Bearer {token}"}
        rules = 'rules = [ { rate = "1/10s", burst = 50 } ]'
        conn = http.client.HTTPConnection(HOST, m.admin_port, timeout=5)
        conn.request("PUT", "/overrides/api/vip", body=rules.encode(), headers=auth)
        self.assertEqual(conn.getresponse().status, 201)
        conn.close()
        wait_until(lambda: r.command("GET", b"smockron-override:api\0vip") == rules.encode(), 5,
                   message="the override in Redis under the documented key, with no expiry")
        self.assertEqual(r.command("PTTL", b"smockron-override:api\0vip"), -1)
        m = self.restart_master(m, signal.SIGKILL)
        gk = self.closing(m.gatekeeper(["api"]))
        t = now_ms()
        for i in range(10):  # the domain's burst is 3: the override's 50 is in force again
            gk.accepted("api", "vip", t + i)
        self.assertIsNone(gk.recv(0.5), "vip limited by the domain's rules: its override was lost")
        status = json.loads(m.get("/status").body)
        api = [o for d in status["domains"] if d["name"] == "api" for o in d["overrides"]]
        self.assertEqual([(o["identifier"], o["source"]) for o in api], [("vip", "api")])
        # Deleted: gone from Redis too.
        conn = http.client.HTTPConnection(HOST, m.admin_port, timeout=5)
        conn.request("DELETE", "/overrides/api/vip", headers=auth)
        self.assertEqual(conn.getresponse().status, 200)
        conn.close()
        wait_until(lambda: r.command("EXISTS", b"smockron-override:api\0vip") == 0, 5, message="the record deleted")



class RedisSentinelTest(RedisTestCase):
    """store = "redis" through Sentinel: a primary, a replica and three Sentinels,
    all real processes on 127.0.0.1. The primary is killed under load: decisions
    never wait, the master follows the promoted replica, and what was written
    before the failover (and during and after it) survives a master restart."""

    NAME = "smockron"

    def test_the_master_follows_a_failover_without_stalling_or_losing_state(self):
        primary = self.start_redis()
        replica = self.start_redis(extra_args=("--replicaof", "127.0.0.1", primary.port))
        wait_until(lambda: b"master_link_status:up" in replica.command("INFO", "replication"), 15,
                   interval=0.1, message="the replica is in sync")
        sentinels = []
        for _ in range(3):
            s = RedisSentinel(self.tmp, self.NAME, primary.port)
            self.addCleanup(s.stop)
            s.start()
            self.log_files.append((f"redis-sentinel {s.port}", s.log_path))
            sentinels.append(s)
        # A failover needs Sentinels that know each other and the replica
        # (they meet through the primary's hello channel every 2 s).
        wait_until(lambda: all(len(s.command("SENTINEL", "sentinels", self.NAME)) == 2
                               and len(s.command("SENTINEL", "replicas", self.NAME)) == 1 for s in sentinels),
                   30, interval=0.2, message="three Sentinels that know each other and the replica")

        url = "redis-sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in sentinels) + f"/{self.NAME}/0"
        # A window of 3 minutes (1/min, burst 3): "before" is still limited after the failover
        # and the restart below however long the Sentinels' election takes (it may retry:
        # failover-timeout 5 s). redis_timeout 5 s: a decision that waited for Redis would
        # take up to that, which the bound on the slowest decision (2.5 s) tells apart.
        m = self.start_master({"api": {"rules": [("1/min", 3)]}}, store="redis", redis=url, redis_timeout="5s")
        m.wait_metric("smockron_master_redis_up", predicate=lambda v: v == 1, timeout=10)
        self.assertIn(f"127.0.0.1:{primary.port}", m.get("/readyz").body)
        gk = self.closing(m.gatekeeper(["api"]))
        self.fill(gk, "api", "before")
        self.wait_written(m)
        wait_until(lambda: replica.command("GET", key("api", "before")) is not None, 10,
                   message="the state reached the replica")

        # Kill the primary; keep deciding (one identifier filled every 50 ms)
        # until the master is connected to the promoted replica.
        primary.kill()
        killed = time.monotonic()
        worst, n = 0.0, 0
        while True:
            t = time.monotonic()
            self.fill(gk, "api", f"during{n}")
            worst = max(worst, time.monotonic() - t)
            n += 1
            body = m.get("/readyz").body
            if f"127.0.0.1:{replica.port}" in body and "connected" in body:
                break
            self.assertLess(time.monotonic() - killed, 60, f"no failover followed: {body}")
            time.sleep(0.05)
        followed = time.monotonic() - killed
        self.assertEqual(sentinels[0].primary(), ("127.0.0.1", replica.port))
        self.assertLess(worst, 2.5, f"a decision took {worst:.3f}s during the failover (redis_timeout 5s)")
        self.fill(gk, "api", "after")
        self.wait_written(m, timeout=10)
        print(f"\nfailover: master on the new primary {followed:.2f}s after the kill; "
              f"{n} decisions meanwhile, the slowest {worst * 1000:.1f} ms", file=sys.stderr)

        # What the old primary had (replicated), what was decided while there was
        # none (rewritten from memory), and what came after: all in the new primary.
        m = self.restart_master(m, signal.SIGKILL)
        m.wait_metric("smockron_master_redis_loaded_total", predicate=lambda v: v >= n + 2, timeout=10)
        gk.close()
        gk = self.closing(m.gatekeeper(["api"]))
        for identifier in ("before", "during0", f"during{n - 1}", "after"):
            self.assert_limited(gk, "api", identifier)


if __name__ == "__main__":
    unittest.main()
