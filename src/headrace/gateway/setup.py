"""Building the gateway from settings and connecting it to a running app.

`headrace serve` calls `setup_gateway(GatewayConfig, os.environ)` before it starts (a bad
tenants file or admin key source stops it there, naming the file and field) and
`connect_gateway` once the app exists, so the gateway reads the engines' live step statistics
and its metrics join the app's registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from prometheus_client.registry import Collector

from headrace.config import GatewayConfig
from headrace.engine.frontend.client import EngineClient
from headrace.gateway.access import InternalAccess
from headrace.gateway.admin_key import ENV, AdminKeySource
from headrace.gateway.base import Gateway, OpenGateway, Tenant
from headrace.gateway.gateway import TenantGateway
from headrace.gateway.reload import GatewayReloader
from headrace.gateway.tenants import load_tenants

log = logging.getLogger("headrace.gateway")


class _Metrics(Protocol):
    def add_collector(self, collector: Collector) -> None: ...


def build_gateway(cfg: GatewayConfig, admin_key: AdminKeySource | None = None) -> Gateway:
    """No tenants file, admin key or bounds: the open gateway (no keys, no limits). Otherwise
    the tenant gateway; without a file it runs open (one default tenant) but sheds load.
    `admin_key` is where the admin key comes from (default: `cfg`'s flags). Logs a warning
    when the internal routes are open to anyone, or closed to everyone."""
    gateway: Gateway
    source = admin_key or AdminKeySource.resolve(cfg, {})
    default_tenant = Tenant(queue_timeout_s=cfg.queue_timeout_s)
    plain = GatewayConfig(replica_api=cfg.replica_api, queue_timeout_s=cfg.queue_timeout_s)
    if cfg == plain and source is None:
        access = InternalAccess(replica_api=cfg.replica_api)
        gateway = OpenGateway(default_tenant, access=access)
    else:
        gateway = TenantGateway(
            load_tenants(cfg.tenants) if cfg.tenants else None,
            max_queued_requests=cfg.max_queued_requests,
            max_queued_tokens=cfg.max_queued_tokens,
            admin_keys=[source.read()] if source is not None else [],
            replica_api=cfg.replica_api,
            default_tenant=default_tenant,
            default_queue_timeout_s=cfg.queue_timeout_s,
        )
    if source is not None and source.origin == "--admin-key":
        log.warning(
            "--admin-key is readable by every local user in the process list; prefer "
            "--admin-key-file or %s", ENV,
        )  # fmt: skip
    _warn_about_access(gateway.access)
    return gateway


def setup_gateway(
    cfg: GatewayConfig, environ: Mapping[str, str]
) -> tuple[Gateway, GatewayReloader]:
    """The gateway and what reloads it (SIGHUP, `POST /admin/reload`); the admin key may come
    from `environ` too. Raises ValueError for a bad tenants file or admin key source."""
    source = AdminKeySource.resolve(cfg, environ)
    gateway = build_gateway(cfg, source)
    return gateway, GatewayReloader(gateway, cfg.tenants, source)


def _warn_about_access(access: InternalAccess) -> None:
    if access.replica_api_open:
        log.warning(
            "the replica API (/v1/replica/*) is on and open: anyone who reaches this server can "
            "run requests as any tenant, at any priority; give it --admin-key to restrict it"
        )
    elif access.locked_out:
        log.warning(
            "/v1/replica/*, /v1/stats, /metrics and the details of /health need an admin key, "
            "and none is set: they refuse everyone (set --admin-key-file, %s or admin_key_sha256)",
            ENV,
        )


def connect_gateway(
    gateway: Gateway, engines: Callable[[], Mapping[str, EngineClient]], metrics: _Metrics
) -> None:
    """Hand the gateway the engines' live stats (read at each admission) and register its
    metrics on the app's registry."""
    if isinstance(gateway, TenantGateway):
        gateway.attach_stats(lambda: {name: e.stats() for name, e in list(engines().items())})
        metrics.add_collector(gateway.metrics)
