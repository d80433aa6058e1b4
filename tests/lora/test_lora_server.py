"""LoRA adapters through a real `headrace serve --lora NAME=PATH --tenants FILE` on 127.0.0.1:
token-exact with transformers + peft, mixed in one batch, chosen with the `openai` SDK's
`model`, owned by tenants (another tenant's adapter is the same 404 as a name nobody serves),
and never sharing cached KV with the base or another adapter."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from factories import (
    Server,
    hf_greedy,
    make_tiny,
    prompts,
    serve_args,
    serving,
    wait_for,
    write_tenants,
)
from factories.lora import make_adapter
from tokenizers import Tokenizer

from headrace.gateway.auth import hash_key

TENANTS = f"""
admin_key_sha256: [{hash_key("admin")}]
tenants:
  alice: {{adapters: [support], api_key_sha256: [{hash_key("alice")}]}}
  bob: {{adapters: "*", api_key_sha256: [{hash_key("bob")}]}}
  carol: {{api_key_sha256: [{hash_key("carol")}]}}
"""
ADAPTERS = ("support", "legal")
NEW = 12


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny Llama, two adapters, and what transformers + peft say for each prompt."""
    tmp = tmp_path_factory.mktemp("lora-server")
    hf_base = make_tiny("llama", tmp / "tiny")
    ps = prompts(3)
    expected: dict[str | None, list[list[int]]] = {None: [hf_greedy(hf_base, p, NEW) for p in ps]}
    for seed, name in enumerate((*ADAPTERS, "extra"), start=1):
        peft_model = make_adapter(tmp / "tiny", tmp / name, seed)
        expected[name] = [hf_greedy(peft_model, p, NEW) for p in ps]
    make_adapter(tmp / "tiny", tmp / "big", 9, r=128)  # above --max-lora-rank 64
    make_tiny("qwen3", tmp / "qwen3")
    make_adapter(tmp / "qwen3", tmp / "other", 10)  # another model's shapes
    return {"dir": tmp, "prompts": ps, "expected": expected}


@pytest.fixture(scope="module")
def server(made: dict[str, Any]) -> Iterator[Server]:
    tmp: Path = made["dir"]
    args = serve_args(f"tiny={tmp / 'tiny'}", extra=("--num-threads", "1"))
    args += ["--tenants", str(write_tenants(tmp, TENANTS))]  # speculation on: drafts too
    args += ["--ledger", str(tmp / "ledger.db")]  # this module's own
    for name in ADAPTERS:
        args += ["--lora", f"{name}={tmp / name}"]
    yield from serving(args, tmp)


def _text(made: dict[str, Any], ids: list[int]) -> str:
    tok = Tokenizer.from_file(str(made["dir"] / "tiny" / "tokenizer.json"))
    return tok.decode(ids)


async def _complete(c: httpx.AsyncClient, model: str, prompt: list[int]) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": NEW, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    r = await c.post("/v1/completions", json=body, headers=_auth("bob"))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return str(r.json()["choices"][0]["text"]).lstrip()  # word-level: a space before each


def test_each_adapter_matches_peft_alone_and_in_a_mixed_batch(
    server: Server, made: dict[str, Any]
) -> None:
    ps, expected = made["prompts"], made["expected"]
    want = {
        (m, i): _text(made, expected[None if m == "tiny" else m][i])
        for m in ("tiny", *ADAPTERS)
        for i in range(len(ps))
    }
    assert len({want["tiny", 0], want["support", 0], want["legal", 0]}) == 3

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            for (m, i), text in want.items():  # alone
                assert await _complete(c, m, ps[i]) == text, (m, i)
            keys = list(want)  # all at once: base and both adapters share steps
            got = await asyncio.gather(*(_complete(c, m, ps[i]) for m, i in keys))
            assert dict(zip(keys, got, strict=True)) == want

    asyncio.run(run())


