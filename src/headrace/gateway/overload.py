"""Load shedding: say "overloaded" at arrival, in milliseconds, instead of after a deadline.

The work queued ahead of a new request is the tokens (still to compute, and to generate up
to max_tokens) of the requests waiting at its priority or a more urgent one. The engine reports
them per priority with each step (`StepStats.waiting_by_priority`); to those the gateway adds
the requests it admitted too recently for the engine's last report to include ("in transit").
Without engine reports it counts every admitted request whose first output has not arrived.

The expected wait is that work, plus one average request's (the new one also needs a running
request to finish), divided by the engine's throughput at capacity: tokens computed per second
of wall time while it had a queue (from its `num_tokens_total`, so step overheads count), or
the per-step rate until that is known. When the wait already exceeds the request's queue
deadline, or the queue ahead is over its bounds, the request is refused at once with 503 and
a Retry-After. One that slips through and still does not start in time is ended by the engine
as `overloaded`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from headrace.engine.outputs import StepStats
from headrace.gateway.errors import overloaded

Clock = Callable[[], float]
StatsSource = Callable[[], Mapping[str, StepStats]]  # model name -> latest step stats

_EMA = 0.2  # weight of a new sample in the throughput and output-ratio averages
_MIN_WINDOW_S = 0.25  # shortest busy interval a throughput sample is taken over


@dataclass(frozen=True)
class _Queued:
    model: str
    priority: int
    tokens: int  # prompt + max_tokens
    admitted_at: float


class _EngineView:
    """One engine as the gateway last saw it, and its measured throughput."""

    def __init__(self) -> None:
        self.stats = StepStats()
        # When the gateway saw the last two changes of the engine's stats: requests admitted
        # before the earlier one had a whole report interval to reach the engine.
        self.seen: deque[float] = deque(maxlen=2)
        self.busy_since: tuple[float, int] | None = None  # (time, num_tokens_total)
        self.wall_rate: float | None = None  # tokens/s over busy wall time
        self.step_rate: float | None = None  # tokens/s of busy steps alone (a fallback)

    def observe(self, st: StepStats, now: float) -> None:
        self.stats = st
        self.seen.append(now)
        if st.num_waiting == 0:  # not at capacity: what it does now says nothing of that
            self.busy_since = None
            return
        if st.step_duration > 0 and st.num_batched_tokens > 0:
            self.step_rate = _ema(self.step_rate, st.num_batched_tokens / st.step_duration)
        if self.busy_since is None:
            self.busy_since = (now, st.num_tokens_total)
            return
        t0, total0 = self.busy_since
        if now - t0 >= _MIN_WINDOW_S and st.num_tokens_total > total0:
            self.wall_rate = _ema(self.wall_rate, (st.num_tokens_total - total0) / (now - t0))
            self.busy_since = (now, st.num_tokens_total)

    def rate(self) -> float | None:
        return self.wall_rate or self.step_rate


def _ema(old: float | None, sample: float) -> float:
    return sample if old is None else old + _EMA * (sample - old)


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
        self._queued: dict[int, _Queued] = {}  # admitted, first output not yet arrived
        self._engines: dict[str, _EngineView] = {}
        self.output_ratio = 1.0  # used / reserved tokens of finished requests, averaged

    # -- the queue as the gateway sees it ------------------------------------------------

    def queued_ahead(self, model: str, priority: int) -> tuple[int, int]:
        """(requests, tokens of work) waiting at `priority` or more urgent for `model`."""
        self._sample()
        engine = self._engine_ahead(model, priority)
        cutoff = float("-inf") if engine is None else self._in_transit_cutoff(model)
        n, tokens = engine or (0, 0)
        # Newest first (dicts keep admission order): stop at the first the engine has seen.
        for q in reversed(self._queued.values()):
            if q.admitted_at < cutoff:
                break
            if q.model == model and q.priority <= priority:
                n += 1
                tokens += q.tokens
        return n, tokens

    def enqueue(self, ticket: int, model: str, priority: int, tokens: int) -> None:
        self._queued[ticket] = _Queued(model, priority, tokens, self.clock())

    def dequeue(self, ticket: int) -> bool:
        """The request started or ended; True if it had not started."""
        return self._queued.pop(ticket, None) is not None

    def observe_finish(self, reserved: int, used: int) -> None:
        if reserved > 0 and used > 0:
            self.output_ratio = _ema(self.output_ratio, min(1.0, used / reserved))

    # -- decisions -----------------------------------------------------------------------

    def check(self, model: str, priority: int) -> None:
        """Cheap: refuse when the queue ahead is already at its request bound."""
        self._check_count(model, priority, *self.queued_ahead(model, priority))

    def admit(self, model: str, priority: int, tokens: int, timeout_s: float | None) -> None:
        """Raise 503 when the request would exceed a queue bound or miss its deadline."""
        n, ahead = self.queued_ahead(model, priority)
        self._check_count(model, priority, n, ahead)
        if self.max_queued_tokens is not None and ahead + tokens > self.max_queued_tokens:
            raise overloaded(
                f"server overloaded: {ahead} tokens are queued ahead, this request adds "
                f"{tokens} (limit {self.max_queued_tokens}); retry later",
                self._work_time(model, ahead + tokens - self.max_queued_tokens) or 1.0,
            )
        wait = self._wait(model, n, ahead)
        if timeout_s is not None and wait is not None and wait > timeout_s:
            raise overloaded(
                f"server overloaded: expected wait {wait:.1f} s ({n} requests queued ahead) "
                f"exceeds this tier's queue deadline of {timeout_s:g} s; retry later",
                wait - timeout_s,
            )

    def expected_wait(self, model: str, priority: int) -> float | None:
        """Seconds until a new request would start; None before any throughput is measured."""
        return self._wait(model, *self.queued_ahead(model, priority))

    def throughput(self, model: str) -> float | None:
        """Measured tokens per second of `model`'s engine (all models when not known)."""
        self._sample()
        return sum(v.rate() or 0.0 for v in self._views(model)) or None

    # -- internals -----------------------------------------------------------------------

    def _views(self, model: str) -> list[_EngineView]:
        """The engine serving `model`, or all engines when the name is not one of theirs."""
        view = self._engines.get(model)
        return [view] if view is not None else list(self._engines.values())

    def _engine_ahead(self, model: str, priority: int) -> tuple[int, int] | None:
        views = self._views(model)
        if not views or any(v.stats.waiting_by_priority is None for v in views):
            return None
        n = work = 0
        for v in views:
            for p, count, tokens in v.stats.waiting_by_priority or ():
                if p <= priority:
                    n += count
                    work += tokens
        return n, work

    def _in_transit_cutoff(self, model: str) -> float:
        cutoffs = [v.seen[0] if len(v.seen) == 2 else float("-inf") for v in self._views(model)]
        return min(cutoffs, default=float("-inf"))

    def _check_count(self, model: str, priority: int, n: int, ahead: int) -> None:
        if self.max_queued_requests is not None and n >= self.max_queued_requests:
            raise overloaded(
                f"server overloaded: {n} requests are queued ahead (limit "
                f"{self.max_queued_requests}); retry later",
                self._work_time(model, ahead // max(1, n)) or 1.0,  # about one request's work
            )

    def _wait(self, model: str, n: int, tokens_ahead: int) -> float | None:
        if n == 0 or tokens_ahead == 0:
            return 0.0  # a slot is free, or a lower tier's request gives way
        return self._work_time(model, tokens_ahead + tokens_ahead // n)

    def _work_time(self, model: str, tokens: int) -> float | None:
        """Seconds for the engine to work off `tokens` (the share of them expected to be
        used); None while its throughput is unknown."""
        rate = self.throughput(model)
        return tokens * self.output_ratio / rate if rate else None

    def _sample(self) -> None:
        """Take in the engines' latest reports (each new one once)."""
        if self.stats_source is None:
            return
        now = self.clock()
        for model, st in self.stats_source().items():
            view = self._engines.setdefault(model, _EngineView())
            if view.stats != st or not view.seen:
                view.observe(st, now)
