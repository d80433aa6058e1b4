"""Causal self-attention of a chunk that starts its sequence, as blocked matmuls (CPU, bf16).

torch's CPU flash kernel for `scaled_dot_product_attention` runs bf16 at about a fifth of the
matmul rate here and does not skip the masked half of a causal chunk (Gemma 3 270M, 4 query
heads on 1 KV head of 256: 1.8 ms for 256 tokens). Blocks of 128 queries against the keys up
to the block's end, through oneDNN matmuls with the softmax in fp32, take 0.8 ms (2.05x at
256 tokens, 2.79x at 512, 2.13x at 2,048; `bench/kernels.py --only causal`). The query heads
that share a KV head become rows of one matmul, so the KV is never repeated.

Shapes: q [n, Hq, D], k / v [n, Hkv, D] -> [n, Hq, D].
"""

from __future__ import annotations

import torch

BLOCK = 128  # queries per block: measured best of 64 / 128 / 256 at 128-2,048 tokens

_masks: dict[int, torch.Tensor] = {}


def use_blocked(q: torch.Tensor) -> bool:
    """Where this path is taken: reduced precision on the CPU (fp32 keeps SDPA, which the
    exactness tests pin against `transformers`)."""
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


def _causal_mask(m: int) -> torch.Tensor:
    """[m, 1, m] additive fp32: 0 on and below the diagonal, -inf above."""
    mask = _masks.get(m)
    if mask is None:
        mask = torch.full((m, m), float("-inf")).triu_(1).view(m, 1, m)
        _masks[m] = mask
    return mask


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    out = torch.empty_like(q)
    qs = q * scale
    for h in range(hkv):
        heads = slice(h * g, (h + 1) * g)
        qh = qs[:, heads]  # [n, G, D]: a view; reshaped per block (a copy only if Hkv > 1)
        kt = k[:, h].t()  # [D, n]
        vh = v[:, h]  # [n, D]
        for s in range(0, n, BLOCK):
            e = min(n, s + BLOCK)
            m = e - s
            scores = torch.matmul(qh[s:e].reshape(m * g, d), kt[:, :e]).view(m, g, e).float()
            scores[:, :, s:e].add_(_causal_mask(m))
            p = torch.softmax(scores, -1).to(q.dtype).view(m * g, e)
            out[s:e, heads] = torch.matmul(p, vh[:e]).view(m, g, d)
    return out
