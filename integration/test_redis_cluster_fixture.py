"""lib/redis_cluster.py's RedisCluster and RespClient against Debian's
redis-server: a real 3 primary + 3 replica cluster on 127.0.0.1, its slot map,
MOVED replies, a primary crash with the cluster's own failover, the crashed
node's return as a replica, a graceful failover back, and a stop that leaves
no process behind. Needs none of the project's binaries.

Run: python3 integration/test_redis_cluster_fixture.py -v
"""
from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.ports import HOST  # noqa: E402
from lib.redis_cluster import SLOTS, RedisCluster, RedisError, crc16, key_slot  # noqa: E402

# Keys whose slot we compute and Redis confirms: hash tags by Redis's rules (the
# first "{" and the first "}" after it; an empty tag hashes the whole key) and
# binary bytes, as in Smockron's keys (domain \0 identifier).
SLOT_KEYS = [
    "foo", "", "{user1000}.following", "{user1000}.followers", "foo{}{bar}", "foo{{bar}}zap",
    "foo{bar}{zap}", "{}", "}{", "{a", "a}", "{", b"smockron:{api\x00user-1}", b"smockron:{api\x00user-1}:hits",
    b"smockron:api\x00user-1", b"\xff\xfe\x00\r\n", "caf\u00e9", b"{\x00}",
]


def tmp_dir_cleanup(path: str) -> None:
    if os.environ.get("SMOCKRON_KEEP_TMP"):
        sys.stderr.write(f"\nkept {path}\n")
    else:
        shutil.rmtree(path, ignore_errors=True)


def dump_logs(cluster: RedisCluster) -> None:
    for port, path in cluster.log_paths().items():
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        sys.stderr.write(f"\n----- redis-server {port} log {path} -----\n{text[-4000:]}")


