"""The LoRA term of one projection, per row segment of a mixed batch (Punica's SGMV and BGMV,
in torch).

A step's rows belong to requests of the base model and of several adapters. The runner sets
`LoraBatch.groups` before each forward: for each adapter in the step, its rows (a slice when
they are contiguous, as they are for one request, else an index). Every LoRA'd projection then
adds `(x[rows] @ A) @ B` to its output rows, B already scaled by the adapter's alpha / r; the
base rows cost nothing.

With many adapters in one step (GATHER_MIN_GROUPS or more: decode rows of as many tenants'
fine-tunes), two matmuls per adapter per projection cost more in calls than in arithmetic
(32 adapters of Gemma 3 270M: 8,064 matmuls a step, 4.5x a plain step). Then each row's A and B
are gathered from the projection's stack of every adapter (zero-padded to the largest rank:
the padding adds exact zeros) and two batched matmuls compute every row's term at once.

In bf16 on the CPU one C call per projection does it all instead (kernels/lora_sgmv.py): each
adapter's weights read in place once a step, whatever the number of adapters and rows.
"""

from __future__ import annotations

import torch

from headrace.kernels import lora_sgmv
from headrace.kernels.host_copy import to_device

Rows = slice | torch.Tensor  # contiguous rows, or an int64 index [n]
# lora_sgmv's view of a step: adapter ids in group order, every adapter row [P] int64, where
# each group's run starts [G + 1] int64, and the rows a step must have (the largest + 1)
Segments = tuple[tuple[int, ...], torch.Tensor, torch.Tensor, int]
GATHER_MIN_GROUPS = 8


class LoraBatch:
    """Which rows of the step now running belong to which adapter; owned by the runner's
    adapter manager and shared (read-only) by every projection's `LoraDelta`."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, Rows]] = []  # (adapter id, its rows)
        # with GATHER_MIN_GROUPS groups or more: every adapter row's index [n] and its
        # adapter's id, group by group (set_rows)
        self.gathered: tuple[torch.Tensor, list[int]] | None = None
        # this step's (rows, slots) per set of stacked adapters: the projections of one set
        # (every projection, for adapters on all seven) share them
        self.slots: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self.segments: Segments | None = None  # on the CPU, for lora_sgmv


class LoraDelta:
    """The adapters' weights for one (merged) projection, applied to the rows of each."""

    def __init__(self, batch: LoraBatch) -> None:
        self.batch = batch
        # adapter id -> A [in, R], B [R, sum(out)] (zero where a merged part has no LoRA)
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # the stack for gathering, built for the adapters of `weights` at the time (ids are
        # never reused, so the ids name the stack): ids, A [S, in, R], B [S, R, out]
        self._stack: tuple[tuple[int, ...], torch.Tensor, torch.Tensor] | None = None
        # adapter id -> packed A, packed B and B's spans for lora_sgmv, where it serves
        self.packed: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        # the step's groups (ids) -> [4, G] addresses and ranks for lora_sgmv.add
        self._pointers: tuple[tuple[int, ...], torch.Tensor] | None = None

    def put(self, adapter_id: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Install an adapter's A [in, R] and scaled B [R, out]."""
        self.weights[adapter_id] = (a, b)
        if lora_sgmv.supported(a, b):
            self.packed[adapter_id] = (lora_sgmv.pack_a(a), *lora_sgmv.pack_b(b))
        self._pointers = None

    def drop(self, adapter_id: int) -> None:
        self.weights.pop(adapter_id, None)
        self.packed.pop(adapter_id, None)
        self._pointers = None

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] += the LoRA term of every row whose adapter touches this projection."""
        segments = self.batch.segments
        if segments is not None and self.packed and lora_sgmv.usable(x, y):
            ids, every_row, off, needed = segments
            if min(x.shape[0], y.shape[0]) < needed:  # the C kernel does not check its rows
                raise ValueError(f"LoRA rows up to {needed - 1} in a step of {x.shape[0]} rows")
            return lora_sgmv.add(x, y, every_row, off, self._pointers_for(ids))
        if self.batch.gathered is not None:
            return self._add_gathered(x, y, *self.batch.gathered)
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

    def _pointers_for(self, ids: tuple[int, ...]) -> torch.Tensor:
        if self._pointers is None or self._pointers[0] != ids:
            table = torch.zeros(4, len(ids), dtype=torch.int64)
            for g, adapter_id in enumerate(ids):
                if adapter_id in self.packed:
                    a, b, spans = self.packed[adapter_id]
                    rank = self.weights[adapter_id][1].shape[0]
                    table[:, g] = torch.tensor([a.data_ptr(), b.data_ptr(), rank, spans.data_ptr()])
            self._pointers = (ids, table)
        return self._pointers[1]

    def _add_gathered(
        self, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, ids: list[int]
    ) -> torch.Tensor:
        stacked, a_all, b_all = self._stacked()
        if stacked not in self.batch.slots:
            slot = {adapter_id: i for i, adapter_id in enumerate(stacked)}
            keep = [k for k, i in enumerate(ids) if i in slot]  # adapters on this projection
            slots = to_device([slot[ids[k]] for k in keep], rows.device, torch.int64)
            kept = (
                rows if len(keep) == len(ids) else rows[to_device(keep, rows.device, torch.int64)]
            )
            self.batch.slots[stacked] = (kept, slots)
        rows, slots = self.batch.slots[stacked]
        a, b = a_all.index_select(0, slots), b_all.index_select(0, slots)  # [n, in, R], [n, R, out]
        term = torch.bmm(torch.bmm(x.index_select(0, rows).unsqueeze(1), a), b)  # [n, 1, out]
        return y.index_add_(0, rows, term.squeeze(1))

    def _stacked(self) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor]:
        ids = tuple(self.weights)
        if self._stack is None or self._stack[0] != ids:
            pairs = list(self.weights.values())
            a0, b0 = pairs[0]
            rank = max(a.shape[1] for a, _ in pairs)
            a_all = a0.new_zeros(len(pairs), a0.shape[0], rank)
            b_all = b0.new_zeros(len(pairs), rank, b0.shape[1])
            for slot, (a, b) in enumerate(pairs):
                a_all[slot, :, : a.shape[1]] = a
                b_all[slot, : b.shape[0]] = b
            self._stack = (ids, a_all, b_all)
        return self._stack
