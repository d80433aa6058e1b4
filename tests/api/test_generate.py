"""POST /v1/generate against a real `headrace serve` with a tiny model, over httpx."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from factories import Server, sse_events
from transformers import AutoTokenizer

PROMPT = "The quick brown fox"


def stream_generate(client: httpx.Client, body: dict[str, object]) -> list[dict[str, object]]:
    with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_generate_answers_text_usage_and_timing(
    client: httpx.Client, api_model_dir: Path, api_server: Server
) -> None:
    r = client.post("/v1/generate", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "text", "finish_reason", "usage", "timing"}
    assert body["model"] == "tiny"
    assert body["finish_reason"] in ("length", "stop")
    hf = AutoTokenizer.from_pretrained(api_model_dir)
    assert body["usage"]["prompt_tokens"] == len(hf(PROMPT).input_ids)
    assert 1 <= body["usage"]["completion_tokens"] <= 12
    timing = body["timing"]
    assert 0 <= timing["queue_ms"] <= timing["ttft_ms"] <= timing["total_ms"]
    assert 200 in api_server.health_seen


def test_streamed_text_equals_non_streamed_text_for_greedy(client: httpx.Client) -> None:
    for prompt in (PROMPT, "Once upon a time", "Numbers 0123"):
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        whole = client.post("/v1/generate", json=body).json()
        events = stream_generate(client, body)
        pieces, final = events[:-1], events[-1]
        assert all(e["text"] for e in pieces), "one event per new piece of text"
        assert "".join(str(e["text"]) for e in pieces) == whole["text"]
        assert final["finish_reason"] == "length" == whole["finish_reason"]
        assert (
            final["usage"]
            == whole["usage"]
            == {
                "prompt_tokens": whole["usage"]["prompt_tokens"],
                "completion_tokens": 24,
                "cached_tokens": 0,  # shorter than a KV block: nothing to reuse
            }
        )
        assert final["id"] == pieces[0]["id"] != whole["id"]


def test_seed_reproduces_sampled_text(client: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    first = client.post("/v1/generate", json=body).json()["text"]
    assert client.post("/v1/generate", json=body).json()["text"] == first


def test_stop_string_is_cut(client: httpx.Client) -> None:
    base = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = client.post("/v1/generate", json=base).json()["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), "the tiny model wrote whitespace only"
    cut = client.post("/v1/generate", json={**base, "stop": [stop]}).json()
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == text[: text.index(stop)]
    streamed = stream_generate(client, {**base, "stop": stop})
    assert "".join(str(e["text"]) for e in streamed) == cut["text"]


def test_timeout_ends_with_finish_reason_timeout(client: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 120, "ignore_eos": True, "timeout": 0.001}
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["finish_reason"] == "timeout"
    assert r.json()["usage"]["completion_tokens"] < 120
    events = stream_generate(client, body)
    assert events[-1]["finish_reason"] == "timeout"
