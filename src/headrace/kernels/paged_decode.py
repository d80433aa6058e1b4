"""Decode attention that reads the paged KV cache in place (the C kernel in cpu_kernels.c).

The torch path (layers/attention.py) gathers every sequence's blocks into a padded copy per
layer and runs SDPA over it: at batch 32, context 300 that is about a third of a Gemma 3 270M
decode step on this CPU. The kernel reads each cached K/V row once, where it lies, and only up
to each sequence's own length: no copy, no padding, no mask.

Shapes (one layer, one step): q [B, Hq, D]; k_cache, v_cache [N, bs, Hkv, D];
bounds [3, B] int64 = (base, lo, hi): block_table[b, 0] holds position base[b], and sequence b
attends to positions [lo[b], hi[b]). Output [B, Hq, D] in q's dtype. Benchmark: bench/kernels.py.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels

_NAMES = {torch.bfloat16: "paged_decode_bf16", torch.float32: "paged_decode_f32"}


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype in _NAMES and cpu_kernels() is not None


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    bounds: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    lib = cpu_kernels()
    assert lib is not None and q.dtype == k_cache.dtype == v_cache.dtype
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    q = q.contiguous()
    table = block_table.contiguous()
    bounds = bounds.contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and hq % hkv == 0
    assert table.dtype == bounds.dtype == torch.int64 and bounds.shape == (3, b)
    out = torch.empty_like(q)
    failed = getattr(lib, _NAMES[q.dtype])(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        table.data_ptr(),
        table.shape[1],
        bounds[0].data_ptr(),
        bounds[1].data_ptr(),
        bounds[2].data_ptr(),
        b,
        hq,
        hkv,
        d,
        bs,
        scale,
        out.data_ptr(),
    )
    if failed:
        raise MemoryError("paged decode attention: out of memory for its score buffers")
    return out
