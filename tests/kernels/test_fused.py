"""The fused bf16 elementwise kernels against the torch ops they replace (within one bf16
rounding step), and never for fp32 (which must stay token-exact with transformers)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headrace.kernels import fused
from headrace.kernels.build import cpu_kernels
from headrace.layers.norm import rms_norm as layer_rms_norm
from headrace.layers.rotary import RotaryEmbedding, apply_rotary

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="no C compiler: kernels off")
GEN = torch.Generator().manual_seed(0)


@pytest.fixture(autouse=True)
def _same_data_in_any_order() -> None:
    GEN.manual_seed(0)


def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=GEN) * scale).bfloat16()


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 steps (the bit patterns of same-sign bf16 values are ordered)."""
    ia = a.view(torch.int16).int()
    ib = b.view(torch.int16).int()
    return (ia - ib).abs()


def close_in_bf16(got: torch.Tensor, want: torch.Tensor, share: float, steps: int = 1) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.bfloat16
    off = got != want
    assert off.float().mean().item() <= share
    # where they differ: `steps` rounding steps at most, or both tiny
    big = off & (want.float().abs() > 1e-3)
    assert int(ulps(got[big], want[big]).max().item() if big.any() else 0) <= steps


@pytest.mark.parametrize("width", [2048, 1000, 7])  # 16-lane chunks, a tail, only a tail
def test_gelu_tanh_mul(width: int) -> None:
    gu = randn(33, 2 * width, scale=2.0)
    got = fused.act_mul(gu, "gelu_tanh")
    assert got is not None
    gate, up = gu[:, :width], gu[:, width:]
    want = F.gelu(gate, approximate="tanh") * up
    close_in_bf16(got, want, share=0.03)
    # the kernel's gelu is closer to the exact function than torch's (no 1 + tanh cancellation)
    exact = F.gelu(gate.double(), approximate="tanh").bfloat16()
    ones = torch.cat([gate, torch.ones_like(up)], dim=1)
    ours_alone = fused.act_mul(ones, "gelu_tanh")
    assert ours_alone is not None
    theirs_alone = F.gelu(gate, approximate="tanh")
    assert (ours_alone != exact).sum() <= (theirs_alone != exact).sum()


def test_silu_mul() -> None:
    gu = randn(17, 2 * 512, scale=3.0)
    got = fused.act_mul(gu, "silu")
    assert got is not None
    close_in_bf16(got, F.silu(gu[:, :512]) * gu[:, 512:], share=0.01)


@pytest.mark.parametrize("offset", [True, False], ids=["gemma", "llama"])
def test_rms_norm_rows(offset: bool) -> None:
    x = randn(40, 640, scale=5.0)
    weight = torch.randn(640, generator=GEN) * 0.2
    scale = 1 + weight if offset else weight.bfloat16()
    got = fused.rms_norm(x, scale.float(), 1e-6, cast_first=not offset)
    assert got is not None
    dim = (640,)
    if offset:
        want = F.rms_norm(x.float(), dim, scale, 1e-6).to(torch.bfloat16)
    else:
        want = scale * F.rms_norm(x.float(), dim, None, 1e-6).to(torch.bfloat16)
    # Llama rounds twice (before and after the weight): a one-step difference in the first
    # rounding can become two after the second
    close_in_bf16(got, want, share=0.001, steps=1 if offset else 2)


def test_rms_norm_of_head_views_with_per_head_scales() -> None:
    """q/k norm: a [T, H, D] view into the fused qkv output, one scale row per head."""
    qkv = randn(9, 6 * 64)
    qk = qkv[:, : 5 * 64].view(-1, 5, 64)
    scale = 1 + torch.randn(5, 64, generator=GEN) * 0.1
    got = fused.rms_norm(qk, scale, 1e-6, cast_first=False)
    assert got is not None and got.is_contiguous()
    want = (F.rms_norm(qk.float(), (64,), None, 1e-6) * scale).to(torch.bfloat16)
    close_in_bf16(got, want, share=0.001)


def test_rms_norm_with_residual() -> None:
    x, res = randn(12, 640, scale=4.0), randn(12, 640)
    scale = 1 + torch.randn(640, generator=GEN) * 0.2
    got = fused.rms_norm(x, scale, 1e-6, cast_first=False, residual=res)
    assert got is not None
    normed = F.rms_norm(x.float(), (640,), scale, 1e-6).to(torch.bfloat16)
    want = res + normed
    assert got.dtype == torch.bfloat16 and (got != want).float().mean().item() <= 0.01
    # a one-step difference in the norm is many steps of a sum that cancels: bound it by the
    # operands' size (a step of the norm and the rounding of the sum), not by the sum's
    bound = 2**-6 * (res.float().abs() + normed.float().abs())
    assert bool(((got.float() - want.float()).abs() <= bound).all())


def torch_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """layers.rotary.apply_rotary's torch expression (the kernel replaces it for bf16)."""
    r = cos.shape[-1]
    rot = x[..., :r] * cos + x[..., :r].roll(r // 2, dims=-1) * sin
    return torch.cat((rot, x[..., r:]), dim=-1)


@pytest.mark.parametrize(
    ("heads", "dim", "rot"),
    [(5, 256, 256), (3, 128, 64), (2, 24, 24)],  # Gemma 3; partial rotary; a tail only
)
def test_rope_equals_torch_bit_for_bit(heads: int, dim: int, rot: int) -> None:
    rope = RotaryEmbedding(rot, {"rope_type": "default", "rope_theta": 10000.0}, 4096, 4096)
    positions = torch.randint(0, 4096, (37,), generator=GEN)
    cos, sin = rope.cos_sin(positions, torch.bfloat16)  # [T, 1, rot]
    # q and k heads as a view of a wider fused projection: rows strided, heads contiguous
    wide = randn(37, (heads + 2) * dim, scale=3.0)
    x = wide[:, : heads * dim].view(37, heads, dim)
    got = fused.rope(x, cos, sin)
    assert got is not None and got.is_contiguous()
    # the same roundings as torch's three bf16 ops: equal, not merely close
    assert torch.equal(got, torch_rotary(x, cos, sin))
    assert torch.equal(apply_rotary(x, cos, sin), got)  # the layer takes the kernel


def test_float32_never_fused() -> None:
    x = torch.randn(4, 64)
    assert fused.rms_norm(x, torch.ones(64), 1e-6, cast_first=False) is None
    assert fused.act_mul(torch.randn(4, 128), "gelu_tanh") is None
    assert fused.rope(torch.randn(4, 2, 8), torch.ones(4, 1, 8), torch.ones(4, 1, 8)) is None
    # and the layer path in fp32 is torch's own expression
    want = F.rms_norm(x, (64,), torch.ones(64) * 1.5, 1e-6)
    assert torch.equal(layer_rms_norm(x, torch.ones(64) * 1.5, 1e-6, offset=True), want)
