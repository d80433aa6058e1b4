"""Linear layers whose weight merges several Hugging Face projections into one matmul.

One `[q | k | v]` matmul instead of three saves two kernel launches per layer, which matters on
the CPU at small batch sizes. The loader fills each part through `shard_slice`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MergedLinear(nn.Module):
    """`y = x W^T (+ b)` where W stacks parts of the given output sizes along dim 0."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_sizes = list(out_sizes)
        total = sum(out_sizes)
        self.weight = nn.Parameter(torch.empty(total, in_features))  # [sum(out), in]
        self.bias = nn.Parameter(torch.zeros(total)) if bias else None

    def shard_slice(self, index: int) -> slice:
        start = sum(self.out_sizes[:index])
        return slice(start, start + self.out_sizes[index])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, sum(out)]
        return F.linear(x, self.weight, self.bias)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(y.split(self.out_sizes, dim=-1))


class Linear(MergedLinear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, [out_features], bias)
