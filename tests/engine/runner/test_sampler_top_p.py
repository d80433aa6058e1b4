"""top_p without a full sort (engine/runner/top_p.py, the torch path: CUDA's, and without a
compiler) keeps the set a float64 full sort keeps (its mass to the float32 logits' precision),
on rows from peaked to flat, over a vocabulary large enough that the partial paths are taken;
the sampler's draws from a wide set follow its mass both in C (kernels/sample_draw.c, the CPU's
way; tests/kernels/test_sample_draw.py compares each draw) and with torch."""

from __future__ import annotations

import math

import pytest
import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.sampler import Sampler, _draw_torch
from headrace.engine.runner.top_p import TOP_P_FIRST, top_p_mask, top_p_sets
from headrace.engine.runner.top_p_fixed import ROWS_AT_ONCE, top_p_cut
from headrace.request import SamplingParams

VOCAB = 20_000
PARAMS = SamplingParams(temperature=1.0, top_p=0.9)


def _full_sort_keep(x: torch.Tensor, p: float) -> torch.Tensor:
    """[V] bool: the reference set, from a float64 sort of the whole row (mass reaching p to
    1e-6, the rule _top_p documents)."""
    probs = torch.softmax(x.double(), dim=-1)
    vals, order = probs.sort(descending=True)
    drop = (vals.cumsum(-1) - vals) >= p - 1e-6
    drop[0] = False
    return torch.zeros_like(drop).scatter_(0, order, drop).logical_not()


def _rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    scales = [0.05, 0.5, 1.0, 2.0, 4.0, 8.0]  # flat (a set of ~19k) to peaked
    rows = [torch.randn(VOCAB, generator=g) * s for s in scales]
    one = torch.randn(VOCAB, generator=g)
    one[7] = 40.0  # one token holds all but ~1e-13
    rows.append(one)
    rows.append(torch.randn(VOCAB, generator=g).round())  # many exact ties at the edge
    masked = torch.randn(VOCAB, generator=g) * 2
    masked[::3] = float("-inf")  # an earlier min_p / top_k cut
    rows.append(masked)
    return torch.stack(rows)


def _cut(way: str, x: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """x with each row cut to its top_p set: top_p.py's way, or top_p_fixed.py's (CUDA's)."""
    if way == "topk":
        return top_p_mask(x, ps)
    return top_p_cut(x, torch.tensor(ps, dtype=torch.float64))


WAYS = pytest.mark.parametrize("way", ["topk", "fixed"])


@WAYS
@pytest.mark.parametrize("p", [1e-9, 0.01, 0.5, 0.9, 0.95, 0.999])
def test_partial_sort_keeps_the_full_sorts_set(way: str, p: float) -> None:
    x = _rows()
    out = _cut(way, x, [p] * len(x))
    for row in range(len(x)):
        kept = out[row] > float("-inf")
        want = _full_sort_keep(x[row], p)
        probs = torch.softmax(x[row].double(), dim=-1)
        # a prefix of the row by likelihood (ties at the edge may go either way) ...
        assert x[row][kept].min() >= x[row][~kept].max(), (row, p)
        # ... whose mass is the reference's
        assert abs(float(probs[kept].sum() - probs[want].sum())) < 1e-9, (row, p)
        assert float(probs[kept].sum()) >= p - 1e-6
        assert torch.equal(out[row][kept], x[row][kept])  # kept logits untouched


@WAYS
def test_sizes_span_the_partial_and_the_whole_sort(way: str) -> None:
    x = _rows()
    kept = (_cut(way, x, [0.95] * len(x)) > float("-inf")).sum(-1)
    assert int(kept.min()) == 1  # the row with one likely token
    assert int(kept.max()) > TOP_P_FIRST * 8  # scale 0.05: most of the row


@WAYS
def test_rows_without_top_p_are_untouched(way: str) -> None:
    x = _rows()
    out = _cut(way, x, [1.0, 0.9] + [1.0] * (len(x) - 2))
    assert torch.equal(out[0], x[0]) and torch.equal(out[2:], x[2:])
    assert not torch.equal(out[1], x[1])


def test_draws_from_a_wide_set_follow_its_renormalized_mass(draw_way: str) -> None:
    """2,000 tokens at logit 0 (A), 2,000 at -1 (B), the rest at -20: top_p 0.9 keeps all of
    A and enough of B (a set of ~3.3k, past TOP_P_FIRST); a draw is from A with probability
    mass(A) / mass(kept) and never from the tail."""
    x = torch.full((VOCAB,), -20.0)
    x[:2000], x[2000:4000] = 0.0, -1.0
    z = float(torch.exp(x.double()).sum())
    mass_a = 2000 / z
    draws = [
        Sampler(seed=s)(x[None], [ScheduledRequest("r", [1], 0, [0], True, PARAMS, 0)])[0][0]
        for s in range(3000)
    ]
    from_a = sum(t < 2000 for t in draws) / len(draws)
    want = mass_a / 0.9  # kept mass is 0.9 to within one B token's (~1.3e-4)
    assert abs(from_a - want) < 4 * (want * (1 - want) / len(draws)) ** 0.5
    assert max(draws) < 4000
    kept_b = int((top_p_mask(x[None], [0.9])[0, 2000:4000] > float("-inf")).sum())
    assert abs(kept_b - (0.9 - mass_a) * z / math.exp(-1)) <= 1


def test_sets_are_in_vocabulary_order_and_padded_with_their_own_ids() -> None:
    x = _rows()
    sets = top_p_sets(x, [0.9] * len(x))
    assert sets is not None and sets.rows == list(range(len(x)))
    for row in range(len(x)):
        real = sets.logits[row] > float("-inf")
        ids = sets.ids[row][real]
        assert torch.equal(ids, ids.sort().values)
        assert torch.equal(sets.logits[row][real], x[row][ids])
        assert set(sets.ids[row][~real].tolist()) <= set(ids.tolist())
    assert top_p_sets(x, [1.0] * len(x)) is None


def test_fixed_shapes_keep_ties_at_the_edge_by_id_as_many_as_the_mass_needs() -> None:
    """100 tokens at logit 0 and the rest far below: p 0.305 needs 31 of the hundred (30 hold
    0.3 of the mass before the 31st); they are the first 31 by id, as sample_draw.c keeps."""
    x = torch.full((1, VOCAB), -60.0)
    tied = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:100]
    x[0, tied] = 0.0
    kept = (top_p_cut(x, torch.tensor([0.305], dtype=torch.float64)) > float("-inf"))[0]
    assert torch.equal(kept.nonzero().flatten(), tied.sort().values[:31])


