#!/usr/bin/env python3
"""smockron-proxy vs nginx serving HTTP/2 on the listener, side by side in one run.

Method (that of proxy_bench.py and tls_bench.py, whose helpers this uses):
- load: h2load (nghttp2, 1 thread), -c 50 clients (one connection each) with
  -m 10 concurrent streams each, for a duration (-D), `x-api-key` header on
  every request. Per run: req/s ("finished in ..., N req/s"), the requests
  line (succeeded, failed, errored, timeout), the status codes line, the mean
  time per request, and the contender's CPU us per request (/proc utime+stime
  deltas; nginx: its master and worker), how busy its core and the load core
  were, h2load's own CPU us per request (the load core is shared with the
  backend and the master), pkts/req: packets over loopback per request
  (both hops, both directions: how the writes are batched), and conn/req:
  TCP connections accepted on the machine per request (h2load's 50, and the
  backend's: upstream connections a contender opens beyond its kept-alive
  ones).
- two loads, each contender in turn (rotating order) in every round:
  h2: HTTP/2 over TLS (ALPN h2). Both serve one self-signed ECDSA P-256
    certificate for localhost and 127.0.0.1 made with the openssl CLI (as
    tls_bench): nginx `listen ... ssl http2`, TLS 1.2/1.3, its default
    ciphers, no session cache nor tickets; smockron-proxy tls_cert / tls_key,
    tls_session_resumption = false (h2load makes one connection per client:
    resumption plays no part). Before the rounds a Python TLS client checks
    that each serves the certificate and selects h2 by ALPN.
  h2c: HTTP/2 in the clear with prior knowledge (h2load sends the preface on
    http:// URIs): nginx `listen ... http2` (no ssl), smockron-proxy's plain
    listener (http2 = true, its default).
  h2load prints the application protocol of every run: a run that did not
  speak h2 (TLS) or h2c (clear) fails the bench.
- same layout as proxy_bench: backend nginx (1 worker, `return 200`, HTTP/1.1),
  h2load and the smockron master on cpu 0; the proxy under test alone on
  cpu 1; nginx with 1 worker (one process serves both loads on two ports),
  proxy_http_version 1.1; smockron-proxy with 1 worker thread and the gate
  active (route with a domain, header identifier, master connected), one
  process per load (a listener is TLS or clear), both on cpu 1, both sending
  accounting to the one master. Both keep 128 idle upstream connections
  (--keepalive; as proxy_bench): with 500 streams in flight, both open and
  close upstream connections as the number in flight varies (conn/req shows
  how many); --keepalive 512 keeps them all.
- rounds where other processes used noticeable CPU, or with any failed,
  errored, timed-out or non-2xx request, are dropped; ratios smockron/nginx
  over paired rounds: median (min, max). The goal this was written for:
  req/s >= 1.0x nginx's and CPU per request <= 0.9x nginx's, both loads.
- at the end: accounting messages the smockron proxies published and dropped,
  and how many the master processed.
- `--only nginx` runs nginx alone (no smockron binaries needed);
  `--baseline DIR` adds another build's smockron-proxy (two processes, as for
  smockron) as contender 'baseline'.
- `--smoke`: 1 round of 1 s per load and contender (0.5 s warm-up, 4 clients
  with 4 streams each): exits 1 unless every contender served the certificate
  with ALPN h2, spoke h2 and h2c, answered every request of both loads with 2xx
  (no failed, errored or timed-out request), and the smockron proxies'
  accounting was published and processed by the master. No figure is judged.
"""
import argparse
import os
import re
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# proxy_bench also puts integration/ on the path and re-exports lib.config.one_box_toml.
from proxy_bench import (ROOT, children, cpu_seconds, free_port, metric_total, nginx_conf, one_box_toml,
                         system_busy_seconds)
from tls_bench import contenders_needed, make_certificate, passive_opens, start

LOADS = {  # name: (label, URI scheme, the protocol h2load must report)
    "h2": ("h2 (TLS)", "https", "h2"),
    "h2c": ("h2c", "http", "h2c"),
}
SMOCKRONS = ("smockron", "baseline")  # contenders that are smockron-proxy builds


def duration(seconds):
    """h2load's -D argument: whole seconds, or milliseconds."""
    return f"{int(seconds)}" if float(seconds).is_integer() else f"{int(round(seconds * 1000))}ms"


def to_us(value, unit):
    return float(value) * {"us": 1, "ms": 1000, "s": 1e6}[unit]


