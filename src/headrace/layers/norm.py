"""RMSNorm in the two flavours Hugging Face uses, computed in float32 like the reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headrace.kernels import fused
from headrace.layers import compiled


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """x [..., D] normalized, times `scale` (broadcast against x).

    Llama casts back to the input dtype before the weight; Gemma multiplies in float32 by
    `1 + w` and casts last. We follow each so that results match transformers'. bf16 on the
    CPU goes through one fused pass with the same roundings (kernels/fused.py); CUDA with
    `--compile` through one compiled kernel (layers/compiled.py).
    """
    fused_out = fused.rms_norm(x, scale, eps, cast_first=not offset)
    if fused_out is not None:
        return fused_out
    if compiled.takes(x):  # per-head norms apart: each function's compiled variants are few
        return compiled.run(_rms_norm if x.dim() == 2 else _rms_norm_heads, x, scale, eps, offset)
    return _rms_norm(x, scale, eps, offset)


def _rms_norm_heads(x: torch.Tensor, scale: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    return _rms_norm(x, scale, eps, offset)


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """The torch ops of `rms_norm` (what CUDA runs, eager or compiled)."""
    dim = (x.shape[-1],)
    if not offset:
        return scale * F.rms_norm(x.float(), dim, None, eps).to(x.dtype)
    if scale.dim() == 1:  # F.rms_norm's own weight path: the same float32 products
        return F.rms_norm(x.float(), dim, scale, eps).to(x.dtype)
    return (F.rms_norm(x.float(), dim, None, eps) * scale).to(x.dtype)


class RMSNorm(nn.Module):
    """`x / rms(x) * w` (Llama, Qwen) or `* (1 + w)` with `offset=True` (Gemma).

    `prepare()` (after loading) computes the multiplier once: Gemma's float32 `1 + w`.
    """

    def __init__(self, dim: int, eps: float, offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.scale: torch.Tensor | None = None

    def multiplier(self) -> torch.Tensor:
        return 1.0 + self.weight.float() if self.offset else self.weight

    def prepare(self) -> None:
        self.scale = self.multiplier()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """[..., dim] -> [..., dim]; with `residual`: residual + norm(x) (a post-norm)."""
        scale = self.scale if self.scale is not None else self.multiplier()
        if residual is None:
            return rms_norm(x, scale, self.eps, self.offset)
        out = fused.rms_norm(x, scale, self.eps, not self.offset, residual)
        if out is not None:
            return out
        if compiled.takes(x):
            return compiled.run(_add_norm, x, scale, self.eps, self.offset, residual)
        return _add_norm(x, scale, self.eps, self.offset, residual)


def _add_norm(
    x: torch.Tensor, scale: torch.Tensor, eps: float, offset: bool, residual: torch.Tensor
) -> torch.Tensor:
    return residual + _rms_norm(x, scale, eps, offset)


def stacked_head_scale(q_norm: RMSNorm, k_norm: RMSNorm, hq: int, hkv: int) -> torch.Tensor:
    """[hq + hkv, D]: the q and k norms' multipliers per head, to normalize q and k in one go."""
    d = q_norm.weight.shape[0]
    return torch.cat((q_norm.multiplier().expand(hq, d), k_norm.multiplier().expand(hkv, d)))
