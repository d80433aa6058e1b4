"""The open server (no tenants file) has a queue deadline too, counted from HTTP arrival: a
request that cannot start in time gets a 503 `overloaded_error` with Retry-After, instead of a
200 with `timeout` after the whole request timeout. Real `headrace serve`, tiny model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, serving, tiny_server_args

DEADLINE_S = 0.1  # far below the ~0.4 s the running 400-token request takes
LONG = {"prompt": "Hello there", "max_tokens": 400, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = tiny_server_args(api_model_dir) + [
        "--max-num-seqs", "1", "--queue-timeout-s", str(DEADLINE_S),
    ]  # fmt: skip
    yield from serving(args, tmp_path_factory.mktemp("deadline"))


def test_a_request_that_cannot_start_in_time_gets_503_with_retry_after(server: Server) -> None:
    started, release = threading.Event(), threading.Event()

    def hold() -> None:  # the only running slot, streaming slowly while we do not read
        with httpx.stream("POST", server.url + "/v1/generate", json=LONG, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()
                if release.is_set():
                    return

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert started.wait(30)
        t0 = time.monotonic()
        r = httpx.post(
            server.url + "/v1/generate", json={**LONG, "stream": False, "max_tokens": 2},
            timeout=30,
        )  # fmt: skip
        waited = time.monotonic() - t0
    finally:
        release.set()
        holder.join(30)
    if r.status_code == 200:  # the holder's 400 tokens ended first: nothing was shown
        pytest.fail(f"the running request ended within {waited:.2f} s; make it longer")
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "overloaded_error"
    assert int(r.headers["retry-after"]) >= 1
    assert DEADLINE_S * 0.8 <= waited < DEADLINE_S + 5, waited
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
