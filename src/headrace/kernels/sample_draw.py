"""The sampler's draw on the CPU in C (sample_draw.c): each row's token from softmax(x) kept
to its top_p set, by inverse CDF in vocabulary order with the row's uniform number; the same
draw as the torch path (engine/runner/top_p.py's set, sampler.py's `_inverse_cdf`) without
building the set.

Shapes: x [R, V] fp32 logits over the temperature (-inf: not allowed) -> [R] int64 token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headrace.kernels.build import cpu_kernels


def supported(x: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.shape[1] < 2**31
        and cpu_kernels() is not None
    )


def draw(x: torch.Tensor, top_p: Sequence[float], uniforms: Sequence[float]) -> torch.Tensor | None:
    """Each row's token; None where the kernel could not get its memory (the caller's torch
    path then draws). top_p >= 1: the whole row."""
    lib = cpu_kernels()
    assert lib is not None
    x = x.contiguous()
    p = torch.tensor(top_p, dtype=torch.float64)
    u = torch.tensor(uniforms, dtype=torch.float64)
    out = torch.empty(len(x), dtype=torch.int64)
    lib.sample_draw(
        x.data_ptr(), x.shape[0], x.shape[1], p.data_ptr(), u.data_ptr(), out.data_ptr()
    )
    return None if bool((out < 0).any()) else out
