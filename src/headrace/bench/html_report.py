"""The bench's report as one HTML file: the SLO tables (all, per tier, per tenant) and the
plots, embedded, so the file alone can be mailed or opened from anywhere (no other file, no
network). Jinja2 escapes every value taken from the document."""

from __future__ import annotations

import base64
import json
import os
from importlib import resources
from typing import Any

import jinja2

from headrace.bench.report import COLUMNS, _level, _limit, table_rows

PLOT_TITLES = {
    "load_sweep.png": "Throughput and TTFT p95 against load",
    "latency_cdf.png": "Latency distributions",
    "server_timeline.png": "Server timeline",
}


def write_html(doc: dict[str, Any], out_dir: str, plots: list[str]) -> str:
    """Writes `report.html` into `out_dir` with the PNGs at `plots`; returns its path."""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(doc, plots))
    return path


def render_html(doc: dict[str, Any], plots: list[str]) -> str:
    template = resources.files("headrace.bench").joinpath("report_template.html")
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    config = doc["config"]
    return env.from_string(template.read_text("utf-8")).render(
        schema=doc["schema"],
        created_at=doc["created_at"],
        target=doc["target"],
        workload=json.dumps(config["workload"], sort_keys=True),
        load=", ".join(_level(config["mode"], level) for level in config["levels"]),
        slo_ttft=_limit(config["slo"]["ttft_s"]),
        slo_tpot=_limit(config["slo"]["tpot_s"]),
        columns=COLUMNS,
        sections=_sections(doc["runs"]),
        errors=_errors(doc["runs"]),
        plots=[_plot(p) for p in plots],
    )


def _sections(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [{"title": "All requests", "rows": [_row(r, "", r["summary"]) for r in runs]}]
    for group, title in (("by_tier", "Per tier"), ("by_tenant", "Per tenant")):
        rows = [_row(r, name, s) for r in runs for name, s in r[group].items()]
        if rows:
            out.append({"title": title, "rows": rows})
    return out


def _row(run: dict[str, Any], name: str, summary: dict[str, Any]) -> list[str]:
    label = _level(run["mode"], run["level"]) + (f" {name}" if name else "")
    return table_rows(label, summary)


def _errors(runs: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in runs:
        errors = r["summary"]["errors"]
        if errors["by_status"]:
            status = ", ".join(f"{k}: {v}" for k, v in errors["by_status"].items())
            out.append(f"{_level(r['mode'], r['level'])}: {status}")
    return out


def _plot(path: str) -> dict[str, str]:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    name = os.path.basename(path)
    return {"title": PLOT_TITLES.get(name, name), "data": data}