def loopback_packets():
    """Packets sent over the loopback interface so far (every connection of the bench is on it)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[9])  # transmit packets
    return 0


def run_h2load(port, scheme, seconds, clients, streams):
    """h2load (1 thread) on cpu 0 against 127.0.0.1:port for `seconds`: its figures, parsed.
    Fails with its output if it printed no result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    argv = ["taskset", "-c", "0", "h2load", "-t", "1", "-c", str(clients), "-m", str(streams),
            "-D", duration(seconds), "-H", "x-api-key: bench-client", f"{scheme}://127.0.0.1:{port}/"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = proc.stdout
    finished = re.search(r"^finished in ([\d.]+)(us|ms|s), ([\d.]+) req/s", out, re.MULTILINE)
    counts = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                       r"(\d+) errored, (\d+) timeout", out, re.MULTILINE)
    codes = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out, re.MULTILINE)
    request_time = re.search(r"^time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)",
                             out, re.MULTILINE)
    protocol = re.search(r"^Application protocol: (\S+)", out, re.MULTILINE)
    if not (finished and counts and codes):
        raise RuntimeError(f"h2load printed no result against port {port} (exit {proc.returncode}): "
                           f"{' '.join(argv)}\n{(out + proc.stderr)[-3000:]}")
    total, started, done, succeeded, failed, errored, timeout = map(int, counts.groups())
    ok, c3, c4, c5 = map(int, codes.groups())
    return {"rps": float(finished.group(3)), "requests": done, "succeeded": succeeded, "failed": failed,
            "errored": errored, "timeout": timeout, "2xx": ok, "non2xx": c3 + c4 + c5,
            "codes": codes.group(0), "counts": counts.group(0),
            "mean_us": to_us(*request_time.group(5, 6)) if request_time else float("nan"),
            "max_us": to_us(*request_time.group(3, 4)) if request_time else float("nan"),
            "protocol": protocol.group(1) if protocol else "none",
            "h2load_cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "exit": proc.returncode, "output": out + proc.stderr}


def measure(port, scheme, pids, others, seconds, clients, streams):
    """One h2load run against the contender `pids` listening on `port`: its CPU us per request,
    how busy its core and the load core (cpu 0) were, and the noise: cores used by anything that
    is neither the contender, `others` nor h2load."""
    c0, o0, s0, t0 = cpu_seconds(pids), cpu_seconds(others), system_busy_seconds(), time.time()
    l0, opens0, packets0 = system_busy_seconds("cpu0 "), passive_opens(), loopback_packets()
    r = run_h2load(port, scheme, seconds, clients, streams)
    c1, o1, s1, t1 = cpu_seconds(pids), cpu_seconds(others), system_busy_seconds(), time.time()
    # TCP connections accepted per request (h2load's own and the backend's: upstream connection churn)
    r["conn_per_req"] = (passive_opens() - opens0) / r["requests"] if r["requests"] else float("nan")
    # TCP segments per request, both hops and both directions (how the writes are batched)
    r["pkts_per_req"] = (loopback_packets() - packets0) / r["requests"] if r["requests"] else float("nan")
    wall = t1 - t0
    r["load"] = (system_busy_seconds("cpu0 ") - l0) / wall  # h2load + backend (+ master) core
    r["cpu_us"] = (c1 - c0) / r["requests"] * 1e6 if r["requests"] else float("nan")
    r["busy"] = (c1 - c0) / wall
    r["client_us"] = r["h2load_cpu"] / r["requests"] * 1e6 if r["requests"] else float("nan")
    r["noise"] = max(0.0, ((s1 - s0) - (c1 - c0) - (o1 - o0) - r["h2load_cpu"]) / wall)
    return r


def problems_of(r, load):
    """What is wrong with one run: [] when every request was answered 2xx over the right protocol."""
    out = []
    want = LOADS[load][2]
    if r["protocol"] != want:
        out.append(f"application protocol {r['protocol']} (not {want})")
    if r["requests"] == 0 or r["succeeded"] == 0:
        out.append("no request completed")
    if r["failed"] or r["errored"] or r["timeout"] or r["non2xx"] or r["succeeded"] != r["requests"]:
        out.append(f"h2load: '{r['counts']}'; '{r['codes']}'")
    if r["exit"] != 0:
        out.append(f"h2load exited with {r['exit']}")
    return out


def start_all(args, names, tmp, procs):
    """Backend, contenders (and the smockron master), all serving one new certificate.
    Returns {contender: {load: (port, pids)}}, the pids whose CPU is not noise, the admin
    ports of the smockron proxies, the master's admin port and the cert path."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    cert, key = make_certificate(tmp)
    backend_port, acct, ctrl, madmin = free_port(), free_port(), free_port(), free_port()
    ports = {(name, load): (free_port(), free_port()) for name in names for load in LOADS}  # listener, admin

    backend_conf = nginx_conf(os.path.join(tmp, "backend"), f"""
  server {{ listen 127.0.0.1:{backend_port} backlog=4096; location / {{ return 200 "ok\\n"; }} }}""")
    os.makedirs(os.path.join(tmp, "backend", "tmp"), exist_ok=True)
    start(procs, "backend", [nginx, "-c", backend_conf, "-p", os.path.join(tmp, "backend")], 0, backend_port, tmp)

    if "nginx" in names:
        tls_port, h2c_port = ports[("nginx", "h2")][0], ports[("nginx", "h2c")][0]
        location = 'location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }'
        peer_conf = nginx_conf(os.path.join(tmp, "peer"), f"""
  upstream app {{ server 127.0.0.1:{backend_port}; keepalive {args.keepalive}; }}
  server {{ listen 127.0.0.1:{tls_port} ssl http2 backlog=4096;
    ssl_certificate {cert}; ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3; ssl_ciphers HIGH:!aNULL:!MD5;
    ssl_session_cache off; ssl_session_tickets off;
    {location} }}
  server {{ listen 127.0.0.1:{h2c_port} http2 backlog=4096;
    {location} }}""")
        os.makedirs(os.path.join(tmp, "peer", "tmp"), exist_ok=True)
        start(procs, "nginx", [nginx, "-c", peer_conf, "-p", os.path.join(tmp, "peer")], 1, tls_port, tmp)
        wait_listening = [h2c_port]
    else:
        wait_listening = []

    def smockron_conf(name, load):
        port, admin = ports[(name, load)]
        tls = (f'tls_cert = "{cert}"\ntls_key = "{key}"\ntls_session_resumption = false\n' if load == "h2" else "")
        path = os.path.join(tmp, f"{name}-{load}.toml")
        with open(path, "w") as f:
            f.write(one_box_toml(domain="bench", rule='{ rate = "10000000/s", burst = 1000000 }',
                                 backend_port=backend_port, proxy_port=port, proxy_admin=admin,
                                 master_admin=madmin, accounting=acct, control=ctrl,
                                 identify='"header:X-API-Key", "ip"', upstream_extra=f"keepalive = {args.keepalive}",
                                 proxy_extra=tls + "http2 = true"))
        return path

    bins = {"smockron": args.bin, "baseline": args.baseline}
    if any(n in SMOCKRONS for n in names):
        start(procs, "master", [os.path.join(args.bin, "smockron-master"), "--config",
                                smockron_conf(next(n for n in names if n in SMOCKRONS), "h2c"),
                                "--log-level", "warn"], 0, madmin, tmp)
    for name in names:
        if name in bins:
            for load in LOADS:
                start(procs, f"{name}-{load}", [os.path.join(bins[name], "smockron-proxy"), "--config",
                                                smockron_conf(name, load), "--log-level", "warn"],
                      1, ports[(name, load)][0], tmp)
    for port in wait_listening:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass

    time.sleep(0.5)  # nginx's workers are forked
    contenders = {}
    for name in names:
        if name == "nginx":
            pids = [procs["nginx"].p.pid] + children(procs["nginx"].p.pid)
            contenders[name] = {load: (ports[(name, load)][0], pids) for load in LOADS}
        else:
            contenders[name] = {load: (ports[(name, load)][0], [procs[f"{name}-{load}"].p.pid]) for load in LOADS}
    others = [procs["backend"].p.pid] + children(procs["backend"].p.pid)
    if "master" in procs:
        others.append(procs["master"].p.pid)
    admins = [ports[(name, load)][1] for name in names if name in SMOCKRONS for load in LOADS]
    return contenders, others, admins, madmin, cert


def alpn_probe(port, cert):
    """A TLS handshake with 127.0.0.1:port offering h2 and http/1.1, checking that it serves
    `cert` for localhost. Returns (protocol, cipher, ALPN selected)."""
    ctx = ssl.create_default_context(cafile=cert)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
                ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            return tls.version(), tls.cipher()[0], tls.selected_alpn_protocol()
    except OSError as e:  # ssl.SSLError and timeouts too
        raise RuntimeError(f"no TLS on port {port}: {e}") from None


def warm_up(args, contenders):
    print(f"warm-up ({args.warmup:g}s each) ...", flush=True)
    for name, loads in contenders.items():
        for load, (port, _) in loads.items():
            r = run_h2load(port, LOADS[load][1], args.warmup, args.clients, args.streams)
            print(f"  {name} {load}: application protocol {r['protocol']}, {r['rps']:.0f} req/s; {r['counts']}",
                  flush=True)


def wait_linked(admins, deadline_s=20.0):
    """Waits until every smockron proxy says its master is connected (/readyz), so that the
    accounting the rounds publish has somewhere to go; False at the deadline."""
    def linked(port):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                body = r.read().decode()
        except urllib.error.HTTPError as e:  # not ready: its body says why
            body = e.read().decode()
        except OSError:
            return False
        return "masters connected: 1/1" in body

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if all(linked(a) for a in admins):
            return True
        time.sleep(0.1)
    return False


def accounting(admins, madmin):
    """(published, dropped, unsent, HTTP/2 requests) summed over the smockron proxies, and processed
    by the master, so far."""
    def total(name):
        return sum(metric_total(a, name) for a in admins)
    return {"published": total("smockron_proxy_accounting_messages_total"),
            "dropped": total("smockron_proxy_accounting_dropped_total"),
            "unsent": total("smockron_proxy_accounting_unsent_total"),
            "h2": total('smockron_proxy_http_requests_total{protocol="h2"}'),
            "processed": metric_total(madmin, "smockron_master_accounting_messages_total")}


def run_rounds(args, contenders, others):
    """args.rounds rounds of every load for every contender: {(name, load): [result]}."""
    results = {(name, load): [] for name in contenders for load in LOADS}
    print(f"{'round':>5} {'load':>8} {'who':>9} {'req/s':>9} {'mean us':>8} {'max us':>8} {'cpu us/req':>10} "
          f"{'busy':>5} {'load':>5} {'h2load us':>9} {'pkts/req':>8} {'conn/req':>8} {'noise':>6}")
    order = list(contenders)
    for rnd in range(args.rounds):
        for load, (label, scheme, _) in LOADS.items():
            for name in order[rnd % len(order):] + order[:rnd % len(order)]:  # each goes first in turn
                port, pids = contenders[name][load]
                r = measure(port, scheme, pids, others, args.seconds, args.clients, args.streams)
                r["problems"] = problems_of(r, load)
                r["kept"] = r["noise"] < 0.10 and not r["problems"]
                results[(name, load)].append(r)
                note = "" if r["kept"] else "  (dropped)"
                if r["problems"]:
                    note += "  " + "; ".join(r["problems"])
                print(f"{rnd:>5} {load:>8} {name:>9} {r['rps']:>9.0f} {r['mean_us']:>8.0f} {r['max_us']:>8.0f} "
                      f"{r['cpu_us']:>10.1f} {r['busy']*100:>4.0f}% {r['load']*100:>4.0f}% {r['client_us']:>9.1f} "
                      f"{r['pkts_per_req']:>8.2f} {r['conn_per_req']:>8.4f} {r['noise']:>6.2f}{note}", flush=True)
                if r["problems"] and not args.smoke:
                    print("      h2load printed:\n" + "\n".join(
                        "        " + line for line in r["output"].splitlines()
                        if line.startswith(("finished", "requests:", "status codes:", "Application", "TLS",
                                            "Cipher", "time for request"))), flush=True)
    return results


def report(args, contenders, results):
    """Medians per contender and load (over the kept rounds), then the ratios of paired rounds."""
    def median(rs, key):
        return statistics.median(r[key] for r in rs)

    for load, (label, _, _) in LOADS.items():
        print(f"\n{label} ({args.clients} clients x {args.streams} streams, {args.seconds:g} s runs):")
        for name in contenders:
            kept = [r for r in results[(name, load)] if r["kept"]]
            rs = kept or results[(name, load)]
            print(f"{name:>9}: median {median(rs, 'rps'):.0f} req/s, mean {median(rs, 'mean_us'):.0f} us/request, "
                  f"cpu {median(rs, 'cpu_us'):.1f} us/req, core busy {median(rs, 'busy')*100:.0f}%, "
                  f"load core busy {median(rs, 'load')*100:.0f}% (h2load {median(rs, 'client_us'):.1f} us/req), "
                  f"{median(rs, 'pkts_per_req'):.2f} packets/req, {median(rs, 'conn_per_req'):.4f} conn/req  "
                  f"({len(kept)} rounds kept)")

    def ratio_line(label, x, y, load, key):
        rs = [a[key] / b[key] for a, b in zip(results[(x, load)], results[(y, load)]) if a["kept"] and b["kept"]]
        if not rs:
            return f"  {label:<20} no paired rounds kept"
        return (f"  {label:<20} {statistics.median(rs):.2f} "
                f"(min {min(rs):.2f}, max {max(rs):.2f}, {len(rs)} paired rounds)")

    for x, y in (("smockron", "nginx"), ("baseline", "nginx"), ("smockron", "baseline")):
        if x in contenders and y in contenders:
            print(f"\nratios {x}/{y}, median of paired rounds:")
            for load in LOADS:
                print(ratio_line(f"{load} req/s", x, y, load, "rps"))
                print(ratio_line(f"{load} CPU/request", x, y, load, "cpu_us"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per contender and load (alternating; default 5, smoke 1)")
    ap.add_argument("--seconds", type=float, default=None, help="length of one h2load run (default 5, smoke 1)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="length of the warm-up run per contender and load (default 2, smoke 0.5)")
    ap.add_argument("--clients", "-c", type=int, default=None,
                    help="h2load clients, one connection each (default 50, smoke 4)")
    ap.add_argument("--streams", "-m", type=int, default=None,
                    help="h2load concurrent streams per connection (default 10, smoke 4)")
    ap.add_argument("--keepalive", type=int, default=128,
                    help="idle upstream connections both contenders keep (nginx `keepalive`, smockron's upstream "
                         "`keepalive`; default 128, as proxy_bench): below clients x streams, both open and close "
                         "upstream connections as the streams in flight vary (the conn/req column)")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round of 1 s per load, 0.5 s warm-up, 4 clients x 4 streams (unless given): exit 1 "
                         "unless every request of both loads was answered 2xx over h2 and h2c and the accounting "
                         "reached the master")
    ap.add_argument("--only", choices=("smockron", "nginx"), help="run one contender alone")
    ap.add_argument("--bin", default=os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run DIR/smockron-proxy (another build) as contender 'baseline'")
    args = ap.parse_args()
    for name, default, smoke in (("rounds", 5, 1), ("seconds", 5, 1), ("warmup", 2, 0.5),
                                 ("clients", 50, 4), ("streams", 10, 4)):
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else default)
    names = contenders_needed(args, ("nginx", "h2load", "taskset", "openssl"),
                              " (h2load: Debian's nghttp2-client)")

    tmp = tempfile.mkdtemp(prefix="smockron-h2-bench-")
    procs = {}  # name: Proc, in start order
    try:
        contenders, others, admins, madmin, cert = start_all(args, names, tmp, procs)
        problems = []
        negotiated = {}
        for name, loads in contenders.items():
            protocol, cipher, alpn = alpn_probe(loads["h2"][0], cert)
            negotiated[name] = (protocol, cipher)
            print(f"{name:>9}: {protocol} {cipher}, ALPN {alpn}")
            if alpn != "h2":
                problems.append(f"{name} selected ALPN {alpn!r} when offered h2 and http/1.1")
        if len(set(negotiated.values())) > 1:
            print("warning: the contenders negotiate different protocols or ciphers with OpenSSL's defaults")

        if admins and not wait_linked(admins):
            problems.append("the smockron proxies' links to the master did not come up within 20 s")
        results = {}
        if not problems:
            warm_up(args, contenders)
            if admins:
                time.sleep(0.5)  # the warm-up's accounting settles
                before = accounting(admins, madmin)
            results = run_rounds(args, contenders, others)
            report(args, contenders, results)
        if admins and results:
            time.sleep(1.0)  # the master catches up on what is queued before it is asked
            after = accounting(admins, madmin)
            published, processed, h2 = (after[k] - before[k] for k in ("published", "processed", "h2"))
            requests = sum(r["requests"] for (n, _), rs in results.items() if n in SMOCKRONS for r in rs)
            print(f"\naccounting: {requests} requests in smockron rounds (h2load's done), {h2:.0f} HTTP/2 requests "
                  f"counted by the proxies, {published:.0f} messages published, {after['dropped']:.0f} dropped, "
                  f"{after['unsent']:.0f} unsent, {processed:.0f} processed by the master")
            if published <= 0 or processed <= 0:
                problems.append(f"the gate's accounting was not seen: {published:.0f} messages published by the "
                                f"proxies, {processed:.0f} processed by the master (both must be > 0)")
        if args.smoke:
            for (name, load), rs in results.items():
                for i, r in enumerate(rs):
                    problems += [f"{name} {load} round {i}: {p}" for p in r["problems"]]
            for p in problems:
                print(f"smoke: FAIL: {p}")
            if problems:
                return 1
            print(f"smoke: OK: {', '.join(contenders)} served ALPN h2 over TLS and h2c with prior knowledge and "
                  f"answered every request of both loads 2xx"
                  + ("; accounting published and processed" if admins else ""))
        elif problems:
            for p in problems:
                print(f"error: {p}")
            return 1
        return 0
    except RuntimeError as e:
        sys.exit(f"h2_bench: {e}")
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
