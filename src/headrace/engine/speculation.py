"""Speculative decoding for greedy requests, with drafts from prompt lookup (ngram_proposer).

A decode step of a request with drafts computes its last token and the k drafts as one chunk:
the model's greedy pick after each of them comes back (runner), and the scheduler keeps the
picks up to the first draft the model disagrees with. Every kept token is the one plain
decoding would have produced, so speculation changes how many steps a request takes, not
its tokens. A step with a few more rows costs about what a one-row step costs where the
weights' reads dominate (few requests running), so that is where it is turned on.
"""

from __future__ import annotations

from collections.abc import Sequence

from headrace.engine.ngram_proposer import NgramProposer
from headrace.request import Request


def speculates(req: Request) -> bool:
    """Greedy on the raw logits: the only case where accepting a draft is exact without
    rejection sampling (no logprobs, no grammar, no logits processors)."""
    return req.params.argmax_only and not req.params.processes_logits


def drafts_for(req: Request, proposer: NgramProposer, max_model_len: int, budget: int) -> list[int]:
    """Drafts for `req`'s next decode step, within its max_tokens, the model's length and the
    step's budget (one token of which is the request's own last token)."""
    limit = min(
        req.params.max_tokens - req.num_output_tokens - 1,  # the step yields 1 + accepted
        max_model_len - req.num_tokens,  # positions of the drafts
        budget - 1,
    )
    if limit <= 0 or not speculates(req):
        return []
    return proposer.propose(req.all_token_ids, limit)


def accept(first: int, drafts: Sequence[int], picks: Sequence[int]) -> list[int]:
    """The tokens a speculative step produced: the pick after the last token (`first`), then
    each draft's pick for as long as every draft before equals the model's pick there.

    picks[i] is the model's greedy token after drafts[i].
    """
    out = [first]
    for draft, pick in zip(drafts, picks, strict=False):
        if draft != out[-1]:
            break
        out.append(pick)
    return out