def test_fixed_shapes_take_minus_zero_for_the_zero_it_equals() -> None:
    """-0.0 == +0.0: tied logits, kept by id whatever their sign bits."""
    x = torch.tensor([[-0.0, -0.0, 0.0, 0.0, -30.0]])
    out = top_p_cut(x, torch.tensor([0.5], dtype=torch.float64))
    assert (out[0] > float("-inf")).tolist() == [True, True, False, False, False]


def test_fixed_shapes_span_every_float_range() -> None:
    """Logits negative and positive, a largest below zero, one of each sign bit's edge: the
    ordered keys' passes agree with the full sort (the mass kept is the reference's)."""
    g = torch.Generator().manual_seed(5)
    rows = [torch.randn(VOCAB, generator=g) * 3 - 50, torch.randn(VOCAB, generator=g) * 3 + 50]
    mixed = torch.randn(VOCAB, generator=g) * 1e-3
    mixed[:2] = torch.tensor([0.0, -0.0])
    rows.append(mixed)
    x = torch.stack(rows)
    for p in (0.3, 0.9):
        out = top_p_cut(x, torch.tensor([p] * len(x), dtype=torch.float64))
        for row in range(len(x)):
            probs = torch.softmax(x[row].double(), dim=-1)
            want = probs[_full_sort_keep(x[row], p)].sum()
            assert abs(float(probs[out[row] > float("-inf")].sum() - want)) < 1e-9, (row, p)


def test_fixed_shapes_cut_many_rows_as_each_alone() -> None:
    """Past ROWS_AT_ONCE rows the cut goes a block of rows at a time: each row as alone."""
    g = torch.Generator().manual_seed(9)
    n = 2 * ROWS_AT_ONCE + 5
    x = torch.randn(n, 2000, generator=g) * torch.linspace(0.2, 6, n)[:, None]
    ps = torch.rand(n, generator=g, dtype=torch.float64)
    ps[::7] = 1.0
    out = top_p_cut(x, ps)
    for row in range(n):
        assert torch.equal(out[row], top_p_cut(x[row : row + 1], ps[row : row + 1])[0]), row


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fixed_shapes_draw_without_a_read_on_the_host() -> None:
    """The sampler's top_p draw on CUDA queues its work and returns: no op waits for the device
    (torch's sync debug mode raises on one), so a step launched ahead of its tokens overlaps."""
    x = _rows().cuda()
    ps, uniforms = [0.9] * len(x), [0.5] * len(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = _draw_torch(x, ps, uniforms)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    kept = top_p_mask(x, ps) > float("-inf")
    assert bool(kept.gather(1, tokens[:, None]).all())
