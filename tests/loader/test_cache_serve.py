"""`headrace serve --replicas 2` from an empty cache: both replicas build and read the one cache
entry of the embedded Gemma (the GGUF, its conversion, the kernels) and the server answers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from factories import start_server

pytestmark = pytest.mark.gemma


def test_two_replicas_start_from_an_empty_cache(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "HEADRACE_CACHE": str(tmp_path / "cache")}
    args = ["--replicas", "2", "--max-model-len", "256", "--max-num-seqs", "2"]
    server = start_server([*args, "--log-level", "warning"], tmp_path, env)
    try:
        server.wait_ready(timeout=900)  # two loads of real Gemma on a busy 2-core machine
        health = httpx.get(server.url + "/health", timeout=10).json()
        (replicas,) = health["replicas"].values()
        assert [r["state"] for r in replicas] == ["healthy", "healthy"], health
        r = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
            timeout=300,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
    finally:
        code = server.stop(timeout=60)
    assert code == 0, server.log()
    assert not list((tmp_path / "cache").rglob(".*.tmp"))
