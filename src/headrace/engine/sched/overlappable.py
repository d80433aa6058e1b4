"""Which steps may have the next one scheduled before their tokens are read (--async-scheduling,
engine/core/overlap.py)."""

from __future__ import annotations

from itertools import compress
from operator import attrgetter

from headrace.engine.outputs import SchedulerOutput

_DRAFTS, _INPUTS = attrgetter("draft_token_ids"), attrgetter("logits_inputs")
_PARAMS, _SAMPLE = attrgetter("params"), attrgetter("sample")
_ON_HOST = attrgetter("picks_on_host")


def overlappable(out: SchedulerOutput) -> bool:
    """No drafts (their acceptance decides the next tokens), and no sampled row whose pick the
    host makes or reads: a grammar, or bad_words (the host matches the tokens so far). The
    other logits processors run in the launched pick: penalties count the history on the
    device, its last token taken from this step's (runner/token_counts.py). Asked every step:
    ~30 us at 256 rows."""
    rows = out.scheduled
    if not rows or any(map(_DRAFTS, rows)):
        return False
    if any(map(_INPUTS, rows)) and any(r.params.bad_words for r in rows if r.logits_inputs):
        return False
    sampled = compress(map(_PARAMS, rows), map(_SAMPLE, rows))
    return not any(map(_ON_HOST, sampled))
