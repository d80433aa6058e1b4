"""Which steps may have the next one scheduled before their tokens are read (--async-scheduling,
engine/core/overlap.py)."""

from __future__ import annotations

from itertools import compress
from operator import attrgetter

from headrace.engine.outputs import SchedulerOutput

_DRAFTS = attrgetter("draft_token_ids")
_PARAMS, _SAMPLE = attrgetter("params"), attrgetter("sample")
_GRAMMAR = attrgetter("grammar")  # never "" (validated): set is truthy


def overlappable(out: SchedulerOutput) -> bool:
    """No drafts (their acceptance decides the next tokens), and no sampled row whose pick the
    host makes or reads: a grammar (its matcher reads each token). The logits processors run
    in the launched pick, the last token of a history taken from this step's on the device:
    penalties count it there (runner/token_counts.py), a bad word whose next-to-last token
    it may be is banned where it is (logits_processors.ban_if_last). Asked every step: ~30 us
    at 256 rows."""
    rows = out.scheduled
    if not rows or any(map(_DRAFTS, rows)):
        return False
    sampled = compress(map(_PARAMS, rows), map(_SAMPLE, rows))
    return not any(map(_GRAMMAR, sampled))
