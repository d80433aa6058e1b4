"""The bf16 matmul of decode-sized steps against a float64 product of the same bf16 operands
(one bf16 rounding apart, plus fp32 summation), and the linear layer's dispatch by row count."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import bf16_linear
from headrace.kernels.bf16_linear import SMALL_MAX_ROWS, SMALL_MIN_ROWS
from headrace.kernels.build import cpu_kernels
from headrace.layers.linear import MergedLinear

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not bf16_linear.supported(torch.zeros(64, 2, dtype=torch.bfloat16)),
    reason="no C compiler or no AVX-512 BF16",
)


def randn(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen).bfloat16()


def assert_one_rounding(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias=None) -> None:
    """y within one bf16 rounding (2^-8 relative) of the exact product, plus fp32 sums' error
    (K ulps of fp32 on the sum of |products|)."""
    exact = x.double() @ w.double().t()
    if bias is not None:
        exact += bias.double()
    magnitude = x.double().abs() @ w.double().abs().t()
    slack = 2.0**-8 * exact.abs() + x.shape[1] * 2.0**-23 * magnitude + 1e-30
    assert ((y.double() - exact).abs() <= slack).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 33, 64])
def test_every_row_count_is_one_rounding_from_exact(rows: int) -> None:
    x, w = randn(rows, 640, seed=rows), randn(256, 640, seed=100 + rows)
    y = bf16_linear.linear(x, bf16_linear.pack(w), None)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 256)
    assert_one_rounding(y, x, w)
    # the same precision as oneDNN's bf16 product: mostly equal, at most one step apart
    ref = torch.nn.functional.linear(x, w)
    assert (y != ref).float().mean() < 0.05


def test_bias_strided_rows_and_odd_shapes() -> None:
    x = torch.cat([randn(9, 130, seed=1), randn(9, 6, seed=2)], dim=1)[:, :130]  # row stride 136
    w, bias = randn(192, 130, seed=3), randn(1, 192, seed=4)[0]
    y = bf16_linear.linear(x, bf16_linear.pack(w), bias)
    assert_one_rounding(y, x, w, bias)


@pytest.mark.parametrize("rows", [3, 16, 21])
def test_rows_are_shared_where_blocks_are_fewer_than_threads(rows: int) -> None:
    x, w = randn(rows, 256, seed=5), randn(128, 256, seed=6)  # 2 blocks of 64 channels
    before = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        y = bf16_linear.linear(x, bf16_linear.pack(w), None)
    finally:
        torch.set_num_threads(before)
    assert_one_rounding(y, x, w)
    assert torch.equal(y, bf16_linear.linear(x, bf16_linear.pack(w), None))  # same sums


def test_unsupported_shapes_are_refused() -> None:
    assert not bf16_linear.supported(torch.zeros(48, 64, dtype=torch.bfloat16))  # N % 64
    assert not bf16_linear.supported(torch.zeros(64, 63, dtype=torch.bfloat16))  # K odd
    assert not bf16_linear.supported(torch.zeros(64, 64))  # fp32


def test_the_layer_takes_the_kernel_only_for_decode_sized_steps(monkeypatch) -> None:
    layer = MergedLinear(640, [128, 128]).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(randn(256, 640, seed=7))
    layer.pack()
    assert layer.small is not None
    calls: list[int] = []
    real = bf16_linear.linear

    def counted(x, packed, bias):
        calls.append(x.shape[0])
        return real(x, packed, bias)

    monkeypatch.setattr(bf16_linear, "linear", counted)
    for rows in (SMALL_MIN_ROWS, SMALL_MAX_ROWS, SMALL_MAX_ROWS + 1):
        x = randn(rows, 640, seed=rows)
        assert_one_rounding(layer(x), x, layer.weight.detach())
    assert calls == [SMALL_MIN_ROWS, SMALL_MAX_ROWS]  # larger steps keep oneDNN


def test_an_int8_layer_drops_the_onednn_copy_it_no_longer_uses() -> None:
    from headrace.kernels.int8_linear import int8_dot_cpu

    if not int8_dot_cpu():
        pytest.skip("no int8 dot products: the int8 copy is not built")
    layer = MergedLinear(640, [256]).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(randn(256, 640, seed=8))
    layer.pack()
    assert layer.packed is not None and layer.quantize()
    assert layer.packed is None and layer.small is not None
    for rows in (1, 16, 31, 32, 64, 65, 300):  # bf16_linear below 32 rows, int8 from 32
        x = randn(rows, 640, seed=rows)
        y = layer(x)
        assert y.shape == (rows, 256) and torch.isfinite(y.float()).all()
