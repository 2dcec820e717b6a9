"""The proxy's JSON access log: the [proxy] keys that turn it on, and its lines
read back with times from the proxy's own clock."""
from __future__ import annotations

import datetime
import json


def access_log_keys(path: str) -> dict:
    """[proxy] keys for a JSON access log written to `path` (start_proxy, gate_stack ...)."""
    return {"access_log": True, "access_log_format": "json", "access_log_path": path}


def _epoch_seconds(rfc3339: str) -> float:
    """ "2026-11-23T17:41:15.123Z" (the access log's UTC time, milliseconds) as seconds since the epoch."""
    dt = datetime.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.replace(tzinfo=datetime.timezone.utc).timestamp()


def read_access_log(*paths: str) -> list[dict]:
    """The entries of JSON access logs (several proxies' merged; a missing file has none;
    only complete lines), sorted by "t_out". Each entry gets, from the proxy's own clock
    (so neither a busy test process nor a Python backend can skew them; wall clock,
    seconds since the epoch, comparable with time.time()):
      "t_head": when the request head was complete, which is when the gate decided
                (millisecond resolution);
      "t_out":  when the gate let the request go: t_head + held_ms;
      "forwarded": whether it went to an upstream (not refused, not gone while held)."""
    out = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        for line in text.split("\n")[:-1]:  # the last piece is empty or a line still being written
            if not line.strip():
                continue
            e = json.loads(line)
            e["t_head"] = _epoch_seconds(e["time"])
            e["t_out"] = e["t_head"] + float(e["held_ms"]) / 1000.0
            e["forwarded"] = bool(e.get("upstream"))
            out.append(e)
    out.sort(key=lambda e: e["t_out"])
    return out