def test_openai_sdk_picks_the_adapter_by_model(server: Server, made: dict[str, Any]) -> None:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="bob", max_retries=0) as sdk:
        ids = [m.id for m in sdk.models.list()]
        assert ids == ["tiny", "support", "legal"]
        out = sdk.completions.create(
            model="legal", prompt=made["prompts"][1], max_tokens=NEW, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
    assert out.model == "legal"
    assert out.choices[0].text.lstrip() == _text(made, made["expected"]["legal"][1])


def test_models_list_adapters_with_parent_per_tenant(server: Server) -> None:
    def listed(key: str) -> dict[str, Any]:
        r = httpx.get(server.url + "/v1/models", headers=_auth(key), timeout=10)
        assert r.status_code == 200, r.text
        return {m["id"]: m.get("parent") for m in r.json()["data"]}

    assert listed("admin") == {"tiny": None, "support": "tiny", "legal": "tiny"}
    assert listed("bob") == {"tiny": None, "support": "tiny", "legal": "tiny"}
    assert listed("alice") == {"tiny": None, "support": "tiny"}
    assert listed("carol") == {"tiny": None}


def test_another_tenants_adapter_is_the_same_404_as_no_model(server: Server) -> None:
    def ask(key: str, model: str) -> httpx.Response:
        body = {"model": model, "prompt": "hello", "max_tokens": 2}
        return httpx.post(server.url + "/v1/completions", json=body, headers=_auth(key), timeout=30)

    for key, model in (("alice", "legal"), ("carol", "support")):
        theirs, nobodys = ask(key, model), ask(key, "no-such-model")
        assert theirs.status_code == nobodys.status_code == 404
        assert theirs.json() == _renamed(nobodys.json(), "no-such-model", model)
    assert ask("alice", "support").status_code == 200
    chat = {"model": "legal", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=_auth("alice"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def _renamed(body: dict[str, Any], old: str, new: str) -> Any:
    error = dict(body["error"])
    error["message"] = error["message"].replace(repr(old), repr(new))
    return {**body, "error": error}


def test_no_cache_hit_across_adapters(server: Server) -> None:
    prompt = "The quick brown fox jumps over the lazy dog . " * 6

    def cached(model: str) -> int:
        body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        r = httpx.post(server.url + "/v1/completions", json=body, headers=_auth("bob"), timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] >= 48
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached("tiny") == 0
    assert cached("tiny") > 0  # the cache works
    assert cached("support") == 0  # the base's blocks are not the adapter's
    assert cached("legal") == 0  # nor one adapter's another's
    assert cached("support") > 0
    assert cached("legal") > 0


def test_load_and_unload_at_run_time(server: Server, made: dict[str, Any]) -> None:
    tmp: Path = made["dir"]

    def admin(route: str, body: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/{route}", json=body, headers=_auth("admin"), timeout=60)

    for bad, reason in (("big", "rank 128 is above --max-lora-rank 64"), ("other", "do not fit"),
                        ("missing", "cannot read the adapter config")):  # fmt: skip
        r = admin("load_lora_adapter", {"lora_name": bad, "lora_path": str(tmp / bad)})
        assert r.status_code == 400 and reason in r.json()["error"]["message"], r.text
    r = admin("load_lora_adapter", {"lora_name": "extra", "lora_path": str(tmp / "extra")})
    assert r.status_code == 200, r.text
    want = _text(made, made["expected"]["extra"][0])

    async def ask() -> str:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            return await _complete(c, "extra", made["prompts"][0])

    assert asyncio.run(ask()) == want  # bob may use every adapter ("*"), new ones too
    victim = _replica(server)
    os.kill(victim["pid"], signal.SIGKILL)  # the restarted core loads "extra" again

    def restarted() -> bool:
        rep = _replica(server)
        return rep["state"] == "healthy" and rep["pid"] != victim["pid"]

    wait_for(restarted, 60, "the killed replica to restart")
    assert asyncio.run(ask()) == want
    assert asyncio.run(ask_support(server, made)) == _text(made, made["expected"]["support"][0])
    r = admin("unload_lora_adapter", {"lora_name": "extra"})
    assert r.status_code == 200, r.text
    body = {"model": "extra", "prompt": "hello", "max_tokens": 2}
    r = httpx.post(server.url + "/v1/completions", json=body, headers=_auth("bob"), timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def ask_support(server: Server, made: dict[str, Any]) -> str:
    """The adapters loaded at start are untouched by refused loads and other unloads."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        return await _complete(c, "support", made["prompts"][0])


def _replica(server: Server) -> dict[str, Any]:
    stats = httpx.get(server.url + "/v1/stats", headers=_auth("admin"), timeout=10).json()
    reps: list[dict[str, Any]] = stats["models"]["tiny"]["replicas"]
    return reps[0]


def test_generate_route_takes_the_adapter_too(server: Server, made: dict[str, Any]) -> None:
    text = " ".join(f"w{t}" for t in made["prompts"][2][1:])  # the word-level vocabulary
    bodies = {m: {"model": m, "prompt": text, "max_tokens": NEW, "temperature": 0,
                  "ignore_eos": True} for m in ("tiny", "legal")}  # fmt: skip
    out = {
        m: httpx.post(server.url + "/v1/generate", json=b, headers=_auth("bob"), timeout=60)
        for m, b in bodies.items()
    }
    assert all(r.status_code == 200 for r in out.values()), [r.text for r in out.values()]
    assert out["legal"].json()["model"] == "legal"
    assert out["legal"].json()["text"] != out["tiny"].json()["text"]
    r = httpx.post(
        server.url + "/v1/generate", json=bodies["legal"], headers=_auth("alice"), timeout=60
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_ledger_books_each_adapter_and_no_other_tenants(server: Server) -> None:
    """Usage per adapter, summing what the client was told; a tenant asking for another's
    adapter is booked as for a name nobody serves, so its own usage cannot tell them apart."""
    start = time.time()
    told: dict[str | None, int] = {None: 0, "support": 0}
    for model in ("tiny", "support", "support", "legal", "no-such-model"):
        body = {"model": model, "prompt": "hello there", "max_tokens": 3}
        r = httpx.post(server.url + "/v1/completions", json=body, headers=_auth("alice"))
        if model in ("legal", "no-such-model"):
            assert r.status_code == 404
            continue
        assert r.status_code == 200, r.text
        told[None if model == "tiny" else model] += r.json()["usage"]["total_tokens"]

    def usage(group_by: str) -> list[tuple[Any, ...]]:
        params = {"start": str(start), "group_by": group_by}
        r = httpx.get(server.url + "/v1/usage", params=params, headers=_auth("alice"), timeout=30)
        assert r.status_code == 200, r.text
        rows = r.json()["data"]
        return [(x[group_by], x["requests"], x["errors"], x["total_tokens"]) for x in rows]

    assert usage("adapter") == [(None, 3, 2, told[None]), ("support", 2, 0, told["support"])]
    assert usage("model") == [(None, 2, 2, 0), ("tiny", 3, 0, told[None] + told["support"])]
