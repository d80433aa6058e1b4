"""Turning a request's prompt into token ids with the engine's tokenizer, off the event loop when
it is big enough to matter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from headrace.api.errors import bad_request

T = TypeVar("T")

INLINE_CHARS = 4096  # shorter prompts tokenize in well under a millisecond: not worth a thread


async def encode_text(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = await _maybe_in_thread(len(text), tokenizer.encode, text)
    return ids


def check_token_ids(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    vocab = int(tokenizer.vocab_size)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
    return list(ids)


async def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The conversation rendered with the model's chat template, ready for the assistant."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    size = sum(len(m["content"]) for m in messages)
    try:
        ids: list[int] = await _maybe_in_thread(size, tokenizer.encode_chat, messages)
    except (ValueError, TypeError, KeyError) as e:  # the template's own raise_exception()
        raise bad_request(f"chat template refused the messages: {e}", "messages") from e
    return ids


async def _maybe_in_thread(size: int, fn: Callable[..., T], *args: Any) -> T:
    if size <= INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
