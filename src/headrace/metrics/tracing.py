"""Request traces for OpenTelemetry: one span per request, children for queue, prefill, decode.

Off unless `--otlp-traces-endpoint` is given (`otlp_tracer`), as in vLLM. Nothing is traced
while a request runs: its `RequestTimer` already holds every moment, so the spans are written
once, when the request is recorded, with their start and end times set from the timer. The
request span carries the tenant, tier, replica, token counts and finish reason; a
`traceparent` header sent with the request makes it a child of the caller's span.

Span times: the timer's clock is monotonic; spans need the epoch, so each moment is placed
relative to "now" on both clocks when the request is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.metrics.timing import RequestTimer

SERVICE = "headrace"


@dataclass(frozen=True)
class TracedRequest:
    request_id: str
    model: str
    tenant: str
    tier: str
    replica: str | None
    timer: RequestTimer
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    traceparent: str | None = None


class RequestTracer:
    """Writes a finished request's spans to an OpenTelemetry `Tracer`."""

    def __init__(self, tracer: Any, provider: Any = None) -> None:
        self.tracer = tracer
        self.provider = provider  # shut down (flushed) by `close()`, when this owns it

    def record(self, r: TracedRequest) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {"traceparent": r.traceparent} if r.traceparent else {}
        parent = TraceContextTextMapPropagator().extract(carrier)
        epoch = _to_epoch_ns()
        t = r.timer
        end = t.end if t.end is not None else t.start
        span = self.tracer.start_span(
            "llm_request", context=parent, kind=trace.SpanKind.SERVER,
            start_time=epoch(t.start), attributes=_attributes(r),
        )  # fmt: skip
        inside = trace.set_span_in_context(span)
        for name, a, b in _phases(t, end):
            child = self.tracer.start_span(name, context=inside, start_time=epoch(a))
            child.end(end_time=epoch(b))
        if r.finish_reason == "error":
            span.set_status(trace.Status(trace.StatusCode.ERROR, "the engine failed"))
        span.end(end_time=epoch(end))

    def close(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def _phases(t: RequestTimer, end: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of queue (arrival -> first scheduled), prefill (-> first token) and
    decode (-> last token); a phase the request never reached is left out."""
    if t.queue_time is None:
        return [("queue", t.start, end)]  # never scheduled: it waited all its life
    scheduled = t.start + t.queue_time
    out = [("queue", t.start, scheduled)]
    if t.first_token is None:
        return [*out, ("prefill", scheduled, end)]
    out.append(("prefill", scheduled, t.first_token))
    return [*out, ("decode", t.first_token, end)]


def _attributes(r: TracedRequest) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.system": SERVICE,
        "gen_ai.request.model": r.model,
        "gen_ai.response.id": r.request_id,
        "gen_ai.response.finish_reasons": [r.finish_reason],
        "gen_ai.usage.input_tokens": r.prompt_tokens,
        "gen_ai.usage.output_tokens": r.completion_tokens,
        "headrace.tenant": r.tenant,
        "headrace.tier": r.tier,
        "headrace.cached_tokens": r.cached_tokens,
    }
    if r.replica is not None:
        attrs["headrace.replica"] = r.replica
    if r.timer.ttft is not None:
        attrs["headrace.ttft_s"] = round(r.timer.ttft, 6)
    return attrs


def _to_epoch_ns() -> Callable[[float], int]:
    offset = time.time() - time.monotonic()

    def epoch(monotonic: float) -> int:
        return int((monotonic + offset) * 1e9)

    return epoch


def otlp_tracer(endpoint: str) -> RequestTracer:
    """Spans batched to an OTLP/HTTP collector at `endpoint` (`.../v1/traces`). Needs the
    `otlp` extra: `pip install 'headrace[otlp]'`."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise ValueError(
            "--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'headrace[otlp]'"
        ) from e
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return RequestTracer(provider.get_tracer("headrace"), provider)
