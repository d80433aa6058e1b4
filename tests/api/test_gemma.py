"""The real embedded Gemma 3 270M behind `headrace serve`: its chat template, streaming."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from factories import Server, start_server

pytestmark = pytest.mark.gemma

QUESTION = "Name three colours of the rainbow."
# Gemma 3's chat format, as its template renders one user turn (BOS is added by the tokenizer)
GEMMA_CHAT_PROMPT = f"<start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--max-model-len", "512", "--max-num-seqs", "4", "--log-level", "warning"]
    server = start_server(args, tmp_path_factory.mktemp("gemma"))
    try:
        server.wait_ready(timeout=300)
        yield server
    finally:
        code = server.stop()
    assert code == 0, server.log()


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
