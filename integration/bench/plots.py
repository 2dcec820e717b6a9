"""Pictures of the benchmarks' results (matplotlib from Debian's
python3-matplotlib, Agg backend: files only, no display). Each benchmark
that draws calls one function here with its results and a path; the
benchmarks document shows the PNGs (docs/images/).

  proxy_vs_nginx(rounds, path)   req/s and CPU per request, per round and contender
  accuracy(cells, path)          admitted/ideal against one-way delay, a line per
                                 scenario (algorithm) and fleet size G
"""
from __future__ import annotations

import os
import sys


def _pyplot():
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # Debian's python3-matplotlib lives in dist-packages (see integration/lib/__init__.py)
        dist = "/usr/lib/python3/dist-packages"
        if dist not in sys.path:
            sys.path.append(dist)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def proxy_vs_nginx(rounds: dict[str, list[dict]], path: str, title: str = "smockron-proxy vs nginx") -> str:
    """rounds: {contender: [{"rps": .., "cpu_us": ..}, ...]} in round order. Writes `path`."""
    plt = _pyplot()
    names = list(rounds)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        xs = [i + k * width for i in range(len(rounds[name]))]
        top.bar(xs, [r["rps"] for r in rounds[name]], width, label=name)
        bottom.bar(xs, [r["cpu_us"] for r in rounds[name]], width, label=name)
    top.set_ylabel("requests/s")
    bottom.set_ylabel("CPU µs per request")
    bottom.set_xlabel("round")
    n = max(len(v) for v in rounds.values()) if rounds else 0
    bottom.set_xticks([i + 0.4 - width / 2 for i in range(n)], [str(i) for i in range(n)])
    top.legend()
    top.set_title(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def accuracy(cells: list[dict], path: str, title: str = "one limit across G gatekeepers") -> str:
    """cells: [{"scenario": .., "g": .., "delay_ms": .., "ratio": ..}]. A line per (scenario, G);
    the band is the goal [0.98, 1.03]. Writes `path`."""
    plt = _pyplot()
    scenarios = sorted({c["scenario"] for c in cells})
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * max(1, len(scenarios)), 4), squeeze=False, sharey=True)
    for ax, scenario in zip(axes[0], scenarios):
        for g in sorted({c["g"] for c in cells if c["scenario"] == scenario}):
            pts = sorted((c["delay_ms"], c["ratio"]) for c in cells if c["scenario"] == scenario and c["g"] == g)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"G = {g}")
        ax.axhspan(0.98, 1.03, color="green", alpha=0.12)
        ax.set_title(scenario)
        ax.set_xlabel("one-way delay to the master (ms)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("admitted / ideal")
    axes[0][-1].legend()
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
