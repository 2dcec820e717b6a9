"""Packaging checks that need no Docker engine: every shipped config passes
--check for the daemon(s) whose table it has, docker-compose.yml validates
with `docker-compose config -q` and has the stack DESIGN.md describes (Redis
with a health check, a master that waits for it, gatekeepers that do not wait
for the master), the Dockerfile passes `dockerfile-utils lint` with neither
errors nor warnings, and it builds with the same install and build scripts as
the tested quick start.

`scripts/install-deps.sh --test` installs docker-compose and the pinned linter
(into build/tools/)."""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import lib  # noqa: E402,F401  (Debian's python3-yaml, a docker-compose dependency, for any Python)
import yaml  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin"))
LINTER = os.path.join(ROOT, "build", "tools", "node_modules", ".bin", "dockerfile-utils")
COMPOSE_FILE = os.path.join(ROOT, "docker-compose.yml")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def check_config(path: str) -> list[str]:
    """Runs --check of every daemon whose table `path` has; returns the failures.
    A config naming the compose stack's keys (/etc/smockron/keys/) is checked with
    keys made by scripts/compose-keys.sh in a directory of its own."""
    text = read(path)
    if "/etc/smockron/keys/" in text:
        keys = tempfile.mkdtemp(prefix="smockron-keys-")
        try:
            r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "compose-keys.sh"), keys], capture_output=True,
                               text=True, timeout=30, env=dict(os.environ, SMOCKRON_QUERY=os.path.join(BIN,
                                                                                                   "smockron-query")))
            if r.returncode != 0:
                return [f"compose-keys.sh: {r.stdout}{r.stderr}"]
            copy = os.path.join(keys, os.path.basename(path))
            with open(copy, "w", encoding="utf-8") as f:
                f.write(text.replace("/etc/smockron/keys/", keys + "/"))
            return [f.replace(copy, path) for f in check_config(copy)]
        finally:
            shutil.rmtree(keys, ignore_errors=True)
    daemons = [d for d in ("master", "proxy") if f"[{d}]" in text]
    if not daemons:
        return [f"{path} has neither [master] nor [proxy]"]
    failures = []
    for daemon in daemons:
        r = subprocess.run([os.path.join(BIN, f"smockron-{daemon}"), "--check", "--config", path],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            failures.append(f"{daemon} --check {path}: {r.stdout}{r.stderr}")
    return failures


def lint(path: str) -> list[dict]:
    """dockerfile-utils' findings (errors and warnings) for one Dockerfile."""
    if not os.access(LINTER, os.X_OK):
        raise AssertionError(f"{LINTER} is missing: scripts/install-deps.sh --test installs it")
    r = subprocess.run([LINTER, "lint", "--json", path], capture_output=True, text=True, timeout=60, cwd=ROOT)
    try:
        findings = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"dockerfile-utils lint gave no JSON (exit {r.returncode}): {r.stdout}{r.stderr}") from None
    if (r.returncode != 0) != bool(findings):
        raise AssertionError(f"dockerfile-utils lint exited {r.returncode} with findings {findings}")
    return findings


def describe(findings: list[dict], path: str) -> str:
    lines = read(path).splitlines()
    out = []
    for f in findings:
        n = f["range"]["start"]["line"]
        out.append(f"{os.path.basename(path)}:{n + 1}: {f['severity']}: {f['message']}\n    {lines[n] if n < len(lines) else ''}")
    return "\n".join(out)


