"""The paged KV pool: per layer, K and V tensors of `[num_blocks, block_size, Hkv, D]`."""

from __future__ import annotations

import math

import numpy as np
import torch

from headrace.models.args import ModelArgs


def bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * dtype.itemsize
    return per_token * block_size


def blocks_for_budget(args: ModelArgs, block_size: int, dtype: torch.dtype, gib: float) -> int:
    return max(1, int(gib * (1 << 30)) // bytes_per_block(args, block_size, dtype))


class KVCache:
    """The pools. Masked-out slots of a gathered block must hold finite values, since attention
    multiplies them by a zero weight (0 * NaN is NaN), so every block reads as zeros before a
    step first writes it.

    On the CPU the pools come from calloc (numpy's zeros): the OS hands out zeroed pages as
    they are first touched, so start-up does not wait for them; the step that first writes a
    page pays the kernel's zeroing instead (1.3 s a GiB in all on the 2-core AMD EPYC host,
    spread over the first tokens through each block; once a pool is touched, nothing more).
    On a GPU they are zeroed when allocated: one memset at start-up (tens of ms for a pool of
    tens of GiB at the device's bandwidth). Zeroing a block when a step first used it instead
    meant looking up every block of every scheduled request each step (5,000 look-ups at 256
    decodes of 320 tokens) on the host, which a GPU step waits for.
    """

    def __init__(
        self,
        args: ModelArgs,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        spare_block: bool = False,
    ) -> None:
        """`spare_block`: one more block past `num_blocks`, which no sequence is given: the
        padding rows of a decode graph write there (engine/runner/decode_graphs.py)."""
        shape = (num_blocks + spare_block, block_size, args.num_kv_heads, args.head_dim)
        self.num_blocks = num_blocks
        self.spare_block = num_blocks if spare_block else None
        self.block_size = block_size
        self.device = device
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (_pool(shape, dtype, device), _pool(shape, dtype, device))
            for _ in range(args.num_layers)
        ]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def _pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = dtype.itemsize * math.prod(shape)
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
