"""The Envoy, Istio and Contour examples of docs/operations.md ("Envoy's rate
limit services") use the names the master serves: every service and method
they name is declared in master/envoy/proto, the master configuration beside
them passes `smockron-master --check`, and every domain, port and descriptor
or bucket key the data-plane examples use is one that configuration has.

Run: cd integration && python3 -m unittest -v test_envoy_docs
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin"))


def section() -> str:
    with open(os.path.join(ROOT, "docs", "operations.md")) as f:
        text = f.read()
    start = text.index("## Envoy's rate limit services")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


class EnvoyExamplesTest(unittest.TestCase):
    def setUp(self):
        self.text = section()
        self.toml = blocks(self.text, "toml")[0]
        self.yaml = blocks(self.text, "yaml")

    def test_named_services_and_methods_are_declared(self):
        declared = set()
        for root, _, files in os.walk(os.path.join(ROOT, "master", "envoy", "proto")):
            for f in files:
                with open(os.path.join(root, f)) as fh:
                    proto = fh.read()
                package = re.search(r"^package ([\w.]+);", proto, re.M).group(1)
                for service, body in re.findall(r"^service (\w+) \{(.*?)^\}", proto, re.M | re.S):
                    for method in re.findall(r"rpc (\w+)\(", body):
                        declared.add(f"{package}.{service}/{method}")
        named = set(re.findall(r"envoy\.service\.[\w.]+/\w+", self.text))
        self.assertEqual(len(named), 2, named)
        self.assertLessEqual(named, declared)

    def test_the_master_configuration_is_valid(self):
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write(self.toml)
            f.flush()
            r = subprocess.run([os.path.join(BIN, "smockron-master"), "--check", "--config", f.name],
                               capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_examples_use_the_configured_domain_port_and_keys(self):
        domains = set(re.findall(r"^\[master\.domains\.(\w+)\]", self.toml, re.M))
        port = re.search(r'^rls = "[^"]*:(\d+)"', self.toml, re.M).group(1)
        keys = set(re.findall(r'"(\w+)"', re.search(r"^descriptor_keys = \[(.*)\]", self.toml, re.M).group(1)))
        self.assertEqual(len(self.yaml), 4, "Envoy RLS, Envoy RLQS, Istio, Contour")
        for y in self.yaml:
            for d in re.findall(r"^\s*domain: (\w+)", y, re.M):
                self.assertIn(d, domains, y)
            for p in re.findall(r"\b(?:port_value|port): (\d+)", y) + re.findall(r"outbound\|(\d+)\|", y):
                self.assertEqual(p, port, y)
        used = set(re.findall(r"descriptor_key: (\w+)", self.text))
        used |= set(re.findall(r"bucket_id_builder:\n\s+bucket_id_builder:\n\s+(\w+):", self.text))
        self.assertEqual(used, keys)


if __name__ == "__main__":
    unittest.main()
