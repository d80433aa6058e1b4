"""The bench's outputs: the JSON document (schema in `bench_schema.json`, id `headrace-bench/1`),
the table printed at the end and the progress bar drawn while it runs."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TextIO

from headrace.bench.client import Target
from headrace.bench.loadgen import Bounds, LevelRun
from headrace.bench.stats import RequestResult, Slo, summarize, summarize_groups
from headrace.bench.workloads import Workload

SCHEMA_ID = "headrace-bench/1"


def load_schema() -> dict[str, Any]:
    text = resources.files("headrace.bench").joinpath("bench_schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def run_document(run: LevelRun, slo: Slo) -> dict[str, Any]:
    return {
        "mode": run.mode,
        "level": run.level,
        "started_at": _iso(run.started_at),
        "summary": summarize(run.results, run.duration_s, slo),
        "by_tenant": summarize_groups(run.results, run.duration_s, slo, "tenant"),
        "by_tier": summarize_groups(run.results, run.duration_s, slo, "tier"),
        "server": {
            "metrics_available": run.metrics_available,
            "generation_tokens_delta": run.generation_tokens_delta,
            "timeline": [s.as_dict() for s in run.timeline],
        },
        "requests": [_request_row(r) for r in run.results],
    }


def _request_row(r: RequestResult) -> dict[str, Any]:
    return {
        "index": r.index,
        "start_s": r.start,
        "ok": r.ok,
        "status": r.status,
        "error": r.error,
        "ttft_s": r.ttft,
        "tpot_s": r.tpot,
        "e2e_s": r.e2e,
        "output_tokens": r.output_tokens,
        "prompt_tokens": r.prompt_tokens,
        "max_tokens": r.max_tokens,
        "tenant": r.tenant,
        "tier": r.tier,
        "kind": r.kind,
    }


def bench_document(
    target: Target,
    workload: Workload,
    mode: str,
    levels: list[float],
    bounds: Bounds,
    arrivals: str,
    slo: Slo,
    runs: list[dict[str, Any]],
    created_at: float,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "created_at": _iso(created_at),
        "target": {
            "url": target.url,
            "api": target.api,
            "model": target.model,
            "ignore_eos": target.ignore_eos,
            "connection_per_request": target.connection_per_request,
        },
        "config": {
            "mode": mode,
            "levels": levels,
            "arrivals": arrivals,
            "num_requests": bounds.num_requests,
            "duration_s": bounds.duration,
            "drain_timeout_s": bounds.drain_timeout,
            "workload": workload.describe(),
            "slo": {"ttft_s": slo.ttft, "tpot_s": slo.tpot},
        },
        "runs": runs,
    }


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _limit(seconds: float | None) -> str:
    return "(no limit)" if seconds is None else f"{seconds:g} s"


def _level(mode: str, level: float) -> str:
    return f"{level:g} req/s" if mode == "rate" else f"{level:g} streams"


COLUMNS = (
    "load",
    "ok/sent",
    "req/s",
    "out tok/s",
    "TTFT p50/p95/p99 ms",
    "TPOT p50/p95 ms",
    "ITL p95 ms",
    "e2e p50/p95 ms",
    "goodput",
)


def table_rows(name: str, summary: dict[str, Any]) -> list[str]:
    ttft, tpot, itl, e2e = (summary[k] for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s"))
    good = summary["goodput"]
    return [
        name,
        f"{summary['completed']}/{summary['requests']}",
        f"{summary['request_throughput']:.2f}",
        f"{summary['output_tokens_per_s']:.1f}",
        f"{_ms(ttft['p50'])}/{_ms(ttft['p95'])}/{_ms(ttft['p99'])}",
        f"{_ms(tpot['p50'])}/{_ms(tpot['p95'])}",
        _ms(itl["p95"]),
        f"{_ms(e2e['p50'])}/{_ms(e2e['p95'])}",
        f"{good['share'] * 100:.0f}% ({good['rate_per_s']:.2f}/s)",
    ]


def format_table(rows: list[list[str]], header: tuple[str, ...] = COLUMNS) -> str:
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    """The human-readable report of a bench document."""
    runs = doc["runs"]
    slo = doc["config"]["slo"]
    out = [
        f"{doc['target']['url']} ({doc['target']['api']}, model {doc['target']['model']}), "
        f"workload {doc['config']['workload']['kind']}, "
        f"goodput SLO: TTFT <= {_limit(slo['ttft_s'])}, TPOT <= {_limit(slo['tpot_s'])}",
        format_table([table_rows(_level(r["mode"], r["level"]), r["summary"]) for r in runs]),
    ]
    for group in ("by_tier", "by_tenant"):
        rows = [
            table_rows(f"{_level(r['mode'], r['level'])} {name}", summary)
            for r in runs
            for name, summary in r[group].items()
        ]
        if rows:
            out += ["", group.replace("by_", "per "), format_table(rows)]
    for r in runs:
        errors = r["summary"]["errors"]
        if errors["by_status"]:
            status = ", ".join(f"{k}: {v}" for k, v in errors["by_status"].items())
            kinds = ", ".join(f"{k}: {v}" for k, v in errors["by_type"].items())
            out.append(f"errors at {_level(r['mode'], r['level'])}: {status} ({kinds})")
    return "\n".join(out)


class Progress:
    """A one-line progress bar on a terminal; silent when the stream is not a terminal."""

    def __init__(
        self,
        label: str,
        total: int | None,
        duration: float | None,
        stream: TextIO | None = None,
        width: int = 30,
    ) -> None:
        self.label, self.total, self.duration, self.width = label, total, duration, width
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.ok = self.failed = 0
        self.t0 = time.perf_counter()

    def update(self, result: RequestResult) -> None:
        if result.ok:
            self.ok += 1
        else:
            self.failed += 1
        self.draw()

    def draw(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line())
            self.stream.flush()

    async def tick(self, interval: float = 0.5) -> None:
        """Redraws until cancelled, so that the clock moves while long requests run."""
        while True:
            self.draw()
            await asyncio.sleep(interval)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        done = self.ok + self.failed
        fractions = [done / self.total] if self.total else []
        if self.duration:
            fractions.append(elapsed / self.duration)
        frac = min(1.0, max(fractions)) if fractions else 0.0
        bar = "#" * int(frac * self.width)
        count = f"{done}/{self.total}" if self.total else f"{done}"
        return (
            f"{self.label} [{bar.ljust(self.width, '.')}] {count} ok={self.ok} "
            f"err={self.failed} {elapsed:.1f}s"
        )

    def close(self) -> None:
        # Off a terminal (logs, CI) one line per level still shows that work is done.
        self.stream.write(("\r" if self.enabled else "") + self.line() + "\n")
        self.stream.flush()
