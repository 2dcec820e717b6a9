"""Prometheus text exposition as the tests read it (parse_metrics, metric,
metric_sum) and the names of the proxy's metrics several test files check."""
from __future__ import annotations

import re

CTL = "smockron_proxy_control_messages_total"
HELD = "smockron_proxy_held_requests"
ABUSE = "smockron_proxy_http2_abuse_total"
HTTP_REQUESTS = "smockron_proxy_http_requests_total"
UPSTREAM_SECONDS = "smockron_proxy_upstream_response_seconds"


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape_label(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def _parse_labels(text: str) -> dict:
    labels = {}
    pos = 0
    while pos < len(text):
        m = _LABEL_RE.match(text, pos)
        if not m:
            raise ValueError(f"bad label set {{{text}}}")
        labels[m.group(1)] = _unescape_label(m.group(2))
        pos = m.end()
    return labels


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """Parses Prometheus text exposition into (name, labels, value) samples."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise ValueError(f"unparsable metrics line: {line!r}")
        value = m.group(4)
        samples.append((m.group(1), _parse_labels(m.group(3) or ""), float(value.replace("Inf", "inf"))))
    return samples


def metric(text: str, name: str, labels: dict | None = None) -> float | None:
    """Value of the sample `name` whose label set is exactly `labels` (None/{} = no labels); None if absent."""
    want = dict(labels or {})
    for n, l, v in parse_metrics(text):
        if n == name and l == want:
            return v
    return None


def metric_sum(text: str, name: str, **match) -> float:
    """Sum of every sample of `name` whose labels include `match` (0 when none)."""
    return sum(v for n, l, v in parse_metrics(text) if n == name and all(l.get(k) == x for k, x in match.items()))


def requests_by_protocol(proxy, protocol: str) -> float:
    """smockron_proxy_http_requests_total{protocol} of a running proxy (summed over its other labels)."""
    return metric_sum(proxy.metrics(), HTTP_REQUESTS, protocol=protocol)
