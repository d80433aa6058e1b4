"""Turning a request's prompt into token ids with the engine's tokenizer, off the event loop when
it is big enough to matter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jinja2

from headrace.api.errors import bad_request
from headrace.api.schemas import MAX_CHAT_MESSAGES
from headrace.engine.frontend.tokenizer import Tokenizer

T = TypeVar("T")

INLINE_CHARS = 4096  # shorter prompts tokenize in well under a millisecond: not worth a thread
# a message costs the template's markup around it (turn markers: 30-60 characters) and a turn of
# the template's loop, even when its content is empty
MESSAGE_CHARS = 64


async def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    ids: list[int] = await _maybe_in_thread(len(text), tokenizer.encode, text, True)
    return ids


def check_token_ids(tokenizer: Tokenizer, ids: Sequence[int]) -> list[int]:
    vocab = int(tokenizer.vocab_size)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
    return list(ids)


async def encode_chat(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The conversation rendered with the model's chat template, ready for the assistant
    (`tools`: the template's own tool format). Large conversations render in a thread; the body
    size limit bounds that work."""
    if len(messages) > MAX_CHAT_MESSAGES:
        raise bad_request(
            f"messages has {len(messages)} entries; at most {MAX_CHAT_MESSAGES} are accepted",
            "messages",
        )
    size = sum(len(str(m.get("content") or "")) + MESSAGE_CHARS for m in messages)
    size += len(str(tools)) if tools else 0
    ids: list[int] = await _maybe_in_thread(size, _render_and_encode, tokenizer, messages, tools)
    return ids


def _render_and_encode(
    tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    try:
        if tools is None:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        else:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:  # raise_exception()
        raise bad_request(f"the chat template refused the messages: {e}", "messages") from e
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)  # BOS is in the text
    return ids


async def _maybe_in_thread(size: int, fn: Callable[..., T], *args: Any) -> T:
    if size <= INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
