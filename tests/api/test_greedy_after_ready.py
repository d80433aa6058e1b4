"""Ready means final: a greedy request sent the moment `/health` says 200 gets the same text as
the same request once the server has settled (the int8 greedy head is built before ready)."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from factories import Server, start_server

from headrace.kernels.int8_head import supported

pytestmark = [
    pytest.mark.gemma,
    pytest.mark.skipif(
        not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
        reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
    ),
]

# Near-ties in its first token: the bf16 head and the exact int8 head pick "a)" and "1."
PROMPT = "Write one sentence about rivers:"
HEAD_READY = "int8 greedy head ready"


def _texts(server: Server, model: str) -> dict[str, str]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    gen = httpx.post(server.url + "/v1/generate", json=body, timeout=120)
    comp = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert gen.status_code == comp.status_code == 200, (gen.text, comp.text)
    return {"generate": gen.json()["text"], "completions": comp.json()["choices"][0]["text"]}


def test_greedy_text_right_after_ready_equals_later(tmp_path) -> None:
    args = ["--dtype", "bfloat16", "--max-model-len", "512", "--log-level", "warning"]
    server = start_server(args, tmp_path)
    try:
        server.wait_ready(timeout=300)
        model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        first = _texts(server, model)
        deadline = time.monotonic() + 120
        while HEAD_READY not in server.log() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert HEAD_READY in server.log(), server.log()
        later = _texts(server, model)
    finally:
        code = server.stop()
    assert first == later
    assert first["generate"] == first["completions"]
    assert code == 0, server.log()
