"""What the HTTP layer asks of the gateway: who is calling, may they start, and settle up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from headrace.gateway.access import InternalAccess


@dataclass(frozen=True)
class Tenant:
    name: str = "default"
    tier: str = "free"
    priority: int = 1  # lower is more urgent
    weight: float = 1.0
    queue_timeout_s: float | None = None
    cache_group: str | None = None  # tenants of one group share cached prompt prefixes
    # LoRA adapters it may use, by name; None: every one (the open server's one tenant)
    adapters: frozenset[str] | None = None

    def may_use(self, adapter: str) -> bool:
        return self.adapters is None or adapter in self.adapters

    @property
    def cache_salt(self) -> str:
        """The prefix cache's salt: a tenant shares cached blocks only within its salt, so
        that no tenant can time another's prompts (the open server's one tenant shares all)."""
        if self.cache_group is not None:
            return f"group:{self.cache_group}"
        return f"tenant:{self.name}"


@dataclass(frozen=True)
class Admission:
    """A started request's claim on its tenant's limits; handed back to `release`."""

    tenant: Tenant
    reserved_tokens: int
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-* for the response


class Gateway(Protocol):
    """Call order for one request: `authenticate` -> `check` (before tokenizing) -> `admit`
    (prompt counted) -> `started` (first output arrived) -> `release` (always, once admitted).
    `access` says who may use the internal routes (replica API, stats, metrics, health details).
    """

    access: InternalAccess

    def authenticate(self, headers: Mapping[str, str]) -> Tenant:
        """Raises GatewayError(401) for a missing or wrong key."""
        ...

    def authorize_admin(self, headers: Mapping[str, str]) -> None:
        """For /metrics: `access.authorize(Scope.METRICS, headers)`."""
        ...

    def check(self, tenant: Tenant, model: str = "") -> None:
        """Cheap pre-check before tokenizing: raises GatewayError(429) when the tenant is at
        its concurrency limit or out of tokens, GatewayError(503) when the queue is full."""
        ...

    def admit(
        self, tenant: Tenant, prompt_tokens: int, max_tokens: int, model: str = ""
    ) -> Admission:
        """Raises GatewayError(429 or 503) when the tenant is over a limit or the pool is full."""
        ...

    def started(
        self, admission: Admission, queue_time_s: float | None = None, ttft_s: float | None = None
    ) -> None:
        """The request's first output arrived: it left the queue (for wait estimates, metrics)."""
        ...

    def release(
        self, admission: Admission, used_tokens: int, finish_reason: str | None = None
    ) -> None:
        """The request ended having used `used_tokens` (prompt + completion): refund the rest.
        `finish_reason` ("overloaded" for a queue deadline, ...) feeds the metrics."""
        ...


class OpenGateway:
    """No tenants file: everyone is the default tenant, no limits."""

    def __init__(self, tenant: Tenant | None = None, access: InternalAccess | None = None) -> None:
        self.tenant = tenant or Tenant()
        self.access = access or InternalAccess()

    def authenticate(self, headers: Mapping[str, str]) -> Tenant:
        return self.tenant

    def authorize_admin(self, headers: Mapping[str, str]) -> None:
        from headrace.gateway.access import Scope

        self.access.authorize(Scope.METRICS, headers)

    def check(self, tenant: Tenant, model: str = "") -> None:
        return None

    def admit(
        self, tenant: Tenant, prompt_tokens: int, max_tokens: int, model: str = ""
    ) -> Admission:
        return Admission(tenant=tenant, reserved_tokens=prompt_tokens + max_tokens)

    def started(
        self, admission: Admission, queue_time_s: float | None = None, ttft_s: float | None = None
    ) -> None:
        return None

    def release(
        self, admission: Admission, used_tokens: int, finish_reason: str | None = None
    ) -> None:
        return None
