"""Speculative decoding with drafts from prompt lookup (ngram_proposer), for greedy and for
sampled requests.

A decode step of a request with drafts computes its last token and the k drafts as one chunk:
the runner picks a token after each of them the way the request picks any token (its argmax,
or a draw from its distribution there), and the scheduler keeps the picks up to the first
draft the model's pick differs from. A greedy request's kept tokens are the ones plain decoding
would have produced, so speculation changes how many steps it takes, not its tokens.

A sampled request's drafts are verified by speculative sampling (Leviathan et al. 2023) with a
draft distribution that puts all its mass on the drafted token q = 1[x = d]: accept d with
probability min(1, p(d) / q(d)) = p(d), else draw from the residual max(0, p - q), normalized,
which is p with d taken out. The token that comes out has the distribution p(d) 1[x = d] +
(1 - p(d)) p(x) 1[x != d] / (1 - p(d)) = p(x): exactly the target's. Drawing x ~ p once and
accepting d when x = d is the same procedure, so the runner draws every row from its own
distribution and `accept` compares, as for greedy. Every kept token is thus drawn from the
request's distribution given the tokens before it; a seeded request draws the token at output
index j from the seed's j-th number with or without speculation.

A step with a few more rows costs about what a one-row step costs where the weights' reads
dominate (few requests running), so that is where it is turned on. Rows are not free, though
(the head and the sampler work per row): where a request's drafts keep failing (sampled
natural text accepts about a quarter of them, random-token prompts four fifths), its window
of drafts shrinks, and it grows back while they are accepted (`next_window`).
"""

from __future__ import annotations

from collections.abc import Sequence

from headrace.engine.sched.ngram_proposer import NgramProposer
from headrace.request import Request


def speculates(req: Request) -> bool:
    """Greedy or sampled, from the model's logits as they are or with temperature, top-k,
    top-p and min-p: no logprobs (a draft's would be the row's, not a plain step's), no
    grammar, no logits processors (penalties would have to count the drafts as output)."""
    params = req.params
    return params.logprobs is None and params.grammar is None and not params.processes_logits


def drafts_for(req: Request, proposer: NgramProposer, max_model_len: int, budget: int) -> list[int]:
    """Drafts for `req`'s next decode step, within its max_tokens, the model's length and the
    step's budget (one token of which is the request's own last token)."""
    limit = min(
        req.params.max_tokens - req.num_output_tokens - 1,  # the step yields 1 + accepted
        max_model_len - req.num_tokens,  # positions of the drafts
        budget - 1,
    )
    if req.draft_window is not None:
        limit = min(limit, req.draft_window)
    if limit <= 0 or not speculates(req):
        return []
    return proposer.propose(req.all_token_ids, limit)


def next_window(window: int, drafted: int, accepted: int, most: int) -> int:
    """The drafts a request's next step may carry after `accepted` of `drafted` were kept:
    twice as many after all were kept (up to `most`), the kept ones and one more otherwise."""
    if accepted == drafted:
        return min(most, max(window, drafted) * 2)
    return max(1, accepted + 1)


def accept(first: int, drafts: Sequence[int], picks: Sequence[int]) -> list[int]:
    """The tokens a speculative step produced: the pick after the last token (`first`), then
    each draft's pick for as long as every draft before equals the model's pick there.

    picks[i] is the model's token after drafts[i]: its greedy pick, or a draw from the
    request's distribution there (see the module's docstring for why that is exact).
    """
    out = [first]
    for draft, pick in zip(drafts, picks, strict=False):
        if draft != out[-1]:
            break
        out.append(pick)
    return out
