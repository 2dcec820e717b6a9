#!/usr/bin/env python3
"""smockron-proxy vs nginx, side by side in one run, same backend, same load.

Method (see docs/benchmarks.md):
- backend: nginx (1 worker) answering `return 200`; wrk (1 thread, 50
  keep-alive connections) and the backend share cpu 0; the proxy under test
  has cpu 1 alone (the smockron master also sits on cpu 0: its CPU per
  accounting message is the "master" column).
- peer: nginx, 1 worker, proxy_http_version 1.1, upstream keepalive 128.
- smockron-proxy: 1 worker thread, gate active (route with a domain,
  identifier extraction, master connected).
- alternating rounds after a warm-up; per round: req/s, p50/p99 latency,
  proxy CPU us per request (/proc), and whether the proxy core was >= 90% busy.
  Rounds where other processes used noticeable CPU are dropped.
- at the end: accounting messages the proxy published and dropped, and how
  many the master processed (the gate's cost is only real if none is lost).
- `--baseline DIR`: a third contender, the smockron-proxy of another build
  (e.g. the commit before a change), on its own port beside the first, same
  master and cpu: before and after measured in the same run.
- `--curve`: a third contender, the same smockron-proxy whose links to a
  master of its own (cpu 0 too) speak CURVE (keys made with `smockron-query
  keygen`): CPU per request with and without CURVE in the same run.
- `--traces`: two more contenders, the same smockron-proxy against a master
  of their own (cpu 0) whose limit refuses every request but the first
  (1/h): "refused" without traces and "traced" with trace_endpoint at 100%
  sampling (a span per refused request, exported to the backend nginx,
  which answers 200). CPU per request traced/refused is what tracing costs
  the proxy, its exporter thread and its syscalls included (goal <= 1.05).
- `--smoke`: 1 round of 1 s per contender (1 s warm-up, 10 connections):
  exits 1 unless every contender answered every request with 2xx and no
  socket error (refused and traced: every request answered, 5xx allowed, and
  traced exported spans), and the smockron proxies' accounting was published
  and processed by the master. No throughput figure is judged.
"""
import argparse
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib.config import one_box_toml  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline=10.0, proc=None):
    """Waits until something listens on 127.0.0.1:port; fails at once if `proc` (a Popen) exits."""
    end = time.time() + deadline
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except FileNotFoundError:
            pass
    return total / TICK


def system_busy_seconds(line="cpu "):
    """Busy CPU seconds of the whole machine, or of one cpu ("cpu0 ")."""
    with open("/proc/stat") as f:
        for text in f:
            if text.startswith(line):
                v = [int(x) for x in text.split()[1:]]
                break
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / TICK


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def metric_total(port, name):
    """Sum of a Prometheus counter over its labels, from an admin endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


class Proc:
    def __init__(self, argv, cpu, log):
        self.p = subprocess.Popen(["taskset", "-c", str(cpu)] + argv, stdout=log, stderr=log)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def nginx_conf(prefix, body):
    os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
    path = os.path.join(prefix, "nginx.conf")
    with open(path, "w") as f:
        f.write(f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/tmp;
  proxy_temp_path {prefix}/tmp;
  keepalive_requests 1000000;
{body}
}}
""")
    return path


