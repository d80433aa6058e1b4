"""Request traces written from a finished request's timer, read back through the SDK's
in-memory exporter: one request span, queue / prefill / decode children at the timer's
moments, the attributes, and the caller's trace as parent when it sent a traceparent."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from headrace.config import ServerConfig
from headrace.metrics.timing import RequestTimer
from headrace.metrics.tracing import RequestTracer, TracedRequest

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def tracer() -> tuple[RequestTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return RequestTracer(provider.get_tracer("test"), provider), exporter


def finished_timer() -> RequestTimer:
    now = time.monotonic()
    t = RequestTimer(start=now - 1.0)
    t.on_tokens(0, queue_time=0.25, now=now - 0.7)
    t.on_tokens(1, now=now - 0.5)
    t.on_tokens(3, now=now - 0.1)
    t.finish(now=now)
    return t


def request(timer: RequestTimer, **kw: object) -> TracedRequest:
    fields: dict[str, object] = dict(
        request_id="gen-1", model="tiny", tenant="acme", tier="paid", replica="tiny/0",
        timer=timer, prompt_tokens=7, completion_tokens=4, cached_tokens=3,
        finish_reason="length",
    )  # fmt: skip
    fields.update(kw)
    return TracedRequest(**fields)  # type: ignore[arg-type]


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def test_one_request_span_with_queue_prefill_and_decode_children() -> None:
    t, exporter = tracer()
    t.record(request(finished_timer()))
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"llm_request", "queue", "prefill", "decode"}
    root = spans["llm_request"]
    assert root.parent is None
    for name in ("queue", "prefill", "decode"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].context.trace_id == root.context.trace_id
    assert seconds(root) == pytest.approx(1.0, abs=1e-3)
    assert seconds(spans["queue"]) == pytest.approx(0.25, abs=1e-3)
    assert seconds(spans["prefill"]) == pytest.approx(0.25, abs=1e-3)  # scheduled -> 1st token
    assert seconds(spans["decode"]) == pytest.approx(0.5, abs=1e-3)
    assert spans["queue"].end_time == spans["prefill"].start_time
    assert spans["decode"].end_time == root.end_time
    wall = time.time_ns()
    assert root.end_time is not None and abs(root.end_time - wall) < 1e9  # epoch, not monotonic
    a = root.attributes or {}
    assert a["headrace.tenant"] == "acme" and a["headrace.tier"] == "paid"
    assert a["headrace.replica"] == "tiny/0"
    assert a["gen_ai.usage.input_tokens"] == 7 and a["gen_ai.usage.output_tokens"] == 4
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)  # type: ignore[arg-type]
    assert a["gen_ai.request.model"] == "tiny" and a["gen_ai.response.id"] == "gen-1"


def test_a_request_that_never_started_has_only_its_queue() -> None:
    t, exporter = tracer()
    timer = RequestTimer(start=time.monotonic() - 2.0)
    timer.finish()
    t.record(request(timer, finish_reason="overloaded", completion_tokens=0, replica=None))
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"llm_request", "queue"}
    assert seconds(spans["queue"]) == pytest.approx(seconds(spans["llm_request"]))
    assert "headrace.replica" not in (spans["llm_request"].attributes or {})


def test_the_callers_traceparent_becomes_the_parent() -> None:
    t, exporter = tracer()
    parent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    t.record(request(finished_timer(), traceparent=parent))
    root = by_name(exporter.get_finished_spans())["llm_request"]
    assert f"{root.context.trace_id:032x}" == CALLER_TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CALLER_SPAN


def test_an_error_marks_the_span() -> None:
    t, exporter = tracer()
    t.record(request(finished_timer(), finish_reason="error"))
    root = by_name(exporter.get_finished_spans())["llm_request"]
    assert root.status.status_code.name == "ERROR"


def test_the_endpoint_must_be_an_http_url() -> None:
    assert ServerConfig().otlp_traces_endpoint is None  # off by default
    with pytest.raises(ValueError, match="http"):
        ServerConfig(otlp_traces_endpoint="127.0.0.1:4318")
