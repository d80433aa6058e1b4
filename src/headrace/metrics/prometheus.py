"""Prometheus metrics, named after vLLM's (`vllm:` becomes `headrace:`) so dashboards map over.

`Metrics` owns a registry of its own (never the process-global one), so several apps in one
process — tests, a router's front end — do not collide. Request-level histograms and counters
are fed by the API through `observe_request`; the engine gauges are read live from
`EngineClient.stats()` at scrape time by a collector, so they are never stale.

Other subsystems extend it: `metrics.registry` takes their own prometheus-client metrics, and
`add_collector` takes live collectors (the router's replica health, say). TTFT and queue time
carry a `tier` label that the gateway fills in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from headrace.metrics.engine_collector import EngineCollector
from headrace.metrics.timing import RequestTimer
from headrace.metrics.tracing import RequestTracer
from headrace.metrics.window import Finished, RequestWindow

if TYPE_CHECKING:
    from headrace.engine.frontend.client import EngineClient

PREFIX = "headrace:"
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

EngineSource = Callable[[], Mapping[str, "EngineClient"]]


class Metrics:
    """The server's metrics registry and the request-level instruments."""

    def __init__(self, engines: EngineSource | None = None) -> None:
        # Long on purpose: a flat list of metric declarations reads best in one place.
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Time to first token.",
            ["model_name", "tier"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.inter_token = Histogram(
            PREFIX + "inter_token_latency_seconds", "Time between consecutive output tokens.",
            ["model_name"], buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            PREFIX + "request_queue_time_seconds", "Time from arrival to first scheduled step.",
            ["model_name", "tier"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds", "Request latency, arrival to last token.",
            ["model_name"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prefill tokens processed.", ["model_name"], registry=r
        )
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Generated tokens.", ["model_name"], registry=r
        )
        # The engine's own counters (EngineCollector) are per model; these split the
        # first lookup of each started request by tier.
        self.tier_prefix_queries = Counter(
            PREFIX + "tier_prefix_cache_queries", "Prompt tokens of started requests, by tier.",
            ["model_name", "tier"], registry=r,
        )  # fmt: skip
        self.tier_prefix_hits = Counter(
            PREFIX + "tier_prefix_cache_hits",
            "Prompt tokens of started requests found in the prefix cache, by tier.",
            ["model_name", "tier"], registry=r,
        )  # fmt: skip
        self.request_success = Counter(
            PREFIX + "request_success", "Finished requests by finish reason.",
            ["model_name", "finish_reason"], registry=r,
        )  # fmt: skip
        self.send_timeouts = Counter(
            PREFIX + "http_send_timeouts",
            "Connections dropped because the client read none of a response for --send-timeout-s.",
            registry=r,
        )
        self.window = RequestWindow()  # the dashboard's last seconds, per tenant
        self.tracer: RequestTracer | None = None  # --otlp-traces-endpoint
        if engines is not None:
            self.watch_engines(engines)

    def watch_engines(self, engines: EngineSource) -> None:
        """Export the live gauges of the engines that `engines()` returns at each scrape."""
        self.add_collector(EngineCollector(engines))

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def observe_request(
        self,
        model: str,
        tier: str,
        timer: RequestTimer,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        tenant: str = "default",
        weight: float = 1.0,
    ) -> None:
        """Record one finished request (any finish reason, client aborts included)."""
        self.window.add(
            _finished(
                model, tenant, tier, weight, timer, finish_reason, prompt_tokens + completion_tokens
            )
        )
        if timer.ttft is not None:
            self.ttft.labels(model, tier).observe(timer.ttft)
        if timer.queue_time is not None:
            self.queue_time.labels(model, tier).observe(timer.queue_time)
        itl = self.inter_token.labels(model)
        for gap in timer.token_gaps:
            itl.observe(gap)
        self.e2e.labels(model).observe(timer.e2e)
        self.prompt_tokens.labels(model).inc(prompt_tokens)
        self.generation_tokens.labels(model).inc(completion_tokens)
        self.request_success.labels(model, finish_reason).inc()
        if timer.queue_time is not None:  # it was scheduled: the cache was looked up
            self.tier_prefix_queries.labels(model, tier).inc(prompt_tokens)
            self.tier_prefix_hits.labels(model, tier).inc(cached_tokens)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _finished(
    model: str,
    tenant: str,
    tier: str,
    weight: float,
    timer: RequestTimer,
    reason: str,
    tokens: int,
) -> Finished:
    gaps = timer.token_gaps
    tpot = sum(gaps) / len(gaps) if gaps else None
    return Finished(
        timer.end or timer.start, model, tenant, tier, weight, timer.ttft, tpot, tokens, reason
    )
