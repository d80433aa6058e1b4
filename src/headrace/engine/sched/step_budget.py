"""How many tokens the next step may compute.

`max_num_batched_tokens` bounds a step, and so the pause that running streams see between two
tokens while prompts are computed beside them. When prompts back up (a burst of arrivals, a
server just started under load), small steps make each waiting prompt also wait for every
step's fixed costs — the running decodes' attention and head, the per-step overhead — about a
fifth of a 512-token step at 32 streams here. So while the backlog exceeds the budget, the
budget may double each step, up to `burst_batched_tokens`: the first prompts of a burst still
get their first token after a small step, and the rest clear in fewer, larger ones. It falls
back to `max_num_batched_tokens` once one step's budget covers all that is left. By default
there is no growth: the default budget, 2,048 tokens, is a burst-sized step already
(docs/engine.md has the measurements).
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace.request import Request


def demand(running: Iterable[Request], waiting: Iterable[Request], cap: int) -> int:
    """Tokens that running and waiting requests still have to compute (a decode counts one),
    counted up to `cap`."""
    need = 0
    for group in (running, waiting):
        for req in group:
            need += req.num_tokens - req.num_computed_tokens
            if need >= cap:
                return cap
    return need


class StepBudget:
    def __init__(self, base: int, burst: int) -> None:
        self.base = base
        self.burst = max(base, burst)
        self.limit = base  # this step's budget while a backlog lasts

    def next(self, running: Iterable[Request], waiting: Iterable[Request]) -> int:
        if self.burst == self.base:
            return self.base
        need = demand(running, waiting, self.burst + 1)
        budget = self.limit
        self.limit = min(self.burst, 2 * self.limit) if need > self.limit else self.base
        return budget
