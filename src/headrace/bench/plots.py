"""PNG plots of a bench document, drawn with matplotlib's Agg backend (no display needed):
throughput and TTFT p95 against offered load (sweeps), latency CDFs, and the server timeline
(batch size, queue depth, KV-cache usage) when the server exported metrics."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.figure import Figure  # noqa: E402


def write_plots(doc: dict[str, Any], out_dir: str) -> list[str]:
    """Writes every plot the document has data for; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, draw in (
        ("load_sweep.png", draw_sweep),
        ("latency_cdf.png", draw_cdfs),
        ("server_timeline.png", draw_timeline),
    ):
        fig = draw(doc)
        if fig is None:
            continue
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _load_label(doc: dict[str, Any]) -> str:
    if doc["config"]["mode"] == "rate":
        return "offered load (requests/s)"
    return "concurrent streams"


def draw_sweep(doc: dict[str, Any]) -> Figure | None:
    runs = doc["runs"]
    if len(runs) < 2:
        return None
    x = [r["level"] for r in runs]
    tput = [r["summary"]["output_tokens_per_s"] for r in runs]
    ttft = [r["summary"]["ttft_s"]["p95"] for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, tput, "o-", color="tab:blue", label="output tokens/s")
    ax.set_xlabel(_load_label(doc))
    ax.set_ylabel("output tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(x, [t if t is not None else float("nan") for t in ttft], "s--", color="tab:red")
    ax2.set_ylabel("TTFT p95 (s)", color="tab:red")
    slo = doc["config"]["slo"]["ttft_s"]
    if slo is not None:
        ax2.axhline(slo, color="tab:red", linestyle=":", linewidth=1, label=f"TTFT SLO {slo} s")
        ax2.legend(loc="upper left")
    ax.set_title("Throughput and TTFT p95 against offered load")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if not values:
        return
    ordered = sorted(values)
    n = len(ordered)
    ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label)


def draw_cdfs(doc: dict[str, Any]) -> Figure | None:
    if not any(q["ok"] for r in doc["runs"] for q in r["requests"]):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, title in zip(
        axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "end-to-end"), strict=True
    ):
        for run in doc["runs"]:
            values = [q[key] for q in run["requests"] if q["ok"] and q[key] is not None]
            unit = "req/s" if run["mode"] == "rate" else "streams"
            _cdf(ax, values, f"{run['level']:g} {unit}")
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of requests")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    return fig


def draw_timeline(doc: dict[str, Any]) -> Figure | None:
    runs = [r for r in doc["runs"] if r["server"]["metrics_available"] and r["server"]["timeline"]]
    if not runs:
        return None
    fig, (ax, ax_kv) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    offset = 0.0
    for i, run in enumerate(runs):
        points = run["server"]["timeline"]
        t = [offset + p["t"] for p in points]
        first = i == 0  # one legend entry per series, not per run
        ax.plot(
            t,
            [_nan(p["running"]) for p in points],
            color="tab:blue",
            label="batch size (running)" if first else None,
        )
        ax.plot(
            t,
            [_nan(p["waiting"]) for p in points],
            color="tab:orange",
            label="queue depth (waiting)" if first else None,
        )
        ax_kv.plot(t, [_nan(p["kv_cache_usage"], 100.0) for p in points], color="tab:green")
        if len(runs) > 1:
            ax.axvline(offset, color="grey", linewidth=0.5)
            ax.text(offset, 0, f" {run['level']:g}", fontsize="x-small", va="bottom")
        offset = t[-1] if t else offset
    ax.set_ylabel("requests")
    ax.legend(loc="upper left", fontsize="small")
    ax.grid(alpha=0.3)
    ax.set_title("Server state scraped from /metrics")
    ax_kv.set_ylabel("KV cache used (%)")
    ax_kv.set_xlabel("seconds")
    ax_kv.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _nan(value: float | None, scale: float = 1.0) -> float:
    return float("nan") if value is None else value * scale
