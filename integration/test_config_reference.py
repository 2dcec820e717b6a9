"""The configuration reference, docs/configuration.md, documents every key the
parser accepts, each in the section of its table, and no key it does not
accept. Needs no binary and no service: it reads source text only.

The parser's keys come from shared/config/config*.cpp. Every key is read through
a `reader` (shared/config/config_reader.hpp), one per TOML table, with its name
as a string literal: `r.duration("max_delay", ...)`,
`rr.typed<toml::value<std::string>>("path", ...)`, `rr.get("identify")`.
READERS says which table each reader variable of each function reads; a
reader call that READERS does not place fails the test, so a new table
cannot go unchecked. Keys the same code names outside reader calls
(`rt->contains("domain")`, `for (const char* k : {...})` lists) must be keys
some reader reads: a key read any other way would be invisible here, and
belongs in EXTRA_KEYS.

In the reference, a section is a level-2 or level-3 heading; SECTIONS names
the one of each table. A key is a level-4 heading holding only the key in
backticks (#### `max_delay`), or the first cell of a row of a Markdown table
whose header's first cell is "key" (| `max_delay` | ... |).

Run: cd integration && python3 -m unittest -v test_config_reference
"""
from __future__ import annotations

import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The parser: the load, the checks both schemas use, and each daemon's table.
CONFIG_SOURCES = [os.path.join(ROOT, "shared", "config", f)
                  for f in ("config.cpp", "config_reader.cpp", "config_master.cpp", "config_proxy.cpp",
                            "config_routes.cpp")]
CONFIG_READER = os.path.join(ROOT, "shared", "config", "config_reader.hpp")
REFERENCE = os.path.join(ROOT, "docs", "configuration.md")

# Table -> the heading (without its #s) of its section in the reference.
SECTIONS = {
    "top level": "Top level",
    "[master]": "`[master]`",
    "[master.domains.NAME]": "`[master.domains.NAME]`",
    "rules entries": "`rules` entries",
    "overrides entries": "`overrides` entries",
    "[master.domains.NAME.tiers.TIER]": "`[master.domains.NAME.tiers.TIER]`",
    "[proxy]": "`[proxy]`",
    "[proxy.jwt]": "`[proxy.jwt]`",
    "tls_sni entries": "`tls_sni` entries",
    "[proxy.upstreams.NAME]": "`[proxy.upstreams.NAME]`",
    "[[proxy.routes]]": "`[[proxy.routes]]`",
    "identify source tables": "Identifier sources (`identify`)",
    "[[proxy.shards]]": "`[[proxy.shards]]`",
}

# (function in config.cpp, reader variable) -> the table that reader reads.
READERS = {
    ("load_string", "r"): "top level",
    ("read_master", "r"): "[master]",
    ("read_admin_token", "r"): "[master]",
    ("read_rls", "r"): "[master]",
    ("read_master_curve", "r"): "[master]",
    ("read_proxy_curve", "r"): "[proxy]",
    ("read_master_trace", "r"): "[master]",
    ("read_proxy_trace", "r"): "[proxy]",
    ("parse_override_rules", "r"): "overrides entries",  # the override API's document: an entry's rules
    ("read_domain", "r"): "[master.domains.NAME]",
    ("read_shared", "r"): "[master.domains.NAME]",  # r.get("shared")
    ("read_rule", "r"): "rules entries",
    ("read_quota", "r"): "rules entries",
    ("read_overrides", "r"): "[master.domains.NAME]",  # r.get("overrides")
    ("read_overrides", "orr"): "overrides entries",
    ("read_tiers", "r"): "[master.domains.NAME]",  # r.get("tiers")
    ("read_tiers", "tr"): "[master.domains.NAME.tiers.TIER]",
    ("read_proxy", "r"): "[proxy]",
    ("read_http2", "r"): "[proxy]",
    ("read_paths", "r"): "[proxy]",
    ("read_jwt", "r"): "[proxy]",  # r.typed("jwt")
    ("read_jwt", "jr"): "[proxy.jwt]",
    ("read_tls", "r"): "[proxy]",
    ("read_tls", "sr"): "tls_sni entries",
    ("read_upstreams", "r"): "[proxy]",  # r.get("upstreams")
    ("read_upstreams", "ur"): "[proxy.upstreams.NAME]",
    ("read_routes", "r"): "[proxy]",  # r.get("routes")
    ("read_routes", "rr"): "[[proxy.routes]]",
    ("read_route_place", "rr"): "[[proxy.routes]]",
    ("read_route_limits", "rr"): "[[proxy.routes]]",
    ("read_cost", "rr"): "[[proxy.routes]]",
    ("read_cost_estimate", "rr"): "[[proxy.routes]]",
    ("read_identify", "tr"): "identify source tables",
    ("read_dns", "r"): "[proxy]",
    ("read_shards", "r"): "[proxy]",  # r.get("shards")
    ("read_shards", "hr"): "[[proxy.shards]]",
}