def processes_in(directory: str) -> list[int]:
    """PIDs of the processes whose working directory is `directory` (redis-server
    chdirs to its --dir, and rewrites its command line, so that is no help)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") == os.path.realpath(directory):
                pids.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return pids


class RedisClusterFixtureTest(unittest.TestCase):
    """One cluster for the class: each test reads the topology as it is, and the
    failover test leaves the same primaries serving the same slots."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="smockron-rc-")
        cls.cluster = RedisCluster(cls.tmp, primaries=3, replicas_per_primary=1, node_timeout_ms=1000)
        try:
            cls.cluster.start()
        except BaseException:
            dump_logs(cls.cluster)
            tmp_dir_cleanup(cls.tmp)
            raise
        cls.initial_primaries = cls.cluster.primaries()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        tmp_dir_cleanup(cls.tmp)

    def test_every_node_ok_and_all_slots_covered_once(self):
        c = self.cluster
        self.assertEqual(len(c.seeds), 6)
        ports = [int(s.rsplit(":", 1)[1]) for s in c.seeds]
        for port in ports:
            info = c.command(port, "CLUSTER", "INFO").decode()
            for line in ("cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384",
                         "cluster_known_nodes:6", "cluster_size:3"):
                self.assertIn(line + "\r\n", info, f"127.0.0.1:{port}")
        primaries = c.primaries()
        self.assertEqual(len(primaries), 3)
        self.assertEqual(c.url, "redis-cluster://" + ",".join(f"{HOST}:{p}" for p in self.initial_primaries))
        self.assertEqual(sorted(primaries), sorted(self.initial_primaries))
        covered = [slot for p in primaries for start, end in c.slots_of(p) for slot in range(start, end + 1)]
        self.assertEqual(sorted(covered), list(range(SLOTS)))  # every slot, exactly once
        replicas = [c.replica_of(p) for p in primaries]
        self.assertEqual(sorted(primaries + replicas), sorted(ports))
        for p, r in zip(primaries, replicas):
            self.assertEqual(c.primary_of(r), p)
            self.assertIsNone(c.primary_of(p))
            role = c.command(r, "ROLE")
            self.assertEqual((role[0], int(role[2]), role[3]), (b"slave", p, b"connected"))

    def test_key_slot_matches_cluster_keyslot(self):
        self.assertEqual(crc16(b"123456789"), 0x31C3)  # the XMODEM check value
        self.assertEqual(key_slot("foo"), 12182)      # Redis's documentation example
        c = self.cluster
        with c.client(c.primaries()[0]) as conn:
            for key in SLOT_KEYS:
                slot = key_slot(key)
                self.assertEqual(slot, conn.command("CLUSTER", "KEYSLOT", key), repr(key))
                owner = c.node_for_key(key)
                self.assertTrue(any(s <= slot <= e for s, e in c.slots_of(owner)), repr(key))
        self.assertEqual(key_slot(b"smockron:{api\x00user-1}"), key_slot(b"api\x00user-1"))
        self.assertEqual(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS)
        self.assertEqual(key_slot("foo{{bar}}zap"), key_slot("{bar"))

    def test_moved_then_write_on_the_right_node(self):
        c = self.cluster
        keys = {b"fixture:a": b"1", b"fixture:b": b"2", b"fixture:{t}:1": b"3", b"fixture:{t}:2": b"4",
                b"fixture:smockron:{api\x00user-1}": b"\x00\xff bin\r\nary", "fixture:caf\u00e9".encode(): b""}
        primaries = c.primaries()
        before = sum(c.command(p, "DBSIZE") for p in primaries)
        for key, value in keys.items():
            right = c.node_for_key(key)
            wrong = next(p for p in primaries if p != right)
            with c.client(wrong) as conn, self.assertRaises(RedisError) as caught:
                conn.command("SET", key, value)
            self.assertEqual(caught.exception.kind, "MOVED")
            self.assertEqual(caught.exception.redirect, (key_slot(key), HOST, right))
            self.assertEqual(caught.exception.message, f"MOVED {key_slot(key)} {HOST}:{right}")
            with c.client(right) as conn:  # following the redirect once
                self.assertEqual(conn.command("SET", key, value), "OK")
                self.assertEqual(conn.command("GET", key), value)
                self.assertEqual(conn.command("WAIT", 1, 2000), 1)  # its replica has it too
            with c.client(c.replica_of(right)) as conn:
                with self.assertRaises(RedisError) as caught:
                    conn.command("GET", key)  # a replica redirects to its primary...
                self.assertEqual(caught.exception.redirect, (key_slot(key), HOST, right))
                self.assertEqual(conn.command("READONLY"), "OK")
                self.assertEqual(conn.command("GET", key), value)  # ...unless asked to read
        found = c.keys_everywhere("fixture:*")
        self.assertEqual(found, keys)
        self.assertEqual(sum(c.command(p, "DBSIZE") for p in primaries), before + len(keys))  # nowhere else

    def test_resp_reply_types(self):
        c = self.cluster
        port = c.node_for_key("{resp}")
        with c.client(port) as conn:
            self.assertEqual(conn.command("PING"), "PONG")                          # simple string
            self.assertEqual(conn.command("SET", "{resp}:n", 41), "OK")
            self.assertEqual(conn.command("INCR", "{resp}:n"), 42)                  # integer
            self.assertIsNone(conn.command("GET", "{resp}:missing"))                # nil bulk
            self.assertEqual(conn.command("RPUSH", b"{resp}:l", b"a\r\nb", b"", b"\x00"), 3)
            self.assertEqual(conn.command("LRANGE", "{resp}:l", 0, -1), [b"a\r\nb", b"", b"\x00"])  # array
            self.assertEqual(conn.command("MGET", "{resp}:n", "{resp}:missing"), [b"42", None])
            self.assertEqual(conn.command("LRANGE", "{resp}:none", 0, -1), [])
            self.assertIsNone(conn.command("BLPOP", "{resp}:none", "0.01"))       # nil array
            with self.assertRaises(RedisError) as caught:
                conn.command("GET", "{resp}:l")
            self.assertEqual(caught.exception.kind, "WRONGTYPE")
            with self.assertRaises(RedisError) as caught:
                conn.command("NO-SUCH-COMMAND")
            self.assertEqual(caught.exception.kind, "ERR")
            self.assertEqual(conn.command("MULTI"), "OK")
            self.assertEqual(conn.command("INCR", "{resp}:n"), "QUEUED")
            self.assertEqual(conn.command("INCR", "{resp}:l"), "QUEUED")
            done = conn.command("EXEC")                                             # an error inside an array
            self.assertEqual(done[0], 43)
            self.assertIsInstance(done[1], RedisError)
            self.assertEqual(done[1].kind, "WRONGTYPE")
            self.assertEqual(conn.command("PING"), "PONG")  # the connection is still in step

    def test_failover_restart_and_manual_failover(self):
        c = self.cluster
        key = b"smockron:{api\x00user-1}"
        victim = c.node_for_key(key)
        victim_slots = c.slots_of(victim)
        replica = c.replica_of(victim)
        with c.client(victim) as conn:
            conn.command("SET", key, b"before")
            self.assertEqual(conn.command("WAIT", 1, 2000), 1)  # on the replica before the crash

        t0 = time.monotonic()
        self.assertEqual(c.kill_primary(victim), replica)
        promoted = c.wait_failover(victim, timeout=20)
        failover_s = time.monotonic() - t0
        self.assertEqual(promoted, replica)
        self.assertEqual(c.slots_of(replica), victim_slots)
        self.assertNotIn(victim, c.primaries())
        self.assertEqual(len(c.primaries()), 3)
        self.assertEqual(c.node_for_key(key), replica)
        with self.assertRaises(ConnectionRefusedError):
            c.client(victim).close()
        for port in c.live_ports():
            self.assertIn(b"cluster_state:ok\r\n", c.command(port, "CLUSTER", "INFO"))
            self.assertNotIn(victim, [p for _, _, primary, replicas in c.slot_map(port) for p in (primary, *replicas)])
        with c.client(replica) as conn:
            self.assertEqual(conn.command("GET", key), b"before")  # it survived the crash
            self.assertEqual(conn.command("SET", key, b"after"), "OK")
        other = next(p for p in c.primaries() if p != replica)
        with c.client(other) as conn, self.assertRaises(RedisError) as caught:
            conn.command("GET", key)
        self.assertEqual(caught.exception.redirect, (key_slot(key), HOST, replica))

        t0 = time.monotonic()
        c.restart(victim)
        restart_s = time.monotonic() - t0
        self.assertEqual(c.primary_of(victim), replica)  # back as a replica of the promoted node
        self.assertEqual(c.replica_of(replica), victim)
        self.assertEqual(c.slots_of(replica), victim_slots)
        self.assertEqual(c.command(replica, "WAIT", 1, 2000), 1)
        with c.client(victim) as conn:
            role = conn.command("ROLE")
            self.assertEqual((role[0], int(role[2]), role[3]), (b"slave", replica, b"connected"))
            conn.command("READONLY")
            self.assertEqual(conn.command("GET", key), b"after")  # it synced from the new primary

        t0 = time.monotonic()
        self.assertEqual(c.failover_manual(victim), replica)
        manual_s = time.monotonic() - t0
        self.assertEqual(c.slots_of(victim), victim_slots)
        self.assertEqual(c.primary_of(replica), victim)
        self.assertEqual(sorted(c.primaries()), sorted(self.initial_primaries))
        self.assertEqual(c.command(victim, "GET", key), b"after")
        sys.stderr.write(f"[start {c.start_seconds:.2f}s, failover {failover_s:.2f}s, restart {restart_s:.2f}s, "
                         f"manual failover {manual_s:.2f}s] ")


class RedisClusterStopTest(unittest.TestCase):
    def test_stop_leaves_no_process(self):
        tmp = tempfile.mkdtemp(prefix="smockron-rc-")
        self.addCleanup(tmp_dir_cleanup, tmp)
        cluster = RedisCluster(tmp)
        self.addCleanup(cluster.stop)
        with cluster:
            self.assertEqual(len(processes_in(tmp)), 6)
            replica = cluster.replica_of(cluster.primaries()[0])
            cluster.kill(replica)  # a replica: no failover, it just comes back
            cluster.restart(replica)
            self.assertEqual(len(processes_in(tmp)), 6)
            pids = [pid for node in cluster.nodes for pid in node.pids]
            self.assertEqual(len(pids), 7)
            ports = cluster.live_ports()
        self.assertEqual(processes_in(tmp), [])
        for pid in pids:
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)
        for port in ports:
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection((HOST, port), timeout=1).close()
        cluster.stop()  # again: a no-op


if __name__ == "__main__":
    unittest.main()
