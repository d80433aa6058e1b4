"""bf16 matmuls of decode-sized steps on CPUs with AVX-512 BF16 (bf16_linear.c).

oneDNN's packed bf16 matmul runs Gemma 3's layer shapes at 16 rows at about 60% of the
VDPBF16PS rate here: it loads the weights from memory and then multiplies them, in turn; at 1-4
rows it reads them at well under the memory's rate. The kernel fetches the next block of weights
while it multiplies the current one: 1.3-1.6x oneDNN at 16 rows, 1.4-2.4x at 1-2, 1.1-1.3x at
32, even from 96 (`bench/kernels.py --only bf16`, weights from memory as in a step). Steps of
up to SMALL_MAX_ROWS rows take it; larger ones keep oneDNN. Same precision: bf16 inputs, exact
products, fp32 sums, one rounding to bf16.

Shapes: x [M, K] bf16 (rows at any stride, unit inner stride) -> [M, N] bf16.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels

SMALL_MIN_ROWS = 1
SMALL_MAX_ROWS = 64


def supported(weight: torch.Tensor) -> bool:
    n, k = weight.shape
    lib = cpu_kernels()
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and n % 64 == 0
        and k % 2 == 0
        and lib is not None
        and bool(lib.linear_bf16_supported())
    )


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> [N/16, K/2, 16, 2]: 16 channels by a pair of inputs, one VDPBF16PS operand."""
    n, k = weight.shape
    return weight.detach().reshape(n // 16, 16, k // 2, 2).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] -> x W^T (+ bias) [M, N], bf16."""
    m, k = x.shape
    n = packed.shape[0] * 16
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.bfloat16)
    lib = cpu_kernels()
    assert lib is not None
    lib.linear_bf16(
        x.data_ptr(),
        m,
        k,
        x.stride(0),
        packed.data_ptr(),
        n,
        bias.data_ptr() if bias is not None else None,
        y.data_ptr(),
    )
    return y
