"""Draft tokens by prompt lookup: speculative decoding without a draft model.

If the last few tokens of a sequence occurred earlier in it (in the prompt, or in what it has
generated: a small model's greedy output loops), the tokens that followed that occurrence are a
guess at what comes next. The model checks the guesses in one step (scheduler and runner), and
greedy decoding keeps exactly the guesses it would have produced itself, so the output is the
same with or without drafts; only the number of steps changes.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NgramProposer:
    num_tokens: int  # drafts per step (k); 0 turns speculation off
    max_ngram: int = 4  # the longest suffix looked up first; a longer match is a better guess
    min_ngram: int = 2  # below this, matches are too often chance
    window: int = 2048  # how far back to look: bounds the cost per step of a long sequence

    def propose(self, tokens: Sequence[int], limit: int | None = None) -> list[int]:
        """min(k, limit) tokens that followed the latest earlier occurrence of the longest
        suffix of `tokens` (between max_ngram and min_ngram long); [] if there is none."""
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        n_tok = len(tokens)
        if k <= 0 or n_tok <= self.min_ngram:
            return []
        recent = tokens[max(0, n_tok - self.window) :]
        buf = array("i", recent).tobytes()
        for n in range(min(self.max_ngram, len(recent) - 1), self.min_ngram - 1, -1):
            start = _latest_match(buf, n)
            if start is not None:
                return _continuation(recent, start + n, len(recent) - n - start, k)
        return []


def _continuation(tokens: Sequence[int], follow: int, period: int, k: int) -> list[int]:
    """k tokens from `follow` on; past the end, the loop between the match and the suffix
    (`period` tokens long) is assumed to go on."""
    out = list(tokens[follow : follow + k])
    while len(out) < k:
        out.append(out[len(out) - period])
    return out


def _latest_match(buf: bytes, n: int) -> int | None:
    """Token index of the latest occurrence of the last n tokens that ends before the last
    token. `buf` holds the tokens as 4-byte integers, so that bytes.rfind does the scan in C."""
    pattern = buf[-4 * n :]
    end = len(buf) - 4
    while (pos := buf.rfind(pattern, 0, end)) >= 0:
        if pos % 4 == 0:
            return pos // 4
        end = pos + 4 * n - 1  # straddles two tokens: look before it
    return None
