"""`headrace serve --max-loras 2 --max-cpu-loras 2` with four adapters, on 127.0.0.1: each
adapter's greedy tokens equal transformers + peft's (what a server holding all four says:
test_lora_server.py), together and one after another; the loads and evictions are counted;
an evicted adapter whose files are gone is a 502 with the reason while the others serve; no
request or KV block is left behind."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import (
    Server,
    hf_greedy,
    make_tiny,
    prompts,
    read_metrics,
    serve_args,
    serving,
    wait_for,
)
from factories.lora import make_adapter
from tokenizers import Tokenizer

NAMES = ("a", "b", "c", "d")
NEW = 8


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("cpu-loras-server")
    make_tiny("llama", tmp / "tiny")
    ps = prompts(2)
    tok = Tokenizer.from_file(str(tmp / "tiny" / "tokenizer.json"))
    expected = {}  # the text of peft's greedy tokens (word-level: one word per token)
    for seed, name in enumerate(NAMES, start=1):
        peft_model = make_adapter(tmp / "tiny", tmp / name, seed, r=4)
        expected[name] = [tok.decode(hf_greedy(peft_model, p, NEW)) for p in ps]
    return {"dir": tmp, "prompts": ps, "expected": expected}


@pytest.fixture(scope="module")
def server(made: dict[str, Any]) -> Iterator[Server]:
    tmp: Path = made["dir"]
    args = serve_args(f"tiny={tmp / 'tiny'}", extra=("--num-threads", "1"))
    args += ["--max-loras", "2", "--max-cpu-loras", "2"]
    for name in NAMES:
        args += ["--lora", f"{name}={tmp / name}"]
    yield from serving(args, tmp)


async def _text(c: httpx.AsyncClient, model: str, prompt: list[int]) -> str:
    """The completion's text (its tokens, word by word)."""
    body = {"model": model, "prompt": prompt, "max_tokens": NEW, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"]).lstrip()  # word-level: a space before each


def _idle(server: Server) -> bool:
    stats = httpx.get(server.url + "/v1/stats", timeout=10).json()["models"]["tiny"]["stats"]
    return bool(stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0)


def test_four_adapters_through_two_places_match_peft(server: Server, made: dict[str, Any]) -> None:
    ps, expected = made["prompts"], made["expected"]
    assert len({expected[m][0] for m in NAMES}) == len(NAMES)  # four different answers
    keys = [(m, i) for m in NAMES for i in range(len(ps))]
    before = read_metrics(server.url)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            got = await asyncio.gather(*(_text(c, m, ps[i]) for m, i in keys))
            assert dict(zip(keys, got, strict=True)) == {k: expected[k[0]][k[1]] for k in keys}
            for m, i in keys + keys:  # one after another: each is read again from disk
                assert await _text(c, m, ps[i]) == expected[m][i], (m, i)

    asyncio.run(run())
    after = read_metrics(server.url)
    for counter in ("headrace:lora_adapter_loads_total", "headrace:lora_adapter_evictions_total"):
        assert after[counter] >= before.get(counter, 0) + 4, counter
    models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["tiny", *NAMES]  # evicted or not, all listed
    wait_for(lambda: _idle(server), 30, "no request or KV block left")


def test_an_evicted_adapter_with_its_files_gone_is_an_error_the_others_serve(
    server: Server, made: dict[str, Any]
) -> None:
    tmp: Path = made["dir"]
    ps, expected = made["prompts"], made["expected"]

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            for m in ("c", "d"):  # the last two used: a and b are out of memory
                assert await _text(c, m, ps[0]) == expected[m][0]
            shutil.move(tmp / "a", tmp / "a-gone")
            try:
                body = {"model": "a", "prompt": ps[0], "max_tokens": NEW}
                r = await c.post("/v1/completions", json=body)
                assert r.status_code == 502, r.text
                message = r.json()["error"]["message"]
                assert "adapter 'a' cannot be served" in message, message
                assert "cannot read the adapter config" in message, message
                for m in ("b", "c", "d"):
                    assert await _text(c, m, ps[1]) == expected[m][1], m
            finally:
                shutil.move(tmp / "a-gone", tmp / "a")
            assert await _text(c, "a", ps[1]) == expected["a"][1]  # files back: serves

    asyncio.run(run())
    wait_for(lambda: _idle(server), 30, "no request or KV block left")
