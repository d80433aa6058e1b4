"""The C draw (kernels/sample_draw.c) is the inverse CDF of each row's top_p set, in vocabulary
order, from a float64 full sort (ties at the edge by id): the same token for every uniform
number, on rows from one likely token to flat ones, with masked tokens, ties and NaN; a row
draws the same alone or in a batch."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import sample_draw

VOCAB = 20_000
UNIFORMS = [i / 401 for i in range(401)] + [0.0, 1 - 2**-53]
TOL = 1e-5  # of the mass: past the kernel's exp (~2e-7) and the 1e-6 rule

pytestmark = pytest.mark.skipif(
    not sample_draw.supported(torch.zeros(1, 1)), reason="no C compiler: the torch path draws"
)


def _rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(VOCAB, generator=g) * s for s in (0.05, 0.5, 1.0, 3.0, 8.0)]
    one = torch.randn(VOCAB, generator=g)
    one[7] = 40.0  # all the mass but ~1e-13
    masked = torch.randn(VOCAB, generator=g) * 2
    masked[::3] = float("-inf")  # an earlier min_p / top_k cut
    ties = (torch.randn(VOCAB, generator=g) * 2).round()  # thousands tie at the edge
    return torch.stack([*rows, one, masked, ties])


def _reference(x: torch.Tensor, p: float, goal_shift: float = 0.0) -> torch.Tensor:
    """[V] bool: the set, from a float64 sort (likelier first, ties by id): a token is kept
    while the mass before it is below p Z - 1e-6 Z (shifted by goal_shift Z), the first always."""
    w = torch.exp(x.double() - x.max().double())
    z = float(w.sum())
    order = torch.sort(-x.double(), stable=True).indices  # ties: ascending id
    before = w[order].cumsum(0) - w[order]
    kept = before < (p - 1e-6 + goal_shift) * z if p < 1 else torch.ones_like(before, dtype=bool)
    kept[0] = True
    return torch.zeros(len(x), dtype=torch.bool).scatter_(0, order, kept)


def _cdf(x: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The set's cumulative mass in vocabulary order (float64)."""
    return torch.where(kept, torch.exp(x.double() - x.max().double()), 0.0).cumsum(0)


def _inverse_cdf(cdf: torch.Tensor, us: list[float]) -> list[int]:
    """The first token whose cumulative mass passes u times the whole, for each u."""
    target = torch.tensor(us, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(
        cdf, target.clamp(max=float(cdf[-1]) * (1 - 1e-15)), right=True
    ).tolist()


@pytest.mark.parametrize("p", [1e-7, 0.05, 0.5, 0.9, 0.95, 0.999, 1.0])
def test_each_draw_is_the_inverse_cdf_of_the_set(p: float) -> None:
    x = _rows()
    drawn = [sample_draw.draw(x, [1.0] * len(x), [p] * len(x), [u] * len(x)) for u in UNIFORMS]
    assert all(d is not None for d in drawn)
    table = torch.stack([d for d in drawn if d is not None], dim=1)  # [rows, uniforms]
    for row, tokens in zip(x, table.tolist(), strict=True):
        wide, narrow = _reference(row, p, TOL), _reference(row, p, -TOL)
        assert bool(wide[tokens].all()) and bool((row[tokens] > float("-inf")).all()), p
        if not torch.equal(wide, narrow):  # a token within TOL of the edge: either set
            continue
        cdf = _cdf(row, wide)
        low = _inverse_cdf(cdf, [u * (1 - TOL) for u in UNIFORMS])
        high = _inverse_cdf(cdf, [min(u * (1 + TOL), 1 - 2**-53) for u in UNIFORMS])
        for u, token, a, b in zip(UNIFORMS, tokens, low, high, strict=True):
            if a == b:  # u is not within TOL of a token's boundary
                assert token == a, (p, u, token, a)


def test_a_row_draws_the_same_alone_or_in_a_batch() -> None:
    x = _rows()
    ps = [0.9, 1.0, 0.5, 0.95, 0.999, 0.8, 0.7, 0.9]
    us = [0.1, 0.9, 0.5, 0.33, 0.77, 0.01, 0.99, 0.6]
    together = sample_draw.draw(x, [1.0] * len(x), ps, us)
    alone = [
        sample_draw.draw(x[i : i + 1], [1.0], ps[i : i + 1], us[i : i + 1]) for i in range(len(x))
    ]
    assert together is not None and all(a is not None for a in alone)
    assert together.tolist() == [int(a[0]) for a in alone if a is not None]


def test_ties_at_the_top_nan_and_a_row_with_nothing_allowed() -> None:
    x = torch.full((4, 300), float("-inf"))
    x[0, [5, 9, 200]] = 2.0  # three tie for the likeliest: a tiny p keeps the first by id
    x[1, :] = torch.linspace(0, 1, 300)
    x[1, ::2] = float("nan")  # NaN logits are never drawn
    x[2, 17] = 0.0  # one allowed token
    # row 3: none allowed: token 0, as the reference path falls back to
    for u in (0.0, 0.4, 0.999):
        drawn = sample_draw.draw(x, [1.0] * 4, [1e-9, 1.0, 0.9, 0.9], [u] * 4)
        assert drawn is not None
        assert int(drawn[0]) == 5
        assert int(drawn[1]) % 2 == 1
        assert drawn[2:].tolist() == [17, 0]
    everywhere = sample_draw.draw(x[:1], [1.0], [1.0], [0.999])
    assert everywhere is not None and int(everywhere[0]) == 200  # all three ties, by u


@pytest.mark.parametrize("t", [0.3, 0.8, 1.0, 1.7])
def test_bf16_rows_over_a_temperature_draw_as_their_float32_quotient(t: float) -> None:
    """The kernel reads bf16 (or strided fp32) logits and divides by t itself: the same draws
    as from the float32 quotient torch makes (x.float() / t)."""
    wide = torch.cat([_rows() * 3, torch.zeros(8, 5)], dim=1)  # rows VOCAB + 5 apart
    logits = wide.bfloat16()[:, :VOCAB]
    quotient = logits.float() / torch.tensor([t] * len(logits))[:, None]
    ps = [0.9, 1.0, 0.5, 0.95, 0.999, 0.8, 0.7, 0.9]
    for u in UNIFORMS[::7]:
        us = [u] * len(logits)
        from_bf16 = sample_draw.draw(logits, [t] * len(logits), ps, us)
        from_strided = sample_draw.draw(wide[:, :VOCAB], [t] * len(logits), ps, us)
        from_quotient = sample_draw.draw(quotient, [1.0] * len(logits), ps, us)
        assert from_bf16 is not None and from_quotient is not None and from_strided is not None
        assert from_bf16.tolist() == from_quotient.tolist()
        plain = sample_draw.draw(wide[:, :VOCAB].contiguous() / t, [1.0] * len(logits), ps, us)
        assert plain is not None and from_strided.tolist() == plain.tolist()
