"""Per-request sampling in one batch: greedy, temperature, min-p, top-k, top-p, seeds, logprobs.

Requests with logits processors (penalties, logit_bias, min_tokens, bad_words: their
ScheduledRequest has `logits_inputs`) get their rows copied to float32 and processed
(logits_processors.py) before the same choice; the other rows take the plain path untouched.

A draw is inverse-CDF sampling with one uniform number per request, over the request's whole
row or its top_p set, in vocabulary order: on the CPU in C (kernels/sample_draw.c), elsewhere
with torch (top_p.py's set, then `_inverse_cdf`; on CUDA top_p_fixed.py's cut of the whole
row, which reads nothing back). For a seeded request that number is a hash of (seed,
num_output_tokens), so the same request gives the same tokens whatever else shares its batch,
and again after preemption and recompute.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

import torch

from headrace.engine.messages import TokenLogprobs
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner import top_p_fixed
from headrace.engine.runner.logits_processors import apply_processors
from headrace.engine.runner.logprobs import logprob_table, read_logprobs
from headrace.engine.runner.top_p import top_p_sets
from headrace.engine.runner.top_p_fixed import top_p_cut
from headrace.kernels import sample_draw
from headrace.kernels.argmax import argmax_rows
from headrace.kernels.host_copy import to_device
from headrace.request import GREEDY_BELOW_TEMPERATURE, PENDING_TOKEN


def seeded_uniform(seed: int, step: int) -> float:
    """A number in [0, 1) fixed by (seed, step)."""
    digest = hashlib.sha256(f"headrace:{seed}:{step}".encode()).digest()
    return (int.from_bytes(digest[:8], "little") >> 11) / float(1 << 53)


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)  # for requests without a seed
        # The tokens of a launched step not yet read, on the device, by request (None: 0),
        # where a processor's history (penalties, bad words) ends in a placeholder: the
        # runner's LastTokens.tokens_of
        self.in_flight: Callable[[Sequence[str | None]], torch.Tensor] | None = None

    def __call__(
        self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """logits [S, V] (any float dtype), one row per request -> token ids and logprobs
        (logprobs from the raw logits, before any processor, as OpenAI and vLLM)."""
        tokens = self.pick(logits, requests)
        table = logprob_table(logits, requests, tokens)
        chosen = tokens.tolist()
        packed = table.packed.tolist() if table is not None else []
        return chosen, read_logprobs(table, len(requests), chosen, packed)

    def pick(self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> torch.Tensor:
        """logits [S, V] -> token ids [S] on the logits' device, each row's logits processors
        applied first (nothing read back: a step launched ahead of its tokens picks so)."""
        processed = [i for i, r in enumerate(requests) if r.logits_inputs is not None]
        tokens = self.choose(logits, requests, skip=processed)  # [S]
        if processed:
            rows = to_device(processed, logits.device, torch.int64)
            subset = [requests[i] for i in processed]
            every = len(processed) == len(requests)
            own = logits.float() if every else logits.index_select(0, rows).float()
            if own is logits:  # already float32: the raw logits stay for the logprobs
                own = own.clone()
            x = apply_processors(own, subset, self._placeholders(subset))  # [P, V] float32
            tokens[rows] = self.choose(x, subset)
        return tokens

    def _placeholders(self, reqs: Sequence[ScheduledRequest]) -> torch.Tensor | None:
        """[P] each row's token of the step in flight where its history ends in its
        placeholder (--async-scheduling), else None."""
        ends = [r.request_id if _ends_pending(r) else None for r in reqs]
        if not any(ends):
            return None
        if self.in_flight is None:
            raise ValueError(f"request {next(filter(None, ends))}: a pending token in its history")
        return self.in_flight(ends)

    def draw_after_drafts(
        self, logits: torch.Tensor, owners: Sequence[ScheduledRequest], ahead: Sequence[int]
    ) -> list[int]:
        """logits [D, V]: the rows after the drafts of sampled requests without logits
        processors (speculation.py) -> one draw per row from its request's distribution. Row i
        is its request's token `ahead[i]` places past the next one: a seeded request's draw
        there uses the seed's number for that output index, as a plain step would."""
        return [int(t) for t in self._draw(logits, list(owners), ahead).tolist()]

    def choose(
        self, logits: torch.Tensor, requests: Sequence[ScheduledRequest], skip: Sequence[int] = ()
    ) -> torch.Tensor:
        """logits [S, V] -> token ids [S], on the logits' device (no logprobs, no processors:
        rows in `skip` get an argmax to be replaced)."""
        skipped = set(skip)
        if len(skipped) == len(requests):
            return torch.empty(len(requests), dtype=torch.int64, device=logits.device)
        drawn = [i for i, r in enumerate(requests) if not r.params.greedy and i not in skipped]
        if not drawn:  # greedy needs no float32 copy of a [S, 262k] bf16 tensor
            return argmax_rows(logits)
        drawn_set = set(drawn)
        greedy = [i for i in range(len(requests)) if i not in drawn_set]
        tokens = torch.empty(len(requests), dtype=torch.int64, device=logits.device)
        if greedy:
            rows = to_device(greedy, logits.device, torch.int64)
            tokens[rows] = argmax_rows(logits.index_select(0, rows))
        rows = to_device(drawn, logits.device, torch.int64)
        sub = logits if len(drawn) == len(logits) else logits.index_select(0, rows)
        tokens[rows] = self._draw(sub, [requests[i] for i in drawn])
        return tokens

    def _draw(
        self,
        logits: torch.Tensor,
        reqs: list[ScheduledRequest],
        ahead: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """logits [R, V] (any float dtype) -> token ids [R]; `ahead`: each row's output index
        past the request's next token (0 for all when None). Each row draws from softmax over
        its logits / temperature (after min_p and top_k), kept to its top_p set."""
        # Greedy requests never come here; the floor keeps a division by ~0 out regardless.
        temps = [max(r.params.temperature, GREEDY_BELOW_TEMPERATURE) for r in reqs]
        offsets = ahead if ahead is not None else [0] * len(reqs)
        uniforms = [self._uniform(r, k) for r, k in zip(reqs, offsets, strict=True)]
        ps = [r.params.top_p for r in reqs]
        vocab = logits.shape[1]
        plain = not any(r.params.min_p > 0 or 0 < r.params.top_k < vocab for r in reqs)
        x = logits if plain else _cut(logits, reqs, temps)
        if sample_draw.supported(x):  # the CPU: no float32 copy of plain rows, no list
            drawn = sample_draw.draw(x, temps if plain else [1.0] * len(reqs), ps, uniforms)
            if drawn is not None:
                return drawn
        return _draw_torch(_cut(logits, reqs, temps) if plain else x, ps, uniforms)

    def _uniform(self, req: ScheduledRequest, ahead: int = 0) -> float:
        if req.params.seed is None:
            return self._rng.random()
        step = req.params.seed_offset + req.num_output_tokens + ahead
        return seeded_uniform(req.params.seed, step)


def _ends_pending(req: ScheduledRequest) -> bool:
    inputs = req.logits_inputs
    return inputs is not None and inputs.output_token_ids[-1:] == [PENDING_TOKEN]


def _cut(logits: torch.Tensor, reqs: list[ScheduledRequest], temps: list[float]) -> torch.Tensor:
    """[R, V] float32: each row's logits over its temperature, min_p and top_k applied."""
    x = logits.float() / to_device(temps, logits.device, torch.float32)[:, None]
    x = _min_p(x, [r.params.min_p for r in reqs])
    return _top_k(x, [r.params.top_k for r in reqs])


def _draw_torch(x: torch.Tensor, ps: list[float], uniforms: list[float]) -> torch.Tensor:
    """x [R, V] float32 -> [R] token ids: top_p.py's sets, then the inverse CDF."""
    device = x.device
    u = to_device(uniforms, device, torch.float32)
    if top_p_fixed.takes(x):  # CUDA: the same ops whatever the rows, nothing read back
        cut = any(p < 1.0 for p in ps)
        return _inverse_cdf(top_p_cut(x, to_device(ps, device, torch.float64)) if cut else x, u)
    sets = top_p_sets(x, ps)
    if sets is None:
        return _inverse_cdf(x, u)
    tokens = torch.empty(len(x), dtype=torch.int64, device=device)
    rows = to_device(sets.rows, device, torch.int64)
    picks = _inverse_cdf(sets.logits, u[rows])  # a top_p row: from its set alone
    tokens[rows] = sets.ids.gather(1, picks[:, None]).squeeze(1)
    if len(sets.rows) < len(x):
        rest = to_device(sorted(set(range(len(x))) - set(sets.rows)), device, torch.int64)
        tokens[rest] = _inverse_cdf(x.index_select(0, rest), u[rest])
    return tokens


def _inverse_cdf(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """x [R, W] logits (-inf: not allowed), u [R] in [0, 1) -> [R] column of each row's draw:
    the first whose cumulative probability, in column order, exceeds u."""
    probs = torch.softmax(x, dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]  # [R, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)  # first cdf > target: p > 0
    # Rounding can push the target to the very end; fall back to the likeliest token.
    return torch.where(idx >= probs.shape[1], argmax_rows(probs), idx)


def _min_p(x: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Keep each row's tokens whose probability is at least p times the likeliest one's
    (x, the sampler's own tensor, is changed in place)."""
    rows = [i for i, p in enumerate(ps) if p > 0]
    if not rows:
        return x
    index = to_device(rows, x.device, torch.int64)
    sub = x.index_select(0, index)  # [R', V]
    probs = torch.softmax(sub, dim=-1)
    p = to_device([ps[i] for i in rows], x.device, probs.dtype)[:, None]
    floor = p * probs.max(dim=-1, keepdim=True).values  # [R', 1]
    x[index] = sub.masked_fill(probs < floor, float("-inf"))
    return x


def _top_k(x: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Keep each row's k largest (ties at the k-th kept); k = 0 keeps all."""
    vocab = x.shape[1]
    if not any(0 < k < vocab for k in ks):
        return x
    k_max = max(k for k in ks if 0 < k < vocab)
    top = torch.topk(x, k_max, dim=-1).values  # [R, k_max]
    k_idx = torch.tensor([min(k, k_max) - 1 if 0 < k < vocab else k_max - 1 for k in ks])
    kth = top.gather(1, to_device(k_idx, x.device)[:, None])  # [R, 1]
    active = to_device([0 < k < vocab for k in ks], x.device, torch.bool)[:, None]
    return x.masked_fill(active & (x < kth), float("-inf"))