class PackagingTest(unittest.TestCase):
    def test_every_shipped_config_passes_check(self):
        configs = sorted(glob.glob(os.path.join(ROOT, "config", "*.toml")) +
                         glob.glob(os.path.join(ROOT, "config", "curve", "*.toml")))
        self.assertTrue(configs)
        failures = [f for path in configs for f in check_config(path)]
        self.assertEqual(failures, [])

    def compose(self, links: str = "") -> dict:
        """docker-compose.yml as docker-compose resolves it (anchors merged, defaults filled),
        with SMOCKRON_LINKS=`links` ("curve": the configs of config/curve/, with CURVE keys)."""
        exe = shutil.which("docker-compose")
        if exe is None:
            self.fail("docker-compose is missing: scripts/install-deps.sh --test installs it")
        env = dict(os.environ)
        env.pop("SMOCKRON_LINKS", None)
        if links:
            env["SMOCKRON_LINKS"] = links
        r = subprocess.run([exe, "-f", COMPOSE_FILE, "config", "-q"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run([exe, "-f", COMPOSE_FILE, "config"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                           env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return yaml.safe_load(r.stdout)

    def test_compose_with_keys_names_the_curve_configs(self):
        services = self.compose("curve")["services"]
        self.assertIn("/etc/smockron/curve/compose-master.toml", services["master"]["command"])
        for name in ("proxy1", "proxy2"):
            self.assertIn("/etc/smockron/curve/compose-proxy.toml", services[name]["command"])
        for name in ("compose-master.toml", "compose-proxy.toml"):
            self.assertEqual(check_config(os.path.join(ROOT, "config", "curve", name)), [], name)

    def test_compose_file_is_valid_and_mounts_checked_configs(self):
        services = self.compose()["services"]
        mounted = set()
        for name, svc in services.items():
            for v in svc.get("volumes", []):
                source = v["source"] if isinstance(v, dict) else v.split(":")[0]
                if os.path.abspath(source) == os.path.join(ROOT, "config"):
                    mounted.add(name)
            for arg in svc.get("command", []):
                if arg.startswith("/etc/smockron/"):
                    self.assertIn(name, mounted, f"{name} reads {arg} but config/ is not mounted")
                    path = os.path.normpath(os.path.join(ROOT, "config", arg[len("/etc/smockron/"):]))
                    self.assertTrue(os.path.exists(path), f"{name}: {path}")
                    self.assertEqual(check_config(path), [], name)
        for name in ("compose-master.toml", "compose-proxy.toml"):
            self.assertTrue(os.path.exists(os.path.join(ROOT, "config", name)))

    def test_compose_stack_redis_master_and_fail_permissive_gatekeepers(self):
        services = self.compose()["services"]
        self.assertLessEqual({"redis", "master", "proxy1", "proxy2", "backend"}, set(services))
        for name, svc in services.items():
            self.assertTrue(svc.get("init"), f"{name}: init: true (signals reach the daemon, zombies reaped)")
            self.assertIn("stop_grace_period", svc, name)

        redis = services["redis"]
        self.assertRegex(redis["image"], r"^redis:7")
        self.assertIn("redis-cli", redis["healthcheck"]["test"])
        self.assertIn("ping", redis["healthcheck"]["test"])

        master = services["master"]
        self.assertEqual(master["depends_on"]["redis"]["condition"], "service_healthy")
        master_cfg = read(os.path.join(ROOT, "config", "compose-master.toml"))
        self.assertRegex(master_cfg, r'(?m)^store\s*=\s*"redis"')
        self.assertRegex(master_cfg, r'(?m)^redis\s*=\s*"redis://redis:6379/0"')

        for name in ("proxy1", "proxy2"):
            self.assertNotIn("master", services[name].get("depends_on", {}), f"{name} must not wait for the master")
            self.assertNotIn("redis", services[name].get("depends_on", {}), name)
            self.assertIn("/etc/smockron/compose-proxy.toml", [os.path.normpath(a) for a in services[name]["command"]])
        proxy_cfg = read(os.path.join(ROOT, "config", "compose-proxy.toml"))
        self.assertIn('"tcp://master:10004"', proxy_cfg)
        self.assertIn('"tcp://master:10005"', proxy_cfg)

    def test_curve_keys_stay_out_of_the_image(self):
        # The runtime stage copies config/ whole: the compose stack's keys must not go with it.
        ignored = [line.strip() for line in read(os.path.join(ROOT, ".dockerignore")).splitlines()]
        self.assertIn("config/keys", ignored)
        self.assertIn("COPY config/ /etc/smockron/", read(os.path.join(ROOT, "Dockerfile")))

    def test_dockerfile_passes_the_linter(self):
        path = os.path.join(ROOT, "Dockerfile")
        findings = lint(path)
        self.assertEqual(findings, [], "\n" + describe(findings, path))

    def test_linter_reports_errors_and_warnings(self):
        # The check above is only worth something if the linter finds problems: one error
        # (unknown instruction) and one warning (relative WORKDIR) in a throwaway file.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "Dockerfile")
            with open(path, "w") as f:
                f.write("FROM debian:bookworm\nWORKDIR relative\nFROOM x\n")
            severities = sorted(f["severity"] for f in lint(path))
        self.assertEqual(severities, ["error", "warning"])

    def test_dockerfile_uses_the_tested_scripts(self):
        text = read(os.path.join(ROOT, "Dockerfile"))
        self.assertIn("FROM debian:bookworm AS build", text)
        self.assertIn("bash scripts/install-deps.sh", text)
        self.assertIn("bash scripts/build.sh", text)
        for needed in ("USER 10001", "EXPOSE", "STOPSIGNAL SIGTERM", "HEALTHCHECK", "--healthcheck"):
            self.assertIn(needed, text)
        # The runtime image has the library the master's Redis store links against.
        self.assertIn("libhiredis", text)


    def test_compose_restarts_services_and_keeps_admin_ports_on_the_hosts_loopback(self):
        services = self.compose()["services"]
        for name, svc in services.items():
            self.assertEqual(svc.get("restart"), "unless-stopped", name)
            for port in svc.get("ports", []):
                if isinstance(port, dict):
                    target, host_ip = int(port["target"]), port.get("host_ip", "")
                else:  # "[HOST_IP:]PUBLISHED:TARGET[/PROTO]"
                    parts = str(port).split("/")[0].split(":")
                    target, host_ip = int(parts[-1]), parts[0] if len(parts) == 3 else ""
                if target in (9105, 9106):
                    self.assertEqual(host_ip, "127.0.0.1", f"{name}: an admin port on every host interface")
        self.assertEqual(services["master"]["healthcheck"]["test"][1:3], ["smockron-master", "--healthcheck"])
        self.assertNotIn("smockron", services["backend"].get("image", ""), "the demo backend is not the Smockron image")

    def test_the_image_default_listens_on_every_interface(self):
        text = read(os.path.join(ROOT, "Dockerfile"))
        self.assertIn('CMD ["smockron-proxy", "--config", "/etc/smockron/container.toml"]', text)
        cfg = read(os.path.join(ROOT, "config", "container.toml"))
        self.assertRegex(cfg, r'(?m)^listen\s*=\s*"0\.0\.0\.0:8080"')
        self.assertRegex(cfg, r'(?m)^admin\s*=\s*"127\.0\.0\.1:9106"')
        self.assertEqual(check_config(os.path.join(ROOT, "config", "container.toml")), [])
        ignored = read(os.path.join(ROOT, ".dockerignore")).split()
        self.assertLessEqual({".git", "build", "build-*"}, set(ignored))

    def test_the_runtime_stage_installs_exactly_the_libraries_the_binaries_load(self):
        text = read(os.path.join(ROOT, "Dockerfile"))
        runtime = text[text.index("FROM debian:bookworm-slim"):]
        listed = set(re.search(r"--no-install-recommends ([^\\&]+)", runtime).group(1).split())
        loaded = set()
        for binary in ("smockron-proxy", "smockron-master", "smockron-query"):
            out = subprocess.run(["ldd", os.path.join(BIN, binary)], capture_output=True, text=True, check=True).stdout
            for path in re.findall(r"=> (/\S+)", out):
                loaded.add(owning_package(path))
        # What bookworm-slim has anyway, and what the listed packages pull in.
        closure = apt_closure(listed) | {"libc6", "libgcc-s1", "libstdc++6"}
        self.assertEqual(sorted(loaded - closure), [], "libraries no runtime package provides")
        direct = {p for p in loaded if p in listed}
        self.assertEqual(sorted(listed - direct), [], "packages the runtime stage installs but no binary loads")


    def test_install_puts_daemons_config_and_sandboxed_units_in_place(self):
        build = os.path.dirname(BIN)
        with tempfile.TemporaryDirectory() as prefix:
            r = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for daemon in ("smockron-master", "smockron-proxy", "smockron-query"):
                v = subprocess.run([os.path.join(prefix, "bin", daemon), "--version"], capture_output=True, text=True)
                self.assertEqual(v.returncode, 0, v.stderr)
            installed_cfg = os.path.join(prefix, "etc", "smockron", "smockron.toml")
            self.assertEqual(check_config(installed_cfg), [])
            for daemon in ("smockron-master", "smockron-proxy"):
                unit = read(os.path.join(prefix, "lib", "systemd", "system", f"{daemon}.service"))
                self.assertNotIn("@", unit, "every path was filled in at configure time")
                for directive in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                                  "ExecReload=/bin/kill -HUP $MAINPID", "Restart=on-failure"):
                    self.assertIn(directive, unit, daemon)
                self.assertRegex(unit, rf"(?m)^ExecStart=/\S+/bin/{daemon} --config /\S+/smockron/smockron\.toml$")
                if shutil.which("systemd-analyze"):
                    # The unit names the configured prefix's paths; verify it against this install's.
                    local = re.sub(r"/\S+/bin/", os.path.join(prefix, "bin") + "/", unit)
                    local = re.sub(r"/\S+/smockron/smockron\.toml", installed_cfg, local)
                    path = os.path.join(prefix, f"{daemon}.service")
                    with open(path, "w") as f:
                        f.write(local)
                    v = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True, timeout=60)
                    problems = [line for line in (v.stdout + v.stderr).splitlines()
                                if daemon in line and "network-online" not in line]
                    self.assertEqual(problems, [], "systemd-analyze verify")

def owning_package(path: str) -> str:
    """The Debian package that owns a library (usrmerge: /lib is /usr/lib)."""
    for candidate in (path, "/usr" + path, os.path.realpath(path)):
        r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    raise AssertionError(f"no package owns {path}")


def apt_closure(packages: set[str]) -> set[str]:
    """`packages` and everything they depend on (Depends and PreDepends, recursively)."""
    out = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                          "--no-breaks", "--no-replaces", "--no-enhances", *sorted(packages)],
                         capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        name = line.strip().split(":", 1)[-1].strip() if ":" in line else line.strip()
        if name and not name.startswith("<"):
            found.add(name.split(":")[0])
    return found

if __name__ == "__main__":
    unittest.main()
