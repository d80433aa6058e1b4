"""How much of what it reserves a tenant really uses: (prompt + output) / (prompt + max_tokens).

Queued work is counted at this share of its reservation. It is kept per tenant and learnt only
from requests that finished normally (`stop`, `length`): a client that hangs up after one token,
or requests that failed or timed out, say nothing about how long requests run, and would
otherwise let one tenant shrink everyone's estimates (and so get more of its own work admitted).
A tenant not seen finishing yet is counted at the mean of the tenants' ratios, each tenant
one voice whatever its volume.
"""

from __future__ import annotations

from headrace.gateway.engine_view import ema

NORMAL_FINISHES = frozenset({"stop", "length"})


class OutputRatios:
    def __init__(self) -> None:
        self._by_tenant: dict[str, float] = {}

    def observe(self, tenant: str, reserved: int, used: int, finish_reason: str | None) -> None:
        if finish_reason not in NORMAL_FINISHES or reserved <= 0 or used <= 0:
            return
        sample = min(1.0, used / reserved)
        self._by_tenant[tenant] = ema(self._by_tenant.get(tenant), sample)

    def of(self, tenant: str) -> float:
        ratio = self._by_tenant.get(tenant)
        return self.overall if ratio is None else ratio

    @property
    def overall(self) -> float:
        """For tenants without a history; 1.0 (every request runs to max_tokens) at first."""
        if not self._by_tenant:
            return 1.0
        return sum(self._by_tenant.values()) / len(self._by_tenant)
