from __future__ import annotations

import pytest

from headrace.engine.kv.block_manager import BlockManager, blocks_for


def test_allocate_grows_and_free_returns_everything() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.allocate("a", 5) is not None  # 2 blocks
    assert bm.allocate("a", 8) == []  # still 2 blocks
    grown = bm.allocate("a", 9)
    assert grown is not None and len(grown) == 1
    assert bm.allocate("b", 16) is not None
    assert bm.num_free_blocks == 1
    bm.check_invariants({"a": 9, "b": 16})
    assert bm.free("a") == 3
    assert bm.num_free_blocks == 4
    bm.check_invariants({"b": 16})


def test_does_not_fit_answers_none_and_changes_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate("a", 12) is not None
    before = bm.block_table("a")
    assert bm.allocate("a", 17) is None
    assert bm.allocate("b", 8) is None
    assert bm.block_table("a") == before and bm.block_table("b") == []
    assert bm.num_free_blocks == 1
    assert bm.max_tokens_fitting("a") == 16
    bm.check_invariants({"a": 12})


def test_invariants_catch_double_ownership_leaks_and_short_tables() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.allocate("a", 4)
    bm._tables["b"] = [bm._tables["a"][0]]  # corrupt on purpose
    with pytest.raises(AssertionError, match="owned by"):
        bm.check_invariants()
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.allocate("a", 4)
    bm._tables["a"].pop()  # a block neither free nor owned
    with pytest.raises(AssertionError, match="leaked"):
        bm.check_invariants()
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.allocate("a", 2)
    with pytest.raises(AssertionError, match="1 blocks for 3"):
        bm.check_invariants({"a": 3})
    with pytest.raises(AssertionError, match="does not run"):
        bm.check_invariants({})


def test_blocks_for_rounds_up() -> None:
    assert [blocks_for(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_trim_gives_back_the_blocks_past_a_length() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.allocate("a", 13) is not None  # 4 blocks: a speculative step's drafts
    kept = bm.block_table("a")[:2]
    assert bm.trim("a", 6) == 2  # 6 tokens need 2 blocks
    assert bm.block_table("a") == kept
    assert bm.num_free_blocks == 6
    bm.check_invariants({"a": 6})
    assert bm.trim("a", 8) == 0
    assert bm.trim("nobody", 0) == 0


def test_a_table_keeps_its_epoch_while_it_only_grows_at_its_end() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, enable_caching=True)
    assert bm.table_epoch("a") == 0  # no table
    bm.allocate("a", 5)
    first = bm.table_epoch("a")
    bm.allocate("a", 12)  # grown at its end: the same epoch
    assert bm.table_epoch("a") == first
    bm.trim("a", 12)  # nothing cut: the same
    assert bm.table_epoch("a") == first
    bm.trim("a", 5)  # cut: a reader's copy is stale
    cut = bm.table_epoch("a")
    assert cut not in (0, first)
    bm.allocate("b", 4)
    assert bm.table_epoch("b") not in (0, first, cut)  # epochs are never shared
    bm.free("a")
    assert bm.table_epoch("a") == 0
    bm.allocate("a", 4)  # made again (as after a preemption): a new epoch
    assert bm.table_epoch("a") not in (0, first, cut)
    bm.check_invariants({"a": 4, "b": 4})


def test_a_table_found_in_the_prefix_cache_has_an_epoch() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, enable_caching=True)
    prompt = list(range(13))
    bm.allocate("a", 13)
    bm.cache_computed("a", prompt, 12, "t")
    assert bm.match("b", prompt, "t") == 12
    assert bm.table_epoch("b") not in (0, bm.table_epoch("a"))
    bm.check_invariants()
