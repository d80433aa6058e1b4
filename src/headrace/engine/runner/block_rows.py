"""The decodes' block tables, kept on the host from one step to the next.

A decode step reads each sequence's block table. Built afresh, that is every block of every
running request turned from a Python list into int64 and checked against the pool, each
step: 5,000 blocks at 256 streams of 320 tokens, 0.5 ms of host time, growing with the
context. Here each request has a row that is written when its table changes: whole when the
scheduler's `table_epoch` for it is new (its table was made, made again after a preemption,
or cut after rejected drafts), else only the blocks added since (one every `block_size`
tokens). A step's table is then one gather of its rows. A block id is checked against the
pool once, when it is written.

`table_epoch` 0 (a step built by hand, as the tests do) means "unknown": the row is written
whole every time.

Shapes: `table` [rows, width], int64; `gather` returns [B, nb] for B decodes, nb the blocks
of the longest context among them, each row padded with block 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from headrace.engine.outputs import ScheduledRequest


class BlockRows:
    def __init__(self, num_kv_blocks: int | None = None) -> None:
        """`num_kv_blocks`: the pool's size, which every block id must lie within (None: any)."""
        self.num_kv_blocks = num_kv_blocks
        self.table = np.zeros((16, 16), dtype=np.int64)
        self._rows: dict[str, list[int]] = {}  # request id -> [row, epoch, blocks written]
        self._free: list[int] = []
        self._used = 0  # rows handed out so far (freed ones are reused first)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._rows

    def gather(
        self, decodes: Sequence[ScheduledRequest], ends: Sequence[int], block_size: int
    ) -> np.ndarray:
        """Each decode's blocks up to the one holding its last position (`ends`: one past it,
        [B]), as [B, nb], padded with block 0 (which the bounds keep any kernel from reading)."""
        get, rows = self._rows.get, []
        for d in decodes:  # a row as it was (most decodes of most steps): looked up inline
            state = get(d.request_id)
            if (
                state is not None
                and state[1] == d.table_epoch != 0
                and state[2] == len(d.block_ids)
            ):
                rows.append(state[0])
            else:
                rows.append(self._row(d))
        keep = (np.array(ends, dtype=np.int64) + (block_size - 1)) // block_size  # [B]
        width = int(keep.max())
        out = self.table[rows, :width]  # a copy: fancy indexing
        if keep.min() < width:
            out[np.arange(width) >= keep[:, None]] = 0
        return out

    def drop(self, request_ids: Iterable[str]) -> None:
        """Forget finished requests: their rows go to the next new ones."""
        for rid in request_ids:
            state = self._rows.pop(rid, None)
            if state is not None:
                self._free.append(state[0])

    def _row(self, d: ScheduledRequest) -> int:
        state = self._rows.get(d.request_id)
        if state is None:
            state = self._rows[d.request_id] = [self._new_row(), 0, 0]
        row, epoch, written = state
        have = len(d.block_ids)
        if d.table_epoch == 0 or epoch != d.table_epoch or have < written:
            self._write(d, row, 0)
        elif have > written:
            self._write(d, row, written)
        else:
            return row
        state[1], state[2] = d.table_epoch, have
        return row

    def _write(self, d: ScheduledRequest, row: int, start: int) -> None:
        new = np.array(d.block_ids[start:], dtype=np.int64)
        if (
            self.num_kv_blocks is not None
            and new.size
            and not (new.min() >= 0 and new.max() < self.num_kv_blocks)
        ):
            raise ValueError(f"request {d.request_id}: block id outside the KV pool")
        end = start + new.size
        if end > self.table.shape[1]:
            self._grow(self.table.shape[0], max(end, 2 * self.table.shape[1]))
        self.table[row, start:end] = new

    def _new_row(self) -> int:
        if self._free:
            return self._free.pop()
        if self._used == self.table.shape[0]:
            self._grow(2 * self._used, self.table.shape[1])
        self._used += 1
        return self._used - 1

    def _grow(self, rows: int, width: int) -> None:
        table = np.zeros((rows, width), dtype=np.int64)
        old = self.table
        table[: old.shape[0], : old.shape[1]] = old
        self.table = table
