"""Gateway metrics by tenant and tier, as a prometheus-client collector.

The metrics are created unregistered; the app registers this collector on its own registry
(`Metrics.add_collector(gateway.metrics)`). TTFT and queue time by tier are not repeated here:
the app's `headrace:time_to_first_token_seconds` and `headrace:request_queue_time_seconds`
carry a `tier` label.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Rejection reasons: a bad key, a tenant limit, refused at arrival (queue bound or expected
# wait), and not started within the queue deadline (ended by the engine).
REASONS = ("auth", "rate_limit", "overloaded", "deadline")
UNAUTHENTICATED = "unauthenticated"


class GatewayMetrics(Collector):
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

    def collect(self) -> Iterator[Metric]:
        for m in (
            self.admitted,
            self.rejected,
            self.tokens,
            self.in_flight,
            self.queued,
        ):
            yield from m.collect()

    def reject(self, tenant: str, tier: str, reason: str) -> None:
        self.rejected.labels(tenant, tier, reason).inc()
