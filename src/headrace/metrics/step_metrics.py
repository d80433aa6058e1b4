"""What the latest engine step did, per model, read at scrape time: its duration and its batch
(prefill and decode tokens), and the tokens computed since start (tokens/s is its rate).

The dashboard and the Grafana panels draw the same series from these; a scrape sees one step
out of many, so they are gauges of the moment (vLLM's `iteration_tokens_total` is a histogram
of every step, which the engine loop would have to feed; this costs the loop nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from headrace.engine.client import EngineClient

PREFIX = "headrace:"


class StepCollector(Collector):
    def __init__(self, engines: Callable[[], Mapping[str, EngineClient]]) -> None:
        self.engines = engines

    def describe(self) -> Iterable[Metric]:
        return []  # the label sets follow the live engines

    def collect(self) -> Iterable[Metric]:
        labels = ["model_name"]
        duration = GaugeMetricFamily(
            PREFIX + "step_duration_seconds", "Duration of the latest engine step.", labels=labels
        )
        prefill = GaugeMetricFamily(
            PREFIX + "step_prefill_tokens", "Prompt tokens in the latest step's batch.",
            labels=labels,
        )  # fmt: skip
        decode = GaugeMetricFamily(
            PREFIX + "step_decode_tokens", "Generated tokens in the latest step's batch.",
            labels=labels,
        )  # fmt: skip
        computed = CounterMetricFamily(
            PREFIX + "tokens_computed", "Tokens computed (prefill + decode) since start.",
            labels=labels,
        )  # fmt: skip
        for name, engine in list(self.engines().items()):
            s = engine.stats()
            duration.add_metric([name], s.step_duration)
            prefill.add_metric([name], s.num_prefill_tokens)
            decode.add_metric([name], s.num_decode_tokens)
            computed.add_metric([name], s.num_tokens_total)
        return [duration, prefill, decode, computed]
