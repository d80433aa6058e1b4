"""The engine's per-token logprobs in the two OpenAI shapes (completions and chat)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import TokenLogprobs


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    text: str = tokenizer.decode([token_id])
    return text


def completion_logprobs(
    tokenizer: Tokenizer, items: Sequence[TokenLogprobs], offset: int = 0
) -> dict[str, Any]:
    """`{tokens, token_logprobs, top_logprobs, text_offset}`; `offset` continues a stream."""
    tokens, offsets = [], []
    for lp in items:
        text = token_text(tokenizer, lp.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [finite(lp.logprob) for lp in items],
        "top_logprobs": [{token_text(tokenizer, t): finite(p) for t, p in lp.top} for lp in items],
        "text_offset": offsets,
    }


def chat_logprobs(tokenizer: Tokenizer, items: Sequence[TokenLogprobs]) -> dict[str, Any]:
    """`{content: [{token, logprob, bytes, top_logprobs: [...]}]}`."""
    return {
        "content": [
            {
                **_entry(tokenizer, lp.token_id, lp.logprob),
                "top_logprobs": [_entry(tokenizer, t, p) for t, p in lp.top],
            }
            for lp in items
        ]
    }


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = token_text(tokenizer, token_id)
    return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode())}


def finite(logprob: float) -> float:
    """JSON has no -inf: a token the sampler had ruled out gets a very low finite number."""
    return max(logprob, -9999.0) if logprob == logprob else -9999.0
