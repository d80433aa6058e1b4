"""Linear layers whose weight merges several Hugging Face projections into one matmul.

One `[q | k | v]` matmul instead of three saves two kernel launches per layer, which matters on
the CPU at small batch sizes. The loader fills each part through `shard_slice`.

On the CPU, weights can be repacked once into oneDNN's preferred layout (`pack_weight`): the
matmuls of a decode step then run 1.2-2.5x faster than `F.linear`, which reorders the weight on
every call (bf16) or takes MKL's slow path for a few rows (fp32).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from headrace.kernels import bf16_linear, block_linear
from headrace.kernels.int8_linear import Int8Linear
from headrace.layers.lora import LoraDelta

log = logging.getLogger(__name__)
PACK_BATCH_HINT = 32  # oneDNN picks the layout for about this many rows; any count works
_NO_BUCKET = bool(os.environ.get("HEADRACE_NO_BUCKET"))
# Which steps take the int8 copy is Int8Linear.min_rows: from 5 rows where int8_small.c runs
# (1.5-2.2x bf16_linear's kernel at 1-31 rows, the weights from memory as in a step:
# `bench/kernels.py --only int8-small`), from 32 where only oneDNN's int8 matmul does (slower
# than bf16 below that). Steps of 1-4 rows (one to a few streams) keep their numerics: the
# GGUF's own blocks (the file's weights exactly, in fewer bytes than int8) or bf16.


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight [out, in] in oneDNN's layout, or None where that is unavailable or differs."""
    if (
        weight.device.type != "cpu"
        or weight.dtype not in (torch.float32, torch.bfloat16)
        or not torch.backends.mkldnn.is_available()
        or os.environ.get("HEADRACE_NO_PACK")
    ):
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
        probe = probe.to(weight.dtype)
        got = packed_linear(probe, packed, None).float()
        want = F.linear(probe, weight).float()
    except (RuntimeError, AttributeError) as e:  # an op missing from this torch build
        log.info("oneDNN weight packing unavailable: %s", e)
        return None
    tolerance = 1e-2 if weight.dtype == torch.bfloat16 else 1e-3
    if not torch.allclose(got, want, rtol=tolerance, atol=tolerance):
        return None
    return packed


def bucket_rows(rows: int) -> int:
    """`rows` rounded up to one of 16 sizes per power of two (exact up to 32).

    oneDNN builds a primitive for every input shape (about 15 ms each here) and keeps 1,024;
    a server's steps have every token count from 1 to the budget, 4-5 weight shapes each, so
    unbucketed they evict each other and nearly every step rebuilds its matmuls. Padding by at
    most 1/16 bounds the shapes to about 110 per weight.
    """
    if rows <= 32:
        return rows
    grain = 1 << (rows.bit_length() - 5)
    return -(-rows // grain) * grain


def padded_rows(rows: int) -> int:
    """The rows a oneDNN matmul of `rows` runs on: its bucket (HEADRACE_NO_BUCKET: itself)."""
    return rows if _NO_BUCKET else bucket_rows(rows)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, in] -> [T, out] through oneDNN, computed on `bucket_rows(T)` rows."""
    rows = x.shape[0]
    padded = padded_rows(rows) if x.dim() == 2 else rows
    if padded != rows:
        x = F.pad(x, (0, 0, 0, padded - rows))
    y = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return y if padded == rows else y[:rows]


class MergedLinear(nn.Module):
    """`y = x W^T (+ b)` where W stacks parts of the given output sizes along dim 0."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_sizes = list(out_sizes)
        total = sum(out_sizes)
        self.weight = nn.Parameter(torch.empty(total, in_features))  # [sum(out), in]
        self.bias = nn.Parameter(torch.zeros(total)) if bias else None
        self.packed: torch.Tensor | None = None
        self.small: torch.Tensor | None = None  # bf16_linear's layout, for decode-sized steps
        self.int8: Int8Linear | None = None
        self.blocks: block_linear.BlockWeights | None = None  # a GGUF's own, for decode steps
        self.row_invariant = False  # every 2-D step through bf16_linear (make_row_invariant)
        self.lora: LoraDelta | None = None  # adapters' terms, where any adapter targets this
        # int8 also in steps with adapter rows (--int8-matmuls on); under auto those steps keep
        # bf16: with a LoRA adapter int8 fails the quality gate (docs/lora.md)
        self.int8_with_lora = False

    def shard_slice(self, index: int) -> slice:
        start = sum(self.out_sizes[:index])
        return slice(start, start + self.out_sizes[index])

    def pack(self) -> None:
        """Repack for the CPU; the plain weight stays for export and inspection."""
        self.packed = pack_weight(self.weight)
        if self.packed is not None and bf16_linear.supported(self.weight):
            self.small = bf16_linear.pack(self.weight)

    def quantize(self, with_lora: bool = False) -> bool:
        """Add an int8 copy for steps of its min_rows rows or more (`with_lora`: also those
        with adapter rows); False where unavailable."""
        self.int8, self.int8_with_lora = Int8Linear.build(self.weight), with_lora
        if self.int8 is not None and self.small is not None:
            self.packed = None  # every 2-D step now takes one of the two (Gemma 3 270M: 129 MB)
        return self.int8 is not None

    def use_blocks(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> bool:
        """Take the weight's quantized blocks (codes [out, in] u8, scale and offset per block)
        for steps of up to block_linear.MAX_ROWS rows; False where the kernel cannot serve
        them. Only beside the bf16 decode kernel: the blocks replace what it does best."""
        n, k = codes.shape
        blocks = scale.shape[1] if scale.dim() == 2 else 0
        if (
            self.small is None
            or blocks == 0
            or scale.shape != (n, blocks)
            or offset.shape != scale.shape
            or k % blocks
            or self.row_invariant
            or (n, k) != tuple(self.weight.shape)
            or not block_linear.supported(n, k, k // blocks)
            or int(codes.max()) > block_linear.MAX_CODE
        ):
            return False
        self.blocks = block_linear.pack(codes, scale, offset)
        return True

    def make_row_invariant(self) -> bool:
        """Take bf16_linear for every row count: each output is one row's own fp32 sum in a
        fixed order, so a row's result does not depend on the step's size (oneDNN blocks its
        sums by the row count, and the int8 path starts at 32 rows). False where the kernel is
        unavailable."""
        self.int8 = self.blocks = None
        self.row_invariant = self.small is not None
        return self.row_invariant

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, sum(out)]
        y = self._base(x)
        return y if self.lora is None else self.lora.add(x, y)

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.int8 is not None
            and x.dim() == 2
            and x.shape[0] >= self.int8.min_rows
            and (self.int8_with_lora or self.lora is None or not self.lora.batch.groups)
        ):
            return self.int8(x, self.bias, padded_rows(x.shape[0]))
        if self.blocks is not None and x.dim() == 2 and x.shape[0] <= block_linear.MAX_ROWS:
            return block_linear.linear(x, self.blocks, self.bias)
        if self.small is not None and x.dim() == 2 and self._small_rows(x.shape[0]):
            return bf16_linear.linear(x, self.small, self.bias)
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)

    def _small_rows(self, rows: int) -> bool:
        if self.row_invariant:
            return rows >= bf16_linear.SMALL_MIN_ROWS
        return bf16_linear.SMALL_MIN_ROWS <= rows <= bf16_linear.SMALL_MAX_ROWS

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(y.split(self.out_sizes, dim=-1))


class Linear(MergedLinear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, [out_features], bias)
