"""Load shedding: say "overloaded" at arrival, in milliseconds, instead of after a deadline,
and judge each tenant by its own share of the queue, not by everyone's backlog.

The queue really waiting is what the engine reports per priority with each step
(`StepStats.waiting_by_priority`), plus the requests the gateway admitted too recently for the
engine's last report to include ("in transit"); without engine reports, every admitted request
whose first output has not arrived. Requests of lower priorities never count. Each tenant's
part of it is counted by the gateway (`TenantQueue`).

- Queue bounds (`max_queued_requests`, `max_queued_tokens`): while the queue at a request's
  priority and above is under the bound, it is admitted. At the bound, a tenant is refused
  only when its own queue at that priority would pass its share of the bound: what more urgent
  work leaves of it, by weight among the tenants queued at that priority (the newcomer
  counted; a share of requests rounded up). So one tenant's flood never shuts out another of
  the same tier, and the queue passes the bound only by the shares of tenants that came after
  it filled: a tenant over its share gets nothing more until it is back under.
- Expected wait, as the engine's fair queue serves: more urgent work counts in full; at the
  request's own priority, the tenant's own queued work, and from each other tenant at most as
  much, by weight, as the tenant's own work with the new request; plus one average request
  (the new one also needs a running request to finish). Each tenant's work counts at the share
  of its reservations its requests really use (`OutputRatios`). Divided by the engine's
  throughput at capacity (`EngineView`), that is the wait; beyond the request's queue deadline
  it is refused at once with 503 and a Retry-After.

One that slips through and still does not start in time is ended by the engine as `overloaded`.

A refusal's message tells the tenant its own figures only (its queued requests or tokens, its
expected wait): never the queue's length, the bound, its share (which follows from how many
others are queued) or other tiers' backlog.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from headrace.engine.messages import StepStats
from headrace.gateway.base import Tenant
from headrace.gateway.engine_view import EngineView
from headrace.gateway.errors import overloaded
from headrace.gateway.fair_share import Ahead, fair_wait, over_share
from headrace.gateway.output_ratio import OutputRatios
from headrace.gateway.tenant_queue import Backlog, Queued, TenantQueue

Clock = Callable[[], float]
StatsSource = Callable[[], Mapping[str, StepStats]]  # model name -> latest step stats


class LoadShedder:
    def __init__(
        self,
        max_queued_requests: int | None = None,
        max_queued_tokens: int | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.max_queued_requests = max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        self.clock = clock
        self.stats_source: StatsSource | None = None
        self.queue = TenantQueue()  # admitted, first output not yet arrived
        self.ratios = OutputRatios()
        self._engines: dict[str, EngineView] = {}

    # -- the queue as the gateway sees it ------------------------------------------------

    def queued_ahead(self, model: str, priority: int) -> tuple[int, int]:
        """(requests, tokens of work) waiting at `priority` or more urgent for `model`."""
        waiting = self._waiting(model, priority).values()
        return sum(n for n, _ in waiting), sum(t for _, t in waiting)

    def enqueue(self, ticket: int, tenant: Tenant, model: str, tokens: int) -> None:
        q = Queued(model, tenant.priority, tenant.name, tenant.weight, tokens, self.clock())
        self.queue.add(ticket, q)

    def dequeue(self, ticket: int) -> bool:
        """The request started or ended; True if it had not started."""
        return self.queue.remove(ticket)

    def observe_finish(
        self, tenant: str, reserved: int, used: int, finish_reason: str | None
    ) -> None:
        self.ratios.observe(tenant, reserved, used, finish_reason)

    # -- decisions -----------------------------------------------------------------------

    def check(self, tenant: Tenant, model: str) -> None:
        """Cheap, before the prompt is known: refuse when the queue is at its request bound
        and the tenant at its share, or when even a request of no work would miss the
        tenant's queue deadline."""
        a = self._ahead(tenant, model)
        self._check_count(model, a)
        self._check_wait(tenant, model, a, 0)

    def admit(self, tenant: Tenant, model: str, tokens: int) -> None:
        """Raise 503 when the request would pass the tenant's share of a full queue bound, or
        miss the tenant's queue deadline."""
        a = self._ahead(tenant, model)
        self._check_count(model, a)
        self._check_tokens(model, a, tokens)
        self._check_wait(tenant, model, a, tokens)

    def _check_wait(self, tenant: Tenant, model: str, a: Ahead, tokens: int) -> None:
        wait = self._wait(model, a, tokens)
        timeout_s = tenant.queue_timeout_s
        if timeout_s is not None and wait is not None and wait > timeout_s:
            raise overloaded(
                f"server overloaded: expected wait {wait:.1f} s exceeds this tier's queue "
                f"deadline of {timeout_s:g} s; retry later",
                wait - timeout_s,
            )

    def expected_wait(self, tenant: Tenant, model: str, tokens: int = 0) -> float | None:
        """Seconds until a new request of `tenant` would start; None before any throughput
        is measured."""
        return self._wait(model, self._ahead(tenant, model), tokens)

    def throughput(self, model: str) -> float | None:
        """Measured tokens per second of `model`'s engine (all models when not known)."""
        self._sample()
        return sum(v.rate() or 0.0 for v in self._views(model)) or None

    @property
    def output_ratio(self) -> float:
        """The share of reservations used, for a tenant without a history."""
        return self.ratios.overall

    # -- bounds --------------------------------------------------------------------------

    def _check_count(self, model: str, a: Ahead) -> None:
        bound = self.max_queued_requests
        if bound is None or a.n < bound:
            return
        quota = a.request_quota(bound)
        if not over_share(a.own.count, 1, quota):
            return
        if quota <= 0:
            message = "the queue is full with requests of more urgent tiers"
            retry = self._retry_after(model, a, a.tokens / a.n, fair=False)
        else:
            message = (
                f"the queue is full, and this tenant has {a.own.count} requests queued, its "
                "share of it"
            )
            excess = (a.own.count + 1 - quota) * a.own.tokens / a.own.count
            retry = self._retry_after(model, a, excess)
        raise overloaded(f"server overloaded: {message}; retry later", retry)

    def _check_tokens(self, model: str, a: Ahead, tokens: int) -> None:
        bound = self.max_queued_tokens
        if bound is None or a.tokens + tokens <= bound:
            return
        share = a.share(bound, a.urgent_tokens)
        if not over_share(a.own.tokens, tokens, share):
            return
        raise overloaded(
            f"server overloaded: the token queue is full, and this tenant has "
            f"{a.own.tokens} tokens queued; this request's {tokens} more would pass its share; "
            "retry later",
            self._retry_after(model, a, a.own.tokens + tokens - share, fair=share > 0),
        )

    def _retry_after(self, model: str, a: Ahead, tokens: float, fair: bool = True) -> float:
        """Seconds for `tokens` of this tenant's work to be served at its fair part of the
        throughput (all of it when not `fair`); 1 while the throughput is unknown."""
        rate = self.throughput(model)
        if not rate or tokens <= 0:
            return 1.0
        part = a.weight / a.weights if fair else 1.0
        return tokens * self.ratios.of(a.tenant) / (rate * part)

    # -- the expected wait ---------------------------------------------------------------

    def _wait(self, model: str, a: Ahead, tokens: int) -> float | None:
        if a.n == 0 or a.tokens == 0:
            return 0.0  # a slot is free, or a lower tier's request gives way
        rate = self.throughput(model)
        if not rate:
            return None
        levels = {p: self._level_work(model, p, t) for p, (_, t) in a.waiting.items()}
        urgent = sum(w for p, w in levels.items() if p < a.priority)
        slot = sum(levels.values()) / a.n  # one average request
        return (urgent + self._fair_work(a, tokens) + slot) / rate

    def _level_work(self, model: str, priority: int, tokens: int) -> float:
        """`tokens` waiting at `priority`, at the output ratios of the tenants queued there."""
        backlogs = self.queue.backlogs(model, priority)
        reserved = sum(b.tokens for b in backlogs.values())
        if reserved == 0:
            return tokens * self.ratios.overall
        used = sum(b.tokens * self.ratios.of(t) for t, b in backlogs.items())
        return tokens * used / reserved

    def _fair_work(self, a: Ahead, tokens: int) -> float:
        """Work at the tenant's own priority that its new request waits behind."""
        scale, unattributed = a.reconcile()
        ratio = self.ratios.of
        others = [(b.tokens * scale * ratio(t), b.weight) for t, b in a.others.items()]
        others.append((unattributed * self.ratios.overall, a.weight))  # as one more tenant
        own = a.own.tokens * scale * ratio(a.tenant)
        return fair_wait(own, tokens * ratio(a.tenant), a.weight, others)

    # -- gathering -----------------------------------------------------------------------

    def _ahead(self, tenant: Tenant, model: str) -> Ahead:
        backlogs = self.queue.backlogs(model, tenant.priority)
        own = backlogs.get(tenant.name) or Backlog(tenant.weight)
        others = {t: b for t, b in backlogs.items() if t != tenant.name}
        waiting = self._waiting(model, tenant.priority)
        return Ahead(tenant.name, tenant.weight, tenant.priority, waiting, own, others)

    def _waiting(self, model: str, priority: int) -> dict[int, tuple[int, int]]:
        """Priority -> (requests, tokens) really waiting, at `priority` or more urgent."""
        self._sample()
        views = self._views(model)
        totals: dict[int, list[int]] = {}
        cutoff = float("-inf")  # without engine reports: all the gateway has queued
        if views and all(v.stats.waiting_by_priority is not None for v in views):
            cutoff = min(v.in_transit_cutoff() for v in views)
            for v in views:
                for p, count, tokens in v.stats.waiting_by_priority or ():
                    if p <= priority:
                        _add(totals, p, count, tokens)
        for p, (count, tokens) in self.queue.admitted_since(model, priority, cutoff).items():
            _add(totals, p, count, tokens)
        return {p: (n, t) for p, (n, t) in sorted(totals.items())}

    def _views(self, model: str) -> list[EngineView]:
        """The engine serving `model`, or all engines when the name is not one of theirs."""
        view = self._engines.get(model)
        return [view] if view is not None else list(self._engines.values())

    def _sample(self) -> None:
        """Take in the engines' latest reports (each new one once)."""
        if self.stats_source is None:
            return
        now = self.clock()
        for model, st in self.stats_source().items():
            view = self._engines.setdefault(model, EngineView())
            if view.seen and view.stats is st:
                continue  # the same report: no field to compare
            if view.stats != st or not view.seen:
                view.observe(st, now)


def _add(totals: dict[int, list[int]], priority: int, count: int, tokens: int) -> None:
    level = totals.setdefault(priority, [0, 0])
    level[0] += count
    level[1] += tokens
