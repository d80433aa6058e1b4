"""The paged KV pool: per layer, K and V tensors of `[num_blocks, block_size, Hkv, D]`."""

from __future__ import annotations

import math
from collections.abc import Iterable

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
    Elsewhere they are allocated uninitialized and a block is zeroed the first time a step
    uses it (the in-place decode kernels never read an unwritten slot, but a prefill chunk
    over cached blocks still gathers them).
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
        on_cpu = device.type == "cpu"
        blocks = shape[0]
        self._zeroed = bytearray(b"\x01" * blocks if on_cpu else blocks)
        padding = [0] if self.spare_block is None else [0, self.spare_block]
        self.prepare(padding)  # padded rows and tables read them

    def prepare(self, block_ids: Iterable[int]) -> None:
        """Zero the blocks among `block_ids` that no step has used yet."""
        fresh = sorted({b for b in block_ids if not self._zeroed[b]})
        if not fresh:
            return
        index = torch.tensor(fresh, dtype=torch.int64, device=self.device)
        for k, v in self.layers:
            k.index_fill_(0, index, 0)
            v.index_fill_(0, index, 0)
        for b in fresh:
            self._zeroed[b] = 1

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def _pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    nbytes = dtype.itemsize * math.prod(shape)
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
