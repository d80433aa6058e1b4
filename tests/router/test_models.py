"""Two models side by side, and a front end that routes to another `headrace serve` too: each
request reaches its own model (outputs equal the model run alone), long prompts take their
own pool, a remote that goes away leaves the rotation while the local replica serves on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import (
    MAX_MODEL_LEN,
    Server,
    replicas,
    routed,
    running,
    serve_args,
    sse_events,
    start_server,
    word_prompt,
)

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.llm import LLM
from headrace.request import SamplingParams

MAX_TOKENS = 12
PROMPTS = [word_prompt(6), word_prompt(9, start=40), word_prompt(4, start=300)]
LONG = 32  # prompts longer than this many tokens go to the long pool of the front end


@pytest.fixture(scope="module")
def reference(tiny_models: dict[str, Path]) -> dict[str, list[str]]:
    """Each model's greedy continuation of each prompt, run alone in this process."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    out = {}
    for name, path in tiny_models.items():
        llm = LLM(
            ModelConfig(model=str(path), dtype="float32", max_model_len=MAX_MODEL_LEN),
            CacheConfig(num_kv_blocks=64),
        )
        out[name] = [o.text for o in llm.generate(PROMPTS + [word_prompt(40)], params)]
    return out


@pytest.fixture(scope="module")
def pair(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """alpha and beta, one replica each; open, with the replica API on (for `front`)."""
    args = serve_args(
        f"alpha={tiny_models['alpha']}:1", f"beta={tiny_models['beta']}:1",
        extra=("--replica-api",),
    )  # fmt: skip
    with running(args, tmp_path_factory.mktemp("pair"), clean_exit=False) as s:
        yield s


@pytest.fixture(scope="module")
def front(
    pair: Server, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """alpha locally (one replica, plus one for long prompts) and `pair` as a remote replica
    of alpha and of beta (which this server has no files for)."""
    args = serve_args(
        f"alpha={tiny_models['alpha']}:1",
        extra=("--long-prompt-threshold", str(LONG), "--long-replicas", "1",
               "--replica-url", pair.url),
    )  # fmt: skip
    with running(args, tmp_path_factory.mktemp("front")) as s:
        yield s


def wait_idle(url: str, model: str) -> None:
    """Until the router sees no load on any replica of `model` (reports arrive after work)."""
    deadline = time.monotonic() + 10
    while any(r["load_tokens"] for r in replicas(url, model)):
        assert time.monotonic() < deadline, replicas(url, model)
        time.sleep(0.02)


def complete(url: str, model: str, text: str, *, stream: bool = False) -> str:
    body = {"model": model, "prompt": text, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}  # fmt: skip
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        events = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    assert events and events[-1].get("choices", [{}])[0].get("finish_reason") == "length", events
    return "".join(e["choices"][0]["text"] for e in events)


def test_two_models_side_by_side(pair: Server, reference: dict[str, list[str]]) -> None:
    models = httpx.get(pair.url + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["alpha", "beta"]
    assert reference["alpha"] != reference["beta"], "the two models must tell apart"
    for i, text in enumerate(PROMPTS):
        for model in ("alpha", "beta"):
            assert complete(pair.url, model, text) == reference[model][i], (model, text)


def test_unknown_model_is_404(pair: Server) -> None:
    r = httpx.post(pair.url + "/v1/completions", json={"model": "gamma", "prompt": "w5"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and "alpha, beta" in error["message"]


def test_front_end_routes_to_local_and_remote_replicas(
    front: Server, pair: Server, reference: dict[str, list[str]]
) -> None:
    models = httpx.get(front.url + "/v1/models").json()["data"]
    assert sorted(m["id"] for m in models) == ["alpha", "beta"]
    health = httpx.get(front.url + "/health").json()
    alpha = {r["name"]: r for r in health["replicas"]["alpha"]}
    assert set(alpha) == {"alpha/0", "alpha/long-0", "alpha/remote-0"}
    assert alpha["alpha/remote-0"]["url"] == pair.url and alpha["alpha/0"]["pid"]
    assert [r["name"] for r in health["replicas"]["beta"]] == ["beta/remote-0"]
    before = routed(front.url, "alpha")
    for i, text in enumerate(PROMPTS * 2):  # one after another: idle replicas take turns
        wait_idle(front.url, "alpha")  # a polled remote's last report can still show the last
        got = complete(front.url, "alpha", text, stream=i % 2 == 1)
        assert got == reference["alpha"][i % len(PROMPTS)]
    after = routed(front.url, "alpha")
    assert after["alpha/0"] - before["alpha/0"] >= 2
    assert after["alpha/remote-0"] - before["alpha/remote-0"] >= 2
    assert after["alpha/long-0"] == before["alpha/long-0"], "short prompts stay off the long pool"
    # beta lives only on the remote server: its tokenizer came from there
    assert complete(front.url, "beta", PROMPTS[0], stream=True) == reference["beta"][0]


def test_an_open_server_keeps_its_replica_api_off_unless_asked(front: Server) -> None:
    body = {"request_id": "r", "model": "alpha", "prompt_token_ids": [1], "params": {}}
    for path in ("/v1/replica/generate", "/v1/replica/abort"):
        r = httpx.post(front.url + path, json=body)
        assert r.status_code == 404 and "--replica-api" in r.json()["error"]["message"], r.text
    r = httpx.get(front.url + "/v1/replica/tokenizer", params={"model": "alpha"})
    assert r.status_code == 404
    assert httpx.get(front.url + "/v1/stats").status_code == 200  # stats stay open
    assert httpx.get(front.url + "/metrics").status_code == 200


def test_a_front_end_refuses_a_remote_whose_replica_api_is_off(
    front: Server, tmp_path: Path
) -> None:
    server = start_server(serve_args(extra=("--replicas", "0", "--replica-url", front.url)),
                          tmp_path)  # fmt: skip
    try:
        assert server.proc.wait(60) == 1, server.log()
    finally:
        server.stop()
    assert "--replica-api" in server.log() and "does not let this server use" in server.log()


def test_long_prompts_take_the_long_pool(front: Server, reference: dict[str, list[str]]) -> None:
    before = routed(front.url, "alpha")
    for _ in range(2):
        assert complete(front.url, "alpha", word_prompt(40)) == reference["alpha"][-1]
    after = routed(front.url, "alpha")
    assert after["alpha/long-0"] - before["alpha/long-0"] == 2
    assert sum(after.values()) - sum(before.values()) == 2


def test_a_remote_that_goes_away_leaves_the_rotation(front: Server, pair: Server) -> None:
    pair.stop()
    deadline = time.monotonic() + 10
    while {r["name"]: r["state"] for r in replicas(front.url, "alpha")}["alpha/remote-0"] != "down":
        assert time.monotonic() < deadline, "the remote replica was not taken out"
        time.sleep(0.05)
    before = routed(front.url, "alpha")
    for text in PROMPTS:
        complete(front.url, "alpha", text)  # the local replica serves on
    assert routed(front.url, "alpha")["alpha/remote-0"] == before["alpha/remote-0"]
    r = httpx.post(front.url + "/v1/completions", json={"model": "beta", "prompt": "w5"})
    assert r.status_code == 503  # beta had only the remote replica
    health = httpx.get(front.url + "/health")
    assert health.status_code == 503 and health.json()["models"] == {"alpha": "ok", "beta": "dead"}
