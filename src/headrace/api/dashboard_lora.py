"""The dashboard's LoRA panel: per served model, a row for the base model and one for each of
its adapters, from what is already counted (as the rest of `dashboard_data`).

- running / waiting: the engine's latest `StepStats.lora_requests`; the base row is the rest
  of the model's requests (the scheduler counts only adapter requests per adapter);
- prompt / generation tokens: `headrace:prompt_tokens` / `headrace:generation_tokens`, whose
  `model_name` is the name a request asked for (the adapter's, or the base model's), so they
  equal the usage the clients were told; the page turns them into rates;
- resident / loads / evictions: `StepStats.lora_adapters` (resident: replicas holding the
  adapter's weights in memory; loads and evictions by `--max-cpu-loras`). The base has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headrace.api.state import AppState
from headrace.engine.messages import StepStats

PROMPT, GENERATION = "headrace:prompt_tokens", "headrace:generation_tokens"
Row = dict[str, Any]


def lora_panel(state: AppState, counters: Mapping[str, list[list[Any]]]) -> dict[str, list[Row]]:
    """{base model: rows} for the models that serve adapters (a model without any: no rows)."""
    tokens = {name: _by_model(counters.get(name, [])) for name in (PROMPT, GENERATION)}
    out: dict[str, list[Row]] = {}
    for model, engine in list(state.engines.items()):
        stats = engine.stats()
        names = {a for a, base in state.adapters.items() if base == model}
        names |= {row[0] for row in stats.lora_adapters}  # --lora, or loaded at run time
        if names:
            out[model] = [_base_row(model, stats, tokens)] + [
                _adapter_row(name, stats, tokens) for name in sorted(names)
            ]
    return out


def _base_row(model: str, stats: StepStats, tokens: Mapping[str, Mapping[str, float]]) -> Row:
    running = sum(r[1] for r in stats.lora_requests)
    waiting = sum(r[2] for r in stats.lora_requests)
    row = _row(model, tokens, adapter=False)
    row.update(running=max(stats.num_running - running, 0),
               waiting=max(stats.num_waiting - waiting, 0))  # fmt: skip
    return row


def _adapter_row(name: str, stats: StepStats, tokens: Mapping[str, Mapping[str, float]]) -> Row:
    row = _row(name, tokens, adapter=True)
    for lora, running, waiting, _ in stats.lora_requests:
        if lora == name:
            row.update(running=running, waiting=waiting)
    for lora, resident, loads, evictions in stats.lora_adapters:
        if lora == name:
            row.update(resident=resident, loads=loads, evictions=evictions)
    return row


def _row(name: str, tokens: Mapping[str, Mapping[str, float]], adapter: bool) -> Row:
    """A row's defaults: nothing running or waiting; an adapter's weights not in memory, never
    read (an adapter the front end lists but whose replica has not reported yet)."""
    row: Row = {"name": name, "adapter": adapter, "running": 0, "waiting": 0}
    row["prompt_tokens"] = tokens[PROMPT].get(name, 0.0)
    row["generation_tokens"] = tokens[GENERATION].get(name, 0.0)
    if adapter:
        row.update(resident=0, loads=0, evictions=0)
    return row


def _by_model(rows: list[list[Any]]) -> dict[str, float]:
    """A counter's rows [model_name, value] summed by model name."""
    out: dict[str, float] = {}
    for name, value in rows:
        out[name] = out.get(name, 0.0) + value
    return out
