"""A replica's live load: its latest reported step statistics plus the router's own exact
account of the requests it dispatched that the report cannot include yet.

A replica pushes `StepStats` after every step (and every 0.5 s when idle); a remote one is
polled. Between two reports the router may dispatch a burst of requests; counting them here
spreads the burst instead of sending it all to the replica that looked idlest at the last
report. A dispatched request leaves the account when the replica's reports certainly count it:
at its first output (the report that came with it counts it), or once `SETTLE_REPORTS` new
reports arrived after dispatch — the first may have left before the replica received the
request, the second may come from a step already running when it arrived, the third follows a
step that saw it. Erring this way counts a request twice for a step or two, never not at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from headrace.engine.messages import StepStats
from headrace.engine.sched.lora_stats import add_counts

SETTLE_REPORTS = 3
NOT_REPORTED_FREE_BLOCKS = 1 << 30  # a replica yet to report is empty: it wins a tie


@dataclass
class _Dispatched:
    tokens: int  # the work it brings: prompt + max_tokens
    reports_at_dispatch: int


class LoadTracker:
    def __init__(
        self, baseline: StepStats | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`baseline`: what the engine shows before its first report (not a report itself)."""
        self._clock = clock
        self.reported = baseline if baseline is not None else StepStats()
        self.reports = 0  # new reports seen so far
        self.last_report_at = self._clock()
        self._dispatched: dict[str, _Dispatched] = {}

    def observe(self, stats: StepStats) -> None:
        """Look at the replica's current stats; a new object is a new report."""
        if stats is not self.reported:
            self.reported = stats
            self.reports += 1
            self.last_report_at = self._clock()

    def dispatched(self, request_id: str, tokens: int) -> None:
        self._dispatched[request_id] = _Dispatched(tokens, self.reports)

    def settle(self, request_id: str) -> None:
        """The request produced output (or ended): the replica's reports count it now."""
        self._dispatched.pop(request_id, None)

    @property
    def pending_tokens(self) -> int:
        """Tokens of dispatched requests that the latest report may not count."""
        settled = [
            rid
            for rid, d in self._dispatched.items()
            if self.reports - d.reports_at_dispatch >= SETTLE_REPORTS
        ]
        for rid in settled:
            del self._dispatched[rid]
        return sum(d.tokens for d in self._dispatched.values())

    @property
    def reported_tokens(self) -> int:
        return self.reported.waiting_tokens + self.reported.running_tokens

    @property
    def load_tokens(self) -> int:
        return self.reported_tokens + self.pending_tokens

    @property
    def free_blocks(self) -> int:
        if self.reports == 0:  # (re)started, not reported yet: empty
            return NOT_REPORTED_FREE_BLOCKS
        return max(self.reported.kv_blocks_total - self.reported.kv_blocks_used, 0)

    def silent_for(self) -> float:
        """Seconds since the replica last reported."""
        return self._clock() - self.last_report_at


def sum_stats(stats: Iterable[StepStats]) -> StepStats:
    """One model's stats over its replicas: counts add up, the step time is the longest,
    the waiting work per priority adds up priority by priority. One replica's are its own
    (the same object while it does not report again: the gateway reads them per request)."""
    stats = list(stats)
    if len(stats) == 1:
        return stats[0]
    total: dict[str, Any] = {}
    by_priority: dict[int, tuple[int, int]] = {}
    by_lora: dict[str, tuple[int, int, int]] = {}
    adapters: dict[str, tuple[int, int, int]] = {}
    reported = False
    for s in stats:
        for f in msgspec.structs.fields(StepStats):
            value = getattr(s, f.name)
            if f.name == "waiting_by_priority":
                reported = reported or value is not None
                for prio, count, work in value or ():
                    c, w = by_priority.get(prio, (0, 0))
                    by_priority[prio] = (c + count, w + work)
            elif f.name == "lora_requests":
                add_counts(by_lora, value)
            elif f.name == "lora_adapters":
                add_counts(adapters, value)
            elif f.name == "max_loras":  # the same flag on every replica
                total[f.name] = max(total.get(f.name, 0), value)
            elif f.name == "step_duration":
                total[f.name] = max(total.get(f.name, 0.0), value)
            else:
                total[f.name] = total.get(f.name, 0) + value
    total["lora_requests"] = tuple((name, *by_lora[name]) for name in sorted(by_lora))
    total["lora_adapters"] = tuple((name, *adapters[name]) for name in sorted(adapters))
    if reported:
        total["waiting_by_priority"] = tuple((p, *by_priority[p]) for p in sorted(by_priority))
    return StepStats(**total)
