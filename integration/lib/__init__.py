"""Shared helpers of Smockron's black-box integration tests (real binaries, 127.0.0.1 only).

- ports.py        free_port(s), reserve_port (a port that refuses), bind_failed(log)
- timing.py       now_ms, wait_until / WaitTimeout (deadline polling), max_in_window
- config.py       master_toml, proxy_toml, toml_value, one_box_toml; probe and warm-up domains
- daemons.py      binary() from $SMOCKRON_BIN_DIR (default build/bin), Daemon, MasterProcess,
                  ProxyProcess (stopped by PID), run_binary, run (peer programs), stop_process
- http1.py        RawConn, request_bytes, fetch (exact HTTP/1.1 bytes), http_get
- metrics.py      parse_metrics, metric, metric_sum, requests_by_protocol; metric names
- access_log.py   access_log_keys, read_access_log
- gatekeeper.py   Gatekeeper and FakeMaster (ZeroMQ stand-ins), parse_control
- testcase.py     DaemonTestCase (temp dir, fixtures: start_master / start_proxy / start_backend,
                  gate_stack + prime)
- backends.py     the HTTP/1.1 test backend (a process: python3 lib/backends.py) and BackendProcess
- h2_servers.py   in-process upstreams: CountingBackend, H2cBackend, RefusingUpstream
- grpc_echo.py    EchoServer (grpcio) and its service's method names
- h2frames.py     RFC 9113 constants and frame builders; h2client.py: H2Client, Stream
- tls_ca.py       TestCA; redis_server.py: RedisServer, RedisSentinel
- redis_cluster.py RedisCluster (3 primaries + 3 replicas, failovers), RespClient, key_slot
- dns_server.py   DnsServer: A/AAAA/SRV records on loopback, failures, query counts

Importing the package makes Debian's python3 packages (zmq, yaml, h2, hpack, grpc)
importable from another Python of the same minor version too.
"""
from __future__ import annotations

import os
import sys

# Debian's python3 packages live in dist-packages, which a pyenv/venv Python of
# the same minor version does not search by default. Appended when one of
# those the tests import is missing (not prepended: the interpreter's own
# packages stay first).
_DIST = "/usr/lib/python3/dist-packages"
for _module in ("zmq", "yaml"):
    try:
        __import__(_module)
    except ImportError:  # pragma: no cover - depends on the machine's Python
        if os.path.isdir(os.path.join(_DIST, _module)) and _DIST not in sys.path:
            sys.path.append(_DIST)
        __import__(_module)  # raises a clear ImportError if still missing
