#!/usr/bin/env python3
"""Checks of the container image and the compose stack, run by
scripts/test-image.sh once they are built (podman, podman-compose; settings
from scripts/podman-env.sh in the environment). Not a unittest module: the
image build takes minutes, so the script runs it once, then these.

  image_checks.py image --container NAME     the image alone (smockron:latest)
  image_checks.py compose --project NAME     docker-compose.yml, up, used, down
  image_checks.py compose --project NAME --links curve   the same with CURVE keys (fewer checks)

Every wait polls with a deadline; ports are free ones on 127.0.0.1.
Exit status 0 when every check passed; a failed check prints what it saw.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.http1 import http_get  # noqa: E402
from lib.metrics import metric  # noqa: E402
from lib.ports import free_ports  # noqa: E402
from lib.timing import WaitTimeout, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*cmd: str, check: bool = True, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if check and p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def answers(port: int, path: str = "/", timeout: float = 2.0):
    try:
        return http_get(port, path, timeout=timeout)
    except OSError:
        return None


def healthy(container: str) -> bool:
    return run("podman", "healthcheck", "run", container, check=False, timeout=30).returncode == 0


# --------------------------------------------------------------------------------------- the image


def image_checks(container: str) -> None:
    (port,) = free_ports(1)
    run("podman", "run", "-d", "--name", container, "-p", f"127.0.0.1:{port}:8080", "smockron:latest")
    try:
        # Published on the host's loopback, bound inside on every interface: it answers.
        r = wait_until(lambda: answers(port), 30, message="the image's proxy answers on its published port")
        # (No backend in the default configuration: the proxy's own 502.)
        check(r.status == 502, f"the default configuration listens on every interface (answered {r.status})")
        wait_until(lambda: healthy(container), 30, interval=0.5, message="HEALTHCHECK passes")
        check(True, "its HEALTHCHECK passes (podman healthcheck run)")
        health = run("podman", "inspect", "--format", "{{json .Config.Healthcheck}}", container).stdout
        check("--healthcheck" in health, f"the image carries its HEALTHCHECK (--format docker): {health.strip()}")
        uid = run("podman", "exec", container, "id", "-u").stdout.strip()
        check(uid == "10001", f"the runtime stage runs as non-root (uid {uid})")
        compilers = run("podman", "exec", container, "sh", "-c",
                        "for c in cc gcc g++ c++ clang clang++ cmake ninja make ld; do command -v $c; done; true").stdout
        check(compilers.strip() == "", f"no compiler or build tool in the image ({compilers.split()})")
        versions = run("podman", "exec", container, "smockron-master", "--version").stdout.strip()
        check(versions.startswith("smockron-master"), f"the master is in the image too ({versions})")
    finally:
        run("podman", "rm", "-f", container, check=False)


# ------------------------------------------------------------------------------- the compose stack


class Stack:
    def __init__(self, project: str, links: str = ""):
        self.project = project
        ports = free_ports(5)
        self.env = dict(os.environ, SMOCKRON_PROXY1_PORT=str(ports[0]), SMOCKRON_PROXY2_PORT=str(ports[1]),
                        SMOCKRON_MASTER_ADMIN_PORT=str(ports[2]), SMOCKRON_PROXY1_ADMIN_PORT=str(ports[3]),
                        SMOCKRON_PROXY2_ADMIN_PORT=str(ports[4]))
        if links:
            self.env["SMOCKRON_LINKS"] = links
        self.proxy1, self.proxy2, self.master_admin, self.proxy1_admin, self.proxy2_admin = ports

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return run("podman-compose", "-p", self.project, "-f", "docker-compose.yml", *args, timeout=timeout,
                   env=self.env)

    def container(self, service: str) -> str:
        out = run("podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}",
                  "--filter", f"label=com.docker.compose.service={service}", "--format", "{{.Names}}").stdout.split()
        if len(out) != 1:
            raise SystemExit(f"expected one container for {service}, found {out}")
        return out[0]

    def running(self) -> list[str]:
        """The stack's containers (running or not) and pods."""
        containers = run("podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}",
                         "--format", "{{.Names}}").stdout.split()
        pods = run("podman", "pod", "ps", "--filter", f"name={self.project}", "--format", "{{.Name}}").stdout.split()
        return containers + pods

    def leftovers(self) -> list[str]:
        """The stack's networks and volumes."""
        networks = [n for n in run("podman", "network", "ls", "--format", "{{.Name}}").stdout.split()
                    if n.startswith(self.project)]
        volumes = [v for v in run("podman", "volume", "ls", "--format", "{{.Name}}").stdout.split()
                   if v.startswith(self.project)]
        return networks + volumes


def request(port: int, key: str):
    return http_get(port, "/", timeout=10, headers={"X-API-Key": key})


