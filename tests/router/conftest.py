"""Router test fixtures: two tiny random-weight models (different architectures and weights)
and helpers to run `headrace serve` with several replicas and read its state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from api.helpers import Server, start_server
from models.tiny import make_tiny

MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`alpha` (Llama) and `beta` (Qwen2): same word-level tokenizer, different outputs."""
    root = tmp_path_factory.mktemp("router-models")
    make_tiny("llama", root / "alpha", seed=0)
    make_tiny("qwen2", root / "beta", seed=1)
    return {"alpha": root / "alpha", "beta": root / "beta"}


def serve_args(*models: str, extra: tuple[str, ...] = ()) -> list[str]:
    """`headrace serve` flags for the tiny models (`models` as `--model` specs)."""
    args: list[str] = []
    for spec in models:
        args += ["--model", spec]
    return args + [
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "128",
        "--block-size", "16", "--log-level", "warning", "--request-timeout-s", "60", *extra,
    ]  # fmt: skip


@contextmanager
def running(args: list[str], log_dir: Path, *, clean_exit: bool = True) -> Iterator[Server]:
    server = start_server(args, log_dir)
    try:
        server.wait_ready()
        yield server
    finally:
        code = server.stop()
    if clean_exit:
        assert code == 0, server.log()


def replicas(url: str, model: str) -> list[dict[str, Any]]:
    """Each replica's state and load, from GET /v1/stats."""
    data = httpx.get(url + "/v1/stats", timeout=10).json()
    reps: list[dict[str, Any]] = data["models"][model]["replicas"]
    return reps


def routed(url: str, model: str) -> dict[str, int]:
    return {r["name"]: r["routed"] for r in replicas(url, model)}


def prompt(n: int, start: int = 5) -> str:
    """`n` words of the tiny word-level vocabulary (plus BOS when tokenized)."""
    return " ".join(f"w{start + i % 400}" for i in range(n))


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it holds; fail saying `what` did not happen within `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
