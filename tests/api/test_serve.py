"""`headrace serve` as a process: loading, ready line, engine death, and a clean stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
from factories import Server, start_server, tiny_server_args


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _open_streams(url: str, n: int, started: asyncio.Event) -> list[list[str]]:
    body = {"prompt": "a long story", "max_tokens": 480, "ignore_eos": True, "stream": True}

    async def one(c: httpx.AsyncClient) -> list[str]:
        events = []
        async with c.stream("POST", "/v1/generate", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
        return events

    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        return list(await asyncio.gather(*(one(c) for _ in range(n))))


def _streams_during(server: Server, n: int, action: object) -> list[list[str]]:
    """Open `n` long streams; once text flows, call `action()`; return every stream's events."""

    async def run() -> list[list[str]]:
        started = asyncio.Event()
        task = asyncio.ensure_future(_open_streams(server.url, n, started))
        await asyncio.wait_for(started.wait(), 60)
        await asyncio.sleep(0.2)
        action()  # type: ignore[operator]
        return await asyncio.wait_for(task, 60)

    return asyncio.run(run())


def _ends_with_error(events: list[str]) -> dict[str, object]:
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["text"] is not None, "the stream had started"
    error = json.loads(events[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


def test_stop_signal_ends_streams_with_an_error_event_and_leaves_nothing(
    api_model_dir: Path, tmp_path: Path
) -> None:
    server = start_server(tiny_server_args(api_model_dir), tmp_path)
    try:
        server.wait_ready()
        assert 503 in server.health_seen, "/health answered 503 while the model loaded"
        children = child_pids(server.proc.pid)
        assert children, "the engine core runs in a child process"
        streams = _streams_during(server, 3, lambda: server.proc.send_signal(signal.SIGTERM))
        for events in streams:
            assert _ends_with_error(events)["message"] == "server shutting down"
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in children if alive(p)], "engine processes left running"
    log = server.log()
    assert f"Headrace ready: model tiny on {server.url}" in log
    assert "core INFO: runner ready: tiny" in log, "the core process logs its runner's choices"


def test_engine_death_fails_streams_and_health(api_model_dir: Path, tmp_path: Path) -> None:
    # Without resumes (tests/router covers them): the streams end with the error.
    server = start_server([*tiny_server_args(api_model_dir), "--max-resumes", "0"], tmp_path)
    try:
        server.wait_ready()
        (engine,) = [p for p in child_pids(server.proc.pid) if b"spawn_main" in cmdline(p)]
        streams = _streams_during(server, 2, lambda: os.kill(engine, signal.SIGKILL))
        for events in streams:
            _ends_with_error(events)
        r = httpx.get(server.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "unhealthy"
        r = httpx.post(server.url + "/v1/generate", json={"prompt": "hi"}, timeout=10)
        assert r.status_code >= 500 and r.json()["error"]["message"]
    finally:
        assert server.stop() == 0
