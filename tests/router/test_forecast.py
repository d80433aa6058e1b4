"""The online Holt-Winters forecaster: a ramp is extrapolated, a daily profile is learned after
one day and anticipated the next, nothing is forecast below zero."""

from __future__ import annotations

import math

import pytest

from headrace.router.forecast import HoltWinters, Smoothing, replay

STEP_S = 600.0  # 144 samples a day


def diurnal(t: float) -> float:
    """Tokens/s over a day: a trough at 04:00, a peak at 16:00."""
    return 500 + 400 * math.sin(2 * math.pi * (t / 86_400 - 10 / 24))


def test_nothing_before_the_first_sample() -> None:
    model = HoltWinters(STEP_S)
    assert model.forecast(3) == [] and model.peak(3600) is None


def test_a_ramp_is_extrapolated() -> None:
    model = replay([100 + 10 * i for i in range(60)], STEP_S)
    ahead = model.forecast(6)
    assert ahead == sorted(ahead)  # still rising
    assert ahead[-1] == pytest.approx(690 + 60, rel=0.05)


def test_a_daily_profile_is_anticipated_after_one_day() -> None:
    day = int(86_400 / STEP_S)
    rates = [diurnal(i * STEP_S) for i in range(2 * day + day // 6)]  # to 04:00 on day 3
    seasonal = replay(rates, STEP_S)
    flat = replay(rates, STEP_S, season_s=1e12)  # never a full season: Holt only
    assert seasonal.seasonal and not flat.seasonal
    now = len(rates) * STEP_S
    truth = [diurnal(now + h * STEP_S) for h in range(1, 37)]  # the next 6 hours: rising

    def error(model: HoltWinters) -> float:
        return max(abs(f - t) for f, t in zip(model.forecast(36), truth, strict=True))

    assert error(seasonal) < 100 < error(flat)
    assert seasonal.peak(6 * 3600) == pytest.approx(max(truth), rel=0.15)


def test_forecasts_are_never_negative() -> None:
    model = replay([1000 - 100 * i for i in range(11)], STEP_S)
    assert min(model.forecast(50)) == 0.0


def test_smoothing_constants_are_checked() -> None:
    with pytest.raises(ValueError):
        Smoothing(alpha=0)
