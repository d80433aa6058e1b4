"""Building the gateway from settings and connecting it to a running app.

`headrace serve` calls `build_gateway(GatewayConfig)` before it starts (a bad tenants file
stops it there, naming the file and field) and `connect_gateway` once the app exists, so the
gateway reads the engines' live step statistics and its metrics join the app's registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from prometheus_client.registry import Collector

from headrace.config import GatewayConfig
from headrace.engine.client import EngineClient
from headrace.gateway.base import Gateway, OpenGateway
from headrace.gateway.gateway import TenantGateway
from headrace.gateway.tenants import load_tenants


class _Metrics(Protocol):
    def add_collector(self, collector: Collector) -> None: ...


def build_gateway(cfg: GatewayConfig) -> Gateway:
    """No tenants file and no bounds: the open gateway (no keys, no limits). Otherwise the
    tenant gateway; without a file it runs open (one default tenant) but sheds load."""
    if cfg == GatewayConfig():
        return OpenGateway()
    tenants = load_tenants(cfg.tenants) if cfg.tenants else None
    return TenantGateway(
        tenants,
        max_queued_requests=cfg.max_queued_requests,
        max_queued_tokens=cfg.max_queued_tokens,
        admin_keys=[cfg.admin_key] if cfg.admin_key else [],
    )


def connect_gateway(
    gateway: Gateway, engines: Callable[[], Mapping[str, EngineClient]], metrics: _Metrics
) -> None:
    """Hand the gateway the engines' live stats (read at each admission) and register its
    metrics on the app's registry."""
    if isinstance(gateway, TenantGateway):
        gateway.attach_stats(lambda: {name: e.stats() for name, e in list(engines().items())})
        metrics.add_collector(gateway.metrics)
