"""Engine test fixtures over the factories (`factories.engine`, `factories.tokenizers`,
`factories.models`): the fake runner and core, requests, tokenizers and one tiny model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from factories import (
    FakeCore,
    FakeRunner,
    TokenizerAdapter,
    fake_reference,
    make_byte_level_tokenizer,
    make_prompt,
    make_request,
    make_scheduler,
    make_sentencepiece_tokenizer,
    make_tiny_llama,
)
from tokenizers import Tokenizer

from headrace.engine.sched.scheduler import Scheduler
from headrace.request import Request


@pytest.fixture
def fake_engine() -> Callable[..., FakeCore]:
    return FakeCore


@pytest.fixture
def fake_runner() -> type[FakeRunner]:
    return FakeRunner


@pytest.fixture(name="make_request")
def make_request_fixture() -> Callable[..., Request]:
    return make_request


@pytest.fixture(name="make_scheduler")
def make_scheduler_fixture() -> Callable[..., Scheduler]:
    return make_scheduler


@pytest.fixture(name="make_prompt")
def make_prompt_fixture() -> Callable[[int, int], list[int]]:
    return make_prompt


@pytest.fixture(name="fake_reference")
def fake_reference_fixture() -> Callable[..., list[int]]:
    return fake_reference


@pytest.fixture(scope="session")
def sp_tokenizer() -> Tokenizer:
    return make_sentencepiece_tokenizer()


@pytest.fixture(scope="session")
def byte_level_tokenizer() -> Tokenizer:
    return make_byte_level_tokenizer()


@pytest.fixture
def fake_tokenizer(sp_tokenizer: Tokenizer) -> TokenizerAdapter:
    return TokenizerAdapter(sp_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny random-weight model directory for the engine's real-model tests."""
    return make_tiny_llama(tmp_path_factory.mktemp("engine") / "tiny-llama", "sentencepiece")
