"""How often each token stands in each row's history, counted on the device: the penalties'
counts with no read on the host, and with the token of a step still in flight.

The sparse way (logits_processors.distinct_pairs) finds the distinct (row, token) pairs with
`torch.unique`, whose output size the host must read, so on CUDA it waits for the device, and
a step launched ahead of its tokens (--async-scheduling) cannot hold it. Here the counts are a
dense [R, V] table filled by one `index_put_` (accumulate), a shape known beforehand; a
history that ends in a placeholder (PENDING_TOKEN: the launched step's token, not yet read)
takes that token from the step's ids on the device (`last`).

Shapes: ids R lists of token ids, last [R] int64 or None -> counts [R, V] float32 (exact
integers). Memory: 1 MiB a row at Gemma 3's 262k; only rows with a penalty come here.
"""

from __future__ import annotations

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
