#!/usr/bin/env python3
"""Memory of the master's rule state: how much its RSS grows with N (default
100,000) identifiers of a domain whose rules are a rate with a burst of
1,000,000 (the sliding log's worst case: before sliding-window counters, a
full history was a million timestamps, 8 MB, per identifier) and a quota of
1,000,000 per month. Goal: under 200 MiB for 100,000 identifiers.

A stand-in gatekeeper (pyzmq PUB, as the integration tests use) sends each
identifier --uses accounting messages with costs (loginfo "cost=N", 1..100),
in chunks the master is let to catch up with (its processed-message counter),
so no message is dropped on the way. RSS is read from /proc before the first
message and once every identifier is tracked
(smockron_master_domain_tracked_identifiers). Per identifier: both rules'
state (three numbers for the counted rate rule, two for the quota), the
state's key, and the map's and LRU list's share.

--smoke: 2,000 identifiers; exit 1 unless every one is tracked and every
message was processed.
--max-mib X: exit 1 if the RSS growth exceeds X MiB.
Run: python3 integration/bench/master_memory.py [--identifiers N] [--uses K]"""
import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib.config import master_toml  # noqa: E402
from lib.daemons import MasterProcess  # noqa: E402
from lib.gatekeeper import Gatekeeper  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.ports import free_ports  # noqa: E402
from lib.timing import now_ms, wait_until  # noqa: E402

DOMAIN = "m"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--identifiers", type=int, default=100_000)
    ap.add_argument("--uses", type=int, default=3, help="accounting messages per identifier")
    ap.add_argument("--algorithm", default="sliding-log", choices=["sliding-log", "gcra"])
    ap.add_argument("--max-mib", type=float, default=200.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.identifiers = 2_000
    tmp = tempfile.mkdtemp(prefix="smockron-master-memory-")
    master = None
    gk = None
    try:
        acc, ctl, adm = free_ports(3)
        domains = {DOMAIN: {"rules": [("1000000/30d", 1_000_000), {"quota": 1_000_000, "per": "month"}],
                            "algorithm": args.algorithm}}
        path = os.path.join(tmp, "master.toml")
        with open(path, "w") as f:
            f.write(master_toml(acc, ctl, adm, domains, max_identifiers=max(1_000_000, args.identifiers)))
        master = MasterProcess(tmp, acc, ctl, adm, path)
        master.start()
        gk = Gatekeeper(master.accounting, master.control, [DOMAIN])
        gk.handshake()
        # The handshake's probe messages are counted too: the base to count from.
        def processed() -> float:
            return metric(master.metrics(), "smockron_master_accounting_messages_total",
                          {"domain": DOMAIN, "status": "ACCEPTED"}) or 0.0

        time.sleep(0.2)
        before = rss_kib(master.pid)
        rng = random.Random(1)
        sent = 0
        chunk = 20_000
        t0 = time.monotonic()
        for start in range(0, args.identifiers, chunk // args.uses or 1):
            ids = range(start, min(args.identifiers, start + max(1, chunk // args.uses)))
            now = now_ms()
            for _ in range(args.uses):
                for i in ids:
                    gk.accepted(DOMAIN, f"client-{i:08d}", now, loginfo=f"cost={rng.randint(1, 100)}")
                    sent += 1
            wait_until(lambda: processed() >= sent, 60, message=f"the master processed {sent} messages")
        took = time.monotonic() - t0
        tracked = metric(master.metrics(), "smockron_master_domain_tracked_identifiers", {"domain": DOMAIN})
        after = rss_kib(master.pid)
        delta_mib = (after - before) / 1024
        print(f"{args.identifiers} identifiers x {args.uses} uses ({sent} messages, costs 1..100) in {took:.1f} s; "
              f"algorithm {args.algorithm}, rules: 1000000/30d burst 1000000 + quota 1000000/month")
        print(f"master RSS before: {before / 1024:.1f} MiB, with {int(tracked or 0)} identifiers tracked: "
              f"{after / 1024:.1f} MiB, delta {delta_mib:.1f} MiB "
              f"({(after - before) * 1024 // max(1, args.identifiers)} bytes per identifier)")
        ok = tracked == args.identifiers
        verdict = "PASS" if delta_mib < args.max_mib else "FAIL"
        print(f"RSS growth {delta_mib:.1f} MiB, bound {args.max_mib:g} MiB: {verdict}")
        if not ok:
            print(f"error: {tracked} identifiers tracked, {args.identifiers} expected", file=sys.stderr)
            return 1
        if args.smoke:
            print("smoke: OK")
        return 0 if verdict == "PASS" else 1
    finally:
        if gk is not None:
            gk.close()
        if master is not None:
            master.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
