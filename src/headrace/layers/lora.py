"""The LoRA term of one projection, per row segment of a mixed batch (Punica's SGMV, in torch).

A step's rows belong to requests of the base model and of several adapters. The runner sets
`LoraBatch.groups` before each forward: for each adapter in the step, its rows (a slice when
they are contiguous, as they are for one request, else an index). Every LoRA'd projection then
adds `(x[rows] @ A) @ B` to its output rows, B already scaled by the adapter's alpha / r; the
base rows cost nothing.
"""

from __future__ import annotations

import torch

Rows = slice | torch.Tensor  # contiguous rows, or an int64 index [n]


class LoraBatch:
    """Which rows of the step now running belong to which adapter; owned by the runner's
    adapter manager and shared (read-only) by every projection's `LoraDelta`."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, Rows]] = []  # (adapter id, its rows)


class LoraDelta:
    """The adapters' weights for one (merged) projection, applied to the rows of each."""

    def __init__(self, batch: LoraBatch) -> None:
        self.batch = batch
        # adapter id -> A [in, R], B [R, sum(out)] (zero where a merged part has no LoRA)
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] += the LoRA term of every row whose adapter touches this projection."""
        for adapter_id, rows in self.batch.groups:
            w = self.weights.get(adapter_id)
            if w is None:
                continue
            a, b = w
            if isinstance(rows, slice):
                y[rows] += (x[rows] @ a) @ b  # [n, in] @ [in, R] @ [R, out]
            else:
                y.index_add_(0, rows, (x.index_select(0, rows) @ a) @ b)
        return y
