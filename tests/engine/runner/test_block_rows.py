"""The decodes' block tables kept between steps (runner/block_rows.py): after any sequence of
tables that grow, get cut or are made again, a step's gathered table equals the one built
afresh from its lists; bad block ids are refused when written; finished rows are let go."""

from __future__ import annotations

import random

import pytest

from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.block_rows import BlockRows
from headrace.request import SamplingParams

BS = 4
PARAMS = SamplingParams()


def _decode(rid: str, pos: int, blocks: list[int], epoch: int) -> ScheduledRequest:
    return ScheduledRequest(rid, [3], pos, blocks, True, PARAMS, 0, table_epoch=epoch)


def _expected(decodes: list[ScheduledRequest]) -> list[list[int]]:
    rows = [d.block_ids[: d.start_pos // BS + 1] for d in decodes]
    width = max(len(r) for r in rows)
    return [r + [0] * (width - len(r)) for r in rows]


def _gather(rows: BlockRows, decodes: list[ScheduledRequest]) -> list[list[int]]:
    table: list[list[int]] = rows.gather(decodes, [d.start_pos + 1 for d in decodes], BS).tolist()
    return table


def test_gathered_tables_match_fresh_ones_through_growth_cuts_and_preemptions() -> None:
    rng = random.Random(0)
    bm = BlockManager(num_blocks=600, block_size=BS)
    rows = BlockRows(num_kv_blocks=600)
    tokens: dict[str, int] = {}  # request -> tokens with KV entries
    for step in range(400):
        for rid in list(tokens):
            roll = rng.random()
            if roll < 0.03:  # preempted: its table is made again later, of other blocks
                bm.free(rid)
                tokens[rid] = 0
            elif roll < 0.05:  # finished
                bm.free(rid)
                del tokens[rid]
                rows.drop([rid])
        while len(tokens) < 12:
            tokens[f"r{step}-{len(tokens)}"] = 0
        decodes, drafted = [], {}
        for rid in tokens:
            if tokens[rid] == 0:  # a prompt computed in an earlier step
                tokens[rid] = rng.randint(1, 3 * BS)
                assert bm.allocate(rid, tokens[rid]) is not None
            # the next token and its drafts (a speculative step), as the scheduler allocates
            drafted[rid] = rng.choice([0, 0, BS, 2 * BS])
            assert bm.allocate(rid, tokens[rid] + 1 + drafted[rid]) is not None
            decodes.append(_decode(rid, tokens[rid], bm.block_table(rid), bm.table_epoch(rid)))
        assert _gather(rows, decodes) == _expected(decodes)
        for rid in tokens:  # some drafts accepted; the rejected ones' blocks given back
            tokens[rid] += 1 + rng.randint(0, drafted[rid])
            bm.trim(rid, tokens[rid])
    assert len(rows) == len(tokens)
    rows.drop(list(tokens))
    assert len(rows) == 0


def test_epoch_zero_rewrites_the_row_every_step() -> None:
    rows = BlockRows()
    assert _gather(rows, [_decode("a", 5, [7, 8], 0)]) == [[7, 8]]
    # the same length, other blocks: without an epoch nothing says so but the row is rewritten
    assert _gather(rows, [_decode("a", 5, [9, 10], 0)]) == [[9, 10]]


def test_a_shorter_table_under_the_same_epoch_is_rewritten() -> None:
    rows = BlockRows()
    assert _gather(rows, [_decode("a", 9, [1, 2, 3], 5)]) == [[1, 2, 3]]
    assert _gather(rows, [_decode("a", 5, [4, 5], 5)]) == [[4, 5]]


def test_a_block_outside_the_pool_is_refused_when_written() -> None:
    rows = BlockRows(num_kv_blocks=10)
    with pytest.raises(ValueError, match="request b: block id outside the KV pool"):
        _gather(rows, [_decode("a", 1, [3], 1), _decode("b", 5, [4, 10], 2)])
    with pytest.raises(ValueError, match="request c: block id outside"):
        _gather(rows, [_decode("c", 1, [-1], 3)])
    assert _gather(rows, [_decode("a", 5, [3, 9], 1)]) == [[3, 9]]  # a's new block is fine


def test_rows_and_width_grow_and_dropped_rows_are_reused() -> None:
    rows = BlockRows()
    many = [_decode(f"r{i}", 40 * BS, list(range(i, i + 41)), i + 1) for i in range(40)]
    assert _gather(rows, many) == _expected(many)
    assert rows.table.shape[0] >= 40 and rows.table.shape[1] >= 41
    shape = rows.table.shape
    rows.drop([d.request_id for d in many])
    assert len(rows) == 0
    again = [_decode(f"s{i}", 3, [i], 100 + i) for i in range(40)]
    assert _gather(rows, again) == _expected(again)
    assert rows.table.shape == shape  # the freed rows served the new requests
