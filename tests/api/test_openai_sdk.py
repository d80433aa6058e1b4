"""The official `openai` SDK, unmodified, against a real `headrace serve` (tiny model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from factories import Server
from transformers import AutoTokenizer

PROMPT = "Once upon a time"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about foxes."},
]


@pytest.fixture
def sdk(api_server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=api_server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_lists_the_served_model(sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == ["tiny"]


def test_completions_stream_equals_whole_and_usage_matches_tokenizer(
    sdk: openai.OpenAI, api_model_dir: Path
) -> None:
    whole = sdk.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert whole.usage is not None
    hf = AutoTokenizer.from_pretrained(api_model_dir)
    assert whole.usage.prompt_tokens == len(hf(PROMPT).input_ids)
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert whole.usage.completion_tokens == len(choice.logprobs.tokens) == 20
    assert choice.logprobs.top_logprobs is not None
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    # greedy: the chosen token is the most likely one
    chosen_lps = choice.logprobs.token_logprobs or []
    for chosen, top in zip(chosen_lps, choice.logprobs.top_logprobs, strict=True):
        assert chosen >= max(top.values()) - 1e-4

    chunks = list(
        sdk.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_stream_equals_whole(sdk: openai.OpenAI, api_model_dir: Path) -> None:
    whole = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=16, temperature=0,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    msg = whole.choices[0].message
    assert msg.role == "assistant" and msg.content
    hf = AutoTokenizer.from_pretrained(api_model_dir)
    rendered = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt_ids = hf(rendered, add_special_tokens=False).input_ids
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == len(prompt_ids)
    assert whole.usage.completion_tokens == 16

    stream = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    usage = chunks[-1].usage
    assert usage is not None and whole.usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens,
    )  # fmt: skip
    # The same chat again: its prompt's full KV blocks come from the prefix cache.
    assert usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 < cached < usage.prompt_tokens
    assert cached >= whole.usage.prompt_tokens_details.cached_tokens


def test_chat_logprobs(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,  # type: ignore[arg-type]
        top_logprobs=3,
    )  # fmt: skip
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert r.usage is not None and len(lp.content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp.content)


def test_sdk_sees_errors_as_its_exceptions(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        sdk.completions.create(model="nope", prompt="x", max_tokens=2)
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        sdk.completions.create(model="tiny", prompt="x", max_tokens=100_000)
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, n=17)  # type: ignore[arg-type]
