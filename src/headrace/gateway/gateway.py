"""The multi-tenant gateway: keys -> tenants, per-tenant limits, load shedding, metrics.

One instance serves the whole front end and runs on its event loop (no locks needed: every
method is synchronous and short). For each request the HTTP layer calls `authenticate`,
`check` (before tokenizing), `admit` (with the prompt's length), `started` (first output) and
`release` (always, once admitted).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from headrace.gateway.access import InternalAccess, Scope
from headrace.gateway.auth import KeyStore, hash_key, key_from_headers
from headrace.gateway.base import Admission, Tenant
from headrace.gateway.errors import GatewayError, unauthenticated
from headrace.gateway.metrics import UNAUTHENTICATED, GatewayMetrics
from headrace.gateway.overload import Clock, LoadShedder, StatsSource
from headrace.gateway.ratelimit import TenantLimiter
from headrace.gateway.tenants import TenantsConfig, load_tenants


@dataclass(frozen=True)
class Ticket(Admission):
    """An Admission with what the gateway needs to settle it."""

    ticket: int = 0
    model: str = ""
    prompt_tokens: int = 0


class TenantGateway:
    def __init__(
        self,
        config: TenantsConfig | None,
        *,
        max_queued_requests: int | None = None,
        max_queued_tokens: int | None = None,
        admin_keys: Iterable[str] = (),
        default_tenant: Tenant | None = None,
        clock: Clock = time.monotonic,
        replica_api: bool = False,
        default_queue_timeout_s: float | None = None,
    ) -> None:
        """`config` None runs open: no keys, everyone is `default_tenant`, but the queue bounds
        and load shedding still apply. `admin_keys` are keys in clear (e.g. `--admin-key`);
        `replica_api` is `--replica-api` (see `InternalAccess`)."""
        self.config = config
        self.clock = clock
        self.default_tenant = default_tenant or Tenant()
        self.default_queue_timeout_s = default_queue_timeout_s
        self.tenants: dict[str, Tenant] = {}
        self.limiters: dict[str, TenantLimiter] = {}
        self.access = InternalAccess(tenants=config is not None, replica_api=replica_api)
        self.reload_listeners: list[Callable[[], None]] = []  # called after each reload
        self._apply(config, admin_keys)
        self.shedder = LoadShedder(max_queued_requests, max_queued_tokens, clock)
        self.metrics = GatewayMetrics()
        self._tickets = itertools.count(1)
        self._open: dict[int, Ticket] = {}  # admitted, not yet released

    def reload(self, config: TenantsConfig | None, admin_keys: Iterable[str] = ()) -> None:
        """Swap in a reloaded tenants file (validated already) and admin keys in clear: keys,
        tiers and limits apply to the next request; requests in flight keep their tenant and
        reservation. A gateway started open stays open (`config` None)."""
        self._apply(config if self.config is not None else None, admin_keys)
        for listener in self.reload_listeners:
            listener()

    def _apply(self, config: TenantsConfig | None, admin_keys: Iterable[str]) -> None:
        self.config = config
        specs = config.tenants if config is not None else ()
        # A tenant whose tenant entry and tier set no queue deadline gets the server's.
        deadline = self.default_queue_timeout_s
        self.tenants = {s.name: _with_deadline(s.tenant(), deadline) for s in specs}
        limiters = {}
        for s in specs:  # a kept tenant keeps its limiter: its bucket and requests in flight
            limiter = self.limiters.get(s.name)
            if limiter is None:
                limiter = TenantLimiter(s.name, s.tokens_per_minute, s.max_concurrent, self.clock)
            limiter.update(s.tokens_per_minute, s.max_concurrent)
            limiters[s.name] = limiter
        self.limiters = limiters
        self.keys = KeyStore((h, s.name) for s in specs for h in s.key_hashes)
        admin = [hash_key(k) for k in admin_keys]
        admin += list(config.admin_key_hashes) if config is not None else []
        self.admin_keys = KeyStore((h, "admin") for h in admin)
        self.access.admin_keys = self.admin_keys

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: object) -> TenantGateway:
        return cls(load_tenants(path), **kwargs)  # type: ignore[arg-type]

    @property
    def is_open(self) -> bool:
        return self.config is None

    def attach_stats(self, source: StatsSource) -> None:
        """Live engine statistics per model (for measured throughput); called at app start."""
        self.shedder.stats_source = source

    # -- who is calling ------------------------------------------------------------------

    def authenticate(self, headers: Mapping[str, str]) -> Tenant:
        if self.is_open:
            return self.default_tenant
        key = key_from_headers(headers)
        owner = self.keys.owner(key)
        if owner is None:
            self.metrics.reject(UNAUTHENTICATED, "", "auth")
            if key is None:
                raise unauthenticated(
                    "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                )
            raise unauthenticated("invalid API key")
        return self.tenants[owner]

    @property
    def protects_metrics(self) -> bool:
        return self.access.guarded

    def authorize_admin(self, headers: Mapping[str, str]) -> None:
        """For /metrics: 401 unless the admin key is given or the server is open."""
        self.access.authorize(Scope.METRICS, headers)

    # -- may it start --------------------------------------------------------------------

    def check(self, tenant: Tenant, model: str = "") -> None:
        try:
            limiter = self.limiters.get(tenant.name)
            if limiter is not None:
                limiter.check()
            self.shedder.check(tenant, model)
        except GatewayError as e:
            self.metrics.reject(tenant.name, tenant.tier, e.reason)
            raise

    def admit(
        self, tenant: Tenant, prompt_tokens: int, max_tokens: int, model: str = ""
    ) -> Admission:
        tokens = prompt_tokens + max_tokens
        ticket = next(self._tickets)
        limiter = self.limiters.get(tenant.name)
        try:
            if limiter is not None:
                limiter.check(tokens)  # a 429 goes before a 503: it is the tenant's own doing
            self.shedder.admit(tenant, model, tokens)
            headers = limiter.reserve(ticket, tokens) if limiter is not None else {}
        except GatewayError as e:
            self.metrics.reject(tenant.name, tenant.tier, e.reason)
            raise
        self.shedder.enqueue(ticket, tenant, model, tokens)
        adm = Ticket(
            tenant, tokens, headers, ticket=ticket, model=model, prompt_tokens=prompt_tokens
        )
        self._open[ticket] = adm
        self.metrics.admitted.labels(tenant.name, tenant.tier).inc()
        self.metrics.in_flight.labels(tenant.name, tenant.tier).inc()
        self.metrics.queued.labels(tenant.tier).inc()
        return adm

    # -- settling up ---------------------------------------------------------------------

    def started(
        self, admission: Admission, queue_time_s: float | None = None, ttft_s: float | None = None
    ) -> None:
        if not isinstance(admission, Ticket) or admission.ticket not in self._open:
            return
        # Timings are recorded by the app's metrics (labelled by tier); here the request
        # leaves the queue that wait estimates and bounds count.
        if self.shedder.dequeue(admission.ticket):
            self.metrics.queued.labels(admission.tenant.tier).dec()

    def release(
        self, admission: Admission, used_tokens: int, finish_reason: str | None = None
    ) -> None:
        if not isinstance(admission, Ticket) or self._open.pop(admission.ticket, None) is None:
            return  # not ours, or released already
        tenant = admission.tenant
        used = max(0, min(used_tokens, admission.reserved_tokens))
        limiter = self.limiters.get(tenant.name)
        if limiter is not None:
            limiter.settle(admission.ticket, admission.reserved_tokens, used)
        if self.shedder.dequeue(admission.ticket):
            self.metrics.queued.labels(tenant.tier).dec()
        else:
            # Only a started request says how much of its reservation requests really use.
            self.shedder.observe_finish(tenant.name, admission.reserved_tokens, used, finish_reason)
        if finish_reason == "overloaded":
            self.metrics.reject(tenant.name, tenant.tier, "deadline")
        self.metrics.tokens.labels(tenant.name, tenant.tier).inc(used)
        self.metrics.in_flight.labels(tenant.name, tenant.tier).dec()

    @property
    def num_open(self) -> int:
        return len(self._open)


def _with_deadline(tenant: Tenant, default_s: float | None) -> Tenant:
    if tenant.queue_timeout_s is not None or default_s is None:
        return tenant
    return dataclasses.replace(tenant, queue_timeout_s=default_s)
