"""The screened sampler draws exactly from softmax(l / T) over the fp32 logits l = x . w: chi-square
against the float64 distribution on 20k draws (peaked and flat rows, temperature alone, with
top_k, with min_p, with top_k and top_p); the rows it does not take are the reference path's."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch

from headrace.engine.outputs import LogitsInputs, ScheduledRequest
from headrace.engine.runner import screened_sampler
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.screened_sampler import ScreenedSampler, screened_row
from headrace.kernels.int8_head import Int8GreedyHead, supported
from headrace.request import SamplingParams

pytestmark = pytest.mark.skipif(
    not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
    reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
)
VOCAB, HIDDEN, DRAWS, BATCH = 1000, 64, 20000, 2000


def _head(seed: int = 0) -> tuple[torch.Tensor, Int8GreedyHead]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05
    w *= torch.rand(VOCAB, 1, generator=gen) * 3 + 0.2  # rows of unlike norms: unlike bounds
    return w.bfloat16(), Int8GreedyHead(w.bfloat16())


def _req(**params: float | int | None) -> ScheduledRequest:
    return ScheduledRequest("r", [1], 0, [0], True, SamplingParams(**params), 0)  # type: ignore[arg-type]


def _target(logits: torch.Tensor, t: float, top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """The reference sampler's distribution, in float64 from the exact logits."""
    x = logits / t
    keep = torch.ones_like(x, dtype=torch.bool)
    if min_p > 0:
        keep &= x >= x.max() + math.log(min_p)
    if top_k:
        keep &= x >= x[keep].topk(min(top_k, int(keep.sum()))).values[-1]
    return torch.softmax(x.masked_fill(~keep, float("-inf")), dim=0)


def _chi_square(counts: Counter[int], p: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens expected 5+ times (the rest pooled), and its df."""
    expected = p * DRAWS
    big = (expected >= 5).nonzero().flatten().tolist()
    obs = [counts.get(v, 0) for v in big]
    exp_ = [float(expected[v]) for v in big]
    rest_obs, rest_exp = DRAWS - sum(obs), DRAWS - sum(exp_)
    if rest_exp >= 5:
        obs.append(rest_obs)
        exp_.append(rest_exp)
    elif rest_obs:  # tokens that should (almost) never come
        return math.inf, len(obs)
    return sum((o - e) ** 2 / e for o, e in zip(obs, exp_, strict=True)), len(obs) - 1


def _draw(sampler: ScreenedSampler, x: torch.Tensor, **params: float | int | None) -> Counter[int]:
    ref = Sampler(seed=1)
    counts: Counter[int] = Counter()
    for _ in range(DRAWS // BATCH):
        reqs = [_req(**params) for _ in range(BATCH)]
        picks = sampler(x.expand(BATCH, -1), reqs, ref)
        assert None not in picks
        counts.update(t for t in picks if t is not None)
    return counts


CASES = [
    ("peaked", 4.0, {"temperature": 1.0}),
    ("flat", 0.4, {"temperature": 1.0}),
    ("peaked", 4.0, {"temperature": 0.5}),
    ("flat", 0.4, {"temperature": 0.7, "min_p": 0.3}),
    ("peaked", 4.0, {"temperature": 1.0, "min_p": 0.05}),
    ("flat", 0.4, {"temperature": 0.8, "top_k": 40}),
    ("peaked", 4.0, {"temperature": 1.2, "top_k": 5, "min_p": 0.02}),
    ("flat", 0.4, {"temperature": 1.0, "top_k": 30, "top_p": 0.5}),
]


@pytest.mark.parametrize(("shape", "scale", "params"), CASES)
def test_draws_follow_softmax_of_exact_logits(
    shape: str, scale: float, params: dict[str, float]
) -> None:
    _check_draws(scale, params)


def test_min_p_by_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    """min_p rows whose allowed tokens spread over many groups take the rejection path."""
    monkeypatch.setattr(screened_sampler, "MAX_GROUPS", 0)
    _check_draws(0.4, {"temperature": 1.0, "min_p": 0.05})
    _check_draws(4.0, {"temperature": 0.6, "min_p": 0.01})


def _check_draws(scale: float, params: dict[str, float]) -> None:
    w, head = _head()
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(1, HIDDEN, generator=gen) * scale).bfloat16()
    x[0, 5] *= 30  # a heavy channel, as Gemma's
    sampler = ScreenedSampler(head, seed=3)
    counts = _draw(sampler, x, **params)
    exact = (x.double() @ w.double().t())[0]
    t = float(params["temperature"])
    p = _target(exact, t, int(params.get("top_k", 0)), float(params.get("min_p", 0.0)))
    if "top_p" in params:  # the reference's top_p on top of top_k, in float64
        order = p.argsort(descending=True)
        before = p[order].cumsum(0) - p[order]
        drop = torch.zeros_like(p, dtype=torch.bool)
        drop[order] = before >= params["top_p"]
        p = torch.softmax((exact / t).masked_fill(drop | (p == 0), float("-inf")), dim=0)
    stat, df = _chi_square(counts, p)
    # mean df, sd sqrt(2 df): 6 sd and 10 more cannot flake; skipping the acceptance step
    # (proposals from exp(ub / T) taken as they come) gives several times the bound
    assert stat < df + 6 * math.sqrt(2 * df) + 10, (stat, df)
    assert sampler.stats.violations == 0 and sampler.stats.fallbacks == 0


def test_rows_it_takes() -> None:
    takes = [_req(), _req(temperature=0.7, min_p=0.1), _req(top_k=50, top_p=0.9)]
    leaves = [
        _req(temperature=0.0),
        _req(seed=5),
        _req(logprobs=0),
        _req(top_p=0.9),
        _req(grammar="start: /a+/"),
        _req(temperature=0.05),
        _req(top_k=5000),
    ]
    assert all(screened_row(r, 262144) for r in takes)
    assert not any(screened_row(r, 262144) for r in leaves)
    penalised = LogitsInputs([3], [], ())
    processed = ScheduledRequest("p", [1], 0, [0], True, SamplingParams(), 0, penalised)
    assert not screened_row(processed, 262144)


def test_a_row_whose_bound_breaks_goes_back_to_the_full_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every upper bound lowered under the exact logits, an acceptance capped at 1 would
    draw from exp(ub / T), not the softmax: such rows come back None (the full head's)."""
    _, head = _head()
    sampler = ScreenedSampler(head, seed=3)
    bounds = sampler.env.group_bounds

    def too_low(x: torch.Tensor, rows: torch.Tensor, groups: torch.Tensor) -> Any:
        ub, lb = bounds(x, rows, groups)
        return lb - 1.0, lb - 2.0

    monkeypatch.setattr(sampler.env, "group_bounds", too_low)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(2)).bfloat16()
    picks = sampler(x, [_req(temperature=1.0) for _ in range(3)], Sampler(seed=1))
    assert picks == [None, None, None]
    assert sampler.stats.violations == 3 and sampler.stats.fallbacks == 3