def run_wrk(port, seconds, connections, scheme="http", headers=()):
    """wrk on cpu 0 against 127.0.0.1:port, with `headers` added to each request."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    argv = ["taskset", "-c", "0", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
            "-H", "X-API-Key: bench-client"]
    for header in headers:
        argv += ["-H", header]
    out = subprocess.run(argv + [f"{scheme}://127.0.0.1:{port}/"],
                         capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)

    def pct(p):
        m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out)
        v, unit = float(m.group(1)), m.group(2)
        return v * {"us": 1, "ms": 1000, "s": 1e6}[unit]
    return {"rps": rps, "requests": requests, "p50": pct(50), "p99": pct(99), "wrk_cpu": wrk_cpu,
            "errors": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sum(map(int, socket_errors.groups())) if socket_errors else 0}


def measure(port, pids, others, seconds, connections, **wrk_args):
    """One wrk run (run_wrk) against the contender `pids` listening on `port`: its CPU us
    per request, how busy its core and the load core (cpu 0) were, and the noise: cores
    used by anything that is neither the contender, `others` nor wrk."""
    c0, o0, s0, t0 = cpu_seconds(pids), cpu_seconds(others), system_busy_seconds(), time.time()
    l0 = system_busy_seconds("cpu0 ")
    r = run_wrk(port, seconds, connections, **wrk_args)
    c1, o1, s1, t1 = cpu_seconds(pids), cpu_seconds(others), system_busy_seconds(), time.time()
    if r["requests"] == 0:
        raise RuntimeError(f"wrk completed no request on port {port}")
    wall = t1 - t0
    r["load"] = (system_busy_seconds("cpu0 ") - l0) / wall  # wrk + backend (+ master) core
    r["cpu_us"] = (c1 - c0) / r["requests"] * 1e6
    r["busy"] = (c1 - c0) / wall
    r["noise"] = max(0.0, ((s1 - s0) - (c1 - c0) - (o1 - o0) - r["wrk_cpu"]) / wall)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="rounds per contender (alternating; default 10, smoke 1)")
    ap.add_argument("--seconds", type=int, default=None, help="length of one round (default 5, smoke 1)")
    ap.add_argument("--connections", type=int, default=None, help="wrk connections (default 50, smoke 10)")
    ap.add_argument("--perf", metavar="FILE",
                    help="also record a perf profile (call graphs) of smockron-proxy's first round (with --traces: "
                         "the traced proxy's)")
    ap.add_argument("--bin", default=os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--baseline", metavar="DIR", help="also run DIR/smockron-proxy (another build) as contender 'baseline'")
    ap.add_argument("--curve", action="store_true", help="also run a smockron-proxy whose links speak CURVE ('curve')")
    ap.add_argument("--traces", action="store_true",
                    help="also run 'refused' and 'traced': every request refused, without and with traces")
    ap.add_argument("--plot", metavar="PNG", help="also draw req/s and CPU per request by round and contender (plots.py)")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round of 1 s, 1 s warm-up, 10 connections (unless given): exit 1 unless every request of "
                         "every contender was answered 2xx and the accounting reached the master")
    args = ap.parse_args()
    for name, default, smoke in (("rounds", 10, 1), ("seconds", 5, 1), ("connections", 50, 10)):
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else default)
    for path in [os.path.join(args.bin, n) for n in ("smockron-master", "smockron-proxy")] + \
            ([os.path.join(args.baseline, "smockron-proxy")] if args.baseline else []):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: build it (or pass --bin)")
    for tool in ("nginx", "wrk", "taskset"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            sys.exit(f"{tool} is missing: run scripts/install-deps.sh --test")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    tmp = tempfile.mkdtemp(prefix="smockron-bench-")
    log = open(os.path.join(tmp, "bench.log"), "w")
    procs = []
    try:
        backend_port, nginx_port, proxy_port, base_port = free_port(), free_port(), free_port(), free_port()
        acct, ctrl, madmin, padmin, base_admin = free_port(), free_port(), free_port(), free_port(), free_port()
        backend_conf = nginx_conf(os.path.join(tmp, "backend"), f"""
  server {{ listen 127.0.0.1:{backend_port} backlog=4096; location / {{ return 200 "ok\\n"; }}
           location = /v1/traces {{ return 200 "{{}}"; }} }}""")
        peer_conf = nginx_conf(os.path.join(tmp, "peer"), f"""
  upstream app {{ server 127.0.0.1:{backend_port}; keepalive 128; }}
  server {{ listen 127.0.0.1:{nginx_port} backlog=4096;
    location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }} }}""")
        for d in ("backend", "peer"):
            os.makedirs(os.path.join(tmp, d, "tmp"), exist_ok=True)
        def write_conf(name, port, admin, master_admin=madmin, accounting=acct, control=ctrl, master_extra="",
                       proxy_extra="", rule='{ rate = "10000000/s", burst = 1000000 }'):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(one_box_toml(domain="bench", rule=rule,
                                     backend_port=backend_port, proxy_port=port, proxy_admin=admin,
                                     master_admin=master_admin, accounting=accounting, control=control,
                                     identify='"header:X-API-Key", "ip"', upstream_extra="keepalive = 128",
                                     master_extra=master_extra, proxy_extra=proxy_extra))
            return path
        smockron_conf = write_conf("smockron.toml", proxy_port, padmin)
        backend = Proc([nginx, "-c", backend_conf, "-p", os.path.join(tmp, "backend")], 0, log)
        peer = Proc([nginx, "-c", peer_conf, "-p", os.path.join(tmp, "peer")], 1, log)
        master = Proc([os.path.join(args.bin, "smockron-master"), "--config", smockron_conf, "--log-level", "warn"], 0, log)
        proxy = Proc([os.path.join(args.bin, "smockron-proxy"), "--config", smockron_conf, "--log-level", "warn"], 1, log)
        procs = [proxy, master, peer, backend]
        if args.baseline:
            base_conf = write_conf("baseline.toml", base_port, base_admin)
            baseline = Proc([os.path.join(args.baseline, "smockron-proxy"), "--config", base_conf, "--log-level", "warn"], 1, log)
            procs.insert(1, baseline)
            wait_port(base_port, proc=baseline.p)
        masters = {"smockron": master, "baseline": master}
        if args.curve:
            keys = os.path.join(tmp, "keys")
            os.makedirs(keys)
            for name in ("master", "proxy"):
                subprocess.run([os.path.join(args.bin, "smockron-query"), "keygen", os.path.join(keys, name)],
                               check=True, stdout=subprocess.DEVNULL)
            curve_port, curve_admin, curve_madmin = free_port(), free_port(), free_port()
            curve_conf = write_conf(
                "curve.toml", curve_port, curve_admin, curve_madmin, free_port(), free_port(),
                master_extra=f'curve_secret_key = "{keys}/master.key"\ncurve_allowed_keys = "{keys}/proxy.pub"',
                proxy_extra=f'curve_secret_key = "{keys}/proxy.key"\ncurve_master_key = "{keys}/master.pub"')
            curve_master = Proc([os.path.join(args.bin, "smockron-master"), "--config", curve_conf, "--log-level", "warn"],
                                0, log)
            curve_proxy = Proc([os.path.join(args.bin, "smockron-proxy"), "--config", curve_conf, "--log-level", "warn"],
                               1, log)
            procs += [curve_proxy, curve_master]
            masters["curve"] = curve_master
            wait_port(curve_port, proc=curve_proxy.p)
            wait_port(curve_madmin, proc=curve_master.p)
        if args.traces:
            # One master whose limit refuses all but the first request; the two proxies share it.
            refused_port, refused_admin, traced_port, traced_admin, refusing_madmin, racct, rctrl = (
                free_port(), free_port(), free_port(), free_port(), free_port(), free_port(), free_port())
            refusing = '{ rate = "1/h", burst = 1 }'
            refused_conf = write_conf("refused.toml", refused_port, refused_admin, refusing_madmin, racct, rctrl,
                                      rule=refusing)
            traced_conf = write_conf(
                "traced.toml", traced_port, traced_admin, refusing_madmin, racct, rctrl, rule=refusing,
                proxy_extra=f'trace_endpoint = "http://127.0.0.1:{backend_port}/v1/traces"')
            refusing_master = Proc([os.path.join(args.bin, "smockron-master"), "--config", refused_conf,
                                    "--log-level", "warn"], 0, log)
            refused_proxy = Proc([os.path.join(args.bin, "smockron-proxy"), "--config", refused_conf,
                                  "--log-level", "warn"], 1, log)
            traced_proxy = Proc([os.path.join(args.bin, "smockron-proxy"), "--config", traced_conf,
                                 "--log-level", "warn"], 1, log)
            procs += [refused_proxy, traced_proxy, refusing_master]
            masters["refused"] = masters["traced"] = refusing_master
            for port, proc in ((refusing_madmin, refusing_master), (refused_port, refused_proxy),
                               (traced_port, traced_proxy)):
                wait_port(port, proc=proc.p)
        for port, proc in ((backend_port, backend), (nginx_port, peer), (proxy_port, proxy), (madmin, master)):
            wait_port(port, proc=proc.p)
        time.sleep(0.5)
        peer_pids = [peer.p.pid] + children(peer.p.pid)
        backend_pids = [backend.p.pid] + children(backend.p.pid)
        contenders = {"smockron": (proxy_port, [proxy.p.pid]), "nginx": (nginx_port, peer_pids)}
        if args.baseline:
            contenders["baseline"] = (base_port, [baseline.p.pid])
        if args.curve:
            contenders["curve"] = (curve_port, [curve_proxy.p.pid])
        refusing_contenders = set()
        if args.traces:
            contenders["refused"] = (refused_port, [refused_proxy.p.pid])
            contenders["traced"] = (traced_port, [traced_proxy.p.pid])
            refusing_contenders = {"refused", "traced"}
        others = backend_pids + sorted({m.p.pid for m in masters.values()})

        warmup = 1 if args.smoke else max(2, args.seconds // 2)
        print(f"warm-up ({warmup}s each) ...", flush=True)
        for name, (port, _) in contenders.items():
            run_wrk(port, warmup, args.connections)

        time.sleep(0.5)  # the warm-up's accounting settles
        admins = [padmin] + ([base_admin] if args.baseline else []) + ([curve_admin] if args.curve else [])
        master_admins = [madmin] + ([curve_madmin] if args.curve else [])
        published0 = sum(metric_total(a, "smockron_proxy_accounting_messages_total") for a in admins)
        processed0 = sum(metric_total(a, "smockron_master_accounting_messages_total") for a in master_admins)
        results = {name: [] for name in contenders}
        print(f"{'round':>5} {'who':>9} {'req/s':>9} {'p50 us':>8} {'p99 us':>8} {'cpu us/req':>10} {'busy':>5} {'load':>5} "
              f"{'master':>6} {'noise':>6}")
        names = list(contenders)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:  # each goes first in turn
                port, pids = contenders[name]
                perf = None
                if args.perf and name == ("traced" if args.traces else "smockron") and rnd == 0:
                    perf = subprocess.Popen(["perf", "record", "-q", "-g", "-o", args.perf, "-p", str(pids[0])],
                                            stdout=log, stderr=log)
                its_master = masters.get(name, master)
                m0 = cpu_seconds([its_master.p.pid])
                r = measure(port, pids, others, args.seconds, args.connections)
                if perf:
                    perf.send_signal(signal.SIGINT)
                    perf.wait()
                r["master_us"] = (cpu_seconds([its_master.p.pid]) - m0) / r["requests"] * 1e6
                # Refusals are what the refusing contenders answer (wrk counts them as errors).
                r["kept"] = r["noise"] < 0.10 and (r["errors"] == 0 or name in refusing_contenders)
                results[name].append(r)
                print(f"{rnd:>5} {name:>9} {r['rps']:>9.0f} {r['p50']:>8.0f} {r['p99']:>8.0f} {r['cpu_us']:>10.1f} "
                      f"{r['busy']*100:>4.0f}% {r['load']*100:>4.0f}% "
                      f"{r['master_us'] if name != 'nginx' else 0:>6.1f} {r['noise']:>6.2f}{'' if r['kept'] else '  (dropped)'}", flush=True)

        def paired(x, y):
            return [a["rps"] / b["rps"] for a, b in zip(results[x], results[y]) if a["kept"] and b["kept"]]
        ratios, kept = paired("smockron", "nginx"), {n: [r for r in results[n] if r["kept"]] for n in results}
        print()
        for name in names:
            rs = kept[name] or results[name]
            print(f"{name:>9}: median {statistics.median(r['rps'] for r in rs):.0f} req/s, "
                  f"p50 {statistics.median(r['p50'] for r in rs):.0f} us, p99 {statistics.median(r['p99'] for r in rs):.0f} us, "
                  f"cpu {statistics.median(r['cpu_us'] for r in rs):.1f} us/req, "
                  f"core busy {statistics.median(r['busy'] for r in rs)*100:.0f}%, "
                  f"load core busy {statistics.median(r['load'] for r in rs)*100:.0f}%  ({len(kept[name])} rounds kept)")
        if ratios:
            print(f"req/s ratio smockron/nginx: median {statistics.median(ratios):.2f} "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} paired rounds)")
        else:
            print("no paired rounds kept (machine too noisy)")
        if args.baseline:
            for x, y in (("baseline", "nginx"), ("smockron", "baseline")):
                rs = paired(x, y)
                if rs:
                    print(f"req/s ratio {x}/{y}: median {statistics.median(rs):.2f} "
                          f"(min {min(rs):.2f}, max {max(rs):.2f}, {len(rs)} paired rounds)")
            cpu = {n: statistics.median(r["cpu_us"] for r in (kept[n] or results[n])) for n in ("smockron", "baseline")}
            print(f"cpu us/req smockron/baseline: {cpu['smockron'] / cpu['baseline']:.2f}")
        if args.curve:
            cpu = {n: statistics.median(r["cpu_us"] for r in (kept[n] or results[n])) for n in ("smockron", "curve")}
            mcpu = {n: statistics.median(r["master_us"] for r in (kept[n] or results[n])) for n in ("smockron", "curve")}
            print(f"cpu us/req curve/smockron: {cpu['curve'] / cpu['smockron']:.2f} (goal <= 1.05); "
                  f"master cpu us/req curve/smockron: {mcpu['curve'] / max(mcpu['smockron'], 1e-9):.2f}")
        spans = 0
        if args.traces:
            cpu = {n: statistics.median(r["cpu_us"] for r in (kept[n] or results[n])) for n in ("refused", "traced")}
            pairs = [t["cpu_us"] / r["cpu_us"] for r, t in zip(results["refused"], results["traced"])
                     if r["kept"] and t["kept"]]
            print(f"cpu us/req traced/refused: {cpu['traced'] / cpu['refused']:.3f} (goal <= 1.05)"
                  + (f"; paired rounds: min {min(pairs):.3f}, median {statistics.median(pairs):.3f}, "
                     f"max {max(pairs):.3f}" if pairs else ""))
            with urllib.request.urlopen(f"http://127.0.0.1:{traced_admin}/metrics", timeout=5) as m:
                text = m.read().decode()
            spans = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith('smockron_proxy_trace_spans_total{result="exported"}'))
            print(f"traced: {spans:.0f} spans exported")
        if args.plot:
            import plots  # beside this file
            print(f"plot: {plots.proxy_vs_nginx(results, args.plot)}")
        # The master catches up on what is queued before it is asked.
        requests = sum(r["requests"] for n in names if n != "nginx" and n not in refusing_contenders for r in results[n])
        time.sleep(1.0)
        published = sum(metric_total(a, "smockron_proxy_accounting_messages_total") for a in admins) - published0
        dropped = sum(metric_total(a, "smockron_proxy_accounting_dropped_total") for a in admins)
        unsent = sum(metric_total(a, "smockron_proxy_accounting_unsent_total") for a in admins)
        processed = sum(metric_total(a, "smockron_master_accounting_messages_total") for a in master_admins) - processed0
        print(f"accounting: {requests} requests in smockron{' and baseline' if args.baseline else ''}"
              f"{' and curve' if args.curve else ''} rounds, {published:.0f} messages "
              f"published, {dropped:.0f} dropped, {unsent:.0f} unsent, {processed:.0f} processed by the master")
        if args.smoke:
            problems = [f"{name} round {i}: {r['errors']} non-2xx responses, {r['socket_errors']} socket errors "
                        f"(of {r['requests']} requests)"
                        for name in names for i, r in enumerate(results[name])
                        if (r["errors"] and name not in refusing_contenders) or r["socket_errors"]]
            if args.traces and spans <= 0:
                problems.append("traced: no span was exported")
            if published <= 0 or processed <= 0:
                problems.append(f"the gate's accounting was not seen: {published:.0f} messages published by the "
                                f"proxy, {processed:.0f} processed by the master (both must be > 0)")
            for p in problems:
                print(f"smoke: FAIL: {p}")
            if problems:
                return 1
            print(f"smoke: OK: {', '.join(names)} answered every request; accounting published and processed")
        return 0
    finally:
        for p in procs:
            p.stop()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
