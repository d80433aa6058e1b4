"""The head on a GGUF's Q8_0 blocks against a float64 product with the blocks' exact weights
(fp32 sums apart), its reading of the converter's block form, and the model's dispatch to it."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import q8_head

pytestmark = pytest.mark.skipif(
    not q8_head.supported(16, 32), reason="no C compiler or no AVX-512 BF16"
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def q8_blocks(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes over the whole range (-128 included), fp16 scales of both signs."""
    g = gen(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int16).to(torch.int8)
    d = ((torch.rand(n, k // 32, generator=g) - 0.3) * 0.02).to(torch.float16)
    return q, d


def weights(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return q.double() * d.double().repeat_interleave(32, dim=1)


def assert_fp32_sums(y: torch.Tensor, x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> None:
    """y within fp32 summation error of x W^T in float64: each block's 32 exact products, then
    20 scaled block sums (K = 640), each step at most 2^-24 relative to what it adds up."""
    w = weights(q, d)
    exact = x.double() @ w.t()
    slack = x.shape[1] * 2.0**-23 * (x.double().abs() @ w.abs().t()) + 1e-30
    assert ((y.double() - exact).abs() <= slack).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_every_row_count_is_the_blocks_product_in_fp32(rows: int) -> None:
    q, d = q8_blocks(272, 640, seed=rows)
    x = torch.randn(rows, 640, generator=gen(10 + rows)).bfloat16()
    y = q8_head.logits(x, q8_head.pack(q, d))
    assert y.dtype == torch.float32 and y.shape == (rows, 272)
    assert_fp32_sums(y, x, q, d)
    # nearer the blocks' product than the bf16-rounded weights (the bf16 head's) can be
    bf16_head = x.double() @ weights(q, d).bfloat16().double().t()
    exact = x.double() @ weights(q, d).t()
    assert (y.double() - exact).abs().mean() < (bf16_head - exact).abs().mean() / 10


def test_rows_are_their_own_and_strided_rows_read_in_place() -> None:
    q, d = q8_blocks(64, 256, seed=5)
    w = q8_head.pack(q, d)
    wide = torch.randn(4, 300, generator=gen(6)).bfloat16()
    x = wide[:, :256]  # row stride 300
    together = q8_head.logits(x, w)
    for i in range(4):
        assert torch.equal(q8_head.logits(x[i : i + 1], w), together[i : i + 1])
    assert torch.equal(together, q8_head.logits(x.contiguous(), w))


def test_rows_or_widths_the_kernel_does_not_take_are_refused() -> None:
    q, d = q8_blocks(16, 32, seed=7)
    w = q8_head.pack(q, d)
    for x in (torch.zeros(q8_head.MAX_ROWS + 1, 32), torch.zeros(1, 64), torch.zeros(0, 32)):
        with pytest.raises(ValueError, match="q8_head"):
            q8_head.logits(x.bfloat16(), w)
    with pytest.raises(ValueError, match="q8_head"):
        q8_head.logits(torch.zeros(1, 32), w)  # fp32 rows


def test_the_converters_q8_0_form_is_read_and_other_forms_are_not() -> None:
    q, d = q8_blocks(32, 64, seed=8)
    codes = (q.to(torch.int16) + 128).to(torch.uint8)
    scale = d.float()
    form = q8_head.q8_form(codes, scale, -128 * scale)
    assert form is not None
    assert torch.equal(form[0], q) and torch.equal(form[1], d)
    assert q8_head.q8_form(codes, scale, -127 * scale) is None  # another type's offsets
    assert q8_head.q8_form(codes, scale + 1e-7, -128 * (scale + 1e-7)) is None  # not fp16
    assert q8_head.q8_form(codes, scale[:, :1], -128 * scale[:, :1]) is None  # blocks of 64
