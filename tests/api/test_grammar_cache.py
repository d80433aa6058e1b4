"""The front end's grammar cache is bounded by bytes as well as entries: many large distinct
sources stay under the bound, a source over 64 KB is compiled but not kept, failures count."""

from __future__ import annotations

import json
import tracemalloc

from headrace.api.grammar_cache import MAX_BYTES, MAX_ENTRIES, MAX_SOURCE_BYTES, GrammarCache
from headrace.api.structured import StructuredFields, _grammar, grammar_cache, grammar_of


def _regex(i: int, size: int) -> str:
    return f"(x{i}|" + "a" * size + ")"  # a distinct valid regex of about `size` bytes


def test_the_default_bounds() -> None:
    assert MAX_SOURCE_BYTES == 64 << 10 and MAX_ENTRIES <= 512 and MAX_BYTES <= 64 << 20


def test_many_large_distinct_sources_stay_within_the_byte_bound() -> None:
    bound = 4 << 20
    cache = GrammarCache(_grammar, max_bytes=bound)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):  # 200 x (60 KB source + 60 KB grammar): 24 MB unbounded
            grammar, error = cache.get("regex", _regex(i, 60 << 10))
            assert grammar and not error
            assert cache.nbytes <= bound
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= bound + (1 << 20), held  # what is really retained, not only counted
    assert 0 < len(cache) < 200  # bytes, not the entry count, bound it
    assert cache.get("regex", _regex(199, 60 << 10))[0]  # the newest are kept


def test_a_source_over_64_kb_is_not_kept_and_failures_count_in_the_bound() -> None:
    cache = grammar_cache()
    grammar, error = cache.get("regex", _regex(0, MAX_SOURCE_BYTES + 1))
    assert grammar and not error
    assert len(cache) == 0 and cache.nbytes == 0
    _, error = cache.get("regex", "[" + "a" * (30 << 10))  # does not compile: kept, counted
    assert error
    assert len(cache) == 1 and cache.nbytes >= 30 << 10


def test_entries_are_bounded_too_and_grammar_of_uses_the_cache() -> None:
    cache = GrammarCache(_grammar, max_entries=3)
    for i in range(5):
        body = StructuredFields(guided_json=json.dumps({"type": "integer", "minimum": i}))
        first = grammar_of(body, cache)
        assert grammar_of(body, cache) == first
    assert len(cache) == 3
