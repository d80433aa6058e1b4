"""A screened top_p row's head and exact logits of chosen tokens (screened_row.c), for
engine/runner/screened_top_p.py.

Shapes: ub, lb [V] fp32 (one row of the int8 head's bounds; scaled in place by 1 / T) -> the
head's ids [K <= most] (whole buckets of 1/16 nat below the row's largest ub) and the tail's
exp(ub / T - top), exp(lb / T - top) [V] with 0 on the head; x [H] fp32, ids [n] -> x . w_id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headrace.kernels.build import cpu_kernels


@dataclass(frozen=True)
class RowHead:
    head: torch.Tensor  # [K] int64 ids, ascending
    tail_eu: torch.Tensor  # [V] fp32 exp(u - top), 0 on the head
    tail_ew: torch.Tensor  # [V] fp32 exp(w - top), 0 on the head
    top: float  # max u
    tail_top: float  # max u off the head (-inf: no tail)
    total: float  # sum exp(u - top) over the row
    on_head: float  # ... over the head
    tail_hi: float  # ... over the tail
    tail_lo: float  # sum exp(w - top) over the tail


def row_head(ub: torch.Tensor, lb: torch.Tensor, inv_t: float, most: int) -> RowHead:
    """ub, lb [V] fp32 contiguous, both scaled by inv_t in place (they become u and w)."""
    lib = cpu_kernels()
    assert lib is not None and ub.is_contiguous() and lb.is_contiguous()
    v = len(ub)
    eu, ew = torch.empty(v), torch.empty(v)
    head = torch.empty(v, dtype=torch.int64)
    bucket = torch.empty(v, dtype=torch.int16)
    f, d = torch.empty(2), torch.empty(4, dtype=torch.float64)
    n = lib.screened_row_head(
        ub.data_ptr(), lb.data_ptr(), v, inv_t, most, eu.data_ptr(), ew.data_ptr(),
        head.data_ptr(), bucket.data_ptr(), f.data_ptr(), d.data_ptr(),
    )  # fmt: skip
    top, tail_top = f.tolist()
    total, on_head, tail_hi, tail_lo = d.tolist()
    return RowHead(head[:n], eu, ew, top, tail_top, total, on_head, tail_hi, tail_lo)


def rows_dot(x: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """x [H] fp32, weight [V, H] bf16 (unit stride along H), ids [n] int64 -> [n] fp32."""
    lib = cpu_kernels()
    assert lib is not None and weight.dtype == torch.bfloat16 and weight.stride(1) == 1
    x = x.contiguous()
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(len(ids))
    lib.rows_dot_bf16(
        x.data_ptr(), x.shape[0], weight.data_ptr(), weight.stride(0), ids.data_ptr(), len(ids),
        out.data_ptr(),
    )  # fmt: skip
    return out
