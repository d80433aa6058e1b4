"""What the dashboard page polls: one compact JSON snapshot of what the server already counts.

Nothing here is measured anew: each model's latest `StepStats` (what /v1/stats returns), a
router's replicas (`describe()`), the gateway's and the router's counters as the Prometheus
registry holds them, and the request window's per-tenant summary. The page turns counters
into rates itself (the change between two polls), so the server keeps no history for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.metrics_core import Metric

from headrace.api.dashboard_lora import lora_panel
from headrace.api.state import AppState
from headrace.ledger.database import database_errors
from headrace.ledger.query import UsageQuery
from headrace.metrics.window import SloTargets

LEDGER_HOURS = 24  # the ledger panel's span

# Counter and gauge families the page shows, by Prometheus name (the `_total` suffix dropped).
FAMILIES = (
    "headrace:gateway_requests_admitted",
    "headrace:gateway_requests_rejected",
    "headrace:gateway_tokens",
    "headrace:gateway_requests_in_flight",
    "headrace:gateway_requests_queued",
    "headrace:num_preemptions",
    "headrace:request_success",
    "headrace:router_requests_routed",
    "headrace:router_replica_restarts",
    "headrace:router_replica_healthy",
    "headrace:router_retries",
    "headrace:batches_running",
    "headrace:batch_lines_running",
    "headrace:batch_lines",
    "headrace:prompt_tokens",  # per model name: a base model or a LoRA adapter (the LoRA panel)
    "headrace:generation_tokens",
)
_STEP_FIELDS = (
    "step_duration", "num_running", "num_waiting", "num_batched_tokens", "num_prefill_tokens",
    "num_decode_tokens", "kv_blocks_used", "kv_blocks_total", "kv_blocks_cached",
    "num_tokens_total", "num_preemptions_total",
)  # fmt: skip
_REPLICA_FIELDS = (
    "name", "state", "restarts", "routed", "in_flight", "num_running", "num_waiting",
    "kv_blocks_used", "kv_blocks_total", "load_tokens", "last_error",
)  # fmt: skip


def snapshot(state: AppState, slo: SloTargets) -> dict[str, Any]:
    counted = counters(state.metrics.registry.collect())
    return {
        "time": round(time.time(), 3),
        "status": state.health()[1]["status"],
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "models": {name: _model(engine) for name, engine in list(state.engines.items())},
        "counters": counted,
        "requests": state.metrics.window.summary(slo),
        "lora": lora_panel(state, counted),
    }


def _model(engine: Any) -> dict[str, Any]:
    step = engine.stats()
    out: dict[str, Any] = {
        "healthy": engine.is_healthy,
        "step": {k: getattr(step, k) for k in _STEP_FIELDS},
        "replicas": [],
    }
    replicas = engine.describe().get("replicas", [])  # a router's, as /health
    if isinstance(replicas, list):
        out["replicas"] = [{k: r.get(k) for k in _REPLICA_FIELDS} for r in replicas]
    return out


def counters(families: Iterable[Metric]) -> dict[str, list[list[Any]]]:
    """{family: [[label values..., value], ...]} of the families in FAMILIES; the label names
    are fixed per family (documented in docs/observability.md)."""
    out: dict[str, list[list[Any]]] = {}
    for family in families:
        if family.name not in FAMILIES:
            continue
        rows = out.setdefault(family.name, [])
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            rows.append([*s.labels.values(), s.value])
    return out


def ledger_hours(state: AppState) -> dict[str, Any]:
    """The ledger panel: every tenant's totals per UTC hour over the last LEDGER_HOURS, from
    the ledger (which persists: the page's other series start when it opens). Blocking: call
    it off the event loop."""
    if state.ledger is None:
        return {"enabled": False, "data": []}
    start = (time.time() // 3600 - (LEDGER_HOURS - 1)) * 3600.0
    try:
        rows = state.ledger.totals(UsageQuery(start=start, group_by="hour"))
    except database_errors() as e:
        return {"enabled": True, "error": str(e), "data": []}
    return {"enabled": True, "start": start, "data": rows}
