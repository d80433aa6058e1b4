"""One step's token picks from its hidden rows: the int8 greedy head for every plain greedy row,
the full head and the sampler for the rest (a sampled request's draft rows draw from its
distribution there: speculative sampling, speculation.py).

The int8 head picks the argmax of the full-precision logits; the full head's bf16 logits round
near-ties together, so the two can pick different tokens for the same row. A plain greedy row
therefore always goes to the int8 head where the runner has one, whatever shares its step (a
sampled neighbour, a grammar, more rows than the head's sweet spot): a greedy request's tokens
do not depend on its neighbours. The other rows (sampled, logprobs, grammar, processors) and the
drafts of such requests take the full head's logits as before, except the plain sampled rows
(engine/runner/screened_sampler.py: no processors, logprobs, grammar or seed), which the runner's
screened sampler draws exactly from the int8 head's bounds where it has one, unless they are at
most the screened sampler's `few_rows`: the model has a head that cheap for them (its GGUF's
Q8_0 head: reading it costs what the int8 envelope does, and the full logits spare the
rejection), or more than its `max_rows` (without AMX the full head is faster for that many).
A speculating step's draft rows of such requests go there too where all of the step's sampled
rows can and they are at most WITH_DRAFTS: a draft row's pick is a draw from its request's
distribution there (speculative sampling), the same whichever way it is drawn (an
unseeded request's).

Rows: the step's sampled rows, one per request, then the draft rows, request after request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from headrace.engine.messages import TokenLogprobs
from headrace.engine.outputs import RunnerOutput, ScheduledRequest
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.screened_sampler import VNNI_MAX_ROWS, ScreenedSampler
from headrace.engine.runner.structured import GrammarEnds, GrammarMasks
from headrace.kernels.argmax import argmax_rows
from headrace.kernels.build import switched_on
from headrace.kernels.host_copy import to_device
from headrace.kernels.int8_head import Int8GreedyHead
from headrace.kernels.int8_head import supported as int8_head_supported
from headrace.kernels.int8_screen import MIN_ROWS
from headrace.models.base import CausalLM

log = logging.getLogger("headrace.engine.runner.model_runner")  # the runner's load-time lines

# Most sampled rows (own and drafts together) of a speculating step that the screened sampler
# draws: a few-row step's full head costs about what one row's does, the screened rows each
# their own (bench/sampled_head.py: 1.46x the full head at 4 top_p rows, 1.41x at 4 rows of
# plain temperature); past it the full head takes them all.
WITH_DRAFTS = 4


@dataclass(frozen=True)
class StepPicks:
    tokens: list[int]  # [S] one per sampled request
    logprobs: list[TokenLogprobs | None]  # [S]
    draft_tokens: list[int]  # [D] the token after each draft row: greedy, or drawn
    ends: GrammarEnds  # constrained requests that end here without a token


def plain_greedy(r: ScheduledRequest) -> bool:
    """Greedy on the raw logits: no logprobs, no grammar mask, no logits processors."""
    return r.params.argmax_only and r.logits_inputs is None


def head_rows(sampled: list[ScheduledRequest]) -> list[bool]:
    """Per row (sampled rows, then draft rows): whether it belongs to a plain greedy request."""
    own = [plain_greedy(r) for r in sampled]
    return own + [g for r, g in zip(sampled, own, strict=True) for _ in r.draft_token_ids]


def head_argmax(head: Int8GreedyHead, x: torch.Tensor) -> list[int]:
    """The int8 head over any number of rows: each row's pick is its own (blocks of
    `max_rows`, past which the head is slower than the full head but still exact)."""
    step = max(head.max_rows, 1)
    return [t for at in range(0, len(x), step) for t in head.argmax(x[at : at + step]).tolist()]


def pick_tokens(
    rows: torch.Tensor,  # [S + D, H]
    sampled: list[ScheduledRequest],
    head: Int8GreedyHead | None,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    sampler: Sampler,
    grammars: GrammarMasks,
    screened: ScreenedSampler | None = None,
) -> StepPicks:
    s, n = len(sampled), len(rows)
    greedy = head_rows(sampled) if head is not None else [False] * n
    flat = [0] * n
    on_head = [i for i in range(n) if greedy[i]]
    if head is not None and on_head:
        x = rows if len(on_head) == n else rows[on_head]  # all greedy: no copy
        for i, t in zip(on_head, head_argmax(head, x), strict=True):
            flat[i] = t
    own = [i for i in range(s) if not greedy[i]]
    drafts = [i for i in range(s, n) if not greedy[i]]
    full_rows = len(own) + len(drafts)
    # a few-row step's full head is cheap (few_rows), a many-row step's too for each row
    # (max_rows); a speculating step's pays for all its rows
    screen = not drafts or full_rows <= WITH_DRAFTS
    if screened is not None and own and screened.worth(full_rows) and screen:
        own, drafts = _draw_screened(rows, sampled, own, drafts, screened, sampler, flat)
    logprobs: list[TokenLogprobs | None] = [None] * s
    ends = GrammarEnds()  # none on the int8 head: a constrained row never goes there
    if own or drafts:
        ends = _full_head(
            rows, sampled, own, drafts, compute_logits, sampler, grammars, flat, logprobs
        )
    return StepPicks(flat[:s], logprobs, flat[s:], ends)


def _full_head(
    rows: torch.Tensor,
    sampled: list[ScheduledRequest],
    own: list[int],
    drafts: list[int],
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    sampler: Sampler,
    grammars: GrammarMasks,
    flat: list[int],
    logprobs: list[TokenLogprobs | None],
) -> GrammarEnds:
    """Rows `own` (sampled) and `drafts` from the full head's logits, into `flat` and
    `logprobs`; the constrained requests that end here."""
    s, n = len(sampled), len(rows)
    full = rows if len(own) + len(drafts) == n else rows[own + drafts]
    logits = compute_logits(full)  # [S' + D', V]
    k = len(own)
    reqs = [sampled[i] for i in own]
    ends = grammars.apply(logits[:k], reqs)
    tokens, lps = sampler(logits[:k], reqs) if k else ([], [])
    for i, t, lp in zip(own, tokens, lps, strict=True):
        flat[i], logprobs[i] = t, lp
    if drafts:
        picks = after_drafts(logits[k:], [i - s for i in drafts], sampled, sampler)
        for i, t in zip(drafts, picks, strict=True):
            flat[i] = t
    return ends


def runner_output(sampled: list[ScheduledRequest], picked: StepPicks) -> RunnerOutput:
    """The step's picks by request id; a request that ends here has no token (`picked.ends`)."""
    picks = _split_picks(sampled, picked.draft_tokens)
    ids = [r.request_id for r in sampled]
    ends = picked.ends
    lps: dict[str, TokenLogprobs] = {
        i: lp
        for i, lp in zip(ids, picked.logprobs, strict=True)
        if lp is not None and i not in ends
    }
    tokens = {i: t for i, t in zip(ids, picked.tokens, strict=True) if i not in ends}
    return RunnerOutput(tokens, lps, picks, stopped=ends.stopped, errors=ends.errors)


