"""Logits processors: repetition, frequency and presence penalties, logit_bias, and the bans of
min_tokens and bad_words, per request inside one batch.

Each processor gathers the (row, token) pairs of the requests that use it (a loop over those
requests, never over the vocabulary) and changes the [R, V] float32 logits with one indexed
op. The order, as docs/api.md gives it: repetition penalty, frequency and presence penalties,
logit_bias, then the bans, so that a ban is final. Greedy requests take the argmax of the
result; drawn ones go on to temperature, min_p, top-k and top-p (sampler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

from headrace.engine.outputs import LogitsInputs, ScheduledRequest
from headrace.engine.runner.token_counts import (
    frequency_presence_on_device,
    repetition_on_device,
)
from headrace.kernels.host_copy import to_device
from headrace.request import PENDING_TOKEN

Pairs = tuple[torch.Tensor, torch.Tensor]  # rows [P], tokens [P] (int64)


def apply_processors(
    logits: torch.Tensor, reqs: Sequence[ScheduledRequest], last: torch.Tensor | None = None
) -> torch.Tensor:
    """logits [R, V] float32, one row per request (each with `logits_inputs`): changed in
    place and returned. `last` [R]: each row's token of the step in flight, for a history
    that ends in its placeholder (--async-scheduling). On CUDA, or with `last`, the penalties
    count on the device (token_counts.py), with nothing read back."""
    inputs = [_inputs(r) for r in reqs]
    params = [r.params for r in reqs]
    dense = logits.is_cuda or last is not None
    if any(p.repetition_penalty != 1 for p in params):
        repetition_penalty(logits, [p.repetition_penalty for p in params], inputs, dense, last)
    if any(p.frequency_penalty != 0 or p.presence_penalty != 0 for p in params):
        frequency_presence(
            logits,
            [p.frequency_penalty for p in params],
            [p.presence_penalty for p in params],
            [i.output_token_ids for i in inputs],
            dense,
            last,
        )
    if any(p.logit_bias for p in params):
        add_logit_bias(logits, [p.logit_bias for p in params])
    banned, if_last = [], []  # if_last: (row, token, the in-flight token that bans it)
    for row, (i, p) in enumerate(zip(inputs, params, strict=True)):
        words, pending = _word_bans(i.output_token_ids, p.bad_words)
        banned.append([*i.banned_token_ids, *words])
        if_last += [(row, t, need) for t, need in pending]
    if any(banned):
        ban(logits, banned)
    if if_last:
        ban_if_last(logits, if_last, last)
    return logits


def _word_bans(
    output: list[int], words: tuple[tuple[int, ...], ...]
) -> tuple[list[int], list[tuple[int, int]]]:
    """The bad words' bans: sure ones, and (token, need) pairs where the output's last token
    is still in flight (a placeholder)."""
    if words and output[-1:] == [PENDING_TOKEN]:
        return bans_after_pending(output, words)
    return bad_word_bans(output, words) if words else [], []


def _inputs(req: ScheduledRequest) -> LogitsInputs:
    if req.logits_inputs is None:
        raise ValueError(f"request {req.request_id} has no logits inputs")
    return req.logits_inputs


def repetition_penalty(
    logits: torch.Tensor,
    penalties: list[float],
    inputs: list[LogitsInputs],
    dense: bool = False,
    last: torch.Tensor | None = None,
) -> None:
    """Each distinct token t of prompt + output: l_t / r where l_t > 0, else l_t * r."""
    ids = [i.prompt_token_ids + i.output_token_ids if r != 1 else [] for r, i in zip(
        penalties, inputs, strict=True
    )]  # fmt: skip
    if dense:
        repetition_on_device(logits, penalties, ids, last)
        return
    rows, toks, _ = distinct_pairs(ids, logits.shape[1], logits.device)
    if rows.numel() == 0:
        return
    r = to_device(penalties, logits.device, logits.dtype)[rows]  # [P]
    values = logits[rows, toks]  # [P]
    logits[rows, toks] = torch.where(values > 0, values / r, values * r)


def frequency_presence(
    logits: torch.Tensor,
    frequency: list[float],
    presence: list[float],
    outputs: list[list[int]],
    dense: bool = False,
    last: torch.Tensor | None = None,
) -> None:
    """Each token t generated c_t > 0 times so far: l_t - c_t * frequency - presence."""
    used = [f != 0 or p != 0 for f, p in zip(frequency, presence, strict=True)]
    ids = [out if u else [] for out, u in zip(outputs, used, strict=True)]
    if dense:  # the same sums: c_t * f + p where c_t > 0, 0 elsewhere
        frequency_presence_on_device(logits, frequency, presence, ids, last)
        return
    rows, toks, counts = distinct_pairs(ids, logits.shape[1], logits.device)
    if rows.numel() == 0:
        return
    f = to_device(frequency, logits.device, logits.dtype)[rows]  # [P]
    p = to_device(presence, logits.device, logits.dtype)[rows]  # [P]
    logits.index_put_((rows, toks), -(counts.to(logits.dtype) * f + p), accumulate=True)


def add_logit_bias(logits: torch.Tensor, biases: list[tuple[tuple[int, float], ...]]) -> None:
    """l_t + b_t for each (t, b_t) of a request's logit_bias (ids outside the vocabulary are
    skipped; the front end refuses them)."""
    vocab = logits.shape[1]
    entries = [(row, t, b) for row, pairs in enumerate(biases) for t, b in pairs if t < vocab]
    if not entries:
        return
    rows, toks, values = zip(*entries, strict=True)
    index = _long(rows, logits.device), _long(toks, logits.device)
    bias = to_device(values, logits.device, logits.dtype)  # [P]
    logits.index_put_(index, bias, accumulate=True)


def ban(logits: torch.Tensor, banned: list[list[int]]) -> None:
    """l_t = -inf for each token t in a row's list (ids outside the vocabulary are skipped)."""
    vocab = logits.shape[1]
    entries = [(row, t) for row, toks in enumerate(banned) for t in toks if t < vocab]
    if not entries:
        return
    rows, toks = zip(*entries, strict=True)
    index = _long(rows, logits.device), _long(toks, logits.device)
    logits.index_put_(index, logits.new_full((), float("-inf")))  # a fill, not a copy


