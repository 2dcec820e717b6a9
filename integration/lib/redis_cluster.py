"""A real Redis Cluster for tests: N primaries with M replicas each, every node a
RedisServer on fresh 127.0.0.1 ports (client and cluster bus), created with
`redis-cli --cluster create`, stopped by PID. Failures are real: kill_primary()
SIGKILLs a process and wait_failover() waits for the cluster's own election;
restart() brings the node back on its port with its cluster config file.

The topology is never assumed: redis-cli chooses which node replicates which,
and a failover changes it, so every question (primaries, replica_of, slots_of,
node_for_key) is answered from CLUSTER SLOTS of a live node at that moment.
Waits end when every live node agrees (see wait_settled()).

Queries go through RespClient, a small RESP2 client of our own (redis-py is not
installed), which also serves the tests: error replies raise RedisError with
Redis's message, so MOVED / ASK / CLUSTERDOWN reach the test as they are.

    with RedisCluster(tmp) as cluster:
        ... our client configured with cluster.url ...
        old = cluster.node_for_key(b"k")
        replica = cluster.kill_primary(old)
        assert cluster.wait_failover(old) == replica
        cluster.restart(old)                  # back as a replica of `replica`
"""
from __future__ import annotations

import os
import socket
import subprocess
import time

from lib.daemons import stop_process
from lib.ports import HOST, OwnsSocket, free_ports
from lib.redis_server import RedisError, RedisServer, encode_command, read_reply  # noqa: F401 (RedisError: for importers)
from lib.timing import TRANSIENT_ERRORS, WaitTimeout, wait_until

SLOTS = 16384


class RespClient(OwnsSocket):
    """One connection to 127.0.0.1:`port` speaking RESP2, binary-safe. Replies:
    simple string -> str, bulk -> bytes (None for nil), integer -> int, array ->
    list (None for a nil array); an error reply raises RedisError (inside an
    array, e.g. EXEC's, it is an element instead). No redirection is followed:
    a test sees MOVED and decides."""

    def __init__(self, port: int, host: str = HOST, timeout: float = 5.0):
        self.port = port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self._reader = self.sock.makefile("rb")

    def command(self, *args):
        self.sock.sendall(encode_command(*args))
        reply = read_reply(self._reader)
        if isinstance(reply, RedisError):
            raise reply
        return reply

    def close(self) -> None:
        self._reader.close()
        super().close()


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-XMODEM (poly 0x1021, init 0), Redis Cluster's key hash: crc16(b"123456789") == 0x31C3."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ b) & 0xFF]
    return crc


def key_slot(key: bytes | str) -> int:
    """The key's hash slot as Redis computes it: only the part between the first
    "{" and the first "}" after it is hashed, if that part is not empty."""
    if isinstance(key, str):
        key = key.encode()
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc16(key) % SLOTS


# One agreed slot map: (start, end, primary port, replica ports) sorted by start.
SlotMap = list[tuple[int, int, int, tuple[int, ...]]]


