"""The int8 layer matmul (dynamic per-row u8 activations x per-channel s8 weights through
oneDNN) against a float64 reference of the same quantized operands, and against the bf16
product within the stated int8 error; the linear layer's dispatch by row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headrace.kernels import int8_linear
from headrace.kernels.build import cpu_kernels
from headrace.kernels.int8_linear import Int8Linear, int8_dot_cpu, quantize_rows, quantize_weight
from headrace.layers.linear import MergedLinear, bucket_rows, packed_linear

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not int8_dot_cpu(), reason="no C compiler or no int8 dot products"
)


def randn(rows: int, cols: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=gen) * scale).bfloat16()


@pytest.mark.parametrize(("rows", "cols", "padded"), [(1, 16, 1), (5, 100, 8), (37, 640, 40)])
def test_quantize_rows_matches_torch(rows: int, cols: int, padded: int) -> None:
    x = randn(rows, cols, seed=rows)
    x[0, :3] = torch.tensor([0.0, -7.5, 3.0])  # the row's largest magnitude is negative
    q, s = quantize_rows(x, padded)
    xf = x.float()
    want_s = xf.abs().amax(dim=1) / 127
    torch.testing.assert_close(s[:rows], want_s)
    want_q = torch.round(xf / want_s[:, None]) + 128
    # one step at most where x / s lands within float rounding of a half
    assert (q[:rows].int() - want_q.int()).abs().max() <= 1
    assert (q[:rows].int() != want_q.int()).float().mean() < 1e-3
    assert q[0, 1] == 1 and q.min() >= 1  # -max maps to -127: symmetric, 0 never used
    assert (q[rows:] == 128).all() and (s[rows:] == 0).all()  # padding adds nothing


def test_quantize_zero_row_and_strided_input() -> None:
    x = randn(6, 64, seed=1)
    x[2] = 0
    wide = torch.cat([x, randn(6, 16, seed=2)], dim=1)[:, :64]  # row stride 80
    q, s = quantize_rows(wide, 6)
    q2, s2 = quantize_rows(x.contiguous(), 6)
    assert torch.equal(q, q2) and torch.equal(s, s2)
    assert s[2] == 0 and (q[2] == 128).all()


def dequantized_reference(lin: Int8Linear, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The product of the very operands the kernel multiplies, in float64."""
    q, s = quantize_rows(x, x.shape[0])  # checked against torch's rounding above
    qx, sx = q.double() - 128, s.double()[:, None]
    qw, sw = quantize_weight(weight)
    assert torch.equal(sw, lin.w_scale)
    return (qx * sx) @ (qw.double() * sw.double()[:, None]).t()


@pytest.mark.parametrize("rows", [1, 16, 33, 100, 257])
def test_int8_linear_equals_its_quantized_operands_product(rows: int) -> None:
    weight = randn(96, 128, seed=3, scale=0.05)
    x = randn(rows, 128, seed=rows, scale=2.0)
    lin = Int8Linear.build(weight)
    assert lin is not None
    padded = rows + rows // 8
    got = lin(x, None, padded)
    assert got.shape == (rows, 96) and got.dtype == torch.bfloat16
    want = dequantized_reference(lin, x, weight)
    # exact int32 sums, then bf16 roundings (the matmul's output, the row scale): 2^-7 relative
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=1e-6 * float(want.abs().max()))


def test_int8_error_against_bf16_is_the_stated_bound() -> None:
    weight = randn(256, 640, seed=4, scale=0.05)
    x = randn(64, 640, seed=5)
    lin = Int8Linear.build(weight)
    assert lin is not None
    got = lin(x, None, 64).double()
    exact = x.double() @ weight.double().t()
    # |error| <= (s_x/2) |w_o|_1 + (s_w/2) |x_t|_1 + products of the two halves, per entry
    sx = x.double().abs().amax(dim=1, keepdim=True) / 127
    sw = lin.w_scale.double()[None, :]
    bound = sx / 2 * weight.double().abs().sum(dim=1)[None, :] + sw / 2 * (
        x.double().abs().sum(dim=1, keepdim=True) + 640 * sx / 2
    )
    assert ((got - exact).abs() <= bound + exact.abs() * 2**-7).all()
    assert (got - exact).abs().mean() < 0.05 * bound.mean()  # errors cancel: far below it


def test_bias_is_added() -> None:
    weight = randn(32, 64, seed=6)
    bias = randn(1, 32, seed=7)[0]
    x = randn(20, 64, seed=8)
    lin = Int8Linear.build(weight)
    assert lin is not None
    with_bias = lin(x, bias, 20).float()
    without = lin(x, None, 20).float()
    torch.testing.assert_close(with_bias, without + bias.float(), rtol=2**-7, atol=2**-6)


def test_build_refuses_what_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Int8Linear.build(randn(32, 64, seed=9).float()) is None  # fp32 stays exact
    assert Int8Linear.build(randn(32, 62, seed=9)) is None  # in-features not a multiple of 4
    monkeypatch.setattr(int8_linear, "int8_dot_cpu", lambda: False)
    assert Int8Linear.build(randn(32, 64, seed=9)) is None


def test_linear_layer_dispatches_by_row_count() -> None:
    layer = MergedLinear(128, [64, 32]).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(randn(96, 128, seed=10, scale=0.05))
    layer.pack()
    assert layer.quantize() and layer.int8 is not None
    threshold = layer.int8.min_rows  # 96 channels: oneDNN's int8 only, from 32 rows
    small = randn(threshold - 1, 128, seed=11)
    want = packed_linear(small, layer.packed, None) if layer.packed is not None else None
    got_small = layer(small)
    assert want is None or torch.equal(got_small, want)  # below the threshold: bf16 as before
    big = randn(threshold + 3, 128, seed=12)
    lin = layer.int8
    assert lin is not None
    assert torch.equal(layer(big), lin(big, None, bucket_rows(threshold + 3)))
    ref = F.linear(big.float(), layer.weight.float())
    torch.testing.assert_close(layer(big).float(), ref, rtol=0.05, atol=0.05)


def test_fp32_layers_are_never_quantized() -> None:
    layer = MergedLinear(64, [32])
    assert not layer.quantize() and layer.int8 is None
