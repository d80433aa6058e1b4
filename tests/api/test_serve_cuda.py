"""`headrace serve --device cuda` with its default dtype (bf16 on CUDA), where a GPU is present:
greedy completions, streaming that equals the whole answer, a bad request's JSON 400, and a
core log that says it took CUDA. Elsewhere the module is skipped (the CPU legs of the same
paths run in test_serve.py and the API suite)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from factories import MAX_MODEL_LEN, NO_CUDA, running, sse_events

pytestmark = pytest.mark.skipif(NO_CUDA, reason="no CUDA")


def test_a_cuda_server_answers_streams_and_refuses(api_model_dir: Path, tmp_path: Path) -> None:
    args = [
        "--model", str(api_model_dir), "--served-model-name", "tiny", "--device", "cuda",
        "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "256", "--log-level", "info",
    ]  # fmt: skip
    with running(args, tmp_path) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 16}
        whole = c.post("/v1/completions", json={**body, "temperature": 0, "ignore_eos": True})
        assert whole.status_code == 200, whole.text
        assert whole.json()["usage"]["completion_tokens"] == 16
        text = whole.json()["choices"][0]["text"]
        stream = {**body, "temperature": 0, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=stream) as r:
            events = sse_events(r.iter_lines())
        assert events[-1] == "[DONE]"
        pieces = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        assert "".join(pieces) == text
        bad = c.post("/v1/completions", json={**body, "max_tokens": -3})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        assert c.get("/health").json()["status"] == "ok"
        log = server.log()
    assert "runner ready: tiny on cuda" in log and "in bfloat16" in log