def ban_if_last(
    logits: torch.Tensor, entries: list[tuple[int, int, int]], last: torch.Tensor | None
) -> None:
    """l_t = -inf for each (row, t, need) whose row's token in flight (`last` [R], on the
    device) is `need`: a bad word whose next-to-last token is that token."""
    entries = [e for e in entries if e[1] < logits.shape[1]]
    if not entries:
        return
    if last is None:
        raise ValueError("a bad word waits on a pending token, and no step in flight holds it")
    rows, toks, need = (_long(column, logits.device) for column in zip(*entries, strict=True))
    hit = last.index_select(0, rows) == need  # [P]
    # a minimum, so that a token two words ban under different conditions keeps either ban
    # (in any order), and a +inf logit banned is -inf, not NaN
    cap = torch.where(hit, float("-inf"), float("inf")).to(logits.dtype)
    flat = logits.view(-1)  # the processors' own contiguous copy
    flat.scatter_reduce_(0, rows * logits.shape[1] + toks, cap, "amin")


def bans_after_pending(
    output: list[int], words: tuple[tuple[int, ...], ...]
) -> tuple[list[int], list[tuple[int, int]]]:
    """For an output whose last token is still a placeholder (--async-scheduling): the bans
    sure whatever it is (one-token words), and (token, need) pairs, banned if it is `need`
    (the word's other tokens before it end the known output)."""
    sure, pending = [], []
    for word in words:
        n = len(word) - 1
        if n == 0:
            sure.append(word[-1])
        elif n <= len(output) and tuple(output[len(output) - n : -1]) == word[:-2]:
            pending.append((word[-1], word[-2]))
    return sure, pending


def bad_word_bans(output: list[int], words: tuple[tuple[int, ...], ...]) -> list[int]:
    """The last token of each word whose other tokens end the output (a one-token word:
    always)."""
    banned = []
    for word in words:
        n = len(word) - 1
        if n == 0 or (n <= len(output) and tuple(output[len(output) - n :]) == word[:-1]):
            banned.append(word[-1])
    return banned


def distinct_pairs(
    ids: list[list[int]], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct (row, token) pairs of each row's token list, with their counts: rows [P],
    tokens [P], counts [P] (int64). Tokens outside the vocabulary are dropped."""
    lengths = [len(x) for x in ids]
    flat = list(chain.from_iterable(ids))
    if not flat:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return empty, empty, empty
    toks = torch.tensor(flat, dtype=torch.int64)  # [N]
    rows = torch.repeat_interleave(torch.arange(len(ids)), torch.tensor(lengths))  # [N]
    keys = to_device((rows * vocab + toks)[toks < vocab], device)  # [N']
    unique, counts = torch.unique(keys, return_counts=True)  # [P]
    return unique // vocab, unique % vocab, counts


def _long(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return to_device(values, device, torch.int64)
