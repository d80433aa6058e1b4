"""RMSNorm in the two flavours Hugging Face uses, computed in float32 like the reference."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """`x / rms(x) * w` (Llama, Qwen) or `* (1 + w)` with `offset=True` (Gemma).

    Llama casts back to the input dtype before the weight; Gemma multiplies in float32 and casts
    last. We follow each so that bf16 results match transformers bit for bit where possible.
    """

    def __init__(self, dim: int, eps: float, offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (xf * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)
