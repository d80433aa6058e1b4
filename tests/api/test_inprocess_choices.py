"""`n` choices in process (httpx.ASGITransport, a scripted engine): seeds and request ids per
choice, choice 0 first, and a choice that fails ends the whole request with its siblings
aborted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fake_engine import FakeEngine

from api.inprocess import request
from api.route_coverage import covers
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.request import FinishReason, SamplingParams


class Vocab:
    vocab_size = 100


class ScriptedEngine(FakeEngine):
    """Each request streams two chunks; the one whose id ends with `fail_suffix` fails."""

    tokenizer = Vocab()

    def __init__(self, fail_suffix: str | None = None) -> None:
        self.fail_suffix = fail_suffix
        self.events: list[str] = []  # "start <id>", "first <id>", "end <id>"
        self.aborted: list[str] = []
        self.seeds: dict[str, int | None] = {}

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        self.events.append(f"start {request_id}")
        self.seeds[request_id] = params.seed
        try:
            await asyncio.sleep(0.01)
            self.events.append(f"first {request_id}")
            yield GenerationChunk(request_id, f"<{params.seed}>", [5], prompt_tokens=2,
                                  completion_tokens=1)  # fmt: skip
            await asyncio.sleep(0.01)
            if self.fail_suffix and request_id.endswith(self.fail_suffix):
                yield GenerationChunk(request_id, "", [], FinishReason.ERROR, error="boom")
                return
            yield GenerationChunk(request_id, ".", [6], FinishReason.LENGTH, prompt_tokens=2,
                                  completion_tokens=2)  # fmt: skip
        finally:
            self.events.append(f"end {request_id}")

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _post(engine: ScriptedEngine, body: dict[str, Any]) -> httpx.Response:
    return request(engine, "POST", "/v1/completions", json=body)


BODY = {"prompt": [1, 2], "max_tokens": 2, "temperature": 1.0, "n": 3, "seed": 10}


@covers("POST /v1/completions")
def test_each_choice_has_its_seed_and_the_others_start_after_choice_0s_first_token() -> None:
    engine = ScriptedEngine()
    r = _post(engine, BODY)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert [c["text"] for c in answer["choices"]] == ["<10>.", "<11>.", "<12>."]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8,
                               "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    first = engine.events[0].split()[1]
    assert sorted(engine.seeds.values()) == [10, 11, 12]
    assert engine.events.index(f"first {first}") < engine.events.index(f"start {first}-1")
    assert not engine.aborted


@covers("POST /v1/completions")
def test_a_failing_choice_ends_the_request_and_aborts_its_siblings() -> None:
    engine = ScriptedEngine(fail_suffix="-1")
    r = _post(engine, BODY)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["message"] == "boom"
    started = [e.split()[1] for e in engine.events if e.startswith("start")]
    ended = [e.split()[1] for e in engine.events if e.startswith("end")]
    # Every choice's stream was closed (its engine request freed), none left running.
    assert len(started) == 3 and sorted(ended) == sorted(started)
    assert set(engine.aborted) <= set(started)


@covers("POST /v1/completions")
def test_streamed_chunks_carry_their_choice() -> None:
    engine = ScriptedEngine()
    r = _post(engine, {**BODY, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    texts = ["", "", ""]
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == ["<10>.", "<11>.", "<12>."]
    assert r.text.rstrip().endswith("data: [DONE]")
