"""The real embedded Gemma 3 270M behind `headrace serve` (the suite's shared `gemma_server`,
tests/api/conftest.py): its chat template, streaming."""

from __future__ import annotations

import httpx
import openai
import pytest
from factories import Server

pytestmark = pytest.mark.gemma

QUESTION = "Name three colours of the rainbow."
# Gemma 3's chat format, as its template renders one user turn (BOS is added by the tokenizer)
GEMMA_CHAT_PROMPT = f"<start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"


def test_chat_streams_through_gemma_template(gemma_server: Server) -> None:
    """A streamed greedy chat answer equals a plain completion of the hand-rendered template."""
    with openai.OpenAI(base_url=gemma_server.url + "/v1", api_key="x", max_retries=0) as sdk:
        (model,) = [m.id for m in sdk.models.list()]
        stream = sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=12,
            temperature=0, stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    raw = httpx.post(
        gemma_server.url + "/v1/completions",
        json={"model": model, "prompt": GEMMA_CHAT_PROMPT, "max_tokens": 12, "temperature": 0},
        timeout=120,
    ).json()
    assert streamed and raw["choices"][0]["text"] == streamed
    assert usage is not None and raw["usage"]["prompt_tokens"] == usage.prompt_tokens