# Keys the parser accepts that no reader call names with a literal (read, say,
# through a variable), by table: {"[proxy]": {"key": "why the regex misses it"}}.
# None today: every key goes through a reader call. Each listed key must still
# appear as "key" in config.cpp, or the test fails (the list cannot rot).
EXTRA_KEYS: dict[str, dict[str, str]] = {}

# Keys a table refuses by name with a message of their own (config_reader.hpp,
# reader::finish). They are not keys of that table: the reference mentions them
# in its section, in backticks, but not as a key heading or row.
REFUSED_KEYS = {
    "[master]": {"accounting_hwm": "renamed to startup_backlog"},
}

_READ_METHODS = ("string|boolean|duration|choice|cidr_list|string_list|address|bind_address|"
                 "integer|unsigned_integer|size|real|get|typed<.*?>")
# `r.duration("max_delay"`, `rr.typed<toml::value<std::string>>("path"`: variable, key.
_READER_CALL = re.compile(r'\b([A-Za-z_]\w*)\.(?:' + _READ_METHODS + r')\(\s*"([^"]*)"')
# `rt->contains("domain")`, `r.table().get("log_level")`: keys named outside a reader call.
_SIDE_REFERENCE = re.compile(r'(?:->|\)\.)(?:get|contains)\(\s*"([^"]*)"')
# `for (const char* k : {"identify", "unidentified", ...})`.
_KEY_LOOP = re.compile(r'for\s*\(\s*const\s+char\s*\*\s*\w+\s*:\s*\{([^}]*)\}')
# A function definition at namespace scope: `master_config read_master(const toml::table& t, ...`.
_FUNCTION = re.compile(r'^(?!namespace\b|using\b|template\b|return\b|#|//)[A-Za-z_][^(;=]*?\b(\w+)\(')


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def functions(source: str) -> list[tuple[str | None, int, str]]:
    """(enclosing function or None, line number, line) for every line of a C++
    file whose function bodies end with a `}` in column 0."""
    out = []
    current = None
    for number, line in enumerate(source.splitlines(), 1):
        if line.startswith("}"):
            out.append((current, number, line))
            current = None
            continue
        m = _FUNCTION.match(line)
        if m:
            current = m.group(1)
        out.append((current, number, line))
    return out


def parser_keys(source: str, extra_keys: dict[str, dict[str, str]] | None = None
                ) -> tuple[dict[str, set[str]], list[str]]:
    """The keys config.cpp accepts, by table, and the problems found reading them."""
    extra_keys = EXTRA_KEYS if extra_keys is None else extra_keys
    keys: dict[str, set[str]] = {table: set() for table in SECTIONS}
    problems = []
    side = []
    for function, number, line in functions(source):
        for m in _READER_CALL.finditer(line):
            variable, key = m.group(1), m.group(2)
            table = READERS.get((function, variable))
            if table is None:
                problems.append(f"config.cpp:{number}: {variable}.{line[m.end(1) + 1:m.end()]}...) in "
                                f"{function}(): READERS does not say which table `{variable}` reads")
            else:
                keys[table].add(key)
        side += [(number, k) for k in _SIDE_REFERENCE.findall(line)]
    for m in _KEY_LOOP.finditer(source):
        number = source.count("\n", 0, m.start()) + 1
        side += [(number, k) for k in re.findall(r'"([^"]*)"', m.group(1))]
    for table, listed in extra_keys.items():
        if table not in keys:
            problems.append(f"EXTRA_KEYS names table {table!r}, which SECTIONS does not know")
            continue
        for key in sorted(listed):
            if f'"{key}"' not in source:
                problems.append(f"EXTRA_KEYS lists {table} {key!r}, which config.cpp no longer names: remove it")
            keys[table].add(key)
    accepted = set().union(*keys.values())
    for number, key in side:
        if key not in accepted:
            problems.append(f"config.cpp:{number}: key {key!r} is named outside a reader call and no reader "
                            f"reads it: read it through the reader, or list it in EXTRA_KEYS")
    return keys, problems


