#!/usr/bin/env python3
"""smockron-proxy vs nginx with TLS on the listener, side by side in one run.

Method (that of proxy_bench.py, whose helpers this uses):
- certificate: one self-signed ECDSA P-256 certificate for localhost and
  127.0.0.1, made with the openssl CLI at start, served by both contenders.
  nginx: ssl_protocols TLSv1.2 TLSv1.3, ssl_ciphers HIGH:!aNULL:!MD5 (its
  default, which smockron-proxy uses too; TLS 1.3 suites are OpenSSL's on
  both), no session cache and no session tickets; smockron-proxy: [proxy]
  tls_cert / tls_key, tls_session_resumption = false. With --resumption both
  allow it (nginx: ssl_session_cache shared:SSL:10m, tickets on; smockron:
  its default), and wrk resumes. Before the rounds a Python client (OpenSSL
  defaults, like wrk) prints what each negotiates and whether it would resume.
- same setup as proxy_bench: backend nginx (1 worker, `return 200`), wrk
  (1 thread) and the smockron master on cpu 0; the proxy under test alone on
  cpu 1; nginx with 1 worker and upstream keepalive 128, smockron-proxy with
  1 worker thread and the gate active. Both speak plain HTTP to the backend.
- two loads, each contender in turn (rotating order) in every round:
  keep-alive: wrk over https with keep-alive connections: req/s, p50/p99,
    proxy CPU us per request.
  handshake: the same with `Connection: close`, so every request is a new
    TCP connection and a full TLS handshake: handshakes/s and proxy CPU us
    per handshake (with its one request). The conn/req column (TCP
    connections accepted per request, /proc/net/snmp) checks it is ~1.
    wrk resumes sessions when a server allows it; the probe says so if one does.
    wrk's side of the handshakes fills the load core (`load` ~100%) before the
    proxy's: handshakes/s is then the client's ceiling, and CPU per handshake
    is the figure that compares the contenders.
- rounds where other processes used noticeable CPU (or with errors) are
  dropped; ratios smockron/nginx over paired rounds: median (min, max).
- `--only nginx` runs nginx alone (no smockron binaries needed);
  `--baseline DIR` adds another build's smockron-proxy, as in proxy_bench.
- `--smoke`: 1 round of 1 s per load and contender (1 s warm-up, 10
  connections): exits 1 unless every contender served the certificate,
  answered every request of both loads with 2xx and no socket error, and the
  handshake load opened a connection per request. No figure is judged.
"""
import argparse
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

# proxy_bench also puts integration/ on the path and re-exports lib.config.one_box_toml.
from proxy_bench import ROOT, Proc, children, free_port, measure, nginx_conf, one_box_toml, run_wrk, wait_port

LOADS = {  # name: (label, headers added to every request, unit of the rate, unit of CPU)
    "keepalive": ("keep-alive", (), "req/s", "us/req"),
    "handshake": ("handshake", ("Connection: close",), "handshakes/s", "us/handshake"),
}


