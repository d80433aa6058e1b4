"""screened_row.c against torch: a top_p row's head is whole buckets of the largest ub / T (no
tail token above a head token), at most `most` of them unless the first bucket alone holds
more; the tail's exp sums and arrays, and the exact logits of chosen rows of a bf16 head."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels.build import cpu_kernels
from headrace.kernels.screened_row import row_head, rows_dot

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="no C compiler: kernels are off")


def _bounds(vocab: int, spread: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ub = torch.randn(vocab, generator=gen) * spread
    return ub, ub - torch.rand(vocab, generator=gen) * 0.5


# (vocab, spread of ub, most): a plain row, a Gemma-sized head, a vocabulary under `most`, and a
# flat row whose first bucket alone holds more than `most`
CASES = [(5000, 3.0, 100), (70000, 1.0, 2048), (300, 4.0, 1000), (4000, 0.03, 50)]


@pytest.mark.parametrize(("vocab", "spread", "most"), CASES)
def test_the_head_is_the_likeliest_buckets_and_the_sums_agree(
    vocab: int, spread: float, most: int
) -> None:
    ub, lb = _bounds(vocab, spread, vocab)
    inv_t = 1.25
    u, w = ub * inv_t, lb * inv_t
    h = row_head(ub, lb, inv_t, most)
    assert torch.equal(ub, u) and torch.equal(lb, w)  # scaled in place
    head = h.head
    on = torch.zeros(vocab, dtype=torch.bool)
    on[head] = True
    assert torch.equal(head, on.nonzero().flatten())  # ascending, no repeats
    top = float(u.max())
    assert h.top == top
    if vocab <= most:
        assert len(head) == vocab and h.tail_top == float("-inf")
    else:
        assert float(u[on].min()) >= float(u[~on].max()) == h.tail_top
        first = ((top - u) * 16 < 1).sum()  # the first bucket, taken whole
        assert len(head) <= max(most, int(first))
        assert len(head) > most - 0.2 * most or len(head) == int(first)
    eu, ew = torch.exp((u - top).double()), torch.exp((w - top).double())  # fp32 differences
    assert h.total == pytest.approx(float(eu.sum()), rel=1e-6)
    assert h.on_head == pytest.approx(float(eu[on].sum()), rel=1e-6)
    assert h.tail_hi == pytest.approx(float(eu[~on].sum()), rel=1e-6, abs=1e-300)
    assert h.tail_lo == pytest.approx(float(ew[~on].sum()), rel=1e-6, abs=1e-300)
    assert (h.tail_eu[on] == 0).all() and (h.tail_ew[on] == 0).all()
    torch.testing.assert_close(h.tail_eu[~on].double(), eu[~on], rtol=5e-7, atol=1e-30)
    torch.testing.assert_close(h.tail_ew[~on].double(), ew[~on], rtol=5e-7, atol=1e-30)


@pytest.mark.parametrize("n", [0, 3, 300])
def test_rows_dot_is_the_fp32_dot_of_the_chosen_rows(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    weight = (torch.randn(4000, 656, generator=gen) * 0.05).bfloat16()[:, :640]  # strided rows
    x = torch.randn(640, generator=gen) * 3
    ids = torch.randint(0, 4000, (n,), generator=gen)
    expected = weight[ids].double() @ x.double()
    torch.testing.assert_close(rows_dot(x, weight, ids).double(), expected, rtol=1e-5, atol=1e-4)
