"""Through a real server: a constrained request its grammar leaves no allowed token ends alone
(an error when its grammar is incomplete, `stop` when complete) while streams in the same
steps keep their text and the step is not retried in halves; a min_tokens no choice can reach
is a 400."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import llguidance
import pytest
from factories import Server, serving, stream_text, tiny_server_args

RETRY_LOG = "retrying it in halves"
BYSTANDERS = [
    {
        "prompt": f"Prompt number {i}: the quick brown fox", "max_tokens": 48,
        "temperature": 0, "ignore_eos": True, "stream": True,
    }
    for i in range(4)
]  # fmt: skip


@pytest.fixture(scope="module")
def server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving(tiny_server_args(api_model_dir), tmp_path_factory.mktemp("logs"))


def first_tokens(model_dir: Path, regex: str) -> list[int]:
    """The tokens a request constrained to `regex` may start with."""
    table = llguidance.LLTokenizer((model_dir / "tokenizer.json").read_text())
    grammar = llguidance.LLMatcher.grammar_from_regex(regex)
    mask = llguidance.LLMatcher(table, grammar, log_level=0).compute_logit_bias()
    return [t for t, allowed in enumerate(mask) if allowed]


async def _run(url: str, constrained: list[dict[str, Any]]) -> tuple[list[str], list[Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        started = [asyncio.Event() for _ in BYSTANDERS]
        streams = asyncio.gather(
            *(stream_text(c, b, e) for b, e in zip(BYSTANDERS, started, strict=True))
        )
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
        done = await asyncio.gather(*(c.post("/v1/completions", json=b) for b in constrained))
        return await streams, [(r.status_code, r.json()) for r in done]


def test_dead_ends_end_alone_and_the_streams_beside_them_go_on(
    server: Server, api_model_dir: Path
) -> None:
    a_tokens = first_tokens(api_model_dir, "a")
    assert 0 < len(a_tokens) <= 64, a_tokens
    base = {"prompt": "Say a:", "max_tokens": 5, "temperature": 0, "guided_regex": "a"}
    stuck = {**base, "min_tokens": 2, "stop_token_ids": a_tokens}  # "a" is all banned
    complete = {**base, "min_tokens": 3}  # "a", then only EOS, which min_tokens bans
    reference, _ = asyncio.run(_run(server.url, []))
    together, [(stuck_status, stuck_body), (ok_status, ok_body)] = asyncio.run(
        _run(server.url, [stuck, complete])
    )
    assert together == reference
    assert RETRY_LOG not in server.log()
    assert stuck_status == 502, stuck_body
    assert "every token its grammar allows next is banned" in stuck_body["error"]["message"]
    assert ok_status == 200, ok_body
    choice = ok_body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("a", "stop"), ok_body
    assert ok_body["usage"]["completion_tokens"] == 1, ok_body


def test_a_min_tokens_no_choice_can_reach_is_a_400(server: Server) -> None:
    body = {"prompt": "Yes or no?", "max_tokens": 8, "guided_choice": ["yes", "no"]}
    r = httpx.post(server.url + "/v1/completions", json={**body, "min_tokens": 4}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "min_tokens"
    assert "longest choice is 3 bytes" in r.json()["error"]["message"]
    ok = httpx.post(server.url + "/v1/completions", json={**body, "min_tokens": 3}, timeout=60)
    assert ok.status_code == 200, ok.text  # reachable in principle: not refused
    eos_free = {**body, "min_tokens": 4, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=eos_free, timeout=60)
    assert r.status_code == 200, r.text
    assert RETRY_LOG not in server.log()
