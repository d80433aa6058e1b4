"""Prefix caching through the scheduler, on the fake runner that reads tokens back through the
block tables: a wrong hit, a stale block or a miscounted reference changes the output."""

from __future__ import annotations

import random

from factories import FakeCore, FakeRunner, fake_reference, make_prompt

from headrace.request import FinishReason, SamplingParams

GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def _engine(**kw: object) -> FakeCore:
    return FakeCore(enable_prefix_caching=True, **kw)


def _check(engine: FakeCore, prompts: dict[str, list[int]], **params: object) -> None:
    for rid, prompt in prompts.items():
        ref = fake_reference(prompt, SamplingParams(**{**GREEDY, **params}))  # type: ignore[arg-type]
        assert engine.tokens[rid] == ref, rid


def test_a_later_request_with_the_same_prefix_hits_and_generates_the_same() -> None:
    e = _engine()
    system = make_prompt(1, 20)  # 5 full blocks of 4
    prompts = {"a": system + [5, 6], "b": system + [7, 8, 9]}
    e.add("a", prompts["a"], **GREEDY)
    e.run()
    e.add("b", prompts["b"], **GREEDY)
    e.run()
    _check(e, prompts)
    assert e.finished["a"].num_cached_tokens == 0
    assert e.finished["b"].num_cached_tokens == 20
    last = e.stats[-1]
    assert last.prefix_cache_queries_total == 22 + 23
    assert last.prefix_cache_hits_total == 20
    assert last.kv_blocks_used == 0 and last.kv_blocks_cached > 0


def test_a_batch_sharing_a_prefix_and_staggered_arrivals_stay_exact() -> None:
    rng = random.Random(3)
    e = _engine(max_num_batched_tokens=16, max_num_seqs=6)
    systems = [make_prompt(s, rng.choice([9, 16, 30])) for s in range(3)]
    prompts: dict[str, list[int]] = {}
    for i in range(24):
        prompts[f"r{i}"] = rng.choice(systems) + make_prompt(100 + i, rng.randint(1, 7))
    pending = list(prompts.items())
    while pending or e.core.has_work():
        for _ in range(rng.randint(0, 2)):
            if pending:
                rid, prompt = pending.pop(0)
                e.add(rid, prompt, **GREEDY)
        e.step()
    _check(e, prompts)
    assert sum(o.num_cached_tokens for o in e.finished.values()) > 0
    assert e.stats[-1].kv_blocks_used == 0


def test_tenants_do_not_share_unless_they_share_a_salt() -> None:
    e = _engine()
    prompt = make_prompt(7, 17)
    e.add("a", prompt, tenant="alice", **GREEDY)
    e.run()
    e.add("b", prompt, tenant="bob", **GREEDY)
    e.run()
    assert e.finished["b"].num_cached_tokens == 0
    e.add("a2", prompt, tenant="alice", **GREEDY)
    e.add("g1", prompt, tenant="carol", cache_salt="acme", **GREEDY)
    e.run()
    assert e.finished["a2"].num_cached_tokens == 16
    assert e.finished["g1"].num_cached_tokens == 0
    e.add("g2", prompt, tenant="dave", cache_salt="acme", **GREEDY)
    e.run()
    assert e.finished["g2"].num_cached_tokens == 16
    _check(e, {rid: prompt for rid in ("a", "b", "a2", "g1", "g2")})


def test_preemption_and_a_tight_pool_keep_outputs_exact() -> None:
    # 12 blocks of 4 tokens for 6 requests of 12 + 16 tokens each: preemption is certain.
    e = _engine(runner=FakeRunner(num_kv_blocks=12), max_num_batched_tokens=12)
    system = make_prompt(9, 8)
    prompts = {f"p{i}": system + make_prompt(i, 4) for i in range(6)}
    for rid, prompt in prompts.items():
        e.add(rid, prompt, **{**GREEDY, "max_tokens": 16})
    e.run()
    _check(e, prompts, max_tokens=16)
    assert e.core.scheduler.num_preemptions_total > 0
    assert all(o.finish_reason is FinishReason.LENGTH for o in e.finished.values())


