"""Headrace greedy tokens == transformers greedy tokens, tiny random models, fp32, on the CPU
and (where a GPU is present) on CUDA against transformers on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from factories import ARCHS, DEVICES, hf_greedy, make_tiny, prompts

from headrace.config import CacheConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.loader.hf import load_model

NEW_TOKENS = 32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(arch: str, device: str, tmp_path: Path) -> None:
    hf_model = make_tiny(arch, tmp_path)
    model, _ = load_model(tmp_path, torch.float32, torch.device(device), 512)
    runner = ModelRunner.from_parts(model, tmp_path, CacheConfig(block_size=4, num_kv_blocks=256))
    ps = prompts(4)
    expected = [hf_greedy(hf_model, p, NEW_TOKENS) for p in ps]
    assert all(len(e) == NEW_TOKENS for e in expected)
    assert greedy(runner, ps, NEW_TOKENS) == expected
    # prompts fed in chunks of 5 tokens meet the cached prefix of earlier chunks
    assert greedy(runner, ps, NEW_TOKENS, chunk=5) == expected
