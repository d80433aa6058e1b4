"""docs/api.md's logits-processor formulas written out one token at a time: the reference the
vectorized processors are checked against."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from headrace.request import SamplingParams


def reference(
    raw: torch.Tensor,
    p: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    eos: tuple[int, ...],
) -> torch.Tensor:
    """docs/api.md's formulas, one token at a time: raw [V] -> processed [V]."""
    x = raw.clone()
    if p.repetition_penalty != 1:
        for t in set(prompt) | set(output):
            v = float(x[t])
            x[t] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
    for t, c in Counter(output).items():
        x[t] = x[t] - c * p.frequency_penalty - p.presence_penalty
    for t, b in p.logit_bias:
        x[t] = x[t] + b
    if len(output) < p.min_tokens:
        for t in (() if p.ignore_eos else eos) + p.stop_token_ids:
            x[t] = -math.inf
    for word in p.bad_words:
        n = len(word) - 1
        if n == 0 or (n <= len(output) and tuple(output[len(output) - n :]) == word[:-1]):
            x[word[-1]] = -math.inf
    return x
