"""Packaging checks that need no Docker engine: every shipped config passes
--check for the daemon(s) whose table it has, docker-compose.yml validates
with `docker-compose config -q`, and the Dockerfile builds with the same
install and build scripts as the tested quick start."""
import glob
import os
import shutil
import subprocess
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin"))


class PackagingTest(unittest.TestCase):
    def test_every_shipped_config_passes_check(self):
        configs = sorted(glob.glob(os.path.join(ROOT, "config", "*.toml")))
        self.assertTrue(configs)
        for path in configs:
            text = open(path).read()
            daemons = [d for d in ("master", "proxy") if f"[{d}]" in text]
            self.assertTrue(daemons, f"{path} has neither [master] nor [proxy]")
            for daemon in daemons:
                r = subprocess.run([os.path.join(BIN, f"smockron-{daemon}"), "--check", "--config", path],
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 0, f"{daemon} --check {path}: {r.stderr}")

    def test_compose_file_is_valid_and_mounts_checked_configs(self):
        compose = shutil.which("docker-compose")
        if compose is None:
            self.fail("docker-compose is missing: scripts/install-deps.sh --test installs it")
        r = subprocess.run([compose, "-f", os.path.join(ROOT, "docker-compose.yml"), "config", "-q"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = open(os.path.join(ROOT, "docker-compose.yml")).read()
        for name in ("compose-master.toml", "compose-proxy.toml"):
            self.assertIn(name, text)
            self.assertTrue(os.path.exists(os.path.join(ROOT, "config", name)))

    def test_dockerfile_uses_the_tested_scripts(self):
        text = open(os.path.join(ROOT, "Dockerfile")).read()
        self.assertIn("FROM debian:bookworm AS build", text)
        self.assertIn("bash scripts/install-deps.sh", text)
        self.assertIn("bash scripts/build.sh", text)
        for needed in ("USER 10001", "EXPOSE", "STOPSIGNAL SIGTERM", "HEALTHCHECK", "--healthcheck"):
            self.assertIn(needed, text)


if __name__ == "__main__":
    unittest.main()
