"""How often each token stands in each row's history, counted on the device: the penalties'
counts with no read on the host, and with the token of a step still in flight.

The sparse way (logits_processors.distinct_pairs) finds the distinct (row, token) pairs with
`torch.unique`, whose output size the host must read, so on CUDA it waits for the device, and
a step launched ahead of its tokens (--async-scheduling) cannot hold it. Here the counts are a
dense [R, V] table filled by one `index_put_` (accumulate), a shape known beforehand; a
history that ends in a placeholder (PENDING_TOKEN: the launched step's token, not yet read)
takes that token from the step's ids on the device (`last`).

Shapes: ids R lists of token ids, last [R] int64 or None -> counts [R, V] float32 (exact
integers). Memory: 1 MiB a row at Gemma 3's 262k: only the rows with that penalty are counted,
32 at a time (a few [32, V] temporaries, beside a KV pool sized at start).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

import torch

from headrace.kernels.host_copy import to_device


def token_counts(
    ids: list[list[int]], vocab: int, device: torch.device, last: torch.Tensor | None = None
) -> torch.Tensor:
    """[R, V] float32: row r's count of each token in ids[r]; a negative id (a placeholder)
    is last[r]; ids outside the vocabulary are not counted."""
    counts = torch.zeros(len(ids), vocab, device=device)
    flat = list(chain.from_iterable(ids))
    if not flat:
        return counts
    toks = to_device(flat, device, torch.int64)  # [N]
    rows = to_device([r for r, x in enumerate(ids) for _ in x], device, torch.int64)  # [N]
    if last is not None:
        toks = torch.where(toks < 0, last.index_select(0, rows), toks)
    inside = (toks >= 0) & (toks < vocab)
    counts.index_put_((rows, toks.clamp(0, vocab - 1)), inside.to(counts.dtype), accumulate=True)
    return counts


ROWS_AT_ONCE = 32


def repetition_on_device(
    logits: torch.Tensor, penalties: list[float], ids: list[list[int]], last: torch.Tensor | None
) -> None:
    """logits [R, V] in place: each token of row r's ids (prompt + output), l / r_r where
    l > 0, else l * r_r (logits_processors.repetition_penalty's rule)."""
    for chunk, idx in _chunks([i for i, r in enumerate(penalties) if r != 1], logits.device):
        seen = token_counts([ids[i] for i in chunk], logits.shape[1], logits.device, _at(last, idx))
        r = to_device([penalties[i] for i in chunk], logits.device, logits.dtype)[:, None]
        x = logits.index_select(0, idx)  # [C, V]
        logits.index_copy_(0, idx, torch.where(seen > 0, torch.where(x > 0, x / r, x * r), x))


def frequency_presence_on_device(
    logits: torch.Tensor,
    frequency: list[float],
    presence: list[float],
    ids: list[list[int]],
    last: torch.Tensor | None,
) -> None:
    """logits [R, V] in place: l - c * f_r - p_r for each token counted c > 0 times in row
    r's ids (logits_processors.frequency_presence's rule, the same sums)."""
    used = [i for i, (f, p) in enumerate(zip(frequency, presence, strict=True)) if f or p]
    for chunk, idx in _chunks(used, logits.device):
        c = token_counts([ids[i] for i in chunk], logits.shape[1], logits.device, _at(last, idx))
        f = to_device([frequency[i] for i in chunk], logits.device, logits.dtype)[:, None]
        p = to_device([presence[i] for i in chunk], logits.device, logits.dtype)[:, None]
        present = (c > 0).to(logits.dtype).mul_(p)
        x = logits.index_select(0, idx)
        logits.index_copy_(0, idx, x.sub_(c.mul_(f).add_(present)))


def _chunks(rows: list[int], device: torch.device) -> Iterator[tuple[list[int], torch.Tensor]]:
    for start in range(0, len(rows), ROWS_AT_ONCE):
        chunk = rows[start : start + ROWS_AT_ONCE]
        yield chunk, to_device(chunk, device, torch.int64)


def _at(last: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if last is None else last.index_select(0, idx)
