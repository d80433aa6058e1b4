"""The block manager with prefix caching: hits, partial hits, eviction order, shared blocks."""

from __future__ import annotations

import pytest

from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.kv.prefix_cache import block_hash, root_hash

BS = 4


def _computed(bm: BlockManager, rid: str, tokens: list[int], salt: str = "t") -> None:
    """Allocate and "compute" all of `tokens` for `rid`, caching its full blocks."""
    assert bm.allocate(rid, len(tokens)) is not None
    bm.cache_computed(rid, tokens, len(tokens), salt)


def test_a_repeated_prompt_hits_its_full_blocks_but_leaves_the_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_caching=True)
    prompt = list(range(10, 22))  # 12 tokens: 3 full blocks
    _computed(bm, "a", prompt)
    table_a = bm.block_table("a")
    bm.free("a")
    bm.check_invariants({})
    assert bm.num_free_blocks == 16 and bm.num_cached_blocks == 3
    # The whole prompt is cached, but one token must be computed: 2 blocks hit, not 3.
    assert bm.match("b", prompt, "t") == 8
    assert bm.block_table("b") == table_a[:2]
    bm.check_invariants({"b": 8})
    # One more token and the third block hits too.
    bm.free("b")
    assert bm.match("c", prompt + [99], "t") == 12
    assert bm.block_table("c") == table_a
    bm.check_invariants({"c": 12})


def test_partial_hit_stops_at_the_first_different_block() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_caching=True)
    _computed(bm, "a", list(range(16)))
    other = list(range(8)) + [100, 101, 102, 103] + list(range(12, 20))
    assert bm.match("b", other, "t") == 8
    # Same tokens after a different block: still a miss (the chain carries the prefix).
    assert bm.match("c", [7, 7, 7, 7] + list(range(4, 16)) + [0], "t") == 0
    assert bm.block_table("c") == []
    bm.check_invariants({"a": 16, "b": 8})


def test_salts_never_share_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_caching=True)
    prompt = list(range(13))
    _computed(bm, "a", prompt, salt="tenant-a")
    assert bm.match("b", prompt, "tenant-b") == 0
    assert bm.match("a2", prompt, "tenant-a") == 12
    assert root_hash("x") != root_hash("y")
    assert block_hash(root_hash("x"), [1, 2]) != block_hash(root_hash("y"), [1, 2])


def test_shared_blocks_are_counted_and_survive_one_owner_leaving() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_caching=True)
    prompt = list(range(9))
    _computed(bm, "a", prompt)  # 3 blocks, 2 full
    assert bm.match("b", prompt, "t") == 8
    assert bm.allocate("b", 9) is not None  # its own third block
    shared = bm.block_table("a")[:2]
    assert bm.block_table("b")[:2] == shared
    assert bm.num_used_blocks == 4
    assert bm.num_freeable("a") == 1 and bm.num_freeable("b") == 1
    bm.check_invariants({"a": 9, "b": 9})
    bm.free("a")  # an abort of one sharer
    assert bm.num_used_blocks == 3  # the shared blocks stay with b
    bm.check_invariants({"b": 9})
    bm.free("b")
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 2
    bm.check_invariants({})


def test_eviction_takes_never_used_blocks_first_then_least_recently_parked() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS, enable_caching=True)
    first, second = [1] * 8 + [0], [2] * 8 + [0]
    _computed(bm, "first", first)  # 3 blocks, 2 cached
    _computed(bm, "second", second)  # 3 blocks, 2 cached
    bm.free("first")
    bm.free("second")
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 4
    # The two partial blocks are plain free blocks: taken before any cached one.
    assert bm.allocate("x", 8) is not None
    assert bm.num_cached_blocks == 4
    # Next, the least recently parked: "first"'s blocks, its tail block first.
    assert bm.allocate("y", 4) is not None
    assert bm.match("probe", first, "t") == 4  # its first block is still there
    bm.free("probe")
    assert bm.match("probe", second, "t") == 8
    bm.check_invariants({"x": 8, "y": 4, "probe": 8})


def test_a_hit_takes_its_block_out_of_the_evictable_pool() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, enable_caching=True)
    prompt = [5] * 8 + [6]
    _computed(bm, "a", prompt)
    bm.free("a")
    assert bm.match("b", prompt, "t") == 8
    assert bm.num_free_blocks == 2  # the two hit blocks are owned now
    assert bm.allocate("c", 12) is None  # would need 3
    assert bm.allocate("c", 8) is not None
    bm.check_invariants({"b": 8, "c": 8})


def test_a_block_computed_twice_stays_private_the_second_time() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_caching=True)
    prompt = [3] * 8 + [4]
    _computed(bm, "a", prompt)
    _computed(bm, "b", prompt)  # computed at the same time: no hit was possible
    assert bm.num_cached_blocks == 2
    bm.free("a")
    bm.free("b")
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 8
    bm.check_invariants({})


def test_without_caching_nothing_matches_or_is_kept() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    _computed(bm, "a", list(range(9)))
    bm.free("a")
    assert bm.match("b", list(range(9)), "t") == 0 and bm.num_cached_blocks == 0
    bm.check_invariants({})


def test_invariants_catch_a_wrong_reference_count_and_a_parked_owned_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_caching=True)
    _computed(bm, "a", list(range(9)))
    bm._refs[bm.block_table("a")[0]] += 1
    with pytest.raises(AssertionError, match="leaked"):
        bm.check_invariants()
    bm = BlockManager(num_blocks=8, block_size=BS, enable_caching=True)
    _computed(bm, "a", list(range(9)))
    assert bm.cache is not None
    bm.cache._parked[bm.block_table("a")[0]] = None
    with pytest.raises(AssertionError, match="parked"):
        bm.check_invariants()
