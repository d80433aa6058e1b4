"""Rotary position embeddings with the scaling types of Hugging Face configs.

`rope_parameters` is the dict transformers 5 writes (`rope_type`, `rope_theta`, `factor`, ...);
`normalize_rope` also accepts the older `rope_theta` + `rope_scaling` spelling. The cos/sin table
is computed once for every position up to `max_len` and gathered per step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from headrace.kernels import fused
from headrace.layers import compiled

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic")


def normalize_rope(
    rope_parameters: dict[str, Any] | None,
    rope_theta: float | None,
    rope_scaling: dict[str, Any] | None,
    default_theta: float = 10000.0,
) -> dict[str, Any]:
    """One flat dict with `rope_type` and `rope_theta` set, from either config spelling."""
    params: dict[str, Any] = dict(rope_parameters or rope_scaling or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", rope_theta if rope_theta is not None else default_theta)
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope type {params['rope_type']!r}")
    return params


def inv_freq_and_scale(
    params: dict[str, Any], head_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the cos/sin multiplier, as in transformers."""
    base = float(params["rope_theta"])
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (base**exponents)
    kind = params["rope_type"]
    if kind == "linear":
        return inv_freq / params["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    if kind == "yarn":
        return _yarn(params, base, dim, max_position_embeddings)
    return inv_freq, 1.0  # default; `dynamic` equals default within the trained length


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(p: dict[str, Any], base: float, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
    original = p.get("original_max_position_embeddings") or max_pos
    factor = p.get("factor") or max_pos / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention_factor = (
            mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        )
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Holds cos/sin for positions [0, max_len); `cos_sin(positions)` feeds `apply_rotary`.

    The sin table carries the sign of rotate-half (`[-sin, sin]`), so that a rotation is
    `x * cos + roll(x, D/2) * sin`: the same products as transformers', with fewer kernels.
    """

    def __init__(
        self, head_dim: int, params: dict[str, Any], max_position_embeddings: int, max_len: int
    ) -> None:
        super().__init__()
        inv_freq, scale = inv_freq_and_scale(params, head_dim, max_position_embeddings)
        positions = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_len, rot_dim / 2]
        cos, sin = freqs.cos() * scale, freqs.sin() * scale
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", torch.cat((cos, cos), dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat((-sin, sin), dim=-1), persistent=False)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] -> cos, signed sin [T, 1, rot_dim] in `dtype`, shared by every layer of a step."""
        cos = self.cos.index_select(0, positions).unsqueeze(1).to(dtype)
        sin = self.sin.index_select(0, positions).unsqueeze(1).to(dtype)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by cos/sin [T, 1, rot_dim] (rotate-half layout, as in transformers).
    bf16 on the CPU: one fused pass with the same roundings (kernels/fused.py)."""
    fused_out = fused.rope(x, cos, sin)
    if fused_out is not None:
        return fused_out
    if compiled.takes(x):  # CUDA with --compile: one kernel
        return compiled.run(_rotate, x, cos, sin)
    return _rotate(x, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot_dim = cos.shape[-1]
    if rot_dim < x.shape[-1]:
        rot, rest = x[..., :rot_dim], x[..., rot_dim:]
        return torch.cat((_rotate(rot, cos, sin), rest), dim=-1)
    return x * cos + x.roll(rot_dim // 2, dims=-1) * sin