class ClusterNode(RedisServer):
    """A redis-server with cluster mode on: a fresh client port and cluster bus
    port (the default bus port, port + 10000, may be past 65535 for an ephemeral
    port), its own cluster config file in the workdir, named after the port."""

    def __init__(self, workdir: str, node_timeout_ms: int):
        super().__init__(workdir)
        self.node_timeout_ms = node_timeout_ms
        self.bus_port = 0
        self.config_file = ""
        self.pids: list[int] = []  # every process this node has been, for "none left" checks

    def _start_once(self, timeout: float) -> bool:
        if not self.fixed_port:  # a first start: a fresh bus port and config file too
            self.bus_port = next(p for p in free_ports(2) if p != self.port)
            self.config_file = os.path.join(self.workdir, f"nodes-{self.port}.conf")
            if os.path.exists(self.config_file):  # left by an earlier cluster in this workdir
                os.remove(self.config_file)
        # RedisServer already passes --save "" --appendonly no (no persistence).
        self.extra_args = [
            "--cluster-enabled", "yes", "--cluster-config-file", self.config_file,
            "--cluster-port", str(self.bus_port), "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica always runs for election, however long ago it last heard its
            # primary: tests kill nodes in quick succession.
            "--cluster-replica-validity-factor", "0",
            # SIGTERM exits at once instead of waiting up to 10 s for lagging replicas.
            "--shutdown-timeout", "0",
            # A replica's full sync starts at once, not after the default 5 s wait for
            # more replicas to share the transfer.
            "--repl-diskless-sync-delay", "0",
            # CLUSTER SLOTS leaves out a replica whose replication offset is still 0, and
            # without writes the offset moves with the primary's pings: every second,
            # not every 10 s, so a fresh replica shows up within a second or two.
            "--repl-ping-replica-period", "1",
        ]
        started = super()._start_once(timeout)
        if self.proc is not None:
            self.pids.append(self.proc.pid)
        return started

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class RedisCluster:
    """`primaries` primaries with `replicas_per_primary` replicas each on 127.0.0.1.

    seeds / url name the nodes as started; everything else is asked of the live
    cluster when called. Stopped by PID (stop(), also a context manager).
    """

    def __init__(self, workdir: str, primaries: int = 3, replicas_per_primary: int = 1,
                 node_timeout_ms: int = 1000):
        if primaries < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 primaries")
        self.workdir = workdir
        self.primaries_wanted = primaries
        self.replicas_per_primary = replicas_per_primary
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[ClusterNode] = []
        self._initial_primaries: list[int] = []
        self._map: SlotMap = []  # the last map every live node agreed on
        self.start_seconds = 0.0  # how long start() took

    # ----- lifecycle -----

    def start(self, timeout: float = 60.0) -> "RedisCluster":
        """Starts the nodes, creates the cluster and waits until every node says
        cluster_state:ok, agrees on all 16384 slots and every replica is in sync.
        Stops what it started if anything fails."""
        if self.nodes:
            raise AssertionError("this RedisCluster was started already")
        t0 = time.monotonic()
        try:
            n = self.primaries_wanted * (1 + self.replicas_per_primary)
            for _ in range(n):
                node = ClusterNode(self.workdir, self.node_timeout_ms)
                self.nodes.append(node)
                node.start()
                node.fixed_port = node.port  # from now on (restart) the same ports
            self._create(timeout)
            self.wait_settled(max(1.0, timeout - (time.monotonic() - t0)), "the new cluster")
            self._initial_primaries = [primary for _, _, primary, _ in self._map]
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _create(self, timeout: float) -> None:
        cmd = ["redis-cli", "--cluster", "create", *self.seeds,
               "--cluster-replicas", str(self.replicas_per_primary), "--cluster-yes"]
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"redis-cli --cluster create still running after {timeout}s: "
                                 f"{_text(e.stdout)}{_text(e.stderr)}") from None
        out = _text(r.stdout) + _text(r.stderr)
        if r.returncode != 0 or "All 16384 slots covered" not in out:
            raise AssertionError(f"redis-cli --cluster create failed ({r.returncode}):\n{out}")

    def stop(self) -> None:
        """SIGTERM to every live node at once, then each reaped (SIGKILL after 5 s).
        Idempotent: usable as a cleanup whatever state the cluster is in."""
        for node in self.nodes:
            if node.alive():
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is not None:
                stop_process(node.proc)

    close = stop

    def __enter__(self) -> "RedisCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----- names -----

    @property
    def seeds(self) -> list[str]:
        """Every node as "127.0.0.1:port", in start order."""
        return [f"{HOST}:{node.port}" for node in self.nodes]

    @property
    def url(self) -> str:
        """redis-cluster://127.0.0.1:p1,... naming the primaries the cluster started with."""
        return "redis-cluster://" + ",".join(f"{HOST}:{p}" for p in self._initial_primaries)

    def node(self, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node of this cluster on port {port}")

    def live_ports(self) -> list[int]:
        return [node.port for node in self.nodes if node.alive()]

    def log_paths(self) -> dict[int, str]:
        return {node.port: node.log_path for node in self.nodes}

    # ----- clients -----

    def client(self, port: int, timeout: float = 5.0) -> RespClient:
        """A new connection to the node on `port` (close it, or use `with`)."""
        return RespClient(port, timeout=timeout)

    def command(self, port: int, *args, timeout: float = 5.0):
        """One command on its own connection to the node on `port`."""
        with self.client(port, timeout) as c:
            return c.command(*args)

    def keys_everywhere(self, pattern: str | bytes = "*") -> dict[bytes, bytes | None]:
        """key -> value (GET) of every key matching `pattern` on every current
        primary (SCAN on each node, so a key in the wrong node shows up too)."""
        found: dict[bytes, bytes | None] = {}
        for port in self.primaries():
            with self.client(port) as c:
                cursor = b"0"
                while True:
                    cursor, keys = c.command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                    for key in keys:
                        found[key] = c.command("GET", key)
                    if cursor == b"0":
                        break
        return found

    # ----- topology, as a live node sees it now -----

    def slot_map(self, port: int | None = None) -> SlotMap:
        """CLUSTER SLOTS of the node on `port`, or of the first live node that answers."""
        if port is not None:
            with self.client(port) as c:
                return _slot_map(c.command("CLUSTER", "SLOTS"))
        last: BaseException | None = None
        for p in self.live_ports():
            try:
                return self.slot_map(p)
            except OSError as e:
                last = e
        raise AssertionError(f"no node of the cluster answers CLUSTER SLOTS (last error: {last!r})")

    def primaries(self) -> list[int]:
        """Ports of the nodes serving slots now, in slot order."""
        ports: list[int] = []
        for _, _, primary, _ in self.slot_map():
            if primary not in ports:
                ports.append(primary)
        return ports

    def slots_of(self, port: int) -> list[tuple[int, int]]:
        """(start, end) slot ranges, inclusive, the primary on `port` serves now."""
        return [(start, end) for start, end, primary, _ in self.slot_map() if primary == port]

    def replicas_of(self, port: int) -> list[int]:
        """Ports of the (non-failed) replicas of the primary on `port`."""
        for _, _, primary, replicas in self.slot_map():
            if primary == port:
                return list(replicas)
        raise AssertionError(f"127.0.0.1:{port} serves no slots (primaries now: {self.primaries()})")

    def replica_of(self, port: int) -> int:
        """A replica's port of the primary on `port` (the first CLUSTER SLOTS names)."""
        replicas = self.replicas_of(port)
        if not replicas:
            raise AssertionError(f"primary 127.0.0.1:{port} has no replica")
        return replicas[0]

    def primary_of(self, port: int) -> int | None:
        """The port of the primary the replica on `port` replicates; None if it is a primary."""
        for _, _, primary, replicas in self.slot_map():
            if port in replicas:
                return primary
            if primary == port:
                return None
        raise AssertionError(f"127.0.0.1:{port} is neither a primary nor a live replica")

    def node_for_key(self, key: bytes | str) -> int:
        """The port of the primary serving the key's slot now."""
        slot = key_slot(key)
        for start, end, primary, _ in self.slot_map():
            if start <= slot <= end:
                return primary
        raise AssertionError(f"slot {slot} is not served")

    # ----- convergence -----

    def _agreed_map(self) -> SlotMap | None:
        """The slot map if the live nodes have settled, else None: every live node
        says cluster_state:ok with 16384 slots ok, returns the same CLUSTER SLOTS,
        which covers every slot once and names every live node, and every replica's
        link to its primary is up (ROLE "connected")."""
        live = self.live_ports()
        maps = []
        for port in live:
            with self.client(port, timeout=2.0) as c:
                info = _info(c.command("CLUSTER", "INFO"))
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                    return None
                maps.append(_slot_map(c.command("CLUSTER", "SLOTS")))
                role = c.command("ROLE")
                if role[0] == b"slave" and role[3] != b"connected":
                    return None
        if not maps or any(m != maps[0] for m in maps):
            return None
        agreed = maps[0]
        if [(s, e) for s, e, _, _ in agreed] != _contiguous(agreed):
            return None
        named = sorted(p for _, _, primary, replicas in agreed for p in {primary, *replicas})
        return agreed if named == sorted(live) else None

    def wait_settled(self, timeout: float = 20.0, what: str = "the cluster") -> SlotMap:
        """Waits until the live nodes agree (see _agreed_map); returns the agreed map."""
        try:
            self._map = wait_until(self._agreed_map, timeout, interval=0.05,
                                   message=f"{what} to settle (all live nodes ok and in agreement)",
                                   retry_on=(*TRANSIENT_ERRORS, RedisError))
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}\nlive nodes' CLUSTER NODES:\n{self._describe()}"
                              f"logs: {self.log_paths()}") from e
        return self._map

    def _describe(self) -> str:
        lines = []
        for port in self.live_ports():
            try:
                lines.append(f"{port}:\n{_text(self.command(port, 'CLUSTER', 'NODES', timeout=1.0))}")
            except (OSError, RedisError) as e:
                lines.append(f"{port}: {e!r}\n")
        return "".join(lines)

    # ----- failures -----

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port` (a crash: no shutdown, nothing saved)."""
        self.node(port).kill()

    def kill_primary(self, port: int) -> int:
        """SIGKILLs the primary on `port`; returns the port of its replica (of the
        first, with several: the cluster elects which one is promoted)."""
        self._map = self.slot_map()  # its slots, for wait_failover
        replica = self.replica_of(port)
        self.kill(port)
        return replica

    def wait_failover(self, old_port: int, timeout: float = 20.0) -> int:
        """Waits until a replica of the dead primary `old_port` is promoted: the
        survivors settled, CLUSTER SLOTS no longer naming old_port. Returns the
        port of the primary now serving old_port's slots."""
        old_slots = [start for start, _, primary, _ in self._map if primary == old_port]
        if not old_slots:
            raise AssertionError(f"127.0.0.1:{old_port} served no slots when last seen")

        def promoted():
            agreed = self._agreed_map()
            if agreed is None or any(old_port in (primary, *replicas) for _, _, primary, replicas in agreed):
                return None
            return agreed

        try:
            self._map = wait_until(promoted, timeout, interval=0.05,
                                   message=f"a replica of 127.0.0.1:{old_port} promoted",
                                   retry_on=(*TRANSIENT_ERRORS, RedisError))
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}\nlive nodes' CLUSTER NODES:\n{self._describe()}") from e
        return next(primary for start, _, primary, _ in self._map if start == old_slots[0])

    def failover_manual(self, replica_port: int, timeout: float = 20.0) -> int:
        """CLUSTER FAILOVER on the replica (graceful: its primary pauses writes until
        it has caught up); waits until it is the primary of those slots and every
        live node agrees. Returns the former primary's port."""
        old = self.primary_of(replica_port)
        if old is None:
            raise AssertionError(f"127.0.0.1:{replica_port} is a primary already")
        old_ranges = self.slots_of(old)
        self.command(replica_port, "CLUSTER", "FAILOVER")

        def taken_over():
            agreed = self._agreed_map()
            if agreed is None:
                return None
            mine = [(s, e) for s, e, primary, _ in agreed if primary == replica_port]
            return agreed if mine == old_ranges else None

        self._map = wait_until(taken_over, timeout, interval=0.05,
                               message=f"127.0.0.1:{replica_port} primary of {old_ranges}",
                               retry_on=(*TRANSIENT_ERRORS, RedisError))
        return old

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Starts the killed node on `port` again, with its cluster config file: it
        comes back as the node it was and the cluster tells it what it is now (a
        replica of the node that took its slots). Waits until all live nodes,
        it included, have settled."""
        node = self.node(port)
        if node.alive():
            raise AssertionError(f"127.0.0.1:{port} is running")
        node.start()
        self.wait_settled(timeout, f"the cluster with 127.0.0.1:{port} back")


def _slot_map(reply) -> SlotMap:
    # Each entry: [start, end, [ip, port, id, ...] of the primary, then of each replica].
    return sorted((int(entry[0]), int(entry[1]), int(entry[2][1]), tuple(sorted(int(n[1]) for n in entry[3:])))
                  for entry in reply)


def _contiguous(slot_map: SlotMap) -> list[tuple[int, int]]:
    """The ranges slot_map should have to cover 0..16383 once, given where each starts."""
    starts = [s for s, _, _, _ in slot_map]
    if not starts or starts[0] != 0:
        return []
    return [(s, e - 1) for s, e in zip(starts, starts[1:] + [SLOTS])]


def _info(reply: bytes) -> dict[str, str]:
    return dict(line.split(":", 1) for line in _text(reply).splitlines() if ":" in line)


def _text(data) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else (data or "")
