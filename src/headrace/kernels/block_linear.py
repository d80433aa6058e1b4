"""Decode-sized matmuls on a GGUF's own block-quantized weights (block_linear.c).

A GGUF's Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K tensors hold each block of 16 or 32 weights of a row
as `scale * code + offset` with small integer codes (`loader/gguf_blocks.py`). The bf16 path
serves the dequantized weights rounded to bf16, two bytes each; this kernel reads the codes
in as many bits as they take (4-7: a nibble plane, then a plane per higher bit, where it read a
byte each until 2026-12-06) and the block's two fp32 constants, and computes with the GGUF's
weights exactly (each product exact in fp32, fp32 sums, one rounding of the output to bf16; the
block's `128 * sum x` term, added and taken off again, costs about 2^-16 of `scale * sum |x|`):
closer to the fp32 path than the bf16 weights are. A decode step of a few rows reads its weights
from memory, so fewer bytes are a faster step; from a few rows up the bf16 kernel's denser dot
products win (`bench/kernels.py --only blocks`), so steps of up to MAX_ROWS rows take this.

Shapes: x [M, K] bf16 (rows at any stride, unit inner stride) -> [M, N] bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from headrace.kernels.build import cpu_kernels

MAX_ROWS = 4
MAX_CODE = 127  # 0x4300 | code is the bf16 of 128 + code only below 128


@dataclass(frozen=True)
class BlockWeights:
    """A weight [N, K] as the kernel reads it, one stream [N/64, K/block, block/2 * (64 + 16 *
    planes) + 512] u8: for each 64 channels and each block of inputs, the codes a line per pair
    of inputs (the 128 codes' low nibbles in 64 bytes, ordered for code_lines in
    block_linear.c, then `planes` bit planes of 16 bytes: bits 4, 5, 6), then the 64 scales
    and the 64 shifts (offset - 128 * scale), fp32."""

    data: torch.Tensor
    shape: tuple[int, int]
    block: int
    planes: int  # codes of 4 + planes bits


def supported(n: int, k: int, block: int) -> bool:
    lib = cpu_kernels()
    return (
        n % 64 == 0
        and block in (16, 32)
        and k % block == 0
        and lib is not None
        and bool(lib.linear_blocks_supported())
    )


def pack(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> BlockWeights:
    """codes [N, K] u8 (each <= MAX_CODE), scale and offset [N, K / block] f32."""
    n, k = codes.shape
    kb = scale.shape[1]
    block = k // kb
    top = int(codes.max())
    if codes.dtype != torch.uint8 or top > MAX_CODE:
        raise ValueError(f"block_linear: codes of {codes.dtype} up to {top} (u8 <= {MAX_CODE})")
    planes = max(0, top.bit_length() - 4)
    pairs = codes.reshape(n // 64, 64, kb, block // 2, 2).permute(0, 2, 3, 1, 4)
    # [N/64, KB, pair, 64 channels, 2] -> each half of 32 channels as 64 codes: lane l holds
    # the pairs of channels 4l..4l+3 of its first 16 channels, then those of its second 16
    halves = pairs.reshape(n // 64, kb, block // 2, 2, 2, 4, 8)
    halves = halves.permute(0, 1, 2, 3, 5, 4, 6).reshape(n // 64, kb, block // 2, 2, 64)
    lines = [halves[..., 0, :] & 15 | (halves[..., 1, :] & 15) << 4]  # two nibbles a byte
    for b in range(planes):  # bit 4 + b of each half's 64 codes, as a 64-bit mask (byte i: bit i)
        bits = ((halves >> (4 + b)) & 1).numpy()  # [..., 2, 64]
        masks = torch.from_numpy(np.packbits(bits, axis=-1, bitorder="little"))  # [..., 2, 8]
        lines.append(masks.reshape(*masks.shape[:-2], 16))
    shift = (offset.double() - 128 * scale.double()).float()  # one rounding

    def by_block(t: torch.Tensor) -> torch.Tensor:  # [N, KB] f32 -> [N/64, KB, 256] bytes
        return t.float().reshape(n // 64, 64, kb).transpose(1, 2).contiguous().view(torch.uint8)

    codes_part = torch.cat(lines, dim=-1).reshape(n // 64, kb, -1)
    data = torch.cat([codes_part, by_block(scale), by_block(shift)], dim=2).contiguous()
    return BlockWeights(data, (n, k), block, planes)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The weights [N, K] the blocks stand for, in fp32."""
    block = codes.shape[1] // scale.shape[1]
    s = scale.repeat_interleave(block, dim=1)
    return s * codes.float() + offset.repeat_interleave(block, dim=1)


def linear(x: torch.Tensor, w: BlockWeights, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] -> x W^T (+ bias) [M, N], bf16."""
    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.bfloat16)
    lib = cpu_kernels()
    assert lib is not None
    failed = lib.linear_blocks(
        x.data_ptr(),
        m,
        k,
        x.stride(0),
        w.block,
        w.planes,
        w.data.data_ptr(),
        n,
        bias.data_ptr() if bias is not None else None,
        y.data_ptr(),
    )
    if failed:
        raise MemoryError(f"block_linear: no memory for {m} x {k // w.block} row sums")
    return y
