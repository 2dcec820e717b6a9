"""The documentation matches the tree: every file or folder that
docs/architecture.md names (in backquotes, e.g. `proxy/io/conn_io.*`) exists,
and every relative link of README.md and docs/*.md leads to a file that
exists. A page that describes a layout the code no longer has fails here.

Run: cd integration && python3 -m unittest -v test_docs
"""
from __future__ import annotations

import glob
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ("proxy/", "shared/", "master/", "tests/", "integration/", "scripts/", "config/", "packaging/", "docs/")


def read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


class DocsMatchTheTreeTest(unittest.TestCase):
    def test_every_path_architecture_names_exists(self):
        named = set()
        for quoted in re.findall(r"`([^`\s]+)`", read("docs/architecture.md")):
            if quoted.startswith(TOP):
                named.add(quoted.rstrip(".,:;)"))
        self.assertGreater(len(named), 20, "the page names the folders and files of the tree")
        missing = [p for p in sorted(named) if not glob.glob(os.path.join(ROOT, p.replace("{", "").replace("}", "")))
                   and not glob.glob(os.path.join(ROOT, p))]
        self.assertEqual(missing, [], "docs/architecture.md names paths the tree does not have")

    def test_every_proxy_layer_and_master_part_is_described(self):
        page = read("docs/architecture.md")
        for daemon in ("proxy", "master"):
            parts = sorted(d for d in os.listdir(os.path.join(ROOT, daemon))
                           if os.path.isdir(os.path.join(ROOT, daemon, d)))
            self.assertTrue(parts, daemon)
            for part in parts:
                self.assertIn(f"`{daemon}/{part}/", page, f"{daemon}/{part}/ is not in docs/architecture.md")

    def test_relative_links_resolve(self):
        pages = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
        broken = []
        for page in pages:
            for target in re.findall(r"\]\(([^)\s]+)\)", read(page)):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(os.path.join(ROOT, page)), target.split("#")[0]))
                if not os.path.exists(path):
                    broken.append(f"{page}: {target}")
        self.assertEqual(broken, [])

    def test_readme_is_a_front_door(self):
        lines = read("README.md").splitlines()
        self.assertLessEqual(len(lines), 300, "README.md: what Smockron is and how to run it; the rest in docs/")
        start = "\n".join(lines[:40])
        self.assertIn("bash scripts/run.sh", start)
        self.assertIn("bash scripts/test.sh", start)


if __name__ == "__main__":
    unittest.main()
