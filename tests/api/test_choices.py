"""`n` choices on the OpenAI routes, against a real `headrace serve` of a tiny model: each
choice equals a single request with its derived seed, the prompt is computed once, usage counts
it once, streams tag every chunk with its choice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, serving, sse_events, tiny_server_args

# 40 words: more than two KV blocks of 16 tokens, so choices 1.. reuse choice 0's prompt.
PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 4) + " and then"
SAMPLED = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tiny_server_args(api_model_dir), tmp_path_factory.mktemp("choices"))


def _post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _tokens_total(server: Server) -> int:
    stats = httpx.get(server.url + "/v1/stats", timeout=10).json()
    return int(stats["models"]["tiny"]["stats"]["num_tokens_total"])


def test_three_seeded_choices_equal_single_requests_with_derived_seeds(server: Server) -> None:
    three = _post(server, "/v1/completions", {**SAMPLED, "n": 3, "seed": 40})
    texts = [c["text"] for c in sorted(three["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert len(set(texts)) == 3
    singles = [_post(server, "/v1/completions", {**SAMPLED, "seed": 40 + i}) for i in range(3)]
    assert texts == [s["choices"][0]["text"] for s in singles]
    usage, one = three["usage"], singles[0]["usage"]
    assert usage["prompt_tokens"] == one["prompt_tokens"]  # the prompt counted once
    assert usage["completion_tokens"] == 3 * 12 == usage["total_tokens"] - usage["prompt_tokens"]


def test_the_prompt_is_computed_once(server: Server) -> None:
    fresh = {**SAMPLED, "prompt": "a brand new prompt " * 9, "seed": 7}
    before = _tokens_total(server)
    body = _post(server, "/v1/completions", {**fresh, "n": 4})
    computed = _tokens_total(server) - before
    p = body["usage"]["prompt_tokens"]
    cached = (p - 1) // 16 * 16  # what each later choice finds in the prefix cache
    # Choice 0 computes the prompt; the others only its last partial block. Each choice
    # computes max_tokens - 1 decode tokens (its last token is sampled, never computed).
    assert computed == p + 3 * (p - cached) + 4 * (12 - 1)
    assert computed < 2 * p  # where four separate requests would compute it four times


def test_streamed_choices_carry_their_index_and_match_the_whole_answer(server: Server) -> None:
    body = {**SAMPLED, "n": 2, "seed": 3, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    texts, reasons = ["", ""], [None, None]
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            reasons[c["index"]] = c["finish_reason"] or reasons[c["index"]]
    whole = _post(server, "/v1/completions", {**SAMPLED, "n": 2, "seed": 3})
    assert texts == [c["text"] for c in whole["choices"]]
    assert reasons == ["length", "length"]
    assert events[-1]["usage"]["completion_tokens"] == 24


def test_chat_choices_and_the_bound_on_n(server: Server) -> None:
    msgs = [{"role": "user", "content": PROMPT}]
    chat = _post(
        server, "/v1/chat/completions",
        {"messages": msgs, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
    )  # fmt: skip
    a, b = (c["message"]["content"] for c in chat["choices"])
    assert a == b and a  # greedy: the same answer twice
    r = httpx.post(server.url + "/v1/completions", json={**SAMPLED, "n": 17}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    stats = httpx.get(server.url + "/v1/stats", timeout=10).json()["models"]["tiny"]["stats"]
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
