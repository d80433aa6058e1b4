"""Router test fixtures: two tiny random-weight models (different architectures and weights).
The helpers to run `headrace serve` with several replicas and read its state are in
`factories.servers`."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import make_tiny


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`alpha` (Llama) and `beta` (Qwen2): same word-level tokenizer, different outputs."""
    root = tmp_path_factory.mktemp("router-models")
    make_tiny("llama", root / "alpha", seed=0)
    make_tiny("qwen2", root / "beta", seed=1)
    return {"alpha": root / "alpha", "beta": root / "beta"}