def compose_checks(project: str, links: str = "") -> None:
    """The stack up, used and down; with links="curve" its links speak CURVE
    (keys made by scripts/compose-keys.sh), and the checks stop after the
    shared limit."""
    s = Stack(project, links)
    if links:
        run("bash", "scripts/compose-keys.sh", timeout=60)
    try:
        s.compose("up", "-d")
        services = ["redis", "backend", "master", "proxy1", "proxy2"]
        running = {svc: s.container(svc) for svc in services}
        for svc in ("redis", "master", "proxy1", "proxy2"):
            wait_until(lambda c=running[svc]: healthy(c), 90, interval=1, message=f"{svc} healthy")
            check(True, f"{svc}: its health check passes")
        # Both gatekeepers have the master (DNS by service name on the stack's network).
        for port in (s.proxy1_admin, s.proxy2_admin):
            wait_until(lambda p=port: (r := answers(p, "/readyz")) and "masters connected: 1/1" in r.body, 60,
                       message=f"proxy admin {port}: masters connected: 1/1")
        check(True, "both proxies connected to the master")
        # ... and hold its POLICY for the demo domain (each one's guard bounds the first round trip).
        for port in (s.proxy1_admin, s.proxy2_admin):
            wait_until(lambda p=port: (r := answers(p, "/status")) and any(
                d["name"] == "demo" and d["covered_by_a_master"] for d in json.loads(r.body)["domains"]), 60,
                message=f"proxy admin {port}: the demo domain covered by the master")
        wait_until(lambda: (r := answers(s.proxy1)) and r.status == 200, 60, message="proxy1 forwards to the backend")

        # One client through both gatekeepers: one limit (demo: 2/s, burst 5). Sequential
        # requests, alternating; the master counts them all for that one key.
        def decisions(decision: str) -> float:
            return sum(metric(http_get(p, "/metrics").body, "smockron_proxy_requests_total",
                              {"domain": "demo", "decision": decision}) or 0.0
                       for p in (s.proxy1_admin, s.proxy2_admin))
        base_accepted, base_delayed = decisions("accepted"), decisions("delayed")
        key = f"shared-{os.getpid()}"
        statuses = [request(s.proxy1 if i % 2 == 0 else s.proxy2, key).status for i in range(12)]
        check(statuses == [200] * 12, f"12 requests of one key through proxy1 and proxy2 answered 200: {statuses}")
        accepted, delayed = decisions("accepted") - base_accepted, decisions("delayed") - base_delayed
        # Apart, each gatekeeper would pass its 6 at once (burst 5); together they pass the burst
        # and each one's first round trip at most (its guard never more than its burst of 5).
        check(accepted + delayed == 12 and delayed >= 2 and accepted <= 10,
              f"the limit is shared: {accepted:g} accepted (burst 5, and each gatekeeper's first round trip), "
              f"{delayed:g} held, across both proxies")
        status = wait_until(lambda: (r := answers(s.master_admin, f"/status/demo/{key}")) and r.status == 200
                            and len(json.loads(r.body)["uses_ms"]) >= 12 and json.loads(r.body), 20,
                            message="the master counted every use of the key")
        check(len(status["uses_ms"]) >= 12, f"the master holds the key's {len(status['uses_ms'])} uses")
        if links:
            refused = metric(http_get(s.master_admin, "/metrics").body, "smockron_master_accounting_disconnects_total",
                             {"reason": "mechanism"})
            check(refused == 0, f"no plaintext peer refused ({refused:g})")
            master_links = json.loads(http_get(s.master_admin, "/status").body)["links"]
            check(master_links["mechanism"] == "CURVE" and master_links["gatekeeper_keys"] >= 1,
                  f"the master's links are CURVE: {master_links}")
            for p in (s.proxy1_admin, s.proxy2_admin):
                mechanism = json.loads(http_get(p, "/status").body)["masters"]["mechanism"]
                check(mechanism == "CURVE", f"proxy admin {p}: its links to the master are {mechanism}")
            return

        # The master restarted keeps its state: read back from Redis (appendonly).
        before = status["uses_ms"]
        wait_until(lambda: metric(http_get(s.master_admin, "/metrics").body,
                                  "smockron_master_redis_unwritten_states") == 0, 20,
                   message="the master's states written to Redis")
        run("podman", "restart", "-t", "10", running["master"], timeout=60)
        wait_until(lambda: healthy(running["master"]), 60, interval=1, message="master healthy again")
        after = wait_until(lambda: (r := answers(s.master_admin, f"/status/demo/{key}")) and r.status == 200
                           and json.loads(r.body)["tracked"] and json.loads(r.body), 30,
                           message="the master has the key's state after its restart")
        check(after["uses_ms"] == before, f"the restarted master read the key's {len(before)} uses back from Redis")

        # The live status page is served from the published admin port.
        page = http_get(s.master_admin, "/")
        check(page.status == 200 and "<title>smockron-master</title>" in page.body, "the master's status page")
    finally:
        # podman-compose's `down` removes the containers and the pod; the
        # network (and, with -v, the named volumes) may stay: removed here.
        s.compose("down", "-v", "-t", "5", timeout=180)
        left = s.running()
        for name in s.leftovers():
            run("podman", "network", "rm", "-f", name, check=False)
            run("podman", "volume", "rm", "-f", name, check=False)
    check(left == [], f"`down` leaves nothing running (found {left})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    i = sub.add_parser("image")
    i.add_argument("--container", required=True)
    c = sub.add_parser("compose")
    c.add_argument("--project", required=True)
    c.add_argument("--links", default="", help='"curve": the configs of config/curve/, with CURVE keys')
    args = ap.parse_args()
    try:
        if args.what == "image":
            image_checks(args.container)
        else:
            compose_checks(args.project, args.links)
    except WaitTimeout as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
