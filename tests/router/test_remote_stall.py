"""A remote replica that freezes mid-stream (SIGSTOP) does not hang its clients: within
`--replica-read-timeout-s` it leaves the rotation, and its stream, through the front end,
waits; once it runs again (SIGCONT) it rejoins and the stream resumes there, with the text of
an undisturbed run. Real processes on
127.0.0.1: `remote` serves the tiny model with `--replica-api`, `front` only routes to it."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, replicas, running, serve_args, wait_for, word_prompt

READ_TIMEOUT_S = 3.0
MAX_TOKENS = 480  # a stream that is still going when the remote stops


@pytest.fixture(scope="module")
def remote(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    args = serve_args(f"alpha={tiny_models['alpha']}:1", extra=("--replica-api",))
    with running(args, tmp_path_factory.mktemp("stall-remote"), clean_exit=False) as s:
        yield s


@pytest.fixture(scope="module")
def front(remote: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = serve_args(extra=("--replicas", "0", "--replica-url", remote.url,
                             "--replica-read-timeout-s", str(READ_TIMEOUT_S)))  # fmt: skip
    with running(args, tmp_path_factory.mktemp("stall-front")) as s:
        yield s


def remote_state(front: Server) -> str:
    state: str = replicas(front.url, "alpha")[0]["state"]
    return state


def test_the_open_replica_api_is_announced(remote: Server) -> None:
    assert "the replica API (/v1/replica/*) is on and open" in remote.log()


def stream_events(url: str, body: dict[str, object], on_first: Callable[[], None] = lambda: None
                  ) -> list[dict[str, object]]:  # fmt: skip
    got: list[dict[str, object]] = []
    with httpx.stream("POST", url + "/v1/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            got.append(json.loads(line[6:]))
            if len(got) == 1:
                on_first()
    return got


def test_a_frozen_remote_leaves_the_rotation_and_its_stream_resumes_when_it_is_back(
    front: Server, remote: Server
) -> None:
    body = {"model": "alpha", "prompt": word_prompt(6), "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    reference = stream_events(front.url, body)
    resumes = httpx.get(front.url + "/v1/stats", timeout=10).json()["models"]["alpha"]["resumes"]

    def freeze_then_thaw() -> None:  # the stream is under way: freeze the remote's server
        os.kill(remote.proc.pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            wait_for(lambda: remote_state(front) == "down", READ_TIMEOUT_S + 5, "it to leave")
            assert time.monotonic() - stopped_at < READ_TIMEOUT_S + 3.0
            health = httpx.get(front.url + "/health", timeout=10)
            assert health.status_code == 503
        finally:
            os.kill(remote.proc.pid, signal.SIGCONT)

    got = stream_events(front.url, body, freeze_then_thaw)
    # running again: the stats poll brings it back, and the stream resumes there
    assert got[-1]["finish_reason"] == "length", got[-3:]
    assert "".join(str(e.get("text", "")) for e in got) == "".join(
        str(e.get("text", "")) for e in reference
    )
    assert got[-1]["usage"] == reference[-1]["usage"]
    stats = httpx.get(front.url + "/v1/stats", timeout=10).json()["models"]["alpha"]
    assert stats["resumes"] == resumes + 1 and remote_state(front) == "healthy"
