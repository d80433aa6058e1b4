"""Paged attention in plain torch.

The KV pool of one layer is `[num_blocks, block_size, num_kv_heads, head_dim]`; a sequence's
tokens live in the blocks of its block table. Each step, new K/V go to their slots, then:

* all single-token queries (decodes) attend in one call through a kernel that reads the blocks
  in place (kernels/paged_decode.py: C on the CPU, Triton on CUDA), or where there is none
  (no compiler, no Triton) by SDPA over their gathered blocks, masked by context length (and
  window);
* each multi-token chunk (prefill) attends on its own: a chunk that starts its sequence in
  bf16 on the CPU through blocked matmuls (causal_attention.py); one over cached blocks on
  CUDA through a kernel that reads them in place (kernels/paged_prefill.py); others with
  `scaled_dot_product_attention`, over the gathered blocks where the chunk reads the cache.

`AttentionMetadata` is built once per step (see `engine/runner/step_inputs.py`) and shared by
layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from headrace.kernels.paged_decode import paged_decode
from headrace.layers.causal_attention import causal_attention, use_blocked

Window = int | None  # None: full attention


@dataclass
class KVView:
    """Which cache blocks a query group reads, and which of their slots it may see."""

    block_table: torch.Tensor  # [B, num_blocks] (decode) or [num_blocks] (prefill), int64
    # True = attend (or additive 0 / -inf): [B, 1, 1, L] (decode) or [q_len, L] (prefill);
    # None for a prefill: the in-place kernel, over the table from the sequence's first block
    mask: torch.Tensor | None
    # decode through the in-place kernel instead of a mask: [3, B] int64 (base, lo, hi), see
    # kernels/paged_decode.py
    bounds: torch.Tensor | None = None
    # spans the GPU's decode kernel cuts a sequence into (None: as many as the batch leaves
    # room for); 1 where a token's attention must not depend on its batch (--deterministic)
    splits: int | None = None


@dataclass
class PrefillChunk:
    """One sequence computing several tokens at once."""

    start: int  # first row of the chunk in the flattened batch
    end: int
    # window -> view over the cache; absent when the chunk attends only to itself causally
    views: dict[Window, KVView] = field(default_factory=dict)
    start_pos: int = 0  # the position of its first token


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot (block * block_size + offset) per token
    num_decodes: int  # rows [0, num_decodes) of the batch are single-token queries
    decode_views: dict[Window, KVView]
    prefills: list[PrefillChunk]


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Store k, v [T, Hkv, D] into the pools [N, bs, Hkv, D] at the given flat slots [T]."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: Window,
) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] of this step -> output [T, Hq * D]."""
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    nd = meta.num_decodes
    if nd == q.shape[0]:  # decodes only: the common step, no output buffer needed
        return _decode(q, k_cache, v_cache, meta.decode_views[window], scale).flatten(1)
    out = q.new_empty(q.shape)  # [T, Hq, D]
    if nd:
        out[:nd] = _decode(q[:nd], k_cache, v_cache, meta.decode_views[window], scale)
    for chunk in meta.prefills:
        rows = slice(chunk.start, chunk.end)
        view = chunk.views.get(window)
        if view is not None and view.mask is None:  # in place (kernels/paged_prefill.py)
            # imported here: Triton, which the module needs, is not on every CPU machine
            from headrace.kernels.paged_prefill_triton import paged_prefill_triton

            out[rows] = paged_prefill_triton(
                q[rows], k_cache, v_cache, view.block_table, chunk.start_pos, window, scale
            )
        else:
            out[rows] = _prefill(q[rows], k[rows], v[rows], k_cache, v_cache, view, scale)
    return out.flatten(1)


def _gather(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """cache [N, bs, Hkv, D], table [..., nb] -> [..., Hkv, nb * bs, D]."""
    # index_select copies whole blocks; it is several times faster than cache[table]
    blocks = cache.index_select(0, table.reshape(-1))  # [prod(...) * nb, bs, Hkv, D]
    flat = blocks.view(*table.shape[:-1], -1, *cache.shape[2:])  # [..., L, Hkv, D]
    return flat.transpose(-3, -2)


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, view: KVView, scale: float
) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hq, D]: one query per sequence, all sequences in one call."""
    if view.bounds is not None:
        return paged_decode(q, k_cache, v_cache, view.block_table, view.bounds, scale, view.splits)
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    keys = _gather(k_cache, view.block_table)  # [B, Hkv, L, D]
    values = _gather(v_cache, view.block_table)
    # The query heads sharing a KV head become that head's query rows: no KV repeat needed.
    qg = q.view(b, hkv, hq // hkv, d)  # [B, Hkv, G, D]
    o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=view.mask, scale=scale)
    return o.reshape(b, hq, d)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    view: KVView | None,
    scale: float,
) -> torch.Tensor:
    """q [n, Hq, D] of one sequence -> [n, Hq, D]."""
    if view is None and use_blocked(q):
        return causal_attention(q, k, v, scale)
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
    gqa = q.shape[1] != k.shape[1]
    if view is None:  # the chunk starts the sequence and fits its window: plain causal
        kh, vh = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        kh = _gather(k_cache, view.block_table).unsqueeze(0)  # [1, Hkv, L, D]
        vh = _gather(v_cache, view.block_table).unsqueeze(0)
        o = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=view.mask, scale=scale, enable_gqa=gqa
        )
    return o.squeeze(0).transpose(0, 1)
