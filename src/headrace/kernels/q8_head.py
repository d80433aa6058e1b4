"""The head's logits of a decode step of a few rows from a GGUF's own Q8_0 blocks (q8_head.c).

Gemma 3 270M's GGUF stores its tied 262k x 640 embedding as Q8_0: each block of 32 weights of a
row is `d * q`, an fp16 scale times int8 codes. The bf16 head rounds each `d * q` to bf16 and
reads 2 bytes a weight (335 MB a step); this kernel reads the codes and the scales (1.06 bytes,
178 MB) and computes with the file's weights exactly (each `q * x` exact in fp32, fp32 sums, the
scale applied once per block, fp32 logits): closer to the fp32 path than the bf16 head (which
rounds the weights and its logits to bf16), and about half the bytes where a step of few rows
is bound by memory (`bench/kernels.py --only q8head`). Steps of up to MAX_ROWS rows take it
(models/base.py).

Shapes: x [M, K] bf16 (rows at any stride, unit inner stride), M <= MAX_ROWS -> [M, N] fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headrace.kernels.build import cpu_kernels

MAX_ROWS = 4
BLOCK = 32
GROUP = 16  # channels a vector


@dataclass(frozen=True)
class Q8Head:
    """The weight [N, K] as the kernel reads it, one stream [N/16, K/32, 544] u8: for each 16
    channels and each block of 32 inputs, the int8 codes input by input (16 bytes each), then
    the 16 channels' fp16 scales."""

    data: torch.Tensor
    shape: tuple[int, int]


def supported(n: int, k: int) -> bool:
    lib = cpu_kernels()
    return n % GROUP == 0 and k % BLOCK == 0 and lib is not None and bool(lib.q8_head_supported())


def q8_form(
    codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A GGUF block form (codes [N, K] u8 = q + 128, scale and offset [N, K/32] f32, offset =
    -128 scale: loader/gguf_blocks.py's Q8_0) as (q int8 [N, K], d fp16 [N, K/32]); None where
    it is not Q8_0's (other offsets, other block sizes, a scale fp16 cannot hold)."""
    n, k = codes.shape
    if scale.shape != (n, k // BLOCK) or k % BLOCK or offset.shape != scale.shape:
        return None
    d = scale.to(torch.float16)
    if not torch.equal(d.float(), scale) or not torch.equal(offset, -128 * scale):
        return None
    if codes.dtype != torch.uint8:
        return None
    return torch.bitwise_xor(codes, 128).view(torch.int8), d  # q + 128 -> q, no wide copy


def pack(q: torch.Tensor, d: torch.Tensor) -> Q8Head:
    """q [N, K] int8, d [N, K/32] fp16."""
    n, k = q.shape
    kb = k // BLOCK
    codes = q.reshape(n // GROUP, GROUP, kb, BLOCK).permute(0, 2, 3, 1)  # [N/16, KB, 32, 16]
    codes = codes.reshape(n // GROUP, kb, BLOCK * GROUP).view(torch.uint8)
    scales = d.reshape(n // GROUP, GROUP, kb).transpose(1, 2).contiguous().view(torch.uint8)
    data = torch.cat([codes, scales], dim=2).contiguous()  # [N/16, KB, 512 + 32]
    return Q8Head(data, (n, k))


def logits(x: torch.Tensor, w: Q8Head) -> torch.Tensor:
    """x [M, K] bf16 -> x W^T [M, N] fp32."""
    m, k = x.shape
    n = w.shape[0]
    if k != w.shape[1] or not 0 < m <= MAX_ROWS or x.dtype != torch.bfloat16:
        raise ValueError(f"q8_head: x {tuple(x.shape)} {x.dtype} for a head {w.shape}")
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    lib = cpu_kernels()
    assert lib is not None
    if lib.q8_head(x.data_ptr(), m, k, x.stride(0), w.data.data_ptr(), n, y.data_ptr()):
        raise MemoryError(f"q8_head: no memory for {m} x {k} fp32")
    return y
