"""The checks a sampling setting passes where a request is built (`SamplingParams.validate`):
integers and finite reals in their ranges, logit_bias pairs, bad_words sequences; and the
limits on the last two, which the HTTP schemas and the replica wire share."""

from __future__ import annotations

import math

INT32_MAX = (1 << 31) - 1  # counts (max_tokens, top_k, token ids) fit an int32
MAX_LOGIT_BIAS = 100.0  # biases in [-100, 100]
MAX_LOGIT_BIAS_ENTRIES = 300  # as OpenAI
MAX_BAD_WORD_SEQUENCES = 128  # token sequences (a word gives one or two: with a leading space)
MAX_BAD_WORD_TOKENS = 64  # tokens in one sequence


def check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def check_range(name: str, value: object, lo: float, hi: float) -> None:
    if not lo <= check_real(name, value) <= hi:
        raise ValueError(f"{name} must be in [{lo:g}, {hi:g}], got {value}")


def check_logit_bias(pairs: object) -> None:
    if not isinstance(pairs, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        raise ValueError(f"logit_bias must be a tuple of (token id, bias) pairs, got {pairs!r}")
    if len(pairs) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(
            f"logit_bias has {len(pairs)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are accepted"
        )
    for token, bias in pairs:
        check_int("logit_bias token id", token, 0, INT32_MAX)
        check_range("logit_bias value", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    if len({token for token, _ in pairs}) != len(pairs):
        raise ValueError("logit_bias names a token id twice")


def check_bad_words(seqs: object) -> None:
    if not isinstance(seqs, tuple) or not all(isinstance(s, tuple) and s for s in seqs):
        raise ValueError(f"bad_words must be a tuple of non-empty token id tuples, got {seqs!r}")
    if len(seqs) > MAX_BAD_WORD_SEQUENCES:
        raise ValueError(
            f"bad_words gives {len(seqs)} token sequences; at most {MAX_BAD_WORD_SEQUENCES}"
        )
    for seq in seqs:
        if len(seq) > MAX_BAD_WORD_TOKENS:
            raise ValueError(f"a bad word has {len(seq)} tokens; at most {MAX_BAD_WORD_TOKENS}")
        for token in seq:
            check_int("bad_words token id", token, 0, INT32_MAX)


def check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return float(value)
