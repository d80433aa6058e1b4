"""Routing policies on plain numbers: no engine needed."""

from __future__ import annotations

from collections import Counter

import pytest

from headrace.router.policies import (
    Candidate,
    LeastLoad,
    PowerOfTwo,
    RoundRobin,
    make_policy,
)


def cands(*loads: int, free: tuple[int, ...] | None = None) -> list[Candidate]:
    free = free or (100,) * len(loads)
    return [Candidate(i, load, f, 0) for i, (load, f) in enumerate(zip(loads, free, strict=True))]


def test_least_load_takes_the_fewest_tokens() -> None:
    assert LeastLoad().choose(cands(300, 20, 150)).index == 1


def test_least_load_ties_go_to_more_free_blocks() -> None:
    assert LeastLoad().choose(cands(50, 50, 80, free=(10, 90, 200))).index == 1


def test_least_load_idle_replicas_take_turns() -> None:
    policy = LeastLoad()
    picks = [policy.choose(cands(0, 0, 0)).index for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]


def test_least_load_turns_skip_missing_replicas() -> None:
    policy = LeastLoad()
    only = [Candidate(0, 0, 1, 0), Candidate(2, 0, 1, 0)]  # replica 1 is down
    assert [policy.choose(only).index for _ in range(4)] == [0, 2, 0, 2]


def test_power_of_two_picks_the_lighter_of_two_samples() -> None:
    policy = PowerOfTwo(seed=7)
    picks = Counter(policy.choose(cands(900, 10, 500, 700)).index for _ in range(400))
    # the heaviest replica never wins a pair; the lightest wins every pair it is drawn into
    assert picks[0] == 0
    assert picks[1] == pytest.approx(400 / 2, rel=0.25)  # drawn in half of all pairs
    assert set(picks) <= {1, 2, 3}


def test_power_of_two_with_two_replicas_is_least_load() -> None:
    assert PowerOfTwo(seed=1).choose(cands(40, 30)).index == 1


def test_round_robin_ignores_load_and_skips_missing() -> None:
    policy = RoundRobin()
    assert [policy.choose(cands(0, 999, 5)).index for _ in range(4)] == [0, 1, 2, 0]
    only = [Candidate(1, 0, 1, 0), Candidate(2, 0, 1, 0)]
    assert policy.choose(only).index == 1  # after 0 comes 1
    assert policy.choose(only).index == 2


def test_make_policy_by_name() -> None:
    assert make_policy("least-load").name == "least-load"
    assert make_policy("power-of-two").name == "power-of-two"
    assert make_policy("round-robin").name == "round-robin"
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")