def documented_keys(doc: str) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """The keys the reference documents, by table (in order, duplicates kept),
    each section's text, and the problems found reading them."""
    tables = {heading: table for table, heading in SECTIONS.items()}
    keys: dict[str, list[str]] = {}
    text: dict[str, str] = {}
    problems = []
    section = None  # the table of the current section, None outside them
    heading = "(before the first heading)"
    fenced = False
    key_table = False  # inside a Markdown table whose first column is "key"
    previous = ""
    for number, line in enumerate(doc.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith("```"):
            previous = line
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            level, title = len(m.group(1)), m.group(2)
            if level <= 3:
                heading = title
                section = tables.get(title)
                if section is not None:
                    if section in keys:
                        problems.append(f"reference:{number}: a second section {title!r}")
                    keys.setdefault(section, [])
                    text.setdefault(section, "")
            elif level == 4:
                km = re.fullmatch(r"`([^`]+)`", title)
                if section is None:
                    if km:
                        problems.append(f"reference:{number}: key heading {title} under {heading!r}, "
                                        f"which is no table's section (SECTIONS)")
                elif km:
                    keys[section].append(km.group(1))
                else:
                    problems.append(f"reference:{number}: heading {title!r} in {section} is not a key "
                                    f"(a key heading is only the key in backticks)")
        if section is not None:
            text[section] += line + "\n"
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not previous.startswith("|"):
                key_table = cells[0].lower() == "key"
            elif key_table and not re.fullmatch(r":?-+:?", cells[0]):
                km = re.fullmatch(r"`([^`]+)`", cells[0])
                if section is None:
                    problems.append(f"reference:{number}: key row under {heading!r}, which is no table's section")
                elif km:
                    keys[section].append(km.group(1))
                else:
                    problems.append(f"reference:{number}: key row {cells[0]!r} in {section} does not start "
                                    f"with the key in backticks")
        else:
            key_table = False
        previous = line
    return keys, text, problems


def check(source: str, reader_source: str, doc: str,
          extra_keys: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Every problem with the reference against the parser; empty when it matches."""
    accepted, problems = parser_keys(source, extra_keys)
    documented, text, doc_problems = documented_keys(doc)
    problems += doc_problems
    for table, heading in SECTIONS.items():
        if table not in documented:
            if accepted[table]:
                problems.append(f"reference: no section {heading!r} for {table} "
                                f"(keys: {', '.join(sorted(accepted[table]))})")
            continue
        listed = documented[table]
        missing = sorted(accepted[table] - set(listed))
        unknown = sorted(set(listed) - accepted[table])
        twice = sorted({k for k in listed if listed.count(k) > 1})
        if missing:
            problems.append(f"reference, {table}: keys the parser accepts but the reference does not document: "
                            f"{', '.join(missing)}")
        if unknown:
            problems.append(f"reference, {table}: documents keys the parser does not accept: {', '.join(unknown)}")
        if twice:
            problems.append(f"reference, {table}: keys documented twice: {', '.join(twice)}")
    for table, refused in REFUSED_KEYS.items():
        for key, message in refused.items():
            if f'"{key}"' not in reader_source or message not in reader_source:
                problems.append(f"REFUSED_KEYS: config_reader.hpp no longer refuses {table} {key!r} with "
                                f"{message!r}: update REFUSED_KEYS")
            if key in accepted[table]:
                problems.append(f"REFUSED_KEYS: {table} accepts {key!r} now: remove it from REFUSED_KEYS")
            if f"`{key}`" not in text.get(table, ""):
                problems.append(f"reference, {table}: does not mention the refused key `{key}` ({message})")
    return problems


class ConfigReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.source = "\n".join(read(p) for p in CONFIG_SOURCES)
        cls.reader_source = read(CONFIG_READER)
        cls.doc = read(REFERENCE)

    def check(self, doc=None, source=None, extra_keys=None):
        return check(self.source if source is None else source, self.reader_source,
                     self.doc if doc is None else doc, extra_keys)

    def test_reference_documents_exactly_the_accepted_keys(self):
        problems = self.check()
        self.assertEqual([], problems, "\n" + "\n".join(problems))

    def test_extraction_finds_the_keys_of_every_table(self):
        # A regex that silently matched nothing would make the other test vacuous.
        keys, problems = parser_keys(self.source)
        self.assertEqual([], problems)
        self.assertEqual({"master", "proxy"}, keys["top level"])
        self.assertEqual({"algorithm", "rules", "shared", "share_window", "overrides", "tiers", "descriptor_keys",
                          "descriptor_separator", "envoy_mode", "admission"},
                         keys["[master.domains.NAME]"])
        self.assertEqual({"rules", "weight"}, keys["[master.domains.NAME.tiers.TIER]"])
        self.assertEqual({"identifier", "rules", "weight"}, keys["overrides entries"])
        self.assertEqual({"rate", "burst", "quota", "per", "tz", "concurrency"}, keys["rules entries"])
        self.assertEqual({"source", "hash"}, keys["identify source tables"])
        self.assertEqual({"servers", "fail_timeout", "keepalive", "tls", "tls_ca", "tls_verify", "tls_server_name",
                          "tls_client_cert", "tls_client_key", "protocol", "max_streams"}, keys["[proxy.upstreams.NAME]"])
        self.assertLessEqual({"domains", "store", "redis", "log_level", "startup_backlog"}, keys["[master]"])
        self.assertLessEqual({"max_delay", "jwt", "upstreams", "routes", "accounting_hwm", "max_header_bytes"},
                             keys["[proxy]"])
        self.assertLessEqual({"hs256_secret", "leeway"}, keys["[proxy.jwt]"])
        self.assertLessEqual({"host", "path", "domain", "upstream", "identify", "max_delay", "explain"},
                             keys["[[proxy.routes]]"])
        self.assertNotIn("accounting_hwm", keys["[master]"])

    def test_an_undocumented_key_fails(self):
        # [proxy] max_delay removed; the route's max_delay stays, so only the proxy's may be reported.
        proxy = self.doc.index("\n## `[proxy]`\n")
        heading = self.doc.index("\n#### `max_delay`\n", proxy)
        doc = self.doc[:heading] + self.doc[heading:].replace("\n#### `max_delay`\n", "\n", 1)
        problems = self.check(doc=doc)
        self.assertEqual(1, len(problems), problems)
        self.assertIn("[proxy]: keys the parser accepts but the reference does not document: max_delay",
                      problems[0])

    def test_an_unknown_key_fails(self):
        doc = self.doc.replace("\n#### `leeway`\n", "\n#### `leeway`\n\n#### `clock_leeway`\n", 1)
        problems = self.check(doc=doc)
        self.assertEqual(1, len(problems), problems)
        self.assertIn("[proxy.jwt]: documents keys the parser does not accept: clock_leeway", problems[0])

    def test_a_key_in_the_wrong_section_fails(self):
        # `fail_timeout` moved from the upstreams to the routes: missing there, unknown here.
        doc = self.doc.replace("\n#### `fail_timeout`\n", "\n", 1)
        doc = doc.replace("\n#### `explain`\n", "\n#### `explain`\n\n#### `fail_timeout`\n", 1)
        problems = "\n".join(self.check(doc=doc))
        self.assertIn("[proxy.upstreams.NAME]: keys the parser accepts but the reference does not document: "
                      "fail_timeout", problems)
        self.assertIn("[[proxy.routes]]: documents keys the parser does not accept: fail_timeout", problems)

    def test_key_table_rows_count(self):
        doc = ("## `[proxy.jwt]`\n\n| key | type |\n|---|---|\n| `issuer` | string |\n| `audience` | string |\n\n"
               "| source | meaning |\n|---|---|\n| `token` | not a key: this table's first column is not \"key\" |\n")
        documented, _, problems = documented_keys(doc)
        self.assertEqual([], problems)
        self.assertEqual(["issuer", "audience"], documented["[proxy.jwt]"])

    def test_a_reader_the_map_does_not_know_fails(self):
        source = self.source + '\nvoid read_ciphers(reader& r, tls_config& t) {\n  r.string("cert_file", t.cert);\n}\n'
        problems = "\n".join(self.check(source=source))
        self.assertIn("READERS does not say which table `r` reads", problems)
        self.assertIn("read_ciphers()", problems)

    def test_a_key_read_outside_the_reader_fails(self):
        source = self.source.replace('if (rr.table().contains("max_held")) {',
                                     'if (rr.table().contains("max_held") || rr.table().contains("max_holds")) {', 1)
        self.assertNotEqual(self.source, source)
        problems = "\n".join(self.check(source=source))
        self.assertIn("key 'max_holds' is named outside a reader call", problems)

    def test_a_stale_extra_key_fails(self):
        problems = "\n".join(self.check(extra_keys={"[proxy]": {"tls_ciphers": "read through a variable"}}))
        self.assertIn("EXTRA_KEYS lists [proxy] 'tls_ciphers', which config.cpp no longer names", problems)

    def test_a_refused_key_documented_as_a_key_fails(self):
        doc = self.doc.replace("\n#### `accounting`\n", "\n#### `accounting_hwm`\n\n#### `accounting`\n", 1)
        problems = "\n".join(self.check(doc=doc))
        self.assertIn("[master]: documents keys the parser does not accept: accounting_hwm", problems)


if __name__ == "__main__":
    unittest.main()
