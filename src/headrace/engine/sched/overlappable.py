"""Which steps may have the next one scheduled before their tokens are read (--async-scheduling,
engine/core/overlap.py)."""

from __future__ import annotations

from itertools import compress
from operator import attrgetter

from headrace.engine.outputs import SchedulerOutput

_DRAFTS, _INPUTS = attrgetter("draft_token_ids"), attrgetter("logits_inputs")
_PARAMS, _SAMPLE = attrgetter("params"), attrgetter("sample")
_ON_HOST, _HISTORY = attrgetter("picks_on_host"), attrgetter("uses_output_history")


def overlappable(out: SchedulerOutput) -> bool:
    """No drafts (their acceptance decides the next tokens), and no sampled row whose pick the
    host makes or reads: a grammar, or logits processors that read the tokens so far
    (penalties, bad_words: the next step's inputs would need this one's token; logit_bias and
    min_tokens' bans do not, and run on the device). Asked every step: ~30 us at 256 rows."""
    rows = out.scheduled
    if not rows or any(map(_DRAFTS, rows)):
        return False
    if any(map(_INPUTS, rows)) and any(_HISTORY(r.params) for r in rows if r.logits_inputs):
        return False
    sampled = compress(map(_PARAMS, rows), map(_SAMPLE, rows))
    return not any(map(_ON_HOST, sampled))
