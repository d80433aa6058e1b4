"""Demand forecast: exponential smoothing with a trend (damped if asked) and, once a full day
of history exists, an additive daily seasonal profile (Holt-Winters), updated online in O(1)
per sample.

Why not statsmodels' `ExponentialSmoothing`: it fits its smoothing constants by numerical
optimisation over the whole history at every refit and brings scipy, pandas and patsy (about
150 MB) into the server. A forecaster that must take one sample every few seconds on a busy CPU
wants fixed constants and a constant-time update, which is a few lines; the constants below
are the textbook middle ground (Hyndman & Athanasopoulos, *Forecasting: Principles and
Practice*, ch. 8) and can be given per use.

Samples are rates (tokens/s) at a fixed spacing `step_s`; `season_len` samples make a day.
Before a day is seen the seasonal terms are 0 and the model is Holt's linear trend; at the end
of the first day each slot's seasonal term starts as that day's deviation from its mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DAY_S = 86_400.0


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
    def __init__(self, step_s: float, season_s: float = DAY_S, smoothing: Smoothing | None = None):
        if step_s <= 0:
            raise ValueError("step_s must be positive")
        self.step_s = step_s
        self.season_len = max(2, round(season_s / step_s))
        self.s = smoothing or Smoothing()
        self.level: float | None = None
        self.trend = 0.0
        self.season: list[float] | None = None  # None until a full season is seen
        self._first: list[float] = []  # the first season's samples
        self.n = 0  # samples seen

    @property
    def seasonal(self) -> bool:
        return self.season is not None

    def update(self, value: float) -> None:
        """One more sample (the rate over the last `step_s`)."""
        s, slot = self.s, self.n % self.season_len
        if self.level is None:
            self.level = value
        else:
            seasonal = self.season[slot] if self.season is not None else 0.0
            damped = self.level + s.phi * self.trend
            level = s.alpha * (value - seasonal) + (1 - s.alpha) * damped
            self.trend = s.beta * (level - self.level) + (1 - s.beta) * s.phi * self.trend
            self.level = level
            if self.season is not None:
                self.season[slot] = s.gamma * (value - level) + (1 - s.gamma) * seasonal
        self.n += 1
        if self.season is None:
            self._first.append(value)
            if len(self._first) == self.season_len:
                mean = sum(self._first) / len(self._first)
                self.season = [x - mean for x in self._first]
                self._first = []

    def forecast(self, steps: int) -> list[float]:
        """The rates of the next `steps` samples (never negative); [] before any sample."""
        if self.level is None:
            return []
        out, damp = [], 0.0
        for h in range(1, steps + 1):
            damp += self.s.phi**h
            seasonal = self.season[(self.n + h - 1) % self.season_len] if self.season else 0.0
            out.append(max(self.level + damp * self.trend + seasonal, 0.0))
        return out

    def peak(self, horizon_s: float) -> float | None:
        """The highest rate forecast within `horizon_s` (None before any sample)."""
        values = self.forecast(max(1, math.ceil(horizon_s / self.step_s)))
        return max(values) if values else None


def replay(
    rates: Sequence[float], step_s: float, season_s: float = DAY_S,
    smoothing: Smoothing | None = None,
) -> HoltWinters:  # fmt: skip
    """A forecaster fed a recorded series of rates."""
    model = HoltWinters(step_s, season_s, smoothing)
    for rate in rates:
        model.update(rate)
    return model
