"""API test fixtures: one tiny-model `headrace serve` for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args


@pytest.fixture(scope="session")
def api_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("api") / "tiny-llama")


@pytest.fixture(scope="session")
def api_server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One tiny-model server for the whole API suite; it must stop cleanly (exit code 0)."""
    args = tiny_server_args(api_model_dir) + ["--api-docs"]  # test_schemathesis reads it
    yield from serving(args, tmp_path_factory.mktemp("logs"), exits=(0,))


@pytest.fixture
def client(api_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The real Gemma 3 270M at its defaults, room for 24 sequences of 1,024 tokens, for the
    tests of one module (structured outputs, tool calls). Not held for the session: with the
    suite in two processes each would keep its own (2.9 GB) until the end, beside Ray's tests,
    whose memory monitor kills actors when the machine is 95% full. A start is about 12 s."""
    args = ["--max-model-len", "1024", "--max-num-seqs", "24", "--log-level", "warning"]
    yield from serving(args, tmp_path_factory.mktemp("gemma"))
