"""A remote replica that freezes mid-stream (SIGSTOP) does not hang its clients: the stream
through the front end ends with an error event within `--replica-read-timeout-s`, and the
replica leaves the rotation; once it runs again (SIGCONT) it rejoins. Real processes on
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
from api.helpers import Server

from router.conftest import prompt, replicas, running, serve_args

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


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_open_replica_api_is_announced(remote: Server) -> None:
    assert "the replica API (/v1/replica/*) is on and open" in remote.log()


def test_a_frozen_remote_ends_the_stream_and_leaves_the_rotation(
    front: Server, remote: Server
) -> None:
    body = {"model": "alpha", "prompt": prompt(6), "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    got: list[dict[str, object]] = []
    stopped_at = 0.0
    try:
        with httpx.stream("POST", front.url + "/v1/generate", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                got.append(json.loads(line[6:]))
                if len(got) == 1:  # the stream is under way: freeze the remote's server
                    os.kill(remote.proc.pid, signal.SIGSTOP)
                    stopped_at = time.monotonic()
        ended_after = time.monotonic() - stopped_at
        assert "error" in got[-1], got[-3:]  # an error event, not a finished stream
        assert got[-1]["error"]["code"] == 502  # type: ignore[index]
        assert ended_after < READ_TIMEOUT_S + 3.0, ended_after
        assert remote_state(front) == "down"
        health = httpx.get(front.url + "/health", timeout=10)
        assert health.status_code == 503
    finally:
        os.kill(remote.proc.pid, signal.SIGCONT)
    # running again: the stats poll brings it back, and it serves
    wait_for(lambda: remote_state(front) == "healthy", 15, "the remote to rejoin")
    short = {**body, "max_tokens": 4, "stream": False}
    r2 = httpx.post(front.url + "/v1/generate", json=short, timeout=30)
    assert r2.status_code == 200 and r2.json()["finish_reason"] == "length", r2.text
