"""Routing policies: which replica of a model gets the next request.

A policy sees one `Candidate` per replica that may take the request (healthy, in the right
pool, not already tried for it) and picks one. Policies are pure: the numbers come from the
router (`replica.LoadTracker`), so they are tested without any engine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

POLICY_NAMES = ("cache-aware", "least-load", "power-of-two", "round-robin")


@dataclass(frozen=True)
class Candidate:
    """One replica as a policy sees it."""

    index: int  # the replica's position in its router: stable across restarts
    load_tokens: int  # waiting + running tokens reported, plus those dispatched since
    free_blocks: int  # free KV-cache blocks reported
    in_flight: int  # requests this router has open on the replica
    prefix_blocks: int = 0  # leading blocks of this prompt sent there before (cache-aware)
    holds_adapter: bool = False  # the request's LoRA adapter is in this replica's memory


class RoutingPolicy(Protocol):
    """Picks one of `candidates` (never empty). May keep state (a rotation), never blocks."""

    name: str
    uses_prefixes: bool  # wants `Candidate.prefix_blocks` filled in

    def choose(self, candidates: Sequence[Candidate]) -> Candidate: ...


class LeastLoad:
    """The fewest waiting + running tokens; ties go to more free KV blocks, then fewer open
    requests, then the next replica after the last one chosen (so idle replicas take turns)."""

    name = "least-load"
    uses_prefixes = False

    def __init__(self) -> None:
        self._last = -1

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        span = max(c.index for c in candidates) + 1

        def key(c: Candidate) -> tuple[int, int, int, int]:
            turn = (c.index - self._last - 1) % span
            return (c.load_tokens, -c.free_blocks, c.in_flight, turn)

        best = min(candidates, key=key)
        self._last = best.index
        return best


class PowerOfTwo:
    """Two replicas at random, the less loaded of them (least-load's order between the two).

    Cheaper than a full scan for many replicas, and less herd-prone when load numbers lag."""

    name = "power-of-two"
    uses_prefixes = False

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._tie = LeastLoad()

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        if len(candidates) <= 2:
            return self._tie.choose(candidates)
        return self._tie.choose(self._rng.sample(list(candidates), 2))


class RoundRobin:
    """The next replica after the last one chosen, whatever the load."""

    name = "round-robin"
    uses_prefixes = False

    def __init__(self) -> None:
        self._last = -1

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        ordered = sorted(candidates, key=lambda c: c.index)
        best = next((c for c in ordered if c.index > self._last), ordered[0])
        self._last = best.index
        return best


class CacheAware:
    """The replica sent the longest prefix of this prompt before — the likeliest to hold its KV
    in its prefix cache — while its load is within `margin_tokens` of the least loaded one's;
    then, for a LoRA request, the least loaded replica holding its adapter in memory, within the
    same margin (another would read the adapter from disk, and may evict one of its own:
    `--max-cpu-loras`); otherwise least-load (whose pick then becomes the prefix's home)."""

    name = "cache-aware"
    uses_prefixes = True

    def __init__(self, margin_tokens: int) -> None:
        self.margin_tokens = margin_tokens
        self._fallback = LeastLoad()

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        best = max(candidates, key=lambda c: (c.prefix_blocks, -c.load_tokens))
        least = min(c.load_tokens for c in candidates)
        if best.prefix_blocks > 0 and best.load_tokens - least <= self.margin_tokens:
            return best
        holders = [c for c in candidates if c.holds_adapter]
        if holders and len(holders) < len(candidates):
            holder = self._fallback.choose(holders)
            if holder.load_tokens - least <= self.margin_tokens:
                return holder
        return self._fallback.choose(candidates)


def make_policy(name: str, seed: int | None = None, margin_tokens: int = 0) -> RoutingPolicy:
    if name == "cache-aware":
        return CacheAware(margin_tokens)
    if name == "least-load":
        return LeastLoad()
    if name == "power-of-two":
        return PowerOfTwo(seed)
    if name == "round-robin":
        return RoundRobin()
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
