"""One engine as the gateway last saw it: its queue per priority and its measured throughput.

Throughput at capacity is tokens computed per second of wall time while the engine had a queue
(from its `num_tokens_total`, so step overheads count), or the per-step rate until that is
known. Steps without a queue say nothing of capacity and are not sampled.
"""

from __future__ import annotations

from collections import deque

from headrace.engine.messages import StepStats

EMA = 0.2  # weight of a new sample in the gateway's running averages
_MIN_WINDOW_S = 0.25  # shortest busy interval a throughput sample is taken over


def ema(old: float | None, sample: float) -> float:
    return sample if old is None else old + EMA * (sample - old)


class EngineView:
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
            self.step_rate = ema(self.step_rate, st.num_batched_tokens / st.step_duration)
        if self.busy_since is None:
            self.busy_since = (now, st.num_tokens_total)
            return
        t0, total0 = self.busy_since
        if now - t0 >= _MIN_WINDOW_S and st.num_tokens_total > total0:
            self.wall_rate = ema(self.wall_rate, (st.num_tokens_total - total0) / (now - t0))
            self.busy_since = (now, st.num_tokens_total)

    def rate(self) -> float | None:
        return self.wall_rate or self.step_rate

    def in_transit_cutoff(self) -> float:
        """Requests admitted at or after this time may not be in the engine's report yet."""
        return self.seen[0] if len(self.seen) == 2 else float("-inf")
