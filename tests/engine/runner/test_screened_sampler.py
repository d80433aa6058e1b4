"""The screened sampler draws exactly from softmax(l / T) over the fp32 logits l = x . w: chi-square
against the float64 distribution on 20k draws (peaked and flat rows, temperature alone, with
top_k, with min_p, with top_k and top_p, top_p alone by screened_top_p.py); the rows it does not
take are the reference path's."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch

from headrace.engine.outputs import LogitsInputs, ScheduledRequest
from headrace.engine.runner import screened_sampler, screened_top_p, top_p_membership
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


def _chi_square(counts: Counter[int], p: torch.Tensor, draws: int) -> tuple[float, int]:
    """Pearson's statistic over the tokens expected 5+ times (the rest pooled), and its df."""
    expected = p * draws
    big = (expected >= 5).nonzero().flatten().tolist()
    obs = [counts.get(v, 0) for v in big]
    exp_ = [float(expected[v]) for v in big]
    rest_obs, rest_exp = draws - sum(obs), draws - sum(exp_)
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
        p = _nucleus(exact, t, p, float(params["top_p"]))
    _assert_fits(counts, p)
    assert sampler.stats.violations == 0 and sampler.stats.fallbacks == 0


def _nucleus(exact: torch.Tensor, t: float, p: torch.Tensor, top_p: float) -> torch.Tensor:
    order = p.argsort(descending=True)
    before = p[order].cumsum(0) - p[order]
    drop = torch.zeros_like(p, dtype=torch.bool)
    drop[order] = before >= top_p
    return torch.softmax((exact / t).masked_fill(drop | (p == 0), float("-inf")), dim=0)


def _assert_fits(counts: Counter[int], p: torch.Tensor) -> None:
    stat, df = _chi_square(counts, p, sum(counts.values()))
    # mean df, sd sqrt(2 df): 6 sd and 10 more cannot flake; skipping the acceptance step
    # (proposals from exp(ub / T) taken as they come) gives several times the bound
    assert stat < df + 6 * math.sqrt(2 * df) + 10, (stat, df)


def test_rows_it_takes() -> None:
    takes = [_req(), _req(temperature=0.7, min_p=0.1), _req(top_k=50, top_p=0.9), _req(top_p=0.9)]
    leaves = [
        _req(temperature=0.0),
        _req(seed=5),
        _req(logprobs=0),
        _req(top_p=0.9, min_p=0.1),
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


# (row scale, T, top_p): sets of 781, 139, 13, 12 and 8 of the 1,000 tokens
TOP_P_CASES = [
    (0.2, 1.0, 0.95),
    (0.4, 1.0, 0.95),
    (0.2, 0.7, 0.5),
    (0.4, 1.0, 0.8),
    (0.6, 1.0, 0.95),
]


@pytest.mark.parametrize(("scale", "t", "top_p"), TOP_P_CASES)
def test_top_p_alone_draws_from_the_nucleus_of_exact_logits(
    monkeypatch: pytest.MonkeyPatch, scale: float, t: float, top_p: float
) -> None:
    """screened_top_p.py: a draw from the whole softmax kept only inside the set (drawing
    without the membership check puts tokens outside it, expected 0 times: an infinite
    statistic). A head of 100 of the 1,000 tokens: draws from the tail, edges past the head."""
    monkeypatch.setattr(screened_top_p, "RESCORE_FIRST", 100)
    monkeypatch.setattr(screened_top_p, "ROUTE_MIN_MASS", 0.0)
    stats = _check_top_p(scale, t, top_p)
    assert stats.checks > stats.slow  # the head decided some


@pytest.mark.parametrize("how", ["rescore one at a time", "only the exact rule"])
def test_top_p_decided_by_rescoring(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The rescoring steps (a few tokens, then more, then all) and the all-exact rule."""
    if how == "rescore one at a time":
        monkeypatch.setattr(screened_top_p, "RESCORE_FIRST", 1)
        monkeypatch.setattr(screened_top_p, "ROUTE_MIN_MASS", 0.0)
    else:  # bounds never decide: every check rescores the whole row
        monkeypatch.setattr(screened_top_p, "MARGIN", 10.0)
        monkeypatch.setattr(top_p_membership, "MARGIN", 10.0)
    stats = _check_top_p(0.4, 1.0, 0.95, draws=4000)
    assert stats.slow > 0


def _check_top_p(
    scale: float, t: float, top_p: float, draws: int = DRAWS
) -> screened_top_p.TopPStats:
    w, head = _head()
    x = (torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(11)) * scale).bfloat16()
    x[0, 5] *= 30
    sampler = ScreenedSampler(head, seed=5)
    rows = sampler.env.padded(x).expand(BATCH, -1)
    counts: Counter[int] = Counter()
    for _ in range(draws // BATCH):
        picks = sampler.top_p(rows, [_req(temperature=t, top_p=top_p)] * BATCH)
        assert None not in picks
        counts.update(t for t in picks if t is not None)
    exact = (x.double() @ w.double().t())[0]
    p = _nucleus(exact, t, _target(exact, t), top_p)
    assert int((p > 0).sum()) > 2  # an edge to find
    _assert_fits(counts, p)
    assert sampler.top_p.stats.violations == 0
    return sampler.top_p.stats


def test_a_flat_top_p_row_goes_to_the_full_head_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row whose likeliest tokens hold too little of the mass comes back None, and its
    request skips the envelope for its next REPROBE tokens, then twice as many."""
    monkeypatch.setattr(screened_top_p, "ROUTE_MIN_MASS", 1.01)  # every row is flat
    _, head = _head()
    sampler = ScreenedSampler(head, seed=5)
    x = sampler.env.padded(torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(1)))
    req = _req(temperature=1.0, top_p=0.9)
    assert sampler.top_p(x, [req]) == [None]
    assert sampler.top_p.stats.routed == 1
    calls: list[int] = []
    real = sampler.env.envelope
    monkeypatch.setattr(sampler.env, "envelope", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert sampler.top_p(x, [req]) == [None]  # the same request, too soon: no envelope
    assert not calls and sampler.top_p.stats.routed == 1
    later = ScheduledRequest("r", [1], 0, [0], True, req.params, screened_top_p.REPROBE)
    assert not sampler.takes(req) and sampler.takes(later)
    assert sampler.top_p(x.expand(2, -1), [later, later]) == [None, None]  # one wait set
    assert calls and sampler.top_p.stats.routed == 3
    wait = 2 * screened_top_p.REPROBE
    for at, waits in [
        (screened_top_p.REPROBE + wait - 1, True),
        (screened_top_p.REPROBE + wait, False),
    ]:
        assert (
            sampler.top_p.waits(ScheduledRequest("r", [1], 0, [0], True, req.params, at)) == waits
        )
