"""A replica schedule, hour by hour, from a recorded demand trace and the measured tokens/s per
replica: the autoscaler's forecast (router/forecast.py) replayed over the trace, then run on.

The trace is CSV (`timestamp,tokens_per_s` with a header) or JSON (a list of
`{"timestamp": ..., "tokens_per_s": ...}` or of `[timestamp, tokens_per_s]`); a timestamp is
Unix seconds or ISO 8601. Samples are averaged into steps of the trace's median spacing
(at least a minute), gaps carry the last value.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.bench import BenchError
from headrace.bench.plan import replicas_needed
from headrace.router.forecast import replay

MIN_STEP_S = 60.0
HOUR_S = 3600.0


@dataclass(frozen=True)
class Slot:
    start: float  # Unix seconds
    peak_tokens_per_s: float
    replicas: int


def load_trace(path: str) -> list[tuple[float, float]]:
    """(Unix seconds, tokens/s) pairs, sorted."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        rows = _json_rows(json.loads(text)) if path.endswith(".json") else _csv_rows(text)
        points = sorted((_seconds(t), float(v)) for t, v in rows)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise BenchError(f"{path} is not a demand trace ({exc})") from None
    if len(points) < 2:
        raise BenchError(f"{path} needs at least two samples")
    return points


def resample(points: list[tuple[float, float]]) -> tuple[list[float], float, float]:
    """(rates at a fixed step, the step in seconds, the end of the last step)."""
    gaps = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False) if b[0] > a[0]]
    step = max(statistics.median(gaps) if gaps else MIN_STEP_S, MIN_STEP_S)
    t0 = points[0][0]
    n = int((points[-1][0] - t0) // step) + 1
    sums, counts = [0.0] * n, [0] * n
    for t, v in points:
        i = min(int((t - t0) // step), n - 1)
        sums[i] += v
        counts[i] += 1
    rates, last = [], points[0][1]
    for total, count in zip(sums, counts, strict=True):
        last = total / count if count else last
        rates.append(last)
    return rates, step, t0 + n * step


def schedule(
    points: list[tuple[float, float]], per_replica: float, headroom: float, hours: int
) -> tuple[list[Slot], bool]:
    """The next `hours` whole hours after the trace: each one's forecast peak and replicas;
    and whether the forecast has a daily profile (a day of history or more)."""
    rates, step, end = resample(points)
    model = replay(rates, step)
    first = math.ceil(end / HOUR_S) * HOUR_S
    ahead = model.forecast(math.ceil((first + hours * HOUR_S - end) / step))
    slots = []
    for h in range(hours):
        lo, hi = first + h * HOUR_S, first + (h + 1) * HOUR_S
        inside = [r for i, r in enumerate(ahead) if lo <= end + i * step < hi] or [0.0]
        peak = max(inside)
        slots.append(Slot(lo, peak, replicas_needed(max(peak, 1e-9), per_replica, headroom)))
    return slots, model.seasonal


def render_schedule(slots: list[Slot], seasonal: bool, start_s: float | None) -> str:
    lines = ["", "replica schedule (forecast from the demand trace"
             + ("" if seasonal else "; under a day of history: trend only, no daily profile")
             + "):", f"{'hour (UTC)':<18} {'peak tok/s':>10} {'replicas':>8}"]  # fmt: skip
    for s in slots:
        when = dt.datetime.fromtimestamp(s.start, dt.UTC).strftime("%Y-%m-%d %H:00")
        lines.append(f"{when:<18} {s.peak_tokens_per_s:>10.1f} {s.replicas:>8}")
    if start_s:
        lines.append(f"start each hour's extra replicas {start_s:g} s before it begins")
    return "\n".join(lines)


def _csv_rows(text: str) -> list[tuple[str, str]]:
    reader = csv.DictReader(text.splitlines())
    return [(row["timestamp"], row["tokens_per_s"]) for row in reader]


def _json_rows(doc: Any) -> list[tuple[Any, Any]]:
    if isinstance(doc, dict):
        doc = doc["samples"]
    return [(r["timestamp"], r["tokens_per_s"]) if isinstance(r, dict) else (r[0], r[1])
            for r in doc]  # fmt: skip


def _seconds(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.UTC)
        return stamp.timestamp()
