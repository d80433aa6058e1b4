"""The matmul on a GGUF's quantized blocks against a float64 product with the blocks' exact
weights (one bf16 rounding apart, plus fp32 sums), and the linear layer's dispatch to it."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import block_linear
from headrace.layers.linear import MergedLinear

pytestmark = pytest.mark.skipif(
    not block_linear.supported(64, 32, 32), reason="no C compiler or no AVX-512 BF16"
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def blocks(n: int, k: int, block: int, top: int, seed: int) -> tuple[torch.Tensor, ...]:
    """codes in 0..top, signed scales of a GGUF's sizes, offsets around -scale * top / 2."""
    g = gen(seed)
    codes = torch.randint(0, top + 1, (n, k), generator=g, dtype=torch.uint8)
    scale = (torch.rand(n, k // block, generator=g) - 0.3) * 0.02
    offset = -scale * (top + 1) / 2 + torch.randn(n, k // block, generator=g) * 1e-3
    return codes, scale, offset


def assert_one_rounding(y: torch.Tensor, x: torch.Tensor, parts: tuple[torch.Tensor, ...]) -> None:
    """y within one bf16 rounding of x W^T with the blocks' weights in float64, plus fp32 sums'
    error on the kernel's own terms (each block's sum of x (128 + code), then its shift)."""
    codes, scale, offset = parts
    block = codes.shape[1] // scale.shape[1]
    w = block_linear.dequantize(codes, scale, offset).double()
    exact = x.double() @ w.t()
    wide = lambda t: t.double().abs().repeat_interleave(block, dim=1)  # noqa: E731
    terms = wide(scale) * (128 + codes.double()) + wide(offset - 128 * scale)
    slack = 2.0**-8 * exact.abs() + x.shape[1] * 2.0**-22 * (x.double().abs() @ terms.t())
    assert ((y.double() - exact).abs() <= slack).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize(("block", "top"), [(32, 15), (32, 31), (16, 63), (32, 127)])
def test_every_row_count_is_one_rounding_from_the_blocks_weights(
    rows: int, block: int, top: int
) -> None:
    parts = blocks(192, 640, block, top, seed=rows + top)
    x = torch.randn(rows, 640, generator=gen(rows)).bfloat16()
    y = block_linear.linear(x, block_linear.pack(*parts), None)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 192)
    assert_one_rounding(y, x, parts)
    # mostly the bf16 rounding of the exact product itself
    exact = (x.double() @ block_linear.dequantize(*parts).double().t()).bfloat16()
    assert (y != exact).float().mean() < 0.02


def test_bias_and_strided_rows() -> None:
    parts = blocks(128, 256, 32, 31, seed=3)
    x = torch.randn(3, 300, generator=gen(4)).bfloat16()[:, :256]  # row stride 300
    bias = torch.randn(128, generator=gen(5)).bfloat16()
    y = block_linear.linear(x, block_linear.pack(*parts), bias)
    want = x.double() @ block_linear.dequantize(*parts).double().t() + bias.double()
    assert torch.allclose(y.double(), want, rtol=2**-7, atol=1e-3)


def test_the_layer_takes_the_blocks_for_steps_of_up_to_max_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codes, scale, offset = blocks(128, 256, 32, 31, seed=6)
    layer = MergedLinear(256, [64, 64])
    layer.weight.data = block_linear.dequantize(codes, scale, offset).bfloat16()
    layer.pack()
    assert layer.use_blocks(codes, scale, offset)
    calls: list[int] = []
    real = block_linear.linear

    def spy(x: torch.Tensor, w: block_linear.BlockWeights, b: torch.Tensor | None) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(block_linear, "linear", spy)
    for rows in (1, 4, 5, 16):
        layer(torch.randn(rows, 256, generator=gen(rows)).bfloat16())
    assert calls == [1, 4]
    # codes past 7 bits, shapes the kernel cannot tile, or a row-invariant layer: no blocks
    assert not layer.use_blocks(codes | 128, scale, offset)
    assert not layer.use_blocks(codes[:, :250], scale[:, :5], offset[:, :5])
    assert not layer.use_blocks(codes, scale, offset[:, :4])  # a malformed blocks file
    layer.make_row_invariant()
    assert layer.blocks is None and not layer.use_blocks(codes, scale, offset)
