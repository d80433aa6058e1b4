"""Which steps may have the next one scheduled before their tokens are read (--async-scheduling,
engine/core/overlap.py)."""

from __future__ import annotations

from headrace.engine.outputs import ScheduledRequest, SchedulerOutput


def overlappable(out: SchedulerOutput) -> bool:
    """No drafts (their acceptance decides the next tokens), and no sampled row whose choice
    the host makes or reads (logprobs, a grammar, logits processors: the token history)."""
    return not out.is_empty and all(map(_needs_no_host, out.scheduled))


def _needs_no_host(s: ScheduledRequest) -> bool:
    if s.draft_token_ids:
        return False
    if not s.sample:
        return True
    params = s.params
    return s.logits_inputs is None and params.logprobs is None and params.grammar is None
