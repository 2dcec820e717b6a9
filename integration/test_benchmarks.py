"""Benchmarks never rot: every benchmark in integration/bench/ runs here in its
smoke mode (a second or a few, tiny counts, the whole path: both contenders
where there is a peer such as nginx), as a subprocess bounded in time. Each
test asserts exit status 0, that the output carries the benchmark's figures,
and that the benchmark left no process behind (its own process group).

Nothing here depends on the machine's speed: the benchmarks' smoke modes check
that things ran and were seen (requests answered, accounting processed,
decisions found in the access logs, held requests dropped), never a
throughput; the one bound is held_memory's RSS per held request (8 KiB, with
~5.5-7 KiB measured).

Skipped only when a benchmark binary is not built (SMOCKRON_BENCHMARKS=OFF)
or a peer program (nginx, wrk) is missing: scripts/install-deps.sh --test
installs both. The daemons themselves must be built (as for every other test).

Run: cd integration && python3 -m unittest -v test_benchmarks
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import lib.daemons
from lib.daemons import binary

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "bench")

#: Bound of one benchmark's smoke run (they take 1-15 s on a 2-core machine).
TIMEOUT = 60.0


def tool(name: str) -> str | None:
    """Path of a peer program, or None (nginx lives in /usr/sbin, often outside PATH)."""
    return shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)


def group_members(pgid: int) -> list[str]:
    """Live (non-zombie) processes of process group `pgid`: 'pid command' each."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            out.append(f"{entry} {comm}")
    return out


