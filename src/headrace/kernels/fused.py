"""Fused elementwise ops of a bf16 layer on the CPU (the C kernels in cpu_kernels.c).

In a bf16 prefill of Gemma 3 here, torch's separate elementwise ops (the float32 casts of
RMSNorm, its muls, GELU, GELU x up, residual adds) took over a third of the step: each one
reads and writes a whole activation. Each kernel here makes one pass, in fp32, rounding to
bf16 where torch stores a bf16 tensor, so the result matches torch's to bf16 rounding.

Each function returns None where it does not apply (not bf16, not on the CPU, a layout it does
not read, kernels off): the caller then runs the torch ops. fp32 never comes here, so fp32 stays
token-exact with transformers.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels

ACTS = {"gelu_tanh": 0, "silu": 1}


def _usable(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.shape[-1] > 0


def act_mul(gate_up: torch.Tensor, act: str) -> torch.Tensor | None:
    """gate_up [T, 2I] -> [T, I]: act(gate) * up."""
    lib = cpu_kernels()
    if lib is None or act not in ACTS or not _usable(gate_up) or gate_up.dim() != 2:
        return None
    if gate_up.stride(1) != 1:
        return None
    t, two_i = gate_up.shape
    out = torch.empty(t, two_i // 2, dtype=gate_up.dtype)
    lib.act_mul_bf16(gate_up.data_ptr(), t, two_i // 2, gate_up.stride(0), ACTS[act],
                     out.data_ptr())  # fmt: skip
    return out


def rms_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    cast_first: bool,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """x [T, D] or [T, H, D] (heads contiguous) -> same shape, contiguous. scale: fp32 [D] or
    [H, D]. cast_first: Llama's order (bf16 before the weight). residual: + after the norm."""
    lib = cpu_kernels()
    if lib is None or not _usable(x) or x.stride(-1) != 1 or x.dim() not in (2, 3):
        return None
    d = x.shape[-1]
    inner = 1 if x.dim() == 2 else x.shape[1]
    if x.dim() == 3 and x.stride(1) != d:
        return None
    scale = scale.to(torch.float32).contiguous()
    if scale.shape[-1] != d or scale.dim() > 2:
        return None
    scale_rows = 1 if scale.dim() == 1 else scale.shape[0]
    if scale_rows not in (1, inner):
        return None
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            return None
        residual = residual.contiguous()
    rows = x.numel() // d
    out = torch.empty(x.shape, dtype=x.dtype)
    lib.rms_norm_bf16(
        x.data_ptr(), rows, d, inner, x.stride(0), scale.data_ptr(), scale_rows,
        int(cast_first), eps, residual.data_ptr() if residual is not None else None,
        out.data_ptr(),
    )  # fmt: skip
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x [T, H, D] (heads contiguous) rotated by cos / signed sin [T, 1, R], R <= D even:
    `layers.rotary.apply_rotary` in one pass, with the same bf16 roundings."""
    lib = cpu_kernels()
    if lib is None or not _usable(x) or x.dim() != 3 or x.stride(-1) != 1:
        return None
    t, h, d = x.shape
    r = cos.shape[-1]
    if x.stride(1) != d or r > d or r % 2 or cos.shape != (t, 1, r) or sin.shape != cos.shape:
        return None
    if cos.dtype != torch.bfloat16 or sin.dtype != torch.bfloat16:
        return None
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    lib.rope_bf16(x.data_ptr(), t, h, d, x.stride(0), cos.data_ptr(), sin.data_ptr(), r,
                  out.data_ptr())  # fmt: skip
    return out