def make_certificate(directory):
    """A self-signed ECDSA P-256 certificate for localhost and 127.0.0.1: (cert path, key path)."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def start(procs, name, argv, cpu, port, tmp):
    """Starts argv pinned to `cpu` as procs[name], logging to tmp/NAME.log, and waits until
    it listens on `port`; if it exits or does not listen, fails with the end of its log."""
    path = os.path.join(tmp, f"{name}.log")
    with open(path, "w") as log:
        procs[name] = Proc(argv, cpu, log)
    try:
        wait_port(port, proc=procs[name].p)
    except RuntimeError as e:
        with open(path) as log:
            tail = log.read()[-2000:].strip() or "(its log is empty)"
        raise RuntimeError(f"{name} did not come up ({e}):\n{tail}") from None


def start_all(args, names, tmp, procs):
    """Backend, contenders (and the smockron master), all serving one new certificate.
    Returns {contender: (port, pids)}, the pids whose CPU is not noise, and the cert path."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    cert, key = make_certificate(tmp)
    backend_port, acct, ctrl, madmin = free_port(), free_port(), free_port(), free_port()
    ports = {name: (free_port(), free_port()) for name in names}  # listener, admin

    backend_conf = nginx_conf(os.path.join(tmp, "backend"), f"""
  server {{ listen 127.0.0.1:{backend_port} backlog=4096; location / {{ return 200 "ok\\n"; }} }}""")
    os.makedirs(os.path.join(tmp, "backend", "tmp"), exist_ok=True)
    start(procs, "backend", [nginx, "-c", backend_conf, "-p", os.path.join(tmp, "backend")], 0, backend_port, tmp)

    if "nginx" in names:
        port = ports["nginx"][0]
        peer_conf = nginx_conf(os.path.join(tmp, "peer"), f"""
  upstream app {{ server 127.0.0.1:{backend_port}; keepalive 128; }}
  server {{ listen 127.0.0.1:{port} ssl backlog=4096;
    ssl_certificate {cert}; ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3; ssl_ciphers HIGH:!aNULL:!MD5;
    {"ssl_session_cache shared:SSL:10m; ssl_session_tickets on;" if args.resumption
     else "ssl_session_cache off; ssl_session_tickets off;"}
    location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }} }}""")
        os.makedirs(os.path.join(tmp, "peer", "tmp"), exist_ok=True)
        start(procs, "nginx", [nginx, "-c", peer_conf, "-p", os.path.join(tmp, "peer")], 1, port, tmp)

    def smockron_conf(name):
        port, admin = ports[name]
        path = os.path.join(tmp, f"{name}.toml")
        with open(path, "w") as f:
            f.write(one_box_toml(domain="bench", rule='{ rate = "10000000/s", burst = 1000000 }',
                                 backend_port=backend_port, proxy_port=port, proxy_admin=admin,
                                 master_admin=madmin, accounting=acct, control=ctrl,
                                 identify='"header:X-API-Key", "ip"', upstream_extra="keepalive = 128",
                                 proxy_extra=f'tls_cert = "{cert}"\ntls_key = "{key}"\n'
                                             f'tls_session_resumption = {"true" if args.resumption else "false"}'))
        return path

    bins = {"smockron": args.bin, "baseline": args.baseline}
    if "smockron" in names:
        start(procs, "master", [os.path.join(args.bin, "smockron-master"), "--config", smockron_conf("smockron"),
                                "--log-level", "warn"], 0, madmin, tmp)
    for name in names:
        if name in bins:
            start(procs, name, [os.path.join(bins[name], "smockron-proxy"), "--config", smockron_conf(name),
                                "--log-level", "warn"], 1, ports[name][0], tmp)

    time.sleep(0.5)  # nginx's workers are forked
    contenders = {name: (ports[name][0], [procs[name].p.pid] + children(procs[name].p.pid)) for name in names}
    others = [procs["backend"].p.pid] + children(procs["backend"].p.pid)
    if "master" in procs:
        others.append(procs["master"].p.pid)
    return contenders, others, cert


def tls_probe(port, cert):
    """Two requests over TLS to 127.0.0.1:port, checking that it serves `cert` for
    localhost; the second offers the first's session. Returns (protocol, cipher, resumed)."""
    ctx = ssl.create_default_context(cafile=cert)

    def get(session=None):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
                ctx.wrap_socket(sock, server_hostname="localhost", session=session) as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-API-Key: bench-client\r\n"
                        b"Connection: close\r\n\r\n")
            response = b""
            while chunk := tls.recv(4096):  # a TLS 1.3 ticket, if any, comes with the response
                response += chunk
            if not response.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"port {port} answered {response[:60]!r}")
            return tls.session, tls.session_reused, tls.version(), tls.cipher()[0]

    try:
        session, _, protocol, cipher = get()
        resumed = get(session)[1]
    except OSError as e:  # ssl.SSLError and timeouts too
        raise RuntimeError(f"no TLS on port {port}: {e}") from None
    return protocol, cipher, resumed


