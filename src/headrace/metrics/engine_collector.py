"""The engine gauges and counters, per model, read from each engine's latest `StepStats` when
Prometheus scrapes, so they are never stale and cost the engine loop nothing.

One table: (kind, name, help, the `StepStats` field). The step gauges (duration, prefill and
decode tokens of the latest step) are what the dashboard and the Grafana panels draw; a scrape
sees one step out of many, so they are gauges of the moment (vLLM's `iteration_tokens_total`
is a histogram of every step, which the engine loop would have to feed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from headrace.engine.frontend.client import EngineClient
    from headrace.engine.messages import StepStats

PREFIX = "headrace:"
GAUGE, COUNTER = GaugeMetricFamily, CounterMetricFamily
Family = GaugeMetricFamily | CounterMetricFamily

# Counters drop their `_total` here: prometheus-client appends it.
ENGINE_SERIES: tuple[tuple[type[Family], str, str, str], ...] = (
    (GAUGE, "num_requests_running", "Requests running.", "num_running"),
    (GAUGE, "num_requests_waiting", "Requests waiting.", "num_waiting"),
    (GAUGE, "kv_cache_usage_perc", "KV-cache usage, 0 to 1.", "kv_usage"),
    (GAUGE, "kv_cache_used_blocks", "KV-cache blocks in use.", "kv_blocks_used"),
    (GAUGE, "kv_cache_total_blocks", "KV-cache blocks.", "kv_blocks_total"),
    (COUNTER, "num_preemptions", "Preemptions.", "num_preemptions_total"),
    (GAUGE, "kv_cache_cached_blocks", "KV blocks findable by prefix.", "kv_blocks_cached"),
    (COUNTER, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
     "prefix_cache_queries_total"),
    (COUNTER, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
     "prefix_cache_hits_total"),
    (COUNTER, "spec_decode_num_draft_tokens", "Draft tokens checked (speculative decoding).",
     "spec_draft_tokens_total"),
    (COUNTER, "spec_decode_num_accepted_tokens", "Draft tokens accepted.",
     "spec_accepted_tokens_total"),
    (COUNTER, "steps_overlapped", "Steps left running while the next was scheduled "
     "(--async-scheduling).", "steps_overlapped_total"),
    (GAUGE, "step_duration_seconds", "Duration of the latest engine step.", "step_duration"),
    (GAUGE, "step_prefill_tokens", "Prompt tokens in the latest step's batch.",
     "num_prefill_tokens"),
    (GAUGE, "step_decode_tokens", "Generated tokens in the latest step's batch.",
     "num_decode_tokens"),
    (COUNTER, "tokens_computed", "Tokens computed (prefill + decode) since start.",
     "num_tokens_total"),
    (COUNTER, "lora_adapter_loads", "LoRA adapters read from disk (loads and reloads).",
     "lora_loads_total"),
    (COUNTER, "lora_adapter_evictions", "LoRA adapters evicted from memory (--max-cpu-loras).",
     "lora_evictions_total"),
)  # fmt: skip


class EngineCollector(Collector):
    def __init__(self, engines: Callable[[], Mapping[str, EngineClient]]) -> None:
        self.engines = engines

    def describe(self) -> Iterable[Metric]:
        return []  # the label sets follow the live engines; skip the registry's duplicate check

    def collect(self) -> Iterable[Metric]:
        families = [
            (kind(PREFIX + name, help_text, labels=["model_name"]), field)
            for kind, name, help_text, field in ENGINE_SERIES
        ]
        loras = LoraFamilies()
        for name, engine in list(self.engines().items()):
            stats = engine.stats()
            for family, field in families:
                family.add_metric([name], getattr(stats, field))
            loras.add(name, stats)
        return [family for family, _ in families] + loras.families()


class LoraFamilies:
    """The per-adapter series, labelled `model_name` and `lora_name`, and vLLM's
    `lora_requests_info` (its labels are the adapters' names, comma-separated; its value the
    time of the scrape, as vLLM sets it)."""

    def __init__(self) -> None:
        labels = ["model_name", "lora_name"]
        self.running = GAUGE(PREFIX + "lora_requests_running",
                             "Requests running per LoRA adapter.", labels=labels)  # fmt: skip
        self.waiting = GAUGE(PREFIX + "lora_requests_waiting",
                             "Requests waiting per LoRA adapter.", labels=labels)  # fmt: skip
        self.tokens = COUNTER(PREFIX + "lora_tokens_computed",
                              "Tokens computed per LoRA adapter.", labels=labels)  # fmt: skip
        self.resident = GAUGE(PREFIX + "lora_adapter_resident",
                              "Replicas holding a LoRA adapter's weights in memory.",
                              labels=labels)  # fmt: skip
        # the model's lora_adapter_loads / _evictions, by adapter (--max-cpu-loras)
        self.loads = COUNTER(PREFIX + "lora_adapter_reads",
                             "Times a LoRA adapter was read from disk.", labels=labels)  # fmt: skip
        self.evictions = COUNTER(PREFIX + "lora_adapter_drops",
                                 "Times a LoRA adapter's weights were dropped from memory.",
                                 labels=labels)  # fmt: skip
        self.info = GAUGE(PREFIX + "lora_requests_info", "Running and waiting LoRA adapters.",
                          labels=["model_name", "running_lora_adapters",
                                  "waiting_lora_adapters", "max_lora"])  # fmt: skip

    def add(self, name: str, stats: StepStats) -> None:
        for lora, n_running, n_waiting, n_tokens in stats.lora_requests:
            self.running.add_metric([name, lora], n_running)
            self.waiting.add_metric([name, lora], n_waiting)
            self.tokens.add_metric([name, lora], n_tokens)
        for lora, resident, loads, evictions in stats.lora_adapters:
            self.resident.add_metric([name, lora], resident)
            self.loads.add_metric([name, lora], loads)
            self.evictions.add_metric([name, lora], evictions)
        if stats.max_loras:  # an engine serving adapters
            running = ",".join(r[0] for r in stats.lora_requests if r[1])
            waiting = ",".join(r[0] for r in stats.lora_requests if r[2])
            self.info.add_metric([name, running, waiting, str(stats.max_loras)], time.time())

    def families(self) -> list[Metric]:
        return [self.running, self.waiting, self.tokens, self.resident, self.loads,
                self.evictions, self.info]  # fmt: skip
