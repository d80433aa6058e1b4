"""The logits-processor fields of a request as `SamplingParams` values, once the engine (and so
the tokenizer) is known: logit_bias keys become token ids below the vocabulary, bad_words
become token-id sequences. A bad value is a 400 naming the field."""

from __future__ import annotations

from typing import Any

from headrace.api.errors import bad_request
from headrace.api.schemas import SamplingFields
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.param_checks import MAX_BAD_WORD_TOKENS


def processor_params(body: SamplingFields, tokenizer: Tokenizer, max_tokens: int) -> dict[str, Any]:
    """SamplingParams keyword arguments; null fields are off."""
    min_tokens = body.min_tokens or 0
    if min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens"
        )
    vocab = int(tokenizer.vocab_size)
    return {
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        "min_p": body.min_p or 0.0,
        "min_tokens": min_tokens,
        "logit_bias": logit_bias_pairs(body.logit_bias or {}, vocab),
        "bad_words": bad_word_sequences(tokenizer, body.bad_words or []),
    }


def logit_bias_pairs(bias: dict[str, float], vocab: int) -> tuple[tuple[int, float], ...]:
    """{"id": bias} -> ((id, bias), ...), every id below `vocab` and named once."""
    pairs = tuple((int(key), float(value)) for key, value in bias.items())
    for token, _ in pairs:
        if token >= vocab:
            raise bad_request(
                f"logit_bias: token id {token} is outside the vocabulary [0, {vocab})",
                "logit_bias",
            )
    if len({token for token, _ in pairs}) != len(pairs):
        raise bad_request("logit_bias names a token id twice", "logit_bias")
    return pairs


def bad_word_sequences(tokenizer: Tokenizer, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """As vLLM: each word tokenized alone and after a space (at the start of the text and in
    its middle), without special tokens; distinct sequences in order."""
    seqs: dict[tuple[int, ...], None] = {}
    for word in words:
        word = word.lstrip()
        if not word:
            raise bad_request("bad_words: a word is empty or only spaces", "bad_words")
        for text in (word, " " + word):
            ids = tuple(tokenizer.encode(text, add_special_tokens=False))
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise bad_request(
                    f"bad_words: {word[:32]!r} is {len(ids)} tokens; at most {MAX_BAD_WORD_TOKENS}",
                    "bad_words",
                )
            if ids:
                seqs[ids] = None
    return tuple(seqs)
