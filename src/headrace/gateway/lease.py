"""One front end's lease of a tenant's shared limits (`--ray-namespace`, `shared_limits`).

Front ends that share replicas share each tenant's limits too, kept by one Ray actor
(`limits_actor.LimitsPool`). Asking it per request would put a Ray round trip on every
admission, so each front end holds a lease instead: some of the tenant's tokens and
concurrency slots, taken from the shared pool and handed back in one batched call every
`SYNC_S`. Admission reads only the lease (no I/O). A front end that saw the tenant lately
holds up to its share (the limit / the front ends using the tenant, or the largest request it
had to refuse); one that did not gives everything back.

A request bigger than the lease may still be admitted on credit against what the pool had
free at the last sync: the debt is charged at the next one (the shared bucket may go below
zero, which delays later admissions). The tenant's long-run rate is therefore exact; a burst
may exceed the limit by what other front ends borrowed from the same free tokens within one
sync interval, and a request may be refused while another front end holds idle budget until
the next sync moves it (Retry-After says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.gateway.ratelimit import TenantLimiter

SYNC_S = 0.1  # how often leases are settled with the pool (one Ray call for all tenants)
IDLE_S = 60.0  # a tenant not seen for this long: its lease goes back to the pool


@dataclass(frozen=True)
class TenantSync:
    """What a front end tells the pool about one tenant (tokens after the return)."""

    tenant: str
    tokens_per_minute: int | None
    max_concurrent: int | None
    active: bool
    tokens_held: float
    tokens_returned: float
    debt: float  # tokens admitted on credit since the last sync
    slots_held: int  # in use or free, after the return


@dataclass(frozen=True)
class TenantGrant:
    tokens: float
    pool_tokens: float  # free in the pool after the grant (may be borrowed)
    token_share: float
    slots: int
    pool_slots: int
    slot_share: int


class Lease:
    """The `Bucket` of a tenant whose limits are shared, and its concurrency cap."""

    def __init__(self, limiter: TenantLimiter) -> None:
        self.limiter = limiter
        self.limits = (limiter.tokens_per_minute, limiter.max_concurrent)  # what it was made for
        self.capacity = float(limiter.tokens_per_minute or 0)
        self.rate = self.capacity / 60.0
        self.tokens = 0.0  # ours to admit with
        self.pool = 0.0  # free in the pool at the last sync, less what we borrowed since
        self.debt = 0.0
        self.token_share = self.capacity
        self.need = 0.0  # the largest request refused since the last sync
        self.slots = 0
        self.pool_slots = 0
        self.slot_share = limiter.max_concurrent or 0
        self.seen_at = -IDLE_S

    def install(self) -> None:
        if self.limiter.bucket is not None:
            self.limiter.bucket = self
        if self.limiter.max_concurrent is not None:
            self.limiter.concurrency_cap = self.concurrency_cap

    # -- Bucket -----------------------------------------------------------------------------

    def level(self) -> float:
        return max(self.tokens, 0.0) + max(self.pool, 0.0)

    def wait_for(self, n: float) -> float:
        self.seen_at = self.limiter.clock()
        level = self.level()
        if n <= level:
            return 0.0
        self.need = max(self.need, n)
        return max(2 * SYNC_S, (n - level) / self.rate)

    def take(self, n: float) -> None:
        own = min(n, max(self.tokens, 0.0))
        self.tokens -= own
        self.pool -= n - own
        self.debt += n - own

    def give(self, n: float) -> None:
        repaid = min(n, self.debt)
        self.debt -= repaid
        self.tokens += n - repaid

    def reset_in(self) -> float:
        return max(0.0, (self.capacity - self.level()) / self.rate) if self.rate else 0.0

    # -- concurrency ------------------------------------------------------------------------

    def concurrency_cap(self) -> int:
        self.seen_at = self.limiter.clock()
        return self.slots + max(self.pool_slots, 0)  # held, and what was free at the last sync

    # -- settling with the pool -------------------------------------------------------------

    def outgoing(self) -> TenantSync:
        """Give back what we hold beyond our target; report what we hold and owe."""
        limiter = self.limiter
        in_use = len(limiter.in_flight)
        active = in_use > 0 or limiter.clock() - self.seen_at < IDLE_S
        target = min(self.capacity, max(self.token_share, self.need)) if active else 0.0
        returned = max(0.0, self.tokens - target)
        self.tokens -= returned
        if limiter.max_concurrent is not None:
            target_slots = self.slot_share if active else 0
            self.slots = max(in_use, min(max(self.slots, in_use), target_slots))
        debt, self.debt, self.need = self.debt, 0.0, 0.0
        return TenantSync(
            limiter.name, limiter.tokens_per_minute, limiter.max_concurrent, active,
            self.tokens, returned, debt, self.slots,
        )  # fmt: skip

    def apply(self, grant: TenantGrant) -> None:
        self.tokens += grant.tokens
        self.pool = grant.pool_tokens
        self.token_share = grant.token_share
        self.slots += grant.slots
        self.pool_slots = grant.pool_slots
        self.slot_share = grant.slot_share
