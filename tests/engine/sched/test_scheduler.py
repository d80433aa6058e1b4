"""Scheduler unit tests on a fake runner; block invariants are checked after every step."""

from __future__ import annotations

import random

import pytest

from headrace.request import FinishReason, RequestStatus


def _add_mixed(engine, make_prompt, n: int, seed: int = 0) -> dict[str, tuple[list[int], dict]]:
    rng = random.Random(seed)
    specs = {}
    for i in range(n):
        prompt = make_prompt(i + 1000 * seed, rng.randint(1, 40))
        kw = {"max_tokens": rng.randint(1, 20), "temperature": 0.0}
        specs[f"r{i}"] = (prompt, kw)
        engine.add(f"r{i}", prompt, **kw)
    return specs


def _assert_solo_outputs(engine, specs, fake_reference) -> None:
    from headrace.request import SamplingParams

    for rid, (prompt, kw) in specs.items():
        assert engine.tokens[rid] == fake_reference(prompt, SamplingParams(**kw)), rid


def test_token_budget_and_seq_cap_hold_every_step(fake_engine, make_prompt, fake_reference):
    # burst budget off: the budget is exactly max_num_batched_tokens (test_step_budget.py
    # covers the growth)
    engine = fake_engine(max_num_batched_tokens=16, burst_batched_tokens=16, max_num_seqs=4)
    specs = _add_mixed(engine, make_prompt, 20)
    engine.run()
    assert len(engine.finished) == 20
    steps = engine.runner.steps
    assert max(out.num_batched_tokens for out in steps) == 16  # the budget is used, not exceeded
    assert max(len(out.scheduled) for out in steps) == 4
    assert max(s.num_running for s in engine.stats) <= 4
    _assert_solo_outputs(engine, specs, fake_reference)


def test_chunked_prefill_runs_alongside_decodes(fake_engine, make_prompt, fake_reference):
    engine = fake_engine(max_num_batched_tokens=16, burst_batched_tokens=16, max_num_seqs=8)
    engine.add("short", make_prompt(1, 4), max_tokens=30, ignore_eos=True, temperature=0)
    engine.step()  # "short" prefills and samples its first token
    long_prompt = make_prompt(2, 100)
    engine.add("long", long_prompt, max_tokens=3, ignore_eos=True, temperature=0)
    chunks = []
    while "long" not in engine.tokens:
        engine.step()
        out = engine.runner.steps[-1]
        by_id = {s.request_id: s for s in out.scheduled}
        assert by_id["short"].token_ids and len(by_id["short"].token_ids) == 1  # never stalls
        chunks.append(len(by_id["long"].token_ids))
    assert chunks == [15] * 6 + [10]  # the rest of each step's budget
    engine.run()
    assert engine.tokens["long"] == fake_reference(long_prompt, _greedy(3))


def _greedy(max_tokens: int):
    from headrace.request import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def test_waiting_requests_start_in_priority_then_arrival_order(fake_engine, make_prompt):
    engine = fake_engine(max_num_seqs=1)
    order = [("b1", 2), ("f1", 1), ("p1", 0), ("f2", 1), ("p2", 0), ("b2", 2)]
    for rid, prio in order:
        engine.add(rid, make_prompt(hash(rid) % 100, 5), max_tokens=2, priority=prio)
    started = []
    while engine.core.has_work():
        engine.step()
        for s in engine.runner.steps[-1].scheduled:
            if s.start_pos == 0 and s.request_id not in started:
                started.append(s.request_id)
    assert started == ["p1", "p2", "f1", "f2", "b1", "b2"]


def test_preemption_recomputes_and_every_request_finishes_unchanged(
    fake_engine, fake_runner, make_prompt, fake_reference
):
    # 12 blocks of 4 = 48 tokens; each request needs up to 8 + 24 = 32 on its own.
    engine = fake_engine(runner=fake_runner(num_kv_blocks=12, block_size=4))
    specs = {}
    for i in range(5):
        prompt = make_prompt(50 + i, 8)
        specs[f"r{i}"] = (prompt, {"max_tokens": 24, "temperature": 0, "ignore_eos": True})
        engine.add(f"r{i}", prompt, **specs[f"r{i}"][1])
    engine.run()
    assert engine.stats[-1].num_preemptions_total > 0
    assert all(o.finish_reason is FinishReason.LENGTH for o in engine.finished.values())
    # each request's final output says what its preemptions threw away (the usage ledger's)
    assert sum(o.num_recomputed_tokens for o in engine.finished.values()) >= 8
    _assert_solo_outputs(engine, specs, fake_reference)
    assert engine.core.block_manager.num_used_blocks == 0


def test_the_preempted_request_is_the_lowest_priority_latest_arrival(
    fake_engine, fake_runner, make_prompt
):
    engine = fake_engine(runner=fake_runner(num_kv_blocks=6, block_size=4))
    engine.add("paid", make_prompt(1, 4), max_tokens=12, priority=0, ignore_eos=True)
    engine.add("free-old", make_prompt(2, 4), max_tokens=12, ignore_eos=True)
    engine.add("free-new", make_prompt(3, 4), max_tokens=12, ignore_eos=True)
    sched = engine.core.scheduler
    while engine.stats == [] or engine.stats[-1].num_preemptions_total == 0:
        engine.step()
    assert [r.request_id for r in sched.queue] == ["free-new"]
    assert sched.queue.peek().status is RequestStatus.PREEMPTED
    engine.run()
    assert len(engine.finished) == 3


