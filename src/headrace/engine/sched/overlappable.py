"""Which steps may have the next one scheduled before their tokens are read (--async-scheduling,
engine/core/overlap.py)."""

from __future__ import annotations

from operator import attrgetter

from headrace.engine.outputs import SchedulerOutput

_DRAFTS, _PARAMS = attrgetter("draft_token_ids"), attrgetter("params")
_READS_HOST = attrgetter("reads_host")


def overlappable(out: SchedulerOutput) -> bool:
    """No drafts (their acceptance decides the next tokens), and no request whose picks the
    host makes or reads (logprobs, a grammar, logits processors: the token history), even in
    a step where it only computes prompt tokens. C passes over the rows: at 256 a Python call
    a row took 30 us a step."""
    rows = out.scheduled
    return (
        bool(rows) and not any(map(_DRAFTS, rows)) and not any(map(_READS_HOST, map(_PARAMS, rows)))
    )
