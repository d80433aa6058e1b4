"""The autoscaling policy: how many replicas a model should have, from forecast demand.

Pure logic with an injected clock; `autoscale_loop.py` feeds it and carries out its answer.

- **Demand** is output tokens/s arriving: every `interval_s`, the tokens the router delivered
  (its counter) plus the growth of the waiting requests' backlog, so that demand beyond
  capacity is seen, not capped at it. A forecaster (`forecast.HoltWinters`) takes each sample.
  The forecast peak is never taken below the last sample (smoothing must not delay the
  answer to a burst), and a backlog adds what drains it within the horizon.
- **Target** = ceil(forecast peak ÷ tokens/s per replica × (1 + headroom)), within MIN..MAX,
  the peak taken over the next `start time + horizon`: a replica asked for now serves only
  after its start time, so scale-up starts that much ahead of the demand.
- **Tokens/s per replica** at the SLO: `headrace plan`'s measurement when given, else learned
  online as the highest per-replica throughput seen in a sample during which requests queued
  (the replicas were at capacity). Until it is known, the count moves only when requests queue.
- **Queueing** for a whole sample raises the target to at least one more replica than serve
  now: a floor under the forecast for a wrong capacity figure or a surprise.
- **Scale-down** to the highest target of the last `cooldown_s`: a replica goes only once
  the forecast stayed low for a whole cool-down (not at a momentary low).
- **Start time** is measured on each start (a moving average); a failed start backs the next
  scale-up off (doubling, up to `MAX_BACKOFF_S`) instead of retrying in a loop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from headrace.config import AutoscaleConfig
from headrace.router.forecast import HoltWinters

MAX_BACKOFF_S = 600.0
START_TIME_WEIGHT = 0.5  # of the newest measured start in the moving average


@dataclass(frozen=True)
class Sample:
    """What the router saw over one interval."""

    tokens_per_s: float  # output tokens delivered
    serving: int  # replicas in rotation
    queued: bool  # requests waited through the whole interval
    backlog_tokens: float = 0.0  # work of the waiting requests (tokens to compute and generate)


class Autoscaler:
    def __init__(
        self,
        config: AutoscaleConfig,
        clock: Callable[[], float],
        forecaster: HoltWinters | None = None,
    ) -> None:
        bounds = config.bounds
        if bounds is None:
            raise ValueError("autoscaling needs --autoscale MIN:MAX")
        self.min_replicas, self.max_replicas = bounds
        self.config = config
        self.clock = clock
        self.forecaster = forecaster or HoltWinters(config.autoscale_interval_s)
        self.replica_tokens_per_s = config.autoscale_replica_tokens_per_s
        self._learn = self.replica_tokens_per_s is None
        self.start_time_s = config.autoscale_start_s
        self.failures = 0  # starts failed in a row
        self._retry_at = -math.inf  # no scale-up before this (after a failed start)
        self._recent: deque[tuple[float, int]] = deque()  # (time, target) over the cool-down
        self._since: float | None = None  # the first decision
        self._queued = False
        self._backlog = 0.0
        self._latest = 0.0  # the last sample's demand: a floor under the (smoothed) forecast

    # -- inputs ------------------------------------------------------------------------------

    def observe(self, sample: Sample) -> None:
        growth = (sample.backlog_tokens - self._backlog) / self.config.autoscale_interval_s
        self._latest = max(sample.tokens_per_s + growth, 0.0)
        self.forecaster.update(self._latest)
        self._backlog = sample.backlog_tokens
        self._queued = sample.queued
        if self._learn and sample.queued and sample.serving > 0:
            per_replica = sample.tokens_per_s / sample.serving
            if per_replica > (self.replica_tokens_per_s or 0.0):
                self.replica_tokens_per_s = per_replica

    def started(self, seconds: float) -> None:
        """A replica started in `seconds`."""
        w = START_TIME_WEIGHT
        self.start_time_s = w * seconds + (1 - w) * self.start_time_s
        self.failures = 0
        self._retry_at = -math.inf

    def start_failed(self) -> None:
        self.failures += 1
        backoff = min(self.config.autoscale_interval_s * 2**self.failures, MAX_BACKOFF_S)
        self._retry_at = self.clock() + backoff

    # -- the answer --------------------------------------------------------------------------

    def needed(self, current: int) -> int:
        """Replicas the forecast asks for (unbounded); `current` while nothing is known."""
        lead = self.start_time_s + self.config.autoscale_horizon_s
        peak = self.forecaster.peak(lead)
        tps = self.replica_tokens_per_s
        need = current
        if peak is not None and tps:
            peak = max(peak, self._latest)
            drain = self._backlog / max(self.config.autoscale_horizon_s, 1.0)
            need = math.ceil((peak + drain) / tps * (1 + self.config.autoscale_headroom) - 1e-9)
        if self._queued:
            need = max(need, current + 1)
        return need

    def target(self, current: int) -> int:
        """The replica count to have now, given `current` (serving or starting)."""
        now = self.clock()
        want = min(max(self.needed(current), self.min_replicas), self.max_replicas)
        if want > current and now < self._retry_at:
            want = current  # a start failed a moment ago: wait out its backoff
        window = self.config.autoscale_cooldown_s
        if self._since is None:
            self._since = now
        self._recent.append((now, want))
        while self._recent[0][0] < now - window:
            self._recent.popleft()
        if want >= current:
            return want
        if now - self._since < window:
            return current  # not a whole cool-down of history yet
        return min(current, max(t for _, t in self._recent))

    def describe(self) -> dict[str, object]:
        """For /v1/stats."""
        f = self.forecaster
        return {
            "min": self.min_replicas, "max": self.max_replicas,
            "replica_tokens_per_s": self.replica_tokens_per_s,
            "start_time_s": round(self.start_time_s, 2),
            "forecast_peak_tokens_per_s": f.peak(
                self.start_time_s + self.config.autoscale_horizon_s
            ),
            "seasonal": f.seasonal, "failed_starts": self.failures,
        }  # fmt: skip
