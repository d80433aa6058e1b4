"""top_p sets in fixed shapes, with nothing read on the host: the sampler's way on CUDA.

top_p.py's way reads on the host which rows need more than their 1,024 likeliest tokens, and
a read waits for the device: in a step launched ahead of its tokens (--async-scheduling) it
made the host wait for the step before, so a step with a top_p row never overlapped. Here
every row takes the same ops whatever its logits, so nothing waits and a graph could hold it.

The set is top_p.py's (the likeliest tokens while the mass before each is below p of the
row's, less 1e-6 of it; at least one token; ties at the edge kept by id, as kernels/
sample_draw.c keeps them), found as a threshold by a radix select on mass. Each logit's
float32 bits, read as an int32 ordered like the floats, are the key; three passes over the
row fix the threshold key 12, 12 and 8 bits at a time. A pass sums, per row, the mass of the
tokens still open by their next bits (float64 bins, `scatter_add_`), and keeps the bin where
the mass counted from the top reaches the goal. Every token above the threshold key is kept,
and of those at it (equal logits) as many, by id, as the goal needs. Masses are float64 and
summed in bins rather than in order, so the edge can move only where a token's mass before
it is within ~1e-15 of the goal.

Shapes: x [R, V] float32 logits, ps [R] float -> [R, V], each row with p < 1 at -inf outside
its set (rows with p >= 1 as they are). Work: three passes of [R, V] (topk's partial sort
makes about as many), float64 and int64 temporaries of [32, V] at a time. Timed on a GPU beside
top_p.py's by bench/gpu/device_bench.py; tests/engine/runner/test_sampler_top_p.py holds
both to a float64 full sort.
"""

from __future__ import annotations

import os

import torch

_PASSES = ((20, 12), (8, 12), (0, 8))  # (shift, width) of the key's bits, high to low
# rows cut together: a row's float64 and int64 temporaries are 2 MiB each over Gemma 3's 262k,
# so 32 rows keep the sampler's extra memory near 0.3 GiB beside a KV pool sized at start
ROWS_AT_ONCE = 32


def takes(x: torch.Tensor) -> bool:
    """Whether the sampler draws through fixed shapes: on CUDA, unless HEADRACE_TOP_P=topk
    (top_p.py's way, which reads its wide rows on the host)."""
    return x.is_cuda and os.environ.get("HEADRACE_TOP_P", "") != "topk"


def top_p_cut(x: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    """x [R, V] float32, ps [R] on x's device -> x with each top_p row cut to its set."""
    if len(x) <= ROWS_AT_ONCE:
        return _cut(x, ps)
    return torch.cat([_cut(x[i : i + ROWS_AT_ONCE], ps[i : i + ROWS_AT_ONCE])
                      for i in range(0, len(x), ROWS_AT_ONCE)])  # fmt: skip


def _cut(x: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    top = x.amax(dim=-1, keepdim=True)  # [R, 1]
    mass = torch.exp(x.double() - top.double())  # [R, V] in units of the largest's
    total = mass.sum(dim=-1, keepdim=True)
    # the least positive double: a goal of ~0 (a tiny p) still keeps the likeliest token
    goal = ((ps.double()[:, None] - 1e-6) * total).clamp_min(torch.finfo(torch.float64).tiny)
    key = _ordered(x)  # [R, V] int32, ordered as x
    above = torch.zeros_like(total)  # [R, 1] mass of the keys above the open range
    prefix = torch.zeros_like(top, dtype=torch.int64)  # [R, 1] the key's bits fixed so far
    for i, (shift, width) in enumerate(_PASSES):
        high = key >> shift
        if i == 0:  # signed: offset into [0, 4096), the order kept
            digit, weight = (high + (1 << (width - 1))).long(), mass
        else:
            digit = (high & ((1 << width) - 1)).long()
            weight = mass.masked_fill((high >> width) != prefix, 0.0)
        bins = torch.zeros(len(x), 1 << width, dtype=mass.dtype, device=x.device)
        bins.scatter_add_(1, digit, weight)
        reach = bins.flip(1).cumsum(1).flip(1) + above  # [R, B]: mass from the top to bin b
        # the last bin whose reach is the goal; never below the first (rounding)
        edge = ((reach >= goal).sum(1, keepdim=True) - 1).clamp_min(0)
        above = reach.gather(1, edge) - bins.gather(1, edge)
        first = -(1 << (width - 1)) if i == 0 else 0
        prefix = (prefix << width) + edge + first
    at = key == prefix  # [R, V] the ties at the threshold
    each = mass.masked_fill(~at, 0.0).amax(dim=-1, keepdim=True)  # their one mass
    need = ((goal - above) / each).ceil().clamp_min(1)  # how many of them, by id
    keep = (key > prefix) | (at & (at.cumsum(dim=-1) <= need))
    keep |= (ps >= 1.0)[:, None]
    return x.masked_fill(~keep, float("-inf"))


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """[R, V] float32 -> int32 keys in the floats' order: a negative float's key is minus its
    magnitude's bits, so -0.0 and +0.0 share the key 0 (equal logits, ties kept by id)."""
    bits = x.contiguous().view(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