def test_a_preempted_request_gets_its_own_generated_blocks_back() -> None:
    e = _engine(runner=FakeRunner(num_kv_blocks=8), max_num_batched_tokens=64)
    prompt = make_prompt(4, 9)
    e.add("low", prompt, priority=2, **{**GREEDY, "max_tokens": 12})
    for _ in range(8):
        e.step()
    e.add("high", make_prompt(5, 20), priority=0, **GREEDY)
    e.run()
    assert e.core.scheduler.num_preemptions_total == 1
    _check(e, {"low": prompt}, max_tokens=12)
    _check(e, {"high": make_prompt(5, 20)})


def test_an_abort_of_one_sharer_leaves_the_other_exact() -> None:
    e = _engine(max_num_batched_tokens=64)
    system = make_prompt(2, 16)
    e.add("first", system + [1], **GREEDY)
    e.run()
    e.add("keep", system + [2], **{**GREEDY, "max_tokens": 10})
    e.add("drop", system + [3], **{**GREEDY, "max_tokens": 10})
    e.step()
    e.step()
    assert e.core.abort_request("drop")
    e.run()
    assert e.finished["drop"].finish_reason is FinishReason.ABORT
    _check(e, {"keep": system + [2]}, max_tokens=10)
    assert e.finished["keep"].num_cached_tokens == 16


def test_chunked_prefill_after_a_hit_computes_only_the_rest() -> None:
    e = _engine(max_num_batched_tokens=8)
    system = make_prompt(6, 40)
    e.add("a", system + [1], **GREEDY)
    e.run()
    steps_before = len(e.runner.steps)
    e.add("b", system + make_prompt(8, 20), **GREEDY)
    e.run()
    prefill = [len(s.token_ids) for out in e.runner.steps[steps_before:] for s in out.scheduled]
    assert sum(prefill) == 20 + GREEDY["max_tokens"] - 1  # 40 cached tokens never recomputed
    assert e.finished["b"].num_cached_tokens == 40
    _check(e, {"b": system + make_prompt(8, 20)})


def test_without_prefix_caching_nothing_is_reused() -> None:
    e = FakeCore()
    prompt = make_prompt(1, 20)
    e.add("a", prompt, **GREEDY)
    e.run()
    e.add("b", prompt, **GREEDY)
    e.run()
    assert e.finished["b"].num_cached_tokens == 0
    assert e.stats[-1].prefix_cache_queries_total == 0


def test_requests_arriving_together_compute_their_shared_prefix_once() -> None:
    e = _engine(max_num_batched_tokens=64)
    system = make_prompt(3, 32)  # 8 full blocks
    prompts = {"a": system + [1], "b": system + [2], "c": system + [3]}
    for rid, prompt in prompts.items():
        e.add(rid, prompt, **GREEDY)
    e.run()
    _check(e, prompts)
    computed = sum(len(s.token_ids) for out in e.runner.steps for s in out.scheduled)
    # a computes its 33 prompt tokens; b and c wait a step, then compute their last token.
    assert computed == 33 + 1 + 1 + 3 * (GREEDY["max_tokens"] - 1)
    assert [e.finished[r].num_cached_tokens for r in "abc"] == [0, 32, 32]


def test_a_waiter_computes_the_prefix_itself_once_its_promiser_is_gone() -> None:
    # the promiser needs 5 steps for its prompt (a fixed budget: no growth in the backlog)
    e = _engine(max_num_batched_tokens=8, burst_batched_tokens=8)
    system = make_prompt(4, 36)
    e.add("promiser", system + [1], **GREEDY)
    e.add("waiter", system + [2], **GREEDY)
    e.step()
    e.step()
    assert e.core.scheduler.requests["waiter"].status.name == "WAITING"
    assert e.core.abort_request("promiser")
    e.run()
    _check(e, {"waiter": system + [2]})
    # The 16 tokens the promiser computed before it left were cached for the waiter.
    assert e.finished["waiter"].num_cached_tokens == 16
