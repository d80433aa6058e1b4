"""The one-limb screen (outlier channels in fp32) picks exactly the full-precision argmax, hands
back the rows it gives up on, and the head switches to two limbs while rows are flat."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import int8_screen
from headrace.kernels.int8_head import Int8GreedyHead, supported
from headrace.kernels.int8_screen import FLAT_CANDIDATES, MIN_ROWS, PROBE_EVERY, OneLimbScreen

pytestmark = pytest.mark.skipif(
    not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
    reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
)
PLANTED = [3, 50, 70]


def full_precision_argmax(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().t()).argmax(dim=-1)


def heavy_tailed(rows: int, hidden: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Hidden rows like Gemma's: a few channels tens of times larger than the rest."""
    x = torch.randn(rows, hidden, generator=gen) * scale
    x[:, PLANTED] *= 40
    return x.bfloat16()


@pytest.mark.parametrize("hidden", [96, 128])
@pytest.mark.parametrize("rows", [1, 4, 5, 16, 33, 64])
def test_one_limb_is_exact(rows: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(rows + hidden)
    vocab = 7000 + rows  # padding rows exist
    w = (torch.randn(vocab, hidden, generator=gen) * 0.05).bfloat16()
    w[11] = 0
    head = Int8GreedyHead(w)
    screen = OneLimbScreen(head)
    screen.choose_outliers(heavy_tailed(8, hidden, gen).float(), k=8)
    assert screen.outliers is not None and set(PLANTED) <= set(screen.outliers.tolist())
    for trial in range(10):
        x = heavy_tailed(rows, hidden, gen, scale=1 + trial)
        out = screen.argmax(x.float().contiguous())
        ref = full_precision_argmax(x, w)
        kept = out >= 0
        assert torch.equal(out[kept], ref[kept])
        assert torch.equal(head.argmax(x), ref)


def test_no_outliers_and_a_poor_choice_stay_exact() -> None:
    """The channels taken out only change how many candidates are kept, never the pick."""
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(3000, 96, generator=gen) * 0.05).bfloat16()
    head = Int8GreedyHead(w)
    x = heavy_tailed(6, 96, gen)
    for k, source in ((0, x), (4, torch.randn(2, 96, generator=gen))):  # k=4: not the planted
        screen = OneLimbScreen(head)
        screen.choose_outliers(source.float(), k=k)
        out = screen.argmax(x.float().contiguous())
        ref = full_precision_argmax(x, w)
        assert torch.equal(out[out >= 0], ref[out >= 0])


def test_flat_rows_are_handed_back_and_rescreened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Near-duplicate vocabulary rows: more candidates than the limit, so -1, and the head
    screens those rows again with two limbs; duplicates resolve to the lowest id."""
    monkeypatch.setattr(int8_screen, "CANDIDATE_LIMIT", 64)
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(96, generator=gen) * 0.05
    w = (base + torch.randn(5000, 96, generator=gen) * 1e-4).bfloat16()
    w[4000] = w[100]
    head = Int8GreedyHead(w)
    x = heavy_tailed(MIN_ROWS + 3, 96, gen)
    assert head.one_limb is not None or pytest.skip("AMX: the head takes two limbs")
    out = head.one_limb.argmax(x.float().contiguous())
    assert (out < 0).any()
    head.one_limb.mean_candidates = 0.0
    assert torch.equal(head.argmax(x), full_precision_argmax(x, w))


def test_switches_to_two_limbs_while_rows_are_flat() -> None:
    screen = OneLimbScreen(Int8GreedyHead(torch.zeros(640, 64, dtype=torch.bfloat16)))
    assert not screen.wanted(MIN_ROWS - 1)
    assert screen.wanted(MIN_ROWS)
    screen.mean_candidates = FLAT_CANDIDATES * 2
    picks = [screen.wanted(16) for _ in range(2 * PROBE_EVERY)]
    assert sum(picks) == 2  # only the probes
    screen.mean_candidates = FLAT_CANDIDATES / 2
    assert screen.wanted(16)
