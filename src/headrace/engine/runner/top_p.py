"""top_p (nucleus) sets without sorting the vocabulary: each row's smallest set of likeliest
tokens whose mass reaches p (at least one token), with torch: the sampler's way on CUDA and
without a C compiler (on the CPU, kernels/sample_draw.c finds the set and draws in one go, by
the same rule, ties at the edge by id).

The set is a prefix of the row sorted by probability, so nothing sorts all 262k. torch looks
among a row's TOP_P_FIRST likeliest first (`topk`) and buckets only a row whose set is larger
(`_wide_row`): tokens bucketed by probability, a quarter octave a bucket below the row's
largest (every token of a bucket likelier than the next bucket's); the buckets before the one
where the mass nears p are kept whole, the one or two at the edge sorted, the rest dropped.
The kept set is the one a full sort keeps, with "reaches p" read to 1e-6 of the mass, the
float32 logits' own precision (0.5 + 0.3 reaches 0.8 though their logs round apart); ties at
the edge are kept in either order. Sorting every row took 680 ms for 32
rows of Gemma 3 logits on a 2-core EPYC; bench/sampler_top_p.py times the ways and
tests/engine/runner/test_sampler_top_p.py compares them with it on rows from one likely token to
~19k.

Shapes: x [R, V] float32 logits over T -> the sets of the rows with p < 1 as a table [R', W]
in vocabulary order (the sampler's inverse CDF runs on it as on a whole row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headrace.kernels.host_copy import to_device

TOP_P_FIRST = 1024  # the least partial sort of a row
BUCKETS_PER_NAT = 4 / math.log(2)  # quarter octaves of probability


@dataclass(frozen=True)
class TopPSets:
    rows: list[int]  # the rows of x with p < 1
    ids: torch.Tensor  # [R', W] int64 token ids, ascending; padding repeats a kept id
    logits: torch.Tensor  # [R', W] float32 their logits; -inf in padding


def top_p_mask(x: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """x with each top_p row's tokens outside its set at -inf (a new tensor when any)."""
    sets = top_p_sets(x, ps)
    if sets is None:
        return x
    out = x.clone()
    rows = to_device(sets.rows, x.device, torch.int64)
    out[rows] = float("-inf")
    flat = (rows[:, None] * x.shape[1] + sets.ids).flatten()
    real = sets.logits.flatten() > float("-inf")
    out.view(-1)[flat[real]] = sets.logits.flatten()[real]
    return out


def top_p_sets(x: torch.Tensor, ps: list[float]) -> TopPSets | None:
    """The set of every row with p < 1 (None: no such row)."""
    rows = [i for i, p in enumerate(ps) if p < 1.0]
    if not rows:
        return None
    sub = x if len(rows) == len(x) else x.index_select(0, to_device(rows, x.device, torch.int64))
    return _by_topk(rows, sub, ps)


def _by_topk(rows: list[int], sub: torch.Tensor, ps: list[float]) -> TopPSets:
    """torch alone (CUDA, or no C compiler): the first TOP_P_FIRST by `topk`, `_wide_row`
    for a row whose set is larger."""
    vocab, x = sub.shape[1], sub
    top = sub.amax(dim=-1, keepdim=True)  # [R', 1]
    # float32's cascade sum: ~1e-7 of the mass, inside the 1e-6 rule
    total = torch.exp(sub - top).sum(dim=-1).double()  # [R'] in units of the largest's
    goal = to_device([ps[i] for i in rows], x.device, torch.float64) * total
    slack = 1e-6 * total
    vals, ids = sub.topk(min(vocab, TOP_P_FIRST), dim=-1)  # [R', K]
    mass = torch.exp(vals.double() - top.double())
    cum = mass.cumsum(dim=-1)
    kept = (cum - mass) < (goal - slack)[:, None]  # the exclusive mass before each token
    kept[:, 0] = True
    wide = ((cum[:, -1] < goal) & (vals.shape[1] < vocab)).nonzero().flatten().tolist()
    ids, vals = _in_vocab_order(ids, vals.masked_fill(~kept, float("-inf")), vocab)
    own = {j: _wide_row(sub[j], float(top[j]), float(goal[j]), float(slack[j])) for j in wide}
    width = max([vals.shape[1]] + [len(i) for i, _ in own.values()])
    if width == vals.shape[1]:
        return TopPSets(rows, ids, vals)
    table = torch.full((len(rows), width), float("-inf"), device=x.device)
    table[:, : vals.shape[1]] = vals
    table_ids = ids[:, :1].expand(-1, width).clone()  # padding: a kept id of the row
    table_ids[:, : ids.shape[1]] = ids
    for j, pair in own.items():
        _put(table, table_ids, j, pair)
    return TopPSets(rows, table_ids, table)


def _put(
    table: torch.Tensor, ids: torch.Tensor, j: int, pair: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Row j of the table: the set's logits and ids, then padding (-inf, its first id)."""
    n = len(pair[0])
    table[j, :n], ids[j, :n] = pair[1], pair[0]
    table[j, n:] = float("-inf")
    ids[j, n:] = pair[0][0]


def _in_vocab_order(
    ids: torch.Tensor, logits: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] each: kept tokens sorted by id (a draw's inverse CDF is then the whole row's),
    padding (-inf) last with a kept id of its row."""
    key, order = ids.masked_fill(logits == float("-inf"), vocab).sort(dim=-1)
    return torch.where(key == vocab, key[:, :1], key), logits.gather(1, order)


def _wide_row(
    x: torch.Tensor, top: float, goal: float, slack: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [V] one row's logits, top its largest, goal the mass its set reaches (in units of
    exp(top)) -> the kept (ids, logits). Tokens are bucketed by probability (quarter octaves
    below the largest: a bucket's tokens all likelier than the next bucket's); the buckets
    before the one where the mass nears the goal are kept whole, only the one or two at the
    edge are sorted."""
    gap = x - top  # [V] <= 0
    weight = torch.exp(gap)
    bucket = (gap * -BUCKETS_PER_NAT).clamp_(0, 255).to(torch.int64)
    hist = torch.zeros(256, device=x.device).scatter_add_(0, bucket, weight).cumsum(0)
    # the float32 histogram is off by far less than 1e-4 of the mass
    first = int((hist < goal * (1 - 1e-4)).sum())  # buckets before it: surely kept
    last = min(int((hist < goal * (1 + 1e-4)).sum()), 255)  # buckets after it: surely not
    sure = (bucket < first).nonzero().flatten()
    edge = ((bucket >= first) & (bucket <= last)).nonzero().flatten()
    vals, order = x[edge].sort(descending=True)
    mass = torch.exp(vals.double() - top)
    before = float(weight[sure].double().sum()) + mass.cumsum(0) - mass
    kept = before < goal - slack
    if not len(sure):
        kept[0] = True
    ids, order = torch.cat([sure, edge[order[kept]]]).sort()  # in vocabulary order
    return ids, torch.cat([x[sure], vals[kept]])[order]
