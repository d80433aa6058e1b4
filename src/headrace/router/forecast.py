"""Demand forecast: exponential smoothing with a trend (damped if asked) and, once a full day
of history exists, an additive daily seasonal profile (Holt-Winters), updated online in O(1)
per sample.

Why not statsmodels' `ExponentialSmoothing`: it fits its smoothing constants by numerical
optimisation over the whole history at every refit and brings scipy, pandas and patsy (about
150 MB) into the server. A forecaster that must take one sample every few seconds on a busy CPU
wants fixed constants and a constant-time update, which is a few lines; the constants below
are the textbook middle ground (Hyndman & Athanasopoulos, *Forecasting: Principles and
Practice*, ch. 8) and can be given per use.

Samples are rates (tokens/s) at a fixed spacing `step_s`. The daily profile has `slots` slots
(hourly by default, interpolated between their centres): coarse, so that one day's noise and
bursts do not come back as phantom peaks the next day. Before a day is seen the profile is 0
and the model is Holt's linear trend; at the end of the first day each slot starts as the
median of that day's samples in it, less their mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DAY_S = 86_400.0
SLOTS = 24  # of the seasonal profile: hourly, interpolated between


@dataclass(frozen=True)
class Smoothing:
    alpha: float = 0.3  # level
    beta: float = 0.05  # trend
    gamma: float = 0.2  # seasonal profile
    phi: float = 1.0  # trend damping per step (1: none); below 1 a ramp flattens out ahead

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma", "phi"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")


class HoltWinters:
    def __init__(
        self, step_s: float, season_s: float = DAY_S, smoothing: Smoothing | None = None,
        slots: int = SLOTS,
    ) -> None:  # fmt: skip
        if step_s <= 0 or season_s < 2 * step_s:
            raise ValueError("step_s must be positive and a season at least two steps")
        self.step_s = step_s
        self.season_s = season_s
        self.slots = max(2, min(slots, round(season_s / step_s)))
        self.s = smoothing or Smoothing()
        self.level: float | None = None
        self.trend = 0.0
        self.season: list[float] | None = None  # per slot; None until a full season is seen
        self._first: list[list[float]] = [[] for _ in range(self.slots)]  # the first season
        self.n = 0  # samples seen

    @property
    def seasonal(self) -> bool:
        return self.season is not None

    def update(self, value: float) -> None:
        """One more sample (the rate over the last `step_s`)."""
        s, pos = self.s, self._position(self.n)
        if self.level is None:
            self.level = value
        else:
            seasonal = self._seasonal_at(pos)
            damped = self.level + s.phi * self.trend
            level = s.alpha * (value - seasonal) + (1 - s.alpha) * damped
            self.trend = s.beta * (level - self.level) + (1 - s.beta) * s.phi * self.trend
            self.level = level
            if self.season is not None:  # each slot moves by about gamma per season
                slot, rate = int(pos), s.gamma * self.step_s * self.slots / self.season_s
                self.season[slot] += min(rate, 1.0) * (value - level - self.season[slot])
        self.n += 1
        if self.season is None:
            self._first[int(pos)].append(value)
            if self.n * self.step_s >= self.season_s:
                self._start_season()

    def forecast(self, steps: int) -> list[float]:
        """The rates of the next `steps` samples (never negative); [] before any sample."""
        if self.level is None:
            return []
        out, damp = [], 0.0
        for h in range(1, steps + 1):
            damp += self.s.phi**h
            seasonal = self._seasonal_at(self._position(self.n + h - 1))
            out.append(max(self.level + damp * self.trend + seasonal, 0.0))
        return out

    def peak(self, horizon_s: float) -> float | None:
        """The highest rate forecast within `horizon_s` (None before any sample)."""
        values = self.forecast(max(1, math.ceil(horizon_s / self.step_s)))
        return max(values) if values else None

    def _start_season(self) -> None:
        """Each slot starts as the first season's median there (a burst does not make a
        habit) less the mean of those medians."""
        medians = [statistics.median(xs) if xs else 0.0 for xs in self._first]
        mean = sum(medians) / len(medians)
        self.season = [m - mean for m in medians]
        self._first = []

    def _position(self, n: int) -> float:
        """Where sample `n` falls in the season, in slots (0 <= pos < slots)."""
        return (n * self.step_s % self.season_s) / self.season_s * self.slots

    def _seasonal_at(self, pos: float) -> float:
        """The profile between slot centres, linearly (0 before a season is seen)."""
        if self.season is None:
            return 0.0
        x = pos - 0.5
        i = math.floor(x)
        frac = x - i
        a, b = self.season[i % self.slots], self.season[(i + 1) % self.slots]
        return a + (b - a) * frac


def replay(
    rates: Sequence[float], step_s: float, season_s: float = DAY_S,
    smoothing: Smoothing | None = None, slots: int = SLOTS,
) -> HoltWinters:  # fmt: skip
    """A forecaster fed a recorded series of rates."""
    model = HoltWinters(step_s, season_s, smoothing, slots)
    for rate in rates:
        model.update(rate)
    return model
