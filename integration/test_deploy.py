"""The operator's kit under deploy/: Prometheus alerting rules checked and
unit-tested by promtool (Debian's `prometheus`), the Prometheus config
checked, and every metric the rules and the Grafana dashboard name served by
the real daemons' /metrics (a renamed metric breaks an alert silently).

Run: python3 integration/test_deploy.py -v
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lib.http1 import fetch  # noqa: E402
from lib.testcase import DaemonTestCase  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMETHEUS = os.path.join(ROOT, "deploy", "prometheus")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "smockron-dashboard.json")
# Series Prometheus makes itself, not the daemons.
NOT_OURS = {"up"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    if tool is None:
        raise AssertionError("promtool missing: scripts/install-deps.sh --test installs Debian's prometheus")
    return subprocess.run([tool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)


def names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (histogram series by their family)."""
    found = set(re.findall(r"\b(smockron_[a-z0-9_]+|up)\b(?=\s*[{\[)\s]|\s*$|\s*[/<>=!*+-])", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) else n
            for n in found}


def rule_exprs() -> list[str]:
    # The rules file is plain YAML with `expr:` keys; PyYAML may not be installed, so they are read as text.
    with open(os.path.join(PROMETHEUS, "smockron-alerts.yml")) as f:
        text = f.read()
    exprs = []
    for m in re.finditer(r"^\s+expr:\s*(>-)?\s*(.*)$", text, re.MULTILINE):
        if m.group(1):  # a folded block: the more indented lines after it
            start = m.end()
            lines = []
            for line in text[start:].splitlines()[1:]:
                if line.startswith(" " * 10):
                    lines.append(line.strip())
                else:
                    break
            exprs.append(" ".join(lines))
        else:
            exprs.append(m.group(2))
    return exprs


def dashboard_exprs() -> list[str]:
    with open(DASHBOARD) as f:
        dash = json.load(f)
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


class PromtoolTest(unittest.TestCase):
    def test_rules_are_valid_and_fire_on_their_series(self):
        p = promtool("check", "rules", "smockron-alerts.yml")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        p = promtool("test", "rules", "smockron-alerts.test.yml")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        p = promtool("check", "config", "prometheus.yml")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_the_expressions_are_read(self):
        # The extraction itself: every rule and panel has an expression naming a metric.
        self.assertEqual(len(rule_exprs()), 8)
        self.assertGreaterEqual(len(dashboard_exprs()), 16)
        for e in rule_exprs() + dashboard_exprs():
            self.assertTrue(names_in(e), e)


class MetricsExistTest(DaemonTestCase):
    def test_every_metric_named_is_served(self):
        master, _, proxy = self.gate_stack({"api": {"rules": [("10/s", 5)]}},
                                           [{"path": "/", "domain": "api", "upstream": "app",
                                             "identify": ["header:X-Key"]}])
        r, _ = fetch(proxy.port, "/x", headers=[("X-Key", "k")])
        self.assertEqual(r.status, 200)
        served = set()
        for daemon in (master, proxy):
            served |= set(re.findall(r"^# TYPE (\S+) ", daemon.metrics(), re.MULTILINE))
        named = set()
        for e in rule_exprs() + dashboard_exprs():
            named |= names_in(e)
        missing = sorted(named - served - NOT_OURS)
        self.assertEqual(missing, [], "named by deploy/ but served by neither daemon")


if __name__ == "__main__":
    unittest.main()
