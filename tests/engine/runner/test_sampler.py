"""Sampler: greedy, temperature, top-k, top-p, seeds independent of the batch, logprobs; every
test on both draws: in C (the CPU's) and with torch (CUDA's, and without a compiler)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.sampler import Sampler, seeded_uniform
from headrace.request import SamplingParams

VOCAB = 50


pytestmark = pytest.mark.usefixtures("draw_way")  # every test on both ways


def _req(rid: str = "r", step: int = 0, **params: float | int | None) -> ScheduledRequest:
    return ScheduledRequest(rid, [1], 0, [0], True, SamplingParams(**params), step)  # type: ignore[arg-type]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _draws(logits: torch.Tensor, n: int, **params: float | int | None) -> Counter[int]:
    sampler = Sampler(seed=0)
    return Counter(sampler(logits[None], [_req(step=i, **params)])[0][0] for i in range(n))


def test_greedy_is_argmax() -> None:
    logits = _logits(4)
    tokens, _ = Sampler()(logits, [_req(str(i), temperature=0.0) for i in range(4)])
    assert tokens == logits.argmax(-1).tolist()


def test_top_k_1_and_tiny_top_p_equal_greedy() -> None:
    logits = _logits(6, seed=1)
    argmax = logits.argmax(-1).tolist()
    for i in range(20):
        assert Sampler()(logits, [_req(str(r), i, top_k=1) for r in range(6)])[0] == argmax
        assert Sampler()(logits, [_req(str(r), i, top_p=1e-6) for r in range(6)])[0] == argmax


def test_seeded_draws_repeat_and_ignore_the_batch() -> None:
    logits = _logits(5, seed=2)
    alone = [Sampler()(logits[:1], [_req("s", step, seed=42)])[0][0] for step in range(30)]
    again = [Sampler()(logits[:1], [_req("s", step, seed=42)])[0][0] for step in range(30)]
    mixed = []
    for step in range(30):
        batch = [_req("g", temperature=0.0), _req("s", step, seed=42), _req("u", step, top_k=3)]
        rows = torch.stack([logits[3], logits[0], logits[4]])
        mixed.append(Sampler()(rows, batch)[0][1])
    assert alone == again == mixed
    other_seed = [Sampler()(logits[:1], [_req("s", step, seed=43)])[0][0] for step in range(30)]
    assert other_seed != alone
    assert len(set(alone)) > 1  # the step changes the draw


def test_draws_follow_the_distribution() -> None:
    logits = torch.full((VOCAB,), -1e9)
    logits[:3] = torch.tensor([0.5, 0.3, 0.2]).log()
    counts = _draws(logits, 3000, seed=7)
    assert set(counts) == {0, 1, 2}
    for token, p in enumerate([0.5, 0.3, 0.2]):
        assert abs(counts[token] / 3000 - p) < 0.04


def test_top_k_and_top_p_cut_the_support() -> None:
    logits = torch.full((VOCAB,), -1e9)
    logits[:3] = torch.tensor([0.5, 0.3, 0.2]).log()
    assert set(_draws(logits, 400, top_k=2, seed=1)) == {0, 1}
    assert set(_draws(logits, 400, top_p=0.7, seed=1)) == {0, 1}  # 0.5 < 0.7 <= 0.8
    assert set(_draws(logits, 400, top_p=0.5, seed=1)) == {0}


def test_low_temperature_sharpens() -> None:
    logits = torch.zeros(VOCAB)
    logits[3] = 1.0
    assert _draws(logits, 200, temperature=0.05, seed=3) == Counter({3: 200})
    assert len(_draws(logits, 200, temperature=5.0, seed=3)) > 10


def test_logprobs() -> None:
    logits = _logits(2, seed=5)
    reqs = [_req("a", temperature=0.0, logprobs=5), _req("b", seed=1, logprobs=0)]
    tokens, lps = Sampler()(logits, reqs)
    ref = torch.log_softmax(logits, -1)
    a, b = lps
    assert a is not None and b is not None
    assert a.token_id == tokens[0] and math.isclose(
        a.logprob, ref[0, tokens[0]].item(), abs_tol=1e-5
    )
    assert [t for t, _ in a.top] == ref[0].topk(5).indices.tolist()
    assert a.top[0][0] == tokens[0]  # greedy chose the likeliest
    assert b.top == [] and math.isclose(b.logprob, ref[1, tokens[1]].item(), abs_tol=1e-5)
    assert math.isclose(ref[0].exp().sum().item(), 1.0, abs_tol=1e-4)
    assert Sampler()(logits, [_req("c"), _req("d")])[1] == [None, None]


def test_logprobs_of_rows_asking_for_different_counts_in_one_step() -> None:
    """One copy for the step's rows: each still gets its own count, values and order."""
    logits = _logits(4, seed=7)
    counts = [2, None, 5, 1]
    reqs = [_req(str(i), seed=i, logprobs=n) for i, n in enumerate(counts)]
    tokens, lps = Sampler()(logits, reqs)
    ref = torch.log_softmax(logits, -1)
    for row, (n, lp) in enumerate(zip(counts, lps, strict=True)):
        if n is None:
            assert lp is None
            continue
        assert lp is not None and lp.token_id == tokens[row]
        assert math.isclose(lp.logprob, ref[row, tokens[row]].item(), abs_tol=1e-5)
        values, ids = ref[row].topk(n)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert all(isinstance(t, int) for t, _ in lp.top)
        for (_, got), want in zip(lp.top, values.tolist(), strict=True):
            assert math.isclose(got, want, abs_tol=1e-5)


def test_seeded_uniform_is_fixed() -> None:
    assert seeded_uniform(1, 2) == seeded_uniform(1, 2)
    assert seeded_uniform(1, 2) != seeded_uniform(1, 3)
    assert all(0 <= seeded_uniform(s, 0) < 1 for s in range(100))


def test_a_tiny_temperature_is_greedy_and_never_divides_by_it() -> None:
    logits = _logits(4, seed=6)
    argmax = logits.argmax(-1).tolist()
    for t in (1e-40, 5e-324, 1e-6, 9.9e-6):
        assert SamplingParams(temperature=t).greedy
        for step in range(5):
            reqs = [_req(str(i), step, temperature=t) for i in range(4)]
            assert Sampler()(logits, reqs)[0] == argmax
    # Just above the threshold the draw is still a valid, near-certain token.
    assert not SamplingParams(temperature=1e-5).greedy
    assert Sampler(seed=0)(logits, [_req("r", 0, temperature=1e-5)])[0] == argmax[:1]
    # Mixed with greedy rows, as a batch is.
    mixed = [_req("a", temperature=1e-40), _req("b", seed=3, temperature=1e-5), _req("c")]
    tokens, _ = Sampler(seed=0)(logits[:3], mixed)
    assert tokens[:2] == argmax[:2] and 0 <= tokens[2] < VOCAB
