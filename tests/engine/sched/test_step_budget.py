"""The step budget grows while prompts back up and falls back once a step covers them."""

from __future__ import annotations

import pytest
from factories import FakeCore, fake_reference, make_prompt, make_request

from headrace.config import SchedulerConfig
from headrace.engine.sched.step_budget import StepBudget, demand
from headrace.request import SamplingParams

GREEDY = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True}


def test_demand_counts_what_is_left_up_to_a_cap() -> None:
    running = make_request("r", 40)
    running.num_computed_tokens = 30
    waiting = [make_request(f"w{i}", 100) for i in range(3)]
    assert demand([running], waiting, cap=10_000) == 10 + 300
    assert demand([running], waiting, cap=50) == 50


def test_budget_doubles_in_a_backlog_then_falls_back() -> None:
    budget = StepBudget(512, 2048)
    backlog = [make_request(f"w{i}", 300) for i in range(32)]  # 9,600 tokens
    assert [budget.next([], backlog) for _ in range(5)] == [512, 1024, 2048, 2048, 2048]
    one = backlog[:1]  # 300 tokens: the 2,048 of this step covers them
    assert budget.next([], one) == 2048
    assert [budget.next([], one) for _ in range(2)] == [512, 512]  # back to the base, and stays
    assert [budget.next([], backlog[:2]) for _ in range(2)] == [512, 1024]  # 600 > 512: grows


def test_burst_equal_to_base_turns_growth_off() -> None:
    budget = StepBudget(64, 64)
    backlog = [make_request(f"w{i}", 300) for i in range(8)]
    assert {budget.next([], backlog) for _ in range(4)} == {64}
    assert StepBudget(512, 100).burst == 512  # a burst below the base is the base


def test_config_defaults_to_no_growth_and_refuses_nonsense() -> None:
    assert SchedulerConfig().max_num_batched_tokens == 2048
    core = FakeCore(max_num_batched_tokens=16)
    assert (core.core.scheduler.budget.base, core.core.scheduler.budget.burst) == (16, 16)
    grows = FakeCore(max_num_batched_tokens=16, burst_batched_tokens=64)
    assert grows.core.scheduler.budget.burst == 64
    with pytest.raises(ValueError, match="burst_batched_tokens"):
        SchedulerConfig(burst_batched_tokens=0)


def test_a_burst_clears_in_growing_steps_with_unchanged_outputs() -> None:
    engine = FakeCore(max_num_batched_tokens=16, burst_batched_tokens=64, max_num_seqs=16)
    prompts = {f"r{i}": make_prompt(i, 30) for i in range(12)}  # 360 prompt tokens at once
    for rid, prompt in prompts.items():
        engine.add(rid, prompt, **GREEDY)
    engine.run()
    sizes = [out.num_batched_tokens for out in engine.runner.steps]
    assert sizes[:3] == [16, 32, 64]  # the first prompt's first token after a small step
    assert max(sizes) == 64
    assert sizes[-1] <= 16  # the backlog gone, steps are small again
    for rid, prompt in prompts.items():
        assert engine.tokens[rid] == fake_reference(prompt, SamplingParams(**GREEDY)), rid