def _split_picks(sampled: list[ScheduledRequest], flat: list[int]) -> dict[str, list[int]]:
    """The greedy token after each draft, per request (`flat`: request after request)."""
    picks: dict[str, list[int]] = {}
    at = 0
    for r in sampled:
        if r.draft_token_ids:
            picks[r.request_id] = flat[at : at + len(r.draft_token_ids)]
            at += len(r.draft_token_ids)
    return picks


def after_drafts(
    logits: torch.Tensor,  # [D', V] the full head's rows for these draft rows
    rows: list[int],  # their indices among all the step's draft rows
    sampled: list[ScheduledRequest],
    sampler: Sampler,
) -> list[int]:
    """The token after each draft row: a greedy request's argmax, a sampled request's draw
    from its distribution there (speculative sampling: speculation.py)."""
    owners = [(r, j + 1) for r in sampled for j in range(len(r.draft_token_ids))]
    drawn = [n for n, row in enumerate(rows) if not owners[row][0].params.greedy]
    if not drawn:
        return [int(t) for t in argmax_rows(logits).tolist()]
    picks = [0] * len(rows)
    drawn_set = set(drawn)
    greedy = [n for n in range(len(rows)) if n not in drawn_set]
    if greedy:
        index = to_device(greedy, logits.device, torch.int64)
        for n, t in zip(greedy, argmax_rows(logits[index]).tolist(), strict=True):
            picks[n] = int(t)
    index = to_device(drawn, logits.device, torch.int64)
    reqs = [owners[rows[n]][0] for n in drawn]
    ahead = [owners[rows[n]][1] for n in drawn]
    for n, t in zip(drawn, sampler.draw_after_drafts(logits[index], reqs, ahead), strict=True):
        picks[n] = t
    return picks


def _draw_screened(
    rows: torch.Tensor,
    sampled: list[ScheduledRequest],
    own: list[int],
    drafts: list[int],
    screened: ScreenedSampler,
    sampler: Sampler,
    flat: list[int],
) -> tuple[list[int], list[int]]:
    """Draw the plain sampled rows of `own` and `drafts` from the int8 head (into `flat`); the
    rows left for the full head. Draft rows only when every row of the step can go (else the
    full head's pass is paid anyway, and the envelope's would come on top)."""
    reqs = sampled + [r for r in sampled for _ in r.draft_token_ids]  # each row's request
    take = [i for i in own + drafts if screened.takes(reqs[i])]
    if len(take) < screened.min_rows or (drafts and len(take) < len(own) + len(drafts)):
        return own, drafts
    done = set()
    for i, t in zip(take, screened(rows[take], [reqs[i] for i in take], sampler), strict=True):
        if t is not None:
            flat[i] = t
            done.add(i)
    return [i for i in own if i not in done], [i for i in drafts if i not in done]


def int8_greedy_head(model: CausalLM) -> Int8GreedyHead | None:
    """An int8 copy of a tied bf16 head on the CPU. The final softcap (tanh) keeps the order of
    the logits, so the argmax needs no cap."""
    if model.lm_head is not None or not int8_head_supported(model.embed_weight):
        return None
    head = Int8GreedyHead(model.embed_weight)
    kind = "AMX, two limbs" if head.one_limb is None else f"VNNI, one limb from {MIN_ROWS} rows"
    log.info("int8 greedy head ready (%s): greedy steps of up to %d rows", kind, head.max_rows)
    return head


def screened_sampler(model: CausalLM, head: Int8GreedyHead | None) -> ScreenedSampler | None:
    """Plain sampled rows from the int8 head (exact), unless `HEADRACE_SCREENED_SAMPLER=0`: the
    envelope bounds the raw logits, so a model with a final softcap keeps the full head."""
    if (
        head is None
        or model.args.final_logit_softcapping
        or not switched_on("HEADRACE_SCREENED_SAMPLER")
    ):
        return None
    max_rows = None if head.one_limb is None else VNNI_MAX_ROWS  # one_limb: no AMX
    return ScreenedSampler(head, few_rows=model.few_row_head, max_rows=max_rows)
