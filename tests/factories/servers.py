"""Real `headrace serve` processes on 127.0.0.1 for the tests that need the whole server, and
what the tests read from them (metrics, SSE, stats).

`serving(args, log_dir)` is for a fixture to `yield from`; `running(...)` is the same as a
context manager (a clean stop must exit 0). `tiny_server_args(model_dir)` serves one
`make_tiny_llama` as `tiny`; `serve_args(*specs)` serves `--model` specs (the router's tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MAX_MODEL_LEN = 512
# uvicorn re-raises SIGTERM after a clean stop unless the server clears it (ours does).
CLEAN_EXITS = (0, -signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A `headrace serve` child process."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    health_seen: list[int] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).status_code
                self.health_seen.append(status)
                if status == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Server:
    """`headrace serve --port <free> ARGS`, not waited for; `env` adds to (or overrides) this
    process's environment for the server."""
    port = free_port()
    log_path = log_dir / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return Server(proc, f"http://127.0.0.1:{port}", log_path)


def serving(
    args: list[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    *,
    clean: bool = True,
    exits: tuple[int, ...] = CLEAN_EXITS,
) -> Iterator[Server]:
    """A ready server for a fixture to `yield from`, stopped afterwards; with `clean`, its exit
    status must be one of `exits`."""
    server = start_server(args, log_dir, env)
    try:
        server.wait_ready()
        yield server
    finally:
        code = server.stop()
    if clean:
        assert code in exits, server.log()


@contextmanager
def running(args: list[str], log_dir: Path, *, clean_exit: bool = True) -> Iterator[Server]:
    """`serving` as a context manager; a clean stop must exit 0."""
    yield from serving(args, log_dir, clean=clean_exit, exits=(0,))


def tiny_server_args(model_dir: Path) -> list[str]:
    """Serve one tiny model as `tiny`, in float32, on one thread."""
    return [
        "--model", str(model_dir), "--served-model-name", "tiny", "--dtype", "float32",
        "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "256", "--block-size", "16",
        "--num-threads", "1", "--log-level", "warning", "--request-timeout-s", "60",
    ]  # fmt: skip


def serve_args(*models: str, extra: tuple[str, ...] = ()) -> list[str]:
    """`headrace serve` flags for tiny models given as `--model` specs (`[NAME=]PATH[:N]`)."""
    args: list[str] = []
    for spec in models:
        args += ["--model", spec]
    return args + [
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "128",
        "--block-size", "16", "--log-level", "warning", "--request-timeout-s", "60", *extra,
    ]  # fmt: skip


def write_tenants(directory: Path, text: str) -> Path:
    path = directory / "tenants.yaml"
    path.write_text(text)
    return path


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it holds; fail saying `what` did not happen within `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read_metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Prometheus text as `{'name{labels}': value}`; `name` alone sums every label set."""
    r = httpx.get(url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
        name = key.split("{", 1)[0]
        if name != key:
            out[name] = out.get(name, 0.0) + float(value)
    return out


def sse_events(lines: Iterable[str]) -> list[str]:
    """The `data:` payloads of an SSE stream, in order."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


async def stream_text(
    c: httpx.AsyncClient, body: dict[str, Any], started: asyncio.Event | None = None
) -> str:
    """A streamed /v1/completions' text, asserting it ran to `length` and `[DONE]`; `started`
    is set at its first line (a bystander of a test that waits for its streams to be under way)."""
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = []
        async for line in r.aiter_lines():
            events.extend(sse_events([line]))
            if started is not None:
                started.set()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert chunks[-1]["finish_reason"] == "length"
    return "".join(ch["text"] for ch in chunks)


def replicas(url: str, model: str) -> list[dict[str, Any]]:
    """Each replica's state and load, from GET /v1/stats."""
    data = httpx.get(url + "/v1/stats", timeout=10).json()
    reps: list[dict[str, Any]] = data["models"][model]["replicas"]
    return reps


def routed(url: str, model: str) -> dict[str, int]:
    """How many requests the router sent each replica of `model`."""
    return {r["name"]: r["routed"] for r in replicas(url, model)}
