#!/usr/bin/env python3
"""Instructions per request through smockron-proxy, counted by callgrind: the
figure that settles a hot-path change on a noisy machine (counts, not seconds:
the same binary and load give the same count whatever else runs).

Method (see docs/benchmarks.md):
- backend: nginx (1 worker) answering `return 200`; one master; the proxy
  (1 worker thread, a route with a domain and a header identifier, the gate
  and accounting live) runs under `valgrind --tool=callgrind`.
- load: h2load, 10 connections, one API key; `--h1` for HTTP/1.1, or h2c with
  prior knowledge (10 streams per connection) to the same HTTP/1.1 backend.
- each build and protocol is run twice, with N1 and N2 requests; the
  difference of the two totals over N2 - N1 is the cost of one request
  (start-up and shutdown cancel out). `--repeat K` does that K times, the
  builds alternating, and prints each figure and their mean: the
  accounting batches' timing moves a few hundred instructions between runs.
- `--baseline DIR`: DIR/smockron-proxy (another build, e.g. the commit before
  a change) measured in the same run; the ratio current/baseline is printed.
- `--curve`: the same proxy again as "curve", its links speaking CURVE to a
  master of its own (keys made with `smockron-query keygen`); the ratio
  curve/smockron is printed.
- `--traces`: two more runs where every request after the first is refused
  (a limit of 1/h): "refused" without traces and "traced" with
  trace_endpoint (sampled at 100%: a span per refused request, exported to
  the backend nginx, which answers 200); the ratio traced/refused is the
  cost of tracing a request (goal <= 1.05).
- `--smoke`: N1 = 10, N2 = 30, each protocol once: exits 1 unless every
  request was answered (2xx; refused ones 5xx) and callgrind counted something.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lib.config import one_box_toml  # noqa: E402
from lib.daemons import stop_process  # noqa: E402
from lib.ports import free_ports  # noqa: E402
from proxy_bench import ROOT, nginx_conf, wait_port  # noqa: E402  (the benchmarks' shared helpers)


def h2load(port, n, h1, refused_ok=False):
    """`n` requests; every one must be answered 2xx (or, with `refused_ok`, 2xx or 5xx)."""
    argv = ["h2load", "-c", "10", "-n", str(n), "-H", "X-API-Key: k1"]
    argv += ["--h1"] if h1 else ["-m", "10"]
    out = subprocess.run(argv + [f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=300).stdout
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    ok = (int(m.group(1)) + (int(m.group(4)) if refused_ok else 0)) if m else 0
    if ok != n:
        raise RuntimeError(f"h2load: {ok} of {n} answered {'2xx or 5xx' if refused_ok else '2xx'}\n{out}")


def total_instructions(proxy_bin, conf, port, admin, n, h1, tmp, log, keep=None, refused_ok=False):
    """Runs the proxy under callgrind for one load of `n` requests; its instruction total."""
    out_dir = keep or tempfile.mkdtemp(dir=tmp)
    prefix = f"callgrind.out.{n}."
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/{prefix}%p",
                          proxy_bin, "--config", conf, "--log-level", "warn"], stdout=log, stderr=log)
    try:
        wait_port(port, 60, p)  # slow under callgrind
        wait_port(admin, 60, p)
        h2load(port, n, h1, refused_ok)
    finally:
        stop_process(p, timeout=60)
    totals = 0
    for path in glob.glob(os.path.join(out_dir, prefix + "*")):
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    totals = max(totals, int(line.split()[1]))
    if totals == 0:
        raise RuntimeError("callgrind wrote no total")
    return totals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--baseline", metavar="DIR", help="also count DIR/smockron-proxy (another build)")
    ap.add_argument("--n1", type=int, default=1000)
    ap.add_argument("--n2", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each build and protocol (alternating)")
    ap.add_argument("--protocols", default="h1,h2c", help="h1, h2c or both (comma-separated)")
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind files here (callgrind_annotate reads them)")
    ap.add_argument("--curve", action="store_true", help="also count the proxy with CURVE links ('curve')")
    ap.add_argument("--traces", action="store_true",
                    help="also count refused requests without and with traces ('refused', 'traced')")
    ap.add_argument("--smoke", action="store_true", help="N1 = 10, N2 = 30: checks the method, judges no figure")
    args = ap.parse_args()
    if args.smoke:
        args.n1, args.n2 = 10, 30
    for tool in ("nginx", "h2load", "valgrind"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            sys.exit(f"{tool} is missing: run scripts/install-deps.sh --test")
    builds = {"smockron": os.path.join(args.bin, "smockron-proxy")}
    if args.baseline:
        builds["baseline"] = os.path.join(args.baseline, "smockron-proxy")
    for path in list(builds.values()) + [os.path.join(args.bin, "smockron-master")]:
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: build it (or pass --bin)")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    tmp = tempfile.mkdtemp(prefix="smockron-instructions-")
    log = open(os.path.join(tmp, "bench.log"), "w")
    backend_port, proxy_port, padmin, madmin, acct, ctrl = free_ports(6)

    def write_conf(name, madmin, acct, ctrl, master_extra="", proxy_extra="",
                   rule='{ rate = "10000000/s", burst = 1000000 }'):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(one_box_toml(domain="bench", rule=rule,
                                 backend_port=backend_port, proxy_port=proxy_port, proxy_admin=padmin,
                                 master_admin=madmin, accounting=acct, control=ctrl, upstream_extra="keepalive = 128",
                                 master_extra=master_extra, proxy_extra=proxy_extra))
        return path

    conf = write_conf("smockron.toml", madmin, acct, ctrl)
    confs = {who: conf for who in builds}
    masters = [conf]
    if args.curve:
        keys = os.path.join(tmp, "keys")
        os.makedirs(keys)
        for name in ("master", "proxy"):
            subprocess.run([os.path.join(args.bin, "smockron-query"), "keygen", os.path.join(keys, name)], check=True,
                           stdout=subprocess.DEVNULL)
        cmadmin, cacct, cctrl = free_ports(3)
        builds["curve"] = builds["smockron"]
        confs["curve"] = write_conf(
            "curve.toml", cmadmin, cacct, cctrl,
            master_extra=f'curve_secret_key = "{keys}/master.key"\ncurve_allowed_keys = "{keys}/proxy.pub"',
            proxy_extra=f'curve_secret_key = "{keys}/proxy.key"\ncurve_master_key = "{keys}/master.pub"')
        masters.append(confs["curve"])
    refused_ok = set()
    if args.traces:
        # A master of its own, whose limit refuses all but k1's first request (the proxy's
        # guard refuses from the first POLICY on, before any DELAY_UNTIL).
        rmadmin, racct, rctrl = free_ports(3)
        builds["refused"] = builds["traced"] = builds["smockron"]
        refusing = '{ rate = "1/h", burst = 1 }'
        confs["refused"] = write_conf("refused.toml", rmadmin, racct, rctrl, rule=refusing)
        confs["traced"] = write_conf(
            "traced.toml", rmadmin, racct, rctrl, rule=refusing,
            proxy_extra=f'trace_endpoint = "http://127.0.0.1:{backend_port}/v1/traces"')
        masters.append(confs["refused"])
        refused_ok = {"refused", "traced"}
    backend_conf = nginx_conf(os.path.join(tmp, "backend"), f"""
  server {{ listen 127.0.0.1:{backend_port} backlog=4096; location / {{ return 200 "ok\\n"; }}
           location = /v1/traces {{ return 200 "{{}}"; }} }}""")
    backend = subprocess.Popen([nginx, "-c", backend_conf, "-p", os.path.join(tmp, "backend")], stdout=log, stderr=log)
    running = [subprocess.Popen([os.path.join(args.bin, "smockron-master"), "--config", c, "--log-level", "warn"],
                                stdout=log, stderr=log) for c in masters]
    results = {}
    try:
        wait_port(backend_port, proc=backend)
        wait_port(madmin, proc=running[0])
        if args.curve:
            wait_port(cmadmin, proc=running[1])
        if args.traces:
            wait_port(rmadmin, proc=running[-1])
        print(f"{'who':>9} {'protocol':>8} {'instructions/request':>21}", flush=True)
        for proto in args.protocols.split(","):
            for rep in range(args.repeat):
                for who, proxy_bin in builds.items():
                    keep = os.path.join(args.keep, who, proto, str(rep)) if args.keep else None
                    if keep:
                        os.makedirs(keep, exist_ok=True)
                    c = confs[who]
                    ok = who in refused_ok
                    t1 = total_instructions(proxy_bin, c, proxy_port, padmin, args.n1, proto == "h1", tmp, log, keep,
                                            ok)
                    t2 = total_instructions(proxy_bin, c, proxy_port, padmin, args.n2, proto == "h1", tmp, log, keep,
                                            ok)
                    per = (t2 - t1) / (args.n2 - args.n1)
                    results.setdefault((who, proto), []).append(per)
                    print(f"{who:>9} {proto:>8} {per:>21,.0f}", flush=True)
            for who in builds:
                runs = results[(who, proto)]
                print(f"{who:>9} {proto:>8} {sum(runs) / len(runs):>21,.0f}  mean of {len(runs)}", flush=True)
            mean = {w: sum(results[(w, proto)]) / len(results[(w, proto)]) for w in builds}
            if args.baseline:
                print(f"ratio smockron/baseline {proto}: {mean['smockron'] / mean['baseline']:.3f}", flush=True)
            if args.curve:
                print(f"ratio curve/smockron {proto}: {mean['curve'] / mean['smockron']:.3f} (goal <= 1.05)",
                      flush=True)
            if args.traces:
                print(f"ratio traced/refused {proto}: {mean['traced'] / mean['refused']:.3f} (goal <= 1.05)",
                      flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:  # wait_port, h2load, callgrind
        print(f"FAILED: {e}\n(log: {log.name})", flush=True)
        return 1
    finally:
        for m in running:
            stop_process(m)
        stop_process(backend)
        log.close()
    if args.smoke:
        print("smoke: OK")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