def passive_opens():
    """TCP connections accepted on this machine so far."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("PassiveOpens")])


def run_rounds(args, contenders, others):
    """Warm-up, then args.rounds rounds of every load for every contender: {(name, load): [result]}."""
    warmup = 1 if args.smoke else max(2, args.seconds // 2)
    print(f"warm-up ({warmup}s each) ...", flush=True)
    for port, _ in contenders.values():
        for _, headers, _, _ in LOADS.values():
            run_wrk(port, warmup, args.connections, scheme="https", headers=headers)

    results = {(name, load): [] for name in contenders for load in LOADS}
    print(f"{'round':>5} {'load':>10} {'who':>9} {'req/s':>9} {'p50 us':>8} {'p99 us':>8} {'cpu us/req':>10} "
          f"{'busy':>5} {'load':>5} {'conn/req':>8} {'noise':>6}")
    order = list(contenders)
    for rnd in range(args.rounds):
        for load, (label, headers, _, _) in LOADS.items():
            for name in order[rnd % len(order):] + order[:rnd % len(order)]:  # each goes first in turn
                port, pids = contenders[name]
                perf = None
                if args.perf and name == "smockron" and rnd == 0:
                    perf = subprocess.Popen(["perf", "record", "-q", "-g", "-o", f"{args.perf}.{load}",
                                             "-p", str(pids[0])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                opens0 = passive_opens()
                r = measure(port, pids, others, args.seconds, args.connections, scheme="https", headers=headers)
                r["conn_per_req"] = (passive_opens() - opens0) / r["requests"]
                if perf:
                    perf.send_signal(signal.SIGINT)
                    perf.wait()
                r["kept"] = r["noise"] < 0.10 and r["errors"] == 0 and r["socket_errors"] == 0
                results[(name, load)].append(r)
                note = "" if r["kept"] else "  (dropped)"
                if r["errors"] or r["socket_errors"]:
                    note += f"  {r['errors']} non-2xx, {r['socket_errors']} socket errors"
                print(f"{rnd:>5} {label:>10} {name:>9} {r['rps']:>9.0f} {r['p50']:>8.0f} {r['p99']:>8.0f} "
                      f"{r['cpu_us']:>10.1f} {r['busy']*100:>4.0f}% {r['load']*100:>4.0f}% "
                      f"{r['conn_per_req']:>8.2f} {r['noise']:>6.2f}{note}", flush=True)
    return results


def report(args, contenders, results):
    """Medians per contender and load (over the kept rounds), then the ratios of paired rounds."""
    def median(rs, key):
        return statistics.median(r[key] for r in rs)

    for load, (label, _, rate_unit, cpu_unit) in LOADS.items():
        print(f"\n{label} ({args.connections} connections{', Connection: close' if load == 'handshake' else ''}):")
        for name in contenders:
            kept = [r for r in results[(name, load)] if r["kept"]]
            rs = kept or results[(name, load)]
            print(f"{name:>9}: median {median(rs, 'rps'):.0f} {rate_unit}, p50 {median(rs, 'p50'):.0f} us, "
                  f"p99 {median(rs, 'p99'):.0f} us, cpu {median(rs, 'cpu_us'):.1f} {cpu_unit}, "
                  f"core busy {median(rs, 'busy')*100:.0f}%, load core busy {median(rs, 'load')*100:.0f}%, "
                  f"{median(rs, 'conn_per_req'):.2f} conn/req  ({len(kept)} rounds kept)")
        if load == "handshake" and any(median(results[(n, load)], "conn_per_req") < 0.95 for n in contenders):
            print("warning: fewer TCP connections than requests: not every request was a new handshake")

    def ratio_line(label, x, y, load, key):
        rs = [a[key] / b[key] for a, b in zip(results[(x, load)], results[(y, load)]) if a["kept"] and b["kept"]]
        if not rs:
            return f"  {label:<24} no paired rounds kept (machine too noisy)"
        return (f"  {label:<24} {statistics.median(rs):.2f} "
                f"(min {min(rs):.2f}, max {max(rs):.2f}, {len(rs)} paired rounds)")

    for x, y in (("smockron", "nginx"), ("baseline", "nginx"), ("smockron", "baseline")):
        if x in contenders and y in contenders:
            print(f"\nratios {x}/{y}, median of paired rounds:")
            print(ratio_line("keep-alive req/s", x, y, "keepalive", "rps"))
            print(ratio_line("keep-alive CPU/request", x, y, "keepalive", "cpu_us"))
            print(ratio_line("handshakes/s", x, y, "handshake", "rps"))
            print(ratio_line("CPU/handshake", x, y, "handshake", "cpu_us"))


def smoke_failures(contenders, results):
    """--smoke: every run of every contender and load answered all its requests 2xx without a
    socket error, and the handshake load opened (at least) one TCP connection per request."""
    problems = []
    for name in contenders:
        for load, (label, _, _, _) in LOADS.items():
            for i, r in enumerate(results[(name, load)]):
                if r["errors"] or r["socket_errors"]:
                    problems.append(f"{name} {label} round {i}: {r['errors']} non-2xx responses, "
                                    f"{r['socket_errors']} socket errors (of {r['requests']} requests)")
                if load == "handshake" and r["conn_per_req"] < 0.95:
                    problems.append(f"{name} {label} round {i}: {r['conn_per_req']:.2f} TCP connections per request: "
                                    f"not every request was a new handshake")
    return problems


def contenders_needed(args, tools, hint: str = "") -> list[str]:
    """The contenders of this run (smockron, nginx, baseline: --only and --baseline), after
    checking that `tools` and the smockron binaries they need are there (exits with a message if not)."""
    names = [n for n in ("smockron", "nginx") if args.only in (None, n)]
    if args.baseline and "smockron" in names:
        names.append("baseline")
    for tool in tools:
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            sys.exit(f"{tool} is missing: run scripts/install-deps.sh --test{hint}")
    needed = [os.path.join(args.bin, "smockron-master")] if "smockron" in names else []
    needed += [os.path.join(d, "smockron-proxy") for n, d in (("smockron", args.bin), ("baseline", args.baseline))
               if n in names]
    for path in needed:
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: build it, or pass --only nginx")
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per contender and load (alternating; default 10, smoke 1)")
    ap.add_argument("--seconds", type=int, default=None, help="length of one wrk run (default 5, smoke 1)")
    ap.add_argument("--connections", type=int, default=None, help="wrk connections, both loads (default 50, smoke 10)")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round of 1 s per load, 1 s warm-up, 10 connections (unless given): exit 1 unless every "
                         "request was answered 2xx over TLS and every handshake-load request had its own connection")
    ap.add_argument("--only", choices=("smockron", "nginx"), help="run one contender alone")
    ap.add_argument("--resumption", action="store_true",
                    help="both allow session resumption (tickets and a session cache): wrk then resumes, and the "
                         "handshake load measures resumed handshakes; default: full handshakes only")
    ap.add_argument("--perf", metavar="PREFIX",
                    help="also record perf profiles of smockron-proxy's first round of each load: "
                         "PREFIX.keepalive, PREFIX.handshake")
    ap.add_argument("--bin", default=os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run DIR/smockron-proxy (another build) as contender 'baseline'")
    args = ap.parse_args()
    for name, default, smoke in (("rounds", 10, 1), ("seconds", 5, 1), ("connections", 50, 10)):
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else default)
    names = contenders_needed(args, ("nginx", "wrk", "taskset", "openssl"))

    tmp = tempfile.mkdtemp(prefix="smockron-tls-bench-")
    procs = {}  # name: Proc, in start order
    try:
        contenders, others, cert = start_all(args, names, tmp, procs)
        negotiated = {}
        for name, (port, _) in contenders.items():
            protocol, cipher, resumed = tls_probe(port, cert)
            negotiated[name] = (protocol, cipher)
            print(f"{name:>9}: {protocol} {cipher}, "
                  + ("RESUMES sessions: its handshake figures include resumed handshakes" if resumed
                     else "no session resumption"))
        if len(set(negotiated.values())) > 1:
            print("warning: the contenders negotiate different protocols or ciphers")
        results = run_rounds(args, contenders, others)
        report(args, contenders, results)
        if args.smoke:
            problems = smoke_failures(contenders, results)
            for p in problems:
                print(f"smoke: FAIL: {p}")
            if problems:
                return 1
            print(f"smoke: OK: {', '.join(contenders)} served TLS and answered every request of both loads; "
                  f"every handshake-load request came on a new connection")
        return 0
    except RuntimeError as e:
        sys.exit(f"tls_bench: {e}")
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