class BenchmarkSmokeTest(unittest.TestCase):
    def bench_binary(self, name: str) -> str:
        path = os.path.join(lib.daemons.BIN_DIR, name)
        if not os.access(path, os.X_OK):
            self.skipTest(f"{path} is not built (SMOCKRON_BENCHMARKS=OFF?)")
        return path

    def need(self, *tools: str) -> None:
        missing = [t for t in tools if tool(t) is None]
        if missing:
            self.skipTest(f"{', '.join(missing)} missing (scripts/install-deps.sh --test installs them)")

    def run_bench(self, argv: list[str], timeout: float = TIMEOUT, daemons: bool = True) -> str:
        """Runs argv in its own process group (cwd a temp dir), bounded by `timeout`; asserts exit
        status 0 and that nothing of its group outlives it. Returns stdout + stderr.
        daemons: it runs smockron-master and smockron-proxy, which must be built (a failure, never a skip)."""
        if daemons:
            for name in ("smockron-master", "smockron-proxy"):
                binary(name)
        tmp = tempfile.mkdtemp(prefix="smockron-bench-smoke-")
        self.addCleanup(shutil.rmtree, tmp, True)
        env = dict(os.environ, SMOCKRON_BIN_DIR=lib.daemons.BIN_DIR)
        # Output to a file, not a pipe: a process left behind holding the pipe would stall the read.
        out_path = os.path.join(tmp, "output.txt")
        t0 = time.monotonic()
        with open(out_path, "w") as out_file:
            proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out_file,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)  # the benchmarks stop what they started on SIGTERM
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        took = time.monotonic() - t0
        sys.stderr.write(f"[{os.path.basename(argv[1] if argv[0] == sys.executable else argv[0])}: {took:.1f} s] ")
        # Whatever it started must be gone with it (stopped by PID, waited for).
        deadline = time.monotonic() + 5
        while (left := group_members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with open(out_path, errors="replace") as f:
            out = f.read()
        shown = out[-6000:]
        self.assertFalse(timed_out, f"{' '.join(argv)} still running after {timeout:g} s; output:\n{shown}")
        self.assertEqual(proc.returncode, 0, f"{' '.join(argv)} exited with {proc.returncode}; output:\n{shown}")
        self.assertEqual(left, [], f"{' '.join(argv)} left processes behind; output:\n{shown}")
        return out

    def assert_figures(self, out: str, *patterns: str) -> list[re.Match]:
        """Every regex in `patterns` matches the output (the benchmark printed that figure)."""
        found = []
        for p in patterns:
            m = re.search(p, out, re.MULTILINE)
            self.assertIsNotNone(m, f"no figure matching {p!r} in the output:\n{out[-6000:]}")
            found.append(m)
        return found

    # ------------------------------------------------------------------ Python benchmarks

    def test_proxy_bench(self):
        """smockron-proxy vs nginx (and the same proxy with CURVE links, and refusing every
        request without and with traces): all answered every request (2xx; the refusing ones
        5xx); the gate's accounting was published and processed by the masters; spans exported."""
        self.need("nginx", "wrk", "taskset")
        plot = os.path.join(tempfile.mkdtemp(prefix="smockron-plot-"), "proxy_vs_nginx.png")
        self.addCleanup(shutil.rmtree, os.path.dirname(plot), True)
        out = self.run_bench([sys.executable, os.path.join(BENCH, "proxy_bench.py"), "--smoke", "--plot", plot,
                              "--curve", "--traces"])
        self.assert_figures(out, r"^\s*0\s+curve\s+\d+ ", r"^cpu us/req curve/smockron: [\d.]+ \(goal <= 1.05\)",
                            r"^\s*0\s+traced\s+\d+ ", r"^cpu us/req traced/refused: [\d.]+ \(goal <= 1.05\)",
                            r"^traced: [1-9]\d* spans exported")
        with open(plot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", "the plot is a PNG")
        self.assert_figures(out, r"^\s*0\s+smockron\s+\d+ ", r"^\s*0\s+nginx\s+\d+ ", r"^plot: .*proxy_vs_nginx\.png",
                            r"^ smockron: median \d+ req/s, p50 \d+ us, p99 \d+ us, cpu [\d.]+ us/req",
                            r"^\s+nginx: median \d+ req/s, p50 \d+ us, p99 \d+ us, cpu [\d.]+ us/req",
                            r"^accounting: [1-9]\d* requests in smockron and curve rounds, [1-9]\d* messages published, "
                            r"\d+ dropped, \d+ unsent, [1-9]\d* processed by the master",
                            r"^smoke: OK")

    def test_tls_bench(self):
        """smockron-proxy vs nginx over TLS: both negotiate TLS and answer every request of the
        keep-alive and the handshake load; a connection per request in the handshake load."""
        self.need("nginx", "wrk", "taskset", "openssl")
        out = self.run_bench([sys.executable, os.path.join(BENCH, "tls_bench.py"), "--smoke"])
        self.assert_figures(out, r"^ smockron: TLSv1\.[23] \S+, ", r"^\s+nginx: TLSv1\.[23] \S+, ",
                            r"^keep-alive \(", r"^handshake \(",
                            r"^ smockron: median \d+ req/s, p50 \d+ us",
                            r"^\s+nginx: median \d+ req/s, p50 \d+ us",
                            r"^ smockron: median \d+ handshakes/s, .* [\d.]+ us/handshake",
                            r"^\s+nginx: median \d+ handshakes/s, .* [\d.]+ us/handshake",
                            r"^smoke: OK")

    def test_h2_bench(self):
        """smockron-proxy vs nginx over HTTP/2 (h2load): both select h2 by ALPN, speak h2 over TLS
        and h2c with prior knowledge, answer every request 2xx; the accounting reached the master."""
        self.need("nginx", "h2load", "taskset", "openssl")
        out = self.run_bench([sys.executable, os.path.join(BENCH, "h2_bench.py"), "--smoke"])
        self.assert_figures(out, r"^ smockron: TLSv1\.[23] \S+, ALPN h2$", r"^\s+nginx: TLSv1\.[23] \S+, ALPN h2$",
                            r"^\s*0\s+h2\s+smockron\s+\d+ ", r"^\s*0\s+h2\s+nginx\s+\d+ ",
                            r"^\s*0\s+h2c\s+smockron\s+\d+ ", r"^\s*0\s+h2c\s+nginx\s+\d+ ",
                            r"^h2 \(TLS\) \(", r"^h2c \(",
                            r"^ smockron: median \d+ req/s, mean \d+ us/request, cpu [\d.]+ us/req",
                            r"^\s+nginx: median \d+ req/s, mean \d+ us/request, cpu [\d.]+ us/req",
                            r"^accounting: [1-9]\d* requests in smockron rounds .*, [1-9]\d* HTTP/2 requests counted "
                            r"by the proxies, [1-9]\d* messages published, \d+ dropped, \d+ unsent, "
                            r"[1-9]\d* processed by the master",
                            r"^smoke: OK")

    def test_instructions(self):
        """Instructions per request under callgrind, HTTP/1.1 and h2c: every request answered 2xx
        and a count for each (the figure itself is not judged)."""
        self.need("nginx", "h2load", "valgrind")
        out = self.run_bench([sys.executable, os.path.join(BENCH, "instructions.py"), "--smoke", "--curve",
                              "--traces"])
        self.assert_figures(out, r"^ smockron\s+h1\s+[\d,]+  mean of 1$", r"^ smockron\s+h2c\s+[\d,]+  mean of 1$",
                            r"^    curve\s+h1\s+[\d,]+  mean of 1$", r"^ratio curve/smockron h1: [\d.]+",
                            r"^   traced\s+h1\s+[\d,]+  mean of 1$", r"^ratio traced/refused h2c: [\d.]+",
                            r"^smoke: OK")

    def test_held_memory(self):
        """2,000 requests held on their timers: RSS growth per held request at most 8 KiB, the
        held gauge reaches 2,000 and every one is dropped (not forwarded) on disconnect."""
        out = self.run_bench([sys.executable, os.path.join(BENCH, "held_memory.py"), "--smoke", "--held", "2000",
                              "--max-kib-per-held", "8"])
        self.assert_figures(out, r"proxy RSS before: [\d.]+ MiB, with 2000 held requests: [\d.]+ MiB, "
                                 r"delta -?[\d.]+ MiB \(-?\d+ bytes per held request\)",
                            r"RSS growth per held request -?[\d.]+ KiB, bound 8 KiB: PASS",
                            r"held gauge back to 0 in [\d.]+ s, forwarded none of them: 2000 drops counted",
                            r"^smoke: OK")

    def test_concurrency(self):
        """Two gatekeepers and two nginx nodes under a concurrency limit of 4: every phase ran, its
        figures printed, and smockron never let more than 4 of the key's requests through at once;
        three tenants under a shared limit of 6: the light one served, never more than 6 at once."""
        out = self.run_bench([sys.executable, os.path.join(BENCH, "concurrency.py"), "--smoke"])
        self.assert_figures(out, r"^\s+2\s+0ms \|\s+[\d.]+ \|\s+[\d.]+\s+[\d.]+\s+[0-4] \|\s+[\d.]+\s+[\d.]+\s+[0-4] \|"
                                 r"\s+\d+ms\s+\d+ms\s+[0-4] \|",
                            r"^    tenants \(shared 6, 3 s windows\): heavy-a \[\d+\] heavy-b \[\d+\] light \[[1-9]\d*\].* max [0-6]$",
                            r"^    rate tenants \(shared 60/s, 3 s windows\): heavy-a \[\d+\] heavy-b \[\d+\] "
                            r"light \[[1-9]\d*\].* served/capacity [\d.]+-[\d.]+$",
                            r"^limit held \(smockron never above N\): yes$")

    def test_aborts(self):
        """200 requests of a key under a concurrency limit aborted by their clients (HTTP/1.1 closes,
        HTTP/2 RST_STREAM): nothing stays in flight, the master's leases come back to 0, and the
        limit's slots all serve fresh requests at once."""
        out = self.run_bench([sys.executable, os.path.join(BENCH, "aborts.py"), "--smoke"])
        self.assert_figures(out, r"^aborts: 200 aborted \(100 HTTP/1.1, 100 HTTP/2\)",
                            r"^in flight and waiting at the gatekeepers back to 0 in: [\d.]+ s$",
                            r"^slots leased at the master back to 0 in: [\d.]+ s",
                            r"^most of the key at the backend at once: \d+ \(limit 4",
                            r"^no slot left taken: yes$")

    def test_master_memory(self):
        """2,000 identifiers of a domain with a 1,000,000-burst rate and a monthly quota: every one
        tracked, every message processed, and the master's RSS growth printed and bounded."""
        out = self.run_bench([sys.executable, os.path.join(BENCH, "master_memory.py"), "--smoke"])
        self.assert_figures(out, r"master RSS before: [\d.]+ MiB, with 2000 identifiers tracked: [\d.]+ MiB",
                            r"RSS growth -?[\d.]+ MiB, bound 200 MiB: PASS", r"^smoke: OK")

    def test_held_memory_http2(self):
        """2,000 HTTP/2 streams held on 20 connections: RSS growth per held stream at most 4 KiB
        (twice the goal: RSS moves in pages), every one dropped on disconnect."""
        out = self.run_bench([sys.executable, os.path.join(BENCH, "held_memory.py"), "--smoke", "--h2", "--held",
                              "2000", "--connections", "20", "--max-kib-per-held", "4"])
        self.assert_figures(out, r"proxy RSS before: [\d.]+ MiB, with 2000 held HTTP/2 streams on 20 connections: "
                                 r"[\d.]+ MiB, delta -?[\d.]+ MiB \(-?\d+ bytes per held request\)",
                            r"RSS growth per held request -?[\d.]+ KiB, bound 4 KiB: PASS",
                            r"held gauge back to 0 in [\d.]+ s, forwarded none of them: 2000 drops counted",
                            r"^smoke: OK")

    def test_accuracy(self):
        """Master, 2 gatekeepers behind the delay relay, sniffer, counting backend: every
        well-behaved request found in the access logs and accepted, never delayed; the hot
        client gated; accounting and DELAY_UNTIL sniffed; /metrics counting. Also weighted
        traffic (costs 1..100 from a request field, and from a response field): every cost
        reached the backend, and the master charged exactly the costs the gate let through."""
        plot = os.path.join(tempfile.mkdtemp(prefix="smockron-plot-"), "accuracy.png")
        self.addCleanup(shutil.rmtree, os.path.dirname(plot), True)
        out = self.run_bench([sys.executable, os.path.join(BENCH, "accuracy.py"), "--smoke", "--plot", plot])
        with open(plot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", "the plot is a PNG")
        self.assert_figures(out, r"^plot: .*accuracy\.png", r"^#### G = 2: master \+ 2 gatekeeper",
                            r"^== G=2  sliding-log: ", r"^== G=2  gcra: ",
                            r"^== G=2  weighted: .*cost header:X-Cost",
                            r"^== G=2  weighted-response: .*cost response_header:X-Tokens-Used",
                            r"^hot       : reached backend in \[t0,t0\+D\) [1-9]",
                            r"^hot       : reached backend in \[t0,t0\+D\) [1-9]\d* units \([1-9]\d* requests\)",
                            r"^near      : sent [1-9]\d*, .*access log delayed 0 rejected 0 \(unlogged 0\) \[PASS\]",
                            r"^under     : sent [1-9]\d*, .*access log delayed 0 rejected 0 \(unlogged 0\) \[PASS\]",
                            r"^/metrics  : proxies \(sum of 2\) accepted [1-9]",
                            r"^units     : the master charged [1-9]\d* .*what the gate accepted or held [1-9]\d* \[match\]",
                            r"^units     : the master charged [1-9]\d* .*what reached the backend [1-9]\d* \[match\]",
                            r"^== summary", r"^ 2 sliding-log ", r"^ 2 gcra ", r"^ 2 weighted ", r"^ 2 weighted-response ",
                            r"^cells meeting every goal: \d+ of 4", r"^smoke: OK")

    def test_accuracy_exact(self):
        """The same with admission = "exact" (each request asks the master first): the gate
        still paces the hot client, the master charges exactly what reached the backend."""
        out = self.run_bench([sys.executable, os.path.join(BENCH, "accuracy.py"), "--smoke", "--admission", "exact",
                              "--scenarios", "weighted,weighted-response"])
        self.assert_figures(out, r"; admission exact; ", r"^== G=2  weighted: .*cost header:X-Cost",
                            r"^units     : the master charged [1-9]\d* .*what reached the backend [1-9]\d* \[match\]",
                            r"^cells meeting every goal: \d+ of 2", r"^smoke: OK")

    # ------------------------------------------------------------------ C++ benchmarks

    def test_master_bench(self):
        """Bare ZeroMQ ceiling, the real master's ingest (counted by its /metrics), DELAY_UNTIL
        received, and the control-loop probes answered; again with CURVE on both links, and with
        pace_share = true and the publisher named as a gatekeeper."""
        bench = self.bench_binary("smockron-master-bench")
        out = self.run_bench([bench, "--master", binary("smockron-master"), "--messages", "20000", "--identifiers",
                              "1000", "--latency-seconds", "0.3", "--latency-rate", "10000", "--curve", "--pace-share"])
        curve = self.assert_figures(out, r"^master ingest \(curve\):\s+[\d.]+ msg/s\s+\((\d+) of 20000 processed",
                                    r"^ratio curve/plaintext:\s+[\d.]+")[0]
        self.assertEqual(int(curve.group(1)), 20000, "every batched message over CURVE was processed")
        paced, counted = self.assert_figures(
            out, r"^master ingest \(paced\):\s+[\d.]+ msg/s\s+\((\d+) of 20000 processed",
            r"^paced identifiers:\s+(\d+)$", r"^ratio paced/plain:\s+[\d.]+")[:2]
        self.assertEqual(int(paced.group(1)), 20000, "every message from a named publisher was processed")
        self.assertGreater(int(counted.group(1)), 0, "the master counted no gatekeeper for a held client")
        ingest, loop = self.assert_figures(
            out, r"^master ingest \(memory\):\s+[\d.]+ msg/s\s+\((\d+) of 20000 processed",
            r"^control-loop latency .*: p50 \d+ us, p99 \d+ us, max \d+ us \((\d+) of \d+ probes answered\)",
            r"^zeromq bare PUB->SUB:\s+[\d.]+ msg/s", r"^control messages:\s+[\d.]+ msg/s\s+\(\d+ DELAY_UNTIL received\)",
            r"^ratio master/zeromq:\s+[\d.]+")[:2]
        self.assertGreater(int(ingest.group(1)), 0, "the master processed nothing")
        self.assertGreater(int(loop.group(1)), 0, "no control-loop probe was answered")

    def test_master_bench_with_costs(self):
        """The same with a token budget's mix: known costs, reservations and their corrections, which
        the master charges, opens and closes."""
        bench = self.bench_binary("smockron-master-bench")
        out = self.run_bench([bench, "--master", binary("smockron-master"), "--messages", "20000", "--identifiers",
                              "1000", "--latency-seconds", "0.3", "--latency-rate", "10000", "--costs"])
        ingest, costs = self.assert_figures(
            out, r"^master ingest \(memory\):\s+[\d.]+ msg/s\s+\((\d+) of 20000 processed",
            r"^costs: (\d+) units charged, (\d+) given back, (\d+) reservations opened, (\d+) open$",
            r"^zeromq bare PUB->SUB:\s+[\d.]+ msg/s", r"^ratio master/zeromq:\s+[\d.]+")[:2]
        self.assertGreaterEqual(int(ingest.group(1)), 20000, "every message of the cost mix was processed")
        charged, given_back, opened, still_open = (int(g) for g in costs.groups())
        self.assertEqual(opened, 2000, "one message in ten reserves")
        self.assertEqual(still_open, 0, "each reservation was closed by its correction")
        self.assertGreater(charged, 20000, "known costs of up to 100 units were charged")
        self.assertGreater(given_back, 0, "negative corrections gave units back")

    def test_query_bench(self):
        """The echo server and the real master both answer UDP queries, closed and open loop."""
        bench = self.bench_binary("smockron-query-bench")
        out = self.run_bench([bench, "--master", binary("smockron-master"), "--rounds", "1", "--seconds", "0.3"])
        (rnd,) = self.assert_figures(out, r"^  round 0: echo (\d+)/s, master (\d+)/s, ratio [\d.]+")[:1]
        self.assertGreater(int(rnd.group(1)), 0, "the echo server answered nothing")
        self.assertGreater(int(rnd.group(2)), 0, "the master answered nothing")
        opens = re.findall(r"^open loop at \d+/s .*echo p50 \d+ us p99 \d+ us \(([\d.]+)% answered\); "
                           r"master p50 \d+ us p99 \d+ us \(([\d.]+)% answered\)", out, re.MULTILINE)
        self.assertEqual(len(opens), 2, f"expected the two open-loop lines:\n{out}")
        for echo, master in opens:
            self.assertGreater(float(echo), 0, out)
            self.assertGreater(float(master), 0, out)
        self.assert_figures(out, r"^median: echo \d+/s, master \d+/s, master/echo [\d.]+")

    def test_rls_bench(self):
        """A bare gRPC server and the real master answer ShouldRateLimit; the ingest alone and beside; RLQS."""
        bench = self.bench_binary("smockron-rls-bench")
        out = self.run_bench([bench, "--master", binary("smockron-master"), "--seconds", "0.3", "--window", "8",
                              "--ingest-rate", "2000", "--buckets", "100", "--reports", "1"])
        bare, master = self.assert_figures(
            out, r"^bare gRPC server:\s+[\d.]+ decisions/s .*\((\d+) answered, 0 failed\)",
            r"^smockron-master RLS:\s+[\d.]+ decisions/s .*\((\d+) answered, 0 failed\)",
            r"^ratio master/bare:\s+[\d.]+",
            r"^ingest beside/alone:\s+[\d.]+",
            r"^rlqs 100 buckets a report: answered in p50 [\d.]+ ms, max [\d.]+ ms over 1 reports "
            r"\(every bucket answered\)")[:2]
        self.assertGreater(int(bare.group(1)), 0, "the bare server answered nothing")
        self.assertGreater(int(master.group(1)), 0, "the master answered nothing")
        ingest = re.findall(r"^ingest (?:alone|beside RLS):\s+[\d.]+ msg/s offered, (\d+) sent: [\d.]+ processed "
                            r"within the phase \([\d.]+\), (\d+) a second later", out, re.MULTILINE)
        self.assertEqual(len(ingest), 2, out)
        for sent, processed in ingest:  # how many in how long is the benchmark's figure, not the smoke's
            self.assertGreater(int(processed), 0, f"the master processed no accounting message:\n{out}")

    def test_gate_bench(self):
        """Every benchmark the binary registers runs and prints its time per iteration."""
        bench = self.bench_binary("smockron-gate-bench")
        listed = subprocess.run([bench, "--benchmark_list_tests=true"], capture_output=True, text=True, timeout=30)
        self.assertEqual(listed.returncode, 0, listed.stdout + listed.stderr)
        names = listed.stdout.split()
        self.assertIn("BM_GateDecision", names)
        out = self.run_bench([bench, "--benchmark_min_time=0.01"], daemons=False)
        for name in names:
            self.assert_figures(out, rf"^{re.escape(name)}\s+[\d.]+ [nuµm]?s\s+[\d.]+ [nuµm]?s\s+\d+")


if __name__ == "__main__":
    unittest.main()
