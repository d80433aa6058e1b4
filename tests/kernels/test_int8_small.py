"""int8_small.c, the u8 x s8 matmul of decode-sized steps: equal bit for bit to the oneDNN int8
path it stands in for (the same exact int32 sums, the same two roundings to bf16), so a row's
result does not depend on which of the two served its step; near a float64 product of the
quantized operands; and the linear layer hands it the steps between its two thresholds."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import bf16_linear, int8_linear
from headrace.kernels.build import cpu_kernels
from headrace.kernels.int8_linear import Int8Linear, int8_dot_cpu, quantize_rows
from headrace.layers.linear import MergedLinear

lib = cpu_kernels()
pytestmark = pytest.mark.skipif(
    lib is None or not int8_dot_cpu() or not lib.linear_q8_supported(),
    reason="no C compiler, or no AVX-512 VNNI / BF16",
)


def randn(rows: int, cols: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=gen) * scale).bfloat16()


def onednn(lin: Int8Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    small, lin.small = lin.small, None
    try:
        return lin(x, bias, x.shape[0])
    finally:
        lin.small = small


@pytest.mark.parametrize(("out", "inp"), [(128, 64), (1536, 640), (640, 2048)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 31, 48])
def test_equals_the_onednn_int8_path_bit_for_bit(out: int, inp: int, rows: int) -> None:
    lin = Int8Linear(randn(out, inp, seed=out + inp, scale=0.05))
    assert lin.small is not None
    x = randn(rows, inp, seed=rows, scale=3.0)
    x[0, 5] = -80.0  # one heavy channel, as Gemma's hidden states have
    bias = randn(1, out, seed=99).flatten()
    for b in (None, bias):
        got = lin._small(x, b)
        assert got.shape == (rows, out) and got.dtype == torch.bfloat16
        assert torch.equal(got, onednn(lin, x, b))


def test_is_the_product_of_the_quantized_operands() -> None:
    """Against float64 sums of the very integers it multiplies, with oneDNN's two roundings."""
    w = randn(256, 640, seed=1, scale=0.05)
    lin = Int8Linear(w)
    x = randn(9, 640, seed=2, scale=2.0)
    q, s = quantize_rows(x, 9)
    qw, sw = int8_linear.quantize_weight(w)
    sums = (q.double() - 128) @ qw.double().t()  # exact in float64 at these sizes
    want = ((sums.float() * sw).bfloat16().float() * s[:, None]).bfloat16()
    assert torch.equal(lin._small(x, None), want)
    # and near the bf16 product: int8 rounding of both operands, a few percent of the scale
    ref = x.float() @ w.float().t()
    atol = 0.05 * float(ref.abs().max())
    torch.testing.assert_close(lin._small(x, None).float(), ref, rtol=0.05, atol=atol)


def test_strided_rows_and_an_all_zero_row() -> None:
    lin = Int8Linear(randn(64, 128, seed=3, scale=0.05))
    wide = randn(6, 256, seed=4)
    wide[2] = 0.0
    x = wide[:, :128]  # rows at a stride of 256
    got = lin(x, None, 6)
    assert torch.equal(got, onednn(lin, x.contiguous(), None))
    assert (got[2] == 0).all()


def test_the_layer_takes_it_between_its_thresholds() -> None:
    layer = MergedLinear(128, [64, 64]).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(randn(128, 128, seed=5, scale=0.05))
    layer.pack()
    assert layer.quantize() and layer.int8 is not None and layer.int8.small is not None
    lin = layer.int8
    assert lin.min_rows == int8_linear.SMALL_MIN_ROWS
    calls: list[int] = []
    real = Int8Linear._small

    def counted(self: Int8Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(self, x, bias)

    Int8Linear._small = counted  # type: ignore[method-assign]
    try:
        below = randn(lin.min_rows - 1, 128, seed=6)
        assert layer.small is not None
        assert torch.equal(layer(below), bf16_linear.linear(below, layer.small, None))
        for rows in (lin.min_rows, 16, int8_linear.SMALL_MAX_ROWS, int8_linear.SMALL_MAX_ROWS + 1):
            layer(randn(rows, 128, seed=rows))
    finally:
        Int8Linear._small = real  # type: ignore[method-assign]
    assert calls == [lin.min_rows, 16, int8_linear.SMALL_MAX_ROWS]  # past the last: oneDNN


def test_without_the_kernel_int8_starts_where_onednn_pays() -> None:
    lin = Int8Linear(randn(96, 128, seed=7, scale=0.05))  # 96 channels: not whole blocks of 64
    assert lin.small is None and lin.min_rows == int8_linear.ONEDNN_MIN_ROWS
