"""The store behind `previous_response_id`: per tenant, bounded by count and by age."""

from __future__ import annotations

from headrace.api.response_store import ResponseStore

CONVERSATION = [{"role": "user", "content": "hi"}]


def test_a_tenant_reads_only_its_own() -> None:
    store = ResponseStore()
    store.put("alice", "r1", CONVERSATION)
    stored = store.get("alice", "r1")
    assert stored is not None and stored.messages == CONVERSATION
    assert store.get("bob", "r1") is None


def test_each_tenant_keeps_its_newest_responses() -> None:
    store = ResponseStore(max_per_tenant=3)
    for i in range(5):
        store.put("alice", f"r{i}", CONVERSATION)
    store.put("bob", "b", CONVERSATION)
    assert [store.get("alice", f"r{i}") is not None for i in range(5)] == [False, False] + [
        True
    ] * 3
    assert store.get("bob", "b") is not None and len(store) == 4  # alice's did not push bob's out


def test_responses_expire() -> None:
    now = [0.0]
    store = ResponseStore(ttl_s=60, clock=lambda: now[0])
    store.put("alice", "old", CONVERSATION)
    now[0] = 30
    store.put("alice", "new", CONVERSATION)
    now[0] = 61
    assert store.get("alice", "old") is None and store.get("alice", "new") is not None


def test_a_tenants_share_is_bounded_in_bytes() -> None:
    store = ResponseStore(max_bytes_per_tenant=220)
    for i in range(4):
        store.put("alice", f"r{i}", [{"role": "user", "content": "x" * 60}])
    kept = [i for i in range(4) if store.get("alice", f"r{i}") is not None]
    assert kept == [2, 3]  # about 100 bytes each: the newest two fit
    store.put("alice", "huge", [{"role": "user", "content": "x" * 500}])
    assert store.get("alice", "huge") is None and store.get("alice", "r3") is not None
