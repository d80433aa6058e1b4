"""One turn of attention's online softmax, shared by the Triton decode and prefill kernels.

A program holds a tile of query rows q [R, D] and its running state: each row's max m [R],
sum of exponentials l_sum [R] and weighted values acc [R, D], all fp32 (as FlashAttention's).
A turn reads the keys and values at `rows` (each position's first element in the pools,
[N]), scores them, keeps the scores where `seen` ([R, N] or [1, N]) and folds them into the
state. A row that has seen no key yet takes its shift as 0, not -inf, so no NaN: its state
stays empty until a key it sees comes.
"""

from __future__ import annotations

import triton
import triton.language as tl


def at_least_16(n: int) -> int:
    """A tile side: a power of two, 16 or more (`tl.dot`'s smallest)."""
    return max(16, int(triton.next_power_of_2(n)))


@triton.jit  # type: ignore[untyped-decorator]  # triton's decorator is untyped
def attend_keys(  # type: ignore[no-untyped-def]
    q, k_ptr, v_ptr, rows, kv_mask, d, seen, m, l_sum, acc, scale,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if UPCAST:  # the interpreter's bf16 tiles (see paged_decode_triton.py)
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # [R, N]
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - shift)
    p = tl.exp(s - shift[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_sum, acc
