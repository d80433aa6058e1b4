"""The generation routes in process, over a scripted engine: what each route sends the engine
(token ids, sampling settings, deadlines) and how it answers with what the engine streams —
whole and streamed, finish reasons, usage, `n` choices. test_generate.py, test_openai_sdk.py and
test_choices.py ask the same of a real server with a tiny model."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest
from factories import chat_tokenizer
from fake_engine import ScriptEngine, text_chunks

from api.inprocess import events, request, script_engine
from api.route_coverage import covers
from headrace.config import ServerConfig
from headrace.engine.messages import TokenLogprobs
from headrace.request import FinishReason

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": PROMPT}]
GENERATE, COMPLETIONS, CHAT = "/v1/generate", "/v1/completions", "/v1/chat/completions"
ALL = "POST /v1/generate", "POST /v1/completions", "POST /v1/chat/completions"


def body(route: str, **fields: Any) -> dict[str, Any]:
    return {("messages" if route == CHAT else "prompt"): MESSAGES if route == CHAT else PROMPT,
            **fields}  # fmt: skip


def prompt_ids(route: str) -> list[int]:
    tok = chat_tokenizer()
    if route == CHAT:
        return tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    return tok.encode(PROMPT)


def text_and_reason(route: str, answer: dict[str, Any]) -> tuple[str, str]:
    if route == GENERATE:
        return answer["text"], answer["finish_reason"]
    choice = answer["choices"][0]
    text = choice["message"]["content"] if route == CHAT else choice["text"]
    return text, choice["finish_reason"]


def streamed_text_and_reason(route: str, r: httpx.Response) -> tuple[str, str | None]:
    text, reason = "", None
    for e in events(r):
        if route == GENERATE:
            text, reason = text + e["text"], e.get("finish_reason", reason)
            continue
        for c in e["choices"]:
            text += (c["delta"].get("content") or "") if route == CHAT else c["text"]
            reason = c["finish_reason"] or reason
    return text, reason


@covers(*ALL)
@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS, CHAT])
@pytest.mark.parametrize("stream", [False, True])
def test_each_route_sends_token_ids_and_answers_the_engines_text(route: str, stream: bool) -> None:
    engine = script_engine(text_chunks(["Hello", "", " there"], cached_tokens=16))
    r = request(engine, "POST", route, json=body(route, max_tokens=12, stream=stream))
    got = streamed_text_and_reason(route, r) if stream else text_and_reason(route, r.json())
    assert got == ("Hello there", "length")
    (sent,) = engine.requests
    assert sent.prompt_token_ids == prompt_ids(route) and sent.params.max_tokens == 12
    assert sent.options is not None and sent.options.timeout_s == ServerConfig().request_timeout_s
    assert sent.options.arrival_time is not None  # deadlines count from the front door
    assert engine.closed == [sent.request_id] and not engine.aborted


@covers("POST /v1/generate")
def test_generate_answers_text_usage_and_timing() -> None:
    engine = script_engine()
    answer = request(engine, "POST", GENERATE, json=body(GENERATE, timeout=5)).json()
    assert set(answer) == {"id", "model", "text", "finish_reason", "usage", "timing"}
    assert answer["model"] == "m" and answer["id"].startswith("gen-")
    usage = {"prompt_tokens": len(prompt_ids(GENERATE)), "completion_tokens": 2,
             "cached_tokens": 0}  # fmt: skip
    assert answer["usage"] == usage
    timing = answer["timing"]
    assert 0 <= timing["queue_ms"] <= timing["ttft_ms"] <= timing["total_ms"]
    assert engine.requests[0].options.timeout_s == 5  # type: ignore[union-attr]


@covers("POST /v1/generate")
def test_generate_streams_one_event_per_piece_then_a_final_event() -> None:
    engine = script_engine(text_chunks(["Hello", "", " there"], cached_tokens=16))
    got = events(request(engine, "POST", GENERATE, json=body(GENERATE, stream=True)))
    pieces, final = got[:-1], got[-1]
    assert [e["text"] for e in pieces] == ["Hello", " there"]  # none for the empty chunk
    assert final["text"] == "" and final["finish_reason"] == "length"
    assert final["usage"] == {"prompt_tokens": len(prompt_ids(GENERATE)),
                              "completion_tokens": 3, "cached_tokens": 16}  # fmt: skip
    assert {e["id"] for e in got} == {engine.requests[0].request_id}


@covers(*ALL)
@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS, CHAT])
@pytest.mark.parametrize("reason", ["stop", "length", "timeout", "abort"])
def test_the_engines_finish_reason_is_the_answers(route: str, reason: str) -> None:
    engine = script_engine(text_chunks(["a", "b"], FinishReason(reason)))
    r = request(engine, "POST", route, json=body(route))
    assert r.status_code == 200 and text_and_reason(route, r.json()) == ("ab", reason)
    r = request(engine, "POST", route, json=body(route, stream=True))
    assert streamed_text_and_reason(route, r) == ("ab", reason)


@covers(*ALL)
@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS, CHAT])
def test_sampling_settings_reach_the_engine(route: str) -> None:
    engine = script_engine()
    settings = {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 11, "stop": "END",
                "stop_token_ids": [7, 8], "ignore_eos": True, "min_tokens": 2,
                "presence_penalty": 0.5, "logit_bias": {"9": -2.0}}  # fmt: skip
    r = request(engine, "POST", route, json=body(route, max_tokens=9, **settings))
    assert r.status_code == 200, r.text
    params = engine.requests[0].params
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.7, 0.9, 5, 11)
    assert params.stop == ("END",) and params.stop_token_ids == (7, 8) and params.ignore_eos
    assert (params.max_tokens, params.min_tokens, params.presence_penalty) == (9, 2, 0.5)
    assert params.logit_bias == ((9, -2.0),)


@covers("POST /v1/completions")
@pytest.mark.parametrize("prompt", [PROMPT, [PROMPT], [1, 50, 7]])
def test_a_completion_prompt_is_text_a_list_of_one_text_or_token_ids(prompt: Any) -> None:
    engine = script_engine()
    r = request(engine, "POST", COMPLETIONS, json={"prompt": prompt})
    assert r.status_code == 200, r.text
    ids = prompt if isinstance(prompt[0], int) else chat_tokenizer().encode(PROMPT)
    assert engine.requests[0].prompt_token_ids == ids


@covers("POST /v1/completions")
def test_a_completion_has_openais_shape_and_usage() -> None:
    engine = script_engine(text_chunks(["Hello", " there"], prompt_tokens=5, cached_tokens=4))
    answer = request(engine, "POST", COMPLETIONS, json=body(COMPLETIONS)).json()
    assert answer["object"] == "text_completion" and answer["id"].startswith("cmpl-")
    assert answer["model"] == "m" and isinstance(answer["created"], int)
    assert answer["choices"] == [
        {"index": 0, "text": "Hello there", "logprobs": None, "finish_reason": "length"}
    ]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                               "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip


@covers("POST /v1/completions", "POST /v1/chat/completions")
@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
def test_usage_comes_last_in_a_stream_only_when_asked(route: str) -> None:
    engine = script_engine(text_chunks(["Hello", " there"], prompt_tokens=5))
    options = {"stream": True, "stream_options": {"include_usage": True}}
    with_usage = events(request(engine, "POST", route, json=body(route, **options)))
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["total_tokens"] == 7
    assert all(e["usage"] is None for e in with_usage[:-1])
    plain = events(request(engine, "POST", route, json=body(route, stream=True)))
    assert all("usage" not in e for e in plain)


@covers("POST /v1/chat/completions")
def test_chat_renders_the_template_and_answers_as_the_assistant() -> None:
    engine = script_engine()
    answer = request(engine, "POST", CHAT, json=body(CHAT)).json()
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    choice = answer["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello there"}
    ids = prompt_ids(CHAT)
    assert ids[0] == chat_tokenizer().bos_token_id and ids.count(ids[0]) == 1  # BOS once
    # Without a limit a chat may fill the context; max_completion_tokens wins over max_tokens.
    assert engine.requests[0].params.max_tokens == 512 - len(ids)
    request(engine, "POST", CHAT, json=body(CHAT, max_tokens=9, max_completion_tokens=3))
    assert engine.requests[1].params.max_tokens == 3


@covers("POST /v1/chat/completions")
def test_a_chat_stream_opens_each_choice_with_the_assistants_role() -> None:
    engine = script_engine()
    got = events(request(engine, "POST", CHAT, json=body(CHAT, n=2, seed=1, stream=True)))
    assert [e["object"] for e in got] == ["chat.completion.chunk"] * len(got)
    role = {"role": "assistant", "content": ""}
    assert [(e["choices"][0]["index"], e["choices"][0]["delta"]) for e in got[:2]] == [
        (0, role), (1, role),
    ]  # fmt: skip
    texts = ["", ""]
    for e in got[2:]:
        (c,) = e["choices"]
        texts[c["index"]] += c["delta"].get("content", "")
    assert texts == ["Hello there"] * 2
    assert sorted(r.params.seed for r in engine.requests) == [1, 2]  # type: ignore[type-var]


def logprob_engine() -> ScriptEngine:
    """Two tokens with their logprobs and one alternative each."""
    chunks = text_chunks(["Hello", " there"])
    lps = [[TokenLogprobs(10, -0.5, [(10, -0.5), (11, -1.5)])],
           [TokenLogprobs(11, -0.25, [(11, -0.25), (10, -2.0)])]]  # fmt: skip
    return script_engine(
        [dataclasses.replace(c, logprobs=lp) for c, lp in zip(chunks, lps, strict=True)]
    )


@covers("POST /v1/completions", "POST /v1/chat/completions")
def test_logprobs_in_both_openai_shapes() -> None:
    tok = chat_tokenizer()
    t10, t11 = tok.decode([10]), tok.decode([11])
    engine = logprob_engine()
    answer = request(engine, "POST", COMPLETIONS, json=body(COMPLETIONS, logprobs=1)).json()
    assert engine.requests[0].params.logprobs == 1
    assert answer["choices"][0]["logprobs"] == {
        "tokens": [t10, t11], "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{t10: -0.5, t11: -1.5}, {t11: -0.25, t10: -2.0}],
        "text_offset": [0, len(t10)],
    }  # fmt: skip
    streamed = events(request(engine, "POST", COMPLETIONS, json=body(COMPLETIONS, logprobs=1,
                                                                       stream=True)))  # fmt: skip
    assert [e["choices"][0]["logprobs"]["text_offset"] for e in streamed] == [[0], [len(t10)]]
    chat = request(engine, "POST", CHAT, json=body(CHAT, logprobs=True, top_logprobs=1)).json()
    assert engine.requests[-1].params.logprobs == 1
    first = chat["choices"][0]["logprobs"]["content"][0]
    assert first["token"] == t10 and first["logprob"] == -0.5
    assert first["bytes"] == list(t10.encode()) and len(first["top_logprobs"]) == 2
