"""Decode attention that reads the paged KV cache in place on a GPU (a Triton kernel).

The CUDA path used to gather every sequence's blocks into a padded copy per layer and run
SDPA over it with a mask built on the host (layers/attention.py `_decode`): a copy of the
whole context a layer, padding to the longest sequence, and shapes that change every step.
This kernel takes the C kernel's contract (kernels/paged_decode.py): the block table
[B, nb] and the bounds [3, B] = (base, lo, hi), tensors whose shapes depend only on the
batch and the table's width, so a step can be replayed as a graph. It reads only positions
[lo, hi) of each sequence, where they lie: no copy, no mask, and never a slot that was not
written (blocks need no zeroing for it).

One program per (sequence, KV head, split): the G query heads that share the KV head are the
rows of one tile (padded to 16, `tl.dot`'s smallest), positions are visited BLOCK_N at a time
with an online softmax in fp32 (as FlashAttention's), each position's slot read from the
block table, so any block size works.

Splits (flash-decoding): with few sequences, (sequence, KV head) pairs alone leave most of a
GPU's multiprocessors idle (Gemma 3 270M has one KV head: at batch 1, one program read the
whole context). Then each pair's positions are cut into `splits` equal spans, one program
each; a program writes its span's running max, sum and weighted values, and a few torch ops
combine the spans (each weighted by exp(its max - the largest)). The number of splits depends
only on the batch, the KV heads and the device, so a captured graph replays the same launch.

Shapes: q [B, Hq, D]; k_cache, v_cache [N, bs, Hkv, D]; block_table [B, nb] int64;
bounds [3, B] int64 on q's device -> [B, Hq, D] in q's dtype. Tested on the CPU through
Triton's interpreter (TRITON_INTERPRET=1, tests/kernels/test_paged_decode_triton.py; its
bf16 tiles upcast to fp32 there, see below);
measured on the GPU by bench/gpu/device_bench.py.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from headrace.kernels.triton_attend import at_least_16, attend_keys

BLOCK_N = 32  # positions a loop turn; tl.dot needs 16 or more
MAX_SPLITS = 16


@triton.jit  # type: ignore[untyped-decorator]  # triton's decorator is untyped
def _decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, table_ptr, base_ptr, lo_ptr, hi_ptr, out_ptr, m_ptr, l_ptr,
    table_width, scale,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    UPCAST: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    # One kernel body, long on purpose: the online softmax's state lives in registers across
    # the loop over blocks, which a split into helpers would only pass around.
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    base = tl.load(base_ptr + b).to(tl.int32)  # positions: int32 loop bounds, as Triton likes
    lo = tl.load(lo_ptr + b).to(tl.int32)
    hi = tl.load(hi_ptr + b).to(tl.int32)
    if SPLITS > 1:  # this program's span of [lo, hi); a span may be empty
        span = tl.cdiv(hi - lo, SPLITS)
        lo = tl.minimum(lo + split * span, hi)
        hi = tl.minimum(lo + span, hi)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok = d < D
    q_rows = (b * HKV * G + h * G + g) * D  # the query heads of KV head h
    q_mask = (g < G)[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=q_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        ok = pos < hi
        rel = pos - base  # >= 0: base is the first slot of the table's first block
        block = tl.load(table_ptr + b * table_width + rel // BS, mask=ok, other=0)
        rows = ((block * BS + rel % BS) * HKV + h) * D
        kv_mask = ok[:, None] & d_ok[None, :]
        m, l_sum, acc = attend_keys(
            q, k_ptr, v_ptr, rows, kv_mask, d, ok[None, :], m, l_sum, acc, scale, PREC, UPCAST
        )
    if SPLITS == 1:
        out = acc / l_sum[:, None]
        tl.store(out_ptr + q_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), q_mask)
    else:  # the span's state, [B, HKV, SPLITS, G] (and x D for the values), in fp32
        part = ((b * HKV + h) * SPLITS + split) * G + g
        tl.store(out_ptr + part[:, None] * D + d[None, :], acc, q_mask)
        tl.store(m_ptr + part, m, g < G)
        tl.store(l_ptr + part, l_sum, g < G)


def splits_for(batch: int, kv_heads: int, device: torch.device) -> int:
    """Spans a sequence's positions are cut into: enough programs for every multiprocessor
    twice over, at most MAX_SPLITS; 1 off CUDA (the interpreter) and for a full batch."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(MAX_SPLITS, 2 * sms // (batch * kv_heads)))


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    bounds: torch.Tensor,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:
    """Inputs as `paged_decode` checks them: contiguous, int64 table and bounds [3, B].
    `splits`: spans of each sequence's positions (None: `splits_for` the device)."""
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    g = hq // hkv
    splits = splits_for(b, hkv, q.device) if splits is None else splits
    if splits > 1:
        out = torch.empty(b, hkv, splits, g, d, dtype=torch.float32, device=q.device)
        m = torch.empty(b, hkv, splits, g, dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
    else:
        out, m, l_sum = torch.empty_like(q), q, q  # m, l unused: the kernel stores out
    # Triton's interpreter multiplies bf16 tiles wrongly (their raw bits): there they are
    # upcast first, to products a GPU's bf16 dot accumulates in fp32 alike
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # fp32 stays fp32 (no tf32): it is the dtype the exactness tests pin
    precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"
    _decode_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_table, bounds[0], bounds[1], bounds[2], out, m, l_sum,
        block_table.shape[1], scale,
        HKV=hkv, G=g, D=d, BS=bs, BLOCK_G=at_least_16(g), BLOCK_D=at_least_16(d),
        BLOCK_N=BLOCK_N, PREC=precision, UPCAST=upcast, SPLITS=splits,
    )  # fmt: skip
    if splits == 1:
        return out
    weight = torch.exp(m - m.amax(dim=2, keepdim=True))  # [B, HKV, S, G]; empty spans: 0
    total = (out * weight[..., None]).sum(dim=2) / (l_sum * weight).sum(dim=2)[..., None]
    return total.view(b, hq, d).to(q.dtype)
