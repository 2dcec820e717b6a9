"""TOML configurations for the daemons: master_toml and proxy_toml (one daemon
each, from Python values), one_box_toml (both in one file, as the benchmarks
run them), and the probe and warm-up domains the fixtures add."""
from __future__ import annotations

import json
import re

from lib.ports import HOST

#: Domain every master config rendered by master_toml() gets, used only by the
#: slow-joiner handshake. One request per hour makes every probe answer with a
#: DELAY_UNTIL, so a reply proves both directions of the ZeroMQ link are up.
PROBE_DOMAIN = "smockron-probe"

#: The proxy's counterpart: gate configs (DaemonTestCase.gate_stack) get a first route
#: WARM_ROUTE on WARM_DOMAIN (1 request per hour), so a request with a fresh X-Warm key
#: draws a DELAY_UNTIL: DaemonTestCase.prime() proves the proxy <-> master loop with it.
#: WARM_DOMAIN sorts after the test domains: its subscription is sent last.
WARM_DOMAIN = "zzwarm"
WARM_ROUTE = {"path": "/__warm/", "domain": WARM_DOMAIN, "upstream": "app", "identify": ["header:X-Warm"]}


def toml_value(v) -> str:
    """A Python value as TOML (strings, ints, floats, bools, lists, dicts as inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string of printable text is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot render {v!r} as TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def master_toml(accounting_port: int, control_port: int, admin_port: int, domains: dict,
                probe: bool = True, **master_keys) -> str:
    """A [master] config.

    domains: {name: {"rules": [("10/s", 2), {"quota": 100, "per": "day"}, ...], "algorithm": "gcra",
                     "shared": [{"concurrency": 64}],
                     "overrides": {identifier: [("100/s", 20), ...]},
                     "tiers": {name: [("100/s", 20), {"concurrency": 4}, ...]},
                     "descriptor_keys": ["api_key"], "envoy_mode": "shadow"}} (all but rules optional).
    master_keys: extra [master] keys, e.g. max_identifiers=100, sweep_interval="50ms".
    probe: add PROBE_DOMAIN (rate 1/h, burst 1) for Gatekeeper.handshake().
    """
    lines = [
        "[master]",
        f'accounting = "tcp://{HOST}:{accounting_port}"',
        f'control = "tcp://{HOST}:{control_port}"',
        f'admin = "{HOST}:{admin_port}"',
    ]
    for k, v in master_keys.items():
        lines.append(f"{k} = {toml_value(v)}")
    all_domains = dict(domains)
    if probe:
        all_domains.setdefault(PROBE_DOMAIN, {"rules": [("1/h", 1)]})
    for name, d in all_domains.items():
        lines.append("")
        lines.append(f"[master.domains.{_toml_key(name)}]")
        rules = [r if isinstance(r, dict) else {"rate": r[0], "burst": r[1]} for r in d.get("rules", [])]
        lines.append(f"rules = {toml_value(rules)}")
        if "algorithm" in d:
            lines.append(f'algorithm = {toml_value(d["algorithm"])}')
        if "shared" in d:
            lines.append(f'shared = {toml_value(d["shared"])}')
        if "share_window" in d:
            lines.append(f'share_window = {toml_value(d["share_window"])}')
        for key in ("descriptor_keys", "descriptor_separator", "envoy_mode", "admission"):
            if key in d:
                lines.append(f"{key} = {toml_value(d[key])}")
        if "overrides" in d:
            overrides = [{"identifier": ident, "rules": [{"rate": r, "burst": b} for r, b in rules]}
                         for ident, rules in d["overrides"].items()]
            lines.append(f"overrides = {toml_value(overrides)}")
        for tier, rules in d.get("tiers", {}).items():
            lines.append(f"[master.domains.{_toml_key(name)}.tiers.{_toml_key(tier)}]")
            lines.append(f"rules = {toml_value([r if isinstance(r, dict) else {'rate': r[0], 'burst': r[1]} for r in rules])}")
    return "\n".join(lines) + "\n"


def proxy_toml(listen_port: int, admin_port: int, upstreams: dict, routes: list, accounting: list, control: list,
               **proxy_keys) -> str:
    """A [proxy] config. upstreams: {name: {"servers": [...], "fail_timeout": "200ms"}};
    routes: [{"path": "/", "domain": "api", "upstream": "app", "identify": [...]}]."""
    lines = [
        "[proxy]",
        f'listen = "{HOST}:{listen_port}"',
        f'admin = "{HOST}:{admin_port}"',
        f"accounting = {toml_value(accounting)}",
        f"control = {toml_value(control)}",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in proxy_keys.items()]
    for name, u in upstreams.items():
        lines += ["", f"[proxy.upstreams.{name}]"] + [f"{k} = {toml_value(v)}" for k, v in u.items()]
    for r in routes:
        lines += ["", "[[proxy.routes]]"] + [f"{k} = {toml_value(v)}" for k, v in r.items()]
    return "\n".join(lines) + "\n"


def one_box_toml(*, domain: str, rule: str, backend_port: int, proxy_port: int, proxy_admin: int,
                 master_admin: int, accounting: int, control: int, identify: str = '"header:X-API-Key"',
                 proxy_extra: str = "", upstream_extra: str = "", master_extra: str = "") -> str:
    """A single file driving one master (one domain, one rule) and one proxy
    (one worker, one route to one backend) on 127.0.0.1, as the benchmarks use."""
    return f"""[master]
accounting = "tcp://127.0.0.1:{accounting}"
control = "tcp://127.0.0.1:{control}"
admin = "127.0.0.1:{master_admin}"
{master_extra}
[master.domains.{domain}]
rules = [ {rule} ]

[proxy]
listen = "127.0.0.1:{proxy_port}"
admin = "127.0.0.1:{proxy_admin}"
threads = 1
accounting = ["tcp://127.0.0.1:{accounting}"]
control = ["tcp://127.0.0.1:{control}"]
{proxy_extra}
[proxy.upstreams.app]
servers = ["127.0.0.1:{backend_port}"]
{upstream_extra}
[[proxy.routes]]
path = "/"
domain = "{domain}"
upstream = "app"
identify = [{identify}]
"""
