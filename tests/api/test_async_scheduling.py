"""`headrace serve --async-scheduling` (engine/core/overlap.py) against the suite's server of the
same tiny model with steps in series: the same greedy and seeded answers under concurrent
load, streamed or not; a stream its reader leaves holds nothing. Real servers, 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, read_metrics, serving, sse_events, tiny_server_args, wait_for

TEXT = "the quick brown fox jumps over the lazy dog and then some more words"


@pytest.fixture(scope="module")
def overlapped(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # no speculation: with it, steps of at most four streams run in series (drafts come next)
    args = tiny_server_args(api_model_dir) + ["--async-scheduling", "--num-speculative-tokens", "0"]
    yield from serving(args, tmp_path_factory.mktemp("async"), exits=(0,))


def _bodies() -> list[dict[str, Any]]:
    bodies = []
    for i in range(10):
        words = TEXT.split()
        prompt = " ".join(words[i % 7 : i % 7 + 3 + i])
        sampled = {"temperature": 0.9, "top_p": 0.9, "seed": 50 + i} if i % 2 else {}
        body = {"prompt": prompt, "max_tokens": 10 + 2 * i, "ignore_eos": i % 3 == 0}
        logprobs = {"logprobs": 2} if i % 3 == 1 else {}  # they travel with the tokens
        penalty = {"frequency_penalty": 0.8, "presence_penalty": 0.3} if i % 4 == 2 else {}
        bodies.append({**body, "temperature": 0.0, **sampled, **logprobs, **penalty})
    return bodies


Answer = tuple[str, str, list[list[str]], list[float]]


def _answers(server: Server, bodies: list[dict[str, Any]]) -> list[Answer]:
    def one(body: dict[str, Any]) -> Answer:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        lp = choice["logprobs"] or {"top_logprobs": [], "token_logprobs": []}
        tops = [sorted(top) for top in lp["top_logprobs"]]
        return choice["text"], choice["finish_reason"], tops, lp["token_logprobs"]

    with ThreadPoolExecutor(len(bodies)) as pool:  # all at once: steps of many rows
        return list(pool.map(one, bodies))


def _stats(server: Server) -> dict[str, Any]:
    stats = httpx.get(server.url + "/v1/stats", timeout=10).json()
    return dict(stats["models"]["tiny"]["stats"])


def test_concurrent_answers_equal_the_serial_servers(overlapped: Server, api_server: Server):
    bodies = _bodies()
    got, want = _answers(overlapped, bodies), _answers(api_server, bodies)
    assert [a[:3] for a in got] == [a[:3] for a in want]  # text, finish, top tokens
    assert sum(len(a[3]) for a in got) > 30  # logprobs of four requests' tokens
    for g, w in zip(got, want, strict=True):
        assert g[3] == pytest.approx(w[3], abs=1e-4)
    stats = _stats(overlapped)
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
    assert stats["steps_overlapped_total"] > 10  # the steps after the first, of any streams
    assert _stats(api_server)["steps_overlapped_total"] == 0
    metrics = read_metrics(overlapped.url)
    assert metrics["headrace:steps_overlapped_total"] == stats["steps_overlapped_total"]


def test_a_stream_equals_the_whole_answer_and_a_left_stream_frees_its_blocks(
    overlapped: Server,
) -> None:
    body = {"prompt": "the lazy dog", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(overlapped.url + "/v1/completions", json=body, timeout=60).json()
    with httpx.stream(
        "POST", overlapped.url + "/v1/completions", json={**body, "stream": True}, timeout=60
    ) as r:
        events = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
    long = {**body, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", overlapped.url + "/v1/completions", json=long, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):  # a few tokens in, the reader goes away
            next(lines)
    wait_for(lambda: _stats(overlapped)["num_running"] == 0, 30, "the left stream to end")
    assert _stats(overlapped)["kv_blocks_used"] == 0
    r = httpx.post(overlapped.url + "/v1/completions", json={**body, "max_tokens": -1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
