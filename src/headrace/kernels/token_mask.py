"""Grammar masks on a step's logits (the C kernel in cpu_kernels.c, torch elsewhere).

Unpacking 16 rows of Gemma's 262k-token bitmask with torch (shift, and, compare, masked_fill)
takes about 12 ms here; the kernel skips all-allowed words and writes -inf only where a token
is banned: well under a millisecond.

Shapes: logits [N, V] (bf16 or fp32) masked in place on `rows` [R]; bitmask [R, ceil(V / 32)]
int32, bit j % 32 of word j / 32 set when token j is allowed. Benchmark: bench/kernels.py.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels
from headrace.kernels.host_copy import to_device

_NAMES = {torch.bfloat16: "token_mask_bf16", torch.float32: "token_mask_f32"}
_BITS = torch.arange(32, dtype=torch.int32)


def mask_tokens(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Set the banned tokens of `logits[rows[k]]` to -inf, as `bitmask[k]` says."""
    lib = cpu_kernels()
    usable = lib is not None and logits.device.type == "cpu" and logits.is_contiguous()
    if not usable or logits.dtype not in _NAMES:
        _torch_mask(logits, rows, bitmask)
        return
    assert lib is not None
    index = torch.tensor(rows, dtype=torch.int64)
    bitmask = bitmask.contiguous()
    getattr(lib, _NAMES[logits.dtype])(
        logits.data_ptr(), logits.shape[1], index.data_ptr(), len(rows),
        bitmask.data_ptr(), bitmask.shape[1],
    )  # fmt: skip


def _torch_mask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    allowed = (bitmask.unsqueeze(-1) >> _BITS) & 1  # [R, W, 32]
    allowed = allowed.reshape(len(rows), -1)[:, : logits.shape[1]].bool()  # [R, V]
    index = to_device(rows, logits.device, torch.int64)
    masked = logits.index_select(0, index).masked_fill(
        ~to_device(allowed, logits.device), -torch.inf
    )
    logits.index_copy_(0, index, masked)
