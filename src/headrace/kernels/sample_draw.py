"""The sampler's draw on the CPU in C (sample_draw.c): each row's token from softmax(x) kept
to its top_p set, by inverse CDF in vocabulary order with the row's uniform number, x the row's
logits over its temperature; the same draw as the torch path (engine/runner/top_p.py's set,
sampler.py's `_inverse_cdf`) without building the set, or a float32 copy of the logits.

Shapes: logits [R, V] bf16 or fp32 (each row contiguous), t / top_p / uniforms [R] -> [R] int64
token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headrace.kernels.build import cpu_kernels


def supported(x: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and x.dim() == 2
        and x.stride(1) == 1
        and x.shape[1] < 2**31
        and cpu_kernels() is not None
    )


def draw(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_p: Sequence[float],
    uniforms: Sequence[float],
) -> torch.Tensor | None:
    """Each row's token from softmax(logits / t); None where the kernel could not get its
    memory (the caller's torch path then draws). top_p >= 1: the whole row."""
    lib = cpu_kernels()
    assert lib is not None
    r, v = logits.shape
    rows = torch.arange(r, dtype=torch.int64)
    t = torch.tensor(temperatures, dtype=torch.float32)
    p = torch.tensor(top_p, dtype=torch.float64)
    u = torch.tensor(uniforms, dtype=torch.float64)
    out = torch.empty(r, dtype=torch.int64)
    lib.sample_draw(
        logits.data_ptr(), int(logits.dtype == torch.bfloat16), logits.stride(0), v, r,
        rows.data_ptr(), t.data_ptr(), p.data_ptr(), u.data_ptr(), out.data_ptr(),
    )  # fmt: skip
    return None if bool((out < 0).any()) else out
