"""Table epochs: a number that stays the same for as long as a request's block table only
grows at its end, and is new whenever the table is made, made again or cut. A reader that
keeps a copy of a table (the runner's decode rows, runner/block_rows.py) appends the new
blocks while the epoch holds and copies the whole table when it does not.

One count for the process, not one per block manager: a runner may serve several in turn (the
offline LLM, the tests, the harness) and must never see one epoch stand for two tables."""

from __future__ import annotations

import itertools

_EPOCHS = itertools.count(1)


def new_table_epoch() -> int:
    """An epoch no table of this process had."""
    return next(_EPOCHS)
