"""Request timing and the Prometheus registry (the live engine gauges are checked by the API
tests against a real server's /metrics)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headrace.metrics.prometheus import Metrics
from headrace.metrics.timing import RequestTimer


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_timer_spreads_a_chunk_gap_over_its_tokens() -> None:
    t = RequestTimer(start=10.0)
    t.on_tokens(0, queue_time=0.25, now=10.3)  # a chunk with no token yet: queue time only
    t.on_tokens(1, now=10.5)
    t.on_tokens(1, now=10.6)
    t.on_tokens(2, now=11.0)  # two tokens at once: two gaps of 0.2
    t.finish(now=11.5)
    assert t.queue_time == 0.25
    assert t.ttft == pytest.approx(0.5)
    assert t.token_gaps == pytest.approx([0.1, 0.2, 0.2])
    assert t.e2e == pytest.approx(1.5)
    assert t.as_ms() == {"queue_ms": 250.0, "ttft_ms": 500.0, "total_ms": 1500.0}


def test_timer_of_a_request_that_never_produced_a_token() -> None:
    t = RequestTimer(start=1.0)
    t.finish(now=3.0)
    assert t.ttft is None and t.token_gaps == []
    assert t.as_ms() == {"queue_ms": None, "ttft_ms": None, "total_ms": 2000.0}


def test_observe_request_fills_histograms_and_counters_by_label() -> None:
    m = Metrics()
    t = RequestTimer(start=0.0)
    t.on_tokens(1, queue_time=0.01, now=0.05)
    t.on_tokens(1, now=0.07)
    t.finish(now=0.1)
    m.observe_request("tiny", "paid", t, "length", prompt_tokens=7, completion_tokens=2)
    m.observe_request("tiny", "free", RequestTimer(start=0.0, end=0.2), "abort", 3, 0)
    s = samples(m)
    model = (("model_name", "tiny"),)
    assert s[("headrace:prompt_tokens_total", model)] == 10
    assert s[("headrace:generation_tokens_total", model)] == 2
    assert s[("headrace:request_success_total", (("finish_reason", "length"), *model))] == 1
    assert s[("headrace:request_success_total", (("finish_reason", "abort"), *model))] == 1
    paid = (*model, ("tier", "paid"))
    assert s[("headrace:time_to_first_token_seconds_count", paid)] == 1
    assert s[("headrace:time_to_first_token_seconds_sum", paid)] == pytest.approx(0.05)
    assert s[("headrace:request_queue_time_seconds_sum", paid)] == pytest.approx(0.01)
    assert ("headrace:time_to_first_token_seconds_count", (*model, ("tier", "free"))) not in s
    assert s[("headrace:inter_token_latency_seconds_count", model)] == 1
    assert s[("headrace:e2e_request_latency_seconds_count", model)] == 2


def test_each_metrics_object_has_its_own_registry() -> None:
    a, b = Metrics(engines=lambda: {}), Metrics(engines=lambda: {})
    a.observe_request("m", "free", RequestTimer(start=0.0, end=1.0), "stop", 1, 1)
    assert (
        "headrace:request_success_total",
        (("finish_reason", "stop"), ("model_name", "m")),
    ) in samples(a)
    assert not any(name == "headrace:request_success_total" for name, _ in samples(b))