def test_a_request_that_can_never_fit_is_refused_with_the_limits(fake_engine, fake_runner):
    engine = fake_engine(runner=fake_runner(num_kv_blocks=8, block_size=4, max_model_len=64))
    with pytest.raises(ValueError, match="maximum context length is 64 tokens"):
        engine.add("too-long", [5] * 60, max_tokens=8)
    with pytest.raises(ValueError, match="KV cache holds at most 32 tokens"):
        engine.add("too-big", [5] * 30, max_tokens=8)
    with pytest.raises(ValueError, match="empty"):
        engine.add("empty", [], max_tokens=8)
    engine.add("fits", [5] * 24, max_tokens=8)
    with pytest.raises(ValueError, match="already in use"):
        engine.add("fits", [5] * 4, max_tokens=8)
    engine.run()
    assert list(engine.finished) == ["fits"]


def test_static_policy_waits_for_a_batch_then_allows_no_joins(fake_engine, make_prompt):
    engine = fake_engine(policy="static", static_batch_size=3, static_wait_ms=1000)
    engine.add("a", make_prompt(1, 4), max_tokens=5, ignore_eos=True)
    engine.add("b", make_prompt(2, 4), max_tokens=9, ignore_eos=True)
    for _ in range(3):
        engine.step()
    assert not engine.runner.steps  # two of three: still waiting for the batch to fill
    engine.add("c", make_prompt(3, 4), max_tokens=5, ignore_eos=True)
    engine.step()
    engine.add("late", make_prompt(4, 4), max_tokens=5, ignore_eos=True)
    batch_steps = 0
    while "b" not in engine.finished:
        engine.step()
        ids = {s.request_id for s in engine.runner.steps[-1].scheduled}
        assert "late" not in ids  # no joins while the batch runs
        batch_steps += 1
    assert batch_steps == 8
    # The lone "late" request starts once it has waited static_wait_ms.
    engine.step()
    assert "late" not in engine.tokens
    engine.now += 1.0
    engine.run()
    assert engine.finished["late"].finish_reason is FinishReason.LENGTH


def test_higher_tier_preempts_lower_tier_at_most_max_preemptions(fake_engine, make_prompt):
    engine = fake_engine(max_num_seqs=2, max_preemptions=1)
    engine.add("batch1", make_prompt(1, 4), max_tokens=50, priority=2, ignore_eos=True)
    engine.add("batch2", make_prompt(2, 4), max_tokens=50, priority=2, ignore_eos=True)
    engine.step()
    engine.add("paid1", make_prompt(3, 4), max_tokens=3, priority=0, ignore_eos=True)
    engine.step()
    running = [r.request_id for r in engine.core.scheduler.running]
    assert running == ["paid1", "batch1"]  # the latest-arrived of the lowest tier made room
    while "paid1" not in engine.finished:
        engine.step()
    engine.step()  # batch2 resumes
    assert {r.request_id for r in engine.core.scheduler.running} == {"batch1", "batch2"}
    # batch2 has been preempted once already: it cannot be again; batch1 can.
    engine.add("paid2", make_prompt(4, 4), max_tokens=3, priority=0, ignore_eos=True)
    engine.step()
    assert {r.request_id for r in engine.core.scheduler.running} == {"paid2", "batch2"}
    engine.add("paid3", make_prompt(5, 4), max_tokens=3, priority=0, ignore_eos=True)
    engine.step()
    assert "paid3" not in {r.request_id for r in engine.core.scheduler.running}
    engine.run()
    assert len(engine.finished) == 5


def test_stop_conditions(fake_engine, make_prompt, fake_reference):
    engine = fake_engine()
    prompt = make_prompt(7, 6)
    ref = fake_reference(prompt, _greedy(12))
    engine.add("stop-tok", prompt, max_tokens=12, temperature=0, stop_token_ids=(ref[3],))
    engine.add("length", prompt, max_tokens=12, temperature=0, ignore_eos=True)
    engine.run()
    assert engine.tokens["stop-tok"] == ref[: ref.index(ref[3]) + 1]
    assert engine.finished["stop-tok"].finish_reason is FinishReason.STOP
    assert engine.tokens["length"] == ref
    assert engine.finished["length"].finish_reason is FinishReason.LENGTH


def test_eos_stops_unless_ignored(fake_engine, make_prompt, fake_reference):
    from headrace.request import SamplingParams

    # Find a prompt whose greedy continuation reaches the fake EOS token (0) early.
    prompt = next(
        p for p in (make_prompt(s, 5) for s in range(10_000)) if 0 in fake_reference(p, _greedy(10))
    )
    engine = fake_engine()
    engine.add("eos", prompt, max_tokens=10, temperature=0)
    engine.add("ignore", prompt, max_tokens=10, temperature=0, ignore_eos=True)
    engine.run()
    assert engine.tokens["eos"][-1] == 0 and len(engine.tokens["eos"]) < 10
    assert engine.finished["eos"].finish_reason is FinishReason.STOP
    assert engine.tokens["ignore"] == fake_reference(prompt, _greedy(10))
    assert engine.tokens["eos"] == fake_reference(prompt, SamplingParams(10, temperature=0))


def test_seeded_sampling_is_reproducible_across_batches(fake_engine, make_prompt):
    prompt = make_prompt(9, 7)
    results = []
    for others in (0, 5):
        engine = fake_engine(max_num_batched_tokens=8)
        for i in range(others):
            engine.add(f"o{i}", make_prompt(i, 20), max_tokens=10)
        engine.add("seeded", prompt, max_tokens=10, temperature=0.8, seed=42, ignore_eos=True)
        engine.run()
        results.append(engine.tokens["seeded"])
    assert results[0] == results[1]
