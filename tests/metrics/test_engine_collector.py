"""The engine series (the latest step's gauges, the counters), read from each engine at scrape."""

from __future__ import annotations

import msgspec
from fake_engine import FakeEngine
from prometheus_client.parser import text_string_to_metric_families

from headrace.engine.messages import StepStats
from headrace.metrics.engine_collector import COUNTER, ENGINE_SERIES, PREFIX
from headrace.metrics.prometheus import Metrics


class Busy(FakeEngine):
    def __init__(self, stats: StepStats) -> None:
        self.step = stats

    def stats(self) -> StepStats:
        return self.step


def scrape(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = metrics.render()[0].decode()
    return {
        (s.name, s.labels.get("model_name", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_each_model_reports_its_latest_step() -> None:
    a = Busy(StepStats(step_duration=0.02, num_prefill_tokens=30, num_decode_tokens=5,
                       num_batched_tokens=35, num_tokens_total=1000))  # fmt: skip
    b = Busy(StepStats(step_duration=0.5, num_decode_tokens=1, num_tokens_total=7))
    metrics = Metrics(lambda: {"a": a, "b": b})
    s = scrape(metrics)
    assert s[("headrace:step_duration_seconds", "a")] == 0.02
    assert s[("headrace:step_prefill_tokens", "a")] == 30
    assert s[("headrace:step_decode_tokens", "a")] == 5
    assert s[("headrace:tokens_computed_total", "a")] == 1000
    assert s[("headrace:step_duration_seconds", "b")] == 0.5
    assert s[("headrace:step_prefill_tokens", "b")] == 0
    a.step = StepStats(num_tokens_total=1200)  # read live, never cached
    assert scrape(metrics)[("headrace:tokens_computed_total", "a")] == 1200


def test_every_engine_series_reads_its_own_stats_field() -> None:
    names = [f.name for f in msgspec.structs.fields(StepStats) if f.type in (int, float)]
    stats = StepStats(**{n: i + 2 for i, n in enumerate(names)})  # distinct per field
    stats = msgspec.structs.replace(stats, kv_blocks_used=3, kv_blocks_total=8)  # usage 0.375
    s = scrape(Metrics(lambda: {"m": Busy(stats)}))
    for kind, name, _, field in ENGINE_SERIES:
        sample = PREFIX + name + ("_total" if kind is COUNTER else "")
        assert s[(sample, "m")] == getattr(stats, field), (name, field)
    assert s[(PREFIX + "kv_cache_usage_perc", "m")] == 0.375
