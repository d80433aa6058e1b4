"""The scheduler's speculation: which decoding requests carry drafts this step, how many, and
what became of them (the rules are speculation.py's; this owns the state and the counters)."""

from __future__ import annotations

from collections.abc import Callable

from headrace.config import SchedulerConfig
from headrace.engine.sched.ngram_proposer import NgramProposer
from headrace.engine.sched.speculation import drafts_for, next_window
from headrace.request import Request


class Speculator:
    def __init__(self, config: SchedulerConfig, max_model_len: int) -> None:
        self.proposer = NgramProposer(config.num_speculative_tokens)
        self.max_seqs = config.speculative_max_seqs
        self.max_model_len = max_model_len
        self._drafts: dict[str, list[int]] = {}  # this step's, per request
        self.drafted_total = 0  # draft tokens checked so far
        self.accepted_total = 0  # ... and kept

    def begin_step(self, num_running: int) -> bool:
        """Forget the last step's drafts; whether this step speculates (few requests run)."""
        self._drafts = {}
        return self.speculates(num_running)

    def speculates(self, num_running: int) -> bool:
        """Whether a step with this many running requests carries drafts."""
        return self.proposer.num_tokens > 0 and num_running <= self.max_seqs

    def draft(self, req: Request, budget: int, fits: Callable[[int], bool]) -> int:
        """Drafts for a decoding request where `fits(num_tokens)` says its blocks hold them
        without taking anyone's; returns how many (kept for `take`)."""
        drafts = drafts_for(req, self.proposer, self.max_model_len, budget)
        if not drafts or not fits(req.num_tokens + len(drafts)):
            return 0
        self._drafts[req.request_id] = drafts
        return len(drafts)

    def take(self, request_id: str, n: int) -> list[int]:
        """The drafts of a request scheduled for `n` tokens (a preemption may have cut the
        step short of them)."""
        return self._drafts.get(request_id, [])[: max(0, n - 1)] if n > 1 else []

    def settle(self, req: Request, drafted: int, kept: int) -> None:
        """`kept` of the request's `drafted` drafts matched the model: count them, and size
        its next window."""
        self.drafted_total += drafted
        self.accepted_total += kept
        req.num_draft_tokens += drafted
        req.num_accepted_tokens += kept
        most = self.proposer.num_tokens
        req.draft_window = next_window(req.draft_window or most, drafted, kept, most)
