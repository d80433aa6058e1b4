"""A random adapter on the real embedded Gemma 3 270M: our fp32 greedy tokens equal
transformers + peft's on the same GGUF, alone and batched with the base model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from factories import hf_greedy

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.loader.tokenizer import load_tokenizer

pytestmark = [pytest.mark.gemma, pytest.mark.slow]
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NEW_TOKENS = 16


def test_gemma_adapter_matches_peft(tmp_path: Path, hf_gemma: tuple[Any, Any]) -> None:
    from peft import LoraConfig, get_peft_model

    hf = copy.deepcopy(hf_gemma[0])  # peft injects its layers into the model it is given
    runner = ModelRunner(ModelConfig(dtype="float32", device="cpu"), CacheConfig(num_kv_blocks=64))
    ids = [load_tokenizer(runner.model_dir).encode(p) for p in PROMPTS]
    base = [hf_greedy(hf, p, NEW_TOKENS) for p in ids]
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=16, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    torch.manual_seed(0)
    peft_model = get_peft_model(hf, config).eval()
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = [hf_greedy(peft_model, p, NEW_TOKENS) for p in ids]
    assert expected != base
    lora = runner.loras.load("a", tmp_path / "adapter")
    assert greedy(runner, ids, NEW_TOKENS, lora_ids=[lora, lora]) == expected
    assert greedy(runner, ids, NEW_TOKENS, lora_ids=[lora, 0]) == [expected[0], base[1]]
