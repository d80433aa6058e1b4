"""The int8 head's bounds for the exact sampler: every token's full-precision logit x . w_v
(float64) lies in [lb_v, ub_v], on random and heavy-tailed rows at 1-33 rows; the group summary
and the per-group recomputation agree with the per-token bounds bit for bit."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels.int8_envelope import Int8Envelope
from headrace.kernels.int8_head import Int8GreedyHead, supported

pytestmark = pytest.mark.skipif(
    not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
    reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
)


def _rows(rows: int, hidden: int, heavy: bool, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, hidden, generator=gen)
    if heavy:  # Gemma's hidden states: a few channels ~50x the rest
        x[:, [3, 50, hidden - 5]] *= 50
    return x.bfloat16()


@pytest.mark.parametrize("heavy", [False, True])
@pytest.mark.parametrize("hidden", [96, 128])
@pytest.mark.parametrize("rows", [1, 4, 16, 33])
def test_bounds_hold_in_float64(rows: int, hidden: int, heavy: bool) -> None:
    gen = torch.Generator().manual_seed(rows * hidden)
    vocab = 3000 + rows  # not a multiple of 64: a partly padded group
    w = (torch.randn(vocab, hidden, generator=gen) * 0.05).bfloat16()
    w[7] = 0
    env = Int8Envelope(Int8GreedyHead(w))
    x = _rows(rows, hidden, heavy, gen)
    inv_t = torch.rand(rows, generator=gen) + 0.5
    summary, ub, lb = env.envelope(env.padded(x), inv_t, every=True)
    assert ub is not None and lb is not None
    exact = x.double() @ w.double().t()  # [M, V]
    assert (lb.double() <= exact).all() and (exact <= ub.double()).all()
    width = (ub - lb).double()
    # tight enough to sample from: the bound is a small part of the logits' spread
    assert width.mean() < 0.5 * exact.std(dim=1).mean()
    # the group summary is the per-token bounds' (padding groups: -inf, 0)
    g = env.groups
    up = torch.full((rows, g * 16), float("-inf"))
    up[:, :vocab] = ub
    lo = torch.full((rows, g * 16), float("-inf"))
    lo[:, :vocab] = lb
    assert torch.equal(summary.gmax, up.view(rows, g, 16).amax(-1))
    assert torch.equal(summary.glow, lo.view(rows, g, 16).amax(-1))
    weights = ((up.view(rows, g, 16) - summary.gmax[..., None]) * inv_t[:, None, None]).exp()
    expect = weights.nan_to_num(0.0).sum(-1)
    assert torch.allclose(summary.gsum, expect, rtol=1e-5, atol=0)
    # a group computed again equals the scan's numbers
    pairs_rows = torch.arange(rows).repeat_interleave(5)
    pairs_groups = torch.randint(0, g, (5 * rows,), generator=gen)
    pairs_groups[0] = g - 1  # the last group: padding lanes
    ub2, lb2 = env.group_bounds(env.padded(x), pairs_rows, pairs_groups)
    assert torch.equal(ub2, up.view(rows, g, 16)[pairs_rows, pairs_groups])
    assert torch.equal(lb2, lo.view(rows, g, 16)[pairs_rows, pairs_groups])


def test_outlier_channels_tighten_the_bound() -> None:
    """Gemma's heavy channels summed in fp32 apart from the limbs: the same proven bracket,
    narrower where the rows are heavy-tailed (the weights' rounding counts only the rest)."""
    gen = torch.Generator().manual_seed(7)
    hidden, vocab = 128, 2000
    w = (torch.randn(vocab, hidden, generator=gen) * 0.05).bfloat16()
    x = _rows(8, hidden, True, gen)
    exact = x.double() @ w.double().t()
    widths = {}
    for k in (0, 4):
        env = Int8Envelope(Int8GreedyHead(w), outliers=k)
        _, ub, lb = env.envelope(env.padded(x), torch.ones(8), every=True)
        assert ub is not None and lb is not None
        assert (lb.double() <= exact).all() and (exact <= ub.double()).all()
        widths[k] = float((ub - lb).double().mean())
    assert widths[4] < 0.6 * widths[0]
