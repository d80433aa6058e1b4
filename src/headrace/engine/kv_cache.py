"""The paged KV pool: per layer, K and V tensors of `[num_blocks, block_size, Hkv, D]`."""

from __future__ import annotations

import torch

from headrace.models.args import ModelArgs


def bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * dtype.itemsize
    return per_token * block_size


def blocks_for_budget(args: ModelArgs, block_size: int, dtype: torch.dtype, gib: float) -> int:
    return max(1, int(gib * (1 << 30)) // bytes_per_block(args, block_size, dtype))


class KVCache:
    """Zero-filled pools: masked-out slots must hold finite values (0 * NaN is NaN)."""

    def __init__(
        self,
        args: ModelArgs,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks, block_size, args.num_kv_heads, args.head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(args.num_layers)
        ]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)
