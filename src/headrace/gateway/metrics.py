"""Gateway metrics by tenant and tier, as a prometheus-client collector.

The metrics are created unregistered; the app registers this collector on its own registry
(`registry.register(gateway.metrics)`), next to the engine metrics it extends with the
per-tenant and per-tier view. Names follow the app's `headrace:` prefix.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

# Rejection reasons: a bad key, a tenant limit, refused at arrival (queue bound or expected
# wait), and not started within the queue deadline (ended by the engine).
REASONS = ("auth", "rate_limit", "overloaded", "deadline")
UNAUTHENTICATED = "unauthenticated"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.admitted = Counter(
            "headrace:gateway_requests_admitted",
            "Requests admitted by the gateway",
            ["tenant", "tier"],
            registry=None,
        )
        self.rejected = Counter(
            "headrace:gateway_requests_rejected",
            "Requests refused, by reason: auth, rate_limit, overloaded (at arrival), "
            "deadline (not started within the queue deadline)",
            ["tenant", "tier", "reason"],
            registry=None,
        )
        self.tokens = Counter(
            "headrace:gateway_tokens",
            "Tokens served (prompt + completion) to finished requests",
            ["tenant", "tier"],
            registry=None,
        )
        self.in_flight = Gauge(
            "headrace:gateway_requests_in_flight",
            "Admitted requests not yet finished",
            ["tenant", "tier"],
            registry=None,
        )
        self.queued = Gauge(
            "headrace:gateway_requests_queued",
            "Admitted requests whose first output has not arrived",
            ["tier"],
            registry=None,
        )
        self.ttft = Histogram(
            "headrace:gateway_time_to_first_token_seconds",
            "Time to first token by tier",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )
        self.queue_time = Histogram(
            "headrace:gateway_request_queue_time_seconds",
            "Time from arrival to first scheduled step, by tier",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )

    def collect(self) -> Iterator[Metric]:
        for m in (
            self.admitted,
            self.rejected,
            self.tokens,
            self.in_flight,
            self.queued,
            self.ttft,
            self.queue_time,
        ):
            yield from m.collect()

    def reject(self, tenant: str, tier: str, reason: str) -> None:
        self.rejected.labels(tenant, tier, reason).inc()
