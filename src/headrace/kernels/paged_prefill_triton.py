"""Prefill attention over the paged KV cache in place on a GPU (a Triton kernel), for a chunk
that does not start its sequence or runs past its window: a chunked prompt's later chunks and
prompts whose head the prefix cache held.

The torch path (layers/attention.py `_prefill`) gathers the sequence's blocks into a copy per
layer and runs SDPA over it with a [n, L] mask built on the host each step, which rules out
the flash backends. Here the chunk's queries read the blocks where they lie: causal, and
within the window where the layer has one. The chunk's own K/V are in the cache already
(attention writes a step's K/V first), so every key comes from the cache.

One program per (tile of BLOCK_M queries, KV head): the tile's queries times the G query
heads sharing the KV head are the rows of one tile (as FlashAttention's GQA packing), keys are
visited BLOCK_N positions at a time from the first any of the tile's queries sees to the last
query's own position, with an online softmax in fp32; each key's slot is read from the block
table, so any block size works. A row that sees no key of a turn (the tile's early queries
against its late keys) keeps its state: its shift is taken as 0, not -inf, so no NaN.

Shapes: q [n, Hq, D] (one chunk; query i at position start_pos + i); k_cache, v_cache
[N, bs, Hkv, D]; block_table [nb] int64, the sequence's blocks from its first -> [n, Hq, D] in
q's dtype. Tested on the CPU through Triton's interpreter (TRITON_INTERPRET=1,
tests/kernels/test_paged_prefill_triton.py); not yet measured on a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from headrace.kernels.triton_attend import at_least_16, attend_keys

BLOCK_N = 32  # key positions a loop turn; tl.dot needs 16 or more
# query rows a program (BLOCK_M queries x the padded G heads of one KV head): its fp32 values
# tile [ROWS, D] lives in registers, so a wide head (Gemma's 256) gets half as many rows
ROWS = 64
_NO_WINDOW = 1 << 30  # full attention: a window no context reaches (int32 arithmetic)


@triton.jit  # type: ignore[untyped-decorator]  # triton's decorator is untyped
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, table_ptr, out_ptr, n_q, start_pos, window, scale,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    # One body, long on purpose, as the decode kernel's: the online softmax's state lives in
    # registers across the loop over keys.
    tile = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.arange(0, BLOCK_M * BLOCK_G)
    i = tile * BLOCK_M + r // BLOCK_G  # the row's query, within the chunk
    g = r % BLOCK_G
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok = d < D
    row_ok = (i < n_q) & (g < G)
    q_rows = ((i * HKV + h) * G + g) * D
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=q_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = start_pos + i  # [R]
    first = start_pos + tile * BLOCK_M  # the tile's first query's position
    last = tl.minimum(first + BLOCK_M, start_pos + n_q) - 1
    lo = tl.maximum(first - window + 1, 0)
    m = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    for key0 in range(lo, last + 1, BLOCK_N):
        pos = key0 + n  # [BLOCK_N]
        ok = pos <= last
        block = tl.load(table_ptr + pos // BS, mask=ok, other=0)
        kv_rows = ((block * BS + pos % BS) * HKV + h) * D
        kv_mask = ok[:, None] & d_ok[None, :]
        seen = ok[None, :] & (pos[None, :] <= q_pos[:, None])  # causal
        seen = seen & (pos[None, :] > q_pos[:, None] - window)  # [R, BLOCK_N]
        m, l_sum, acc = attend_keys(
            q, k_ptr, v_ptr, kv_rows, kv_mask, d, seen, m, l_sum, acc, scale, PREC, UPCAST
        )
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]  # 0 only in padding rows
    tl.store(out_ptr + q_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), q_mask)


def paged_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start_pos: int,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """Contiguous pools, an int64 table on q's device; `window` None: full attention."""
    assert q.dtype == k_cache.dtype == v_cache.dtype and block_table.dtype == torch.int64
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    q, block_table = q.contiguous(), block_table.contiguous()
    n, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    out = torch.empty_like(q)
    g = hq // hkv
    block_g = int(triton.next_power_of_2(g))
    block_m = max(1, (ROWS if d <= 128 else ROWS // 2) // block_g)
    # as the decode kernel: the interpreter multiplies bf16 tiles wrongly, so it upcasts
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"
    _prefill_kernel[(triton.cdiv(n, block_m), hkv)](
        q, k_cache, v_cache, block_table, out, n, start_pos, window or _NO_WINDOW, scale,
        HKV=hkv, G=g, D=d, BS=bs, BLOCK_M=block_m, BLOCK_G=block_g, BLOCK_D=at_least_16(d),
        BLOCK_N=BLOCK_N, PREC=precision, UPCAST=upcast,
    )  # fmt: skip
    return out
